//! Copies in and out of memory that a device or a remote peer may access at the same time
//! (registered memory regions), free of data races in Rust's memory model.
//!
//! Every access to shared memory is a relaxed atomic, and the size of the atomic used at an
//! address depends only on the address and the bounds of the region it lies in ([`Region`]),
//! never on the copy: an aligned 8-byte word wholly inside the region is always accessed as one
//! `AtomicU64`, every other byte (the partial words at the region's two ends) as an `AtomicU8`.
//! So two racing copies never mix access sizes at one location (which Rust's model forbids), and
//! a copy racing a device write yields unspecified bytes, never undefined behaviour. A partial
//! write of a whole word (a copy starting or ending inside it) is a compare-and-swap loop, so
//! the word's other bytes are never rewritten with stale values.
//!
//! Device DMA (verbs) is outside the language's model; relaxed atomics still keep the compiler
//! from assuming that memory did not change between two reads.
//!
//! Both soft-provider memory engines (copies between registered regions, TCP gather / scatter)
//! and `MrOps::read_at` / `write_at` go through this module.

use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};

use crate::error::{Result, TransportError};

const WORD: usize = 8;

/// A registered region's bounds, which fix the access size at each address (see the module
/// docs). Every registration of the same memory must use the same bounds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Region {
    pub(crate) base: usize,
    pub(crate) end: usize,
}

impl Region {
    pub(crate) fn new(base: usize, len: usize) -> Region {
        Region {
            base,
            end: base + len,
        }
    }

    /// The aligned words wholly inside the region: `first..last` (word addresses).
    fn words(&self) -> (usize, usize) {
        let first = self.base.next_multiple_of(WORD);
        let last = self.end & !(WORD - 1);
        if first >= last {
            (first, first)
        } else {
            (first, last)
        }
    }
}

/// `MrOps::read_at`: copy out of the region `base..base + size` at `offset`, bounds-checked.
///
/// # Safety
/// `base..base + size` is a registered region's memory, live for the whole call.
pub(crate) unsafe fn read_at(
    base: *mut u8,
    size: usize,
    offset: usize,
    dst: &mut [u8],
) -> Result<()> {
    let base = checked(base, size, offset, dst.len())?;
    // SAFETY: the range is inside the live region (checked above, caller contract), and the
    // providers access region memory only under this module's rule.
    unsafe { read(Region::new(base, size), base + offset, dst) };
    Ok(())
}

/// `MrOps::write_at`: copy into the region `base..base + size` at `offset`, bounds-checked.
///
/// # Safety
/// As for [`read_at`], and the memory is writable.
pub(crate) unsafe fn write_at(base: *mut u8, size: usize, offset: usize, src: &[u8]) -> Result<()> {
    let base = checked(base, size, offset, src.len())?;
    // SAFETY: as in `read_at`.
    unsafe { write(Region::new(base, size), base + offset, src) };
    Ok(())
}

fn checked(base: *mut u8, size: usize, offset: usize, len: usize) -> Result<usize> {
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(base.expose_provenance()),
        _ => Err(TransportError::OutOfBounds { offset, len, size }),
    }
}

/// Copy `dst.len()` bytes from shared memory at `addr` (inside `region`) into `dst`.
///
/// # Safety
/// `addr..addr + dst.len()` lies inside `region`, which is live, readable memory for the whole
/// call, whose address provenance was exposed (`expose_provenance`), and which nothing accesses
/// non-atomically while this runs except under the module's size rule.
pub(crate) unsafe fn read(region: Region, addr: usize, dst: &mut [u8]) {
    debug_assert!(addr >= region.base && addr + dst.len() <= region.end);
    let (first, last) = region.words();
    let mut at = addr;
    let mut out = 0;
    while out < dst.len() {
        let left = dst.len() - out;
        if at >= first && at % WORD == 0 && left >= WORD && at + WORD <= last {
            // Whole words: the bulk of any copy.
            let words = ((last - at) / WORD).min(left / WORD);
            let sink = dst[out..out + words * WORD].as_mut_ptr();
            for i in 0..words {
                // SAFETY: the word is aligned and wholly inside the live region (caller
                // contract); `sink + i * WORD .. + WORD` lies inside the checked `dst` range.
                unsafe {
                    let value = atomic_u64(at + i * WORD).load(Ordering::Relaxed);
                    sink.add(i * WORD).cast::<u64>().write_unaligned(value);
                }
            }
            at += words * WORD;
            out += words * WORD;
        } else if at >= first && at < last {
            let word = at & !(WORD - 1);
            let skip = at - word;
            // SAFETY: `word` is aligned and wholly inside the live region (caller contract).
            let value = unsafe { atomic_u64(word) }.load(Ordering::Relaxed);
            let bytes = value.to_ne_bytes();
            let n = (WORD - skip).min(left);
            dst[out..out + n].copy_from_slice(&bytes[skip..skip + n]);
            at += n;
            out += n;
        } else {
            // SAFETY: `at` is inside the live region (caller contract); u8 has alignment 1.
            dst[out] = unsafe { atomic_u8(at) }.load(Ordering::Relaxed);
            at += 1;
            out += 1;
        }
    }
}

