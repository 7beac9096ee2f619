//! One reactor: its pollers, timers, inbox and the loop that drives them on its thread — the busy
//! path, the way into and out of idle sleep, and the stop/drain sequence.
//!
//! Busy path per iteration: one virtual call per poller, an empty-inbox check (atomic loads), a
//! timer-heap peek and three relaxed counter stores; `Instant::now()` (vDSO, no syscall, but
//! 20-50 ns) once every [`CLOCK_PASSES`] passes while they all do work, once every
//! [`IDLE_CLOCK_PASSES`] while none does, and right after a busy pass that ended idle ones (off
//! the path of the next work: it measures the work just done). An idle pass that read the clock
//! each time spent most of its time there, which delayed noticing new work. No allocation, no
//! lock, no syscall.

use std::sync::Arc;
use std::sync::atomic::{Ordering, fence};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, TryRecvError};

use crate::handle::{Message, ReactorHandle, Shared};
use crate::idle::Sleeper;
use crate::poller::{Arm, Poller, PollerAny, PollerId};
use crate::stats::Local;
use crate::timer::{TimerId, Timers};

/// Messages run per iteration at most, so a flood of control messages cannot starve pollers.
const MESSAGES_PER_ITERATION: usize = 32;
/// Timer callbacks run per iteration at most (a callback re-adding a zero timer cannot spin).
const TIMERS_PER_ITERATION: usize = 256;
/// While every pass does work, the clock is read on one pass in this many: the others reuse the
/// last reading (timers, `ReactorCtx::now` and the busy-time count lag by at most this many
/// busy passes). A pass after an idle one always reads it (idle detection stays exact).
pub const CLOCK_PASSES: u32 = 8;
/// While no pass does work, the clock is read on one pass in this many (an idle pass is a few
/// tens of nanoseconds: timers, idle detection and `ReactorCtx::now` lag by about a
/// microsecond at most). The pass after a sleep always reads it.
pub const IDLE_CLOCK_PASSES: u32 = 32;

/// Work deferred by a poller from inside `poll` (when it cannot borrow the whole reactor).
type Deferred = Box<dyn FnOnce(&mut Reactor)>;

/// What a poller sees while it is being polled: identity, the loop's clock, other reactors.
pub struct ReactorCtx {
    id: usize,
    core: usize,
    now: Instant,
    handles: Arc<[ReactorHandle]>,
    deferred: Vec<Deferred>,
    stopping: bool,
}

impl ReactorCtx {
    /// This reactor's index.
    pub fn id(&self) -> usize {
        self.id
    }

    /// Core this reactor was configured for.
    pub fn core(&self) -> usize {
        self.core
    }

    /// Time read at the start of the current loop iteration, or of a recent one (at most
    /// [`CLOCK_PASSES`] - 1 busy or [`IDLE_CLOCK_PASSES`] - 1 idle passes earlier): a cheap
    /// clock for pollers.
    #[inline]
    pub fn now(&self) -> Instant {
        self.now
    }

    /// Handle to this reactor.
    pub fn handle(&self) -> &ReactorHandle {
        &self.handles[self.id]
    }

    /// Handles of every reactor in the runtime, indexed by reactor id (this one included).
    pub fn handles(&self) -> &[ReactorHandle] {
        &self.handles
    }

    /// Run `f` with the whole reactor right after the current poll pass (e.g. to add a timer or
    /// remove this poller). Control path: boxes `f`.
    pub fn defer(&mut self, f: impl FnOnce(&mut Reactor) + 'static) {
        self.deferred.push(Box::new(f));
    }

    /// True once the reactor has been asked to stop (pollers are being drained).
    pub fn is_stopping(&self) -> bool {
        self.stopping
    }
}

struct Slot {
    id: PollerId,
    poller: Box<dyn Poller>,
    /// `stop()` returned true: no longer polled or stopped.
    drained: bool,
}

/// Timing knobs a reactor takes from [`crate::RuntimeConfig`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct Timing {
    pub(crate) idle_after: Duration,
    pub(crate) drain_timeout: Duration,
}

/// A reactor as seen by messages and timer callbacks, on its own thread: add and remove pollers
/// and timers, reach pollers by id, talk to other reactors.
pub struct Reactor {
    ctx: ReactorCtx,
    pollers: Vec<Slot>,
    next_poller: u64,
    timers: Timers,
    inbox: Receiver<Message>,
    shared: Arc<Shared>,
    sleeper: Sleeper,
    timing: Timing,
    /// Set when a stop was requested: drain until then.
    drain_deadline: Option<Instant>,
    /// Last time any poller, message or deferred action did work.
    last_work: Instant,
    counts: Local,
    /// Spare buffer for running deferred actions without allocating each time.
    deferred_spare: Vec<Deferred>,
}

