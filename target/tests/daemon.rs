//! `nvmf-tgt` as a process: SIGUSR1 writes the statistics file, SIGTERM stops it with exit 0
//! and the file bdev it created is flushed and kept.
#![forbid(unsafe_code)]

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn signal(pid: u32, sig: &str) {
    let ok = Command::new("kill")
        .arg(sig)
        .arg(pid.to_string())
        .status()
        .unwrap();
    assert!(ok.success());
}

/// Wait (bounded) until `f` holds.
fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn sigusr1_stats_and_sigterm_clean_exit() {
    let dir = tempfile::tempdir().unwrap();
    let stats = dir.path().join("stats.json");
    let image = dir.path().join("ns.img");
    let config = dir.path().join("t.toml");
    // The daemon really listens: a free port, not 4420 (another daemon may hold it).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    std::fs::write(
        &config,
        format!(
            "[reactors]\ncores = [0]\n[transport]\nprovider = \"soft\"\nlisten = [\"127.0.0.1:{port}\"]\n\
             [daemon]\nstats_file = {stats:?}\nstats_interval_ms = 3600000\n\
             [[bdev]]\nname = \"f\"\nkind = \"file\"\npath = {image:?}\nsize = 1048576\n\
             [[subsystem]]\nnqn = \"nqn.2016-06.io.nvmf-rs:t\"\nallow_any_host = true\n\
             [[subsystem.namespace]]\nnsid = 1\nbdev = \"f\"\n"
        ),
    )
    .unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_nvmf-tgt"))
        .arg("--config")
        .arg(&config)
        .arg("--log-format")
        .arg("json")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The first stats write happens at start; remove it and ask for a fresh one.
    wait_for("the first stats file", || stats.exists());
    std::fs::remove_file(&stats).unwrap();
    signal(child.id(), "-USR1");
    wait_for("stats after SIGUSR1", || stats.exists());
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&stats).unwrap()).unwrap();
    assert_eq!(json["reactors"].as_array().unwrap().len(), 1);
    assert!(json["subsystems"]["nqn.2016-06.io.nvmf-rs:t"]["controllers"].is_number());
    signal(child.id(), "-TERM");
    let out = child.wait_with_output().unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{log}");
    assert!(log.contains("stopped"), "{log}");
    assert_eq!(std::fs::metadata(&image).unwrap().len(), 1 << 20);
}
