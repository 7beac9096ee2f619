//! The in-process fabric: a requester executes its work request directly against the peer QP
//! (same process, any thread): it takes the peer's receive, checks keys in the peer device's
//! key table and copies memory to memory. No allocation, no lock, no syscall per work request
//! on the success path; the responder's completion goes straight onto the responder's CQ.
//!
//! Responder-side errors follow IB: a receive that cannot hold the message or has a bad lkey
//! completes in error and moves the responder to ERR (requester: REM_INV_REQ / REM_OP); a bad
//! rkey, bounds or access moves the responder to ERR with QP_ACCESS_ERR (requester:
//! REM_ACCESS_ERR). A peer that is gone (destroyed, in ERR, link down) never answers: the
//! requester's retries are exhausted at once (RETRY_EXC_ERR).
//!
//! A `post_send` list of three or more WRs runs in one [`ListScope`]: the keys it uses are
//! pinned once, the responder's in-delivery count is taken once, and its receive completions
//! go onto the responder's CQ under one claim, not per work request.

use std::cell::{Cell, RefCell};
use std::sync::Arc;

use arrayvec::ArrayVec;

use super::mem::{self, PinCache, SgList};
use super::qp::QpShared;
use crate::types::*;

/// Where a WR's local data is.
pub(crate) enum Data<'a> {
    Sges(&'a [Sge]),
    /// Inline data captured at post time.
    Bytes(&'a [u8]),
}

pub(crate) struct WrView<'a> {
    pub(crate) op: SendOp,
    pub(crate) data: Data<'a>,
    pub(crate) solicited: bool,
}

pub(crate) enum Outcome {
    Done {
        byte_len: u32,
    },
    /// No receive posted at the responder (RNR NAK with its timer).
    Rnr {
        timer: u8,
    },
    /// The responder is not in RTR/RTS yet: the request is dropped and retried after the ACK
    /// timeout (`timer` unused).
    NotReady {
        timer: u8,
    },
    Fail(WcStatus),
}

/// A WR's source: its validated SGEs (a list the caller keeps on its stack; moving a list
/// copies its whole capacity) or inline bytes.
enum Src<'s, 'a> {
    Sg(&'s SgList<'a>),
    Bytes(&'s [u8]),
}

impl Src<'_, '_> {
    fn len(&self) -> u64 {
        match self {
            Src::Sg(l) => l.total(),
            Src::Bytes(b) => b.len() as u64,
        }
    }
    #[inline(always)]
    fn copy_to(&self, dst: &SgList<'_>) -> u64 {
        match self {
            Src::Sg(l) => mem::copy_sg(dst, l, l.total()),
            Src::Bytes(b) => mem::scatter(dst, b) as u64,
        }
    }
}

/// What the work requests of one `post_send` list share: the key pins and the responder's
/// in-delivery count (LAST_WQE_REACHED waits for it), each taken at first use and given back
/// when the scope is dropped or [`release`](Self::release)d. Release it before anything that
/// may wait for a pin (a local bind, the send queue's lock).
///
/// Order: the completions it holds are queued before any other completion the list causes on
/// the same receive queue, and a responder entering ERR on its own thread meanwhile leaves the
/// flush of its remaining receives to the end of the list's delivery count (`flush_recvs`), so
/// a receive queue's completions keep their order.
pub(crate) struct ListScope<'a> {
    /// Enabled when the list shares (see `new`): the one flag for pins and completions alike.
    pins: PinCache<'a>,
    delivering: Cell<Option<&'a QpShared>>,
    /// The successful receive completions of the deliveries into `delivering`, queued onto its
    /// CQ together (one claim of the ring's tail, after the copies rather than between them)
    /// before the delivery count is given back.
    completions: RefCell<Completions>,
}

/// Receive completions a scope holds at most before it queues them.
const COMPLETIONS: usize = 32;
const _: () = assert!(COMPLETIONS <= u64::BITS as usize, "one solicited bit each");

