//! Separate processes over the soft RDMA provider's TCP fabric: `nvmf-tgt` serving a
//! file-backed namespace (1) and a malloc one (2), and the initiator tools. Data is written
//! and flushed with `nvmf write` (namespace 1); `nvmf-perf --verify` loads namespace 2 with a
//! reconnect policy; nvmf-tgt is killed with SIGKILL mid-I/O; nvmf-perf reports the loss (I/O
//! in flight failed with the connection, no hang, no panic), reconnects once nvmf-tgt is
//! restarted on the same configuration, and goes on with verified I/O; the flushed data reads
//! back intact.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::rig::{Process, Rig, bin, read_file, sigterm, wait_until};

/// Blocks written and flushed before the kill (512 B each).
const KEPT_BLOCKS: usize = 64;

#[test]
#[ignore = "starts the built nvmf-tgt, nvmf and nvmf-perf: scripts/process-e2e.sh builds them and runs it"]
fn target_killed_mid_io_then_restarted_host_reconnects_and_data_survives() {
    let rig = Rig::new();
    let mut target = rig.start_target("nvmf-tgt-1.log");

    // Data written and flushed (nvmf write flushes) before anything goes wrong.
    let kept: Vec<u8> = (0..KEPT_BLOCKS * 512)
        .map(|i| (i * 7 % 251) as u8 ^ 0x5a)
        .collect();
    let data = rig.dir.path().join("kept.bin");
    std::fs::write(&data, &kept).expect("data file");
    rig.block_io("write", 1, 8, KEPT_BLOCKS, &data);

    // Verified load on namespace 2 with a reconnect policy.
    let perf_out = rig.dir.path().join("perf.json");
    let perf_err = rig.dir.path().join("perf.log");
    let mut perf = Process(
        Command::new(bin("nvmf-perf"))
            .args(rig.host_args())
            .args([
                "--reconnect-delay",
                "1",
                "--ctrl-loss-tmo",
                "60",
                "--nsid",
                "2",
                "-q",
                "16",
                "-o",
                "4096",
                "-w",
                "randrw",
                "-t",
                "20",
                "--verify",
                "--no-pin",
                "--json",
            ])
            .env_remove("RUST_LOG")
            .stdout(std::fs::File::create(&perf_out).expect("perf out"))
            .stderr(std::fs::File::create(&perf_err).expect("perf log"))
            .spawn()
            .expect("nvmf-perf starts"),
    );
    wait_until("nvmf-perf connected", || {
        read_file(&perf_err).contains("controller live")
    });
    // Let the load run a moment: the kill must find I/O in flight (checked below by the
    // count of I/O lost with the connection, not by this pause).
    std::thread::sleep(Duration::from_secs(1));
    assert!(
        perf.0.try_wait().expect("perf").is_none(),
        "nvmf-perf ended early: {}",
        read_file(&perf_err)
    );

    target.0.kill().expect("SIGKILL nvmf-tgt");
    target.0.wait().expect("reaped");
    wait_until("nvmf-perf noticing the loss", || {
        read_file(&perf_err).contains("connection lost")
    });
    assert!(
        perf.0.try_wait().expect("perf").is_none(),
        "nvmf-perf gave up instead of reconnecting: {}",
        read_file(&perf_err)
    );

    // Same configuration, same files.
    let mut target = rig.start_target("nvmf-tgt-2.log");
    let deadline = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(s) = perf.0.try_wait().expect("perf") {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "nvmf-perf hung: {}",
            read_file(&perf_err)
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let log = read_file(&perf_err);
    assert!(!log.contains("panicked"), "{log}");
    assert!(
        status.success(),
        "nvmf-perf: {status}\n{log}\n{}\n-- nvmf-tgt before the kill:\n{}\n-- after:\n{}",
        read_file(&perf_out),
        read_file(&rig.dir.path().join("nvmf-tgt-1.log")),
        read_file(&rig.dir.path().join("nvmf-tgt-2.log")),
    );
    let report: serde_json::Value =
        serde_json::from_str(&read_file(&perf_out)).expect("nvmf-perf --json report");
    let total = &report["total"];
    assert!(
        report["reconnects"].as_u64() >= Some(1),
        "no reconnect: {report}"
    );
    assert!(
        total["lost"].as_u64() >= Some(1),
        "the kill found no I/O in flight: {report}"
    );
    assert_eq!(total["errors"].as_u64(), Some(0), "{report}");
    assert_eq!(total["verify_failures"].as_u64(), Some(0), "{report}");
    assert!(
        report["ios_after_reconnect"].as_u64() > Some(0),
        "no I/O after the reconnect (the run may have ended first): {report}"
    );
    assert_eq!(report["connected_at_end"].as_bool(), Some(true), "{report}");
    assert!(
        report["errors"].as_array().is_some_and(|e| e
            .iter()
            .any(|m| m.as_str().is_some_and(|m| m.contains("connection lost")))),
        "the lost I/O name their cause: {report}"
    );

    // The data flushed before the kill reads back intact.
    let back = rig.dir.path().join("back.bin");
    rig.block_io("read", 1, 8, KEPT_BLOCKS, &back);
    assert!(
        std::fs::read(&back).expect("read back") == kept,
        "flushed data changed across the kill and restart"
    );
    let status = sigterm(&mut target);
    assert!(status.success(), "restarted nvmf-tgt: {status}");
}
