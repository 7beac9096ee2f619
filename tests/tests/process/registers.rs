//! `nvmf show-regs` against nvmf-tgt: the controller's properties read live by Property Get,
//! as the host's bring-up left them (NVMe 1.3, enabled with 64/16-byte entries, ready), CAP's
//! queue entries what the configuration's `max_queue_depth` says.

use crate::rig::{Rig, sigterm};

#[test]
#[ignore = "starts the built nvmf-tgt and nvmf: scripts/process-e2e.sh builds them and runs it"]
fn show_regs_reads_nvmf_tgt_properties() {
    let rig = Rig::with_transport("max_queue_depth = 96\n");
    let mut target = rig.start_target("nvmf-tgt.log");
    let out = rig.nvmf_ok(&["show-regs"]);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines.get(1..),
        Some(&["version : 10300", "cc      : 460001", "csts    : 1"][..]),
        "{out}"
    );
    let human = rig.nvmf_ok(&["show-regs", "-H"]);
    for line in [
        "\tEnable (EN): 1\n",
        "\tReady (RDY): 1\n",
        "\tController Fatal Status (CFS): 0\n",
        "\tCommand Sets Supported (CSS): NVM\n",
    ] {
        assert!(human.contains(line), "{line:?} not in\n{human}");
    }
    // CAP.MQES + 1: the deepest I/O queue nvmf-tgt grants.
    assert!(
        human.contains("\tMaximum Queue Entries Supported (MQES): 96\n"),
        "{human}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&rig.nvmf_ok(&["--json", "show-regs"])).expect("JSON");
    assert_eq!(json["cap"].as_u64().map(|cap| cap & 0xffff), Some(95));
    let status = sigterm(&mut target);
    assert!(status.success(), "nvmf-tgt: {status}");
}
