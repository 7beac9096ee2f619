//! The I/O units one job has in flight, each with the generation a write carries. Asked once
//! per submission (is the unit the generator picked busy?) and once per completion (which
//! unit was it?), where a scan of a list as long as the queue depth cost ~2 x depth compares
//! per I/O.
//!
//! Each I/O holds a slot, and the slot's index is the token it is submitted with, so a
//! completion finds its unit by index. Whether a unit is busy: past [`SCAN_DEPTH`] slots, first
//! asked of a count per hash bucket (a power of two at least eight times the depth,
//! multiplicative hash): a bucket with no unit in flight answers at once, only a bucket shared
//! with a unit in flight scans the slots; up to it, the slots are scanned (cheaper than the
//! hash). Nothing allocates once made while at most the depth given is in flight (more is
//! still correct: a slot is added).

/// A free slot (no unit is `u64::MAX`: units are below the job's unit count).
const FREE: u64 = u64::MAX;

/// The end of the free list.
const NONE: u64 = u64::MAX;

/// Up to this many slots a busy check scans them all without the bucket counts.
const SCAN_DEPTH: usize = 8;

/// Units in flight by slot (see the module documentation).
#[derive(Debug)]
pub(super) struct InFlightUnits {
    /// (unit, generation) per slot; a free slot is (`FREE`, the next free slot or `NONE`).
    slots: Vec<(u64, u64)>,
    /// The first free slot (`NONE`: none).
    free: u64,
    /// Units in flight per hash bucket (empty up to [`SCAN_DEPTH`] slots).
    busy: Vec<u32>,
    /// `64 - log2(busy.len())`: the hash's top bits name the bucket.
    shift: u32,
}

impl InFlightUnits {
    /// Room for `depth` units in flight.
    pub(super) fn new(depth: usize) -> Self {
        let depth = depth.max(1);
        let buckets = if depth <= SCAN_DEPTH {
            0
        } else {
            depth.saturating_mul(8).next_power_of_two()
        };
        let mut table = Self {
            slots: Vec::new(),
            free: NONE,
            busy: vec![0; buckets],
            shift: 64 - buckets.max(1).trailing_zeros(),
        };
        table.slots.resize(depth, (FREE, NONE));
        table.clear();
        table
    }

    /// Fibonacci hashing: nearby units land in different buckets.
    #[inline]
    fn bucket(&self, unit: u64) -> usize {
        (unit.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> self.shift) as usize
    }

    /// True when `unit` is in flight.
    #[inline]
    pub(super) fn contains(&self, unit: u64) -> bool {
        let maybe = self.busy.is_empty() || self.busy[self.bucket(unit)] != 0;
        maybe && self.slots.iter().any(|&(u, _)| u == unit)
    }

    /// The slot the next I/O takes: its token. Stays free until [`InFlightUnits::fill`].
    #[inline]
    pub(super) fn next_slot(&mut self) -> u64 {
        match self.free {
            NONE => self.add_slot(),
            slot => slot,
        }
    }

    /// The I/O of the slot `next_slot` named, on `unit` and carrying `generation`, was
    /// submitted (the caller checked `unit` is not in flight).
    #[inline]
    pub(super) fn fill(&mut self, unit: u64, generation: u64) {
        let Some(entry) = self.slots.get_mut(self.free as usize) else {
            return;
        };
        self.free = entry.1;
        *entry = (unit, generation);
        if !self.busy.is_empty() {
            let bucket = self.bucket(unit);
            self.busy[bucket] += 1;
        }
    }

    /// The I/O of token `slot` completed: its (unit, generation), if the slot held one.
    #[inline]
    pub(super) fn take(&mut self, slot: u64) -> Option<(u64, u64)> {
        let entry = self.slots.get_mut(usize::try_from(slot).ok()?)?;
        if entry.0 == FREE {
            return None;
        }
        let (unit, generation) = std::mem::replace(entry, (FREE, self.free));
        self.free = slot;
        if !self.busy.is_empty() {
            let bucket = self.bucket(unit);
            self.busy[bucket] -= 1;
        }
        Some((unit, generation))
    }

    /// Forgets every unit.
    pub(super) fn clear(&mut self) {
        // Free list in slot order.
        let n = self.slots.len() as u64;
        for (i, entry) in self.slots.iter_mut().enumerate() {
            let next = i as u64 + 1;
            *entry = (FREE, if next < n { next } else { NONE });
        }
        self.free = if n > 0 { 0 } else { NONE };
        self.busy.fill(0);
    }

    /// One more slot (only past the depth the table was made for).
    #[cold]
    fn add_slot(&mut self) -> u64 {
        self.slots.push((FREE, self.free));
        self.free = self.slots.len() as u64 - 1;
        self.free
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Random submissions and completions against a plain list, units drawn from ranges small
    /// enough that buckets are shared.
    #[test]
    fn agrees_with_a_list_under_random_use() {
        let mut rng = fastrand::Rng::with_seed(7);
        for (depth, units) in [(1, 4), (4, 16), (9, 1 << 40), (32, 64), (32, 1 << 20)] {
            let mut t = InFlightUnits::new(depth);
            let mut model: Vec<(u64, u64, u64)> = Vec::new();
            for step in 0..20_000u64 {
                let unit = rng.u64(0..units);
                let busy = model.iter().any(|&(_, u, _)| u == unit);
                assert_eq!(t.contains(unit), busy, "depth {depth} step {step}");
                if model.len() < depth && !busy && rng.bool() {
                    let slot = t.next_slot();
                    assert!(model.iter().all(|&(s, _, _)| s != slot));
                    t.fill(unit, step);
                    model.push((slot, unit, step));
                } else if !model.is_empty() {
                    let (slot, unit, generation) = model.swap_remove(rng.usize(0..model.len()));
                    assert_eq!(t.take(slot), Some((unit, generation)));
                    assert_eq!(t.take(slot), None, "taken once");
                }
            }
            // The bucket counts follow the units: none left once every I/O is taken (a count
            // that only grew would still answer right, by scanning every time).
            for (slot, unit, generation) in model.drain(..) {
                assert_eq!(t.take(slot), Some((unit, generation)));
            }
            assert!(
                t.busy.iter().all(|&c| c == 0),
                "depth {depth}: bucket counts drifted"
            );
        }
    }

    #[test]
    fn more_than_the_depth_still_fits_and_clear_frees_every_slot() {
        let mut t = InFlightUnits::new(2);
        let slots: Vec<_> = (0..10)
            .map(|u| {
                let s = t.next_slot();
                t.fill(u, u + 100);
                s
            })
            .collect();
        for (u, s) in slots.iter().enumerate() {
            assert!(t.contains(u as u64));
            assert_eq!(t.take(*s), Some((u as u64, u as u64 + 100)));
        }
        let s = t.next_slot();
        t.fill(5, 1);
        t.clear();
        assert!(!t.contains(5));
        assert_eq!(t.take(s), None);
        assert_eq!(t.take(u64::MAX), None);
    }
}
