//! Per-reactor timers: one-shot and periodic callbacks kept in a deadline min-heap.
//!
//! The busy loop only peeks the heap top (no allocation, no clock read of its own); adding and
//! cancelling are control-path operations. Cancelled timers leave a stale heap record that is
//! skipped when it surfaces; the heap is rebuilt if stale records pile up.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::time::{Duration, Instant};

use crate::reactor::Reactor;

/// Identifies a timer on its reactor (ids are never reused within one reactor).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TimerId(u64);

/// A timer callback. It runs on the reactor thread with the whole reactor at hand.
pub(crate) type TimerFn = Box<dyn FnMut(&mut Reactor)>;

/// Shortest period: a zero period would fire forever within one loop iteration.
const MIN_PERIOD: Duration = Duration::from_nanos(1);

struct Entry {
    deadline: Instant,
    period: Option<Duration>,
    /// `None` while the callback runs (it is lent out to be called with `&mut Reactor`).
    f: Option<TimerFn>,
}

/// A due timer taken out of the queue to be run; give it back with [`Timers::restore`].
pub(crate) struct Due {
    id: u64,
    pub(crate) f: TimerFn,
    next: Option<Instant>,
}

#[derive(Default)]
pub(crate) struct Timers {
    next_id: u64,
    entries: HashMap<u64, Entry>,
    heap: BinaryHeap<Reverse<(Instant, u64)>>,
}

impl Timers {
    pub(crate) fn add(
        &mut self,
        now: Instant,
        after: Duration,
        period: Option<Duration>,
        f: TimerFn,
    ) -> TimerId {
        let id = self.next_id;
        self.next_id += 1;
        let deadline = now.checked_add(after).unwrap_or_else(far_future);
        self.entries.insert(
            id,
            Entry {
                deadline,
                period: period.map(|p| p.max(MIN_PERIOD)),
                f: Some(f),
            },
        );
        self.heap.push(Reverse((deadline, id)));
        TimerId(id)
    }

    /// True if the timer existed (a one-shot that already fired no longer exists).
    pub(crate) fn cancel(&mut self, id: TimerId) -> bool {
        let existed = self.entries.remove(&id.0).is_some();
        if self.heap.len() > 2 * self.entries.len() + 64 {
            self.rebuild();
        }
        existed
    }

