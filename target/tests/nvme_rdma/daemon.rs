//! `nvmf-tgt` as a process serving NVMe-oF over the soft provider's TCP fabric: a host in this
//! process connects, writes and reads back verified data, and SIGTERM stops the daemon
//! cleanly with the host still connected; a file-backed namespace keeps what was written and
//! flushed before SIGTERM across a restart of the daemon.

use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::process::{Command, Stdio};

use nvmf_protocol::SglDescriptor;
use nvmf_protocol::fabrics::CNTLID_DYNAMIC;
use nvmf_transport::{Context, DeviceSpec, SoftConfig, SoftFabric};

use super::host::{HostQueue, wait_until};
use nvmf_protocol::Sqe;

use super::{SUBNQN, connect, enable, pattern, rw};

/// Kills the daemon if the test fails before stopping it (no orphan process).
struct Daemon(std::process::Child);

impl Daemon {
    /// Starts nvmf-tgt on `config` and waits until every address in `listening` accepts.
    fn start(config: &std::path::Path, stderr: Stdio, listening: &[SocketAddr]) -> Daemon {
        let daemon = Daemon(
            Command::new(env!("CARGO_BIN_EXE_nvmf-tgt"))
                .arg("--config")
                .arg(config)
                .stderr(stderr)
                .spawn()
                .unwrap(),
        );
        for &addr in listening {
            wait_until("the daemon listening", || TcpStream::connect(addr).is_ok());
        }
        daemon
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if self.0.try_wait().ok().flatten().is_none() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
fn nvmf_tgt_serves_read_write_over_tcp() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let config = dir.path().join("t.toml");
    std::fs::write(
        &config,
        format!(
            "[reactors]\ncores = [0, 1]\n[transport]\nprovider = \"soft\"\nfabric = \"tcp\"\n\
             listen = [\"{addr}\"]\nsrq_depth = 256\ndata_buffers = 256\n\
             [[bdev]]\nname = \"m\"\nkind = \"malloc\"\nsize = 1048576\nblock_size = 512\n\
             [[subsystem]]\nnqn = \"{SUBNQN}\"\nallow_any_host = true\n\
             [[subsystem.namespace]]\nnsid = 1\nbdev = \"m\"\n"
        ),
    )
    .unwrap();
    let mut daemon = Daemon::start(&config, Stdio::piped(), &[addr]);
    let child = &mut daemon.0;
    // The host's own soft device (TCP fabric) on another loopback address.
    let _host_device = Context::open(&DeviceSpec::Soft(SoftConfig {
        name: format!("e2e-host{}", std::process::id()),
        fabric: SoftFabric::Tcp,
        ip: Ipv4Addr::new(127, 0, 5, 9),
        ..SoftConfig::default()
    }))
    .expect("host soft device");

    let mut admin = HostQueue::connect(addr, 0, 32);
    let cntlid = connect(&mut admin, 0, CNTLID_DYNAMIC);
    enable(&mut admin);
    let mut io = HostQueue::connect(addr, 1, 32);
    connect(&mut io, 1, cntlid);
    let a = pattern(0x5A, 8192);
    io.write_data(0, &a);
    let c = io.exec(rw(0x01, 16, 16, io.keyed(0, 8192)), &[]).unwrap();
    assert!(c.status.is_success(), "{c:?}");
    let b = pattern(0x11, 2048);
    let in_capsule = SglDescriptor::DataBlockOffset {
        offset: 0,
        length: 2048,
    };
    let c = io.exec(rw(0x01, 32, 4, in_capsule), &b).unwrap();
    assert!(c.status.is_success(), "{c:?}");
    let c = io
        .exec(rw(0x02, 16, 20, io.keyed(16384, 10240)), &[])
        .unwrap();
    assert!(c.status.is_success(), "{c:?}");
    let back = io.read_data(16384, 10240);
    assert!(
        back[..8192] == a[..],
        "keyed write read back through the daemon"
    );
    assert!(
        back[8192..] == b[..],
        "in-capsule write read back through the daemon"
    );

    let ok = Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .status()
        .unwrap()
        .success();
    assert!(ok);
    io.wait_disconnected();
    let status = child.wait().unwrap();
    let mut log = String::new();
    use std::io::Read;
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut log)
        .unwrap();
    assert!(status.success(), "{log}");
    assert!(log.contains("stopped"), "{log}");
    drop(admin);
}

