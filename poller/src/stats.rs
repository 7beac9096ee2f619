//! Per-reactor counters: written by the reactor thread alone (relaxed stores, no read-modify-write
//! on the hot path), read from any thread as a [`ReactorStats`] snapshot.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// A point-in-time copy of one reactor's counters. Fields are read one by one (relaxed), so a
/// snapshot taken while the reactor runs may mix values from adjacent loop iterations.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReactorStats {
    /// Reactor index.
    pub reactor: usize,
    /// Core the reactor was configured for.
    pub core: usize,
    /// Busy-loop iterations (one pass over all pollers, the inbox and the timers).
    pub polls: u64,
    /// Iterations that found no work at all.
    pub idle_polls: u64,
    /// Wall time spent in iterations that found work.
    pub busy: Duration,
    /// Messages taken from the inbox and run.
    pub messages: u64,
    /// Timer callbacks run.
    pub timers_fired: u64,
    /// Times the reactor went to sleep in epoll.
    pub sleeps: u64,
    /// Sleeps ended by an fd or a message (the rest ended because a timer was due).
    pub wakeups: u64,
    /// Sleeps abandoned before epoll because a poller had work pending while arming, or a
    /// message arrived meanwhile.
    pub sleep_aborts: u64,
    /// Pollers registered now.
    pub pollers: u64,
    /// Timers pending now.
    pub timers: u64,
    /// The reactor is asleep in epoll right now.
    pub sleeping: bool,
    /// The last stop gave up on pollers that had not drained within the drain timeout.
    pub drain_timed_out: bool,
    /// The reactor thread has exited.
    pub exited: bool,
}

/// The shared side. Padded so the reactor's per-iteration stores do not share a cache line
/// with the fields senders touch (inbox, sleeping flag).
#[repr(align(128))]
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) polls: AtomicU64,
    pub(crate) idle_polls: AtomicU64,
    pub(crate) busy_ns: AtomicU64,
    pub(crate) messages: AtomicU64,
    pub(crate) timers_fired: AtomicU64,
    pub(crate) sleeps: AtomicU64,
    pub(crate) wakeups: AtomicU64,
    pub(crate) sleep_aborts: AtomicU64,
    pub(crate) pollers: AtomicU64,
    pub(crate) timers: AtomicU64,
    pub(crate) drain_timed_out: AtomicBool,
    pub(crate) exited: AtomicBool,
}

/// The reactor's private copy; published with plain relaxed stores.
#[derive(Debug, Default)]
pub(crate) struct Local {
    pub(crate) polls: u64,
    pub(crate) idle_polls: u64,
    pub(crate) busy_ns: u64,
    pub(crate) messages: u64,
    pub(crate) timers_fired: u64,
    pub(crate) sleeps: u64,
    pub(crate) wakeups: u64,
    pub(crate) sleep_aborts: u64,
}

impl Counters {
    /// Per-iteration publish: the three counters every iteration changes.
    #[inline]
    pub(crate) fn publish_hot(&self, l: &Local) {
        self.polls.store(l.polls, Relaxed);
        self.idle_polls.store(l.idle_polls, Relaxed);
        self.busy_ns.store(l.busy_ns, Relaxed);
    }

    /// Everything, for the rarer events (messages, timers, sleeps).
    pub(crate) fn publish_all(&self, l: &Local) {
        self.publish_hot(l);
        self.messages.store(l.messages, Relaxed);
        self.timers_fired.store(l.timers_fired, Relaxed);
        self.sleeps.store(l.sleeps, Relaxed);
        self.wakeups.store(l.wakeups, Relaxed);
        self.sleep_aborts.store(l.sleep_aborts, Relaxed);
    }

    pub(crate) fn snapshot(&self, reactor: usize, core: usize, sleeping: bool) -> ReactorStats {
        ReactorStats {
            reactor,
            core,
            polls: self.polls.load(Relaxed),
            idle_polls: self.idle_polls.load(Relaxed),
            busy: Duration::from_nanos(self.busy_ns.load(Relaxed)),
            messages: self.messages.load(Relaxed),
            timers_fired: self.timers_fired.load(Relaxed),
            sleeps: self.sleeps.load(Relaxed),
            wakeups: self.wakeups.load(Relaxed),
            sleep_aborts: self.sleep_aborts.load(Relaxed),
            pollers: self.pollers.load(Relaxed),
            timers: self.timers.load(Relaxed),
            sleeping,
            drain_timed_out: self.drain_timed_out.load(Relaxed),
            exited: self.exited.load(Relaxed),
        }
    }
}
