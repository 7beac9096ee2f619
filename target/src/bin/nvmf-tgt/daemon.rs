//! The daemon's life: build the target (block devices, subsystems), start one reactor per
//! configured core with a [`ReactorIo`] each and the keep-alive sweep, serve until SIGINT or
//! SIGTERM, then stop within `shutdown_timeout_ms`: reactors drain (pollers finish in-flight
//! I/O and disconnect their qpairs), then every file bdev is flushed to stable storage.
//!
//! The fabric attaches in [`attach_transport`]: the RDMA transport takes the reactor handles,
//! and each of its poll groups gets an `NvmeHandler` built from the target and that reactor's
//! `ReactorIo`. On stop the transport goes first (no new connections, qpairs drained, their
//! block I/O finished), then the reactors.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use nvmf_poller::{Runtime, RuntimeConfig};
use nvmf_target::bdev::{BdevOp, IoBuf, IoStatus, Submitted};
use nvmf_target::config::{Config, Fabric, Provider};
use nvmf_target::nvme::{ReactorIo, Target};
use nvmf_target::rdma::{DeviceListen, PollGroupConfig, RdmaConfig, RdmaTransport};
use nvmf_target::transport_glue::{Command, NvmeHandler};
use nvmf_transport::{DeviceCapFlags, DeviceSpec, ProviderKind, SoftConfig, SoftFabric};
use std::net::{IpAddr, SocketAddr};

use crate::stats::Stats;

/// How often the main thread looks at signals.
const SIGNAL_POLL: Duration = Duration::from_millis(50);

struct Signals {
    stop: Arc<AtomicBool>,
    dump: Arc<AtomicBool>,
}

impl Signals {
    fn install() -> Result<Signals> {
        let stop = Arc::new(AtomicBool::new(false));
        let dump = Arc::new(AtomicBool::new(false));
        for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
            // The first asks for the orderly stop; a second, while that stop hangs (a device
            // that never answers), ends the process at once, exit status 1.
            signal_hook::flag::register_conditional_shutdown(sig, 1, stop.clone())
                .context("installing SIGINT/SIGTERM")?;
            signal_hook::flag::register(sig, stop.clone()).context("installing SIGINT/SIGTERM")?;
        }
        signal_hook::flag::register(signal_hook::consts::SIGUSR1, dump.clone())
            .context("installing SIGUSR1")?;
        Ok(Signals { stop, dump })
    }
}

/// The transport as the daemon runs it.
type Transport = RdmaTransport<Command, NvmeHandler>;

/// The devices to serve from the `[transport]` section: a soft device per listen IP (soft
/// devices own their address), or the first verbs device listening on every address.
fn open_devices(config: &Config) -> Result<Vec<DeviceListen>> {
    let t = &config.transport;
    let listen: Vec<SocketAddr> = t.listen.get_ref().iter().map(|a| *a.get_ref()).collect();
    let soft = || -> Result<Vec<DeviceListen>> {
        let fabric = match t.fabric.as_ref().map(|f| *f.get_ref()).unwrap_or_default() {
            Fabric::Tcp => SoftFabric::Tcp,
            Fabric::Inproc => SoftFabric::InProcess,
        };
        let mut by_ip: Vec<DeviceListen> = Vec::new();
        for addr in &listen {
            let IpAddr::V4(ip) = addr.ip() else {
                anyhow::bail!("transport.listen: {addr}: the soft provider serves IPv4 only");
            };
            if let Some(d) = by_ip.iter_mut().find(|d| d.listen[0].ip() == addr.ip()) {
                d.listen.push(*addr);
                continue;
            }
            let name = format!("nvmf-tgt{}-{}", std::process::id(), by_ip.len());
            let ctx = nvmf_transport::Context::open(&DeviceSpec::Soft(SoftConfig {
                name,
                fabric,
                ip,
                ..SoftConfig::default()
            }))
            .with_context(|| format!("opening a soft RDMA device on {ip}"))?;
            by_ip.push(DeviceListen {
                ctx,
                listen: vec![*addr],
            });
        }
        Ok(by_ip)
    };
    let verbs = |spec: DeviceSpec| -> Result<Vec<DeviceListen>> {
        let ctx = nvmf_transport::Context::open(&spec).context("opening the RDMA device")?;
        Ok(vec![DeviceListen {
            ctx,
            listen: listen.clone(),
        }])
    };
    match t.provider {
        Provider::Soft => soft(),
        Provider::Verbs => verbs(DeviceSpec::Verbs(None)),
        Provider::Auto => {
            let has_verbs = nvmf_transport::devices()
                .map(|d| d.iter().any(|i| i.provider == ProviderKind::Verbs))
                .unwrap_or(false);
            if has_verbs {
                verbs(DeviceSpec::Verbs(None))
            } else {
                soft()
            }
        }
    }
}

