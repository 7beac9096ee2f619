//! Where each in-flight command's data lives in its I/O queue's registered region.
//!
//! A region that holds a largest transfer for every command gives command slot `i` the fixed
//! range `i * max_transfer ..` (no search, nothing to free). A smaller region (the host's
//! `io_queue_data_size`: 16 MiB per queue at depth 128 and 128 KiB transfers is too much to pin
//! for many queues) is shared: each command takes a run of 512-byte units sized by its own
//! transfer, next-fit from where the last one ended, and gives it back when it completes. A
//! transfer that finds no free run waits like a command that finds no free CID
//! ([`crate::Error::QueueFull`]): the caller polls and submits again.
//!
//! Runs are found in a bitmap (a set bit is a free unit) a word at a time; allocation and
//! release never allocate memory.

use std::ops::Range;

/// Bytes per unit of a shared region: the smallest block size, so a 512-byte read takes one.
const UNIT: usize = 512;

/// The data placement of one I/O queue.
#[derive(Debug)]
pub(super) enum DataSlots {
    /// Slot `index` owns `index * size .. (index + 1) * size`.
    PerCommand { size: usize },
    /// Commands share the region by transfer size.
    Shared(FreeUnits),
}

impl DataSlots {
    /// The placement for a region of `region_len` bytes serving `depth` commands of at most
    /// `max_transfer` bytes each.
    pub(super) fn new(region_len: usize, depth: usize, max_transfer: usize) -> Self {
        if region_len / max_transfer.max(1) >= depth {
            Self::PerCommand { size: max_transfer }
        } else {
            Self::Shared(FreeUnits::new(region_len / UNIT))
        }
    }

    /// The largest transfer one command can place.
    pub(super) fn largest(&self) -> usize {
        match self {
            Self::PerCommand { size } => *size,
            Self::Shared(free) => free.units * UNIT,
        }
    }

    /// The region offset of `bytes` of data for command slot `index`, or `None` when no free
    /// run is long enough now (only in a shared region). A command without data takes nothing.
    #[inline]
    pub(super) fn take(&mut self, index: usize, bytes: usize) -> Option<usize> {
        match self {
            Self::PerCommand { size } => Some(index * *size),
            Self::Shared(_) if bytes == 0 => Some(0),
            Self::Shared(free) => free.take(bytes.div_ceil(UNIT)).map(|unit| unit * UNIT),
        }
    }

    /// Give back what [`DataSlots::take`] returned for `bytes` at `offset`.
    #[inline]
    pub(super) fn release(&mut self, offset: usize, bytes: usize) {
        if let Self::Shared(free) = self {
            if bytes > 0 {
                free.release(offset / UNIT, bytes.div_ceil(UNIT));
            }
        }
    }

    /// How many commands of `bytes` each fit at once (from an empty region).
    pub(super) fn holds(&self, bytes: usize) -> usize {
        match self {
            Self::PerCommand { .. } => usize::MAX,
            Self::Shared(_) if bytes == 0 => usize::MAX,
            Self::Shared(free) => free.units / bytes.div_ceil(UNIT),
        }
    }

    /// True when `bytes` of data could be placed now.
    #[inline]
    pub(super) fn has_room(&self, bytes: usize) -> bool {
        match self {
            Self::PerCommand { .. } => true,
            Self::Shared(_) if bytes == 0 => true,
            Self::Shared(free) => free.find(bytes.div_ceil(UNIT)).is_some(),
        }
    }

    /// Every command is gone (the connection was lost): the whole region is free again.
    pub(super) fn release_all(&mut self) {
        if let Self::Shared(free) = self {
            *free = FreeUnits::new(free.units);
        }
    }
}

/// Free units of a shared region, as a bitmap (bit set = free).
#[derive(Debug)]
pub(super) struct FreeUnits {
    words: Vec<u64>,
    units: usize,
    /// Where the next search starts: just past the last run taken.
    cursor: usize,
}

