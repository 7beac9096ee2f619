//! The receive lane of a soft CQ: a bounded ring of receive completions that any thread may
//! push and whose consumer finds the next completion by reading that slot alone.
//!
//! Why not a general queue: on the in-process fabric the producer is the peer's core and the
//! consumer the CQ owner's. In a queue whose consumer checks the tail for emptiness and stamps
//! each slot free again (crossbeam's `ArrayQueue`), every push waits for a slot line and the
//! tail line the other core wrote last. Here a slot is four words (two per cache line), the
//! last of which carries the ring position it was written for: the consumer polls that word
//! and never reads the tail; the producer never reads a slot, and reads the consumer's head
//! only when the head it saw last says the ring is full. What crosses between the cores per
//! completion is the half line the completion itself occupies.
//!
//! Not for queues kept full (receive queues, re-posted as they drain): there a push must learn
//! from the consumer that a slot is free, and reading the consumer's head for it moves the
//! head's line between the cores on every pop (tried for the soft receive queues with this
//! ring made generic: the in-process QD 32 figure fell 7-14 % in three interleaved pairs).
//! crossbeam's stamp in the slot carries that news with the slot the producer writes anyway.
//!
//! Producers claim positions by CAS on the tail (any thread may complete a receive: the
//! peer's, a flush, a TCP progress run); consumers claim what they read by CAS on the head, so
//! concurrent pollers never return one completion twice (a poller that loses the CAS drops
//! what it read and reads again). Every access is atomic: a torn read is impossible by
//! construction, and a stale one is caught by the position word.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::types::{WcOpcode, WcStatus, WorkCompletion};

/// Bits of the position mark in a slot's last word; the ring's capacity must stay below
/// `1 << POSITION_BITS` so a slot's mark from the lap before never equals the one expected.
const POSITION_BITS: u32 = 29;
const POSITION_MASK: u64 = (1 << POSITION_BITS) - 1;
/// Largest depth a ring takes (its capacity is the next power of two).
pub(crate) const MAX_DEPTH: u32 = 1 << (POSITION_BITS - 1);

// The last word: qp_num 0..24, status 24..29, opcode 29..33, imm flag 33, inv flag 34, position
// mark 35..64.
const STATUS_SHIFT: u32 = 24;
const OPCODE_SHIFT: u32 = 29;
const IMM_FLAG: u64 = 1 << 33;
const INV_FLAG: u64 = 1 << 34;
const POSITION_SHIFT: u32 = 35;
const _: () = assert!(POSITION_SHIFT + POSITION_BITS == 64);
const _: () = assert!(WcStatus::ALL.len() <= 1 << (OPCODE_SHIFT - STATUS_SHIFT));
const _: () = assert!(WcOpcode::ALL.len() <= 1 << (33 - OPCODE_SHIFT));

/// One completion: wr_id; byte_len and src_qp; imm_data and the invalidated rkey; the last word
/// (qp_num, status, opcode, flags, position mark), written last.
#[repr(align(32))]
struct Slot {
    words: [AtomicU64; 4],
}

/// Keeps a field on its own cache line (the head and the tail are written by different cores).
#[repr(align(64))]
struct Line<T>(T);

pub(crate) struct RecvRing {
    slots: Box<[Slot]>,
    /// `slots.len() - 1` (a power of two).
    mask: u64,
    /// Completions it holds at most (the CQ's depth): one more is an overrun.
    depth: u64,
    /// Next position to claim, and the consumer's head as a producer last read it.
    tail: Line<(AtomicU64, AtomicU64)>,
    /// Next position to consume.
    head: Line<AtomicU64>,
}

impl RecvRing {
    /// `depth` in 1..=MAX_DEPTH (the CQ's creation checks it).
    pub(crate) fn new(depth: u32) -> RecvRing {
        let depth = depth.clamp(1, MAX_DEPTH);
        let capacity = depth.next_power_of_two() as usize;
        RecvRing {
            slots: (0..capacity)
                .map(|_| Slot {
                    words: Default::default(),
                })
                .collect(),
            mask: capacity as u64 - 1,
            depth: u64::from(depth),
            tail: Line((AtomicU64::new(0), AtomicU64::new(0))),
            head: Line(AtomicU64::new(0)),
        }
    }

