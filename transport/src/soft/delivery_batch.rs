//! The receive completions of one soft TCP input batch (the frames one read brought), queued
//! onto the QP's receive CQ together: one claim of the CQ ring for them all, and one delivery
//! count around them all, instead of a claim and a count per message. Each of those is a
//! locked instruction, and it waits for the stores before it, here the capsule just copied
//! into a receive buffer the device's core has not touched since the SRQ last went round.
//!
//! Order is kept as the in-process fabric's list scope keeps it: the batch's delivery count
//! is held from its first delivery until its completions are queued, so a QP entering ERR
//! meanwhile (any thread) leaves the flush of its remaining receives and LAST_WQE_REACHED to
//! the batch's end (`end_delivery`); and a delivery that fails queues the batch's earlier
//! successes before its own error.

use arrayvec::ArrayVec;

use super::qp::QpShared;
use crate::types::WorkCompletion;

/// Completions held at most before they are queued.
const HELD: usize = 32;
const _: () = assert!(HELD <= u64::BITS as usize, "one solicited bit each");

#[derive(Default)]
pub(crate) struct DeliveryBatch {
    /// The batch counts as one delivery into its QP (from its first delivery on).
    counted: bool,
    wcs: ArrayVec<WorkCompletion, HELD>,
    /// Bit `i`: `wcs[i]`'s message asked for a solicited event.
    solicited: u64,
}

impl DeliveryBatch {
    /// A message that consumes a receive is about to be delivered into `qp`.
    #[inline]
    pub(crate) fn begin(&mut self, qp: &QpShared) {
        if !self.counted {
            qp.begin_delivery();
            self.counted = true;
        }
    }

    /// A successful receive completion (its `qp_num` filled by `qp`).
    #[inline]
    pub(crate) fn complete(&mut self, qp: &QpShared, wc: WorkCompletion, solicited: bool) {
        debug_assert!(self.counted, "a completion outside a delivery");
        if self.wcs.is_full() {
            self.queue(qp);
        }
        self.solicited |= u64::from(solicited) << self.wcs.len();
        self.wcs.push(WorkCompletion {
            qp_num: qp.qp_num(),
            ..wc
        });
    }

    /// Queue what is held (before any other receive completion of `qp`).
    #[inline]
    pub(crate) fn queue(&mut self, qp: &QpShared) {
        if !self.wcs.is_empty() {
            qp.complete_recvs(&self.wcs, self.solicited);
            self.wcs.clear();
            self.solicited = 0;
        }
    }

    /// The batch's end: its completions queued, its delivery count given back (which runs a
    /// receive flush and LAST_WQE_REACHED now due).
    pub(crate) fn finish(&mut self, qp: &QpShared) {
        self.queue(qp);
        if std::mem::take(&mut self.counted) {
            qp.end_delivery();
        }
    }
}
