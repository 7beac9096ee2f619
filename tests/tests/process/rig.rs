//! What the process tests share: the built binaries, an nvmf-tgt configuration over the soft
//! TCP fabric (namespace 1 a file under the build folder, opened O_DIRECT; namespace 2
//! malloc), the target started and stopped, and `nvmf` run against it.
//!
//! The tests start the built binaries, which only their own packages' tests can name
//! (`CARGO_BIN_EXE_*`): `scripts/process-e2e.sh` builds them and runs these tests (test.sh calls
//! it), so they are `#[ignore]`d in a plain `cargo test`.

use std::io::Read;
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// The subsystem nvmf-tgt serves.
pub const NQN: &str = "nqn.2016-06.io.nvmf-rs:process";

/// A child process killed if the test fails before it ends (no orphan).
pub struct Process(pub Child);

impl Drop for Process {
    fn drop(&mut self) {
        if self.0.try_wait().ok().flatten().is_none() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Where the binaries are: $NVMF_BIN_DIR (the script sets it), else next to this test's
/// build folder.
pub fn bin(name: &str) -> PathBuf {
    let dir = std::env::var_os("NVMF_BIN_DIR")
        .map(PathBuf::from)
        .or_else(|| {
            let exe = std::env::current_exe().ok()?;
            Some(exe.parent()?.parent()?.to_path_buf())
        })
        .expect("no binary folder");
    let path = dir.join(name);
    assert!(
        path.is_file(),
        "{} missing: run scripts/process-e2e.sh (it builds nvmf-tgt, nvmf and nvmf-perf)",
        path.display()
    );
    path
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

pub fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !done() {
        assert!(Instant::now() < deadline, "gave up waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn read_file(path: &Path) -> String {
    let mut s = String::new();
    if let Ok(mut f) = std::fs::File::open(path) {
        let _ = f.read_to_string(&mut s);
    }
    s
}

/// A working folder (nvmf-tgt's configuration, its namespace file, logs) and the address
/// nvmf-tgt listens on.
pub struct Rig {
    pub dir: tempfile::TempDir,
    config: PathBuf,
    addr: SocketAddr,
}

impl Rig {
    pub fn new() -> Rig {
        Rig::with_transport("")
    }

    /// As [`Rig::new`], with `lines` (TOML, each ending in a newline) added to nvmf-tgt's
    /// `[transport]` table.
    pub fn with_transport(lines: &str) -> Rig {
        // Under the build folder, not /tmp: O_DIRECT needs a file system that supports it.
        let base = concat!(env!("CARGO_TARGET_TMPDIR"), "/process");
        std::fs::create_dir_all(base).expect("tmp folder");
        let dir = tempfile::tempdir_in(base).expect("tmp dir");
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, free_port()));
        let config = dir.path().join("nvmf-tgt.toml");
        let keep = dir.path().join("keep.img");
        std::fs::write(
            &config,
            format!(
                "[reactors]\ncores = [0, 1]\n[transport]\n{lines}provider = \"soft\"\n\
                 fabric = \"tcp\"\nlisten = [\"{addr}\"]\n\
                 [[bdev]]\nname = \"keep\"\nkind = \"file\"\npath = \"{}\"\nsize = 1048576\n\
                 block_size = 512\ndirect = true\n\
                 [[bdev]]\nname = \"load\"\nkind = \"malloc\"\nsize = 4194304\nblock_size = 512\n\
                 [[subsystem]]\nnqn = \"{NQN}\"\nallow_any_host = true\n\
                 [[subsystem.namespace]]\nnsid = 1\nbdev = \"keep\"\n\
                 [[subsystem.namespace]]\nnsid = 2\nbdev = \"load\"\n",
                keep.display(),
            ),
        )
        .expect("config");
        Rig { dir, config, addr }
    }

    pub fn start_target(&self, log: &str) -> Process {
        let log = std::fs::File::create(self.dir.path().join(log)).expect("log");
        let target = Process(
            Command::new(bin("nvmf-tgt"))
                .arg("--config")
                .arg(&self.config)
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .expect("nvmf-tgt starts"),
        );
        wait_until("nvmf-tgt listening", || {
            TcpStream::connect(self.addr).is_ok()
        });
        target
    }

    pub fn host_args(&self) -> Vec<String> {
        [
            "--transport",
            "soft-tcp",
            "--traddr",
            "127.0.0.1",
            "--trsvcid",
            &self.addr.port().to_string(),
            "--subnqn",
            NQN,
        ]
        .map(String::from)
        .to_vec()
    }

    /// The built binary `name` with the target's address and then `args`, to completion:
    /// (status, stdout, stderr).
    fn host_tool(&self, name: &str, args: &[&str]) -> (ExitStatus, String, String) {
        let out = Command::new(bin(name))
            .args(self.host_args())
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("{name} runs: {e}"));
        (
            out.status,
            String::from_utf8_lossy(&out.stdout).into(),
            String::from_utf8_lossy(&out.stderr).into(),
        )
    }

    /// `nvmf-perf ARGS...` to completion against the target: (status, stdout, stderr).
    pub fn perf(&self, args: &[&str]) -> (ExitStatus, String, String) {
        self.host_tool("nvmf-perf", args)
    }

    /// `nvmf ARGS...` to completion, giving up on a lost connection at once: (status, stdout,
    /// stderr).
    pub fn nvmf(&self, args: &[&str]) -> (ExitStatus, String, String) {
        let no_reconnect = ["--reconnect-delay", "1", "--ctrl-loss-tmo", "0"];
        self.host_tool("nvmf", &[&no_reconnect[..], args].concat())
    }

    /// `nvmf ARGS...`, which must succeed: its stdout.
    pub fn nvmf_ok(&self, args: &[&str]) -> String {
        let (status, out, err) = self.nvmf(args);
        assert!(status.success(), "nvmf {args:?}: {status}\n{err}");
        out
    }

    /// `nvmf VERB` (read or write) of `count` blocks from `first` of namespace `nsid`, the data
    /// in `file`; must succeed.
    pub fn block_io(&self, verb: &str, nsid: u32, first: usize, count: usize, file: &Path) {
        let (nsid, first, count) = (nsid.to_string(), first.to_string(), count.to_string());
        let file = file.to_str().expect("utf-8 path");
        self.nvmf_ok(&[
            verb,
            "--nsid",
            &nsid,
            "--start-block",
            &first,
            "--block-count",
            &count,
            "--data",
            file,
        ]);
    }
}

pub fn sigterm(process: &mut Process) -> ExitStatus {
    let ok = Command::new("kill")
        .arg("-TERM")
        .arg(process.0.id().to_string())
        .status()
        .expect("kill")
        .success();
    assert!(ok);
    process.0.wait().expect("wait")
}
