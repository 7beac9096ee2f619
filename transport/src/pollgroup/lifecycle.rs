//! Qpairs in and out of a poll group: connecting -> active -> draining -> gone; and the group
//! failing as a whole.
//!
//! Draining: QP to ERR (CM disconnect when there is an id), a zero-length marker SEND that
//! flushes back once every earlier send has. The drain is over when the marker is back and the
//! send accounting is at zero (exact: see `wrid`), and the receive side is done:
//! LAST_WQE_REACHED (SRQ), none of the qpair's receives still posted (per-qpair receive
//! queues, the host: a QP in ERR flushes every one back), or, failing both (rxe and iWARP with
//! an SRQ, the soft device with the flag off), a short grace after the marker. When the marker could not be posted (the QP is
//! already gone), the grace after the drain's start stands in for it. The drain timeout is a
//! last resort, counted, and never the expected end.
//!
//! Removal takes the qpair out of the RB-tree BEFORE its QP is destroyed, re-posts the
//! receives it had taken but not started, and aborts requests still alive: they are kept
//! (buffers, capsule) until the layer above calls `finish`. Later completions for the
//! destroyed QP are orphans (receives: re-posted) or stale by generation (sends: dropped).
//!
//! A CQ that fails (a poll error, CQ_ERR) fails the group: the owner is told
//! (`Handler::group_failed`), every qpair is disconnected and destroyed, and the loss is logged.

use std::time::Instant;

use crate::cm::CmId;
use crate::device::{Qp, QpInitAttr};
use crate::error::{Result, TransportError};
use crate::types::{
    AsyncEventKind, CmEventKind, ConnParam, QpCaps, QpState, SendFlags, SendOp, SendWr,
};

use super::qpair::{Drain, DrainReason, QpRef, QpairNode, QpairPhase, QpairState};
use super::request::Handler;
use super::wrid::{self, WrKind};
use super::{PollGroup, RecvMode};

/// `add_cm_qpair` failed; the id is handed back for a reject.
#[derive(Debug, thiserror::Error)]
#[error("{error}")]
pub struct AddQpairError {
    #[source]
    pub error: TransportError,
    pub id: CmId,
}

/// What the layer above hears about a qpair.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QpairEvent {
    Active,
    Draining(DrainReason),
    /// Out of the tree and destroyed. `forced`: the drain timed out (or destroy was immediate).
    Gone {
        forced: bool,
    },
}

impl<R: Default> PollGroup<R> {
    /// The attributes a QP of this group is created with: this group's CQ and SRQ, a send
    /// queue for a full queue of the longest chains and the SGEs a WR may carry (both capped
    /// by the device).
    fn qp_caps(&self) -> QpCaps {
        QpCaps {
            max_send_wr: self.cfg.max_send_wr().min(self.device_max_qp_wr),
            max_recv_wr: self.recvs_per_qpair(),
            max_send_sge: self.sge_limits.send as u32,
            max_recv_sge: 1,
            max_inline_data: 64,
        }
    }

    fn recvs_per_qpair(&self) -> u32 {
        match self.recv_mode {
            RecvMode::Srq => 0,
            RecvMode::PerQpair { recvs } => recvs,
        }
    }

    /// Whether a qpair of `depth` fits in this group now.
    pub fn check_room(&self, depth: u32) -> Result<()> {
        let recvs = self.recvs_per_qpair();
        if recvs > self.recv.free_count() {
            return Err(TransportError::Limit {
                what: "poll group receive slots for a qpair",
                asked: recvs as u64,
                max: self.recv.free_count() as u64,
            });
        }
        if let Some(why) = &self.failed {
            return Err(TransportError::InvalidArgument(format!(
                "the poll group failed: {why}"
            )));
        }
        if depth == 0 || depth > self.cfg.max_queue_depth {
            return Err(TransportError::InvalidArgument(format!(
                "queue depth {depth} outside 1..={}",
                self.cfg.max_queue_depth
            )));
        }
        let n = self.qpair_count() as u32;
        if n >= self.cfg.max_qpairs {
            return Err(TransportError::Limit {
                what: "poll group qpairs",
                asked: n as u64 + 1,
                max: self.cfg.max_qpairs as u64,
            });
        }
        Ok(())
    }

