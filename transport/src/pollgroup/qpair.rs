//! A qpair as the poll group sees it. The state lives in a slab sized at start (index +
//! generation, `QpRef`), so a request or a drain marker reaches its qpair without a search; the
//! intrusive RB-tree keyed by qp_num holds only small index nodes and is used for receive
//! completions (one lookup per capsule) and control-path events. Per-qpair memory does not
//! depend on its depth: work waiting on it is linked through request and slot indices.

use std::time::Instant;

use intrusive_collections::{KeyAdapter, RBTreeLink, intrusive_adapter};

use crate::cm::CmId;
use crate::device::Qp;

use super::fifo::Fifo;

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
    /// The group's CQ failed: every qpair goes.
    GroupFailed,
}

/// A qpair's slab index and generation: stale once the qpair is gone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct QpRef {
    pub index: u32,
    pub generation: u32,
}

/// Drain bookkeeping.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Drain {
    pub started: Instant,
    pub last_wqe: bool,
    /// It came back: every send posted before it has completed.
    pub marker_done: bool,
    /// When the marker came back or could not be posted (the grace period for straggling
    /// receives starts then).
    pub sends_quiet_at: Option<Instant>,
}

/// The mutable state of a qpair. Only the owning reactor touches it (the group is `!Sync`).
pub(crate) struct QpairState {
    // Field order is drop order: the QP goes before its CM id.
    pub qp: Option<Qp>,
    pub cm_id: Option<CmId>,
    pub qp_num: u32,
    pub generation: u32,
    pub phase: QpairPhase,
    /// The layer above's name for this qpair.
    pub token: u64,
    /// Negotiated queue depth: commands the host may have outstanding.
    pub depth: u32,
    /// Commands received and not yet answered (the answer's SEND not yet posted).
    pub outstanding: u32,
    /// Requests alive on this qpair (capsule to finish or abort).
    pub requests: u32,
    /// Send-queue WRs the group may have posted at once (the drain marker has its own slot).
    pub sq_slots: u32,
    pub sq_used: u32,
    pub sq_high_water: u32,
    /// RDMA READs this side may have in flight (negotiated at connect, capped by the device).
    pub read_depth: u32,
    pub reads_in_flight: u32,
    pub reads_high_water: u32,
    /// Requests whose chain waits to be posted, in order.
    pub to_post: Fifo,
    /// Posted chains that asked for no completion of their own (`poll.rs`, "Silent chains"),
    /// in post order: the next completion on this qpair for a chain posted after them says
    /// they are done.
    pub silent: Fifo,
    /// Lists in a row whose last chain went silent too (`silent.rs`): at
    /// `PollGroupConfig::silent_answers` the next list's last chain asks for a completion.
    pub lone_silent: u32,
    /// A silent flush (`silent.rs`) is on the send queue, with its post number: it retires
    /// the silent chains posted before it.
    pub silent_flush: Option<u32>,
    /// Post number of the next chain posted on this qpair (wrapping; `Request::post_seq`).
    pub next_post_seq: u32,
    /// Capsules (Held slots) waiting for a request object, in order.
    pub waiting_capsules: Fifo,
    pub in_waiting_list: bool,
    /// In the group's dirty list (something to post at the end of the poll).
    pub dirty: bool,
    pub drain: Option<Drain>,
}

impl QpairState {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        qp: Qp,
        cm_id: Option<CmId>,
        generation: u32,
        depth: u32,
        read_depth: u32,
        token: u64,
    ) -> QpairState {
        // One slot of the granted send queue is the drain marker's.
        let sq_slots = qp.caps().max_send_wr.saturating_sub(1).max(1);
        QpairState {
            qp_num: qp.qp_num(),
            qp: Some(qp),
            cm_id,
            generation,
            phase: QpairPhase::Connecting,
            token,
            depth,
            outstanding: 0,
            requests: 0,
            sq_slots,
            sq_used: 0,
            sq_high_water: 0,
            read_depth,
            reads_in_flight: 0,
            reads_high_water: 0,
            to_post: Fifo::default(),
            silent: Fifo::default(),
            lone_silent: 0,
            silent_flush: None,
            next_post_seq: 0,
            waiting_capsules: Fifo::default(),
            in_waiting_list: false,
            dirty: false,
            drain: None,
        }
    }

    /// The post number of the chain going to the send queue now (`Request::post_seq`).
    pub(crate) fn next_post(&mut self) -> u32 {
        let seq = self.next_post_seq;
        self.next_post_seq = seq.wrapping_add(1);
        seq
    }

    /// Whether a chain of `wrs` WRs with `reads` RDMA READs can go on the send queue now
    /// (`post_chain` refuses chains longer than the whole send queue). A
    /// chain with more READs than the read depth goes alone (no other READ in flight): the
    /// device itself never issues more than the QP's max_rd_atomic at once, so such a chain is
    /// only kept from piling onto others.
    pub(crate) fn has_room(&self, wrs: u32, reads: u32) -> bool {
        let sq = self.sq_used + wrs <= self.sq_slots;
        let rd = self.reads_in_flight + reads <= self.read_depth || self.reads_in_flight == 0;
        sq && rd
    }

    pub(crate) fn reserve(&mut self, wrs: u32, reads: u32) {
        self.sq_used += wrs;
        self.reads_in_flight += reads;
        self.sq_high_water = self.sq_high_water.max(self.sq_used);
        self.reads_high_water = self.reads_high_water.max(self.reads_in_flight);
    }

    pub(crate) fn release(&mut self, wrs: u32, reads: u32) {
        debug_assert!(wrs <= self.sq_used && reads <= self.reads_in_flight);
        self.sq_used -= wrs.min(self.sq_used);
        self.reads_in_flight -= reads.min(self.reads_in_flight);
    }
}

/// `qref`'s state if it is still the qpair it names (borrowing the slab only, so the caller
/// may use the group's other fields meanwhile).
pub(crate) fn live_mut(
    qpairs: &mut slab::Slab<QpairState>,
    qref: QpRef,
) -> Option<&mut QpairState> {
    qpairs
        .get_mut(qref.index as usize)
        .filter(|q| q.generation == qref.generation)
}

/// The RB-tree's node: qp_num -> slab index.
pub(crate) struct QpairNode {
    link: RBTreeLink,
    pub qp_num: u32,
    pub index: u32,
}

intrusive_adapter!(pub(crate) QpairAdapter = Box<QpairNode>: QpairNode { link => RBTreeLink });

impl<'a> KeyAdapter<'a> for QpairAdapter {
    type Key = u32;
    fn get_key(&self, q: &'a QpairNode) -> u32 {
        q.qp_num
    }
}

impl QpairNode {
    pub(crate) fn new(qp_num: u32, index: u32) -> Box<QpairNode> {
        Box::new(QpairNode {
            link: RBTreeLink::new(),
            qp_num,
            index,
        })
    }
}
