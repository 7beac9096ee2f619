//! Copies in and out of memory that a device or a remote peer may access at the same time
//! (registered memory regions), free of data races in Rust's memory model.
//!
//! The rule: every access this module makes to shared memory is a relaxed atomic access, and
//! all accesses to one location have the same size. Rust's model makes racing non-atomic
//! accesses, and racing atomic accesses of different sizes to overlapping locations, undefined
//! behaviour; under this rule two racing copies are neither, and a copy racing a device write
//! yields unspecified bytes, never undefined behaviour. Every access to shared memory goes
//! through this module (both soft-provider memory engines: copies between registered regions
//! and TCP gather / scatter; and `MrOps::read_at` / `write_at`), so the rule holds process-wide.
//! Device DMA (verbs) is outside the language's model; the accesses still keep the compiler
//! from assuming that memory did not change between two reads.
//!
//! Two engines, chosen when compiling (one per build, so the sizes never mix):
//! - x86_64 (`x86_64.rs`): inline assembly (AVX2 vector loads and stores, 8- and 1-byte moves
//!   for the tails). Rust's model does not look inside an asm block; the block is sound when
//!   its effect is one some Rust code could have had. The effect claimed here is, for each
//!   byte, a relaxed `AtomicU8` load of the source byte and a relaxed `AtomicU8` store of it to
//!   the destination. The hardware gives at least that: x86 makes every byte of any load or
//!   store single-copy atomic (a wide access may tear between bytes, which separate relaxed
//!   byte accesses allow, and relaxed accesses need no order among themselves). So on x86_64
//!   every access to shared memory is byte-sized, and no wider atomic touches it. The blocks are
//!   not `nomem` / `readonly`: the compiler treats them as reading and writing any memory.
//! - elsewhere, and under Miri, which cannot run inline assembly (`scripts/miri.sh`)
//!   (`portable.rs`): real relaxed atomics whose size at an address depends only on
//!   the address and the bounds of the region it lies in ([`Region`]), never on the copy: an
//!   aligned 8-byte word wholly inside the region is one `AtomicU64`, every other byte an
//!   `AtomicU8`; a partial write of a whole word is a compare-and-swap loop, so the word's
//!   other bytes are never rewritten with stale values.

use crate::error::{Result, TransportError};

#[cfg(any(test, miri, not(target_arch = "x86_64")))]
mod portable;
#[cfg(all(target_arch = "x86_64", not(miri)))]
mod x86_64;

/// The engine this build uses (see the module docs).
#[cfg(all(target_arch = "x86_64", not(miri)))]
type Active = x86_64::Asm;
#[cfg(any(miri, not(target_arch = "x86_64")))]
type Active = portable::Words;

/// A way of copying in and out of shared memory under the module's rule.
trait Engine {
    /// See [`read`].
    ///
    /// # Safety
    /// As for [`read`].
    unsafe fn read(region: Region, addr: usize, dst: &mut [u8]);
    /// See [`write`].
    ///
    /// # Safety
    /// As for [`write`].
    unsafe fn write(region: Region, addr: usize, src: &[u8]);
    /// [`copy`] when a front-to-back copy is exact: `dst <= src` or the spans are disjoint.
    ///
    /// # Safety
    /// As for [`copy`], and `dst <= src || dst >= src + len`.
    unsafe fn copy_forward(
        dst_region: Region,
        dst: usize,
        src_region: Region,
        src: usize,
        len: usize,
    );
}

/// A registered region's bounds, which fix the access size at each address for the portable
/// engine (see the module docs). Every registration of the same memory must use the same
/// bounds.
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
}

/// Ask the CPU to start bringing the cache line at `addr` into this core's cache (a hint:
/// it loads nothing the program sees and never faults, at any address). A poller issues it for
/// each capsule of a batch before reading the first, so the misses on lines the peer's core
/// wrote overlap instead of queueing one behind the other.
#[inline(always)]
pub(crate) fn prefetch(addr: *const u8) {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    // SAFETY: PREFETCHT0 (SSE, in every x86_64 CPU) touches no architectural state and does
    // not fault on any address; it is no access in the language's model.
    unsafe {
        use core::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        _mm_prefetch::<_MM_HINT_T0>(addr.cast());
    }
    #[cfg(any(miri, not(target_arch = "x86_64")))]
    let _ = addr;
}