    /// Queues `wc`; false when the ring already holds `depth` completions (an overrun: the
    /// completion is not queued). `wc.qp_num` and `wc.src_qp` are 24-bit QP numbers.
    #[inline(always)]
    pub(crate) fn push(&self, wc: &WorkCompletion) -> bool {
        match self.claim(1) {
            (position, 1) => {
                self.write(position, wc);
                true
            }
            _ => false,
        }
    }

    /// Queues `wcs` in order under one claim of the tail (a responder's list of deliveries);
    /// returns how many were queued: past the ring's free room the rest are overruns.
    #[inline]
    pub(crate) fn push_all(&self, wcs: &[WorkCompletion]) -> usize {
        let (position, count) = self.claim(wcs.len() as u64);
        for (offset, wc) in wcs.iter().take(count as usize).enumerate() {
            self.write(position + offset as u64, wc);
        }
        count as usize
    }

    /// Claims up to `want` positions (fewer when the ring has less room): the first, and how
    /// many.
    #[inline(always)]
    fn claim(&self, want: u64) -> (u64, u64) {
        let (tail, head_seen) = &self.tail.0;
        let mut position = tail.load(Ordering::Relaxed);
        loop {
            // Acquire (on either word): the consumer read the slots to be overwritten before it
            // moved its head past them.
            // Saturating: a stale `position` may be behind the head (its CAS then fails).
            let mut room = self
                .depth
                .saturating_sub(position.saturating_sub(head_seen.load(Ordering::Acquire)));
            if room < want {
                let head = self.head.0.load(Ordering::Acquire);
                head_seen.fetch_max(head, Ordering::AcqRel);
                room = self.depth.saturating_sub(position.saturating_sub(head));
            }
            let count = room.min(want);
            if count == 0 {
                return (position, 0);
            }
            match tail.compare_exchange_weak(
                position,
                position + count,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return (position, count),
                Err(now) => position = now,
            }
        }
    }

    /// Fills the claimed slot at `position`; its last word publishes it.
    #[inline(always)]
    fn write(&self, position: u64, wc: &WorkCompletion) {
        // The soft provider never sets a receive's vendor_err; its QP numbers are 24-bit.
        debug_assert!(wc.vendor_err == 0 && wc.qp_num <= 0x00ff_ffff, "{wc:?}");
        let slot = &self.slots[(position & self.mask) as usize];
        slot.words[0].store(wc.wr_id, Ordering::Relaxed);
        slot.words[1].store(
            u64::from(wc.byte_len) | u64::from(wc.src_qp) << 32,
            Ordering::Relaxed,
        );
        slot.words[2].store(
            u64::from(wc.imm_data.unwrap_or(0)) | u64::from(wc.invalidated_rkey.unwrap_or(0)) << 32,
            Ordering::Relaxed,
        );
        let mut last = u64::from(wc.qp_num & 0x00ff_ffff)
            | (wc.status as u64) << STATUS_SHIFT
            | (wc.opcode as u64) << OPCODE_SHIFT
            | ((position + 1) & POSITION_MASK) << POSITION_SHIFT;
        if wc.imm_data.is_some() {
            last |= IMM_FLAG;
        }
        if wc.invalidated_rkey.is_some() {
            last |= INV_FLAG;
        }
        // Release: the other words are visible to whoever sees this one.
        slot.words[3].store(last, Ordering::Release);
    }

