//! Receive slots: one registered region cut into slots of (64-byte capsule + in-capsule data),
//! owned by the poll group. With an SRQ every slot is posted there; with per-qpair receive
//! queues (`RecvMode::PerQpair`, the host side) a qpair is assigned its slots when it joins and
//! they are re-posted to its own QP, going back to the free pool when it leaves. Each slot
//! carries its own state:
//!
//! ```text
//! (per-qpair pool) Free --assign--> QueuedForPost
//! QueuedForPost --flush--> Posted --completion--> Held --release--> QueuedForPost
//! (owner gone) Posted / QueuedForPost / Held-then-released --> Free
//! ```
//!
//! A slot is posted only from QueuedForPost (never twice), a completion is accepted only for a
//! Posted slot (anything else is counted as an error and the slot is left alone), and only a
//! Held slot can be released. Capsules waiting for a request object stay Held and are linked
//! in their qpair's FIFO through `links`. A request may keep its slot Held for as long as it
//! lives (in-capsule data lent to block I/O in place: `bytes_mut`).
//!
//! Per-qpair mode re-posts lazily: a qpair needs only `keep` receives posted (its depth: a
//! host has no more responses coming than commands out), so while it has that many a released
//! slot waits, QueuedForPost, in the qpair's `waiting` list, and the list is posted, whole, at
//! the end of the poll in which a completion left fewer posted than that. A queue of depth 2
//! with 32 slots then makes one post call per 31 responses instead of one per response; a
//! qpair with fewer than `LAZY_MIN_SLACK` slots beyond its depth re-posts each slot at the end
//! of the poll, as before (its slots' releases and completions skip the bookkeeping).

use arrayvec::ArrayVec;

use crate::device::{Mr, Pd, Srq};
use crate::error::{PostError, Result};
use crate::types::{Access, RecvWr, Sge};

use super::fifo::Link;
use super::wrid;

/// Most receives posted per `post_recv` call.
const POST_CHUNK: usize = 32;

/// Fewest spare slots (beyond its depth) that make a qpair re-post lazily (see the module
/// documentation): a qpair with fewer re-posts each slot at the end of its poll.
const LAZY_MIN_SLACK: u32 = 8;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotState {
    /// In the per-qpair pool, assigned to no qpair.
    Free,
    QueuedForPost,
    Posted,
    /// Completed: a capsule the layer above (or a waiting qpair) holds.
    Held,
}

pub(crate) struct RecvSlots {
    mr: Mr,
    slot_size: u32,
    state: Box<[SlotState]>,
    /// Bytes received into each slot by its last completion.
    len: Box<[u32]>,
    /// Links of Held slots waiting for a request object (per-qpair FIFOs).
    pub(crate) links: Box<[Link]>,
    /// Slots to post at the end of this poll (capacity = count: never grows).
    repost: Vec<u32>,
    posted: u32,
    /// Per-qpair mode: each slot's qpair (slab index), NO_OWNER when free or orphaned.
    owner: Option<Box<[u32]>>,
    /// Per-qpair mode: slots Posted to each qpair's QP (by slab index): a draining qpair
    /// whose count is zero has no receive the device could still write.
    posted_by: Vec<u32>,
    /// Per-qpair mode, by slab index: the lazy re-posting (see the module documentation).
    lazy: Vec<Lazy>,
    /// Qpairs whose `waiting` list is posted at the end of this poll (capacity: one entry
    /// per qpair, reserved when it joins).
    due: Vec<u32>,
    /// Slots in all `waiting` lists.
    waiting_total: u32,
    /// Per-qpair mode, by slot: its qpair re-posts lazily (else a release or a completion of
    /// it skips the bookkeeping: one load and a branch).
    lazy_slot: Box<[bool]>,
    free: Vec<u32>,
}

pub(crate) const NO_OWNER: u32 = u32::MAX;