#[derive(Default)]
struct Completions {
    wcs: ArrayVec<WorkCompletion, COMPLETIONS>,
    /// Bit `i`: `wcs[i]`'s message asked for a solicited event.
    solicited: u64,
}

impl<'a> ListScope<'a> {
    /// `batch`: the list is long enough for pins and completions to be shared (a key used
    /// twice, several receives of the responder); else each work request pins and completes on
    /// its own, as that costs less.
    pub(crate) fn new(batch: bool) -> ListScope<'a> {
        ListScope {
            pins: PinCache::new(batch),
            delivering: Cell::new(None),
            completions: RefCell::new(Completions::default()),
        }
    }

    /// Count this list as delivering into `peer` (once per list).
    #[inline(always)]
    fn hold_delivery(&self, peer: &'a QpShared) {
        match self.delivering.get() {
            Some(held) if std::ptr::eq(held, peer) => {}
            other => {
                peer.begin_delivery();
                if let Some(previous) = other {
                    self.queue_completions();
                    previous.end_delivery();
                }
                self.delivering.set(Some(peer));
            }
        }
    }

    /// A delivery into the held responder succeeded: its receive completion (queued with the
    /// list's others).
    #[inline(always)]
    fn complete_recv(&self, peer: &QpShared, wc: WorkCompletion, solicited: bool) {
        if !self.pins.enabled() {
            peer.complete_recv(wc, solicited);
            return;
        }
        let full = {
            let mut held = self.completions.borrow_mut();
            let index = held.wcs.len();
            held.solicited |= u64::from(solicited) << index;
            held.wcs.push(wc);
            held.wcs.is_full()
        };
        if full {
            self.queue_completions();
        }
    }

    /// Queue the held receive completions onto the responder's CQ now (before anything else
    /// completes a receive of it: a failed delivery, a flush).
    #[inline(always)]
    pub(crate) fn queue_completions(&self) {
        if self.pins.enabled() {
            self.queue_held();
        }
    }

    #[inline(never)]
    fn queue_held(&self) {
        let mut held = self.completions.borrow_mut();
        if held.wcs.is_empty() {
            return;
        }
        // Completions are held only under a delivery count (`hold_delivery` comes first).
        debug_assert!(self.delivering.get().is_some());
        if let Some(peer) = self.delivering.get() {
            match held.wcs.as_slice() {
                [one] => peer.complete_recv(*one, held.solicited != 0),
                all => peer.complete_recvs(all, held.solicited),
            }
        }
        held.wcs.clear();
        held.solicited = 0;
    }

    /// Queue the held completions, give back the pins and the delivery count now.
    #[inline]
    pub(crate) fn release(&mut self) {
        self.queue_completions();
        self.pins.release();
        if let Some(peer) = self.delivering.take() {
            peer.end_delivery();
        }
    }
}

impl Drop for ListScope<'_> {
    #[inline(always)]
    fn drop(&mut self) {
        self.queue_completions();
        if let Some(peer) = self.delivering.take() {
            peer.end_delivery();
        }
    }
}

fn responder_ready(peer: &QpShared) -> Result<(), Outcome> {
    if !peer.is_live() {
        return Err(Outcome::Fail(WcStatus::RetryExcErr));
    }
    match peer.state() {
        QpState::Rtr | QpState::Rts => Ok(()),
        QpState::Err => Err(Outcome::Fail(WcStatus::RetryExcErr)),
        _ => Err(Outcome::NotReady { timer: 0 }),
    }
}

/// A remote access violation at the responder: it goes to ERR with QP_ACCESS_ERR.
fn access_violation(peer: &Arc<QpShared>) -> Outcome {
    peer.dev().raise(AsyncEventKind::QpAccessErr {
        qp_num: peer.qp_num(),
    });
    peer.enter_err(false);
    Outcome::Fail(WcStatus::RemAccessErr)
}

