//! The `Poller` contract: what a reactor calls in its busy loop, before it sleeps, and when it
//! stops; plus the small types that go with it (ids, poll status, arm result, wake-fd set).

use std::any::Any;
use std::os::fd::{AsFd, AsRawFd, RawFd};

use crate::reactor::ReactorCtx;

/// Identifies a poller on its reactor (ids are never reused within one reactor).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PollerId(pub(crate) u64);

/// What one call to [`Poller::poll`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PollStatus {
    /// Did this many units of work (completions reaped, requests advanced...). `Busy(0)` counts
    /// as idle.
    Busy(usize),
    /// Found nothing to do.
    Idle,
}

impl PollStatus {
    /// `Busy(n)` for `n > 0`, else `Idle`: handy for "reaped n completions".
    #[inline]
    pub fn from_count(n: usize) -> Self {
        if n == 0 {
            PollStatus::Idle
        } else {
            PollStatus::Busy(n)
        }
    }

    /// Units of work done (0 when idle).
    #[inline]
    pub fn work(self) -> usize {
        match self {
            PollStatus::Busy(n) => n,
            PollStatus::Idle => 0,
        }
    }
}

/// What [`Poller::arm`] found when asked to arm its wake-up sources.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arm {
    /// Wake-up sources are armed (their fds were added to the [`WakeFds`]); the reactor may sleep.
    Armed,
    /// Work arrived while arming (e.g. a completion landed between the last poll and
    /// `req_notify_cq`, found by the re-poll after arming): the reactor must not sleep now.
    WorkPending,
}

/// The file descriptors a reactor sleeps on, filled by [`Poller::arm`].
///
/// The reactor only watches them for readability while it sleeps; it never reads them (the
/// poller consumes events, e.g. `ibv_get_cq_event` or reading an eventfd, in its next poll).
/// The fd must stay open while the poller is registered.
#[derive(Debug, Default)]
pub struct WakeFds {
    pub(crate) fds: Vec<RawFd>,
}

impl WakeFds {
    /// Watch `fd` for readability during this sleep.
    pub fn watch(&mut self, fd: impl AsFd) {
        self.fds.push(fd.as_fd().as_raw_fd());
    }

    /// Watch a raw fd (for fds that live inside C structures, e.g. a completion channel).
    /// A negative fd is ignored with a warning when the reactor registers it.
    pub fn watch_raw(&mut self, fd: RawFd) {
        self.fds.push(fd);
    }

    /// Number of fds collected so far for this sleep.
    pub fn len(&self) -> usize {
        self.fds.len()
    }

    /// True if no fd has been collected.
    pub fn is_empty(&self) -> bool {
        self.fds.is_empty()
    }
}

/// Lets the reactor hand a poller back as its concrete type ([`crate::Reactor::poller_mut`]).
/// Implemented for every `'static` type; poller authors never implement it themselves.
pub trait PollerAny: Any {
    /// `self` as `&dyn Any`.
    fn as_any(&self) -> &dyn Any;
    /// `self` as `&mut dyn Any`.
    fn as_any_mut(&mut self) -> &mut dyn Any;
    /// `self` as `Box<dyn Any>`.
    fn into_any(self: Box<Self>) -> Box<dyn Any>;
}

impl<T: Any> PollerAny for T {
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
    fn into_any(self: Box<Self>) -> Box<dyn Any> {
        self
    }
}

/// A unit of polled work owned by one reactor (a poll group, a listener, a keep-alive sweeper).
///
/// The reactor calls [`poll`](Poller::poll) on every loop iteration, from its own thread only.
/// A poller owns its state; control-path messages reach it through
/// [`crate::Reactor::poller_mut`].
pub trait Poller: PollerAny + Send {
    /// Do a bounded amount of work without blocking and report how much was done.
    fn poll(&mut self, ctx: &mut ReactorCtx) -> PollStatus;

    /// Called when the reactor wants to sleep: arm every wake-up source (e.g. `req_notify_cq`),
    /// add its fd to `fds`, then re-check for work that raced with arming and return
    /// [`Arm::WorkPending`] if there is any.
    ///
    /// The reactor re-checks each fd's readiness when it registers it, so an fd that is still
    /// readable wakes the sleep at once: `poll` must consume what made it readable (read the
    /// eventfd, `ibv_get_cq_event` + ack), or every sleep ends immediately.
    ///
    /// The default suits pollers whose work only arrives by message or timer: nothing to arm.
    /// A poller that can only discover work by polling (no fd) must return `WorkPending`
    /// whenever it has some, or it will not be looked at until something else wakes the reactor.
    fn arm(&mut self, fds: &mut WakeFds) -> Arm {
        let _ = fds;
        Arm::Armed
    }

    /// Called on every loop iteration once the reactor is stopping, until it returns `true`.
    /// The first call should stop taking new work; return `true` once in-flight work is done.
    /// After `true` the poller is neither polled nor stopped again; it is dropped when the
    /// reactor exits.
    fn stop(&mut self, ctx: &mut ReactorCtx) -> bool {
        let _ = ctx;
        true
    }

    /// Name for logs (e.g. pollers that did not drain in time).
    fn name(&self) -> &str {
        std::any::type_name::<Self>()
    }
}