/// One qpair's lazy re-posting (per-qpair mode).
#[derive(Default)]
struct Lazy {
    /// Receives it needs posted.
    keep: u32,
    /// Its `waiting` list is in `due`.
    due: bool,
    /// Released slots, QueuedForPost (capacity: its slot count, reserved when it joins).
    waiting: Vec<u32>,
}

impl RecvSlots {
    /// `per_qpair`: slots start Free and are assigned to qpairs; else all go to the SRQ.
    pub(crate) fn new(pd: &Pd, count: u32, slot_size: u32, per_qpair: bool) -> Result<RecvSlots> {
        let mr = pd.alloc_mr(count as usize * slot_size as usize, Access::LOCAL_WRITE)?;
        let (state, repost, free, owner) = if per_qpair {
            (
                SlotState::Free,
                Vec::with_capacity(count as usize),
                (0..count).rev().collect(),
                Some(vec![NO_OWNER; count as usize].into_boxed_slice()),
            )
        } else {
            (
                SlotState::QueuedForPost,
                (0..count).collect(),
                Vec::new(),
                None,
            )
        };
        Ok(RecvSlots {
            mr,
            slot_size,
            state: vec![state; count as usize].into_boxed_slice(),
            len: vec![0; count as usize].into_boxed_slice(),
            links: vec![Link::default(); count as usize].into_boxed_slice(),
            repost,
            posted: 0,
            owner,
            posted_by: Vec::new(),
            lazy: Vec::new(),
            due: Vec::new(),
            waiting_total: 0,
            lazy_slot: vec![false; if per_qpair { count as usize } else { 0 }].into_boxed_slice(),
            free,
        })
    }

    /// Slots in the per-qpair free pool.
    pub(crate) fn free_count(&self) -> u32 {
        self.free.len() as u32
    }

    /// The qpair (slab index) a slot belongs to, per-qpair mode.
    pub(crate) fn owner(&self, slot: u32) -> Option<u32> {
        self.owner
            .as_ref()?
            .get(slot as usize)
            .copied()
            .filter(|&o| o != NO_OWNER)
    }

    /// Gives qpair `owner` `n` slots from the free pool, queued for posting to its QP; later
    /// re-posts wait while `keep` of them are posted (see the module documentation).
    pub(crate) fn assign(&mut self, owner: u32, n: u32, keep: u32) -> bool {
        let Some(owners) = self.owner.as_mut() else {
            return false;
        };
        if self.free.len() < n as usize {
            return false;
        }
        // Control path: the per-qpair counts grow with the slab indexes seen.
        if self.posted_by.len() <= owner as usize {
            self.posted_by.resize(owner as usize + 1, 0);
            self.lazy.resize_with(owner as usize + 1, Lazy::default);
            self.due
                .reserve(self.lazy.len().saturating_sub(self.due.len()));
        }
        let lazy = &mut self.lazy[owner as usize];
        // At least one: a qpair always has a receive for its next response. Lazy only when a
        // list would gather a few slots at least; else each goes at the end of its poll.
        let keep = keep.max(1);
        let on = n.saturating_sub(keep) >= LAZY_MIN_SLACK;
        lazy.keep = if on { keep } else { n.max(1) };
        lazy.waiting.clear();
        lazy.waiting.reserve(n as usize);
        for _ in 0..n {
            let slot = self.free.pop().expect("checked");
            owners[slot as usize] = owner;
            self.lazy_slot[slot as usize] = on;
            self.state[slot as usize] = SlotState::QueuedForPost;
            self.repost.push(slot);
        }
        true
    }

