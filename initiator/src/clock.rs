//! Time as the initiator sees it: a real clock for use, a virtual one for tests, so timeouts,
//! keep-alive and reconnect delays are tested by behaviour and never by wall-clock waits.

use std::sync::Arc;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A source of time the initiator waits on.
pub trait Clock: Send + Sync {
    /// Now.
    fn now(&self) -> Instant;
    /// Let `d` pass while waiting for something (the real clock sleeps, a virtual one advances).
    fn idle(&self, d: Duration);
}

/// The system clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }
    fn idle(&self, d: Duration) {
        if d.is_zero() {
            std::thread::yield_now();
        } else {
            std::thread::sleep(d);
        }
    }
}

/// A clock that moves only when told to (or when someone idles on it).
#[derive(Debug, Clone)]
pub struct VirtualClock {
    base: Instant,
    elapsed: Arc<Mutex<Duration>>,
}

impl Default for VirtualClock {
    fn default() -> Self {
        Self::new()
    }
}

impl VirtualClock {
    /// A clock starting now.
    pub fn new() -> Self {
        Self {
            base: Instant::now(),
            elapsed: Arc::new(Mutex::new(Duration::ZERO)),
        }
    }
    /// Move time forward.
    pub fn advance(&self, d: Duration) {
        let mut e = self.elapsed.lock().unwrap_or_else(|p| p.into_inner());
        *e += d;
    }
    /// Virtual time passed since creation.
    pub fn elapsed(&self) -> Duration {
        *self.elapsed.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Clock for VirtualClock {
    fn now(&self) -> Instant {
        self.base + self.elapsed()
    }
    fn idle(&self, d: Duration) {
        // Idling for zero must still move time, or a wait loop never reaches its deadline.
        self.advance(d.max(Duration::from_micros(1)));
    }
}

/// Shared clock handle.
pub type SharedClock = Arc<dyn Clock>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn virtual_clock_moves_only_when_told() {
        let c = VirtualClock::new();
        let t0 = c.now();
        assert_eq!(c.now(), t0);
        c.idle(Duration::from_millis(5));
        assert_eq!(c.now() - t0, Duration::from_millis(5));
        c.idle(Duration::ZERO);
        assert!(c.now() - t0 > Duration::from_millis(5));
    }
}
