//! `wire`'s floor for depth 1: the round trip of one cache line between the two cores. One
//! thread stores a number, the other (spinning on it) stores it back on a line of its own, the
//! first spins until it sees it. That is the least any exchange between a requester and a
//! responder on those cores costs: a QD 1 I/O makes at least one (command out, response back),
//! and more where the two sides' queues take several lines each way.
//!
//! The trips cycle through [`PAIRS`] pairs of lines: on a mesh a line's coherence traffic goes
//! through the cache slice its address hashes to, so no one line's slice decides the figure.
//! On a VM the figure also moves between runs (0.28-0.59 us on the machine of
//! docs/performance.md, likely with where the hypervisor places the vCPUs): quote it from the
//! same run.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};

/// Warm-up before the measured window (both threads pinned and spinning).
const WARMUP: Duration = Duration::from_millis(200);
/// Round trips between two clock reads.
const TRIPS_PER_CHECK: u64 = 256;
/// The number the requester writes to end the run.
const STOP: u64 = u64::MAX;
/// How far past the run's planned end the requester waits for an answer before it gives up
/// (the responder is gone).
const ANSWER_TIMEOUT: Duration = Duration::from_secs(2);
/// Line pairs the trips cycle through (see the module documentation).
const PAIRS: usize = 64;

/// A word alone on its 128 bytes: the adjacent-line prefetcher pairs lines, and the two words
/// must not share a pair.
#[repr(align(128))]
#[derive(Default)]
struct Lone(AtomicU64);

/// The requester's line and the responder's for one trip.
#[derive(Default)]
struct Pair {
    ping: Lone,
    pong: Lone,
}

/// Nanoseconds per round trip over `duration` (after a warm-up), the requester on
/// `requester_core` and the responder on `responder_core`.
pub fn measure(
    duration: Duration,
    requester_core: usize,
    responder_core: usize,
    pin: bool,
) -> Result<f64> {
    let pairs: Vec<Pair> = (0..PAIRS).map(|_| Pair::default()).collect();
    let pair = |trip: u64| &pairs[(trip % PAIRS as u64) as usize];
    std::thread::scope(|scope| -> Result<f64> {
        let responder = scope.spawn(move || {
            super::wire::pin(responder_core, pin);
            let mut next = 1;
            loop {
                let lines = pair(next);
                let seen = lines.ping.0.load(Ordering::Acquire);
                if seen == STOP {
                    break;
                }
                if seen == next {
                    lines.pong.0.store(seen, Ordering::Release);
                    next += 1;
                }
            }
        });
        let result = (|| -> Result<f64> {
            super::wire::pin(requester_core, pin);
            let start = Instant::now();
            let mut measured: Option<(Instant, u64)> = None;
            let mut trip = 0u64;
            loop {
                trip += 1;
                let lines = pair(trip);
                lines.ping.0.store(trip, Ordering::Release);
                let mut spins = 0u64;
                while lines.pong.0.load(Ordering::Acquire) != trip {
                    spins += 1;
                    if spins % (1 << 20) == 0
                        && start.elapsed() > WARMUP + duration + ANSWER_TIMEOUT
                    {
                        bail!("the responder thread stopped answering (round trip {trip})");
                    }
                }
                if trip % TRIPS_PER_CHECK == 0 {
                    let now = start.elapsed();
                    match measured {
                        None if now >= WARMUP => measured = Some((Instant::now(), trip)),
                        Some((t0, first)) if now >= WARMUP + duration => {
                            let ns = t0.elapsed().as_nanos() as f64;
                            return Ok(ns / (trip - first) as f64);
                        }
                        _ => {}
                    }
                }
            }
        })();
        // Wherever the responder waits.
        for lines in &pairs {
            lines.ping.0.store(STOP, Ordering::Release);
        }
        responder
            .join()
            .map_err(|_| anyhow::anyhow!("responder thread panicked"))?;
        result
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_round_trip_takes_some_time_and_the_responder_stops() {
        // Unpinned (a test machine may have one core): only that it ends and measures.
        let ns = measure(Duration::from_millis(50), 0, 1, false).unwrap();
        assert!(ns.is_finite() && ns > 0.0, "{ns}");
    }
}
