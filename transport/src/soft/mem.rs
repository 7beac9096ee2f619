//! Memory: the device key table, memory regions, and the memory engine that copies between
//! registered addresses. The only `unsafe` of the soft provider lives here.
//!
//! Keys: every MR takes two slots of its device's key table, one for its lkey and one for its
//! rkey, so the two keys are distinct and an lkey is never accepted as an rkey. A key is
//! `slot_index << 8 | generation`; deregistration bumps the generation, so a stale key fails.
//!
//! Liveness: a slot's `state` word packs VALID, the generation and an in-flight count. A lookup
//! increments the count (CAS, only while VALID and the generation matches) and returns a
//! [`KeyRef`] guard that decrements it on drop. Deregistration clears VALID, then waits for
//! the count to reach zero before the memory is freed, so no copy ever touches freed memory.
//! Lookups never block and never allocate. A [`PinCache`] holds pins for one in-process
//! `post_send` list: a key used again in the list is re-checked without a second pin, and
//! each pin is dropped once, when the list is done (a locked instruction right after a copy
//! into the other core's lines waits for those stores: two per key per work request were the
//! largest share of the in-process copy path).

use std::cell::RefCell;
use std::ops::Range;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use arrayvec::ArrayVec;

use super::SoftPd;
use super::device::DeviceInner;
use crate::error::{Result, TransportError};
use crate::provider::{MrOps, MwOps, bind_op};
use crate::shared_mem::{self, Region};
use crate::types::*;

/// Most SGEs one work request can carry on a soft device (fixed-size, allocation-free lists).
pub(crate) const SOFT_MAX_SGE: usize = 16;

const CHUNK_BITS: u32 = 12;
const CHUNK: usize = 1 << CHUNK_BITS;
const CHUNKS: usize = 1024;

const VALID: u64 = 1 << 63;
const GEN_SHIFT: u32 = 32;
const COUNT_MASK: u64 = 0xffff_ffff;
/// Slot flag (in `flags`): this slot is an rkey.
const REMOTE_KEY: u32 = 1 << 31;
/// Slot flag: this slot is a type-2 memory window (an rkey that binds and invalidates).
const WINDOW: u32 = 1 << 30;

/// One key. A slot per cache line: an MR's lkey and rkey slots are neighbours, and the two
/// sides of a connection pin them (the owner its lkey, the peer the rkey), each writing the
/// slot's `state`; sharing a line, every lookup missed the cache.
#[derive(Default)]
#[repr(align(64))]
struct KeySlot {
    state: AtomicU64,
    addr: AtomicU64,
    len: AtomicU64,
    /// The bounds of the registered memory this key reaches into (for an MR, its own range),
    /// which fix the access size at each address (`shared_mem`).
    region_base: AtomicU64,
    region_len: AtomicU64,
    flags: AtomicU32,
    pd: AtomicU32,
    /// A bound window: the lkey of the region it lies in. A lookup pins that region too, so
    /// the region cannot be freed under a copy through the window, and a window over a
    /// deregistered region stops working.
    parent: AtomicU32,
}

/// Why a key lookup failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum KeyError {
    /// No live key with that value (never registered, deregistered, invalidated, wrong kind).
    Unknown,
    /// The key belongs to another protection domain.
    WrongPd,
    /// The range is outside the region.
    Bounds,
    /// The region does not grant the access.
    Access,
}

/// A validated, pinned range of registered memory. While it lives, the region cannot be
/// freed; `addr..addr+len` lies inside it.
pub(crate) struct KeyRef<'a> {
    slot: &'a KeySlot,
    /// A window's region, pinned as well.
    parent: Option<&'a KeySlot>,
    addr: u64,
    len: u64,
    region: Region,
    /// The guard holds the pins itself (false: a [`PinCache`] it borrows from holds them).
    owns_pin: bool,
}

impl Drop for KeyRef<'_> {
    fn drop(&mut self) {
        if self.owns_pin {
            unpin(self.slot, self.parent);
        }
    }
}

#[inline(always)]
fn unpin(slot: &KeySlot, parent: Option<&KeySlot>) {
    slot.state.fetch_sub(1, Ordering::Release);
    if let Some(p) = parent {
        p.state.fetch_sub(1, Ordering::Release);
    }
}

/// Whether `slot` (which the caller keeps pinned) still answers `key`: VALID with its
/// generation (an invalidation or a deregistration begun since it was pinned says no).
#[inline(always)]
fn still_valid(slot: &KeySlot, key: u32) -> bool {
    let cur = slot.state.load(Ordering::Acquire);
    cur & VALID != 0 && (cur >> GEN_SHIFT) & 0xff == u64::from(key & 0xff)
}

/// Take an in-flight reference on `slot` if it is VALID with `generation`.
#[inline(always)]
fn pin(slot: &KeySlot, generation: u64) -> bool {
    let mut cur = slot.state.load(Ordering::Acquire);
    loop {
        if cur & VALID == 0 || (cur >> GEN_SHIFT) & 0xff != generation {
            return false;
        }
        match slot
            .state
            .compare_exchange_weak(cur, cur + 1, Ordering::Acquire, Ordering::Acquire)
        {
            Ok(_) => return true,
            Err(now) => cur = now,
        }
    }
}

