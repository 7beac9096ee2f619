//! Command identifier allocation for one queue, with a generation so a late completion for a
//! CID that was since reused is recognised instead of completing the wrong request.
//!
//! A CID is `generation << index_bits | index`: `index` picks a slot (and the slot's piece of
//! the data region), the generation bumps each time the slot is reused. Allocation and release
//! never allocate memory.

/// A slot's life: free, or carrying one command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SlotState<T> {
    Free,
    InFlight { cid: u16, payload: T },
}

/// What a completion's CID turned out to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CidLookup<T> {
    /// The command in flight with that CID (now released).
    Completed {
        /// Slot index (same as at allocation).
        index: usize,
        /// What the caller stored at allocation.
        payload: T,
    },
    /// No command with that CID is in flight: a late or duplicate completion.
    Stale,
}

/// CID table of one queue.
#[derive(Debug)]
pub struct CidTable<T> {
    slots: Vec<SlotState<T>>,
    generations: Vec<u16>,
    free: Vec<u16>,
    index_bits: u32,
}

impl<T: Copy> CidTable<T> {
    /// A table of `depth` slots (1..=4096 so that at least 4 generation bits remain).
    pub fn new(depth: usize) -> Self {
        let depth = depth.clamp(1, 4096);
        let index_bits = usize::BITS - (depth - 1).leading_zeros();
        Self {
            slots: vec![SlotState::Free; depth],
            generations: vec![0; depth],
            // Pop from the end: lowest index first.
            free: (0..depth as u16).rev().collect(),
            index_bits,
        }
    }

    /// Like [`CidTable::new`], with every slot's generation starting half way round: a queue
    /// that changes hands (an I/O queue after its Fabrics Connect) never reissues the CIDs its
    /// previous table just used.
    pub fn new_half_turn(depth: usize) -> Self {
        let mut t = Self::new(depth);
        let half = ((1u32 << (16 - t.index_bits)) / 2) as u16;
        t.generations.iter_mut().for_each(|g| *g = half);
        t
    }

    /// Number of slots.
    pub fn depth(&self) -> usize {
        self.slots.len()
    }

    /// Commands in flight.
    pub fn in_flight(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    /// True when a slot is free.
    pub fn has_free(&self) -> bool {
        !self.free.is_empty()
    }

    /// Take a free slot; returns (slot index, CID) or `None` when all are in flight.
    pub fn allocate(&mut self, payload: T) -> Option<(usize, u16)> {
        self.allocate_with(|_| Some(payload))
    }

    /// Take a free slot whose payload `payload` makes from the slot's index; `None` (nothing
    /// taken) when all are in flight or `payload` gives none.
    #[inline]
    pub fn allocate_with(
        &mut self,
        payload: impl FnOnce(usize) -> Option<T>,
    ) -> Option<(usize, u16)> {
        let index = *self.free.last()?;
        let i = usize::from(index);
        let payload = payload(i)?;
        self.free.pop();
        let generation_mask = (1u32 << (16 - self.index_bits)) - 1;
        let generation = (u32::from(self.generations[i]) + 1) & generation_mask;
        self.generations[i] = generation as u16;
        let cid = ((generation << self.index_bits) | u32::from(index)) as u16;
        self.slots[i] = SlotState::InFlight { cid, payload };
        Some((i, cid))
    }

    /// Resolve a completion's CID, releasing the slot when it matches.
    pub fn complete(&mut self, cid: u16) -> CidLookup<T> {
        let index = usize::from(cid) & ((1usize << self.index_bits) - 1);
        match self.slots.get(index) {
            Some(SlotState::InFlight { cid: live, payload }) if *live == cid => {
                let payload = *payload;
                self.slots[index] = SlotState::Free;
                self.free.push(index as u16);
                CidLookup::Completed { index, payload }
            }
            _ => CidLookup::Stale,
        }
    }

    /// Payload of an in-flight slot.
    pub fn payload(&self, index: usize) -> Option<&T> {
        match self.slots.get(index) {
            Some(SlotState::InFlight { payload, .. }) => Some(payload),
            _ => None,
        }
    }

    /// Release every in-flight slot (the connection is gone), calling `f` for each.
    pub fn drain(&mut self, mut f: impl FnMut(usize, T)) {
        for index in 0..self.slots.len() {
            if let SlotState::InFlight { payload, .. } = self.slots[index] {
                self.slots[index] = SlotState::Free;
                self.free.push(index as u16);
                f(index, payload);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reused_cid_gets_a_new_generation_and_late_completion_is_stale() {
        let mut t = CidTable::<u32>::new(4);
        let (i, first) = t.allocate(7).unwrap();
        assert_eq!(
            t.complete(first),
            CidLookup::Completed {
                index: i,
                payload: 7
            }
        );
        let (j, second) = t.allocate(8).unwrap();
        assert_eq!(i, j, "the freed slot is reused");
        assert_ne!(first, second, "but with another CID");
        // The late duplicate of the first command must not complete the second.
        assert_eq!(t.complete(first), CidLookup::Stale);
        assert_eq!(t.in_flight(), 1);
        assert_eq!(
            t.complete(second),
            CidLookup::Completed {
                index: j,
                payload: 8
            }
        );
        assert_eq!(t.complete(second), CidLookup::Stale);
    }

    #[test]
    fn a_half_turn_table_starts_on_other_cids() {
        let mut first = CidTable::<()>::new(32);
        let mut second = CidTable::<()>::new_half_turn(32);
        let a = first.allocate(()).unwrap().1;
        let b = second.allocate(()).unwrap().1;
        assert_eq!(a & 31, b & 31);
        assert_ne!(a, b);
    }

    #[test]
    fn full_table_refuses_and_drain_releases_everything() {
        let mut t = CidTable::<u8>::new(3);
        let cids: Vec<_> = (0..3).map(|n| t.allocate(n).unwrap().1).collect();
        assert!(t.allocate(9).is_none());
        let mut drained = Vec::new();
        t.drain(|i, p| drained.push((i, p)));
        assert_eq!(drained, vec![(0, 0), (1, 1), (2, 2)]);
        assert_eq!(t.in_flight(), 0);
        for cid in cids {
            assert_eq!(t.complete(cid), CidLookup::Stale);
        }
    }

    #[test]
    fn generations_wrap_without_colliding_with_other_slots() {
        let mut t = CidTable::<()>::new(128);
        let mut seen = std::collections::HashSet::new();
        for _ in 0..2000 {
            let (i, cid) = t.allocate(()).unwrap();
            assert_eq!(usize::from(cid) & 127, i);
            seen.insert(cid);
            t.complete(cid);
        }
        // 9 generation bits for 128 slots: 512 distinct CIDs for slot 0 before wrapping.
        assert_eq!(seen.len(), 512);
    }
}
