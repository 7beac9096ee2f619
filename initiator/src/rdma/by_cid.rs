//! A queue's commands in flight by CID: which request object a response's CID names.
//!
//! The CIDs come from the caller ([`crate::cid::CidTable`] in the initiator: a slot index in
//! the low bits, a generation above), so the table is direct-mapped on the CID's low bits
//! (a power of two at least the queue depth): with the initiator's own CIDs every command in
//! flight has its own slot, and a lookup is one index and one compare. The full CID is kept
//! and compared, so a late or duplicate response carrying an older generation of a slot's CID
//! never matches the command now in it. CIDs numbered otherwise (any caller may choose them)
//! whose slot is taken go to a small overflow list searched linearly: still correct, only
//! slower. Nothing allocates once made, while at most `depth` commands are in flight.

/// Commands in flight by CID (see the module documentation).
#[derive(Debug)]
pub(super) struct ByCid<V> {
    /// Slot `cid & mask`: the command whose CID has those low bits, if any.
    slots: Vec<Option<(u16, V)>>,
    /// Commands whose slot was taken by another CID.
    overflow: Vec<(u16, V)>,
    mask: usize,
}

impl<V: Copy> ByCid<V> {
    /// A table for `depth` commands in flight.
    pub(super) fn new(depth: usize) -> Self {
        let size = depth.clamp(1, 1 << 16).next_power_of_two();
        Self {
            slots: vec![None; size],
            overflow: Vec::with_capacity(depth),
            mask: size - 1,
        }
    }

    /// True when a command with `cid` is in flight.
    pub(super) fn contains(&self, cid: u16) -> bool {
        self.get(cid).is_some()
    }

    /// The command with `cid`, if one is in flight.
    pub(super) fn get(&self, cid: u16) -> Option<V> {
        match self.slots[usize::from(cid) & self.mask] {
            Some((live, value)) if live == cid => Some(value),
            _ => self
                .overflow
                .iter()
                .find(|(live, _)| *live == cid)
                .map(|&(_, value)| value),
        }
    }

    /// Files `value` under `cid`; the caller checked that `cid` is not in flight already.
    pub(super) fn insert(&mut self, cid: u16, value: V) {
        let slot = &mut self.slots[usize::from(cid) & self.mask];
        match slot {
            None => *slot = Some((cid, value)),
            Some(_) => self.overflow.push((cid, value)),
        }
    }

    /// Takes the command with `cid` out, if one is in flight.
    pub(super) fn remove(&mut self, cid: u16) -> Option<V> {
        let slot = &mut self.slots[usize::from(cid) & self.mask];
        match *slot {
            Some((live, value)) if live == cid => {
                *slot = None;
                Some(value)
            }
            _ => {
                let i = self.overflow.iter().position(|(live, _)| *live == cid)?;
                Some(self.overflow.swap_remove(i).1)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_older_generation_of_a_cid_does_not_match() {
        let mut t = ByCid::new(32);
        // Same low bits (slot 5), generations 1 and 2.
        let (old, new) = (1 << 5 | 5, 2 << 5 | 5);
        t.insert(new, 'n');
        assert_eq!(t.get(old), None);
        assert!(!t.contains(old));
        assert_eq!(t.remove(old), None);
        assert_eq!(t.get(new), Some('n'));
        assert_eq!(t.remove(new), Some('n'));
        assert_eq!(t.remove(new), None, "a duplicate response finds nothing");
    }

    #[test]
    fn colliding_cids_of_another_numbering_are_all_kept() {
        let mut t = ByCid::new(4);
        // Slot 0 for all of them.
        let cids = [0u16, 4, 8, 12, 16];
        for (n, cid) in cids.iter().enumerate() {
            assert!(!t.contains(*cid));
            t.insert(*cid, n);
        }
        for (n, cid) in cids.iter().enumerate() {
            assert_eq!(t.get(*cid), Some(n));
        }
        // Removing the one in the slot leaves the overflow findable, and the slot reusable.
        assert_eq!(t.remove(0), Some(0));
        assert_eq!(t.get(8), Some(2));
        t.insert(20, 5);
        assert_eq!(t.remove(16), Some(4));
        assert_eq!(t.remove(4), Some(1));
        assert_eq!(t.get(20), Some(5));
        assert_eq!(t.get(12), Some(3));
        assert_eq!(t.remove(8), Some(2));
        assert_eq!(t.remove(12), Some(3));
        assert_eq!(t.remove(20), Some(5));
        for cid in cids {
            assert_eq!(t.get(cid), None);
        }
    }

    #[test]
    fn initiator_cids_each_get_their_own_slot() {
        let mut table = crate::cid::CidTable::<()>::new_half_turn(24);
        let mut t = ByCid::new(24);
        for n in 0..24 {
            let (_, cid) = table.allocate(()).unwrap();
            t.insert(cid, n);
        }
        assert!(t.overflow.is_empty());
    }
}