impl FreeUnits {
    fn new(units: usize) -> Self {
        let mut words = vec![u64::MAX; units.div_ceil(64)];
        if units % 64 != 0 {
            // The last word's bits past the region stay clear (used) forever.
            if let Some(last) = words.last_mut() {
                *last = (1u64 << (units % 64)) - 1;
            }
        }
        Self {
            words,
            units,
            cursor: 0,
        }
    }

    /// Take a run of `count` free units; returns its first unit.
    fn take(&mut self, count: usize) -> Option<usize> {
        let start = self.find(count)?;
        self.set(start..start + count, false);
        self.cursor = start + count;
        Some(start)
    }

    fn release(&mut self, start: usize, count: usize) {
        debug_assert!(start + count <= self.units);
        self.set(start..start + count, true);
    }

    /// The first run of `count` free units from the cursor on, else from the start.
    fn find(&self, count: usize) -> Option<usize> {
        if count > self.units {
            return None;
        }
        self.find_in(self.cursor, count)
            .or_else(|| self.find_in(0, count))
    }

    /// The first run of `count` free units starting at or after `from`.
    fn find_in(&self, mut from: usize, count: usize) -> Option<usize> {
        loop {
            let start = self.next_with(from, true)?;
            if start + count > self.units {
                return None;
            }
            // The run ends at the next used unit (or the region's end).
            let end = self.next_with(start, false).unwrap_or(self.units);
            if end - start >= count {
                return Some(start);
            }
            from = end;
        }
    }

    /// The first unit at or after `from` that is free (`free`) or used (`!free`).
    fn next_with(&self, from: usize, free: bool) -> Option<usize> {
        if from >= self.units {
            return None;
        }
        let mut word_index = from / 64;
        let word_of = |i: usize| if free { self.words[i] } else { !self.words[i] };
        // Bits below `from` in its word do not count.
        let mut bits = word_of(word_index) & (u64::MAX << (from % 64));
        loop {
            if bits != 0 {
                let unit = word_index * 64 + bits.trailing_zeros() as usize;
                return (unit < self.units).then_some(unit);
            }
            word_index += 1;
            if word_index == self.words.len() {
                return None;
            }
            bits = word_of(word_index);
        }
    }