    /// Live timers.
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Cheap check for the busy loop: is the earliest heap record due? (It may be stale; then
    /// [`Timers::pop_due`] just discards it.)
    #[inline]
    pub(crate) fn maybe_due(&self, now: Instant) -> bool {
        matches!(self.heap.peek(), Some(Reverse((d, _))) if *d <= now)
    }

    /// Earliest live deadline, discarding stale records on the way.
    pub(crate) fn next_deadline(&mut self) -> Option<Instant> {
        while let Some(&Reverse((d, id))) = self.heap.peek() {
            if self.is_live(d, id) {
                return Some(d);
            }
            self.heap.pop();
        }
        None
    }

    /// Take out the next timer due at `now`. One-shots are removed; periodic timers keep their
    /// entry (so they can be cancelled from their own callback) and get their next deadline.
    pub(crate) fn pop_due(&mut self, now: Instant) -> Option<Due> {
        while let Some(&Reverse((d, id))) = self.heap.peek() {
            if d > now {
                return None;
            }
            self.heap.pop();
            if !self.is_live(d, id) {
                continue;
            }
            let entry = self.entries.get_mut(&id)?;
            match entry.period {
                None => {
                    let entry = self.entries.remove(&id)?;
                    return entry.f.map(|f| Due { id, f, next: None });
                }
                Some(period) => {
                    // Keep the cadence (no drift) unless we fell a whole period behind; then
                    // skip the missed ticks instead of firing a burst.
                    let mut next = d.checked_add(period).unwrap_or_else(far_future);
                    if next <= now {
                        next = now.checked_add(period).unwrap_or_else(far_future);
                    }
                    entry.deadline = next;
                    return entry.f.take().map(|f| Due {
                        id,
                        f,
                        next: Some(next),
                    });
                }
            }
        }
        None
    }

    /// Give a periodic timer's callback back after it ran, unless it was cancelled meanwhile.
    pub(crate) fn restore(&mut self, due: Due) {
        let Some(next) = due.next else { return };
        if let Some(entry) = self.entries.get_mut(&due.id) {
            entry.f = Some(due.f);
            self.heap.push(Reverse((next, due.id)));
        }
    }

    fn is_live(&self, deadline: Instant, id: u64) -> bool {
        self.entries
            .get(&id)
            .is_some_and(|e| e.deadline == deadline && e.f.is_some())
    }

    fn rebuild(&mut self) {
        self.heap = self
            .entries
            .iter()
            .filter(|(_, e)| e.f.is_some())
            .map(|(&id, e)| Reverse((e.deadline, id)))
            .collect();
    }
}

/// A deadline that never comes in practice (for `after` values too large for `Instant`).
fn far_future() -> Instant {
    let now = Instant::now();
    // ~30 years; `Instant` cannot represent arbitrary far points on every platform.
    now.checked_add(Duration::from_secs(1 << 30)).unwrap_or(now)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn noop() -> TimerFn {
        Box::new(|_| {})
    }

    #[test]
    fn one_shot_fires_once_in_deadline_order() {
        let mut t = Timers::default();
        let t0 = Instant::now();
        let late = t.add(t0, Duration::from_millis(20), None, noop());
        let early = t.add(t0, Duration::from_millis(10), None, noop());
        assert!(!t.maybe_due(t0));
        assert_eq!(t.next_deadline(), Some(t0 + Duration::from_millis(10)));
        let now = t0 + Duration::from_millis(25);
        let a = t.pop_due(now).expect("first due");
        let b = t.pop_due(now).expect("second due");
        assert_eq!((a.id, b.id), (early.0, late.0));
        assert!(t.pop_due(now).is_none());
        assert_eq!(t.len(), 0);
        assert!(!t.cancel(early));
    }

    #[test]
    fn periodic_reschedules_without_drift_and_skips_missed_ticks() {
        let mut t = Timers::default();
        let t0 = Instant::now();
        let p = Duration::from_millis(10);
        let id = t.add(t0, p, Some(p), noop());
        let due = t.pop_due(t0 + Duration::from_millis(11)).expect("due");
        assert_eq!(due.next, Some(t0 + Duration::from_millis(20)));
        t.restore(due);
        // Far behind: next deadline is a period after now, not a burst of missed ticks.
        let now = t0 + Duration::from_millis(75);
        let due = t.pop_due(now).expect("due");
        assert_eq!(due.next, Some(now + p));
        t.restore(due);
        assert!(t.pop_due(now).is_none());
        assert!(t.cancel(id));
        assert_eq!(t.next_deadline(), None);
    }

    #[test]
    fn cancelled_while_running_is_not_restored() {
        let mut t = Timers::default();
        let t0 = Instant::now();
        let p = Duration::from_millis(1);
        let id = t.add(t0, p, Some(p), noop());
        let due = t.pop_due(t0 + p).expect("due");
        assert!(t.cancel(id));
        t.restore(due);
        assert_eq!(t.len(), 0);
        assert_eq!(t.next_deadline(), None);
    }

    #[test]
    fn zero_period_fires_once_per_pass() {
        let mut t = Timers::default();
        let t0 = Instant::now();
        t.add(t0, Duration::ZERO, Some(Duration::ZERO), noop());
        let due = t.pop_due(t0).expect("due");
        t.restore(due);
        assert!(t.pop_due(t0).is_none());
    }

    #[test]
    fn stale_records_are_compacted() {
        let mut t = Timers::default();
        let t0 = Instant::now();
        for _ in 0..1000 {
            let id = t.add(t0, Duration::from_secs(60), None, noop());
            t.cancel(id);
        }
        assert!(t.heap.len() <= 64 + 1);
    }
}
