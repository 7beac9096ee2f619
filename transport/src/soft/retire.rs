//! Send-queue retirement: how far each QP's send queue has been freed by polled completions,
//! kept by the send CQ in a table of counters, one per QP that sends into it.
//!
//! A verbs driver frees a send queue's slots when their completion is polled (a signaled WR
//! frees the unsignaled ones before it too). So the poll must reach the QP's counter from the
//! completion alone. A completion carries a plain mark (`RetireMark`: the QP's index in this
//! table, the index's generation, the sequence it retires through) and the poll updates the
//! table's entry. Why not an `Arc` of the counter in each completion (as before): a counter a
//! reset set back to zero was then moved forward by a completion of the QP's earlier life still
//! in the CQ, past the new posts (an underflowing count: a panic, or a queue refused for ever),
//! and it cost a locked increment and decrement per completion.
//!
//! An entry is one word: the generation in the high half, the sequence of the next WR not yet
//! retired (mod 2^32) in the low half. A QP's index is freed when its owner drops it and taken
//! by a later QP with the next generation; a reset of the QP starts a new generation too. A
//! completion whose generation is not the entry's (its QP is gone or was reset since) retires
//! nothing, so a stale completion can never free another QP's slots. Sequences compare
//! wrapping: the device limits a send queue to `MAX_SEND_QUEUE` WRs, far below 2^31.
//!
//! Allocation (QP creation and destruction) is the control path, under a mutex; the counters
//! live in chunks that are allocated on first use and never move, so the fast path (a push
//! writes a mark, a poll one compare-exchange, a post one load) takes no lock.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use crate::error::{Result, TransportError};

/// Counters per chunk (8 KiB).
const CHUNK: u32 = 1024;

/// The largest send queue a soft device grants (`SoftConfig::max_qp_wr`): sequences are compared
/// mod 2^32, which needs the distance between a QP's retired and posted sequences below 2^31.
pub(crate) const MAX_SEND_QUEUE: u32 = 1 << 30;

/// What a send completion retires: the send queue of the QP at `index` in `generation`, up to
/// and including the WR before `next`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RetireMark {
    index: u32,
    generation: u32,
    next: u32,
}

/// A QP's place in its send CQ's table (the QP keeps it; only its owner changes it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RetireSlot {
    index: u32,
    generation: u32,
}

impl RetireSlot {
    /// The mark a completion of the WR with sequence `seq` carries.
    #[inline(always)]
    pub(crate) fn mark(self, seq: u64) -> RetireMark {
        RetireMark {
            index: self.index,
            generation: self.generation,
            next: (seq as u32).wrapping_add(1),
        }
    }

    /// Packed in one word, for a QP's atomic copy (other threads push its completions).
    pub(crate) fn to_word(self) -> u64 {
        u64::from(self.index) << 32 | u64::from(self.generation)
    }

    pub(crate) fn from_word(word: u64) -> RetireSlot {
        RetireSlot {
            index: (word >> 32) as u32,
            generation: word as u32,
        }
    }
}

#[derive(Default)]
struct Free {
    /// Indexes released, for reuse.
    released: Vec<u32>,
    /// Indexes below this were handed out at least once.
    high: u32,
}

pub(crate) struct RetireTable {
    chunks: Box<[OnceLock<Box<[AtomicU64]>>]>,
    /// QPs it holds at once at most.
    capacity: u32,
    free: Mutex<Free>,
}

impl RetireTable {
    /// Room for `capacity` QPs at once (the device's `max_qp`: a QP holds its index from
    /// creation to its owner's drop).
    pub(crate) fn new(capacity: u32) -> RetireTable {
        RetireTable {
            chunks: (0..capacity.div_ceil(CHUNK).max(1))
                .map(|_| OnceLock::new())
                .collect(),
            capacity,
            free: Mutex::new(Free::default()),
        }
    }

    /// An index for a new QP, its counter at zero in a generation no earlier completion carries.
    pub(crate) fn attach(&self) -> Result<RetireSlot> {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        let index = match free.released.pop() {
            Some(index) => index,
            None => {
                let index = free.high;
                if index >= self.capacity {
                    return Err(TransportError::Limit {
                        what: "QPs sending into one CQ",
                        asked: u64::from(index) + 1,
                        max: u64::from(self.capacity),
                    });
                }
                free.high += 1;
                index
            }
        };
        drop(free);
        Ok(self.renew(index))
    }

    /// The QP at `slot` is reset: its counter restarts at zero in the next generation.
    pub(crate) fn reset(&self, slot: RetireSlot) -> RetireSlot {
        self.renew(slot.index)
    }

    /// The QP at `slot` is gone: its completions still queued retire nothing from now on, and
    /// the index may be taken again.
    pub(crate) fn detach(&self, slot: RetireSlot) {
        self.renew(slot.index);
        self.free
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .released
            .push(slot.index);
    }

    /// Moves `index` to its next generation, counter zero.
    fn renew(&self, index: u32) -> RetireSlot {
        let entry = self.entry_or_allocate(index);
        let generation = (entry.load(Ordering::Acquire) >> 32) as u32 + 1;
        entry.store(u64::from(generation) << 32, Ordering::Release);
        RetireSlot { index, generation }
    }

