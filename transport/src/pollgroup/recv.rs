//! Receive slots: one registered region cut into slots of (64-byte capsule + in-capsule data),
//! owned by the poll group, never by a qpair. Each slot carries its own state:
//!
//! ```text
//! QueuedForPost --flush--> Posted --completion--> Held --release--> QueuedForPost
//! ```
//!
//! A slot is posted only from QueuedForPost (never twice), a completion is accepted only for a
//! Posted slot (anything else is counted as an error and the slot is left alone), and only a
//! Held slot can be released. Capsules waiting for a request object stay Held and are linked
//! in their qpair's FIFO through `links`.

use crate::device::{Mr, Pd, Srq};
use crate::error::{PostError, Result};
use crate::types::{Access, RecvWr, Sge};

use super::fifo::Link;
use super::wrid;

/// Most receives posted per `post_recv` call.
const POST_CHUNK: usize = 32;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotState {
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
}

impl RecvSlots {
    pub(crate) fn new(pd: &Pd, count: u32, slot_size: u32) -> Result<RecvSlots> {
        let mr = pd.alloc_mr(count as usize * slot_size as usize, Access::LOCAL_WRITE)?;
        Ok(RecvSlots {
            mr,
            slot_size,
            state: vec![SlotState::QueuedForPost; count as usize].into_boxed_slice(),
            len: vec![0; count as usize].into_boxed_slice(),
            links: vec![Link::default(); count as usize].into_boxed_slice(),
            repost: (0..count).collect(),
            posted: 0,
        })
    }

    pub(crate) fn count(&self) -> u32 {
        self.state.len() as u32
    }

    pub(crate) fn posted(&self) -> u32 {
        self.posted
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

    /// A receive completed into `slot`: Posted -> Held. False (and nothing changed) for a slot
    /// that does not exist or was not posted.
    pub(crate) fn completed(&mut self, slot: u32, byte_len: u32) -> bool {
        if self.state(slot) != Some(SlotState::Posted) {
            return false;
        }
        self.state[slot as usize] = SlotState::Held;
        self.posted -= 1;
        self.len[slot as usize] = byte_len.min(self.slot_size);
        true
    }

    /// What arrived in `slot`.
    pub(crate) fn bytes(&self, slot: u32) -> &[u8] {
        let start = slot as usize * self.slot_size as usize;
        &self.mr.as_slice()[start..start + self.len[slot as usize] as usize]
    }

    /// Held -> QueuedForPost (posted at the end of the poll). False for a slot not Held.
    pub(crate) fn release(&mut self, slot: u32) -> bool {
        if self.state(slot) != Some(SlotState::Held) {
            return false;
        }
        self.state[slot as usize] = SlotState::QueuedForPost;
        self.repost.push(slot);
        true
    }

    /// Posts every queued slot to `srq` as lists. Returns how many post calls it made.
    pub(crate) fn flush(&mut self, srq: &Srq) -> Result<u32, PostError> {
        let mut calls = 0;
        while !self.repost.is_empty() {
            let n = self.repost.len().min(POST_CHUNK);
            let start = self.repost.len() - n;
            let mut sges = [Sge::default(); POST_CHUNK];
            for (sge, &slot) in sges.iter_mut().zip(&self.repost[start..]) {
                *sge = self.sge(slot);
            }
            let slots = &self.repost[start..];
            let wrs: [RecvWr<'_>; POST_CHUNK] = std::array::from_fn(|i| RecvWr {
                wr_id: wrid::recv(slots.get(i).copied().unwrap_or(0)),
                sges: std::slice::from_ref(&sges[i]),
            });
            let result = srq.post_recv(&wrs[..n]);
            calls += 1;
            let done = match &result {
                Ok(()) => n,
                Err(e) => e.failed_index,
            };
            // Posted from the front of the chunk: keep the failed tail queued.
            for &slot in &self.repost[start..start + done] {
                self.state[slot as usize] = SlotState::Posted;
            }
            self.repost.drain(start..start + done);
            self.posted += done as u32;
            result?;
        }
        Ok(calls)
    }
}
