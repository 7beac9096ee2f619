//! The target under test, two ways:
//! - [`InProcessTarget`]: the target crate's library started the way the nvmf-tgt daemon starts
//!   it (`Target::from_config`, one reactor per configured core, the keep-alive sweep, the RDMA
//!   transport with an `NvmeHandler` per poll group, the poll groups sized from `[transport]`),
//!   on the soft in-process fabric, so a host in this same process reaches it with no syscall
//!   on the I/O path;
//! - [`Daemon`]: the nvmf-tgt binary as its own process (soft TCP fabric), stopped by SIGTERM.
//!
//! Both load the null-bdev configurations shipped in `bench/configs/`, with the reactor core
//! (and the TCP port) rewritten from the command line.

use std::io::Read;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use nvmf_poller::{Runtime, RuntimeConfig};
use nvmf_target::config::Config;
use nvmf_target::nvme::{ReactorIo, Target};
use nvmf_target::rdma::{DeviceListen, PollGroupConfig, RdmaConfig, RdmaTransport};
use nvmf_target::transport_glue::{Command as NvmeCommand, NvmeHandler};
use nvmf_transport::{Context, DeviceSpec, SoftConfig, SoftFabric};

/// The in-process configuration (soft in-process fabric, null namespace).
pub const INPROC_CONFIG: &str = include_str!("../configs/null-inproc.toml");
/// The daemon's configuration (soft TCP fabric, null namespace).
pub const TCP_CONFIG: &str = include_str!("../configs/null-tcp.toml");
/// The subsystem both serve.
pub const NQN: &str = "nqn.2016-06.io.nvmf-rs:bench";
/// Port the TCP configuration listens on unless rewritten.
pub const TCP_PORT: u16 = 4520;

/// How often reactor 0 sweeps keep-alive timers (as the daemon does).
const KEEP_ALIVE_SWEEP: Duration = Duration::from_millis(500);

/// `text` with its `cores = [0]` replaced by `cores = [core]` (and the TCP port by `port`).
pub fn rewrite(text: &str, core: usize, port: Option<u16>) -> Result<String> {
    if !text.contains("cores = [0]") {
        bail!("configuration template has no `cores = [0]` line");
    }
    let mut out = text.replace("cores = [0]", &format!("cores = [{core}]"));
    if let Some(port) = port {
        let from = format!("127.0.0.1:{TCP_PORT}\"");
        if !out.contains(&from) {
            bail!("configuration template has no listener 127.0.0.1:{TCP_PORT}");
        }
        out = out.replace(&from, &format!("127.0.0.1:{port}\""));
    }
    Ok(out)
}

type Transport = RdmaTransport<NvmeCommand, NvmeHandler>;

/// nvmf-tgt's engine in this process. See the module documentation.
pub struct InProcessTarget {
    runtime: Option<Runtime>,
    transport: Option<Transport>,
    /// Where it listens.
    pub addr: SocketAddr,
    _target: Arc<Target>,
}

impl InProcessTarget {
    /// Start the in-process configuration with its reactor on `core`. `idle_after`: how long
    /// the reactor spins without work before it sleeps (the runtime's default when None).
    pub fn start(core: usize, pin: bool, idle_after: Option<Duration>) -> Result<InProcessTarget> {
        let text = rewrite(INPROC_CONFIG, core, None)?;
        let config = Config::parse(&text, "bench/configs/null-inproc.toml")
            .map_err(|e| anyhow::anyhow!("{:?}", e.0))?;
        let target = Arc::new(Target::from_config(&config).context("building the target")?);
        let mut runtime_config =
            RuntimeConfig::new(config.reactors.cores.get_ref().clone()).pin(pin);
        if let Some(idle_after) = idle_after {
            runtime_config = runtime_config.idle_after(idle_after);
        }
        let runtime = Runtime::start(runtime_config).context("starting the target reactor")?;
        {
            let target = target.clone();
            runtime.reactors()[0]
                .send(move |r| {
                    r.add_timer(KEEP_ALIVE_SWEEP, Some(KEEP_ALIVE_SWEEP), move |r| {
                        target.reap_expired(r.now());
                    });
                })
                .context("keep-alive timer")?;
        }
        let t = &config.transport;
        let addr = *t.listen.get_ref()[0].get_ref();
        let IpAddr::V4(ip) = addr.ip() else {
            bail!("the soft provider serves IPv4 only");
        };
        let ctx = Context::open(&DeviceSpec::Soft(SoftConfig {
            name: format!("nvmf-bench-tgt{}", std::process::id()),
            fabric: SoftFabric::InProcess,
            ip,
            ..SoftConfig::default()
        }))
        .context("opening the target's soft device")?;
        let mut rdma = RdmaConfig::new(vec![DeviceListen {
            ctx,
            listen: vec![addr],
        }]);
        // As nvmf-tgt's daemon sizes its groups.
        rdma.group = PollGroupConfig {
            srq_depth: *t.srq_depth.get_ref(),
            max_queue_depth: (*t.max_queue_depth.get_ref()).max(*t.max_aq_depth.get_ref()),
            in_capsule_data_size: *t.in_capsule_data_size.get_ref(),
            io_unit_size: *t.io_unit_size.get_ref(),
            data_buffers: *t.data_buffers.get_ref(),
            ..PollGroupConfig::default()
        };
        let max_cqe = rdma
            .devices
            .iter()
            .filter_map(|d| d.ctx.query_device().ok().map(|a| a.max_cqe))
            .min()
            .unwrap_or(u32::MAX);
        rdma.group
            .fit_cq(max_cqe)
            .context("sizing the poll group")?;
        rdma.max_qid = target.limits().max_io_queues;
        let t2 = target.clone();
        let transport = RdmaTransport::start(runtime.reactors(), rdma, move |_| {
            NvmeHandler::new(t2.clone(), ReactorIo::new(t2.clone()))
        })
        .context("starting the RDMA transport")?;
        Ok(InProcessTarget {
            runtime: Some(runtime),
            transport: Some(transport),
            addr,
            _target: target,
        })
    }