/// Wait until no copy holds an in-flight reference on `slot` (a memcpy long: spin, yield).
fn drain(slot: &KeySlot) {
    let mut spins = 0u32;
    while slot.state.load(Ordering::Acquire) & COUNT_MASK != 0 {
        spins += 1;
        if spins < 64 {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
}

/// Why a memory-window operation failed (the WR's completion status says which).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WindowError {
    /// Not a window of this PD, or already bound (a type-2 window is invalidated first).
    BadWindow,
    /// The region: unknown lkey, other PD, range outside it, no MW_BIND, or a writable window
    /// over a region without LOCAL_WRITE.
    BadRegion,
}

#[derive(Default)]
struct FreeList {
    next_fresh: u32,
    free: Vec<u32>,
}

/// A device's key table: lock-free lookups, slots allocated on the control path.
pub(crate) struct KeyTable {
    chunks: Box<[OnceLock<Box<[KeySlot]>>]>,
    free: Mutex<FreeList>,
}

impl KeyTable {
    pub(crate) fn new() -> KeyTable {
        KeyTable {
            chunks: (0..CHUNKS).map(|_| OnceLock::new()).collect(),
            // Slot 0 is never handed out, so no key is 0.
            free: Mutex::new(FreeList {
                next_fresh: 1,
                free: Vec::new(),
            }),
        }
    }

    #[inline(always)]
    fn slot(&self, index: u32) -> Option<&KeySlot> {
        let chunk = self.chunks.get((index >> CHUNK_BITS) as usize)?.get()?;
        chunk.get(index as usize & (CHUNK - 1))
    }

    /// Register `addr..addr+len` under a new key.
    fn register(&self, addr: u64, len: u64, access: Access, pd: u32, remote: bool) -> Result<u32> {
        let index = self.take_slot()?;
        let slot = self.slot_of(index);
        let generation = (slot.state.load(Ordering::Acquire) >> GEN_SHIFT) & 0xff;
        slot.addr.store(addr, Ordering::Relaxed);
        slot.len.store(len, Ordering::Relaxed);
        slot.region_base.store(addr, Ordering::Relaxed);
        slot.region_len.store(len, Ordering::Relaxed);
        slot.flags.store(
            access.bits() | if remote { REMOTE_KEY } else { 0 },
            Ordering::Relaxed,
        );
        slot.pd.store(pd, Ordering::Relaxed);
        slot.parent.store(0, Ordering::Relaxed);
        // Publishes the fields above to every lookup that observes VALID.
        slot.state
            .store(VALID | (generation << GEN_SHIFT), Ordering::Release);
        Ok((index << 8) | generation as u32)
    }

    /// The slot `index` (allocated, so its chunk exists).
    fn slot_of(&self, index: u32) -> &KeySlot {
        let chunk = self.chunks[(index >> CHUNK_BITS) as usize]
            .get_or_init(|| (0..CHUNK).map(|_| KeySlot::default()).collect());
        &chunk[index as usize & (CHUNK - 1)]
    }

    fn take_slot(&self) -> Result<u32> {
        let index = {
            let mut fl = self.free.lock().unwrap_or_else(|e| e.into_inner());
            match fl.free.pop() {
                Some(i) => i,
                None => {
                    let i = fl.next_fresh;
                    if i as usize >= CHUNK * CHUNKS {
                        return Err(TransportError::Limit {
                            what: "memory keys",
                            asked: i as u64 + 1,
                            max: (CHUNK * CHUNKS) as u64,
                        });
                    }
                    fl.next_fresh += 1;
                    i
                }
            }
        };
        Ok(index)
    }

    /// A new, unbound type-2 window of `pd`: its slot, and the key it starts with (which
    /// answers nothing until a bind gives it a generation).
    fn reserve_window(&self, pd: u32) -> Result<u32> {
        let index = self.take_slot()?;
        let slot = self.slot_of(index);
        let generation = (slot.state.load(Ordering::Acquire) >> GEN_SHIFT) & 0xff;
        slot.flags.store(REMOTE_KEY | WINDOW, Ordering::Relaxed);
        slot.pd.store(pd, Ordering::Relaxed);
        slot.parent.store(0, Ordering::Relaxed);
        slot.state.store(generation << GEN_SHIFT, Ordering::Release);
        Ok((index << 8) | generation as u32)
    }

    /// Execute a bind WR: window `rkey >> 8` of `pd`, unbound, takes `rkey` over
    /// `addr..addr+len` of the region `lkey` names, granting `access`.
    pub(crate) fn bind_window(
        &self,
        pd: u32,
        rkey: u32,
        lkey: u32,
        addr: u64,
        len: u64,
        access: Access,
    ) -> std::result::Result<(), WindowError> {
        let slot = self.slot(rkey >> 8).ok_or(WindowError::BadWindow)?;
        let flags = slot.flags.load(Ordering::Relaxed);
        if flags & WINDOW == 0 || slot.pd.load(Ordering::Relaxed) != pd {
            return Err(WindowError::BadWindow);
        }
        if slot.state.load(Ordering::Acquire) & VALID != 0 {
            return Err(WindowError::BadWindow);
        }
        let region = self
            .lookup(lkey, false, pd, addr, len, Access::empty())
            .map_err(|_| WindowError::BadRegion)?;
        let region_flags = Access::from_bits_truncate(region.slot.flags.load(Ordering::Relaxed));
        if !region_flags.contains(Access::MW_BIND)
            || (access.contains(Access::REMOTE_WRITE)
                && !region_flags.contains(Access::LOCAL_WRITE))
        {
            return Err(WindowError::BadRegion);
        }
        // Copies through the window's previous binding may still run: its fields change only
        // once they are done.
        drain(slot);
        slot.addr.store(addr, Ordering::Relaxed);
        slot.len.store(len, Ordering::Relaxed);
        slot.region_base
            .store(region.region.base as u64, Ordering::Relaxed);
        slot.region_len.store(
            (region.region.end - region.region.base) as u64,
            Ordering::Relaxed,
        );
        slot.flags.store(
            (access & (Access::REMOTE_READ | Access::REMOTE_WRITE)).bits() | REMOTE_KEY | WINDOW,
            Ordering::Relaxed,
        );
        slot.parent.store(lkey, Ordering::Relaxed);
        drop(region);
        // Publishes the binding; the count is zero (drained) and only a bind or a free moves
        // an unbound window's state, both on the owner's thread.
        slot.state.store(
            VALID | (u64::from(rkey & 0xff) << GEN_SHIFT),
            Ordering::Release,
        );
        Ok(())
    }

    /// Free a window's slot (`Mw` dropped): it stops answering, then waits for copies.
    fn release_window(&self, key: u32) {
        let index = key >> 8;
        let Some(slot) = self.slot(index) else { return };
        let cur = slot.state.fetch_and(!VALID, Ordering::AcqRel);
        drain(slot);
        let generation = (cur >> GEN_SHIFT) & 0xff;
        slot.state
            .store(((generation + 1) & 0xff) << GEN_SHIFT, Ordering::Release);
        slot.parent.store(0, Ordering::Relaxed);
        slot.flags.store(0, Ordering::Relaxed);
        self.free
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .free
            .push(index);
    }

    /// Pin `key`'s region for `addr..addr+len` with `need` access. Never blocks. Inlined: it
    /// runs 2-4 times per NVMe I/O, and a call returned the guard through memory.
    #[inline(always)]
    pub(crate) fn lookup(
        &self,
        key: u32,
        remote: bool,
        pd: u32,
        addr: u64,
        len: u64,
        need: Access,
    ) -> std::result::Result<KeyRef<'_>, KeyError> {
        let slot = self.slot(key >> 8).ok_or(KeyError::Unknown)?;
        if !pin(slot, u64::from(key & 0xff)) {
            return Err(KeyError::Unknown);
        }
        // From here the guard keeps the slot's fields stable (re-registration and rebinding
        // wait for count 0).
        let region = Region::new(
            slot.region_base.load(Ordering::Relaxed) as usize,
            slot.region_len.load(Ordering::Relaxed) as usize,
        );
        let mut pinned = KeyRef {
            slot,
            parent: None,
            addr,
            len,
            region,
            owns_pin: true,
        };
        let parent = slot.parent.load(Ordering::Relaxed);
        if parent != 0 {
            let parent_slot = self.slot(parent >> 8).ok_or(KeyError::Unknown)?;
            if !pin(parent_slot, u64::from(parent & 0xff)) {
                return Err(KeyError::Unknown);
            }
            pinned.parent = Some(parent_slot);
        }
        check_pinned(slot, remote, pd, addr, len, need)?;
        Ok(pinned)
    }

    /// Invalidation (a peer's SEND_WITH_INV, a local LOCAL_INV): a bound window's rkey stops
    /// working; the window may be bound again. Returns false when `rkey` is not a bound window
    /// of `pd`: as on hardware, a plain MR's rkey cannot be invalidated (the WR fails).
    pub(crate) fn invalidate_rkey(&self, rkey: u32, pd: u32) -> bool {
        let Some(slot) = self.slot(rkey >> 8) else {
            return false;
        };
        if slot.flags.load(Ordering::Relaxed) & WINDOW == 0 || slot.pd.load(Ordering::Relaxed) != pd
        {
            return false;
        }
        let generation = u64::from(rkey & 0xff);
        let mut cur = slot.state.load(Ordering::Acquire);
        loop {
            if cur & VALID == 0 || (cur >> GEN_SHIFT) & 0xff != generation {
                return false;
            }
            match slot.state.compare_exchange_weak(
                cur,
                cur & !VALID,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return true,
                Err(now) => cur = now,
            }
        }
    }

    /// Take `key` out of the table and wait until no copy uses it any more.
    fn deregister(&self, key: u32) {
        let index = key >> 8;
        let Some(slot) = self.slot(index) else { return };
        let generation = u64::from(key & 0xff);
        let cur = slot.state.fetch_and(!VALID, Ordering::AcqRel);
        if (cur >> GEN_SHIFT) & 0xff != generation {
            return;
        }
        drain(slot);
        slot.state
            .store(((generation + 1) & 0xff) << GEN_SHIFT, Ordering::Release);
        self.free
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .free
            .push(index);
    }
}