/// The responder side of an RDMA READ / WRITE: the QP grants `access` and `rkey` covers the
/// range; else the responder goes to ERR and the requester gets REM_ACCESS_ERR. Inlined (an
/// RDMA WRITE or READ per NVMe transfer): as a call it returned the pinned range through memory.
#[inline(always)]
fn remote_range<'s, 'a>(
    scope: &'s ListScope<'a>,
    peer: &'a Arc<QpShared>,
    rkey: u32,
    addr: u64,
    len: u64,
    access: Access,
) -> Result<mem::KeyRef<'s>, Outcome> {
    if !peer.grants_remote(access) {
        return Err(access_violation(peer));
    }
    scope
        .pins
        .lookup(&peer.dev().keys, rkey, true, peer.pd(), addr, len, access)
        .map_err(|_| access_violation(peer))
}

/// Execute one work request against the responder `peer`, in `scope` (its list's).
pub(crate) fn execute<'a>(
    req: &'a QpShared,
    peer: &'a Arc<QpShared>,
    wr: &WrView<'_>,
    scope: &ListScope<'a>,
) -> Outcome {
    if req.link_is_down() {
        return Outcome::Fail(WcStatus::RetryExcErr);
    }
    let local_need = if matches!(wr.op, SendOp::RdmaRead { .. }) {
        Access::LOCAL_WRITE
    } else {
        Access::empty()
    };
    let mut local = SgList::new();
    let src = match wr.data {
        Data::Sges(sges) => {
            match mem::resolve_local_cached(
                &mut local,
                &scope.pins,
                &req.dev().keys,
                req.pd(),
                sges,
                local_need,
            ) {
                Ok(()) => Src::Sg(&local),
                Err(_) => return Outcome::Fail(WcStatus::LocProtErr),
            }
        }
        Data::Bytes(b) => Src::Bytes(b),
    };
    if let Err(o) = responder_ready(peer) {
        return o;
    }
    let len = src.len();
    // The messages that consume a receive share one (inlined) delivery: (imm, inv, opcode,
    // write) per kind.
    let (imm, inv, opcode, write) = match wr.op {
        SendOp::Send => (None, None, WcOpcode::Recv, None),
        SendOp::SendWithImm { imm } => (Some(imm), None, WcOpcode::Recv, None),
        SendOp::SendWithInv { rkey } => (None, Some(rkey), WcOpcode::Recv, None),
        SendOp::RdmaWriteWithImm {
            remote_addr,
            rkey,
            imm,
        } => (
            Some(imm),
            None,
            WcOpcode::RecvRdmaWithImm,
            Some((remote_addr, rkey)),
        ),
        SendOp::RdmaWrite { remote_addr, rkey } => {
            if len == 0 {
                return Outcome::Done { byte_len: 0 };
            }
            let r = match remote_range(scope, peer, rkey, remote_addr, len, Access::REMOTE_WRITE) {
                Ok(r) => r,
                Err(o) => return o,
            };
            let mut dst = SgList::new();
            dst.push(r);
            src.copy_to(&dst);
            return Outcome::Done {
                byte_len: len as u32,
            };
        }
        SendOp::RdmaRead { remote_addr, rkey } => {
            let Src::Sg(local) = src else {
                return Outcome::Fail(WcStatus::LocQpOpErr);
            };
            if len == 0 {
                return Outcome::Done { byte_len: 0 };
            }
            let r = match remote_range(scope, peer, rkey, remote_addr, len, Access::REMOTE_READ) {
                Ok(r) => r,
                Err(o) => return o,
            };
            let mut remote = SgList::new();
            remote.push(r);
            mem::copy_sg(local, &remote, len);
            return Outcome::Done {
                byte_len: len as u32,
            };
        }
        // Local operations never reach the peer: the send queue runs them itself.
        SendOp::LocalInv { .. } | SendOp::BindMw { .. } => {
            return match req.execute_local(&wr.op) {
                Ok(()) => Outcome::Done { byte_len: 0 },
                Err(status) => Outcome::Fail(status),
            };
        }
    };
    deliver(req, peer, scope, &src, wr, imm, inv, opcode, write)
}

