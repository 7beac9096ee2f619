//! `nvmf-tgt --check`: every example configuration passes; broken ones print each
//! FILE:LINE: KEY: MESSAGE and exit 1.
#![forbid(unsafe_code)]

use std::path::Path;
use std::process::Command;

fn check(path: &Path) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_nvmf-tgt"))
        .arg("--config")
        .arg(path)
        .arg("--check")
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn examples_pass_check() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs");
    for name in ["demo.toml", "rdma.toml", "multicore.toml", "file.toml"] {
        let (ok, err) = check(&dir.join(name));
        assert!(ok, "{name}: {err}");
    }
}

#[test]
fn broken_configs_print_every_error() {
    let dir = tempfile::tempdir().unwrap();
    let table = [
        (
            "[reactors]\ncores = [0]\n[transport]\nlisten = [\"127.0.0.1:4420\"]\nspeed = 3\n",
            vec![":5: transport.speed: unknown field"],
        ),
        (
            "[reactors]\ncores = [1, 1]\n[transport]\nlisten = [\"127.0.0.1:4420\"]\n[[bdev]]\nname = \"a\"\nkind = \"null\"\nsize = 4096\nblock_size = 1024\n[[subsystem]]\nnqn = \"nqn.bad\"\n[[subsystem.namespace]]\nnsid = 1\nbdev = \"b\"\n",
            vec![
                ":2: reactors.cores: core 1 listed twice",
                ":9: bdev.block_size:",
                ":11: subsystem.nqn: invalid NQN",
                ":11: subsystem.hosts: no host could connect",
                ":14: subsystem.namespace.bdev: no [[bdev]] named \"b\"",
            ],
        ),
    ];
    for (i, (text, wants)) in table.iter().enumerate() {
        let path = dir.path().join(format!("bad{i}.toml"));
        std::fs::write(&path, text).unwrap();
        let (ok, err) = check(&path);
        assert!(!ok, "case {i} passed");
        let lines: Vec<&str> = err.lines().collect();
        assert_eq!(lines.len(), wants.len(), "case {i}: {err}");
        for (line, want) in lines.iter().zip(wants) {
            let prefix = path.display().to_string();
            assert!(
                line.starts_with(&prefix) && line.contains(want),
                "case {i}: want {want:?}, got {line:?}"
            );
        }
    }
}