/// Copy `src` into shared memory at `addr` (inside `region`).
///
/// # Safety
/// As for [`read`], and the region is writable.
pub(crate) unsafe fn write(region: Region, addr: usize, src: &[u8]) {
    debug_assert!(addr >= region.base && addr + src.len() <= region.end);
    let (first, last) = region.words();
    let mut at = addr;
    let mut inp = 0;
    while inp < src.len() {
        let left = src.len() - inp;
        if at >= first && at % WORD == 0 && left >= WORD && at + WORD <= last {
            // Whole words: the bulk of any copy.
            let words = ((last - at) / WORD).min(left / WORD);
            let source = src[inp..inp + words * WORD].as_ptr();
            for i in 0..words {
                // SAFETY: as in `read`'s word loop, with `source` inside the checked `src`.
                unsafe {
                    let value = source.add(i * WORD).cast::<u64>().read_unaligned();
                    atomic_u64(at + i * WORD).store(value, Ordering::Relaxed);
                }
            }
            at += words * WORD;
            inp += words * WORD;
        } else if at >= first && at < last {
            let word = at & !(WORD - 1);
            let skip = at - word;
            let n = (WORD - skip).min(left);
            // SAFETY: `word` is aligned and wholly inside the live region (caller contract).
            let cell = unsafe { atomic_u64(word) };
            if n == WORD {
                let mut bytes = [0u8; WORD];
                bytes.copy_from_slice(&src[inp..inp + WORD]);
                cell.store(u64::from_ne_bytes(bytes), Ordering::Relaxed);
            } else {
                // Part of a word: replace only our bytes, atomically with respect to the rest.
                let mut current = cell.load(Ordering::Relaxed);
                loop {
                    let mut bytes = current.to_ne_bytes();
                    bytes[skip..skip + n].copy_from_slice(&src[inp..inp + n]);
                    match cell.compare_exchange_weak(
                        current,
                        u64::from_ne_bytes(bytes),
                        Ordering::Relaxed,
                        Ordering::Relaxed,
                    ) {
                        Ok(_) => break,
                        Err(now) => current = now,
                    }
                }
            }
            at += n;
            inp += n;
        } else {
            // SAFETY: `at` is inside the live, writable region (caller contract).
            unsafe { atomic_u8(at) }.store(src[inp], Ordering::Relaxed);
            at += 1;
            inp += 1;
        }
    }
}

/// Copy `len` bytes between two shared spans (they may overlap, as memmove), through a small
/// stack buffer, in the direction that never reads a byte this copy already overwrote.
///
/// # Safety
/// As for [`read`] on the source span and [`write`] on the destination span.
pub(crate) unsafe fn copy(
    dst_region: Region,
    dst: usize,
    src_region: Region,
    src: usize,
    len: usize,
) {
    const CHUNK: usize = 512;
    let forward = dst <= src || dst >= src + len;
    if forward && (dst ^ src) % WORD == 0 {
        // Same alignment: word to word, no bounce buffer. Forward is memmove-safe here.
        let (dst_first, dst_last) = dst_region.words();
        let (src_first, src_last) = src_region.words();
        let mut done = 0;
        while done < len {
            let (d, s) = (dst + done, src + done);
            let left = len - done;
            let whole = d % WORD == 0
                && left >= WORD
                && d >= dst_first
                && d + WORD <= dst_last
                && s >= src_first
                && s + WORD <= src_last;
            if whole {
                let words = ((dst_last - d) / WORD)
                    .min((src_last - s) / WORD)
                    .min(left / WORD);
                for i in 0..words {
                    // SAFETY: both words are aligned and wholly inside their live regions
                    // (checked above, caller contract).
                    unsafe {
                        let value = atomic_u64(s + i * WORD).load(Ordering::Relaxed);
                        atomic_u64(d + i * WORD).store(value, Ordering::Relaxed);
                    }
                }
                done += words * WORD;
            } else {
                let mut byte = [0u8; 1];
                // SAFETY: one byte inside each live region (caller contract).
                unsafe {
                    read(src_region, s, &mut byte);
                    write(dst_region, d, &byte);
                }
                done += 1;
            }
        }
        return;
    }
    let mut buf = [0u8; CHUNK];
    let mut done = 0;
    while done < len {
        let n = CHUNK.min(len - done);
        let off = if forward { done } else { len - done - n };
        // SAFETY: both spans lie in live regions (caller contract); `off + n <= len`.
        unsafe {
            read(src_region, src + off, &mut buf[..n]);
            write(dst_region, dst + off, &buf[..n]);
        }
        done += n;
    }
}