/// Ask the CPU to start taking the cache line at `addr` for writing (PREFETCHW): a sender
/// about to copy a message into a buffer the peer's core last read issues it when it learns
/// the buffer, so the line's ownership moves while it does the checks before the copy, not
/// at the next locked instruction after it (which waits for the copy's stores). A hint, as
/// [`prefetch`]: no fault at any address, nothing the program sees.
#[inline(always)]
pub(crate) fn prefetch_write(addr: *const u8) {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    // SAFETY: PREFETCHW (0F 0D /1) touches no architectural state and does not fault on any
    // address; CPUs without it (no 3DNowPrefetch/PRFCHW) execute it as a NOP.
    unsafe {
        core::arch::asm!("prefetchw [{}]", in(reg) addr, options(nostack, preserves_flags, readonly));
    }
    #[cfg(any(miri, not(target_arch = "x86_64")))]
    let _ = addr;
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
/// non-atomically while this runs except under the module's rule.
pub(crate) unsafe fn read(region: Region, addr: usize, dst: &mut [u8]) {
    debug_assert!(addr >= region.base && addr + dst.len() <= region.end);
    // SAFETY: caller contract.
    unsafe { Active::read(region, addr, dst) }
}

/// Copy `src` into shared memory at `addr` (inside `region`).
///
/// # Safety
/// As for [`read`], and the region is writable.
pub(crate) unsafe fn write(region: Region, addr: usize, src: &[u8]) {
    debug_assert!(addr >= region.base && addr + src.len() <= region.end);
    // SAFETY: caller contract.
    unsafe { Active::write(region, addr, src) }
}

/// Copy `len` bytes between two shared spans; they may overlap, as memmove (a QP may write
/// into its own region over loopback).
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
    // SAFETY: caller contract.
    unsafe { copy_with::<Active>(dst_region, dst, src_region, src, len) }
}

/// [`copy`] with engine `E`.
///
/// # Safety
/// As for [`copy`].
unsafe fn copy_with<E: Engine>(
    dst_region: Region,
    dst: usize,
    src_region: Region,
    src: usize,
    len: usize,
) {
    debug_assert!(dst >= dst_region.base && dst + len <= dst_region.end);
    debug_assert!(src >= src_region.base && src + len <= src_region.end);
    if dst <= src || dst >= src + len {
        // SAFETY: caller contract; a front-to-back copy is exact here.
        unsafe { E::copy_forward(dst_region, dst, src_region, src, len) }
    } else {
        // The destination overlaps the source from above (rare): back to front in chunks.
        // SAFETY: caller contract.
        unsafe {
            bounce(
                E::read,
                E::write,
                dst_region,
                dst,
                src_region,
                src,
                len,
                false,
            )
        }
    }
}