    /// The RDMA READ depth a qpair gets: what was negotiated, capped by the device.
    fn read_depth(&self, negotiated: u32) -> Result<u32> {
        if negotiated == 0 {
            return Err(TransportError::InvalidArgument(
                "read depth 0: RDMA READs could never be posted".into(),
            ));
        }
        Ok(negotiated.min(self.device_read_depth).max(1))
    }

    /// A QP on this group's CQ and SRQ, in RESET, for a caller that connects it by hand
    /// (pingpong style) and then hands it over with `add_qp`.
    pub fn create_qp(&mut self) -> Result<Qp> {
        let caps = self.qp_caps();
        let qp = self.pd.create_qp(&QpInitAttr {
            send_cq: &self.cq,
            recv_cq: &self.cq,
            srq: self.srq.as_ref(),
            caps,
            sq_sig_all: false,
        })?;
        self.note_inline(&qp);
        Ok(qp)
    }

    fn insert(
        &mut self,
        qp: Qp,
        cm_id: Option<CmId>,
        depth: u32,
        read_depth: u32,
        token: u64,
    ) -> QpRef {
        let qp_num = qp.qp_num();
        let entry = self.qpairs.vacant_entry();
        let index = entry.key() as u32;
        let generation = wrid::next_generation(self.qpair_generation[index as usize]);
        self.qpair_generation[index as usize] = generation;
        entry.insert(QpairState::new(
            qp, cm_id, generation, depth, read_depth, token,
        ));
        self.tree.insert(QpairNode::new(qp_num, index));
        self.qpn_cache.fill(qp_num, index);
        self.depth_sum = self.depth_sum.saturating_add(depth);
        let recvs = self.recvs_per_qpair();
        if recvs > 0 {
            // check_room made sure the pool has them; posted at the end of the poll.
            self.recv.assign(index, recvs);
        } else if self.srq.is_some() {
            // Its peer's receives go onto the SRQ now: it may send before this pass ends.
            self.recv.add_peer_depth(depth);
            self.flush_recvs();
        }
        self.stats.qpairs_added += 1;
        QpRef { index, generation }
    }

    fn note_inline(&mut self, qp: &Qp) {
        let granted = qp.caps().max_inline_data;
        self.max_inline = if self.qpair_count() == 0 {
            granted
        } else {
            self.max_inline.min(granted)
        };
    }

    fn check_new(&self, qp_num: u32) -> Result<()> {
        if self.tree.find(&qp_num).get().is_some() {
            return Err(TransportError::InvalidArgument(format!(
                "qp_num {qp_num:#x} is already in this group"
            )));
        }
        Ok(())
    }

    /// Takes a connected QP made by `create_qp` into the group as an active qpair. `depth`:
    /// commands the peer may have outstanding; `read_depth`: RDMA READs this side may have in
    /// flight (negotiated at connect; capped by the device's max_qp_rd_atom /
    /// max_qp_init_rd_atom).
    pub fn add_qp(&mut self, qp: Qp, depth: u32, read_depth: u32, token: u64) -> Result<u32> {
        self.check_room(depth)?;
        let read_depth = self.read_depth(read_depth)?;
        let qp_num = qp.qp_num();
        self.check_new(qp_num)?;
        let qref = self.insert(qp, None, depth, read_depth, token);
        self.qpairs[qref.index as usize].phase = QpairPhase::Active;
        Ok(qp_num)
    }

    /// Creates the QP of a CM connection on this group's CQ and SRQ and takes it into the group
    /// (connecting). The caller then `accept`s (server) or `connect`s (client) through the
    /// group. On failure the id comes back, so the caller can still reject with its own
    /// private data.
    pub fn add_cm_qpair(
        &mut self,
        mut id: CmId,
        depth: u32,
        read_depth: u32,
        token: u64,
    ) -> Result<u32, AddQpairError> {
        let read_depth = match self
            .check_room(depth)
            .and_then(|()| self.read_depth(read_depth))
        {
            Ok(r) => r,
            Err(error) => return Err(AddQpairError { error, id }),
        };
        let caps = self.qp_caps();
        let qp = match id.create_qp(
            &self.pd,
            &QpInitAttr {
                send_cq: &self.cq,
                recv_cq: &self.cq,
                srq: self.srq.as_ref(),
                caps,
                sq_sig_all: false,
            },
        ) {
            Ok(qp) => qp,
            Err(error) => return Err(AddQpairError { error, id }),
        };
        if let Err(error) = self.check_new(qp.qp_num()) {
            drop(qp);
            return Err(AddQpairError { error, id });
        }
        self.note_inline(&qp);
        let qp_num = qp.qp_num();
        id.set_token(token);
        self.insert(qp, Some(id), depth, read_depth, token);
        Ok(qp_num)
    }