/// # Safety
/// `addr` is 8-aligned and the 8 bytes there are live memory (provenance exposed).
unsafe fn atomic_u64<'a>(addr: usize) -> &'a AtomicU64 {
    // SAFETY: caller contract; every access to this word is atomic and of size 8 (module rule).
    unsafe { AtomicU64::from_ptr(std::ptr::with_exposed_provenance_mut(addr)) }
}

/// # Safety
/// The byte at `addr` is live memory (provenance exposed).
unsafe fn atomic_u8<'a>(addr: usize) -> &'a AtomicU8 {
    // SAFETY: caller contract; every access to this byte is atomic and of size 1 (module rule).
    unsafe { AtomicU8::from_ptr(std::ptr::with_exposed_provenance_mut(addr)) }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A test buffer of `len` bytes at `shift` bytes past an 8-aligned address.
    fn buffer(len: usize, shift: usize) -> (Vec<u64>, Region) {
        let backing = vec![0u64; (len + shift).div_ceil(WORD) + 1];
        let base = backing.as_ptr().expose_provenance() + shift;
        (backing, Region::new(base, len))
    }

    #[test]
    fn read_write_every_alignment_and_length() {
        for shift in 0..WORD {
            for len in [1, 3, 7, 8, 9, 16, 23, 64, 100] {
                let (_keep, region) = buffer(len, shift);
                for start in 0..len {
                    let n = len - start;
                    let src: Vec<u8> = (0..n).map(|i| (i * 7 + start + 1) as u8).collect();
                    // SAFETY: inside the live test buffer.
                    unsafe { write(region, region.base + start, &src) };
                    let mut back = vec![0u8; len];
                    // SAFETY: as above.
                    unsafe { read(region, region.base, &mut back) };
                    assert_eq!(
                        &back[start..],
                        &src[..],
                        "shift {shift} len {len} start {start}"
                    );
                }
            }
        }
    }

    #[test]
    fn partial_write_keeps_neighbours() {
        let (_keep, region) = buffer(16, 0);
        // SAFETY: inside the live test buffer.
        unsafe { write(region, region.base, &[0xAA; 16]) };
        // SAFETY: as above.
        unsafe { write(region, region.base + 3, &[1, 2, 3]) };
        let mut back = [0u8; 16];
        // SAFETY: as above.
        unsafe { read(region, region.base, &mut back) };
        assert_eq!(&back[..3], &[0xAA; 3]);
        assert_eq!(&back[3..6], &[1, 2, 3]);
        assert_eq!(&back[6..], &[0xAA; 10]);
    }

    #[test]
    fn overlapping_copy_is_memmove() {
        for (from, to) in [
            (0usize, 5usize),
            (5, 0),
            (1, 600),
            (600, 1),
            (0, 8),
            (8, 0),
            (3, 11),
            (13, 5),
        ] {
            let (_keep, region) = buffer(2000, 3);
            let data: Vec<u8> = (0..1200).map(|i| (i % 251) as u8).collect();
            // SAFETY: inside the live test buffer.
            unsafe {
                write(region, region.base + from, &data);
                copy(
                    region,
                    region.base + to,
                    region,
                    region.base + from,
                    data.len(),
                );
            }
            let mut back = vec![0u8; data.len()];
            // SAFETY: as above.
            unsafe { read(region, region.base + to, &mut back) };
            assert_eq!(back, data, "from {from} to {to}");
        }
    }

    #[test]
    fn copy_between_regions_every_alignment() {
        for src_shift in 0..WORD {
            for dst_shift in 0..WORD {
                let (_a, src) = buffer(100, src_shift);
                let (_b, dst) = buffer(100, dst_shift);
                let data: Vec<u8> = (0..100).map(|i| (i * 3 + 1) as u8).collect();
                for (from, to, n) in [(0, 0, 100), (1, 9, 80), (7, 0, 93), (0, 5, 95)] {
                    // SAFETY: inside the live test buffers.
                    unsafe {
                        write(dst, dst.base, &[0; 100]);
                        write(src, src.base, &data);
                        copy(dst, dst.base + to, src, src.base + from, n);
                    }
                    let mut back = vec![0u8; n];
                    // SAFETY: as above.
                    unsafe { read(dst, dst.base + to, &mut back) };
                    assert_eq!(
                        back,
                        &data[from..from + n],
                        "{src_shift} {dst_shift} {from}"
                    );
                }
            }
        }
    }
}