/// Starts `nvmf-tgt` on a file-backed namespace (512 B blocks, O_DIRECT) listening on a free
/// loopback port; returns the daemon and its address once it listens.
fn start_file_daemon(dir: &std::path::Path, image: &std::path::Path) -> (Daemon, SocketAddr) {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, free_port()));
    let config = dir.join(format!("file-{}.toml", addr.port()));
    std::fs::write(
        &config,
        format!(
            "[reactors]\ncores = [0, 1]\n[transport]\nprovider = \"soft\"\nfabric = \"tcp\"\n\
             listen = [\"{addr}\"]\nsrq_depth = 256\ndata_buffers = 256\n\
             [[bdev]]\nname = \"f\"\nkind = \"file\"\npath = \"{}\"\nsize = 1048576\n\
             block_size = 512\ndirect = true\n\
             [[subsystem]]\nnqn = \"{SUBNQN}\"\nallow_any_host = true\n\
             [[subsystem.namespace]]\nnsid = 1\nbdev = \"f\"\n",
            image.display()
        ),
    )
    .unwrap();
    (Daemon::start(&config, Stdio::null(), &[addr]), addr)
}

/// SIGTERM, and the daemon's exit status.
fn stop(mut daemon: Daemon) -> std::process::ExitStatus {
    let ok = Command::new("kill")
        .arg("-TERM")
        .arg(daemon.0.id().to_string())
        .status()
        .unwrap()
        .success();
    assert!(ok);
    daemon.0.wait().unwrap()
}

#[test]
fn file_namespace_keeps_flushed_data_across_a_restart() {
    // Under the build folder, not /tmp: O_DIRECT needs a file system that supports it.
    std::fs::create_dir_all(concat!(env!("CARGO_TARGET_TMPDIR"), "/nvmf-tgt-restart")).unwrap();
    let dir =
        tempfile::tempdir_in(concat!(env!("CARGO_TARGET_TMPDIR"), "/nvmf-tgt-restart")).unwrap();
    let image = dir.path().join("ns1.img");
    let _host_device = Context::open(&DeviceSpec::Soft(SoftConfig {
        name: format!("restart-host{}", std::process::id()),
        fabric: SoftFabric::Tcp,
        ip: Ipv4Addr::new(127, 0, 5, 10),
        ..SoftConfig::default()
    }))
    .expect("host soft device");
    let data = pattern(0xC3, 8192);

    let (daemon, addr) = start_file_daemon(dir.path(), &image);
    {
        let mut admin = HostQueue::connect(addr, 0, 32);
        let cntlid = connect(&mut admin, 0, CNTLID_DYNAMIC);
        enable(&mut admin);
        let mut io = HostQueue::connect(addr, 1, 32);
        connect(&mut io, 1, cntlid);
        io.write_data(0, &data);
        let c = io.exec(rw(0x01, 40, 16, io.keyed(0, 8192)), &[]).unwrap();
        assert!(c.status.is_success(), "write: {c:?}");
        let c = io.exec(Sqe::new(0x00, 0, 1), &[]).unwrap();
        assert!(c.status.is_success(), "flush: {c:?}");
        let status = stop(daemon);
        assert!(status.success(), "first daemon: {status}");
        io.wait_disconnected();
    }

    let (daemon, addr) = start_file_daemon(dir.path(), &image);
    let mut admin = HostQueue::connect(addr, 0, 32);
    let cntlid = connect(&mut admin, 0, CNTLID_DYNAMIC);
    enable(&mut admin);
    let mut io = HostQueue::connect(addr, 1, 32);
    connect(&mut io, 1, cntlid);
    let c = io
        .exec(rw(0x02, 40, 16, io.keyed(16384, 8192)), &[])
        .unwrap();
    assert!(c.status.is_success(), "read after restart: {c:?}");
    assert!(
        io.read_data(16384, 8192) == data,
        "data written and flushed before SIGTERM reads back after the restart"
    );
    let status = stop(daemon);
    assert!(status.success(), "second daemon: {status}");
}

/// The stats file as it is after SIGUSR1: the first snapshot collected after the signal (its
/// `signals` count grew; `sequence` alone could name one collected before it and written
/// after).
fn fresh_stats(daemon: &Daemon, path: &std::path::Path) -> serde_json::Value {
    let read =
        || -> Option<serde_json::Value> { serde_json::from_slice(&std::fs::read(path).ok()?).ok() };
    let before = read().and_then(|v| v["signals"].as_u64()).unwrap_or(0);
    let ok = Command::new("kill")
        .arg("-USR1")
        .arg(daemon.0.id().to_string())
        .status()
        .unwrap()
        .success();
    assert!(ok);
    let mut fresh = None;
    wait_until("the stats file rewritten after SIGUSR1", || {
        fresh = read().filter(|v| v["signals"].as_u64() > Some(before));
        fresh.is_some()
    });
    fresh.unwrap()
}

