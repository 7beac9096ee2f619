//! A qpair as the poll group sees it: a node of the intrusive RB-tree keyed by qp_num, its QP
//! (and CM id), its phase, flow-control and send accounting, and drain progress.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::time::Instant;

use intrusive_collections::{KeyAdapter, RBTreeLink, intrusive_adapter};

use crate::cm::CmId;
use crate::device::Qp;
use crate::types::{SendFlags, SendOp, SendWr, Sge};

/// Most SGEs one queued work request carries (a 128 KiB transfer in 8 KiB units is 16).
pub const MAX_WR_SGES: usize = 16;

/// Where a qpair is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QpairPhase {
    /// Created on this group's CQ/SRQ, waiting for ESTABLISHED.
    Connecting,
    Active,
    /// QP in ERR; waiting for its sends to flush and its last receive (LAST_WQE_REACHED or the
    /// fallback).
    Draining,
}

/// Why a qpair started draining.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DrainReason {
    /// The layer above asked (host disconnect, shutdown, fatal protocol error).
    Requested,
    /// The peer disconnected (CM DISCONNECTED).
    PeerDisconnected,
    /// A work request failed (the QP is in ERR).
    ErrorCompletion,
    /// The host sent more commands than the negotiated queue depth.
    Overrun,
    /// QP_FATAL and friends.
    AsyncError,
}

/// A send work request queued for the end-of-poll post, owning its SGEs.
#[derive(Clone, Copy, Debug)]
pub struct QueuedWr {
    pub wr_id: u64,
    pub op: SendOp,
    pub sges: [Sge; MAX_WR_SGES],
    pub nsge: u8,
    pub flags: SendFlags,
}

impl QueuedWr {
    pub fn new(wr_id: u64, op: SendOp, sges: &[Sge], flags: SendFlags) -> Option<QueuedWr> {
        if sges.len() > MAX_WR_SGES {
            return None;
        }
        let mut own = [Sge::default(); MAX_WR_SGES];
        own[..sges.len()].copy_from_slice(sges);
        Some(QueuedWr {
            wr_id,
            op,
            sges: own,
            nsge: sges.len() as u8,
            flags,
        })
    }

    pub fn as_wr(&self) -> SendWr<'_> {
        SendWr {
            wr_id: self.wr_id,
            op: self.op,
            sges: &self.sges[..self.nsge as usize],
            flags: self.flags,
        }
    }
}

/// Drain bookkeeping.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Drain {
    pub started: Instant,
    pub last_wqe: bool,
    /// The zero-length marker SEND posted after ERR has come back (flushed): every send posted
    /// before it has completed.
    pub marker_done: bool,
    pub marker_posted: bool,
    /// When the marker came back (the grace period for straggling receives starts then).
    pub marker_at: Option<Instant>,
}

/// The mutable part of a qpair. Only the owning reactor touches it (the group is `!Sync`).
pub(crate) struct QpairState {
    // Field order is drop order: the QP goes before its CM id.
    pub qp: Option<Qp>,
    pub cm_id: Option<CmId>,
    pub phase: QpairPhase,
    /// Negotiated queue depth: commands the host may have outstanding.
    pub depth: u32,
    /// Commands received and not yet answered (the host's view of the queue).
    pub outstanding: u32,
    /// Capsules waiting for a request object: (slot, byte_len).
    pub waiting: VecDeque<(u32, u32)>,
    /// Send WRs queued this poll.
    pub queued: Vec<QueuedWr>,
    /// Send-queue accounting: each entry is a run of WRs ending in a signaled one. A signaled
    /// success retires the head run (RC completes in order); each error completion retires one.
    pub runs: VecDeque<u32>,
    pub sends_outstanding: u32,
    /// Requests alive on this qpair (from capsule to finish).
    pub requests: u32,
    pub drain: Option<Drain>,
    /// In the group's dirty list (WRs queued this poll).
    pub dirty: bool,
    /// The layer above's name for this qpair.
    pub token: u64,
}