    /// WRs of `slot`'s send queue posted (`next_seq` is the next to post) and not yet retired.
    #[inline(always)]
    pub(crate) fn outstanding(&self, slot: RetireSlot, next_seq: u64) -> u32 {
        // Acquire: pairs with the poll's release of the completion that retired them.
        let retired = self
            .entry(slot.index)
            .map_or(0, |e| e.load(Ordering::Acquire) as u32);
        (next_seq as u32).wrapping_sub(retired)
    }

    /// A polled completion retires its QP's send queue through its WR, unless the QP is gone or
    /// was reset since, or a later completion of it already did (concurrent pollers).
    #[inline(always)]
    pub(crate) fn retire(&self, mark: RetireMark) {
        let Some(entry) = self.entry(mark.index) else {
            return;
        };
        let wanted = u64::from(mark.generation) << 32 | u64::from(mark.next);
        let mut current = entry.load(Ordering::Acquire);
        loop {
            if (current >> 32) as u32 != mark.generation
                || mark.next.wrapping_sub(current as u32) as i32 <= 0
            {
                return;
            }
            match entry.compare_exchange_weak(current, wanted, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return,
                Err(now) => current = now,
            }
        }
    }

    #[inline(always)]
    fn entry(&self, index: u32) -> Option<&AtomicU64> {
        let chunk = self.chunks.get((index / CHUNK) as usize)?.get()?;
        chunk.get((index % CHUNK) as usize)
    }

    fn entry_or_allocate(&self, index: u32) -> &AtomicU64 {
        let chunk = self.chunks[(index / CHUNK) as usize]
            .get_or_init(|| (0..CHUNK).map(|_| AtomicU64::new(0)).collect());
        &chunk[(index % CHUNK) as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Polls `mark`'s completion; then what `slot` has outstanding with `next_seq` posted.
    fn outstanding_after(
        table: &RetireTable,
        mark: RetireMark,
        slot: RetireSlot,
        next_seq: u64,
    ) -> u32 {
        table.retire(mark);
        table.outstanding(slot, next_seq)
    }

    #[test]
    fn a_completion_retires_through_its_wr_and_never_backwards() {
        let table = RetireTable::new(4);
        let slot = table.attach().unwrap();
        assert_eq!(table.outstanding(slot, 5), 5);
        assert_eq!(outstanding_after(&table, slot.mark(2), slot, 5), 2);
        // A poller that lost the race hands in an earlier completion after a later one.
        assert_eq!(outstanding_after(&table, slot.mark(1), slot, 5), 2);
        assert_eq!(outstanding_after(&table, slot.mark(4), slot, 5), 0);
    }

    #[test]
    fn sequences_compare_across_the_wrap() {
        let table = RetireTable::new(4);
        let slot = table.attach().unwrap();
        let base = u64::from(u32::MAX) - 2;
        // A send queue moves on by at most its depth at a time; four steps reach the wrap.
        for step in 1..4 {
            table.retire(slot.mark(step * u64::from(MAX_SEND_QUEUE) - 1));
        }
        let next = base + 6;
        assert_eq!(
            outstanding_after(&table, slot.mark(base - 1), slot, next),
            6
        );
        assert_eq!(
            outstanding_after(&table, slot.mark(base + 3), slot, next),
            2
        );
        assert_eq!(outstanding_after(&table, slot.mark(base), slot, next), 2);
    }

    #[test]
    fn a_stale_completion_retires_nothing_after_a_reset_or_a_reuse() {
        let table = RetireTable::new(4);
        let old = table.attach().unwrap();
        let reset = table.reset(old);
        assert_eq!(outstanding_after(&table, old.mark(7), reset, 3), 3);
        table.detach(reset);
        let reused = table.attach().unwrap();
        assert_eq!(reused.index, reset.index);
        table.retire(reset.mark(1));
        assert_eq!(outstanding_after(&table, old.mark(1), reused, 2), 2);
        assert_eq!(outstanding_after(&table, reused.mark(0), reused, 2), 1);
    }

    #[test]
    fn indexes_are_reused_and_the_capacity_is_a_limit() {
        let table = RetireTable::new(CHUNK + 1);
        let slots: Vec<_> = (0..CHUNK + 1).map(|_| table.attach().unwrap()).collect();
        assert!(matches!(table.attach(), Err(TransportError::Limit { .. })));
        // The second chunk is in use: its counter works like the first's.
        let last = slots[CHUNK as usize];
        table.retire(last.mark(0));
        assert_eq!(table.outstanding(last, 1), 0);
        table.detach(slots[3]);
        assert_eq!(table.attach().unwrap().index, 3);
    }

    #[test]
    fn a_slot_survives_its_word_form() {
        let slot = RetireSlot {
            index: 70_000,
            generation: u32::MAX,
        };
        assert_eq!(RetireSlot::from_word(slot.to_word()), slot);
    }
}