/// The checks of a lookup once `slot` is pinned (its fields are then stable): kind, PD,
/// bounds, access.
#[inline(always)]
fn check_pinned(
    slot: &KeySlot,
    remote: bool,
    pd: u32,
    addr: u64,
    len: u64,
    need: Access,
) -> std::result::Result<(), KeyError> {
    let flags = slot.flags.load(Ordering::Relaxed);
    if (flags & REMOTE_KEY != 0) != remote {
        return Err(KeyError::Unknown);
    }
    if slot.pd.load(Ordering::Relaxed) != pd {
        return Err(KeyError::WrongPd);
    }
    let base = slot.addr.load(Ordering::Relaxed);
    let size = slot.len.load(Ordering::Relaxed);
    let end = addr.checked_add(len).ok_or(KeyError::Bounds)?;
    if addr < base || end > base + size {
        return Err(KeyError::Bounds);
    }
    if !Access::from_bits_truncate(flags).contains(need) {
        return Err(KeyError::Access);
    }
    Ok(())
}

/// Keys one cache holds pinned at most; past that a lookup pins for its own guard, as
/// [`KeyTable::lookup`] does. A list's work requests use a few keys each (the target's: its
/// buffer pool's lkey, the response lkey, the host's rkey and receive lkey).
const PIN_CACHE: usize = 8;