#[test]
fn stats_file_shows_qpairs_and_receive_slots_of_every_group() {
    let dir = tempfile::tempdir().unwrap();
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, free_port()));
    // A second device (another listen IP) on the same two reactors: its groups count too.
    let other = SocketAddr::from((Ipv4Addr::new(127, 0, 5, 12), addr.port()));
    let stats = dir.path().join("stats.json");
    let config = dir.path().join("t.toml");
    std::fs::write(
        &config,
        format!(
            "[reactors]\ncores = [0, 1]\n[transport]\nprovider = \"soft\"\nfabric = \"tcp\"\n\
             listen = [\"{addr}\", \"{other}\"]\nsrq_depth = 256\ndata_buffers = 256\n\
             [daemon]\nstats_file = \"{}\"\nstats_interval_ms = 60000\n\
             [[bdev]]\nname = \"m\"\nkind = \"malloc\"\nsize = 1048576\nblock_size = 512\n\
             [[subsystem]]\nnqn = \"{SUBNQN}\"\nallow_any_host = true\n\
             [[subsystem.namespace]]\nnsid = 1\nbdev = \"m\"\n",
            stats.display()
        ),
    )
    .unwrap();
    let daemon = Daemon::start(&config, Stdio::null(), &[addr, other]);
    let _host_device = Context::open(&DeviceSpec::Soft(SoftConfig {
        name: format!("stats-host{}", std::process::id()),
        fabric: SoftFabric::Tcp,
        ip: Ipv4Addr::new(127, 0, 5, 11),
        ..SoftConfig::default()
    }))
    .expect("host soft device");

    // Admin queue on the first device, an I/O queue on the second, I/O done on it.
    let mut admin = HostQueue::connect(addr, 0, 32);
    let cntlid = connect(&mut admin, 0, CNTLID_DYNAMIC);
    enable(&mut admin);
    let mut io = HostQueue::connect(other, 1, 32);
    connect(&mut io, 1, cntlid);
    io.write_data(0, &pattern(0x42, 4096));
    let c = io.exec(rw(0x01, 0, 8, io.keyed(0, 4096)), &[]).unwrap();
    assert!(c.status.is_success(), "{c:?}");

    // The target frees the request when its response SEND is retired: by its own completion,
    // or by the silent flush of an idle group, which over soft TCP the host acknowledges when
    // it polls. So the idle state is waited for, not read from the first snapshot.
    let mut s = serde_json::Value::Null;
    wait_until("every request of the daemon freed", || {
        admin.poll_once();
        io.poll_once();
        s = fresh_stats(&daemon, &stats);
        s["reactors"].as_array().unwrap().iter().all(|r| {
            r["groups"]
                .as_array()
                .unwrap()
                .iter()
                .all(|g| g["requests"]["in_use"] == 0)
        })
    });
    assert_eq!(s["qpairs"], 2, "{s:#}");
    let reactors = s["reactors"].as_array().unwrap();
    assert_eq!(reactors.len(), 2, "{s:#}");
    let groups: Vec<&serde_json::Value> = reactors
        .iter()
        .flat_map(|r| r["groups"].as_array().unwrap())
        .collect();
    assert_eq!(groups.len(), 4, "a group per device and reactor: {s:#}");
    for device in [0, 1] {
        let q: u64 = groups
            .iter()
            .filter(|g| g["device"] == device)
            .map(|g| g["qpairs"].as_u64().unwrap())
            .sum();
        assert_eq!(q, 1, "one qpair on device {device}: {s:#}");
    }
    let writes: u64 = reactors
        .iter()
        .map(|r| r["io"]["writes"].as_u64().unwrap())
        .sum();
    assert_eq!(
        writes, 1,
        "the second device's I/O counted per reactor: {s:#}"
    );
    for g in &groups {
        let slots = &g["recv_slots"];
        assert_eq!(slots["total"], 256, "{g:#}");
        assert_eq!(slots["held"], 0, "idle: no slot held: {g:#}");
        let free = slots["posted"].as_u64().unwrap() + slots["spare"].as_u64().unwrap();
        assert_eq!(free, 256, "idle: every slot posted or spare: {g:#}");
        assert_eq!(g["requests"]["in_use"], 0, "{g:#}");
        assert_eq!(g["counters"]["recv_slot_errors"], 0, "{g:#}");
    }

    io.disconnect();
    admin.disconnect();
    let mut last = serde_json::Value::Null;
    wait_until("no qpair in the daemon's statistics", || {
        last = fresh_stats(&daemon, &stats);
        last["qpairs"] == 0
    });
    assert_eq!(last["recv_slots_held"], 0, "{last:#}");
    let gone: u64 = last["reactors"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| r["groups"].as_array().unwrap())
        .map(|g| g["counters"]["qpairs_gone"].as_u64().unwrap())
        .sum();
    assert_eq!(gone, 2, "{last:#}");
    let status = stop(daemon);
    assert!(status.success(), "{status}");
}
