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
//! (SRQ, beyond the posting limit) QueuedForPost <--flush--> Spare
//! ```
//!
//! With an SRQ the group keeps only as many slots posted as its qpairs' peers may fill
//! (`flush`'s limit: the sum of their queue depths and a margin), not every slot: the SRQ
//! hands out receives in the order they were posted, so each posted slot comes round again
//! only after all the others, and with thousands posted every capsule landed in a buffer long
//! out of cache (a cache miss in the store of each capsule, and in the next locked instruction
//! after it). The rest wait as Spare, the most recently freed on top, and go back when the
//! limit grows.
//!
//! A slot is posted only from QueuedForPost (never twice), a completion is accepted only for a
//! Posted slot (anything else is counted as an error and the slot is left alone), and only a
//! Held slot can be released. Capsules waiting for a request object stay Held and are linked
//! in their qpair's FIFO through `links`. A request may keep its slot Held for as long as it
//! lives (in-capsule data lent to block I/O in place: `bytes_mut`).

use arrayvec::ArrayVec;

use crate::device::{Mr, Pd, Srq};
use crate::error::{PostError, Result};
use crate::types::{Access, RecvWr, Sge};

use super::fifo::Link;
use super::wrid;

/// Most receives posted per `post_recv` call.
const POST_CHUNK: usize = 32;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotState {
    /// In the per-qpair pool, assigned to no qpair.
    Free,
    QueuedForPost,
    Posted,
    /// Completed: a capsule the layer above (or a waiting qpair) holds.
    Held,
    /// SRQ mode: free, kept off the SRQ while the posting limit is reached.
    Spare,
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
    free: Vec<u32>,
    /// SRQ mode: Spare slots, the most recently freed last (capacity = count: never grows).
    spare: Vec<u32>,
    /// SRQ mode: the sum of the queue depths of the group's qpairs' peers (commands, or
    /// responses, they may have outstanding, each a receive it may consume).
    peer_depth: u32,
    /// SRQ mode: posted beyond `peer_depth`: the receives a pass may consume before its end
    /// posts the freed slots again (two passes' worth, for `RecvRepost::NextPass`).
    margin: u32,
}

pub(crate) const NO_OWNER: u32 = u32::MAX;

impl RecvSlots {
    /// `per_qpair`: slots start Free and are assigned to qpairs; else all go to the SRQ.
    /// `margin`: see the field.
    pub(crate) fn new(
        pd: &Pd,
        count: u32,
        slot_size: u32,
        per_qpair: bool,
        margin: u32,
    ) -> Result<RecvSlots> {
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
            free,
            spare: Vec::with_capacity(if per_qpair { 0 } else { count as usize }),
            peer_depth: 0,
            margin,
        })
    }

    /// SRQ mode: a qpair whose peer may have `depth` messages outstanding joined (`flush`
    /// posts for it: before its peer can send).
    pub(crate) fn add_peer_depth(&mut self, depth: u32) {
        self.peer_depth = self.peer_depth.saturating_add(depth);
    }

    /// ... and left.
    pub(crate) fn remove_peer_depth(&mut self, depth: u32) {
        self.peer_depth = self.peer_depth.saturating_sub(depth);
    }

    /// SRQ mode: the most slots kept posted.
    pub(crate) fn post_limit(&self) -> u32 {
        self.peer_depth
            .saturating_add(self.margin)
            .min(self.count())
    }

    /// SRQ mode: slots kept off the SRQ by the posting limit.
    pub(crate) fn spare_count(&self) -> u32 {
        self.spare.len() as u32
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

    /// Gives qpair `owner` `n` slots from the free pool, queued for posting to its QP.
    pub(crate) fn assign(&mut self, owner: u32, n: u32) -> bool {
        let Some(owners) = self.owner.as_mut() else {
            return false;
        };
        if self.free.len() < n as usize {
            return false;
        }
        // Control path: the per-qpair counts grow with the slab indexes seen.
        if self.posted_by.len() <= owner as usize {
            self.posted_by.resize(owner as usize + 1, 0);
        }
        for _ in 0..n {
            let slot = self.free.pop().expect("checked");
            owners[slot as usize] = owner;
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
        for slot in 0..owners.len() {
            if owners[slot] != owner {
                continue;
            }
            owners[slot] = NO_OWNER;
            match self.state[slot] {
                SlotState::Posted | SlotState::QueuedForPost => {
                    if self.state[slot] == SlotState::Posted {
                        self.posted -= 1;
                    }
                    self.state[slot] = SlotState::Free;
                    self.free.push(slot as u32);
                }
                // Spare exists only in SRQ mode, which has no owners.
                SlotState::Held | SlotState::Free | SlotState::Spare => {}
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

    pub(crate) fn queued(&self) -> u32 {
        self.repost.len() as u32
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
        }
        self.len[slot as usize] = byte_len.min(self.slot_size);
        true
    }

    /// Start loading the first line of what arrived in `slot` (see `shared_mem::prefetch`).
    #[inline(always)]
    pub(crate) fn prefetch(&self, slot: u32) {
        let start = slot as usize * self.slot_size as usize;
        if start < self.mr.len() {
            crate::shared_mem::prefetch(self.mr.as_ptr().wrapping_add(start));
        }
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
        self.repost.push(slot);
        true
    }

    /// Per-qpair mode: posts queued slots to their qpairs' QPs, as lists per qpair. Slots
    /// whose post fails stay queued. Returns how many post calls it made.
    pub(crate) fn flush_per_qpair(
        &mut self,
        mut post: impl FnMut(u32, &[RecvWr<'_>]) -> Result<(), PostError>,
    ) -> u32 {
        let Some(owners) = self.owner.as_ref() else {
            return 0;
        };
        self.repost.sort_unstable_by_key(|&s| owners[s as usize]);
        let mut calls = 0;
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

    /// Posts queued slots to `srq` as lists, keeping at most `post_limit` posted: queued
    /// slots beyond it become Spare (the longest queued first), and below it Spare slots are
    /// queued again (the most recently freed first). Returns how many post calls it made.
    pub(crate) fn flush(&mut self, srq: &Srq) -> Result<u32, PostError> {
        self.fit_to(self.post_limit());
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

    /// Makes posted + queued come as near `limit` as the slots allow (see `flush`).
    fn fit_to(&mut self, limit: u32) {
        let room = limit.saturating_sub(self.posted) as usize;
        if self.repost.len() > room {
            // The front of the queue was freed first: its lines are the coldest.
            let excess = self.repost.len() - room;
            for &slot in &self.repost[..excess] {
                self.state[slot as usize] = SlotState::Spare;
            }
            // Pushed oldest first, so the most recently freed stays on top.
            self.spare.extend_from_slice(&self.repost[..excess]);
            self.repost.drain(..excess);
        } else {
            let take = (room - self.repost.len()).min(self.spare.len());
            if take == 0 {
                return;
            }
            // Queued below the slots already queued: `flush` posts from the end, and what
            // the pass freed is the warmest.
            let from = self.spare.len() - take;
            for &slot in &self.spare[from..] {
                self.state[slot as usize] = SlotState::QueuedForPost;
            }
            self.repost.splice(0..0, self.spare.drain(from..));
        }
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