/// A key a [`PinCache`] holds pinned.
struct Held<'t> {
    table: &'t KeyTable,
    key: u32,
    slot: &'t KeySlot,
    /// A window's region, pinned as well, and its lkey.
    parent: Option<(&'t KeySlot, u32)>,
}

/// Pins kept across the work requests of one `post_send` list (in-process fabric), or across
/// the payload spans of one soft TCP write (`Conn::flush_parts`). A lookup
/// of a key the cache holds re-checks the slot with a plain load (an invalidation or a
/// deregistration begun meanwhile fails it, as a fresh pin would) and pins nothing; its
/// guard borrows the cache, so no guard outlives the pins. Deregistration and rebinding wait
/// for the list to end: so its owner drops (or [`release`](Self::release)s) the cache before
/// anything that may wait, such as a local bind on the same device.
pub(crate) struct PinCache<'t> {
    /// False: every lookup pins for its own guard (a list too short to use a key twice, where
    /// the cache's bookkeeping would be all cost).
    enabled: bool,
    held: RefCell<ArrayVec<Held<'t>, PIN_CACHE>>,
}

impl<'t> PinCache<'t> {
    pub(crate) fn new(enabled: bool) -> PinCache<'t> {
        PinCache {
            enabled,
            held: RefCell::new(ArrayVec::new()),
        }
    }

    /// Whether lookups go through the cache (else each pins for its own guard).
    #[inline(always)]
    pub(crate) fn enabled(&self) -> bool {
        self.enabled
    }

    /// [`KeyTable::lookup`] through the cache: `table`'s `key` pinned once per cache.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn lookup<'c>(
        &'c self,
        table: &'t KeyTable,
        key: u32,
        remote: bool,
        pd: u32,
        addr: u64,
        len: u64,
        need: Access,
    ) -> std::result::Result<KeyRef<'c>, KeyError> {
        if !self.enabled {
            return table.lookup(key, remote, pd, addr, len, need);
        }
        let mut held = self.held.borrow_mut();
        if let Some(h) = held
            .iter()
            .find(|h| h.key == key && std::ptr::eq(h.table, table))
        {
            if !still_valid(h.slot, key) || h.parent.is_some_and(|(p, lkey)| !still_valid(p, lkey))
            {
                return Err(KeyError::Unknown);
            }
            check_pinned(h.slot, remote, pd, addr, len, need)?;
            return Ok(KeyRef {
                slot: h.slot,
                parent: h.parent.map(|(p, _)| p),
                addr,
                len,
                region: Region::new(
                    h.slot.region_base.load(Ordering::Relaxed) as usize,
                    h.slot.region_len.load(Ordering::Relaxed) as usize,
                ),
                owns_pin: false,
            });
        }
        let mut found = table.lookup(key, remote, pd, addr, len, need)?;
        if !held.is_full() {
            // The cache takes the guard's pins over.
            let parent = found
                .parent
                .map(|p| (p, found.slot.parent.load(Ordering::Relaxed)));
            held.push(Held {
                table,
                key,
                slot: found.slot,
                parent,
            });
            found.owns_pin = false;
        }
        Ok(found)
    }

    /// Drop every pin now (no guard borrows the cache: `&mut`).
    pub(crate) fn release(&mut self) {
        for h in self.held.get_mut().drain(..) {
            unpin(h.slot, h.parent.map(|(p, _)| p));
        }
    }
}