    /// Runs `f` on `qp_num`'s CM id (accept, reject, connect).
    pub fn with_cm_id<T>(
        &mut self,
        qp_num: u32,
        f: impl FnOnce(&mut CmId) -> Result<T>,
    ) -> Result<T> {
        let Some(qref) = self.lookup(qp_num) else {
            return Err(TransportError::InvalidArgument(format!(
                "no qpair {qp_num:#x}"
            )));
        };
        match self.qpairs[qref.index as usize].cm_id.as_mut() {
            Some(id) => f(id),
            None => Err(TransportError::InvalidArgument(format!(
                "qpair {qp_num:#x} has no CM id"
            ))),
        }
    }

    /// Server side: accept the connection whose QP is `qp_num`.
    pub fn accept(&mut self, qp_num: u32, param: &ConnParam) -> Result<()> {
        self.with_cm_id(qp_num, |id| id.accept(param))
    }

    /// Client side: connect `qp_num` (an id resolved by the caller, its QP made by
    /// `add_cm_qpair`); ESTABLISHED then reaches `handle_cm_event`.
    pub fn connect(&mut self, qp_num: u32, param: &ConnParam) -> Result<()> {
        self.with_cm_id(qp_num, |id| id.connect(param))
    }

    /// The CM says the connection is up.
    pub fn established<H: Handler<R>>(&mut self, h: &mut H, qp_num: u32) {
        let Some(qref) = self.lookup(qp_num) else {
            return;
        };
        let q = &mut self.qpairs[qref.index as usize];
        if q.phase == QpairPhase::Connecting {
            q.phase = QpairPhase::Active;
        }
        let token = q.token;
        h.qpair_event(self, qp_num, token, QpairEvent::Active);
    }

    /// Starts tearing `qp_num` down (no-op when already draining or gone).
    pub fn disconnect<H: Handler<R>>(&mut self, h: &mut H, qp_num: u32) {
        if let Some(qref) = self.lookup(qp_num) {
            self.start_drain(h, qref, DrainReason::Requested);
        }
    }

    pub(crate) fn start_drain<H: Handler<R>>(
        &mut self,
        h: &mut H,
        qref: QpRef,
        reason: DrainReason,
    ) {
        // Also when already draining: its caller saw something (an error) worth a look.
        self.drains_changed = true;
        let now = Instant::now();
        let Some(q) = super::qpair::live_mut(&mut self.qpairs, qref) else {
            return;
        };
        if q.phase == QpairPhase::Draining {
            return;
        }
        q.phase = QpairPhase::Draining;
        let qp_num = q.qp_num;
        if let Some(id) = q.cm_id.as_mut() {
            // Tells the peer and moves the QP to ERR.
            let _ = id.disconnect();
        }
        let mut marker_posted = false;
        if let Some(qp) = q.qp.as_mut() {
            if let Err(e) = qp.modify_to_err() {
                tracing::warn!(qp_num, error = %e, "moving the QP to ERR failed");
            }
            let marker = SendWr {
                wr_id: wrid::encode(WrKind::DrainMarker, 0, qref.generation, qref.index),
                op: SendOp::Send,
                sges: &[],
                flags: SendFlags::SIGNALED,
            };
            marker_posted = qp.post_send(&[marker]).is_ok();
        }
        q.drain = Some(Drain {
            started: now,
            last_wqe: false,
            marker_done: false,
            sends_quiet_at: (!marker_posted).then_some(now),
        });
        // Capsules that never got a request will never start: their slots go back now.
        while let Some(slot) = q.waiting_capsules.pop_front(&mut self.recv.links) {
            q.outstanding = q.outstanding.saturating_sub(1);
            self.recv.release(slot);
        }
        q.in_waiting_list = false;
        let token = q.token;
        // Chains still waiting to be posted complete as flushed at the end of the poll.
        self.mark_dirty(qref);
        self.draining.push(qref);
        h.qpair_event(self, qp_num, token, QpairEvent::Draining(reason));
    }

