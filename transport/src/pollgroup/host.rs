//! The host (initiator) personality of a poll group, over the same core as the target's: one
//! CQ, qpairs in the slab and RB-tree, wr_id encoding, exact send accounting, backpressure and
//! drains. What differs:
//!
//! - receives go to an SRQ or to each qpair's own receive queue (`RecvMode::PerQpair`: the
//!   group assigns a qpair its slots when it joins and re-posts them to its QP);
//! - requests are born by `submit` (not by a received capsule): the initiator writes the
//!   64-byte SQE (and in-capsule data) into the request's buffer and posts its SEND with
//!   `post_chain(req, .., false)`; the target moves the data (RDMA READ / WRITE);
//! - a received capsule is a response: `Handler::response` gets its bytes (CQE first), the
//!   initiator matches the CID and calls `response_received(req)`; the request completes
//!   (`Handler::request_complete`) when both its SEND completion and its response are in, in
//!   either order (a host must not reuse the command's buffers before both). A SEND posted
//!   with `post_chain_owned` that went silent (`silent.rs`) completes at its response: its
//!   depth slot goes back at `finish`, its object (what the SEND reads) when a later
//!   completion retires the SEND.
//!
//! Commands in flight per qpair are bounded by its depth: `submit` refuses past it.
//!
//! On an SRQ a host group may re-post the receive slots a poll freed at the start of its next
//! poll instead of at the end of that one (`RecvRepost::NextPass`): see there why, and what
//! sizing it needs.
//!
//! Connecting (CM client side): resolve a `CmId` (`CmId::resolve` on the initiator's event
//! channel), `add_cm_qpair(id, depth, read_depth, token)` creates its QP on this group, then
//! `connect(qp_num, param)`; ESTABLISHED reaches `handle_cm_event`.

use crate::error::{Result, TransportError};

use super::PollGroup;
use super::qpair::{QpRef, QpairPhase};
use super::request::{Handler, HostProgress, ReqId};

/// Which side of the connection a group serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Target,
    Host,
}

/// Where a group's receive slots are posted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecvMode {
    /// One SRQ shared by every qpair (the target's model).
    Srq,
    /// Each qpair's own receive queue, `recvs` slots each, taken from the group's pool
    /// (`srq_depth` slots in all) when it joins.
    PerQpair { recvs: u32 },
}

/// When the receive slots a poll freed go back to the receive queue.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RecvRepost {
    /// At the end of that poll (every target group, and hosts on per-qpair receive queues).
    #[default]
    EndOfPass,
    /// At the start of the next poll, before its CQ is read: for a host group on an SRQ whose
    /// application submits between polls. Re-posting stores into receive-queue lines the
    /// peer's core holds (on the soft fabric the responder's post pops them), and the first
    /// locked instruction after those stores, the next submission's, waited for their lines
    /// (about 0.1-0.2 us of each I/O at depth 1 on a two-core VM); after the submissions the
    /// wait overlaps the peer's work. Up to a batch of slots (`batch`) is then off the SRQ
    /// while the requests they answered are already free to carry new commands, so the SRQ
    /// needs that slack: `srq_depth >= max_requests + batch`, checked at creation; with less,
    /// a response could find no receive posted (RNR).
    NextPass,
}

/// A qpair named without a tree lookup (slab index + generation): for per-I/O calls such as
/// `submit`. Stale once the qpair is gone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpairHandle(pub(crate) QpRef);

impl<R: Default> PollGroup<R> {
    /// The handle of `qp_num` (one tree lookup; keep it for the connection's life).
    pub fn qpair_handle(&self, qp_num: u32) -> Option<QpairHandle> {
        self.lookup(qp_num).map(QpairHandle)
    }

    /// Host side: a new request for a command on `qp`. Err when the qpair is gone or not
    /// active, its depth is reached, or no request object is free.
    pub fn submit(&mut self, qp: QpairHandle) -> Result<ReqId> {
        if self.role != Role::Host {
            return Err(TransportError::InvalidArgument(
                "submit is for host-side groups".into(),
            ));
        }
        let q = self
            .qpair_at_mut(qp.0)
            .ok_or_else(|| TransportError::InvalidArgument("the qpair is gone".into()))?;
        if q.phase != QpairPhase::Active {
            return Err(TransportError::InvalidArgument(format!(
                "qpair {:#x} is {:?}",
                q.qp_num, q.phase
            )));
        }
        if q.outstanding >= q.depth {
            return Err(TransportError::QueueFull("qpair queue depth"));
        }
        // Not `ok_or`: that built (and dropped) the error on every submit.
        let Some(req) = self.new_request(qp.0, u32::MAX) else {
            return Err(TransportError::QueueFull("request objects"));
        };
        if let Some(q) = self.qpair_at_mut(qp.0) {
            q.outstanding += 1;
        }
        self.reqs[req.index as usize].host = Some(HostProgress::default());
        Ok(req)
    }

    /// Host side: `req`'s response arrived (the initiator matched its CID). Completes it now
    /// if its SEND completion is in too, or its SEND went silent with only the request's own
    /// memory (`post_chain_owned`); else when that completion comes.
    pub fn response_received(&mut self, req: ReqId) -> Result<()> {
        let r = self
            .request_mut(req)
            .ok_or_else(|| TransportError::InvalidArgument(format!("no request {req:?}")))?;
        // A silent SEND of the request's own memory: the response says the target had the
        // command; the object stays held until a later completion retires the SEND.
        let sent = r.silent && r.owned;
        let Some(p) = r.host.as_mut() else {
            return Err(TransportError::InvalidArgument(format!(
                "{req:?} is not a host request"
            )));
        };
        if p.response {
            return Err(TransportError::InvalidArgument(format!(
                "{req:?} already has its response"
            )));
        }
        p.response = true;
        if (p.send_done || sent) && !p.reported {
            p.reported = true;
            self.completed.push(req);
        }
        Ok(())
    }

    /// Host side, inside `Handler::response`: the rkey (a memory window of the host's) that
    /// this response's SEND_WITH_INVALIDATE invalidated, if it did. The window is free to
    /// bind again; a window the target did not invalidate needs a local invalidate first.
    pub fn response_invalidated_rkey(&self) -> Option<u32> {
        self.response_invalidated
    }

    /// A response capsule in `slot` on `qp_num` (the qpair of `token`): up to the initiator,
    /// then the slot goes back.
    pub(crate) fn on_response<H: Handler<R>>(
        &mut self,
        h: &mut H,
        qp_num: u32,
        token: u64,
        slot: u32,
    ) {
        // The handler reads the bytes during the call; the slot is not re-posted before.
        let mut copy = [0u8; 64];
        let bytes = self.recv.bytes(slot);
        let n = bytes.len().min(copy.len());
        copy[..n].copy_from_slice(&bytes[..n]);
        self.recv.release(slot);
        h.response(self, qp_num, token, &copy[..n]);
    }

    /// Host requests completed by `response_received` during this poll.
    pub(crate) fn report_completed<H: Handler<R>>(&mut self, h: &mut H) {
        while let Some(req) = self.completed.pop() {
            // Aborted meanwhile (its qpair went): `aborted` told the initiator already.
            if self.request(req).is_some_and(|r| !r.aborted()) {
                h.request_complete(self, req, crate::types::WcStatus::Success);
            }
        }
    }
}
