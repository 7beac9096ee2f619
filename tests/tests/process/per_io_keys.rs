//! `nvmf-perf --per-io-keys --verify` against nvmf-tgt with and without remote invalidation:
//! with `[transport] remote_invalidate = false` the target answers with plain SENDs, so the
//! host invalidates every I/O's window itself before completing it, and nvmf-perf's report
//! counts those (`host_invalidations`, and a line of the text report); against the default
//! target the responses invalidate the keys and the count is 0.

use crate::rig::{Rig, sigterm};

/// nvmf-perf's JSON report of a short verified per-I/O-key load on namespace 2.
fn per_io_key_load(rig: &Rig, json: bool) -> String {
    let mut args = vec![
        "--per-io-keys",
        "--nsid",
        "2",
        "-q",
        "8",
        "-o",
        "4096",
        "-w",
        "randrw",
        "-t",
        "1",
        "--verify",
        "--no-pin",
    ];
    if json {
        args.push("--json");
    }
    let (status, out, err) = rig.perf(&args);
    assert!(
        status.success(),
        "nvmf-perf {args:?}: {status}\n{out}\n{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
    out
}

#[test]
#[ignore = "starts the built nvmf-tgt and nvmf-perf: scripts/process-e2e.sh builds them and runs it"]
fn the_report_counts_the_keys_the_host_invalidated_itself() {
    for remote_invalidate in [false, true] {
        let rig = Rig::with_transport(&format!("remote_invalidate = {remote_invalidate}\n"));
        let mut target = rig.start_target("nvmf-tgt.log");
        let report: serde_json::Value =
            serde_json::from_str(&per_io_key_load(&rig, true)).expect("nvmf-perf --json report");
        let ios = report["total"]["ios"].as_u64().expect("total ios");
        let reads = report["total"]["reads"].as_u64().expect("total reads");
        let by_host = report["host_invalidations"]
            .as_u64()
            .expect("host_invalidations");
        assert!(reads > 0 && ios > reads, "{report}");
        assert_eq!(report["total"]["verify_failures"].as_u64(), Some(0));
        let text = per_io_key_load(&rig, false);
        let line = "per-I/O keys the host invalidated itself (the target left them valid)";
        if remote_invalidate {
            assert_eq!(by_host, 0, "the target invalidated every key: {report}");
            assert!(!text.contains(line), "{text}");
        } else {
            // Every read the report counts completed after its window's LOCAL_INV (those of
            // the final drain are invalidated too, so there may be more); a 4 KiB write goes in
            // the capsule when the target's in-capsule data size allows, with no key at all.
            assert!(
                by_host >= reads,
                "{by_host} invalidated, {reads} reads: {report}"
            );
            assert!(text.contains(line), "{text}");
        }
        let status = sigterm(&mut target);
        assert!(status.success(), "nvmf-tgt: {status}");
    }
}