    /// Qpair `owner` is gone (its QP destroyed: the device writes none of its receives any
    /// more): its slots go back to the pool; held ones when released.
    pub(crate) fn unassign(&mut self, owner: u32) {
        let Some(owners) = self.owner.as_mut() else {
            return;
        };
        self.repost.retain(|&s| owners[s as usize] != owner);
        if let Some(count) = self.posted_by.get_mut(owner as usize) {
            *count = 0;
        }
        if let Some(lazy) = self.lazy.get_mut(owner as usize) {
            // QueuedForPost: freed by the walk below.
            self.waiting_total -= lazy.waiting.len() as u32;
            lazy.waiting.clear();
            if lazy.due {
                lazy.due = false;
                self.due.retain(|&o| o != owner);
            }
        }
        for slot in 0..owners.len() {
            if owners[slot] != owner {
                continue;
            }
            owners[slot] = NO_OWNER;
            self.lazy_slot[slot] = false;
            match self.state[slot] {
                SlotState::Posted | SlotState::QueuedForPost => {
                    if self.state[slot] == SlotState::Posted {
                        self.posted -= 1;
                    }
                    self.state[slot] = SlotState::Free;
                    self.free.push(slot as u32);
                }
                SlotState::Held | SlotState::Free => {}
            }
        }
    }

    pub(crate) fn count(&self) -> u32 {
        self.state.len() as u32
    }

    pub(crate) fn posted(&self) -> u32 {
        self.posted
    }

    /// Per-qpair mode: how many of qpair `owner`'s slots are posted to its QP (None with an
    /// SRQ, where slots belong to no qpair).
    pub(crate) fn posted_by(&self, owner: u32) -> Option<u32> {
        self.owner.as_ref()?;
        Some(self.posted_by.get(owner as usize).copied().unwrap_or(0))
    }

    /// Slots to post at the end of this poll.
    pub(crate) fn queued(&self) -> u32 {
        let due: usize = self
            .due
            .iter()
            .map(|&o| self.lazy[o as usize].waiting.len())
            .sum();
        (self.repost.len() + due) as u32
    }

    /// Slots QueuedForPost: to post at the end of this poll, or waiting in a qpair's
    /// `waiting` list while it has enough posted.
    pub(crate) fn queued_or_deferred(&self) -> u32 {
        self.repost.len() as u32 + self.waiting_total
    }

    pub(crate) fn state(&self, slot: u32) -> Option<SlotState> {
        self.state.get(slot as usize).copied()
    }

    fn sge(&self, slot: u32) -> Sge {
        self.mr
            .sge(slot as usize * self.slot_size as usize, self.slot_size)
    }

    /// Appends the SGEs of `slots` to `out` (in place: see [`recv_wrs_into`]).
    #[inline]
    fn sges_into(&self, slots: &[u32], out: &mut ArrayVec<Sge, POST_CHUNK>) {
        for &slot in slots {
            out.push(self.sge(slot));
        }
    }

    /// A receive completed into `slot`: Posted -> Held. False (and nothing changed) for a slot
    /// that does not exist or was not posted.
    #[inline]
    pub(crate) fn completed(&mut self, slot: u32, byte_len: u32) -> bool {
        if self.state(slot) != Some(SlotState::Posted) {
            return false;
        }
        self.state[slot as usize] = SlotState::Held;
        self.posted -= 1;
        if let Some(owner) = self.owner(slot) {
            if let Some(count) = self.posted_by.get_mut(owner as usize) {
                *count = count.saturating_sub(1);
            }
            if self.lazy_slot.get(slot as usize) == Some(&true) {
                self.check_keep(owner);
            }
        }
        self.len[slot as usize] = byte_len.min(self.slot_size);
        true
    }

    /// What arrived in `slot`.
    pub(crate) fn bytes(&self, slot: u32) -> &[u8] {
        let start = slot as usize * self.slot_size as usize;
        // SAFETY: a completed slot is not on the SRQ until `flush` reposts it, and `flush`
        // needs `&mut self`, which this borrow excludes: no device write while it lives.
        unsafe {
            self.mr
                .view(start..start + self.len[slot as usize] as usize)
        }
    }

    /// What arrived in `slot`, writable: the layer above lends in-capsule data to block I/O
    /// in place. Empty for a slot that is not Held.
    pub(crate) fn bytes_mut(&mut self, slot: u32) -> &mut [u8] {
        if self.state(slot) != Some(SlotState::Held) {
            return &mut [];
        }
        let start = slot as usize * self.slot_size as usize;
        // SAFETY: a Held slot is on no receive queue (posted only from QueuedForPost, after
        // `release`), so the device writes nothing into it; `&mut self` excludes every other
        // view of the region for this borrow, and slots do not overlap.
        unsafe {
            self.mr
                .view_mut(start..start + self.len[slot as usize] as usize)
        }
    }

