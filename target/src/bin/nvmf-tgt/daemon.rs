//! The daemon's life: build the target (block devices, subsystems), start one reactor per
//! configured core with a [`ReactorIo`] each and the keep-alive sweep, serve until SIGINT or
//! SIGTERM, then stop within `shutdown_timeout_ms`: reactors drain (pollers finish in-flight
//! I/O and disconnect their qpairs), then every file bdev is flushed to stable storage.
//!
//! The fabric attaches in [`attach_transport`]: the RDMA transport takes the reactor handles,
//! and each of its poll groups gets a handler built from the target and that reactor's
//! `ReactorIo` (the interface in `nvmf_target::nvme`). Until the request glue exists that
//! function serves no fabric and says so in the log.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use nvmf_poller::{Runtime, RuntimeConfig};
use nvmf_target::bdev::{BdevOp, IoBuf, IoStatus, Submitted};
use nvmf_target::config::Config;
use nvmf_target::nvme::{ReactorIo, Target};

use crate::stats::Stats;

/// How often reactor 0 sweeps for expired keep-alive timers.
const KEEP_ALIVE_SWEEP: Duration = Duration::from_millis(500);
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
            signal_hook::flag::register(sig, stop.clone()).context("installing SIGINT/SIGTERM")?;
        }
        signal_hook::flag::register(signal_hook::consts::SIGUSR1, dump.clone())
            .context("installing SIGUSR1")?;
        Ok(Signals { stop, dump })
    }
}

/// Start the fabric on the running reactors. See the module documentation.
fn attach_transport(
    config: &Config,
    _runtime: &Runtime,
    _target: &Arc<Target>,
    _io: Vec<ReactorIo>,
) {
    tracing::warn!(
        listen = ?config.transport.listen.get_ref().iter().map(|a| *a.get_ref()).collect::<Vec<_>>(),
        "the RDMA request path is not attached in this build: no fabric is served"
    );
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
    let runtime = Runtime::start(RuntimeConfig::new(cores).drain_timeout(shutdown))
        .context("starting reactors")?;
    let io: Vec<ReactorIo> = runtime
        .reactors()
        .iter()
        .map(|_| ReactorIo::new(target.clone()))
        .collect();
    let stats = Stats::new(
        target.clone(),
        io.iter().map(|i| i.counters().clone()).collect(),
    );
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
    attach_transport(config, &runtime, &target, io);
    tracing::info!(reactors = runtime.reactors().len(), "nvmf-tgt running");

    let interval = Duration::from_millis(config.daemon.stats_interval_ms.max(100));
    let mut next_stats = Instant::now();
    while !signals.stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        let dump = signals.dump.swap(false, Ordering::Relaxed);
        if dump || now >= next_stats {
            let snapshot = stats.collect(&runtime);
            if dump {
                snapshot.log();
            }
            if let Some(path) = &config.daemon.stats_file {
                if let Err(e) = snapshot.write_file(path) {
                    tracing::warn!("stats file {}: {e}", path.display());
                }
            }
            next_stats = now + interval;
        }
        std::thread::sleep(SIGNAL_POLL);
    }

    tracing::info!("stopping: draining reactors");
    let started = Instant::now();
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
