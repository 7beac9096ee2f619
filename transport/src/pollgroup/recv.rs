//! Receive slots: one registered region cut into slots of (64-byte capsule + in-capsule data),
//! owned by the poll group, never by a qpair. A slot is either posted on the SRQ, held by a
//! capsule the layer above is working on, or queued for re-posting at the end of the poll.

use crate::device::{Mr, Pd, Srq};
use crate::error::{PostError, Result};
use crate::types::{Access, RecvWr, Sge};

use super::wrid::{self, WrKind};

/// Most receives posted per `post_recv` call.
const POST_CHUNK: usize = 32;

pub(crate) struct RecvSlots {
    mr: Mr,
    slot_size: u32,
    count: u32,
    /// Bytes received into each slot by its last completion.
    len: Box<[u32]>,
    /// Slots to post at the end of this poll (capacity = count: never grows).
    repost: Vec<u32>,
    /// Slots on the SRQ right now.
    posted: u32,
}

impl RecvSlots {
    pub(crate) fn new(pd: &Pd, count: u32, slot_size: u32) -> Result<RecvSlots> {
        let mr = pd.alloc_mr(count as usize * slot_size as usize, Access::LOCAL_WRITE)?;
        Ok(RecvSlots {
            mr,
            slot_size,
            count,
            len: vec![0; count as usize].into_boxed_slice(),
            repost: (0..count).collect(),
            posted: 0,
        })
    }

    pub(crate) fn count(&self) -> u32 {
        self.count
    }

    pub(crate) fn posted(&self) -> u32 {
        self.posted
    }

    pub(crate) fn queued(&self) -> u32 {
        self.repost.len() as u32
    }

    fn sge(&self, slot: u32) -> Sge {
        self.mr
            .sge(slot as usize * self.slot_size as usize, self.slot_size)
    }

    /// A receive completed into `slot`: it is no longer on the SRQ. False for a slot number
    /// this pool never handed out.
    pub(crate) fn completed(&mut self, slot: u32, byte_len: u32) -> bool {
        if slot >= self.count {
            return false;
        }
        self.posted -= 1;
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

    pub(crate) fn queue_repost(&mut self, slot: u32) {
        debug_assert!(self.repost.len() < self.count as usize);
        self.repost.push(slot);
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
                wr_id: wrid::encode(WrKind::Recv, slots.get(i).copied().unwrap_or(0)),
                sges: std::slice::from_ref(&sges[i]),
            });
            let result = srq.post_recv(&wrs[..n]);
            calls += 1;
            let done = match &result {
                Ok(()) => n,
                Err(e) => e.failed_index,
            };
            // Posted from the front of the chunk: keep the failed tail queued.
            self.repost.drain(start..start + done);
            self.posted += done as u32;
            result?;
        }
        Ok(calls)
    }
}
