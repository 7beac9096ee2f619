//! `nvmf get-feature` / `set-feature` against nvmf-tgt with a feature's data buffer: the Host
//! Identifier comes back as the 16 bytes the host connected with, and its Set Features is
//! refused with the status nvmet gives.

use crate::rig::{Rig, sigterm};

#[test]
#[ignore = "starts the built nvmf-tgt and nvmf: scripts/process-e2e.sh builds them and runs it"]
fn host_identifier_comes_back_as_connect_gave_it() {
    let rig = Rig::new();
    let mut target = rig.start_target("nvmf-tgt.log");
    let hostid = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0";
    // Get Features 0x81 with EXHID and its 16 bytes, as text or JSON.
    let get_host_identifier = |json: &[&str]| {
        let feature = ["get-feature", "-f", "0x81", "--cdw11", "1", "-l", "16"];
        rig.nvmf_ok(&[&["--hostid", hostid][..], json, &feature[..]].concat())
    };
    let out = get_host_identifier(&[]);
    assert!(
        out.starts_with("get-feature:0x81 (Host Identifier), Current value:0x00000000\n"),
        "{out}"
    );
    assert!(
        out.contains("0000: 0f 1e 2d 3c 4b 5a 69 78 87 96 a5 b4 c3 d2 e1 f0"),
        "{out}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&get_host_identifier(&["--json"])).expect("JSON");
    assert_eq!(json["data"], "0f1e2d3c4b5a69788796a5b4c3d2e1f0");
    let (status, _, err) = rig.nvmf(&["set-feature", "-f", "0x81", "-v", "1"]);
    assert!(!status.success());
    assert!(err.contains("CommandSequenceError"), "{err}");
    let status = sigterm(&mut target);
    assert!(status.success(), "nvmf-tgt: {status}");
}
