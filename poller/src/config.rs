//! Runtime configuration: which cores get a reactor, when a reactor may sleep, how long a stop
//! may take to drain.

use std::time::Duration;

/// Default [`RuntimeConfig::idle_after`]: 1 ms.
///
/// Why 1 ms: an epoll wake-up (interrupt, completion-channel event, scheduler) costs tens of
/// microseconds, so a reactor that has seen work within the last millisecond stays busy and
/// sustained traffic (inter-arrival under 1 ms) never pays that latency. After 1 ms of silence the
/// next request pays the wake-up once, which is small next to the gap it follows, while an idle
/// daemon spins at most 1 ms per wake-up instead of forever. Latency-critical deployments that
/// own their cores can set [`Duration::MAX`] (never sleep, pure poll mode, like SPDK's default).
pub const DEFAULT_IDLE_AFTER: Duration = Duration::from_millis(1);

/// Default [`RuntimeConfig::drain_timeout`]: 5 s, enough for in-flight I/O to finish or time
/// out on a healthy fabric, short enough that a shutdown never appears hung.
pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// How to start a [`crate::Runtime`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuntimeConfig {
    /// One reactor per entry, in this order (reactor `i` runs on `cores[i]`). Every core must be
    /// in this process' affinity mask and appear once.
    pub cores: Vec<usize>,
    /// A reactor whose pollers, inbox and deferred work have all been idle this long arms its
    /// pollers' wake-up fds and sleeps in epoll. [`Duration::MAX`] disables sleeping.
    pub idle_after: Duration,
    /// How long a stop waits for pollers to report drained before the reactor exits anyway.
    pub drain_timeout: Duration,
    /// Pin each reactor thread to its core. Tests on small machines may run unpinned; the cores
    /// are validated either way.
    pub pin: bool,
}

impl RuntimeConfig {
    /// A pinned configuration on `cores` with the default idle and drain times.
    pub fn new(cores: impl Into<Vec<usize>>) -> Self {
        RuntimeConfig {
            cores: cores.into(),
            idle_after: DEFAULT_IDLE_AFTER,
            drain_timeout: DEFAULT_DRAIN_TIMEOUT,
            pin: true,
        }
    }

    /// Same configuration with `idle_after` replaced.
    pub fn idle_after(mut self, idle_after: Duration) -> Self {
        self.idle_after = idle_after;
        self
    }

    /// Same configuration with `drain_timeout` replaced.
    pub fn drain_timeout(mut self, drain_timeout: Duration) -> Self {
        self.drain_timeout = drain_timeout;
        self
    }

    /// Same configuration with pinning switched on or off.
    pub fn pin(mut self, pin: bool) -> Self {
        self.pin = pin;
        self
    }
}

impl Default for RuntimeConfig {
    /// One pinned reactor on core 0.
    fn default() -> Self {
        RuntimeConfig::new([0])
    }
}