    /// The target's reactors.
    pub fn runtime(&self) -> &Runtime {
        self.runtime.as_ref().expect("runtime lives until stop")
    }

    /// Completions the target's poll groups have reaped from their CQs so far (control path:
    /// a message to each group's reactor).
    pub fn completions(&self) -> Result<u64> {
        let transport = self
            .transport
            .as_ref()
            .context("the transport is stopped")?;
        let counts = transport
            .each_group(|g| g.snapshot().counters.completions)
            .context("reading the poll groups' counters")?;
        Ok(counts.into_iter().map(|(_, n)| n).sum())
    }

    /// Stop as the daemon does: the transport (qpairs drained), then the reactors.
    pub fn stop(mut self) -> Result<()> {
        self.shutdown()
    }

    fn shutdown(&mut self) -> Result<()> {
        if let Some(t) = self.transport.take() {
            t.stop(Duration::from_secs(5))
                .context("stopping the transport")?;
        }
        if let Some(r) = self.runtime.take() {
            r.stop().context("stopping the reactors")?;
        }
        Ok(())
    }
}

impl Drop for InProcessTarget {
    fn drop(&mut self) {
        if let Err(e) = self.shutdown() {
            tracing::warn!("stopping the in-process target: {e:#}");
        }
    }
}

/// A binary built beside this one (nvmf-tgt, nvmf-perf).
pub fn sibling_binary(name: &str) -> Result<PathBuf> {
    let exe = std::env::current_exe().context("locating nvmf-bench")?;
    let path = exe
        .parent()
        .map(|d| d.join(name))
        .context("nvmf-bench has no directory")?;
    if !path.exists() {
        bail!(
            "{} not found: build it first (cargo build --release -p nvmf-target -p nvmf-initiator)",
            path.display()
        );
    }
    Ok(path)
}

/// nvmf-tgt as its own process.
pub struct Daemon {
    child: Child,
    log: PathBuf,
    /// Where it listens.
    pub addr: SocketAddr,
}

impl Daemon {
    /// Start nvmf-tgt with the TCP configuration on `core` and `port`; its config and log go
    /// to `work_dir`. Returns once it serves.
    pub fn start(core: usize, port: u16, work_dir: &Path) -> Result<Daemon> {
        std::fs::create_dir_all(work_dir)
            .with_context(|| format!("creating {}", work_dir.display()))?;
        let config = work_dir.join(format!("null-tcp-{port}.toml"));
        std::fs::write(&config, rewrite(TCP_CONFIG, core, Some(port))?)
            .with_context(|| format!("writing {}", config.display()))?;
        let log = work_dir.join(format!("nvmf-tgt-{port}.log"));
        let log_file =
            std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let child = Command::new(sibling_binary("nvmf-tgt")?)
            .arg("--config")
            .arg(&config)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file)
            .spawn()
            .context("starting nvmf-tgt")?;
        let mut daemon = Daemon {
            child,
            log,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
        };
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let text = daemon.log_text();
            if text.contains("serving NVMe-oF over RDMA") {
                return Ok(daemon);
            }
            if let Some(status) = daemon.child.try_wait()? {
                bail!("nvmf-tgt exited ({status}) before serving:\n{text}");
            }
            if Instant::now() >= deadline {
                bail!("nvmf-tgt did not serve within 15 s:\n{text}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn log_text(&self) -> String {
        let mut s = String::new();
        if let Ok(mut f) = std::fs::File::open(&self.log) {
            let _ = f.read_to_string(&mut s);
        }
        s
    }

    /// The daemon's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGTERM, then wait (kill after 10 s).
    pub fn stop(mut self) -> Result<()> {
        self.terminate()
    }

    fn terminate(&mut self) -> Result<()> {
        if self.child.try_wait()?.is_some() {
            return Ok(());
        }
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait()? {
                if !status.success() {
                    bail!("nvmf-tgt exited with {status}; log: {}", self.log.display());
                }
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        bail!("nvmf-tgt did not stop within 10 s of SIGTERM");
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.terminate();
    }
}

/// Resident memory of a process in KiB (`VmRSS` of /proc/PID/status; "self" for this one).
pub fn rss_kib(pid: &str) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .context("no VmRSS in /proc/PID/status")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shipped_configurations_load_and_rewrite() {
        for (text, port) in [(INPROC_CONFIG, None), (TCP_CONFIG, Some(4999))] {
            let text = rewrite(text, 1, port).unwrap();
            assert!(text.contains("cores = [1]"));
            let config = Config::parse(&text, "t.toml").map_err(|e| e.0).unwrap();
            assert_eq!(config.reactors.cores.get_ref(), &vec![1]);
            if let Some(port) = port {
                assert_eq!(config.transport.listen.get_ref()[0].get_ref().port(), port);
            }
        }
    }

    #[test]
    fn rss_of_this_process_is_read() {
        assert!(rss_kib("self").unwrap() > 0);
    }
}