/// Copy through a small stack buffer, chunk by chunk, front to back (`forward`) or back to
/// front: each chunk is read whole before it is written, so the direction that never reads a
/// byte this copy already overwrote makes any overlap exact.
///
/// # Safety
/// As for [`copy`]; `forward` only when `dst <= src` or the spans are disjoint.
#[allow(clippy::too_many_arguments)]
unsafe fn bounce(
    read: unsafe fn(Region, usize, &mut [u8]),
    write: unsafe fn(Region, usize, &[u8]),
    dst_region: Region,
    dst: usize,
    src_region: Region,
    src: usize,
    len: usize,
    forward: bool,
) {
    const CHUNK: usize = 512;
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

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const WORD: usize = 8;

    /// A test buffer of `len` bytes at `shift` bytes past an 8-aligned address.
    fn buffer(len: usize, shift: usize) -> (Vec<u64>, Region) {
        let backing = vec![0u64; (len + shift).div_ceil(WORD) + 1];
        let base = backing.as_ptr().expose_provenance() + shift;
        (backing, Region::new(base, len))
    }

    /// Every test runs against this build's engine and the portable one (on x86_64 they
    /// differ; elsewhere the portable one is the build's).
    macro_rules! each_engine {
        ($check:ident) => {
            mod $check {
                #[test]
                fn active() {
                    super::$check::<super::Active>();
                }
                #[test]
                fn portable() {
                    super::$check::<super::portable::Words>();
                }
                #[cfg(all(target_arch = "x86_64", not(miri)))]
                #[test]
                fn rep_movsb() {
                    super::$check::<super::x86_64::RepMovsb>();
                }
            }
        };
    }

    fn read_write_every_alignment_and_length<E: Engine>() {
        for shift in 0..WORD {
            for len in [1, 3, 7, 8, 9, 16, 23, 31, 32, 33, 63, 64, 65, 100, 200] {
                let (_keep, region) = buffer(len, shift);
                for start in 0..len {
                    let n = len - start;
                    let src: Vec<u8> = (0..n).map(|i| (i * 7 + start + 1) as u8).collect();
                    // SAFETY: inside the live test buffer.
                    unsafe { E::write(region, region.base + start, &src) };
                    let mut back = vec![0u8; len];
                    // SAFETY: as above.
                    unsafe { E::read(region, region.base, &mut back) };
                    assert_eq!(
                        &back[start..],
                        &src[..],
                        "shift {shift} len {len} start {start}"
                    );
                }
            }
        }
    }
    each_engine!(read_write_every_alignment_and_length);

    fn partial_write_keeps_neighbours<E: Engine>() {
        let (_keep, region) = buffer(16, 0);
        // SAFETY: inside the live test buffer.
        unsafe { E::write(region, region.base, &[0xAA; 16]) };
        // SAFETY: as above.
        unsafe { E::write(region, region.base + 3, &[1, 2, 3]) };
        let mut back = [0u8; 16];
        // SAFETY: as above.
        unsafe { E::read(region, region.base, &mut back) };
        assert_eq!(&back[..3], &[0xAA; 3]);
        assert_eq!(&back[3..6], &[1, 2, 3]);
        assert_eq!(&back[6..], &[0xAA; 10]);
    }
    each_engine!(partial_write_keeps_neighbours);

    fn overlapping_copy_is_memmove<E: Engine>() {
        for (from, to) in [
            (0usize, 5usize),
            (5, 0),
            (1, 600),
            (600, 1),
            (0, 8),
            (8, 0),
            (3, 11),
            (13, 5),
            (0, 1),
            (1, 0),
            (0, 33),
            (33, 0),
        ] {
            let (_keep, region) = buffer(2000, 3);
            let data: Vec<u8> = (0..1200).map(|i| (i % 251) as u8).collect();
            // SAFETY: inside the live test buffer.
            unsafe {
                E::write(region, region.base + from, &data);
                copy_with::<E>(
                    region,
                    region.base + to,
                    region,
                    region.base + from,
                    data.len(),
                );
            }
            let mut back = vec![0u8; data.len()];
            // SAFETY: as above.
            unsafe { E::read(region, region.base + to, &mut back) };
            assert_eq!(back, data, "from {from} to {to}");
        }
    }
    each_engine!(overlapping_copy_is_memmove);

    fn copy_between_regions_every_alignment<E: Engine>() {
        for src_shift in 0..WORD {
            for dst_shift in 0..WORD {
                let (_a, src) = buffer(100, src_shift);
                let (_b, dst) = buffer(100, dst_shift);
                let data: Vec<u8> = (0..100).map(|i| (i * 3 + 1) as u8).collect();
                for (from, to, n) in [(0, 0, 100), (1, 9, 80), (7, 0, 93), (0, 5, 95)] {
                    // SAFETY: inside the live test buffers.
                    unsafe {
                        E::write(dst, dst.base, &[0; 100]);
                        E::write(src, src.base, &data);
                        copy_with::<E>(dst, dst.base + to, src, src.base + from, n);
                    }
                    let mut back = vec![0u8; n];
                    // SAFETY: as above.
                    unsafe { E::read(dst, dst.base + to, &mut back) };
                    assert_eq!(
                        back,
                        &data[from..from + n],
                        "{src_shift} {dst_shift} {from}"
                    );
                }
            }
        }
    }
    each_engine!(copy_between_regions_every_alignment);

    /// One region of `len` bytes at `shift`, filled with `fill`; a copy of `n` bytes from
    /// `from` to `to` inside it must leave it exactly as `copy_within` leaves a plain slice,
    /// and no byte outside the copy's destination may change.
    fn copy_matches_slice_model<E: Engine>(
        fill: &[u8],
        shift: usize,
        from: usize,
        to: usize,
        n: usize,
    ) {
        let len = fill.len();
        let (_keep, region) = buffer(len, shift);
        // SAFETY: inside the live test buffer.
        unsafe { E::write(region, region.base, fill) };
        // SAFETY: `from + n` and `to + n` are at most `len` (the strategy's bounds).
        unsafe { copy_with::<E>(region, region.base + to, region, region.base + from, n) };
        let mut model = fill.to_vec();
        model.copy_within(from..from + n, to);
        let mut back = vec![0u8; len];
        // SAFETY: inside the live test buffer.
        unsafe { E::read(region, region.base, &mut back) };
        assert_eq!(back, model);
    }

    /// A copy between two regions against `copy_from_slice`, and a read of a random span.
    fn cross_copy_matches_slice_model<E: Engine>(
        a: &[u8],
        b: &[u8],
        shifts: (usize, usize),
        from: usize,
        to: usize,
        n: usize,
    ) {
        let (_ka, src) = buffer(a.len(), shifts.0);
        let (_kb, dst) = buffer(b.len(), shifts.1);
        // SAFETY: inside the live test buffers; `from + n <= a.len()`, `to + n <= b.len()`.
        unsafe {
            E::write(src, src.base, a);
            E::write(dst, dst.base, b);
            copy_with::<E>(dst, dst.base + to, src, src.base + from, n);
        }
        let mut model = b.to_vec();
        model[to..to + n].copy_from_slice(&a[from..from + n]);
        let mut back = vec![0u8; b.len()];
        // SAFETY: as above.
        unsafe { E::read(dst, dst.base, &mut back) };
        assert_eq!(back, model);
        let mut part = vec![0u8; n];
        // SAFETY: as above.
        unsafe { E::read(src, src.base + from, &mut part) };
        assert_eq!(part, &a[from..from + n]);
    }

    /// (contents, from, to, n) with both spans inside the contents.
    fn spans() -> impl Strategy<Value = (Vec<u8>, usize, usize, usize)> {
        proptest::collection::vec(any::<u8>(), 1..600).prop_flat_map(|fill| {
            let len = fill.len();
            (0..=len).prop_flat_map(move |n| {
                let fill = fill.clone();
                (Just(fill), 0..=len - n, 0..=len - n, Just(n))
            })
        })
    }

    proptest! {
        #[test]
        fn copy_is_memmove_active((fill, from, to, n) in spans(), shift in 0..WORD) {
            copy_matches_slice_model::<Active>(&fill, shift, from, to, n);
        }

        #[test]
        fn copy_is_memmove_portable((fill, from, to, n) in spans(), shift in 0..WORD) {
            copy_matches_slice_model::<portable::Words>(&fill, shift, from, to, n);
        }

        #[cfg(all(target_arch = "x86_64", not(miri)))]
        #[test]
        fn copy_is_memmove_rep_movsb((fill, from, to, n) in spans(), shift in 0..WORD) {
            copy_matches_slice_model::<x86_64::RepMovsb>(&fill, shift, from, to, n);
        }

        #[test]
        fn copy_between_regions_every_engine(
            (a, from, _, n) in spans(),
            b_extra in proptest::collection::vec(any::<u8>(), 0..100),
            to_pick in any::<prop::sample::Index>(),
            shifts in (0..WORD, 0..WORD),
        ) {
            let b: Vec<u8> = b_extra.iter().copied().chain(std::iter::repeat_n(7, n)).collect();
            let to = to_pick.index(b.len() - n + 1);
            cross_copy_matches_slice_model::<Active>(&a, &b, shifts, from, to, n);
            cross_copy_matches_slice_model::<portable::Words>(&a, &b, shifts, from, to, n);
        }
    }
}
