//! How busy a reactor was during a measured window: the share of wall time its loop spent in
//! passes that found work (its own busy-time counter, as SPDK's reactors report busy and idle
//! ticks). Below 100 %, the reactor waited for work and something else bound the throughput;
//! throughput / busy share then estimates what the reactor could carry (a low estimate: fed
//! faster, its passes would batch more).

use std::time::{Duration, Instant};

use crate::ReactorHandle;

/// A measurement window over one reactor's busy-time counter.
pub struct BusyWindow<'a> {
    reactor: &'a ReactorHandle,
    started: Instant,
    busy_before: Duration,
    busy_passes_before: u64,
}

impl<'a> BusyWindow<'a> {
    /// Opens the window now.
    pub fn start(reactor: &'a ReactorHandle) -> Self {
        let stats = reactor.stats();
        Self {
            busy_before: stats.busy,
            busy_passes_before: stats.polls.saturating_sub(stats.idle_polls),
            started: Instant::now(),
            reactor,
        }
    }

    /// The busy share since [`start`](Self::start), in percent (0-100).
    pub fn percent(&self) -> f64 {
        let wall = self.started.elapsed();
        let busy = self.reactor.stats().busy.saturating_sub(self.busy_before);
        share_percent(busy, wall)
    }

    /// Passes that found work since [`start`](Self::start): work done in the window over this
    /// says how much each pass batched (few items per pass: the pass's fixed cost dominates).
    pub fn busy_passes(&self) -> u64 {
        let stats = self.reactor.stats();
        stats
            .polls
            .saturating_sub(stats.idle_polls)
            .saturating_sub(self.busy_passes_before)
    }
}

/// `busy` over `wall` in percent, capped at 100 (the reactor's counter lags its clock by a
/// few passes) and 0 for an empty window.
fn share_percent(busy: Duration, wall: Duration) -> f64 {
    if wall.is_zero() {
        return 0.0;
    }
    (100.0 * busy.as_secs_f64() / wall.as_secs_f64()).min(100.0)
}

#[cfg(test)]
mod tests {
    use super::share_percent;
    use std::time::Duration;

    #[test]
    fn share_is_busy_over_wall_capped_at_100() {
        let ms = Duration::from_millis;
        assert_eq!(share_percent(ms(250), ms(1000)), 25.0);
        assert_eq!(share_percent(ms(1001), ms(1000)), 100.0);
        assert_eq!(share_percent(ms(5), Duration::ZERO), 0.0);
    }
}