    /// Held -> QueuedForPost (posted at the end of the poll). False for a slot not Held.
    #[inline]
    pub(crate) fn release(&mut self, slot: u32) -> bool {
        if self.state(slot) != Some(SlotState::Held) {
            return false;
        }
        if self.owner.is_some() && self.owner(slot).is_none() {
            // Its qpair is gone: back to the pool.
            self.state[slot as usize] = SlotState::Free;
            self.free.push(slot);
            return true;
        }
        self.state[slot as usize] = SlotState::QueuedForPost;
        if self.lazy_slot.get(slot as usize) == Some(&true) && self.wait(slot) {
            return true;
        }
        self.repost.push(slot);
        true
    }

    /// A lazy qpair's completion: below what it needs posted, its waiting slots go at the end
    /// of this poll. Out of line, as `wait`.
    #[inline(never)]
    fn check_keep(&mut self, owner: u32) {
        let posted = self.posted_by.get(owner as usize).copied().unwrap_or(0);
        if let Some(lazy) = self.lazy.get_mut(owner as usize) {
            if posted < lazy.keep && !lazy.due && !lazy.waiting.is_empty() {
                lazy.due = true;
                self.due.push(owner);
            }
        }
    }

    /// A released slot of a lazy qpair waits in its list if the qpair has enough posted for
    /// every response it can get, or its list goes at the end of this poll anyway (see the
    /// module documentation). Out of line: the other qpairs' releases stay as short as before.
    #[inline(never)]
    fn wait(&mut self, slot: u32) -> bool {
        let Some(owner) = self.owner(slot).map(|o| o as usize) else {
            return false;
        };
        let posted = self.posted_by.get(owner).copied().unwrap_or(0);
        match self.lazy.get_mut(owner) {
            Some(lazy) if lazy.due || posted >= lazy.keep => {
                lazy.waiting.push(slot);
                self.waiting_total += 1;
                true
            }
            _ => false,
        }
    }