    /// Removes every draining qpair whose drain is over.
    pub(crate) fn progress_drains<H: Handler<R>>(&mut self, h: &mut H) {
        let now = Instant::now();
        // A group tearing many qpairs down polls idle often: each pass walked every draining
        // qpair (two clock subtractions each) though none could end before its next deadline.
        if !std::mem::take(&mut self.drains_changed) && self.drain_due.is_some_and(|t| now < t) {
            return;
        }
        let mut due: Option<Instant> = None;
        let grace = self.cfg.drain_grace;
        let timeout = self.cfg.drain_timeout;
        // LAST_WQE_REACHED is raised for SRQ-attached QPs only: with per-qpair receive queues
        // the grace after the marker stands for it (late receives are orphans either way).
        let raises = self.raises_last_wqe && self.srq.is_some();
        let mut i = 0;
        while i < self.draining.len() {
            let qref = self.draining[i];
            let end = self.qpair_at(qref).and_then(|q| {
                let d = q.drain?;
                // The earliest deadline still to come that can end this drain with nothing
                // else happening (one already past changes nothing by itself any more).
                let quiet_end = d.sends_quiet_at.and_then(|t| t.checked_add(grace));
                let next = [d.started.checked_add(timeout), quiet_end]
                    .into_iter()
                    .flatten()
                    .filter(|&t| t > now)
                    .min();
                let quiet_for = d.sends_quiet_at.map(|t| now - t);
                let sends_done =
                    (d.marker_done && q.sq_used == 0) || quiet_for.is_some_and(|t| t >= grace);
                // Per-qpair receive queues: once none of the qpair's receives is posted (the QP
                // in ERR flushed them all back), the device can write none of its slots, so the
                // receive side is done without waiting out the grace.
                let receives_flushed = self.recv.posted_by(qref.index) == Some(0);
                let receives_done = d.last_wqe
                    || (!raises && (receives_flushed || quiet_for.is_some_and(|t| t >= grace)));
                Some(if sends_done && receives_done {
                    Some(if d.last_wqe { End::LastWqe } else { End::Flush })
                } else if now - d.started >= timeout {
                    Some(End::Timeout)
                } else {
                    if let Some(next) = next {
                        due = Some(due.map_or(next, |t| t.min(next)));
                    }
                    None
                })
            });
            match end {
                Some(Some(end)) => {
                    self.draining.swap_remove(i);
                    match end {
                        End::LastWqe => self.stats.drained_last_wqe += 1,
                        End::Flush => self.stats.drained_flush += 1,
                        End::Timeout => {
                            self.stats.drained_timeout += 1;
                            let q = &self.qpairs[qref.index as usize];
                            tracing::warn!(
                                qp_num = q.qp_num,
                                sq_used = q.sq_used,
                                drain = ?q.drain,
                                "drain timed out: destroying the QP anyway"
                            );
                        }
                    }
                    self.remove(h, qref, end == End::Timeout);
                }
                Some(None) => i += 1,
                // Gone already: forget it.
                None => {
                    self.draining.swap_remove(i);
                }
            }
        }
        // None (no draining qpair has a deadline in the clock's range): every pass looks.
        self.drain_due = due;
    }

    /// Destroys `qp_num` at once, without draining: out of the tree, QP destroyed. Receive
    /// completions still in flight for it become orphans and are re-posted; requests alive on
    /// it are aborted.
    pub fn destroy_qpair<H: Handler<R>>(&mut self, h: &mut H, qp_num: u32) {
        if let Some(qref) = self.lookup(qp_num) {
            self.remove(h, qref, true);
        }
    }

    fn remove<H: Handler<R>>(&mut self, h: &mut H, qref: QpRef, forced: bool) {
        let Some(q) = self.qpair_at(qref) else {
            return;
        };
        let qp_num = q.qp_num;
        // 1. Out of the tree first: from here on its receive completions are orphans.
        drop(self.tree.find_mut(&qp_num).remove());
        self.qpn_cache.remove(qp_num);
        self.draining.retain(|&d| d != qref);
        // 2. Requests still alive: marked aborted and reported; freed by `finish`.
        self.abort_requests(h, qref);
        let mut q = self.qpairs.remove(qref.index as usize);
        // 3. Receives taken but never started.
        while let Some(slot) = q.waiting_capsules.pop_front(&mut self.recv.links) {
            self.recv.release(slot);
        }
        // 4. Destroy the QP, then its CM id; its own receive slots go back to the pool.
        drop(q.qp.take());
        drop(q.cm_id.take());
        self.recv.unassign(qref.index);
        self.depth_sum = self.depth_sum.saturating_sub(q.depth);
        if self.srq.is_some() {
            self.recv.remove_peer_depth(q.depth);
        }
        self.stats.qpairs_gone += 1;
        h.qpair_event(self, qp_num, q.token, QpairEvent::Gone { forced });
    }

