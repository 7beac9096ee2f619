//! nvmf-poller: the reactor runtime.
//!
//! Owns one reactor thread per configured core (pinned with `core_affinity`), the busy loop over
//! registered [`Poller`]s, the crossbeam-channel inbox for [`Message`]s from other reactors and
//! the control thread, per-reactor timers, and the idle mode that sleeps in epoll on the pollers'
//! wake-up fds when no work arrives. It knows nothing of RDMA or NVMe, and has no `unsafe`.
//!
//! # Model
//!
//! - [`Runtime::start`] validates [`RuntimeConfig::cores`] (each must exist in this process'
//!   affinity mask, once), starts reactor `i` on `cores[i]`, and hands out a
//!   [`ReactorHandle`] per reactor. [`Runtime::stop`] drains and joins them.
//! - Each loop iteration reads the clock once ([`ReactorCtx::now`] is the cheap clock for
//!   pollers), polls every poller, runs deferred actions, up to 32 inbox messages and the due
//!   timers. The busy path allocates nothing, takes no lock and makes no syscall.
//! - **State.** Pollers own their state. Control-path messages are closures run on the reactor
//!   thread with `&mut Reactor`, and reach a poller's state by id with
//!   [`Reactor::poller_mut::<T>`](Reactor::poller_mut) (a downcast through `Any`). This keeps the
//!   runtime non-generic (no `Runtime<S>` type parameter leaking into every crate above) and
//!   puts each piece of state next to the code that polls it; the linear lookup by id costs
//!   nothing that matters on the control path.
//! - **Idle.** Once every poller, the inbox and deferred work have been idle for
//!   [`RuntimeConfig::idle_after`] (default [`DEFAULT_IDLE_AFTER`], 1 ms), the reactor publishes
//!   "sleeping", asks each poller to [`Poller::arm`] (e.g. `req_notify_cq` and re-poll; a poller
//!   that finds work answers [`Arm::WorkPending`] and the sleep is abandoned), and sleeps in epoll
//!   until an armed fd is readable, a message arrives (the sender writes the wake eventfd only
//!   when the reactor published "sleeping", so busy reactors cost senders no syscall) or the next
//!   timer is due. Then it busy-polls again.
//! - **Stop.** A stop request is a message: it runs after the messages queued before it. The
//!   reactor then calls [`Poller::stop`] on each poller every iteration (while still polling it)
//!   until each reports drained, or [`RuntimeConfig::drain_timeout`] passes (logged, and flagged
//!   in [`ReactorStats::drain_timed_out`]); then it drops its pollers and the thread exits.
//! - **Counters** ([`ReactorStats`]) are single-writer atomics updated with relaxed stores and
//!   readable from any thread through [`ReactorHandle::stats`].
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod busy;
mod config;
pub mod cputime;
mod error;
mod handle;
mod idle;
mod poller;
mod reactor;
mod runtime;
mod stats;
mod timer;

pub use busy::BusyWindow;
pub use config::{DEFAULT_DRAIN_TIMEOUT, DEFAULT_IDLE_AFTER, RuntimeConfig};
pub use error::PollerError;
pub use handle::{Message, ReactorHandle};
pub use poller::{Arm, PollStatus, Poller, PollerAny, PollerId, WakeFds};
pub use reactor::{CLOCK_PASSES, IDLE_CLOCK_PASSES, Reactor, ReactorCtx};
pub use runtime::Runtime;
pub use stats::ReactorStats;
pub use timer::TimerId;
