//! nvmf-perf's workload: which operation comes next and at which offset, for one job over its
//! own LBA range (jobs never overlap, so --verify knows what every block should hold).

use std::fmt;
use std::str::FromStr;

/// Access pattern (`-w`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Pattern {
    /// Sequential reads.
    Read,
    /// Sequential writes.
    Write,
    /// Random reads.
    RandRead,
    /// Random writes.
    RandWrite,
    /// Sequential mix (`-M` percent reads).
    Rw,
    /// Random mix (`-M` percent reads).
    RandRw,
}

impl Pattern {
    /// Random offsets?
    pub fn is_random(self) -> bool {
        matches!(self, Self::RandRead | Self::RandWrite | Self::RandRw)
    }
    /// Percent of reads, given the `-M` mix for the mixed patterns.
    pub fn read_percent(self, mix: u8) -> u8 {
        match self {
            Self::Read | Self::RandRead => 100,
            Self::Write | Self::RandWrite => 0,
            Self::Rw | Self::RandRw => mix.min(100),
        }
    }
}

impl FromStr for Pattern {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "read" => Self::Read,
            "write" => Self::Write,
            "randread" => Self::RandRead,
            "randwrite" => Self::RandWrite,
            "rw" => Self::Rw,
            "randrw" => Self::RandRw,
            other => {
                return Err(format!(
                    "unknown workload '{other}' (read, write, randread, randwrite, rw, randrw)"
                ));
            }
        })
    }
}

impl fmt::Display for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Read => "read",
            Self::Write => "write",
            Self::RandRead => "randread",
            Self::RandWrite => "randwrite",
            Self::Rw => "rw",
            Self::RandRw => "randrw",
        })
    }
}

/// Read or write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Read.
    Read,
    /// Write.
    Write,
}

/// Picks the next operation and I/O unit of one job.
///
/// The job's range is cut into units of `blocks_per_io` blocks; offsets are unit aligned
/// (like fio's random offsets aligned to the block size).
#[derive(Debug)]
pub struct Generator {
    pattern: Pattern,
    read_percent: u8,
    units: u64,
    cursor: u64,
    rng: fastrand::Rng,
}

impl Generator {
    /// A generator over `units` I/O units.
    pub fn new(pattern: Pattern, mix: u8, units: u64, seed: u64) -> Self {
        Self {
            pattern,
            read_percent: pattern.read_percent(mix),
            units: units.max(1),
            cursor: 0,
            rng: fastrand::Rng::with_seed(seed),
        }
    }

    /// Number of units.
    pub fn units(&self) -> u64 {
        self.units
    }

    /// The next (operation, unit index). `busy` says whether a unit has I/O in flight; a busy
    /// unit is skipped (a few tries for random, the next free one for sequential) and `None`
    /// returned when nothing free was found.
    pub fn next(&mut self, busy: impl Fn(u64) -> bool) -> Option<(Op, u64)> {
        let op = match self.read_percent {
            100 => Op::Read,
            0 => Op::Write,
            p => {
                if self.rng.u8(0..100) < p {
                    Op::Read
                } else {
                    Op::Write
                }
            }
        };
        for _ in 0..8 {
            let unit = if self.pattern.is_random() {
                self.rng.u64(0..self.units)
            } else {
                let u = self.cursor;
                self.cursor = (self.cursor + 1) % self.units;
                u
            };
            if !busy(unit) {
                return Some((op, unit));
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequential_wraps_and_random_stays_in_range() {
        let mut g = Generator::new(Pattern::Write, 0, 3, 1);
        let units: Vec<_> = (0..7).map(|_| g.next(|_| false).unwrap()).collect();
        assert_eq!(
            units.iter().map(|u| u.1).collect::<Vec<_>>(),
            vec![0, 1, 2, 0, 1, 2, 0]
        );
        assert!(units.iter().all(|u| u.0 == Op::Write));
        let mut r = Generator::new(Pattern::RandRead, 0, 10, 2);
        for _ in 0..1000 {
            let (op, u) = r.next(|_| false).unwrap();
            assert_eq!(op, Op::Read);
            assert!(u < 10);
        }
    }

    #[test]
    fn mix_follows_the_read_percent_and_busy_units_are_skipped() {
        let mut g = Generator::new(Pattern::RandRw, 70, 1000, 3);
        let reads = (0..10_000)
            .filter(|_| g.next(|_| false).unwrap().0 == Op::Read)
            .count();
        assert!((6500..7500).contains(&reads), "{reads}");
        let mut s = Generator::new(Pattern::Read, 0, 4, 4);
        assert_eq!(s.next(|u| u == 0).unwrap().1, 1);
        assert_eq!(s.next(|_| true), None);
        assert_eq!("randrw".parse::<Pattern>().unwrap(), Pattern::RandRw);
        assert!("bogus".parse::<Pattern>().is_err());
        assert_eq!(Pattern::Rw.read_percent(150), 100);
    }
}
