//! Where every completion goes.
//!
//! One `poll` reaps up to `batch` completions, then:
//! - RECV: the slot's qpair is looked up by `wc.qp_num` in the RB-tree. Not found: an orphan
//!   (a late completion for a destroyed QP): the slot is re-posted at once and counted. Found
//!   and draining: re-posted and counted as discarded. Found and active: flow control (a host
//!   past its negotiated depth is disconnected), then a request object and up to the handler —
//!   or, with none free, the capsule waits on its qpair.
//! - SEND / READ / WRITE: send-queue accounting on the qpair, then the request's chain; an
//!   error starts draining the qpair.
//! - DRAIN MARKER: the qpair's send queue has flushed.
//!
//! At the end of the poll, queued sends are posted per qpair as lists, receive slots are
//! re-posted to the SRQ as lists, and draining qpairs are checked.

use crate::error::Result;
use crate::types::{WcStatus, WorkCompletion};

use super::qpair::{DrainReason, QpairPhase};
use super::request::{Handler, ReqId};
use super::wrid::{self, WrKind};
use super::{MAX_BATCH, PollGroup};

impl<R: Default> PollGroup<R> {
    /// One pass: reap, dispatch, post. Returns the completions handled (0 = idle).
    pub fn poll<H: Handler<R>>(&mut self, h: &mut H) -> Result<usize> {
        let mut wcs = [WorkCompletion::default(); MAX_BATCH];
        let mut n = 0;
        // Completions carried over (failed posts, arm's re-check) come first.
        while n < self.cfg.batch {
            match self.carried.pop_front() {
                Some(wc) => {
                    wcs[n] = wc;
                    n += 1;
                }
                None => break,
            }
        }
        n += self.cq.poll(&mut wcs[n..self.cfg.batch])?;
        self.stats.polls += 1;
        if n == 0 {
            self.stats.idle_polls += 1;
        }
        self.stats.completions += n as u64;
        for wc in &wcs[..n] {
            self.dispatch(h, wc);
        }
        if !self.waiting.is_empty() {
            self.run_waiting(h);
        }
        if !self.dirty.is_empty() {
            self.flush_sends();
        }
        if self.recv.queued() > 0 {
            let calls = match self.recv.flush(&self.srq) {
                Ok(c) => c,
                Err(e) => {
                    // The SRQ refused: keep the slots queued and try again next poll.
                    tracing::warn!(error = %e, "re-posting receive slots failed");
                    1
                }
            };
            self.stats.recv_post_calls += calls as u64;
        }
        if !self.draining.is_empty() {
            self.progress_drains(h);
        }
        Ok(n)
    }

    fn dispatch<H: Handler<R>>(&mut self, h: &mut H, wc: &WorkCompletion) {
        if wc.status != WcStatus::Success {
            self.stats.error_completions += 1;
        }
        match wrid::decode(wc.wr_id) {
            Some((WrKind::Recv, slot)) => self.on_recv(h, wc, slot),
            Some((kind @ (WrKind::Send | WrKind::Read | WrKind::Write), req)) => {
                self.on_send_side(h, wc, kind, ReqId(req))
            }
            Some((WrKind::DrainMarker, _)) => self.on_marker(wc),
            None => tracing::warn!(
                wr_id = wc.wr_id,
                qp_num = wc.qp_num,
                "completion with a foreign wr_id"
            ),
        }
    }

    fn on_recv<H: Handler<R>>(&mut self, h: &mut H, wc: &WorkCompletion, slot: u32) {
        if !self.recv.completed(slot, wc.byte_len) {
            tracing::warn!(slot, "receive completion for a slot that does not exist");
            return;
        }
        let qp_num = wc.qp_num;
        let verdict = self.with_qpair(qp_num, |st| {
            if wc.status != WcStatus::Success {
                return Verdict::Error;
            }
            match st.phase {
                QpairPhase::Draining => Verdict::Discard,
                QpairPhase::Connecting | QpairPhase::Active => {
                    // A capsule may beat our ESTABLISHED event: the host is connected.
                    st.phase = QpairPhase::Active;
                    if st.outstanding >= st.depth {
                        return Verdict::Overrun;
                    }
                    st.outstanding += 1;
                    Verdict::Deliver
                }
            }
        });
        match verdict {
            None => {
                self.stats.orphans += 1;
                self.recv.queue_repost(slot);
            }
            Some(Verdict::Error) => {
                self.recv.queue_repost(slot);
                self.start_drain(h, qp_num, DrainReason::ErrorCompletion);
            }
            Some(Verdict::Discard) => {
                self.stats.discarded += 1;
                self.recv.queue_repost(slot);
            }
            Some(Verdict::Overrun) => {
                self.stats.overruns += 1;
                self.recv.queue_repost(slot);
                tracing::warn!(
                    qp_num,
                    "host sent more commands than the negotiated queue depth: disconnecting"
                );
                self.start_drain(h, qp_num, DrainReason::Overrun);
            }
            Some(Verdict::Deliver) => self.deliver(h, qp_num, slot),
        }
    }

