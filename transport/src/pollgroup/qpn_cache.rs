//! A direct-mapped cache in front of the poll group's RB-tree (qp_num -> slab index).
//!
//! Why: with many qpairs at low depth each receive completion names another qpair, and a
//! tree walk on a key the last walk did not take mispredicts a branch at most levels: 128
//! qpairs at queue depth 1 spent a tenth of the target's time per I/O there. Devices hand out
//! qp_nums mostly in sequence (soft: a counter; mlx5 and rxe: an allocator over a range), so
//! their low bits spread a group's qpairs over the slots, and a hit is one load and one
//! compare. The tree stays the authority: a slot holds a mapping only while the tree holds the
//! same one (filled on insert and on a walk, cleared on remove), and a miss walks the tree.

use std::cell::Cell;

/// Slots: a power of two at least twice a group's qpairs (fewer collisions of sequential
/// numbers with a stride), capped so the table stays small.
const MAX_SLOTS: usize = 4096;

/// An empty slot's number (qp_nums are 24 bits; `get` refuses it all the same, as a
/// completion's qp_num comes from a device).
const EMPTY: u32 = u32::MAX;

#[derive(Clone, Copy)]
struct Slot {
    qp_num: u32,
    index: u32,
}

const VACANT: Slot = Slot {
    qp_num: EMPTY,
    index: 0,
};

/// Interior mutability: a lookup (`&self`, as the group's other readers) fills it.
pub(crate) struct QpnCache {
    slots: Box<[Cell<Slot>]>,
    mask: u32,
}

impl QpnCache {
    /// For a group of at most `max_qpairs`.
    pub(crate) fn new(max_qpairs: u32) -> QpnCache {
        let len = (max_qpairs.max(1) as usize * 2)
            .next_power_of_two()
            .min(MAX_SLOTS);
        QpnCache {
            slots: (0..len).map(|_| Cell::new(VACANT)).collect(),
            mask: len as u32 - 1,
        }
    }

    /// The slab index of `qp_num` if its slot holds it.
    #[inline(always)]
    pub(crate) fn get(&self, qp_num: u32) -> Option<u32> {
        let slot = self.slots[(qp_num & self.mask) as usize].get();
        (slot.qp_num == qp_num && qp_num != EMPTY).then_some(slot.index)
    }

    /// `qp_num` maps to `index` in the tree (inserted, or found by a walk): its slot holds it
    /// from now on (a collision replaces the older mapping, which the tree still answers).
    #[inline]
    pub(crate) fn fill(&self, qp_num: u32, index: u32) {
        self.slots[(qp_num & self.mask) as usize].set(Slot { qp_num, index });
    }

    /// `qp_num` left the tree.
    pub(crate) fn remove(&mut self, qp_num: u32) {
        let slot = &self.slots[(qp_num & self.mask) as usize];
        if slot.get().qp_num == qp_num {
            slot.set(VACANT);
        }
    }

    /// Every mapping gone (the tree was cleared).
    pub(crate) fn clear(&mut self) {
        self.slots.iter().for_each(|s| s.set(VACANT));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_what_it_was_given_until_removed() {
        let mut cache = QpnCache::new(4);
        assert_eq!(cache.get(17), None);
        cache.fill(17, 3);
        assert_eq!(cache.get(17), Some(3));
        // 17 + 8 shares 17's slot (8 slots): it replaces 17, which misses from then on.
        cache.fill(25, 5);
        assert_eq!(cache.get(25), Some(5));
        assert_eq!(cache.get(17), None);
        // Removing a number its slot does not hold leaves the slot alone.
        cache.remove(17);
        assert_eq!(cache.get(25), Some(5));
        cache.remove(25);
        assert_eq!(cache.get(25), None);
        cache.fill(1, 0);
        cache.clear();
        assert_eq!(cache.get(1), None);
    }

    #[test]
    fn never_matches_the_empty_mark() {
        let cache = QpnCache::new(1024);
        assert_eq!(cache.slots.len(), 2048);
        assert_eq!(cache.get(EMPTY), None);
        assert_eq!(QpnCache::new(100_000).slots.len(), MAX_SLOTS);
    }
}
