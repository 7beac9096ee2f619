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

use std::sync::Arc;

use super::mem::{self, SgList};
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
fn remote_range<'a>(
    peer: &'a Arc<QpShared>,
    rkey: u32,
    addr: u64,
    len: u64,
    access: Access,
) -> Result<mem::KeyRef<'a>, Outcome> {
    if !peer.grants_remote(access) {
        return Err(access_violation(peer));
    }
    peer.dev()
        .keys
        .lookup(rkey, true, peer.pd(), addr, len, access)
        .map_err(|_| access_violation(peer))
}

pub(crate) fn execute(req: &QpShared, peer: &Arc<QpShared>, wr: &WrView<'_>) -> Outcome {
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
            match mem::resolve_local_into(&mut local, &req.dev().keys, req.pd(), sges, local_need) {
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
            let r = match remote_range(peer, rkey, remote_addr, len, Access::REMOTE_WRITE) {
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
            let r = match remote_range(peer, rkey, remote_addr, len, Access::REMOTE_READ) {
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
    deliver(req, peer, &src, wr, imm, inv, opcode, write)
}

/// A message that consumes a receive at the responder (SEND*, RDMA WRITE with immediate).
/// Inlined, as `deliver_inner` (one call site each): as calls they passed eight arguments
/// through memory per SEND.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn deliver(
    req: &QpShared,
    peer: &Arc<QpShared>,
    src: &Src<'_, '_>,
    wr: &WrView<'_>,
    imm: Option<u32>,
    inv: Option<u32>,
    opcode: WcOpcode,
    write: Option<(u64, u32)>,
) -> Outcome {
    peer.delivering(|| deliver_inner(req, peer, src, wr, imm, inv, opcode, write))
}

#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn deliver_inner(
    req: &QpShared,
    peer: &Arc<QpShared>,
    src: &Src<'_, '_>,
    wr: &WrView<'_>,
    imm: Option<u32>,
    inv: Option<u32>,
    opcode: WcOpcode,
    write: Option<(u64, u32)>,
) -> Outcome {
    // Re-check under the in-delivery count: a QP entering ERR now either sees our count (and
    // leaves LAST_WQE to us) or we see its ERR and consume nothing.
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
            match peer
                .dev()
                .keys
                .lookup(rkey, true, peer.pd(), addr, len, Access::REMOTE_WRITE)
            {
                Ok(r) => write_dst.push(r),
                Err(_) => return access_violation(peer),
            }
        }
    }
    // The receive is used in place (a callback: no move of the entry out of the queue).
    let consumed = peer.pop_recv_with(|recv_wr_id, recv_sges| {
        let fail_recv = |status: WcStatus| {
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
            match mem::resolve_local_into(
                &mut recv_dst,
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
        peer.complete_recv(
            WorkCompletion {
                wr_id: recv_wr_id,
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
