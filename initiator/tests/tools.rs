//! The two binaries end to end against their in-process loopback target: flags parse, output
//! has the documented shape, exit codes say what happened.

use std::process::Command;

fn run(bin: &str, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(bin)
        .args(args)
        .env("RUST_BACKTRACE", "0")
        .output()
        .expect("spawn");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

const PERF: &str = env!("CARGO_BIN_EXE_nvmf-perf");
const NVMF: &str = env!("CARGO_BIN_EXE_nvmf");

#[test]
fn perf_verified_run_reports_json_per_namespace() {
    let (code, out, err) = run(
        PERF,
        &[
            "--transport",
            "loopback",
            "--loopback-namespaces",
            "4M,2M",
            "-q",
            "8",
            "-o",
            "4k",
            "-w",
            "randrw",
            "-M",
            "70",
            "-t",
            "1",
            "-c",
            "0",
            "--no-pin",
            "--qpairs",
            "2",
            "--verify",
            "--json",
        ],
    );
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("JSON report");
    assert_eq!(v["namespaces"].as_array().unwrap().len(), 2);
    assert!(v["total"]["ios"].as_u64().unwrap() > 0);
    assert_eq!(v["total"]["verify_failures"], 0);
    // Not a terminal: no progress line mixed into the JSON.
    assert!(!out.contains('\r'));
}

#[test]
fn perf_refuses_bad_flags_and_unusable_transports() {
    let (code, _, err) = run(PERF, &["--transport", "loopback", "-w", "sideways"]);
    assert_ne!(code, 0);
    assert!(err.contains("unknown workload 'sideways'"), "{err}");
    // The in-process soft fabric cannot reach a target in another process.
    let (code, _, err) = run(PERF, &["--transport", "soft", "-t", "1"]);
    assert_ne!(code, 0);
    assert!(err.contains("use --transport soft-tcp"), "{err}");
    let (code, _, err) = run(PERF, &["--transport", "carrier-pigeon", "-t", "1"]);
    assert_ne!(code, 0);
    assert!(
        err.contains("[possible values: rdma, soft-tcp, loopback, soft]"),
        "{err}"
    );
    // Nonsense values are refused naming their flag, not run as something else (or, for a
    // time past any clock, a panic).
    for (args, flag) in [
        (&["-t", "0"][..], "--time"),
        (&["-t", "18446744073709551615"][..], "--time"),
        (&["-q", "0"][..], "--queue-depth"),
        (&["--qpairs", "0"][..], "--qpairs"),
        (&["-o", "0"][..], "--io-size"),
        (&["-c", "0-99999999999"][..], "--cores"),
        (&["--kato", "18446744073709551615"][..], "--kato"),
        (&["-w", "randread", "-M", "30"][..], "-M/--mix"),
    ] {
        let (code, _, err) = run(PERF, &[&["--transport", "loopback"][..], args].concat());
        assert_ne!(code, 0, "{args:?} ran");
        assert!(err.contains(flag), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
    // Nobody listens on this port: a clean error, not a hang.
    let (code, _, err) = run(PERF, &["--transport", "soft-tcp", "-s", "1", "-t", "1"]);
    assert_ne!(code, 0);
    assert!(err.contains("no NVMe-oF listener"), "{err}");
}

#[test]
fn nvmf_identify_list_and_discover() {
    let (code, out, err) = run(NVMF, &["--transport", "loopback", "id-ctrl"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.starts_with("NVME Identify Controller:\nvid       : 0x1b36\n"),
        "{out}"
    );
    let (code, out, _) = run(
        NVMF,
        &["--transport", "loopback", "id-ns", "-N", "1", "--json"],
    );
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["nsze"], 64 * 1024 * 1024 / 512);
    let (code, out, _) = run(NVMF, &["--transport", "loopback", "discover"]);
    assert_eq!(code, 0);
    assert!(
        out.contains("subnqn:  nqn.2024-01.io.nvmf-rs:loopback"),
        "{out}"
    );
    let (code, _, err) = run(NVMF, &["--transport", "loopback", "id-ns", "-N", "9"]);
    assert_ne!(code, 0);
    assert!(err.contains("namespace 9 is not active"), "{err}");
}

#[test]
fn nvmf_connect_says_the_queue_data_size_asked_and_clamped() {
    // The loopback target: MDTS 128 KiB; `connect` asks 128 commands per queue.
    for (asked, registered) in [
        (None, 128 * 128 * 1024),
        (Some("256K"), 256 * 1024),
        (Some("4K"), 128 * 1024),
    ] {
        let mut args = vec!["--transport", "loopback"];
        if let Some(size) = asked {
            args.extend(["--queue-data-size", size]);
        }
        args.extend(["connect", "--json"]);
        let (code, out, err) = run(NVMF, &args);
        assert_eq!(code, 0, "{err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["queue_data"], registered, "{asked:?}: {out}");
    }
    let (code, _, err) = run(
        NVMF,
        &[
            "--transport",
            "loopback",
            "--queue-data-size",
            "lots",
            "connect",
        ],
    );
    assert_eq!(code, 2);
    assert!(err.contains("--queue-data-size"), "{err}");
}

#[test]
fn nvmf_read_writes_stdout_and_compare_sets_the_exit_code() {
    let (code, out, _) = run(
        NVMF,
        &["--transport", "loopback", "read", "-s", "0", "-c", "2"],
    );
    assert_eq!(code, 0);
    assert_eq!(out.len(), 1024);
    let dir = std::env::temp_dir().join(format!("nvmf-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let zeros = dir.join("zeros");
    let ones = dir.join("ones");
    std::fs::write(&zeros, [0u8; 512]).unwrap();
    std::fs::write(&ones, [1u8; 512]).unwrap();
    // A fresh loopback namespace is zeroed.
    let (code, _, err) = run(
        NVMF,
        &[
            "--transport",
            "loopback",
            "compare",
            "-s",
            "0",
            "-c",
            "1",
            "-d",
            zeros.to_str().unwrap(),
        ],
    );
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = run(
        NVMF,
        &[
            "--transport",
            "loopback",
            "compare",
            "-s",
            "0",
            "-c",
            "1",
            "-d",
            ones.to_str().unwrap(),
        ],
    );
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("MISMATCH"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Ranges past the namespace are refused before anything is allocated or sent, including
/// ones whose byte offset or length does not fit 64 bits (unchecked, 2^55 blocks of 512 bytes
/// wrapped to byte 0: the write landed on LBA 0).
#[test]
fn nvmf_read_and_write_refuse_ranges_past_the_namespace() {
    let lo = ["--transport", "loopback"];
    let dir = std::env::temp_dir().join(format!("nvmf-cli-range-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let data = dir.join("data");
    std::fs::write(&data, [7u8; 512]).unwrap();
    let data = data.to_str().unwrap();
    for (args, says) in [
        (
            &["write", "-s", "36028797018963968", "-c", "1", "-d", data][..],
            "blocks 36028797018963968+1 of 512 bytes end past namespace 1",
        ),
        (
            &["read", "-s", "0", "-c", "36028797018963968"][..],
            "blocks 0+36028797018963968 of 512 bytes end past namespace 1",
        ),
        (
            &["read", "-s", "0", "-c", "1000000000000"][..],
            "blocks 0+1000000000000 of 512 bytes end past namespace 1",
        ),
        (
            &["compare", "-s", "131072", "-c", "1", "-d", data][..],
            "blocks 131072+1 of 512 bytes end past namespace 1",
        ),
    ] {
        let (code, out, err) = run(NVMF, &[&lo[..], args].concat());
        assert_eq!(code, 1, "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
        assert!(out.is_empty(), "{args:?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn nvmf_block_range_commands_report_success_and_refuse_what_cannot_be_sent() {
    let lo = ["--transport", "loopback"];
    for (args, says) in [
        (
            &["write-zeroes", "-s", "8", "-c", "70000"][..],
            "write-zeroes: Success (70000 blocks from 8)",
        ),
        (
            &["dsm", "--ad", "-s", "0,100", "-b", "8,1"][..],
            "dsm: Success (2 ranges deallocated)",
        ),
        (&["flush", "-N", "1"][..], "flush: Success (namespace 1)"),
    ] {
        let (code, out, err) = run(NVMF, &[&lo[..], args].concat());
        assert_eq!(code, 0, "{args:?}: {err}");
        assert!(out.contains(says), "{args:?}: {out}");
    }
    // Only deallocation is a DSM attribute the tool sends: --ad is required.
    let (code, _, err) = run(NVMF, &[&lo[..], &["dsm", "-s", "0", "-b", "1"]].concat());
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--ad"), "{err}");
    let (code, _, err) = run(
        NVMF,
        &[&lo[..], &["write-zeroes", "-s", "131072", "-c", "1"]].concat(),
    );
    assert_eq!(code, 1);
    assert!(
        err.contains("blocks 131072+1 end past the namespace's 131072 blocks"),
        "{err}"
    );
}

#[test]
fn nvmf_show_regs_reads_the_live_properties() {
    let (code, out, err) = run(NVMF, &["--transport", "loopback", "show-regs"]);
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 4, "{out}");
    assert!(lines[0].starts_with("cap     : "), "{out}");
    // NVMe 1.3; enabled with 64/16-byte entries; ready.
    assert_eq!(
        &lines[1..],
        ["version : 10300", "cc      : 460001", "csts    : 1"]
    );
    let (code, out, err) = run(NVMF, &["--transport", "loopback", "show-regs", "-H"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("\tReady (RDY): 1\n"), "{out}");
    assert!(
        out.contains("\tNVMe specification version: 1.3.0\n"),
        "{out}"
    );
    let (code, out, _) = run(NVMF, &["--transport", "loopback", "--json", "show-regs"]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(
        (v["csts"].as_u64(), v["version"].as_u64()),
        (Some(1), Some(0x10300))
    );
    assert_eq!(
        format!("cap     : {:x}", v["cap"].as_u64().expect("cap")),
        lines[0],
        "the JSON and the text read the same CAP"
    );
}