impl Reactor {
    pub(crate) fn new(
        handles: Arc<[ReactorHandle]>,
        id: usize,
        inbox: Receiver<Message>,
        sleeper: Sleeper,
        timing: Timing,
    ) -> Self {
        let shared = Arc::clone(&handles[id].shared);
        let now = Instant::now();
        Reactor {
            ctx: ReactorCtx {
                id,
                core: shared.core,
                now,
                handles,
                deferred: Vec::new(),
                stopping: false,
            },
            pollers: Vec::new(),
            next_poller: 0,
            timers: Timers::default(),
            inbox,
            shared,
            sleeper,
            timing,
            drain_deadline: None,
            last_work: now,
            counts: Local::default(),
            deferred_spare: Vec::new(),
        }
    }

    /// This reactor's index.
    pub fn id(&self) -> usize {
        self.ctx.id
    }

    /// Core this reactor was configured for.
    pub fn core(&self) -> usize {
        self.ctx.core
    }

    /// Time read at the start of the current loop iteration (see [`ReactorCtx::now`]).
    pub fn now(&self) -> Instant {
        self.ctx.now
    }

    /// Handle to this reactor.
    pub fn handle(&self) -> &ReactorHandle {
        self.ctx.handle()
    }

    /// Handles of every reactor in the runtime, indexed by reactor id.
    pub fn handles(&self) -> &[ReactorHandle] {
        self.ctx.handles()
    }

    /// The poll context (what pollers get), e.g. to share helper code with pollers.
    pub fn ctx_mut(&mut self) -> &mut ReactorCtx {
        &mut self.ctx
    }

    /// Register a poller; it is polled from the next loop iteration on, after those already
    /// registered. If the reactor is stopping it is asked to drain like the others.
    pub fn add_poller(&mut self, poller: Box<dyn Poller>) -> PollerId {
        let id = PollerId(self.next_poller);
        self.next_poller += 1;
        tracing::debug!(
            reactor = self.ctx.id,
            poller = poller.name(),
            ?id,
            "poller added"
        );
        self.pollers.push(Slot {
            id,
            poller,
            drained: false,
        });
        self.publish_sizes();
        id
    }

    /// Unregister a poller and hand it back (it is not stopped; drop it or keep it).
    pub fn remove_poller(&mut self, id: PollerId) -> Option<Box<dyn Poller>> {
        let pos = self.pollers.iter().position(|s| s.id == id)?;
        let slot = self.pollers.remove(pos);
        tracing::debug!(
            reactor = self.ctx.id,
            poller = slot.poller.name(),
            ?id,
            "poller removed"
        );
        self.publish_sizes();
        Some(slot.poller)
    }

    /// Unregister a poller of concrete type `T` and hand it back as `T`. Returns `None` (and
    /// leaves the poller registered) if there is no such poller or it is not a `T`.
    pub fn take_poller<T: Poller>(&mut self, id: PollerId) -> Option<Box<T>> {
        self.poller_mut::<T>(id)?;
        let boxed = self.remove_poller(id)?;
        PollerAny::into_any(boxed).downcast::<T>().ok()
    }

    /// The poller `id` as its concrete type `T` (how messages reach per-poller state).
    /// `None` if there is no such poller or it is not a `T`.
    pub fn poller_mut<T: Poller>(&mut self, id: PollerId) -> Option<&mut T> {
        let slot = self.pollers.iter_mut().find(|s| s.id == id)?;
        // Call through `&mut dyn Poller`: on the `Box` itself the blanket impl would pick the box.
        PollerAny::as_any_mut(&mut *slot.poller).downcast_mut::<T>()
    }

    /// The poller `id` as `&T`; see [`Reactor::poller_mut`].
    pub fn poller_ref<T: Poller>(&self, id: PollerId) -> Option<&T> {
        let slot = self.pollers.iter().find(|s| s.id == id)?;
        PollerAny::as_any(&*slot.poller).downcast_ref::<T>()
    }

