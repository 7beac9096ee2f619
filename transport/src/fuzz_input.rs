//! What the hostile-peer fuzz harnesses of the layers above (the target's and the initiator's,
//! built for their tests and their `fuzzing` features) share: reading an input's records,
//! keeping their seed files equal to what they build, and a fixed stream of pseudo-random
//! inputs. Small and free of I/O but the seed files: compiled always, hidden from the docs.

use std::borrow::Cow;
use std::path::Path;

/// The first `n` bytes of `bytes` (fewer when it is shorter, padded with zeroes), and the rest.
pub fn take(bytes: &[u8], n: usize) -> (Cow<'_, [u8]>, &[u8]) {
    if bytes.len() >= n {
        (bytes[..n].into(), &bytes[n..])
    } else {
        let mut padded = bytes.to_vec();
        padded.resize(n, 0);
        (padded.into(), &[])
    }
}

/// Panics unless the files in `dir` are exactly `seeds` (name, bytes); with `NVMF_WRITE_SEEDS`
/// set in the environment, rewrites `dir` from `seeds` first.
pub fn check_seed_files(dir: &Path, seeds: &[(&str, Vec<u8>)]) {
    if std::env::var_os("NVMF_WRITE_SEEDS").is_some() {
        let _ = std::fs::remove_dir_all(dir);
        std::fs::create_dir_all(dir).expect("seed directory");
        for (name, input) in seeds {
            std::fs::write(dir.join(name), input).expect("seed file");
        }
    }
    let mut on_disk: Vec<String> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    on_disk.sort();
    let mut names: Vec<String> = seeds.iter().map(|(n, _)| (*n).to_owned()).collect();
    names.sort();
    assert_eq!(on_disk, names, "rewrite with NVMF_WRITE_SEEDS=1");
    for (name, input) in seeds {
        let file = std::fs::read(dir.join(name)).expect("seed file");
        assert!(
            file == *input,
            "{name} differs: rewrite with NVMF_WRITE_SEEDS=1"
        );
    }
}

/// Xorshift64: the same numbers from the same seed on every run (seeded garbage inputs).
pub struct Xorshift(u64);

impl Xorshift {
    /// A stream from `seed` (not zero).
    pub fn new(seed: u64) -> Xorshift {
        Xorshift(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn take_pads_a_short_input_with_zeroes() {
        let (head, rest) = take(&[1, 2, 3], 2);
        assert_eq!((&head[..], rest), (&[1, 2][..], &[3][..]));
        let (head, rest) = take(&[7], 3);
        assert_eq!((&head[..], rest), (&[7, 0, 0][..], &[][..]));
    }
}
