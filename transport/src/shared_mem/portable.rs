//! The portable engine (every target but x86_64; built everywhere for its tests): real relaxed
//! atomics, the access size at each address fixed by the region's bounds (see the parent
//! module's docs): an aligned 8-byte word wholly inside the region is one `AtomicU64`, every
//! other byte an `AtomicU8`, and a partial write of a whole word is a compare-and-swap loop so
//! the word's other bytes are never rewritten with stale values.

use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};

use super::{Engine, Region};

const WORD: usize = 8;

/// The aligned words wholly inside `region`: `first..last` (word addresses).
fn words(region: Region) -> (usize, usize) {
    let first = region.base.next_multiple_of(WORD);
    let last = region.end & !(WORD - 1);
    if first >= last {
        (first, first)
    } else {
        (first, last)
    }
}

/// Word-sized relaxed atomics where the region's bounds allow, bytes elsewhere.
pub(super) struct Words;

impl Engine for Words {
    unsafe fn read(region: Region, addr: usize, dst: &mut [u8]) {
        let (first, last) = words(region);
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

    unsafe fn write(region: Region, addr: usize, src: &[u8]) {
        let (first, last) = words(region);
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

    unsafe fn copy_forward(
        dst_region: Region,
        dst: usize,
        src_region: Region,
        src: usize,
        len: usize,
    ) {
        if (dst ^ src) % WORD != 0 {
            // Different alignment: no word lines up with a word; bounce through the stack.
            // SAFETY: caller contract (forward order is memmove-safe: dst <= src or disjoint).
            unsafe {
                super::bounce(
                    Self::read,
                    Self::write,
                    dst_region,
                    dst,
                    src_region,
                    src,
                    len,
                    true,
                )
            };
            return;
        }
        // Same alignment: word to word, no bounce buffer.
        let (dst_first, dst_last) = words(dst_region);
        let (src_first, src_last) = words(src_region);
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
                    Self::read(src_region, s, &mut byte);
                    Self::write(dst_region, d, &byte);
                }
                done += 1;
            }
        }
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