    /// Moves up to `out.len()` completions, in ring order, into `out`; returns how many.
    #[inline(always)]
    pub(crate) fn pop(&self, out: &mut [WorkCompletion]) -> usize {
        loop {
            let head = self.head.0.load(Ordering::Acquire);
            let mut n = 0;
            while n < out.len() {
                let position = head + n as u64;
                let slot = &self.slots[(position & self.mask) as usize];
                let last = slot.words[3].load(Ordering::Acquire);
                if last >> POSITION_SHIFT != (position + 1) & POSITION_MASK {
                    break;
                }
                let lens = slot.words[1].load(Ordering::Relaxed);
                let extra = slot.words[2].load(Ordering::Relaxed);
                out[n] = WorkCompletion {
                    wr_id: slot.words[0].load(Ordering::Relaxed),
                    status: WcStatus::ALL
                        .get((last >> STATUS_SHIFT & 0x1f) as usize)
                        .copied()
                        .unwrap_or(WcStatus::GeneralErr),
                    opcode: WcOpcode::ALL
                        .get((last >> OPCODE_SHIFT & 0xf) as usize)
                        .copied()
                        .unwrap_or(WcOpcode::Recv),
                    vendor_err: 0,
                    byte_len: lens as u32,
                    qp_num: (last & 0x00ff_ffff) as u32,
                    src_qp: (lens >> 32) as u32,
                    imm_data: (last & IMM_FLAG != 0).then_some(extra as u32),
                    invalidated_rkey: (last & INV_FLAG != 0).then_some((extra >> 32) as u32),
                };
                n += 1;
            }
            if n == 0 {
                return 0;
            }
            // Release: the slots were read before a producer may reuse them. A lost race means
            // another poller took (some of) these: what was read may be stale, read again.
            if self
                .head
                .0
                .compare_exchange(head, head + n as u64, Ordering::Release, Ordering::Relaxed)
                .is_ok()
            {
                return n;
            }
        }
    }

    /// Positions claimed by producers so far: the completions queued up to now end there.
    pub(crate) fn claimed(&self) -> u64 {
        self.tail.0.0.load(Ordering::Acquire)
    }

    /// Positions consumers have taken so far.
    pub(crate) fn taken(&self) -> u64 {
        self.head.0.load(Ordering::Acquire)
    }

