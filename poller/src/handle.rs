//! `ReactorHandle`: the cloneable, thread-safe way to reach a reactor (send it messages, read its
//! counters), and the state it shares with the reactor thread, including the sleep/wake
//! handshake.
//!
//! Wake-up handshake (no syscall for a busy reactor): the reactor publishes `sleeping = true`,
//! fences, then re-checks its inbox before it sleeps; a sender pushes its message, fences, then
//! looks at `sleeping` and writes the wake eventfd only if it is set (and only the sender that
//! flips it back to false does). With a SeqCst fence on both sides, either the reactor sees the
//! message or the sender sees the flag, so no message is left behind a sleeping reactor.

use std::fmt;
use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering, fence};
use std::thread::{self, ThreadId};
use std::time::Duration;

use crossbeam_channel::Sender;

use crate::error::PollerError;
use crate::reactor::Reactor;
use crate::stats::{Counters, ReactorStats};

/// A control-path message: runs once on the target reactor's thread with the whole reactor at
/// hand. Allocation is fine here; the I/O path never sends messages per request.
pub type Message = Box<dyn FnOnce(&mut Reactor) + Send>;

pub(crate) struct Shared {
    pub(crate) id: usize,
    pub(crate) core: usize,
    pub(crate) tx: Sender<Message>,
    pub(crate) waker: mio::Waker,
    pub(crate) sleeping: AtomicBool,
    pub(crate) thread: OnceLock<ThreadId>,
    pub(crate) counters: Counters,
}

impl Shared {
    /// Called by senders after queueing: wake the reactor if (and only if) it said it sleeps.
    fn wake_if_sleeping(&self) {
        // Pairs with the fence in `Reactor::try_sleep` (see the module docs).
        fence(Ordering::SeqCst);
        if self.sleeping.load(Ordering::Relaxed) && self.sleeping.swap(false, Ordering::SeqCst) {
            if let Err(e) = self.waker.wake() {
                tracing::warn!(reactor = self.id, error = %e, "cannot wake reactor");
            }
        }
    }
}

/// A cloneable reference to one reactor, usable from any thread.
#[derive(Clone)]
pub struct ReactorHandle {
    pub(crate) shared: Arc<Shared>,
}

impl ReactorHandle {
    /// Reactor index (position in [`crate::RuntimeConfig::cores`]).
    pub fn id(&self) -> usize {
        self.shared.id
    }

    /// Core this reactor was configured for.
    pub fn core(&self) -> usize {
        self.shared.core
    }

    /// Queue `f` to run on the reactor thread. Wakes the reactor if it sleeps.
    pub fn send<F>(&self, f: F) -> Result<(), PollerError>
    where
        F: FnOnce(&mut Reactor) + Send + 'static,
    {
        self.send_boxed(Box::new(f))
    }

    /// [`ReactorHandle::send`] for an already boxed message.
    pub fn send_boxed(&self, msg: Message) -> Result<(), PollerError> {
        self.shared
            .tx
            .send(msg)
            .map_err(|_| PollerError::ReactorStopped {
                reactor: self.shared.id,
            })?;
        self.shared.wake_if_sleeping();
        Ok(())
    }

    /// The reactor thread's kernel thread id (for `cputime::thread_cpu_time`).
    pub fn os_tid(&self) -> Result<u32, PollerError> {
        self.call(|_| crate::cputime::current_tid().unwrap_or(0))
    }

    /// Run `f` on the reactor and wait for its result. For the control thread: calling it from
    /// the reactor's own thread is refused ([`PollerError::WouldDeadlock`]), and calling it from
    /// another reactor blocks that reactor until the answer comes.
    pub fn call<R, F>(&self, f: F) -> Result<R, PollerError>
    where
        R: Send + 'static,
        F: FnOnce(&mut Reactor) -> R + Send + 'static,
    {
        // If the reactor exits before running the message, the message (and its sender) is
        // dropped: the wait ends as Disconnected.
        self.call_with(f, |rx| {
            rx.recv().map_err(|_| PollerError::ReactorStopped {
                reactor: self.shared.id,
            })
        })
    }

    /// Like [`call`](Self::call), but gives up after `timeout` with [`PollerError::NoAnswer`]:
    /// for callers that must stay responsive (a daemon's signal loop asking for statistics).
    /// `f` may still run later; its result is then dropped.
    pub fn call_timeout<R, F>(&self, timeout: Duration, f: F) -> Result<R, PollerError>
    where
        R: Send + 'static,
        F: FnOnce(&mut Reactor) -> R + Send + 'static,
    {
        self.call_with(f, |rx| {
            rx.recv_timeout(timeout).map_err(|e| match e {
                crossbeam_channel::RecvTimeoutError::Timeout => PollerError::NoAnswer {
                    reactor: self.shared.id,
                    waited: timeout,
                },
                crossbeam_channel::RecvTimeoutError::Disconnected => PollerError::ReactorStopped {
                    reactor: self.shared.id,
                },
            })
        })
    }

    /// Send `f` to the reactor and let `wait` take its answer (refused from the reactor's own
    /// thread, where any wait would deadlock).
    fn call_with<R, F, W>(&self, f: F, wait: W) -> Result<R, PollerError>
    where
        R: Send + 'static,
        F: FnOnce(&mut Reactor) -> R + Send + 'static,
        W: FnOnce(&crossbeam_channel::Receiver<R>) -> Result<R, PollerError>,
    {
        if self.is_current_thread() {
            return Err(PollerError::WouldDeadlock {
                reactor: self.shared.id,
            });
        }
        let (tx, rx) = crossbeam_channel::bounded(1);
        self.send(move |r| {
            // The caller may have given up waiting; nothing to do then.
            let _ = tx.send(f(r));
        })?;
        wait(&rx)
    }

    /// Ask the reactor to stop: it drains its pollers (bounded by the drain timeout) and its
    /// thread exits. Messages queued before this run first. Returns `ReactorStopped` if it
    /// already exited.
    pub fn request_stop(&self) -> Result<(), PollerError> {
        self.send(|r| r.request_stop())
    }

    /// Snapshot of the reactor's counters.
    pub fn stats(&self) -> ReactorStats {
        self.shared.counters.snapshot(
            self.shared.id,
            self.shared.core,
            self.shared.sleeping.load(Ordering::Relaxed),
        )
    }

    /// True if the reactor is asleep in epoll right now.
    pub fn is_sleeping(&self) -> bool {
        self.shared.sleeping.load(Ordering::Relaxed)
    }

    /// True when called from this reactor's own thread.
    pub fn is_current_thread(&self) -> bool {
        self.shared.thread.get() == Some(&thread::current().id())
    }
}

impl fmt::Debug for ReactorHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReactorHandle")
            .field("id", &self.shared.id)
            .field("core", &self.shared.core)
            .finish()
    }
}

impl PartialEq for ReactorHandle {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
    }
}

impl Eq for ReactorHandle {}
