//! Qpairs in and out of a poll group: connecting -> active -> draining -> gone.
//!
//! Draining: QP to ERR (CM disconnect when there is an id), a zero-length marker SEND that
//! flushes back once every earlier send has; then the qpair waits until no sends are
//! outstanding, no request is alive, and either LAST_WQE_REACHED arrived or — on devices that
//! never raise it (rxe, iWARP, the soft device with the flag off) — the marker came back and a
//! short grace passed; or the drain timeout fires. Removal takes the qpair out of the RB-tree
//! BEFORE its QP is destroyed, re-posts the receives it had taken but not started, and frees
//! requests still alive. Receive completions that arrive later for its qp_num are orphans and
//! go straight back to the SRQ.

use std::time::Instant;

use crate::cm::CmId;
use crate::device::{Qp, QpInitAttr};
use crate::error::{Result, TransportError};
use crate::types::{AsyncEventKind, CmEventKind, ConnParam, QpCaps, SendFlags, SendOp, SendWr};

use super::PollGroup;
use super::qpair::{Drain, DrainReason, Qpair, QpairPhase};
use super::request::Handler;
use super::wrid::{self, WrKind};

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
    /// queue for `depth` commands.
    fn qp_caps(&self) -> QpCaps {
        QpCaps {
            max_send_wr: self.cfg.max_send_wr(),
            max_recv_wr: 0,
            max_send_sge: super::MAX_WR_SGES as u32,
            max_recv_sge: 1,
            max_inline_data: 64,
        }
    }

    /// Whether a qpair of `depth` fits in this group now.
    pub fn check_room(&self, depth: u32) -> Result<()> {
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

    /// A QP on this group's CQ and SRQ, in RESET, for a caller that connects it by hand
    /// (pingpong style) and then hands it over with `add_qp`.
    pub fn create_qp(&mut self) -> Result<Qp> {
        let caps = self.qp_caps();
        let qp = self.pd.create_qp(&QpInitAttr {
            send_cq: &self.cq,
            recv_cq: &self.cq,
            srq: Some(&self.srq),
            caps,
            sq_sig_all: false,
        })?;
        self.note_inline(&qp);
        Ok(qp)
    }

    fn insert(&mut self, q: Box<Qpair>) {
        self.tree.insert(q);
        self.qpairs += 1;
        self.stats.qpairs_added += 1;
    }

    fn note_inline(&mut self, qp: &Qp) {
        let granted = qp.caps().max_inline_data;
        self.max_inline = if self.qpair_count() == 0 {
            granted
        } else {
            self.max_inline.min(granted)
        };
    }

    /// Takes a connected QP made by `create_qp` into the tree as an active qpair.
    pub fn add_qp(&mut self, qp: Qp, depth: u32, token: u64) -> Result<u32> {
        self.check_room(depth)?;
        let qp_num = qp.qp_num();
        if self.tree.find(&qp_num).get().is_some() {
            return Err(TransportError::InvalidArgument(format!(
                "qp_num {qp_num:#x} is already in this group"
            )));
        }
        let q = Qpair::new(qp, None, depth, self.cfg.max_send_wr(), token);
        q.st.borrow_mut().phase = QpairPhase::Active;
        self.insert(q);
        Ok(qp_num)
    }

    /// Creates the QP of a CM connection on this group's CQ and SRQ and takes it into the tree
    /// (connecting). The caller then `accept`s (server) or `connect`s (client) through the group.
    /// On failure the id comes back, so the caller can still reject with its own private data.
    pub fn add_cm_qpair(
        &mut self,
        mut id: CmId,
        depth: u32,
        token: u64,
    ) -> Result<u32, AddQpairError> {
        if let Err(error) = self.check_room(depth) {
            return Err(AddQpairError { error, id });
        }
        let caps = self.qp_caps();
        let qp = match id.create_qp(
            &self.pd,
            &QpInitAttr {
                send_cq: &self.cq,
                recv_cq: &self.cq,
                srq: Some(&self.srq),
                caps,
                sq_sig_all: false,
            },
        ) {
            Ok(qp) => qp,
            Err(error) => return Err(AddQpairError { error, id }),
        };
        self.note_inline(&qp);
        let qp_num = qp.qp_num();
        id.set_token(token);
        self.insert(Qpair::new(
            qp,
            Some(id),
            depth,
            self.cfg.max_send_wr(),
            token,
        ));
        Ok(qp_num)
    }

    /// Runs `f` on `qp_num`'s CM id (accept, reject, connect).
    pub fn with_cm_id<T>(
        &mut self,
        qp_num: u32,
        f: impl FnOnce(&mut CmId) -> Result<T>,
    ) -> Result<T> {
        self.with_qpair(qp_num, |st| match st.cm_id.as_mut() {
            Some(id) => f(id),
            None => Err(TransportError::InvalidArgument(format!(
                "qpair {qp_num:#x} has no CM id"
            ))),
        })
        .unwrap_or_else(|| {
            Err(TransportError::InvalidArgument(format!(
                "no qpair {qp_num:#x}"
            )))
        })
    }

    pub fn accept(&mut self, qp_num: u32, param: &ConnParam) -> Result<()> {
        self.with_cm_id(qp_num, |id| id.accept(param))
    }

    /// The CM says the connection is up.
    pub fn established<H: Handler<R>>(&mut self, h: &mut H, qp_num: u32) {
        let token = self.with_qpair(qp_num, |st| {
            if st.phase == QpairPhase::Connecting {
                st.phase = QpairPhase::Active;
            }
            st.token
        });
        if let Some(token) = token {
            h.qpair_event(self, qp_num, token, QpairEvent::Active);
        }
    }

    /// Starts tearing `qp_num` down (no-op when already draining or gone).
    pub fn disconnect<H: Handler<R>>(&mut self, h: &mut H, qp_num: u32) {
        self.start_drain(h, qp_num, DrainReason::Requested);
    }

    pub(crate) fn start_drain<H: Handler<R>>(
        &mut self,
        h: &mut H,
        qp_num: u32,
        reason: DrainReason,
    ) {
        let now = Instant::now();
        let started = self.with_qpair(qp_num, |st| {
            if st.phase == QpairPhase::Draining {
                return None;
            }
            st.phase = QpairPhase::Draining;
            if let Some(id) = st.cm_id.as_mut() {
                // Tells the peer and moves the QP to ERR.
                let _ = id.disconnect();
            }
            let qp = st.qp.as_mut()?;
            if let Err(e) = qp.modify_to_err() {
                tracing::warn!(qp_num, error = %e, "moving the QP to ERR failed");
            }
            let marker = SendWr {
                wr_id: wrid::encode(WrKind::DrainMarker, qp_num),
                op: SendOp::Send,
                sges: &[],
                flags: SendFlags::SIGNALED,
            };
            let marker_posted = qp.post_send(&[marker]).is_ok();
            if marker_posted {
                st.chain_posted(1);
            }
            st.drain = Some(Drain {
                started: now,
                last_wqe: false,
                marker_done: false,
                marker_posted,
                marker_at: None,
            });
            // Capsules that never got a request will never start: their slots go back now.
            let waiting: Vec<(u32, u32)> = st.waiting.drain(..).collect();
            st.outstanding = st.outstanding.saturating_sub(waiting.len() as u32);
            Some((st.token, waiting))
        });
        if let Some(Some((token, waiting))) = started {
            for (slot, _) in waiting {
                self.recv.queue_repost(slot);
            }
            self.draining.push(qp_num);
            h.qpair_event(self, qp_num, token, QpairEvent::Draining(reason));
        }
    }

    /// Removes every draining qpair whose drain is over.
    pub(crate) fn progress_drains<H: Handler<R>>(&mut self, h: &mut H) {
        let now = Instant::now();
        let grace = self.cfg.drain_grace;
        let timeout = self.cfg.drain_timeout;
        let raises = self.raises_last_wqe;
        let mut i = 0;
        while i < self.draining.len() {
            let qp_num = self.draining[i];
            let state = self.with_qpair(qp_num, |st| {
                let d = st.drain?;
                let quiet = st.sends_outstanding == 0 && st.requests == 0;
                let receives_done = d.last_wqe
                    || (!raises
                        && (d.marker_done || !d.marker_posted)
                        && d.marker_at.is_none_or(|t| now - t >= grace));
                if quiet && receives_done {
                    Some(Some(if d.last_wqe { End::LastWqe } else { End::Flush }))
                } else if now - d.started >= timeout {
                    Some(Some(End::Timeout))
                } else {
                    Some(None)
                }
            });
            match state {
                Some(Some(Some(end))) => {
                    self.draining.swap_remove(i);
                    match end {
                        End::LastWqe => self.stats.drained_last_wqe += 1,
                        End::Flush => self.stats.drained_flush += 1,
                        End::Timeout => {
                            self.stats.drained_timeout += 1;
                            tracing::warn!(qp_num, "drain timed out: destroying the QP anyway");
                        }
                    }
                    self.remove(h, qp_num, end == End::Timeout);
                }
                Some(Some(None)) => i += 1,
                // Gone already, or not draining: forget it.
                _ => {
                    self.draining.swap_remove(i);
                }
            }
        }
    }

    /// Destroys `qp_num` at once, without draining: out of the tree, QP destroyed. Receive
    /// completions still in flight for it become orphans and are re-posted.
    pub fn destroy_qpair<H: Handler<R>>(&mut self, h: &mut H, qp_num: u32) {
        self.draining.retain(|&q| q != qp_num);
        self.remove(h, qp_num, true);
    }

    fn remove<H: Handler<R>>(&mut self, h: &mut H, qp_num: u32, forced: bool) {
        // 1. Out of the tree first: from here on its completions are orphans.
        let Some(q) = self.tree.find_mut(&qp_num).remove() else {
            return;
        };
        self.qpairs -= 1;
        // 2. Requests still alive: the handler hears, then they are freed (buffers, slots).
        self.abort_requests(h, qp_num);
        let mut st = q.st.into_inner();
        // 3. Receives taken but never started.
        for (slot, _) in st.waiting.drain(..) {
            self.recv.queue_repost(slot);
        }
        // 4. Destroy the QP, then its CM id.
        drop(st.qp.take());
        drop(st.cm_id.take());
        self.stats.qpairs_gone += 1;
        h.qpair_event(self, qp_num, st.token, QpairEvent::Gone { forced });
    }

    /// An async event of this group's device: route it to its qpair.
    pub fn handle_async_event<H: Handler<R>>(&mut self, h: &mut H, kind: AsyncEventKind) {
        match kind {
            AsyncEventKind::QpLastWqeReached { qp_num } => {
                let draining = self.with_qpair(qp_num, |st| {
                    if let Some(d) = st.drain.as_mut() {
                        d.last_wqe = true;
                    }
                    st.drain.is_some()
                });
                if draining == Some(false) {
                    // The QP went to ERR by itself: drain it, the last WQE is already done.
                    self.start_drain(h, qp_num, DrainReason::AsyncError);
                    self.with_qpair(qp_num, |st| st.drain.as_mut().map(|d| d.last_wqe = true));
                }
            }
            AsyncEventKind::QpFatal { qp_num }
            | AsyncEventKind::QpReqErr { qp_num }
            | AsyncEventKind::QpAccessErr { qp_num } => {
                tracing::warn!(qp_num, ?kind, "QP error event: draining");
                self.start_drain(h, qp_num, DrainReason::AsyncError);
            }
            AsyncEventKind::DeviceFatal => {
                let all: Vec<u32> = self.tree.iter().map(|q| q.qp_num).collect();
                for qp_num in all {
                    self.start_drain(h, qp_num, DrainReason::AsyncError);
                }
            }
            other => tracing::debug!(?other, "async event"),
        }
    }

    /// A CM event for one of this group's qpairs.
    pub fn handle_cm_event<H: Handler<R>>(&mut self, h: &mut H, qp_num: u32, kind: &CmEventKind) {
        match kind {
            CmEventKind::Established { .. } => self.established(h, qp_num),
            CmEventKind::Disconnected
            | CmEventKind::Rejected { .. }
            | CmEventKind::Unreachable
            | CmEventKind::ConnectError
            | CmEventKind::DeviceRemoval => {
                self.start_drain(h, qp_num, DrainReason::PeerDisconnected)
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