/// Start the fabric on the running reactors: the RDMA transport with one [`NvmeHandler`]
/// per poll group, each taking its reactor's `ReactorIo` (a second device's groups on the same
/// reactor get their own).
fn attach_transport(
    config: &Config,
    runtime: &Runtime,
    target: &Arc<Target>,
    io: Vec<ReactorIo>,
) -> Result<Transport> {
    let t = &config.transport;
    let devices = open_devices(config)?;
    let mut rdma = RdmaConfig::new(devices);
    rdma.group = PollGroupConfig {
        srq_depth: *t.srq_depth.get_ref(),
        max_queue_depth: (*t.max_queue_depth.get_ref()).max(*t.max_aq_depth.get_ref()),
        in_capsule_data_size: *t.in_capsule_data_size.get_ref(),
        io_unit_size: *t.io_unit_size.get_ref(),
        data_buffers: *t.data_buffers.get_ref(),
        silent_answers: *t.silent_answers.get_ref(),
        ..PollGroupConfig::default()
    };
    // Request objects bound the CQ (each may have a chain of 17 WRs on it): fewer of them on
    // devices with small CQs (rxe: 32767 entries). The poll group applies the same cap per
    // device; doing it here for the smallest device gives every group one size and a clear
    // error before any reactor is touched.
    let max_cqe = rdma
        .devices
        .iter()
        .filter_map(|d| d.ctx.query_device().ok().map(|a| a.max_cqe))
        .min()
        .unwrap_or(u32::MAX);
    rdma.group
        .fit_cq(max_cqe)
        .context("transport: sizing the poll groups' completion queues")?;
    tracing::info!(
        max_requests = rdma.group.max_requests,
        cq_depth = rdma.group.cq_depth(),
        "poll group sizing"
    );
    rdma.max_qid = target.limits().max_io_queues;
    if !t.remote_invalidate {
        tracing::info!(
            "remote_invalidate = false: responses never invalidate a host's key (the host does)"
        );
    }
    // Per device: SEND_WITH_INVALIDATE needs the memory management extensions.
    let remote_invalidate: Vec<bool> = rdma
        .devices
        .iter()
        .map(|d| {
            let able = d
                .ctx
                .query_device()
                .is_ok_and(|a| a.cap_flags.contains(DeviceCapFlags::MEM_MGT_EXTENSIONS));
            if t.remote_invalidate && !able {
                tracing::info!(
                    device = d.ctx.name(),
                    "no memory management extensions: responses never invalidate a host's key \
                     (the host does)"
                );
            }
            t.remote_invalidate && able
        })
        .collect();
    let mut io: Vec<Option<ReactorIo>> = io.into_iter().map(Some).collect();
    let transport = RdmaTransport::start(runtime.reactors(), rdma, |info| {
        let io = io
            .get_mut(info.reactor)
            .and_then(Option::take)
            .unwrap_or_else(|| ReactorIo::new(target.clone()));
        NvmeHandler::new(target.clone(), io)
            .with_remote_invalidate(remote_invalidate.get(info.device).copied().unwrap_or(false))
    })
    .context("starting the RDMA transport")?;
    tracing::info!(listening = ?transport.listening(), "serving NVMe-oF over RDMA");
    Ok(transport)
}

