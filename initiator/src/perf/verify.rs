//! The --verify block format: every block written carries its LBA, a generation tag, the run's
//! random stamp and the namespace, the rest of the block a pattern derived from all four, so a
//! read finds misplaced, stale, torn or foreign data, and data an earlier run left (the same
//! LBAs and generations recur from run to run) never passes for this run's. Block layout:
//! 0..8 magic, 8..16 LBA, 16..24 generation, 24..32 run stamp, 32..36 NSID, 36..40 zero,
//! 40.. pattern (64-bit words).

/// Marks a block written by nvmf-perf --verify.
pub const MAGIC: u64 = 0x4e56_4d46_5645_5259; // "NVMFVERY"
/// Header bytes before the pattern.
const HEADER: usize = 40;

/// Whose blocks these are: one run's stamp (random per run) on one namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Owner {
    /// The run's random stamp.
    pub run: u64,
    /// The namespace.
    pub nsid: u32,
}

impl Owner {
    /// A fresh stamp for a run (clock and process id mixed: runs never share one in practice).
    pub fn fresh_run() -> u64 {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        mix(nanos ^ (u64::from(std::process::id()) << 32))
    }
}

/// What a read found where it expected something else.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Mismatch {
    /// Namespace.
    pub nsid: u32,
    /// Block address read.
    pub lba: u64,
    /// Generation expected (0 = unknown: only placement was checked).
    pub expected_generation: u64,
    /// LBA found in the block header.
    pub found_lba: u64,
    /// Generation found.
    pub found_generation: u64,
    /// NSID found in the block header.
    pub found_nsid: u32,
    /// The block was written by another run (its stamp differs).
    pub other_run: bool,
    /// First bad byte in the block (0 for header fields).
    pub offset: usize,
}

impl std::fmt::Display for Mismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "verify mismatch: nsid {} LBA {}: expected LBA {} generation {}, found nsid {} LBA {} generation {}{} (byte {})",
            self.nsid,
            self.lba,
            self.lba,
            self.expected_generation,
            self.found_nsid,
            self.found_lba,
            self.found_generation,
            if self.other_run {
                " of another run"
            } else {
                ""
            },
            self.offset
        )
    }
}

/// splitmix64's finaliser.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The block's pattern: word j is seed + (j + 1) * golden, the seed mixed from every field,
/// so no two blocks, generations, runs or namespaces share one, and no word repeats in a block
/// (a shifted or duplicated piece is found).
fn seed(owner: Owner, lba: u64, generation: u64) -> u64 {
    mix(owner.run ^ mix(lba ^ mix(generation ^ mix(u64::from(owner.nsid)))))
}

const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

/// Fill `buf` (whole blocks of `block_size`) as written by `owner` at `first_lba` with
/// `generation`.
pub fn fill(buf: &mut [u8], block_size: usize, owner: Owner, first_lba: u64, generation: u64) {
    for (i, block) in buf.chunks_exact_mut(block_size).enumerate() {
        let lba = first_lba + i as u64;
        block[0..8].copy_from_slice(&MAGIC.to_le_bytes());
        block[8..16].copy_from_slice(&lba.to_le_bytes());
        block[16..24].copy_from_slice(&generation.to_le_bytes());
        block[24..32].copy_from_slice(&owner.run.to_le_bytes());
        block[32..36].copy_from_slice(&owner.nsid.to_le_bytes());
        block[36..40].fill(0);
        let s = seed(owner, lba, generation);
        let mut word = s;
        for chunk in block[HEADER..].chunks_exact_mut(8) {
            word = word.wrapping_add(GOLDEN);
            chunk.copy_from_slice(&word.to_le_bytes());
        }
    }
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

/// How a read checked out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Checked {
    /// Every block was what this run last wrote there.
    Content,
    /// The blocks' content is unknown to this run (never written by it, or a write whose
    /// outcome is unknown): only that none is this run's data misplaced was checked.
    Placement,
}

