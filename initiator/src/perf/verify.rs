//! The --verify block format: every block written carries its LBA and a generation tag, the
//! rest of the block a pattern derived from both, so a read finds misplaced, stale or torn
//! data. Block layout: 0..8 magic, 8..16 LBA, 16..24 generation, 24.. pattern.

/// Marks a block written by nvmf-perf --verify.
pub const MAGIC: u64 = 0x4e56_4d46_5645_5259; // "NVMFVERY"
/// Header bytes before the pattern.
const HEADER: usize = 24;

/// What a read found where it expected something else.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Mismatch {
    /// Namespace.
    pub nsid: u32,
    /// Block address read.
    pub lba: u64,
    /// Generation expected (0 = unknown: only the LBA was checked).
    pub expected_generation: u64,
    /// LBA found in the block header.
    pub found_lba: u64,
    /// Generation found.
    pub found_generation: u64,
    /// First bad byte in the block (0 for header fields).
    pub offset: usize,
}

impl std::fmt::Display for Mismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "verify mismatch: nsid {} LBA {}: expected LBA {} generation {}, found LBA {} generation {} (byte {})",
            self.nsid,
            self.lba,
            self.lba,
            self.expected_generation,
            self.found_lba,
            self.found_generation,
            self.offset
        )
    }
}

fn pattern_byte(lba: u64, generation: u64, i: usize) -> u8 {
    (lba as u8) ^ (generation as u8).rotate_left(3) ^ (i as u8)
}

/// Fill `buf` (whole blocks of `block_size`) as written at `first_lba` with `generation`.
pub fn fill(buf: &mut [u8], block_size: usize, first_lba: u64, generation: u64) {
    for (i, block) in buf.chunks_exact_mut(block_size).enumerate() {
        let lba = first_lba + i as u64;
        block[0..8].copy_from_slice(&MAGIC.to_le_bytes());
        block[8..16].copy_from_slice(&lba.to_le_bytes());
        block[16..24].copy_from_slice(&generation.to_le_bytes());
        for (j, b) in block[HEADER..].iter_mut().enumerate() {
            *b = pattern_byte(lba, generation, j);
        }
    }
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

/// Check blocks read at `first_lba`. `expected_generation` 0 means the job never wrote them in
/// this run: blocks without the magic are accepted, blocks with it must carry the right LBA.
pub fn check(
    buf: &[u8],
    block_size: usize,
    nsid: u32,
    first_lba: u64,
    expected_generation: u64,
) -> Result<(), Mismatch> {
    for (i, block) in buf.chunks_exact(block_size).enumerate() {
        let lba = first_lba + i as u64;
        let magic = u64_at(block, 0);
        let found_lba = u64_at(block, 8);
        let found_generation = u64_at(block, 16);
        let mismatch = |offset| Mismatch {
            nsid,
            lba,
            expected_generation,
            found_lba,
            found_generation,
            offset,
        };
        if expected_generation == 0 {
            if magic == MAGIC && found_lba != lba {
                return Err(mismatch(0));
            }
            continue;
        }
        if magic != MAGIC || found_lba != lba || found_generation != expected_generation {
            return Err(mismatch(0));
        }
        if let Some(j) = block[HEADER..]
            .iter()
            .enumerate()
            .position(|(j, &b)| b != pattern_byte(lba, expected_generation, j))
        {
            return Err(mismatch(HEADER + j));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn written_blocks_check_and_every_kind_of_damage_is_found() {
        let mut buf = vec![0u8; 4 * 512];
        fill(&mut buf, 512, 100, 9);
        assert_eq!(check(&buf, 512, 1, 100, 9), Ok(()));
        // Stale generation.
        let e = check(&buf, 512, 1, 100, 10).unwrap_err();
        assert_eq!(
            (e.lba, e.expected_generation, e.found_generation),
            (100, 10, 9)
        );
        // Misplaced: read at another LBA.
        let e = check(&buf, 512, 1, 101, 9).unwrap_err();
        assert_eq!((e.lba, e.found_lba), (101, 100));
        // Torn: one byte inside the third block.
        let mut torn = buf.clone();
        torn[2 * 512 + 300] ^= 1;
        let e = check(&torn, 512, 1, 100, 9).unwrap_err();
        assert_eq!((e.lba, e.offset), (102, 300));
        assert!(e.to_string().contains("LBA 102"), "{e}");
    }

    #[test]
    fn unknown_generation_accepts_foreign_data_but_not_misplaced_blocks() {
        let zero = vec![0u8; 512];
        assert_eq!(check(&zero, 512, 1, 5, 0), Ok(()));
        let mut ours = vec![0u8; 512];
        fill(&mut ours, 512, 5, 3);
        assert_eq!(check(&ours, 512, 1, 5, 0), Ok(()));
        assert!(check(&ours, 512, 1, 6, 0).is_err());
    }
}