    /// Hands a capsule up, or parks it on its qpair when no request object is free.
    fn deliver<H: Handler<R>>(&mut self, h: &mut H, qp_num: u32, slot: u32) {
        match self.new_request(qp_num, slot) {
            Some(req) => {
                self.stats.capsules += 1;
                h.capsule(self, req);
            }
            None => {
                self.stats.queued_for_request += 1;
                let len = self.recv.bytes(slot).len() as u32;
                let first = self
                    .with_qpair(qp_num, |st| {
                        st.waiting.push_back((slot, len));
                        st.waiting.len() == 1
                    })
                    .unwrap_or(false);
                if first {
                    self.waiting.push_back(qp_num);
                }
            }
        }
    }

    /// Capsules that waited for a request object, oldest qpair first.
    fn run_waiting<H: Handler<R>>(&mut self, h: &mut H) {
        while self.reqs.len() < self.cfg.max_requests as usize {
            let Some(qp_num) = self.waiting.pop_front() else {
                break;
            };
            let next = self.with_qpair(qp_num, |st| {
                let head = st.waiting.pop_front();
                (head, !st.waiting.is_empty())
            });
            let Some((Some((slot, _len)), more)) = next else {
                continue;
            };
            if more {
                self.waiting.push_back(qp_num);
            }
            if let Some(req) = self.new_request(qp_num, slot) {
                self.stats.capsules += 1;
                h.capsule(self, req);
            }
        }
    }

    fn on_send_side<H: Handler<R>>(
        &mut self,
        h: &mut H,
        wc: &WorkCompletion,
        kind: WrKind,
        req: ReqId,
    ) {
        let ok = wc.status == WcStatus::Success;
        self.with_qpair(wc.qp_num, |st| {
            if ok {
                st.run_completed()
            } else {
                st.wr_failed()
            }
        });
        if !ok && wc.status != WcStatus::WrFlushErr {
            tracing::debug!(qp_num = wc.qp_num, status = ?wc.status, ?kind, "work request failed");
        }
        if !ok {
            self.start_drain(h, wc.qp_num, DrainReason::ErrorCompletion);
        }
        if let Some(status) = self.chain_progress(req, wc.qp_num, wc.status) {
            h.chain_done(self, req, kind, status);
        }
    }

    fn on_marker(&mut self, wc: &WorkCompletion) {
        let now = std::time::Instant::now();
        self.with_qpair(wc.qp_num, |st| {
            if wc.status == WcStatus::Success {
                st.run_completed();
            } else {
                st.wr_failed();
            }
            if let Some(d) = st.drain.as_mut() {
                d.marker_done = true;
                d.marker_at = Some(now);
            }
        });
    }

    /// Posts each dirty qpair's queued WRs as lists.
    fn flush_sends(&mut self) {
        const CHUNK: usize = 16;
        let dirty = std::mem::take(&mut self.dirty);
        for &qp_num in &dirty {
            let failed = self.with_qpair(qp_num, |st| {
                st.dirty = false;
                let mut failed = 0..0;
                let super::qpair::QpairState { qp, queued, .. } = st;
                if let Some(qp) = qp.as_mut() {
                    let mut at = 0;
                    while at < queued.len() {
                        let end = (at + CHUNK).min(queued.len());
                        let wrs: [_; CHUNK] =
                            std::array::from_fn(|i| queued[(at + i).min(end - 1)].as_wr());
                        if let Err(e) = qp.post_send(&wrs[..end - at]) {
                            tracing::warn!(qp_num, error = %e, "posting sends failed");
                            failed = at + e.failed_index..queued.len();
                            break;
                        }
                        at = end;
                    }
                } else {
                    failed = 0..queued.len();
                }
                let ids: Vec<u64> = queued[failed].iter().map(|w| w.wr_id).collect();
                queued.clear();
                ids
            });
            // WRs that never reached the QP complete in error next poll, like a flush would.
            for wr_id in failed.unwrap_or_default() {
                self.carried.push_back(WorkCompletion {
                    wr_id,
                    status: WcStatus::GeneralErr,
                    qp_num,
                    ..WorkCompletion::default()
                });
            }
        }
        self.dirty = dirty;
        self.dirty.clear();
    }
}

enum Verdict {
    Deliver,
    Discard,
    Overrun,
    Error,
}