impl Drop for PinCache<'_> {
    #[inline(always)]
    fn drop(&mut self) {
        if self.enabled {
            self.release();
        }
    }
}

/// [`resolve_local_into`] through a [`PinCache`]. The loop is written out in both: one loop
/// taking the lookup as a closure cost the in-process path about 230 instructions per NVMe
/// read on the target under callgrind (session 11).
#[inline(always)]
pub(crate) fn resolve_local_cached<'c, 't>(
    list: &mut SgList<'c>,
    pins: &'c PinCache<'t>,
    table: &'t KeyTable,
    pd: u32,
    sges: &[Sge],
    need: Access,
) -> std::result::Result<(), KeyError> {
    for sge in sges.iter().take(SOFT_MAX_SGE) {
        if sge.length == 0 {
            continue;
        }
        list.push(pins.lookup(
            table,
            sge.lkey,
            false,
            pd,
            sge.addr,
            u64::from(sge.length),
            need,
        )?);
    }
    Ok(())
}

/// A validated scatter/gather list: up to [`SOFT_MAX_SGE`] pinned ranges, no allocation.
/// An `ArrayVec`: creating one writes nothing but its length and dropping it visits only the
/// pushed ranges (a `[Option<KeyRef>; 16]` was zeroed, moved and scanned whole per work
/// request: about a thousand instructions per NVMe I/O). Fill it in place
/// ([`resolve_local_into`]) on the fast path: a move copies the whole capacity.
pub(crate) struct SgList<'a> {
    refs: ArrayVec<KeyRef<'a>, SOFT_MAX_SGE>,
    total: u64,
}

impl<'a> SgList<'a> {
    pub(crate) fn new() -> SgList<'a> {
        SgList {
            refs: ArrayVec::new(),
            total: 0,
        }
    }
    /// Add a range; past [`SOFT_MAX_SGE`] it is dropped (unpinned): callers take at most that
    /// many SGEs, as `resolve_local_into` does.
    #[inline(always)]
    pub(crate) fn push(&mut self, r: KeyRef<'a>) {
        let len = r.len;
        if self.refs.try_push(r).is_ok() {
            self.total += len;
        }
    }
    pub(crate) fn total(&self) -> u64 {
        self.total
    }
    fn spans(&self) -> impl Iterator<Item = &KeyRef<'a>> {
        self.refs.iter()
    }
}

/// Validate local SGEs against `table`: lkeys of `pd` with `need` access. Zero-length SGEs
/// are not checked (as in verbs).
pub(crate) fn resolve_local<'a>(
    table: &'a KeyTable,
    pd: u32,
    sges: &[Sge],
    need: Access,
) -> std::result::Result<SgList<'a>, KeyError> {
    let mut list = SgList::new();
    resolve_local_into(&mut list, table, pd, sges, need)?;
    Ok(list)
}

/// [`resolve_local`] into a list the caller owns (the fast path: no move of the list).
/// Inlined: each in-process WR runs it once or twice, and a call returned its result and
/// spilled the caller's registers around a loop that is one SGE long.
#[inline(always)]
pub(crate) fn resolve_local_into<'a>(
    list: &mut SgList<'a>,
    table: &'a KeyTable,
    pd: u32,
    sges: &[Sge],
    need: Access,
) -> std::result::Result<(), KeyError> {
    for sge in sges.iter().take(SOFT_MAX_SGE) {
        if sge.length == 0 {
            continue;
        }
        list.push(table.lookup(sge.lkey, false, pd, sge.addr, u64::from(sge.length), need)?);
    }
    Ok(())
}

/// Copy `len` bytes from the pinned source spans into the pinned destination spans (both
/// walked in order). Returns the bytes copied: min(src, dst, len).
#[inline]
pub(crate) fn copy_sg(dst: &SgList<'_>, src: &SgList<'_>, len: u64) -> u64 {
    let mut d = dst.spans();
    let mut s = src.spans();
    let (mut dcur, mut scur) = (
        d.next().map(|r| (r.addr, r.len, r.region)),
        s.next().map(|r| (r.addr, r.len, r.region)),
    );
    let mut left = len;
    let mut done = 0;
    while left > 0 {
        let (Some((da, dl, dr)), Some((sa, sl, sr))) = (dcur, scur) else {
            break;
        };
        let n = dl.min(sl).min(left);
        // SAFETY: both spans were proved by `KeyTable::lookup` to lie inside live
        // registrations (`dr`, `sr`) that the lists' `KeyRef` guards keep alive for the call;
        // `shared_mem::copy` is memmove (a QP may write into its own MR over loopback).
        unsafe { shared_mem::copy(dr, da as usize, sr, sa as usize, n as usize) };
        done += n;
        left -= n;
        dcur = if dl == n {
            d.next().map(|r| (r.addr, r.len, r.region))
        } else {
            Some((da + n, dl - n, dr))
        };
        scur = if sl == n {
            s.next().map(|r| (r.addr, r.len, r.region))
        } else {
            Some((sa + n, sl - n, sr))
        };
    }
    done
}