    /// Ids of the registered pollers, in poll order.
    pub fn poller_ids(&self) -> impl Iterator<Item = PollerId> + '_ {
        self.pollers.iter().map(|s| s.id)
    }

    /// Number of registered pollers.
    pub fn poller_count(&self) -> usize {
        self.pollers.len()
    }

    /// Run `f` once `after` has passed, then every `period` if one is given (a zero period
    /// means every loop iteration). Periodic timers keep their cadence and skip ticks missed
    /// while the reactor was busy rather than firing in a burst. Accuracy: [`CLOCK_PASSES`] loop
    /// iterations when busy, [`IDLE_CLOCK_PASSES`] when idle; about a millisecond when asleep
    /// (epoll's resolution).
    pub fn add_timer<F>(&mut self, after: Duration, period: Option<Duration>, f: F) -> TimerId
    where
        F: FnMut(&mut Reactor) + 'static,
    {
        let id = self.timers.add(Instant::now(), after, period, Box::new(f));
        self.publish_sizes();
        id
    }

    /// Cancel a timer (also from inside its own callback). True if it was pending.
    pub fn cancel_timer(&mut self, id: TimerId) -> bool {
        let existed = self.timers.cancel(id);
        self.publish_sizes();
        existed
    }

    /// Snapshot of this reactor's counters.
    pub fn stats(&self) -> crate::ReactorStats {
        self.shared.counters.publish_all(&self.counts);
        self.handle().stats()
    }

    /// Start stopping: pollers are drained (see [`Poller::stop`]) until all report drained or
    /// the drain timeout passes, then the thread exits. Idempotent.
    pub fn request_stop(&mut self) {
        if self.drain_deadline.is_none() {
            let now = Instant::now();
            self.drain_deadline = Some(
                now.checked_add(self.timing.drain_timeout)
                    .unwrap_or(now + Duration::from_secs(3600)),
            );
            self.ctx.stopping = true;
            tracing::debug!(reactor = self.ctx.id, "stop requested; draining pollers");
        }
    }

    /// True once a stop was requested.
    pub fn is_stopping(&self) -> bool {
        self.ctx.stopping
    }

    fn publish_sizes(&self) {
        let c = &self.shared.counters;
        c.pollers
            .store(self.pollers.len() as u64, Ordering::Relaxed);
        c.timers.store(self.timers.len() as u64, Ordering::Relaxed);
    }

    /// The reactor thread's body: loop until stopped and drained.
    pub(crate) fn run(mut self) {
        tracing::info!(
            reactor = self.ctx.id,
            core = self.ctx.core,
            "reactor running"
        );
        let mut prev = Instant::now();
        // Passes since the clock was last read, and how many of them did work.
        let (mut window, mut window_busy) = (0u32, 0u32);
        // The clock is read at the top of the next pass regardless of the window (after a sleep,
        // and after a busy pass that ended idle ones).
        let mut read_next = false;
        // Estimated length of an idle pass, from windows of idle passes only: the busy share of
        // a mixed window is what its idle passes do not explain.
        let mut idle_pass_ns = 0u128;
        let mut now = prev;
        loop {
            let limit = if window_busy > 0 {
                CLOCK_PASSES
            } else {
                IDLE_CLOCK_PASSES
            };
            let fresh = read_next || window >= limit || self.drain_deadline.is_some();
            if fresh {
                now = Instant::now();
                let elapsed = now.saturating_duration_since(prev).as_nanos();
                if window_busy == 0 {
                    if window > 0 {
                        idle_pass_ns = elapsed / u128::from(window);
                    }
                } else {
                    let idle = u128::from(window - window_busy) * idle_pass_ns;
                    let ns = elapsed.saturating_sub(idle);
                    self.counts.busy_ns = self
                        .counts
                        .busy_ns
                        .saturating_add(u64::try_from(ns).unwrap_or(u64::MAX));
                    // Work ended at most now: idle time is counted from here.
                    self.last_work = now;
                }
                prev = now;
                (window, window_busy) = (0, 0);
                self.ctx.now = now;
            }
            window += 1;

            let mut work = 0usize;
            for slot in self.pollers.iter_mut() {
                if !slot.drained {
                    work = work.saturating_add(slot.poller.poll(&mut self.ctx).work());
                }
            }
            if !self.ctx.deferred.is_empty() {
                work = work.saturating_add(self.run_deferred());
            }
            if !self.inbox.is_empty() {
                work = work.saturating_add(self.run_messages());
            }
            if self.timers.maybe_due(now) {
                // Timers alone do not keep a reactor awake: it sleeps until the next one anyway.
                self.run_timers(now);
            }

            self.counts.polls += 1;
            if work > 0 {
                self.last_work = now;
                window_busy += 1;
            } else {
                self.counts.idle_polls += 1;
            }
            // A busy pass after idle ones: its time is measured now, while no work waits.
            read_next = work > 0 && window_busy < window;
            self.shared.counters.publish_hot(&self.counts);

            if self.drain_deadline.is_some() {
                if self.drain_step(now) {
                    break;
                }
            } else if work == 0
                && fresh
                && now.saturating_duration_since(self.last_work) >= self.timing.idle_after
            {
                self.try_sleep();
                // However it ended, time passed: the next pass reads the clock, and the window
                // restarts there (the sleep is neither busy time nor an idle pass).
                read_next = true;
                (window, window_busy) = (0, 0);
            }
        }
        self.exit();
    }

    fn run_deferred(&mut self) -> usize {
        std::mem::swap(&mut self.ctx.deferred, &mut self.deferred_spare);
        let mut batch = std::mem::take(&mut self.deferred_spare);
        let n = batch.len();
        for f in batch.drain(..) {
            f(self);
        }
        // Keep the allocation for next time (anything deferred meanwhile stays queued).
        self.deferred_spare = batch;
        n
    }

    fn run_messages(&mut self) -> usize {
        let mut n = 0;
        while n < MESSAGES_PER_ITERATION {
            match self.inbox.try_recv() {
                Ok(msg) => {
                    msg(self);
                    n += 1;
                }
                // Disconnected cannot happen (our own handle holds a sender); treat it as empty.
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => break,
            }
        }
        self.counts.messages += n as u64;
        self.shared
            .counters
            .messages
            .store(self.counts.messages, Ordering::Relaxed);
        n
    }

    fn run_timers(&mut self, now: Instant) {
        let mut fired = 0;
        while fired < TIMERS_PER_ITERATION {
            let Some(mut due) = self.timers.pop_due(now) else {
                break;
            };
            (due.f)(self);
            self.timers.restore(due);
            fired += 1;
        }
        self.counts.timers_fired += fired as u64;
        self.shared
            .counters
            .timers_fired
            .store(self.counts.timers_fired, Ordering::Relaxed);
        self.publish_sizes();
    }

    /// One drain round: ask undrained pollers to stop. True when the reactor may exit.
    fn drain_step(&mut self, now: Instant) -> bool {
        let mut all = true;
        for slot in self.pollers.iter_mut().filter(|s| !s.drained) {
            slot.drained = slot.poller.stop(&mut self.ctx);
            all &= slot.drained;
        }
        // Deferred work queued by `stop()` runs in the next iteration before we may leave.
        if all && self.ctx.deferred.is_empty() {
            return true;
        }
        if self.drain_deadline.is_some_and(|d| now >= d) {
            let stuck: Vec<&str> = self
                .pollers
                .iter()
                .filter(|s| !s.drained)
                .map(|s| s.poller.name())
                .collect();
            tracing::warn!(
                reactor = self.ctx.id,
                timeout = ?self.timing.drain_timeout,
                pollers = ?stuck,
                "drain timeout: exiting with pollers not drained"
            );
            self.shared
                .counters
                .drain_timed_out
                .store(true, Ordering::Relaxed);
            return true;
        }
        false
    }

    /// Arm every poller and sleep in epoll until an fd fires, a message arrives or the next
    /// timer is due. Gives up (cheaply) if any poller has work pending or a message came in.
    fn try_sleep(&mut self) {
        self.sleeper.flush();
        // Publish "sleeping" before the last inbox check; pairs with `Shared::wake_if_sleeping`.
        self.shared.sleeping.store(true, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        if !self.inbox.is_empty() || !self.ctx.deferred.is_empty() {
            self.abort_sleep();
            return;
        }
        self.sleeper.armed.fds.clear();
        for slot in self.pollers.iter_mut() {
            if slot.poller.arm(&mut self.sleeper.armed) == Arm::WorkPending {
                self.abort_sleep();
                return;
            }
        }
        self.sleeper.register_armed();

        let timeout = self
            .timers
            .next_deadline()
            .map(|d| d.saturating_duration_since(Instant::now()));
        self.counts.sleeps += 1;
        self.shared.counters.publish_all(&self.counts);

        let woken = self.sleeper.wait(timeout);

        self.shared.sleeping.store(false, Ordering::Relaxed);
        if woken {
            self.counts.wakeups += 1;
            // Something arrived: busy-poll again for a full idle window.
            self.last_work = Instant::now();
        }
        self.shared.counters.publish_all(&self.counts);
    }

    fn abort_sleep(&mut self) {
        self.shared.sleeping.store(false, Ordering::Relaxed);
        self.counts.sleep_aborts += 1;
        // Poll for a full idle window before trying again (a poller that keeps reporting
        // pending work must not make us arm on every iteration).
        self.last_work = Instant::now();
        self.shared.counters.publish_all(&self.counts);
    }

    fn exit(mut self) {
        let leftover = self.inbox.len();
        if leftover > 0 {
            tracing::debug!(
                reactor = self.ctx.id,
                leftover,
                "dropping unprocessed messages"
            );
        }
        // Drop pollers (and their resources) on their own thread, in registration order.
        self.pollers.clear();
        self.publish_sizes();
        self.shared.counters.publish_all(&self.counts);
        self.shared.counters.exited.store(true, Ordering::Relaxed);
        tracing::info!(reactor = self.ctx.id, "reactor stopped");
    }
}