pub(crate) struct Qpair {
    link: RBTreeLink,
    pub qp_num: u32,
    pub st: RefCell<QpairState>,
}

intrusive_adapter!(pub(crate) QpairAdapter = Box<Qpair>: Qpair { link => RBTreeLink });

impl<'a> KeyAdapter<'a> for QpairAdapter {
    type Key = u32;
    fn get_key(&self, q: &'a Qpair) -> u32 {
        q.qp_num
    }
}

impl Qpair {
    pub(crate) fn new(
        qp: Qp,
        cm_id: Option<CmId>,
        depth: u32,
        max_send_wr: u32,
        token: u64,
    ) -> Box<Qpair> {
        Box::new(Qpair {
            link: RBTreeLink::new(),
            qp_num: qp.qp_num(),
            st: RefCell::new(QpairState {
                qp: Some(qp),
                cm_id,
                phase: QpairPhase::Connecting,
                depth,
                outstanding: 0,
                waiting: VecDeque::with_capacity(depth as usize + 1),
                queued: Vec::with_capacity(max_send_wr as usize),
                runs: VecDeque::with_capacity(max_send_wr as usize),
                sends_outstanding: 0,
                requests: 0,
                drain: None,
                dirty: false,
                token,
            }),
        })
    }
}

impl QpairState {
    /// Account a chain of `n` WRs whose last is signaled.
    pub(crate) fn chain_posted(&mut self, n: u32) {
        if n > 0 {
            self.runs.push_back(n);
            self.sends_outstanding += n;
        }
    }

    /// A signaled send-side WR completed successfully: its whole run is done.
    pub(crate) fn run_completed(&mut self) {
        if let Some(n) = self.runs.pop_front() {
            self.sends_outstanding -= n;
        }
    }

    /// One send-side WR completed in error (every WR reports its own error or flush).
    pub(crate) fn wr_failed(&mut self) {
        if let Some(head) = self.runs.front_mut() {
            *head -= 1;
            self.sends_outstanding -= 1;
            if *head == 0 {
                self.runs.pop_front();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> QpairState {
        QpairState {
            qp: None,
            cm_id: None,
            phase: QpairPhase::Active,
            depth: 4,
            outstanding: 0,
            waiting: VecDeque::new(),
            queued: Vec::new(),
            runs: VecDeque::new(),
            sends_outstanding: 0,
            requests: 0,
            drain: None,
            dirty: false,
            token: 0,
        }
    }

    #[test]
    fn signaled_success_retires_its_run() {
        let mut s = state();
        s.chain_posted(3); // WRITE, WRITE, SEND(signaled)
        s.chain_posted(1);
        assert_eq!(s.sends_outstanding, 4);
        s.run_completed();
        assert_eq!(s.sends_outstanding, 1);
        s.run_completed();
        assert_eq!(s.sends_outstanding, 0);
        s.run_completed(); // a stray completion cannot underflow
        assert_eq!(s.sends_outstanding, 0);
    }

    #[test]
    fn errors_retire_one_wr_each() {
        let mut s = state();
        s.chain_posted(2);
        s.chain_posted(2);
        for left in [3, 2, 1, 0] {
            s.wr_failed();
            assert_eq!(s.sends_outstanding, left);
        }
        assert!(s.runs.is_empty());
    }

    #[test]
    fn queued_wr_keeps_its_sges() {
        let sges = [
            Sge {
                addr: 1,
                length: 2,
                lkey: 3,
            },
            Sge {
                addr: 4,
                length: 5,
                lkey: 6,
            },
        ];
        let q = QueuedWr::new(9, SendOp::Send, &sges, SendFlags::SIGNALED).unwrap();
        let wr = q.as_wr();
        assert_eq!((wr.wr_id, wr.sges), (9, &sges[..]));
        assert!(
            QueuedWr::new(
                9,
                SendOp::Send,
                &[Sge::default(); MAX_WR_SGES + 1],
                SendFlags::empty()
            )
            .is_none()
        );
    }
}