/// Copy out of pinned spans into `out` (TCP transmit, inline capture).
pub(crate) fn gather(src: &SgList<'_>, out: &mut [u8]) -> usize {
    let mut off = 0;
    for r in src.spans() {
        let n = (r.len as usize).min(out.len() - off);
        if n == 0 {
            break;
        }
        // SAFETY: `r` pins a live registration covering r.addr..r.addr+r.len (checked by
        // `KeyTable::lookup`), and n <= r.len. The address's provenance was exposed at
        // registration.
        unsafe { shared_mem::read(r.region, r.addr as usize, &mut out[off..off + n]) };
        off += n;
    }
    off
}

/// Copy `data` into pinned spans (TCP receive, inline delivery). Returns bytes written.
pub(crate) fn scatter(dst: &SgList<'_>, data: &[u8]) -> usize {
    let mut off = 0;
    for r in dst.spans() {
        let n = (r.len as usize).min(data.len() - off);
        if n == 0 {
            break;
        }
        // SAFETY: `r` pins a live registration covering r.addr..r.addr+r.len, n <= r.len.
        unsafe { shared_mem::write(r.region, r.addr as usize, &data[off..off + n]) };
        off += n;
    }
    off
}

/// One piece of a vectored socket write: bytes of the caller's, or a pinned span of
/// registered memory that the kernel reads in place (as a NIC's DMA would), so a payload is
/// not gathered into a buffer first.
pub(crate) enum Part<'p, 'a> {
    Bytes(&'p [u8]),
    Span(&'p KeyRef<'a>),
}

impl Part<'_, '_> {
    fn len(&self) -> usize {
        match self {
            Part::Bytes(b) => b.len(),
            Part::Span(r) => r.len as usize,
        }
    }
}

/// Most iovecs one `send_parts` call passes (the caller loops for the rest): a soft TCP flush's
/// parts at most (its spans, the bytes between and around them), so that one takes one
/// `sendmsg` when the socket has room.
pub(crate) const MAX_IOV: usize = 65;

/// `sendmsg(2)` (MSG_NOSIGNAL: a closed peer is an error, not a signal) of the concatenation
/// of `parts`, from byte `skip` on. Returns the bytes the socket took.
pub(crate) fn send_parts(
    fd: RawFd,
    parts: &[Part<'_, '_>],
    mut skip: usize,
) -> std::io::Result<usize> {
    let mut iov: ArrayVec<libc::iovec, MAX_IOV> = ArrayVec::new();
    for p in parts {
        let len = p.len();
        if skip >= len {
            skip -= len;
            continue;
        }
        if iov.is_full() {
            break;
        }
        let base: *const u8 = match p {
            Part::Bytes(b) => b[skip..].as_ptr(),
            Part::Span(r) => std::ptr::with_exposed_provenance(r.addr as usize + skip),
        };
        iov.push(libc::iovec {
            iov_base: base.cast_mut().cast(),
            iov_len: len - skip,
        });
        skip = 0;
    }
    if iov.is_empty() {
        return Ok(0);
    }
    // SAFETY: a zeroed msghdr is valid (no name, no control data); it points at `iov`.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov.as_mut_ptr();
    msg.msg_iovlen = iov.len();
    // SAFETY: every iovec covers live memory for the call: the caller's byte slices, or spans
    // that `KeyTable::lookup` proved inside registrations which the `KeyRef` guards keep
    // alive; the kernel only reads them (a concurrent write to registered memory races as
    // with a NIC's DMA read, never with a Rust reference).
    let n = unsafe { libc::sendmsg(fd, &msg, libc::MSG_NOSIGNAL) };
    if n < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// Append the concatenation of `parts`, from byte `skip` on, to `out` (what a socket did not
/// take, kept as bytes of its own).
pub(crate) fn gather_parts(parts: &[Part<'_, '_>], mut skip: usize, out: &mut Vec<u8>) {
    for p in parts {
        let len = p.len();
        if skip >= len {
            skip -= len;
            continue;
        }
        match p {
            Part::Bytes(b) => out.extend_from_slice(&b[skip..]),
            Part::Span(r) => {
                let start = out.len();
                out.resize(start + len - skip, 0);
                // SAFETY: `r` pins a live registration covering r.addr..r.addr+r.len, and
                // skip < len.
                unsafe { shared_mem::read(r.region, r.addr as usize + skip, &mut out[start..]) };
            }
        }
        skip = 0;
    }
}

/// Memory behind an MR.
enum Backing {
    /// Page-aligned, zeroed, from `alloc_mr`.
    Aligned { layout: std::alloc::Layout },
    /// A caller's buffer from `reg_mr_owned`, kept until the MR drops.
    #[allow(dead_code, reason = "held for its Drop")]
    Owned(Box<dyn std::any::Any + Send>),
    /// A caller's memory from `reg_mr_raw`, which the caller keeps (its safety contract).
    Borrowed,
}

/// Where an MR's memory comes from.
pub(crate) enum Source {
    Alloc(usize),
    Owned(Box<dyn std::any::Any + Send>, *mut u8, usize),
    /// # Safety (of the `reg_mr_raw` that builds it)
    /// Valid for `len` bytes until the MR drops.
    Raw(*mut u8, usize),
}

struct Memory {
    addr: usize,
    len: usize,
    backing: Backing,
}

impl Memory {
    fn alloc(len: usize) -> Result<Memory> {
        let layout = std::alloc::Layout::from_size_align(len, 4096)
            .map_err(|_| TransportError::InvalidArgument(format!("MR length {len} too large")))?;
        // SAFETY: layout has non-zero size (callers refuse len 0).
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(TransportError::Limit {
                what: "MR memory",
                asked: len as u64,
                max: 0,
            });
        }
        Ok(Memory {
            addr: ptr.expose_provenance(),
            len,
            backing: Backing::Aligned { layout },
        })
    }

    fn from_source(source: Source) -> Result<Memory> {
        match source {
            Source::Alloc(len) => Memory::alloc(len),
            Source::Owned(owner, ptr, len) => Ok(Memory {
                addr: ptr.expose_provenance(),
                len,
                backing: Backing::Owned(owner),
            }),
            Source::Raw(ptr, len) => Ok(Memory {
                addr: ptr.expose_provenance(),
                len,
                backing: Backing::Borrowed,
            }),
        }
    }

    fn ptr(&self) -> *mut u8 {
        std::ptr::with_exposed_provenance_mut(self.addr)
    }
}

impl Drop for Memory {
    fn drop(&mut self) {
        match self.backing {
            // SAFETY: allocated by `alloc_zeroed` with exactly this layout, freed once; the key
            // table entries were removed and drained before (SoftMr::drop order).
            Backing::Aligned { layout } => unsafe { std::alloc::dealloc(self.ptr(), layout) },
            // The owner drops with the field, after the keys were drained.
            Backing::Owned(_) | Backing::Borrowed => {}
        }
    }
}

/// A registered memory region of a soft device.
pub struct SoftMr {
    // Field order: keys are deregistered in Drop before `mem` is freed.
    dev: Arc<DeviceInner>,
    lkey: u32,
    rkey: u32,
    access: Access,
    mem: Memory,
    _pd: SoftPd,
}

impl SoftMr {
    pub(crate) fn new(pd: &SoftPd, source: Source, access: Access) -> Result<SoftMr> {
        let len = match &source {
            Source::Alloc(len) | Source::Owned(_, _, len) | Source::Raw(_, len) => *len,
        };
        if len == 0 {
            return Err(TransportError::InvalidArgument("MR of zero length".into()));
        }
        let dev = pd.dev().clone();
        let mem = Memory::from_source(source)?;
        let (addr, len) = (mem.addr as u64, mem.len as u64);
        let keys = &dev.keys;
        let lkey = keys.register(addr, len, access, pd.id(), false);
        let rkey = keys.register(addr, len, access, pd.id(), true);
        match (lkey, rkey) {
            (Ok(lkey), Ok(rkey)) => Ok(SoftMr {
                dev,
                lkey,
                rkey,
                access,
                mem,
                _pd: pd.clone(),
            }),
            (l, r) => {
                for k in [&l, &r].into_iter().flatten() {
                    keys.deregister(*k);
                }
                Err(l
                    .err()
                    .or(r.err())
                    .unwrap_or(TransportError::Unsupported("key table")))
            }
        }
    }