    /// An async event of this group's device: route it to its qpair.
    pub fn handle_async_event<H: Handler<R>>(&mut self, h: &mut H, kind: AsyncEventKind) {
        // LAST_WQE_REACHED ends a drain.
        self.drains_changed = true;
        match kind {
            AsyncEventKind::QpLastWqeReached { qp_num } => {
                let Some(qref) = self.lookup(qp_num) else {
                    return;
                };
                let q = &mut self.qpairs[qref.index as usize];
                if let Some(d) = q.drain.as_mut() {
                    d.last_wqe = true;
                } else if q.qp.as_ref().is_some_and(|qp| qp.state() == QpState::Err) {
                    // The QP went to ERR by itself: drain it, the last WQE is already done.
                    self.start_drain(h, qref, DrainReason::AsyncError);
                    if let Some(d) = self.qpairs[qref.index as usize].drain.as_mut() {
                        d.last_wqe = true;
                    }
                } else {
                    // A late event for an earlier QP with this number (qp_nums are reused):
                    // this healthy qpair is not draining.
                    self.stats.last_wqe_ignored += 1;
                    tracing::warn!(
                        qp_num,
                        "LAST_WQE_REACHED for a healthy qpair that is not draining: ignored"
                    );
                }
            }
            AsyncEventKind::QpFatal { qp_num }
            | AsyncEventKind::QpReqErr { qp_num }
            | AsyncEventKind::QpAccessErr { qp_num } => {
                tracing::warn!(qp_num, ?kind, "QP error event: draining");
                if let Some(qref) = self.lookup(qp_num) {
                    self.start_drain(h, qref, DrainReason::AsyncError);
                }
            }
            AsyncEventKind::CqErr { cq_id } if cq_id == self.cq.id() => {
                self.fail_group(h, format!("CQ_ERR on CQ {cq_id}"));
            }
            AsyncEventKind::DeviceFatal => {
                for qref in self.all_qpairs() {
                    self.start_drain(h, qref, DrainReason::AsyncError);
                }
            }
            other => tracing::debug!(?other, "async event"),
        }
    }

    fn all_qpairs(&self) -> Vec<QpRef> {
        self.qpairs
            .iter()
            .map(|(i, q)| QpRef {
                index: i as u32,
                generation: q.generation,
            })
            .collect()
    }

    /// The group's CQ failed: nothing it reaps can be trusted any more. Tell the owner, then
    /// disconnect and destroy every qpair (its requests are aborted).
    pub(crate) fn fail_group<H: Handler<R>>(&mut self, h: &mut H, error: String) {
        if self.failed.is_some() {
            return;
        }
        let in_flight = self
            .reqs
            .iter()
            .filter(|(_, r)| r.chain_in_flight())
            .count();
        tracing::error!(
            %error,
            qpairs = self.qpairs.len(),
            requests = self.reqs.len(),
            chains_in_flight = in_flight,
            "poll group failed: every qpair is torn down and its requests aborted"
        );
        self.failed = Some(error.clone());
        h.group_failed(self, &error);
        for qref in self.all_qpairs() {
            self.start_drain(h, qref, DrainReason::GroupFailed);
            self.remove(h, qref, true);
        }
    }

    /// A CM event for one of this group's qpairs.
    pub fn handle_cm_event<H: Handler<R>>(&mut self, h: &mut H, qp_num: u32, kind: &CmEventKind) {
        self.drains_changed = true;
        match kind {
            CmEventKind::Established { .. } => self.established(h, qp_num),
            CmEventKind::Disconnected
            | CmEventKind::Rejected { .. }
            | CmEventKind::Unreachable
            | CmEventKind::ConnectError
            | CmEventKind::DeviceRemoval => {
                if let Some(qref) = self.lookup(qp_num) {
                    self.start_drain(h, qref, DrainReason::PeerDisconnected);
                }
            }
            _ => {}
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum End {
    LastWqe,
    Flush,
    Timeout,
}