/// Run until a stop signal.
pub fn run(config: &Config) -> Result<()> {
    let signals = Signals::install()?;
    let target = Arc::new(Target::from_config(config).context("building the target")?);
    for s in target.subsystems() {
        let (ns, _) = s.namespaces();
        tracing::info!(subsystem = %s.nqn, namespaces = ns.active().count(), listen = ?s.listen, "subsystem ready");
    }
    let cores = config.reactors.cores.get_ref().clone();
    let shutdown = Duration::from_millis(config.daemon.shutdown_timeout_ms);
    let runtime = Runtime::start(
        RuntimeConfig::new(cores)
            .drain_timeout(shutdown)
            .idle_after(config.reactors.idle_after()),
    )
    .context("starting reactors")?;
    let io: Vec<ReactorIo> = runtime
        .reactors()
        .iter()
        .map(|_| ReactorIo::new(target.clone()))
        .collect();
    let mut stats = Stats::new(target.clone());
    {
        // Reactor 0 sweeps for expired keep-alive timers as often as KAS says it does.
        let sweep = target.limits().keep_alive_granularity();
        let target = target.clone();
        runtime.reactors()[0]
            .send(move |r| {
                r.add_timer(sweep, Some(sweep), move |r| {
                    target.reap_expired(r.now());
                });
            })
            .context("keep-alive timer")?;
    }
    let transport = match attach_transport(config, &runtime, &target, io) {
        Ok(t) => t,
        Err(e) => {
            let _ = runtime.stop();
            return Err(e);
        }
    };
    tracing::info!(reactors = runtime.reactors().len(), "nvmf-tgt running");

    let interval = Duration::from_millis(config.daemon.stats_interval_ms.max(100));
    let mut next_stats = Instant::now();
    while !signals.stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        let dump = signals.dump.swap(false, Ordering::Relaxed);
        if dump || now >= next_stats {
            match stats.collect(dump, &runtime, &transport) {
                Ok(snapshot) => {
                    if dump {
                        snapshot.log();
                    }
                    if let Some(path) = &config.daemon.stats_file {
                        if let Err(e) = snapshot.write_file(path) {
                            tracing::warn!("stats file {}: {e}", path.display());
                        }
                    }
                }
                Err(e) => tracing::warn!("statistics: {e:#}"),
            }
            next_stats = now + interval;
        }
        std::thread::sleep(SIGNAL_POLL);
    }

    tracing::info!("stopping: disconnecting hosts, draining qpairs");
    let started = Instant::now();
    if let Err(e) = transport.stop(shutdown) {
        tracing::warn!("stopping the transport: {e}");
    }
    let reactor_stats = runtime.stop().context("stopping reactors")?;
    if reactor_stats.iter().any(|s| s.drain_timed_out) {
        tracing::warn!("some reactors did not drain within {shutdown:?}");
    }
    flush_all(&target, shutdown.saturating_sub(started.elapsed()));
    tracing::info!(took = ?started.elapsed(), "stopped");
    Ok(())
}

/// Flush every block device to stable storage from this (control) thread, each within what is
/// left of `budget`.
fn flush_all(target: &Target, budget: Duration) {
    let deadline = Instant::now() + budget;
    for bdev in target.bdevs() {
        let name = bdev.info().name.clone();
        let mut ch = match bdev.open_channel() {
            Ok(ch) => ch,
            Err(e) => {
                tracing::error!("flush {name}: {e}");
                continue;
            }
        };
        let mut status = match ch.submit(BdevOp::Flush, &mut IoBuf::empty(), 0) {
            Submitted::Done(s) => Some(s),
            Submitted::Queued => None,
        };
        while status.is_none() && Instant::now() < deadline {
            ch.poll(&mut |_, s| status = Some(s));
            if status.is_none() {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        match status {
            Some(IoStatus::Success) => tracing::debug!(bdev = %name, "flushed"),
            Some(s) => tracing::error!(bdev = %name, ?s, "flush failed"),
            None => tracing::error!(bdev = %name, "flush did not finish in time"),
        }
    }
}
