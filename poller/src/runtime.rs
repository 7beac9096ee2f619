//! `Runtime`: validates the configured cores, starts one (pinned) reactor thread per core, and
//! stops and joins them.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::AtomicBool;
use std::thread::{self, JoinHandle};

use crate::config::RuntimeConfig;
use crate::error::PollerError;
use crate::handle::{ReactorHandle, Shared};
use crate::idle::{Sleeper, WAKER_TOKEN};
use crate::reactor::{Reactor, Timing};
use crate::stats::{Counters, ReactorStats};

/// The running set of reactors. Dropping it stops and joins them (errors are then only logged;
/// call [`Runtime::stop`] to see them).
pub struct Runtime {
    handles: Arc<[ReactorHandle]>,
    threads: Vec<JoinHandle<()>>,
}

impl Runtime {
    /// Validate `cfg` and start its reactors. Returns once every reactor thread runs (and is
    /// pinned, if asked). On any failure the reactors already started are stopped again.
    pub fn start(cfg: RuntimeConfig) -> Result<Runtime, PollerError> {
        validate_cores(&cfg.cores)?;
        let timing = Timing {
            idle_after: cfg.idle_after,
            drain_timeout: cfg.drain_timeout,
        };

        // Everything that can fail without a thread is made here, so handles to all reactors
        // exist before any reactor runs (each reactor can reach every other from the start).
        let mut parts = Vec::with_capacity(cfg.cores.len());
        let mut handles = Vec::with_capacity(cfg.cores.len());
        for (id, &core) in cfg.cores.iter().enumerate() {
            let io = |source| PollerError::Io {
                reactor: id,
                source,
            };
            let poll = mio::Poll::new().map_err(io)?;
            let waker = mio::Waker::new(poll.registry(), WAKER_TOKEN).map_err(io)?;
            let (tx, rx) = crossbeam_channel::unbounded();
            handles.push(ReactorHandle {
                shared: Arc::new(Shared {
                    id,
                    core,
                    tx,
                    waker,
                    sleeping: AtomicBool::new(false),
                    thread: OnceLock::new(),
                    counters: Counters::default(),
                }),
            });
            parts.push((poll, rx));
        }
        let handles: Arc<[ReactorHandle]> = handles.into();

        let (ready_tx, ready_rx) = crossbeam_channel::unbounded();
        let mut runtime = Runtime {
            handles: Arc::clone(&handles),
            threads: Vec::with_capacity(parts.len()),
        };
        for (id, (poll, rx)) in parts.into_iter().enumerate() {
            let handles = Arc::clone(&handles);
            let ready_tx = ready_tx.clone();
            let pin = cfg.pin;
            let core = cfg.cores[id];
            let spawned = thread::Builder::new()
                .name(format!("nvmf-reactor-{id}"))
                .spawn(move || {
                    if pin && !core_affinity::set_for_current(core_affinity::CoreId { id: core }) {
                        let _ =
                            ready_tx.send((id, Err(PollerError::PinFailed { reactor: id, core })));
                        return;
                    }
                    let _ = handles[id].shared.thread.set(thread::current().id());
                    let reactor = Reactor::new(handles, id, rx, Sleeper::new(poll), timing);
                    let _ = ready_tx.send((id, Ok(())));
                    drop(ready_tx);
                    reactor.run();
                });
            match spawned {
                Ok(t) => runtime.threads.push(t),
                Err(source) => {
                    // Dropping `runtime` stops the reactors already started.
                    return Err(PollerError::Io {
                        reactor: id,
                        source,
                    });
                }
            }
        }
        drop(ready_tx);
        let mut ready = vec![false; runtime.threads.len()];
        // Ends when every thread has reported and dropped its sender (or died trying).
        for (id, res) in ready_rx.iter() {
            res?;
            ready[id] = true;
        }
        if let Some(id) = ready.iter().position(|r| !r) {
            return Err(PollerError::ReactorPanicked { reactor: id });
        }
        tracing::info!(
            reactors = runtime.handles.len(),
            cores = ?cfg.cores,
            pinned = cfg.pin,
            idle_after = ?cfg.idle_after,
            "reactor runtime started"
        );
        Ok(runtime)
    }

    /// Handles of all reactors, indexed by reactor id.
    pub fn reactors(&self) -> &[ReactorHandle] {
        &self.handles
    }

    /// Handle of reactor `id`.
    pub fn reactor(&self, id: usize) -> Option<&ReactorHandle> {
        self.handles.get(id)
    }

    /// Stop every reactor (they drain in parallel), join them, and return their final counters.
    /// Fails with [`PollerError::ReactorPanicked`] if any reactor thread panicked (all are
    /// joined regardless).
    pub fn stop(mut self) -> Result<Vec<ReactorStats>, PollerError> {
        self.stop_and_join()?;
        Ok(self.handles.iter().map(ReactorHandle::stats).collect())
    }

    fn stop_and_join(&mut self) -> Result<(), PollerError> {
        for h in self.handles.iter() {
            // Already exited is fine: we only want it gone.
            let _ = h.request_stop();
        }
        let mut result = Ok(());
        for (id, t) in self.threads.drain(..).enumerate() {
            if t.join().is_err() {
                tracing::error!(reactor = id, "reactor thread panicked");
                if result.is_ok() {
                    result = Err(PollerError::ReactorPanicked { reactor: id });
                }
            }
        }
        result
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        if !self.threads.is_empty() {
            let _ = self.stop_and_join();
        }
    }
}

/// Cores must be non-empty, distinct, and in this process' affinity mask.
fn validate_cores(cores: &[usize]) -> Result<(), PollerError> {
    if cores.is_empty() {
        return Err(PollerError::NoCores);
    }
    let mut available: Vec<usize> = core_affinity::get_core_ids()
        .ok_or(PollerError::CoreQueryFailed)?
        .into_iter()
        .map(|c| c.id)
        .collect();
    available.sort_unstable();
    let mut seen = HashSet::new();
    for &core in cores {
        if available.binary_search(&core).is_err() {
            return Err(PollerError::NoSuchCore {
                core,
                available: available.clone(),
            });
        }
        if !seen.insert(core) {
            return Err(PollerError::DuplicateCore { core });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation() {
        assert!(matches!(validate_cores(&[]), Err(PollerError::NoCores)));
        assert!(matches!(
            validate_cores(&[usize::MAX]),
            Err(PollerError::NoSuchCore { core: usize::MAX, ref available }) if !available.is_empty()
        ));
        assert!(matches!(
            validate_cores(&[0, 0]),
            Err(PollerError::DuplicateCore { core: 0 })
        ));
        assert!(validate_cores(&[0]).is_ok());
    }
}