/// Check blocks read at `first_lba` against what `owner` wrote with `expected_generation`. 0
/// means unknown: blocks of other runs or no run are accepted, this run's must carry the
/// right LBA and NSID.
pub fn check(
    buf: &[u8],
    block_size: usize,
    owner: Owner,
    first_lba: u64,
    expected_generation: u64,
) -> Result<Checked, Mismatch> {
    for (i, block) in buf.chunks_exact(block_size).enumerate() {
        let lba = first_lba + i as u64;
        let magic = u64_at(block, 0);
        let found_lba = u64_at(block, 8);
        let found_generation = u64_at(block, 16);
        let ours = magic == MAGIC && u64_at(block, 24) == owner.run;
        let found_nsid = u32_at(block, 32);
        let mismatch = |offset| Mismatch {
            nsid: owner.nsid,
            lba,
            expected_generation,
            found_lba,
            found_generation,
            found_nsid,
            other_run: magic == MAGIC && !ours,
            offset,
        };
        let placed = found_lba == lba && found_nsid == owner.nsid;
        if expected_generation == 0 {
            if ours && !placed {
                return Err(mismatch(0));
            }
            continue;
        }
        if !ours || !placed || found_generation != expected_generation {
            return Err(mismatch(0));
        }
        let mut word = seed(owner, lba, expected_generation);
        for (j, chunk) in block[HEADER..].chunks_exact(8).enumerate() {
            word = word.wrapping_add(GOLDEN);
            if chunk != word.to_le_bytes() {
                let at = chunk
                    .iter()
                    .zip(word.to_le_bytes())
                    .position(|(a, b)| *a != b)
                    .unwrap_or(0);
                return Err(mismatch(HEADER + 8 * j + at));
            }
        }
    }
    Ok(if expected_generation == 0 {
        Checked::Placement
    } else {
        Checked::Content
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const RUN: Owner = Owner { run: 77, nsid: 1 };

    #[test]
    fn written_blocks_check_and_every_kind_of_damage_is_found() {
        let mut buf = vec![0u8; 4 * 512];
        fill(&mut buf, 512, RUN, 100, 9);
        assert_eq!(check(&buf, 512, RUN, 100, 9), Ok(Checked::Content));
        // Stale generation.
        let e = check(&buf, 512, RUN, 100, 10).unwrap_err();
        assert_eq!(
            (e.lba, e.expected_generation, e.found_generation),
            (100, 10, 9)
        );
        // Misplaced: read at another LBA.
        let e = check(&buf, 512, RUN, 101, 9).unwrap_err();
        assert_eq!((e.lba, e.found_lba), (101, 100));
        // Torn: one byte inside the third block.
        let mut torn = buf.clone();
        torn[2 * 512 + 300] ^= 1;
        let e = check(&torn, 512, RUN, 100, 9).unwrap_err();
        assert_eq!((e.lba, e.offset), (102, 300));
        assert!(e.to_string().contains("LBA 102"), "{e}");
        // A piece of the body shifted by 256 bytes (an out-of-order segment).
        let mut shifted = buf.clone();
        shifted.copy_within(40..296, 296);
        assert!(check(&shifted, 512, RUN, 100, 9).is_err());
    }

    /// The same LBAs and generations come back in every run: a block left by an earlier run,
    /// or written to another namespace, never passes for this one's.
    #[test]
    fn another_runs_or_namespaces_block_is_not_this_ones() {
        let mut earlier = vec![0u8; 512];
        fill(&mut earlier, 512, Owner { run: 76, nsid: 1 }, 5, 3);
        let e = check(&earlier, 512, RUN, 5, 3).unwrap_err();
        assert!(e.other_run && e.to_string().contains("another run"), "{e}");
        // Unknown to this run: accepted.
        assert_eq!(check(&earlier, 512, RUN, 5, 0), Ok(Checked::Placement));
        let mut other_ns = vec![0u8; 512];
        fill(&mut other_ns, 512, Owner { run: 77, nsid: 2 }, 5, 3);
        let e = check(&other_ns, 512, RUN, 5, 3).unwrap_err();
        assert_eq!((e.found_nsid, e.other_run), (2, false));
        assert!(
            check(&other_ns, 512, RUN, 5, 0).is_err(),
            "this run's, misplaced"
        );
    }

    #[test]
    fn unknown_generation_accepts_foreign_data_but_not_misplaced_blocks() {
        let zero = vec![0u8; 512];
        assert_eq!(check(&zero, 512, RUN, 5, 0), Ok(Checked::Placement));
        let mut ours = vec![0u8; 512];
        fill(&mut ours, 512, RUN, 5, 3);
        assert_eq!(check(&ours, 512, RUN, 5, 0), Ok(Checked::Placement));
        assert!(check(&ours, 512, RUN, 6, 0).is_err());
    }
}