    /// Completions claimed and not yet consumed (a snapshot; tests).
    #[cfg(test)]
    fn len(&self) -> usize {
        let head = self.head.0.load(Ordering::Acquire);
        let tail = self.tail.0.0.load(Ordering::Acquire);
        tail.saturating_sub(head) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wc(i: u64) -> WorkCompletion {
        WorkCompletion {
            wr_id: i,
            status: WcStatus::ALL[i as usize % WcStatus::ALL.len()],
            opcode: WcOpcode::ALL[i as usize % WcOpcode::ALL.len()],
            vendor_err: 0,
            byte_len: (i * 7) as u32,
            qp_num: (i as u32 * 13) & 0x00ff_ffff,
            src_qp: (i as u32 * 17) & 0x00ff_ffff,
            imm_data: (i % 2 == 0).then_some(i as u32 ^ 0xdead_beef),
            invalidated_rkey: (i % 3 == 0).then_some(i as u32 ^ 0x1234_5678),
        }
    }

    #[test]
    fn every_field_round_trips_in_order_over_many_laps() {
        let ring = RecvRing::new(5);
        let mut out = [WorkCompletion::default(); 3];
        let mut next = 0;
        for i in 0..1000u64 {
            assert!(ring.push(&wc(i)));
            if i % 3 == 2 {
                let n = ring.pop(&mut out);
                assert_eq!(n, 3);
                for c in &out[..n] {
                    assert_eq!(*c, wc(next));
                    next += 1;
                }
            }
        }
        assert_eq!(ring.len(), (1000 - next) as usize);
    }

    #[test]
    fn a_full_ring_refuses_exactly_past_its_depth() {
        // Depth 5 in a ring of 8 slots: the sixth push is the overrun, not the ninth.
        let ring = RecvRing::new(5);
        for i in 0..5 {
            assert!(ring.push(&wc(i)));
        }
        assert!(!ring.push(&wc(5)));
        let mut out = [WorkCompletion::default(); 2];
        assert_eq!(ring.pop(&mut out), 2);
        assert!(ring.push(&wc(5)));
        assert!(ring.push(&wc(6)));
        assert!(!ring.push(&wc(7)));
        let mut all = [WorkCompletion::default(); 8];
        assert_eq!(ring.pop(&mut all), 5);
        assert_eq!(
            all[..5].iter().map(|c| c.wr_id).collect::<Vec<_>>(),
            [2, 3, 4, 5, 6]
        );
        assert_eq!(ring.pop(&mut all), 0);
    }

    #[test]
    fn a_batch_queues_in_order_up_to_the_room_left() {
        let ring = RecvRing::new(5);
        assert!(ring.push(&wc(0)));
        // Four of room: the batch of six queues its first four, in order.
        let batch: Vec<_> = (1..7).map(wc).collect();
        assert_eq!(ring.push_all(&batch), 4);
        assert_eq!(ring.push_all(&batch[4..]), 0);
        let mut out = [WorkCompletion::default(); 8];
        assert_eq!(ring.pop(&mut out), 5);
        assert_eq!(out[..5], (0..5).map(wc).collect::<Vec<_>>()[..]);
        // Across the wrap of the slots.
        assert_eq!(ring.push_all(&batch[4..]), 2);
        assert!(ring.push(&wc(7)));
        assert_eq!(ring.pop(&mut out), 3);
        assert_eq!(out[..3], [wc(5), wc(6), wc(7)]);
    }

    #[test]
    fn producers_and_pollers_on_threads_lose_and_repeat_nothing() {
        // Producer 0 pushes in batches of up to five, the others one at a time.
        use std::sync::Arc;
        use std::sync::atomic::AtomicBool;
        const PRODUCERS: u64 = 3;
        // Fewer under Miri, which checks every memory access for races (slowly).
        const EACH: u64 = if cfg!(miri) { 400 } else { 20_000 };
        let ring = Arc::new(RecvRing::new(64));
        let produced = Arc::new(AtomicBool::new(false));
        let producers: Vec<_> = (0..PRODUCERS)
            .map(|p| {
                let ring = ring.clone();
                std::thread::spawn(move || {
                    let all: Vec<_> = (0..EACH)
                        .map(|i| WorkCompletion {
                            wr_id: p << 32 | i,
                            ..wc(i)
                        })
                        .collect();
                    if p == 0 {
                        // One producer claims in batches (an in-process list's receives).
                        let mut next = 0;
                        while next < all.len() {
                            let end = (next + 5).min(all.len());
                            match ring.push_all(&all[next..end]) {
                                0 => std::thread::yield_now(),
                                queued => next += queued,
                            }
                        }
                    } else {
                        for c in &all {
                            while !ring.push(c) {
                                std::thread::yield_now();
                            }
                        }
                    }
                })
            })
            .collect();
        let pollers: Vec<_> = (0..2)
            .map(|_| {
                let ring = ring.clone();
                let produced = produced.clone();
                std::thread::spawn(move || {
                    let mut seen = Vec::new();
                    let mut out = [WorkCompletion::default(); 7];
                    loop {
                        // Read before the pop: once every push is done, an empty pop is final.
                        let done = produced.load(Ordering::Acquire);
                        let n = ring.pop(&mut out);
                        if n == 0 {
                            if done {
                                break;
                            }
                            std::thread::yield_now();
                        }
                        for c in &out[..n] {
                            // Each completion whole: its fields belong to its own wr_id.
                            let i = c.wr_id & 0xffff_ffff;
                            assert_eq!(c.byte_len, wc(i).byte_len);
                            assert_eq!(c.imm_data, wc(i).imm_data);
                            seen.push(c.wr_id);
                        }
                    }
                    seen
                })
            })
            .collect();
        for p in producers {
            p.join().unwrap();
        }
        produced.store(true, Ordering::Release);
        let mut seen: Vec<u64> = Vec::new();
        for p in pollers {
            let mine = p.join().unwrap();
            // Each producer's completions in its order, within each poller.
            for producer in 0..PRODUCERS {
                let own: Vec<u64> = mine
                    .iter()
                    .copied()
                    .filter(|w| w >> 32 == producer)
                    .collect();
                assert!(own.windows(2).all(|w| w[0] < w[1]));
            }
            seen.extend(mine);
        }
        seen.sort_unstable();
        let expected: Vec<u64> = (0..PRODUCERS)
            .flat_map(|p| (0..EACH).map(move |i| p << 32 | i))
            .collect();
        assert_eq!(seen, expected);
    }
}