    fn set(&mut self, units: Range<usize>, free: bool) {
        let mut unit = units.start;
        while unit < units.end {
            let word_index = unit / 64;
            let low = unit % 64;
            let high = (units.end - word_index * 64).min(64);
            let mask = if high - low == 64 {
                u64::MAX
            } else {
                ((1u64 << (high - low)) - 1) << low
            };
            debug_assert_eq!(
                self.words[word_index] & mask,
                if free { 0 } else { mask },
                "units {units:?} not all {}",
                if free { "used" } else { "free" }
            );
            if free {
                self.words[word_index] |= mask;
            } else {
                self.words[word_index] &= !mask;
            }
            unit = word_index * 64 + high;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_region_with_room_for_every_command_gives_fixed_slots() {
        let mut slots = DataSlots::new(4 * 8192, 4, 8192);
        assert!(matches!(slots, DataSlots::PerCommand { size: 8192 }));
        assert_eq!(slots.take(3, 100), Some(3 * 8192));
        assert!(slots.has_room(8192));
    }

    #[test]
    fn a_smaller_region_is_shared_by_transfer_size() {
        // 16 KiB for 8 commands of up to 8 KiB: four 4 KiB commands fit, a fifth waits.
        let mut slots = DataSlots::new(16 * 1024, 8, 8192);
        assert_eq!(
            (slots.holds(4096), slots.holds(4097), slots.holds(0)),
            (4, 3, usize::MAX)
        );
        let offsets: Vec<_> = (0..4).map(|i| slots.take(i, 4096).unwrap()).collect();
        assert_eq!(offsets, vec![0, 4096, 8192, 12288]);
        assert_eq!(slots.take(4, 4096), None);
        assert!(!slots.has_room(512));
        slots.release(4096, 4096);
        assert!(slots.has_room(4096));
        assert!(!slots.has_room(8192));
        assert_eq!(slots.take(4, 4096), Some(4096));
        // A command without data (Flush) takes nothing, even with the region full.
        assert_eq!(slots.take(5, 0), Some(0));
        slots.release(0, 0);
        assert_eq!(slots.take(4, 4096), None);
        slots.release_all();
        assert_eq!(slots.largest(), 16 * 1024);
        assert_eq!(slots.take(0, 16 * 1024), Some(0));
    }

    #[test]
    fn a_run_is_found_across_words_and_after_a_too_short_hole() {
        let mut free = FreeUnits::new(200);
        assert_eq!(free.take(60), Some(0));
        assert_eq!(free.take(10), Some(60));
        assert_eq!(free.take(100), Some(70));
        free.release(0, 60);
        // The hole of 60 at 0 is too short for 61; the 30 past 170 too: none.
        assert_eq!(free.find(61), None);
        // Next-fit: from the cursor (170) first.
        assert_eq!(free.take(30), Some(170));
        assert_eq!(free.take(5), Some(0));
        free.release(60, 10);
        // 55 free at 5 joined by the 10 released at 60: 65 in a row across the word boundary.
        assert_eq!(free.take(65), Some(5));
    }

    #[test]
    fn units_past_the_region_are_never_handed_out() {
        let mut free = FreeUnits::new(70);
        assert_eq!(free.take(71), None);
        assert_eq!(free.take(70), Some(0));
        assert_eq!(free.take(1), None);
    }

    proptest::proptest! {
        /// Runs of one size stay aligned to it, so as many as `holds` says always fit, in any
        /// completion order (what a perf job of one I/O size relies on for its depth).
        #[test]
        fn runs_of_one_size_always_fit_as_many_as_the_region_holds(
            units in 1usize..300,
            size in 1usize..40,
            picks in proptest::collection::vec(0usize..64, 1..300),
        ) {
            let mut slots = DataSlots::Shared(FreeUnits::new(units));
            let bytes = size * UNIT;
            let depth = slots.holds(bytes);
            let mut held: Vec<usize> = Vec::new();
            for pick in picks {
                while held.len() < depth {
                    let taken = slots.take(0, bytes);
                    proptest::prop_assert!(taken.is_some(), "{} of {depth} held", held.len());
                    held.extend(taken);
                }
                if !held.is_empty() {
                    slots.release(held.swap_remove(pick % held.len()), bytes);
                }
            }
        }

        /// Any sequence of takes and releases: a run taken is inside the region, overlaps no
        /// run held, and a take fails only when no free run of that length exists (checked
        /// against a plain array of the units held).
        #[test]
        fn runs_never_overlap_and_a_take_fails_only_without_room(
            units in 1usize..300,
            steps in proptest::collection::vec((0usize..3, 1usize..80, 0usize..64), 1..200),
        ) {
            let mut free = FreeUnits::new(units);
            let mut held: Vec<(usize, usize)> = Vec::new();
            let mut used = vec![false; units];
            for (action, count, pick) in steps {
                if action == 0 && !held.is_empty() {
                    let (start, n) = held.swap_remove(pick % held.len());
                    free.release(start, n);
                    used[start..start + n].iter_mut().for_each(|u| *u = false);
                    continue;
                }
                let fits = count <= units
                    && (0..=units - count).any(|s| used[s..s + count].iter().all(|u| !u));
                match free.take(count) {
                    Some(start) => {
                        proptest::prop_assert!(start + count <= units);
                        proptest::prop_assert!(used[start..start + count].iter().all(|u| !u));
                        used[start..start + count].iter_mut().for_each(|u| *u = true);
                        held.push((start, count));
                    }
                    None => proptest::prop_assert!(!fits, "{count} units fit but none taken"),
                }
            }
        }
    }
}