/// A message that consumes a receive at the responder (SEND*, RDMA WRITE with immediate).
/// Inlined (one call site): as a call it passed eight arguments through memory per SEND.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn deliver<'a>(
    req: &'a QpShared,
    peer: &'a Arc<QpShared>,
    scope: &ListScope<'a>,
    src: &Src<'_, '_>,
    wr: &WrView<'_>,
    imm: Option<u32>,
    inv: Option<u32>,
    opcode: WcOpcode,
    write: Option<(u64, u32)>,
) -> Outcome {
    scope.hold_delivery(peer);
    // Re-check under the in-delivery count: a QP entering ERR now either sees our count (and
    // leaves LAST_WQE to the scope's end) or we see its ERR and consume nothing.
    if let Err(o) = responder_ready(peer) {
        return o;
    }
    let len = src.len();
    // RDMA WRITE with immediate: the write's own rkey check comes first.
    let mut write_dst = SgList::new();
    if let Some((addr, rkey)) = write {
        if len > 0 {
            if !peer.grants_remote(Access::REMOTE_WRITE) {
                return access_violation(peer);
            }
            match scope.pins.lookup(
                &peer.dev().keys,
                rkey,
                true,
                peer.pd(),
                addr,
                len,
                Access::REMOTE_WRITE,
            ) {
                Ok(r) => write_dst.push(r),
                Err(_) => return access_violation(peer),
            }
        }
    }
    // The receive is used in place (a callback: no move of the entry out of the queue).
    let consumed = peer.pop_recv_with(|recv_wr_id, recv_sges| {
        if let (None, Some(first)) = (write, recv_sges.first()) {
            // Before the receive's checks: the buffer's line comes over meanwhile.
            crate::shared_mem::prefetch_write(first.addr as usize as *const u8);
        }
        let fail_recv = |status: WcStatus| {
            // After the list's earlier completions of this receive queue (their order).
            scope.queue_completions();
            peer.complete_recv(
                WorkCompletion {
                    wr_id: recv_wr_id,
                    status,
                    opcode: WcOpcode::Recv,
                    src_qp: req.qp_num(),
                    ..Default::default()
                },
                false,
            );
            peer.enter_err(false);
        };
        let mut recv_dst = SgList::new();
        let dst = if write.is_some() {
            &write_dst
        } else {
            match mem::resolve_local_cached(
                &mut recv_dst,
                &scope.pins,
                &peer.dev().keys,
                peer.recv_pd(),
                recv_sges,
                Access::LOCAL_WRITE,
            ) {
                Ok(()) => &recv_dst,
                Err(_) => {
                    fail_recv(WcStatus::LocProtErr);
                    return Outcome::Fail(WcStatus::RemOpErr);
                }
            }
        };
        if write.is_none() && len > dst.total() {
            fail_recv(WcStatus::LocLenErr);
            return Outcome::Fail(WcStatus::RemInvReqErr);
        }
        if let Some(rkey) = inv {
            if !peer.dev().keys.invalidate_rkey(rkey, peer.pd()) {
                fail_recv(WcStatus::RemInvReqErr);
                return Outcome::Fail(WcStatus::RemOpErr);
            }
        }
        src.copy_to(dst);
        scope.complete_recv(
            peer,
            WorkCompletion {
                wr_id: recv_wr_id,
                qp_num: peer.qp_num(),
                status: WcStatus::Success,
                opcode,
                byte_len: len as u32,
                src_qp: req.qp_num(),
                imm_data: imm,
                invalidated_rkey: inv,
                ..Default::default()
            },
            wr.solicited,
        );
        Outcome::Done {
            byte_len: len as u32,
        }
    });
    consumed.unwrap_or_else(|| Outcome::Rnr {
        timer: peer.min_rnr_timer(),
    })
}

#[cfg(test)]
#[path = "list_scope_tests.rs"]
mod tests;