    /// Per-qpair mode: posts queued slots to their qpairs' QPs, as lists per qpair. Slots
    /// whose post fails stay queued. Returns how many post calls it made.
    pub(crate) fn flush_per_qpair(
        &mut self,
        mut post: impl FnMut(u32, &[RecvWr<'_>]) -> Result<(), PostError>,
    ) -> u32 {
        if self.owner.is_none() {
            return 0;
        }
        let mut calls = 0;
        // The waiting lists due: each as lists of its own.
        let mut next = 0;
        while next < self.due.len() {
            let owner = self.due[next];
            next += 1;
            calls += self.flush_waiting(owner, &mut post);
        }
        // Those refused (a draining qpair) stay due and are tried again at the next poll.
        let lazy = &self.lazy;
        self.due.retain(|&o| lazy[o as usize].due);
        let Some(owners) = self.owner.as_ref() else {
            return calls;
        };
        self.repost.sort_unstable_by_key(|&s| owners[s as usize]);
        let mut keep = 0usize;
        let mut at = 0usize;
        while at < self.repost.len() {
            let owner = owners[self.repost[at] as usize];
            let mut end = at + 1;
            while end < self.repost.len()
                && end - at < POST_CHUNK
                && owners[self.repost[end] as usize] == owner
            {
                end += 1;
            }
            // Only the entries used are written (a chunk is usually one or two slots).
            let slots = &self.repost[at..end];
            let mut sges = ArrayVec::<Sge, POST_CHUNK>::new();
            self.sges_into(slots, &mut sges);
            let mut wrs = ArrayVec::new();
            recv_wrs_into(slots, &sges, &mut wrs);
            calls += 1;
            let done = match post(owner, &wrs) {
                Ok(()) => end - at,
                Err(e) => e.failed_index,
            };
            for i in at..at + done {
                self.state[self.repost[i] as usize] = SlotState::Posted;
            }
            self.posted += done as u32;
            if let Some(count) = self.posted_by.get_mut(owner as usize) {
                *count += done as u32;
            }
            // Keep the refused tail queued (compacted to the front).
            for i in at + done..end {
                self.repost[keep] = self.repost[i];
                keep += 1;
            }
            at = end;
        }
        self.repost.truncate(keep);
        calls
    }

    /// Posts qpair `owner`'s waiting list as lists; what is refused stays waiting (and due).
    /// Returns how many post calls it made.
    fn flush_waiting(
        &mut self,
        owner: u32,
        post: &mut impl FnMut(u32, &[RecvWr<'_>]) -> Result<(), PostError>,
    ) -> u32 {
        let mut calls = 0;
        loop {
            let waiting = &self.lazy[owner as usize].waiting;
            if waiting.is_empty() {
                self.lazy[owner as usize].due = false;
                return calls;
            }
            // Posted from the tail (the list's order does not matter).
            let n = waiting.len().min(POST_CHUNK);
            let start = waiting.len() - n;
            let slots: ArrayVec<u32, POST_CHUNK> = waiting[start..].iter().copied().collect();
            let mut sges = ArrayVec::<Sge, POST_CHUNK>::new();
            self.sges_into(&slots, &mut sges);
            let mut wrs = ArrayVec::new();
            recv_wrs_into(&slots, &sges, &mut wrs);
            calls += 1;
            let done = match post(owner, &wrs) {
                Ok(()) => n,
                Err(e) => e.failed_index.min(n),
            };
            for &slot in &slots[..done] {
                self.state[slot as usize] = SlotState::Posted;
            }
            self.posted += done as u32;
            if let Some(count) = self.posted_by.get_mut(owner as usize) {
                *count += done as u32;
            }
            self.waiting_total -= done as u32;
            let waiting = &mut self.lazy[owner as usize].waiting;
            // The refused tail of the chunk stays (at the list's end: tried first next time).
            waiting.drain(start..start + done);
            if done < n {
                return calls;
            }
        }
    }

    /// Posts every queued slot to `srq` as lists. Returns how many post calls it made.
    pub(crate) fn flush(&mut self, srq: &Srq) -> Result<u32, PostError> {
        let mut calls = 0;
        while !self.repost.is_empty() {
            let n = self.repost.len().min(POST_CHUNK);
            let start = self.repost.len() - n;
            // Only the entries used are written (a chunk is usually one or two slots).
            let slots = &self.repost[start..];
            let mut sges = ArrayVec::<Sge, POST_CHUNK>::new();
            self.sges_into(slots, &mut sges);
            let mut wrs = ArrayVec::new();
            recv_wrs_into(slots, &sges, &mut wrs);
            let result = srq.post_recv(&wrs);
            calls += 1;
            let done = match &result {
                Ok(()) => n,
                Err(e) => e.failed_index,
            };
            // Posted from the front of the chunk: keep the failed tail queued.
            for &slot in &self.repost[start..start + done] {
                self.state[slot as usize] = SlotState::Posted;
            }
            if done == n {
                // The whole chunk (the tail of the list) went: no tail to move down.
                self.repost.truncate(start);
            } else {
                self.repost.drain(start..start + done);
            }
            self.posted += done as u32;
            result?;
        }
        Ok(calls)
    }
}

/// Appends the receive work requests of `slots` to `out`, one SGE each (`sges[i]` is slot
/// `i`'s). Filled in place: returned by value, the list (and the SGEs' list, collected) was
/// copied whole by `memcpy`, two per re-post (about 180 instructions per I/O at QD 1).
fn recv_wrs_into<'a>(slots: &[u32], sges: &'a [Sge], out: &mut ArrayVec<RecvWr<'a>, POST_CHUNK>) {
    for (&slot, sge) in slots.iter().zip(sges) {
        out.push(RecvWr {
            wr_id: wrid::recv(slot),
            sges: std::slice::from_ref(sge),
        });
    }
}

#[cfg(all(test, feature = "soft"))]
mod tests {
    use super::*;
    use crate::device::{Context, DeviceSpec};
    use crate::types::{SoftConfig, SoftFabric};

    /// Per-qpair slots over a soft in-process device's protection domain.
    fn slots(name: &str, count: u32) -> (Context, Pd, RecvSlots) {
        let ctx = Context::open(&DeviceSpec::Soft(SoftConfig {
            name: format!("recv-unit-{name}-{}", std::process::id()),
            fabric: SoftFabric::InProcess,
            ..SoftConfig::default()
        }))
        .unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let slots = RecvSlots::new(&pd, count, 64, true).unwrap();
        (ctx, pd, slots)
    }

    /// Posts what is queued, accepting every list; returns (post calls, receives posted).
    fn flush(slots: &mut RecvSlots) -> (u32, usize) {
        let mut wrs = 0;
        let calls = slots.flush_per_qpair(|_, list| {
            wrs += list.len();
            Ok(())
        });
        (calls, wrs)
    }

    /// Completes and releases one posted slot of `owner`.
    fn respond(slots: &mut RecvSlots, owner: u32) -> u32 {
        let slot = (0..slots.count())
            .find(|&s| slots.owner(s) == Some(owner) && slots.state(s) == Some(SlotState::Posted))
            .unwrap();
        assert!(slots.completed(slot, 16));
        assert!(slots.release(slot));
        slot
    }

    #[test]
    fn a_shallow_qpair_reposts_its_slots_in_one_list_once_below_its_depth() {
        let (_ctx, _pd, mut s) = slots("lazy", 16);
        assert!(s.assign(0, 10, 1), "depth 1, 10 slots");
        assert_eq!(flush(&mut s), (1, 10));
        assert_eq!(s.posted_by(0), Some(10));
        for left in (1..10).rev() {
            let slot = respond(&mut s, 0);
            // Still `left` posted for a qpair that can get one response: the slot waits.
            assert_eq!(s.state(slot), Some(SlotState::QueuedForPost));
            assert_eq!(s.posted_by(0), Some(left));
            assert_eq!(s.queued(), 0, "nothing to post at the end of this poll");
            assert_eq!(s.queued_or_deferred(), 10 - left);
            assert_eq!(flush(&mut s), (0, 0));
        }
        // The last posted one completes: all ten go back in one list.
        respond(&mut s, 0);
        assert_eq!(s.queued(), 10);
        assert_eq!(flush(&mut s), (1, 10));
        assert_eq!(s.posted_by(0), Some(10));
        assert_eq!(s.queued_or_deferred(), 0);
    }

    #[test]
    fn a_qpair_with_few_spare_slots_reposts_each_at_once_and_a_leaving_one_frees_waiting_slots() {
        let (_ctx, _pd, mut s) = slots("eager", 24);
        assert!(s.assign(0, 8, 1), "7 spare slots: not lazy");
        assert!(s.assign(1, 10, 2), "8 spare slots: lazy");
        assert_eq!(flush(&mut s), (2, 18));
        respond(&mut s, 0);
        assert_eq!(s.queued(), 1, "re-posted at the end of the poll");
        assert_eq!(flush(&mut s), (1, 1));
        respond(&mut s, 1);
        respond(&mut s, 1);
        assert_eq!((s.queued(), s.queued_or_deferred()), (0, 2));
        // Qpair 1 goes: its posted and waiting slots return to the pool.
        s.unassign(1);
        assert_eq!(s.queued_or_deferred(), 0);
        assert_eq!(s.free_count(), 16);
        assert_eq!(s.posted(), 8);
        // Its slab index comes back for a new qpair: fresh slots, nothing stale waiting.
        assert!(s.assign(1, 10, 1));
        assert_eq!(flush(&mut s), (1, 10));
        assert_eq!(s.posted_by(1), Some(10));
        respond(&mut s, 1);
        assert_eq!((s.queued(), s.queued_or_deferred()), (0, 1));
    }
}