    /// The registered byte range, as raw addresses.
    pub fn range(&self) -> Range<u64> {
        self.mem.addr as u64..(self.mem.addr + self.mem.len) as u64
    }
}

impl MrOps for SoftMr {
    fn addr(&self) -> u64 {
        self.mem.addr as u64
    }
    fn len(&self) -> usize {
        self.mem.len
    }
    fn lkey(&self) -> u32 {
        self.lkey
    }
    fn rkey(&self) -> u32 {
        self.rkey
    }
    fn access(&self) -> Access {
        self.access
    }
    fn as_ptr(&self) -> *mut u8 {
        self.mem.ptr()
    }
}

/// A type-2 memory window of a soft device: an rkey that a bind WR points at part of a region
/// and an invalidation (LOCAL_INV, a peer's SEND_WITH_INV) withdraws.
pub struct SoftMw {
    dev: Arc<DeviceInner>,
    /// The rkey of the latest bind built (`bind`), or the initial unbound key.
    rkey: u32,
    _pd: SoftPd,
}

impl SoftMw {
    pub(crate) fn new(pd: &SoftPd) -> Result<SoftMw> {
        let dev = pd.dev().clone();
        let rkey = dev.keys.reserve_window(pd.id())?;
        Ok(SoftMw {
            dev,
            rkey,
            _pd: pd.clone(),
        })
    }
}

impl MwOps<super::Soft> for SoftMw {
    fn handle(&self) -> u32 {
        self.rkey >> 8
    }
    fn rkey(&self) -> u32 {
        self.rkey
    }
    fn bind(&mut self, mr: &SoftMr, offset: usize, len: usize, access: Access) -> Result<SendOp> {
        let op = bind_op(self.handle(), self.rkey, mr, offset, len, access)?;
        if let SendOp::BindMw { rkey, .. } = op {
            self.rkey = rkey;
        }
        Ok(op)
    }
}

impl Drop for SoftMw {
    fn drop(&mut self) {
        self.dev.keys.release_window(self.rkey);
    }
}

impl Drop for SoftMr {
    fn drop(&mut self) {
        // Keys first (waits for in-flight copies), then the memory (field drop, after this).
        self.dev.keys.deregister(self.lkey);
        self.dev.keys.deregister(self.rkey);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_bounds_access_generation() {
        let t = KeyTable::new();
        let buf = [0u8; 64];
        let a = buf.as_ptr() as u64;
        let l = t.register(a, 64, Access::LOCAL_WRITE, 1, false).unwrap();
        let r = t.register(a, 64, Access::REMOTE_READ, 1, true).unwrap();
        assert_ne!(l, r);
        assert!(t.lookup(l, false, 1, a, 64, Access::LOCAL_WRITE).is_ok());
        assert_eq!(
            t.lookup(l, true, 1, a, 64, Access::empty()).err(),
            Some(KeyError::Unknown)
        );
        assert_eq!(
            t.lookup(l, false, 2, a, 64, Access::empty()).err(),
            Some(KeyError::WrongPd)
        );
        assert_eq!(
            t.lookup(l, false, 1, a + 1, 64, Access::empty()).err(),
            Some(KeyError::Bounds)
        );
        assert_eq!(
            t.lookup(r, true, 1, a, 8, Access::REMOTE_WRITE).err(),
            Some(KeyError::Access)
        );
        t.deregister(r);
        assert_eq!(
            t.lookup(r, true, 1, a, 8, Access::REMOTE_READ).err(),
            Some(KeyError::Unknown)
        );
        // The slot is reused with a new generation: the stale key still fails.
        let r2 = t.register(a, 64, Access::REMOTE_READ, 1, true).unwrap();
        assert_eq!(r2 >> 8, r >> 8);
        assert_ne!(r2, r);
        assert!(t.lookup(r, true, 1, a, 8, Access::REMOTE_READ).is_err());
        // A plain region's rkey cannot be invalidated (hardware refuses it too).
        assert!(!t.invalidate_rkey(r2, 1));
        assert!(t.lookup(r2, true, 1, a, 8, Access::REMOTE_READ).is_ok());
        t.deregister(l);
        t.deregister(r2);
    }

    #[test]
    fn window_bind_invalidate_rebind_and_region_gone() {
        let t = KeyTable::new();
        let buf = [0u8; 64];
        let a = buf.as_ptr() as u64;
        let bindable = Access::LOCAL_WRITE | Access::MW_BIND;
        let l = t.register(a, 64, bindable, 1, false).unwrap();
        let w = t.reserve_window(1).unwrap();
        let need = Access::REMOTE_READ;
        // Unbound: answers nothing.
        assert!(t.lookup(w, true, 1, a, 8, need).is_err());
        let k1 = (w & !0xff) | ((w + 1) & 0xff);
        // The window must lie inside the region; another PD's window cannot be bound.
        assert_eq!(
            t.bind_window(1, k1, l, a + 32, 64, need),
            Err(WindowError::BadRegion)
        );
        assert_eq!(
            t.bind_window(2, k1, l, a, 8, need),
            Err(WindowError::BadWindow)
        );
        t.bind_window(1, k1, l, a + 16, 16, need).unwrap();
        assert!(t.lookup(k1, true, 1, a + 16, 16, need).is_ok());
        assert_eq!(
            t.lookup(k1, true, 1, a, 8, need).err(),
            Some(KeyError::Bounds)
        );
        assert_eq!(
            t.lookup(k1, true, 1, a + 16, 8, Access::REMOTE_WRITE).err(),
            Some(KeyError::Access)
        );
        // A bound type-2 window is not bound again before it is invalidated.
        assert_eq!(
            t.bind_window(1, k1, l, a, 8, need),
            Err(WindowError::BadWindow)
        );
        assert!(t.invalidate_rkey(k1, 1));
        assert!(t.lookup(k1, true, 1, a + 16, 8, need).is_err());
        let k2 = (k1 & !0xff) | ((k1 + 1) & 0xff);
        t.bind_window(1, k2, l, a, 8, need).unwrap();
        assert!(
            t.lookup(k1, true, 1, a, 8, need).is_err(),
            "old rkey still works"
        );
        assert!(t.lookup(k2, true, 1, a, 8, need).is_ok());
        // The region goes away: the window over it stops working.
        t.deregister(l);
        assert!(t.lookup(k2, true, 1, a, 8, need).is_err());
        t.release_window(k2);
    }
}
