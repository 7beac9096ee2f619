//! Where every completion goes.
//!
//! One `poll` reaps up to `batch` completions, then:
//! - RECV: the slot must be Posted (else counted, left alone); its qpair is looked up by
//!   `wc.qp_num` in the RB-tree (the one lookup per capsule). Not found: an orphan (a late
//!   completion for a destroyed QP): the slot is re-posted and counted. Draining: re-posted and
//!   counted as discarded. Active: flow control (a host past its negotiated depth is
//!   disconnected), then a request object and up to the handler, or, with none free, the
//!   capsule waits in its qpair's FIFO.
//! - SEND / READ / WRITE: the request by slab index, checked by generation and state (a stale
//!   completion is counted and dropped), the silent chains posted before it on its qpair (done:
//!   see `silent.rs`), its chain's accounting, and its qpair by the slab index the request holds
//!   (no lookup); an error starts draining the qpair.
//! - DRAIN MARKER: the qpair's send queue has flushed; every WR posted before it is done.
//!
//! At the end of the poll: capsules waiting for request objects, requests waiting for
//! buffers, then chains are posted per qpair as lists while they fit (send-queue slots and
//! RDMA READ depth; one completion per list where its chains allow), receive slots are re-posted to the SRQ as lists, and draining qpairs are
//! checked.

use arrayvec::ArrayVec;

use crate::error::{Result, TransportError};
use crate::types::{SendWr, WcStatus, WorkCompletion};

use super::chain::{MAX_CHAIN_WRS, Retired};
use super::qpair::{DrainReason, QpRef, QpairPhase, live_mut};
use super::request::{Handler, RequestState};
use super::silent::silence;
use super::wrid::{self, WrId, WrKind};
use super::{MAX_BATCH, PollGroup, RecvRepost};

/// Most WRs per send post call (at least one whole chain).
const POST_WRS: usize = 32;
const _: () = assert!(POST_WRS >= super::MAX_CHAIN_WRS);
// A list's silent chains are bits of a u32 (at most one chain per WR).
const _: () = assert!(POST_WRS <= u32::BITS as usize);

impl<R: Default> PollGroup<R> {
    /// One pass: reap, dispatch, post. Returns the completions handled (0 = idle). A failing
    /// CQ poll fails the group (`Handler::group_failed`, every qpair torn down) and is
    /// returned once; a failed group polls as idle.
    pub fn poll<H: Handler<R>>(&mut self, h: &mut H) -> Result<usize> {
        if self.failed.is_some() {
            return Ok(0);
        }
        // Taken for the pass (the handler's callbacks get the group); never shorter than
        // MAX_BATCH unless a callback polled the group from inside a poll.
        let mut wcs = std::mem::take(&mut self.wcs);
        if wcs.len() < MAX_BATCH {
            wcs.resize(MAX_BATCH, WorkCompletion::default());
        }
        if self.cfg.recv_repost == RecvRepost::NextPass && self.recv.queued() > 0 {
            // The last poll's slots, after what the application submitted since.
            self.flush_recvs();
        }
        let mut n = 0;
        // Completions carried over (arm's re-check) come first.
        while n < self.cfg.batch {
            match self.carried.pop_front() {
                Some(wc) => {
                    wcs[n] = wc;
                    n += 1;
                }
                None => break,
            }
        }
        match self.cq.poll(&mut wcs[n..self.cfg.batch]) {
            Ok(k) => n += k,
            Err(e) => {
                self.wcs = wcs;
                self.fail_group(h, format!("polling the CQ failed: {e}"));
                return Err(e);
            }
        }
        self.stats.polls += 1;
        if n == 0 {
            self.stats.idle_polls += 1;
            // Quiet for a while: what silent chains hold goes back (`silent.rs`).
            self.idle_streak += 1;
            if self.idle_streak == self.cfg.silent_flush_idle_polls && self.held.requests > 0 {
                self.flush_silent();
            }
        } else {
            self.idle_streak = 0;
        }
        self.stats.completions += n as u64;
        // The capsules of the batch were written by the peer's core: start every line's
        // transfer before the first is read.
        for wc in &wcs[..n] {
            if let Some(id) = wrid::decode(wc.wr_id).filter(|id| id.kind == WrKind::Recv) {
                self.recv.prefetch(id.index);
            }
        }
        for wc in &wcs[..n] {
            self.dispatch(h, wc);
        }
        self.wcs = wcs;
        if !self.waiting.is_empty() {
            self.run_waiting(h);
        }
        if !self.buf_wait.is_empty() {
            self.serve_buffer_waiters(h);
        }
        if !self.dirty.is_empty() {
            self.flush_sends(h);
        }
        if !self.completed.is_empty() {
            self.report_completed(h);
        }
        if self.cfg.recv_repost == RecvRepost::EndOfPass && self.recv.queued() > 0 {
            self.flush_recvs();
        }
        if !self.draining.is_empty() {
            // Completions (a marker, a flushed send or receive) can end a drain.
            self.drains_changed |= n > 0;
            self.progress_drains(h);
        }
        Ok(n)
    }

    fn dispatch<H: Handler<R>>(&mut self, h: &mut H, wc: &WorkCompletion) {
        if wc.status != WcStatus::Success {
            self.stats.error_completions += 1;
        }
        let Some(id) = wrid::decode(wc.wr_id) else {
            self.stats.kind_mismatches += 1;
            tracing::warn!(
                wr_id = wc.wr_id,
                qp_num = wc.qp_num,
                "completion with a foreign wr_id"
            );
            return;
        };
        // Verbs defines the opcode of successful completions only: errors go by wr_id.
        if wc.status == WcStatus::Success && !id.kind.matches(wc.opcode) {
            self.stats.kind_mismatches += 1;
            tracing::warn!(?id, opcode = ?wc.opcode, "completion opcode does not fit its wr_id");
            return;
        }
        match id.kind {
            WrKind::Recv => self.on_recv(h, wc, id.index),
            WrKind::Send | WrKind::Read | WrKind::Write | WrKind::KeyOp => {
                self.on_send_side(h, wc, id)
            }
            WrKind::DrainMarker => self.on_marker(h, wc, id),
            WrKind::SilentFlush => self.on_silent_flush(h, wc, id),
        }
    }

    /// Re-posts queued receive slots: to the SRQ, or to each owning qpair's QP.
    pub(super) fn flush_recvs(&mut self) {
        let calls = match &self.srq {
            Some(srq) => match self.recv.flush(srq) {
                Ok(c) => c,
                Err(e) => {
                    // The SRQ refused: keep the slots queued and try again next poll.
                    tracing::warn!(error = %e, "re-posting receive slots failed");
                    1
                }
            },
            None => {
                let qpairs = &mut self.qpairs;
                self.recv.flush_per_qpair(|owner, wrs| {
                    // A draining QP would flush them straight back: they wait for its end.
                    let q = qpairs
                        .get_mut(owner as usize)
                        .filter(|q| q.phase != QpairPhase::Draining);
                    match q.and_then(|q| q.qp.as_mut()) {
                        Some(qp) => qp.post_recv(wrs),
                        None => Err(crate::error::PostError {
                            failed_index: 0,
                            error: TransportError::InvalidArgument("no QP".into()),
                        }),
                    }
                })
            }
        };
        self.stats.recv_post_calls += calls as u64;
    }

    fn on_recv<H: Handler<R>>(&mut self, h: &mut H, wc: &WorkCompletion, slot: u32) {
        if self.recv.state(slot) == Some(super::SlotState::Free) {
            // Per-qpair mode: its qpair went and the slot went back to the pool.
            self.stats.orphans += 1;
            return;
        }
        if !self.recv.completed(slot, wc.byte_len) {
            self.stats.recv_slot_errors += 1;
            tracing::error!(
                slot,
                state = ?self.recv.state(slot),
                "receive completion for a slot that is not posted"
            );
            return;
        }
        let Some(qref) = self.lookup(wc.qp_num) else {
            self.stats.orphans += 1;
            self.recv.release(slot);
            return;
        };
        let q = live_mut(&mut self.qpairs, qref).expect("the tree names live qpairs");
        if wc.status != WcStatus::Success {
            self.recv.release(slot);
            self.start_drain(h, qref, DrainReason::ErrorCompletion);
            return;
        }
        match q.phase {
            QpairPhase::Draining => {
                self.stats.discarded += 1;
                self.recv.release(slot);
            }
            QpairPhase::Connecting | QpairPhase::Active if self.role == super::Role::Host => {
                q.phase = QpairPhase::Active;
                let (qp_num, token) = (q.qp_num, q.token);
                self.stats.capsules += 1;
                self.response_invalidated = wc.invalidated_rkey;
                self.on_response(h, qp_num, token, slot);
                self.response_invalidated = None;
            }
            QpairPhase::Connecting | QpairPhase::Active => {
                // A capsule may beat our ESTABLISHED event: the host is connected.
                q.phase = QpairPhase::Active;
                if q.outstanding >= q.depth {
                    self.stats.overruns += 1;
                    self.recv.release(slot);
                    tracing::warn!(
                        qp_num = wc.qp_num,
                        "host sent more commands than the negotiated queue depth: disconnecting"
                    );
                    self.start_drain(h, qref, DrainReason::Overrun);
                    return;
                }
                q.outstanding += 1;
                let behind = !q.waiting_capsules.is_empty();
                if behind {
                    // Keep the host's order: earlier capsules still wait for requests.
                    q.waiting_capsules.push_back(&mut self.recv.links, slot);
                    self.stats.queued_for_request += 1;
                    return;
                }
                self.deliver(h, qref, slot);
            }
        }
    }

    /// Hands a capsule up, or parks it on its qpair when no request object is free.
    fn deliver<H: Handler<R>>(&mut self, h: &mut H, qref: QpRef, slot: u32) {
        match self.new_request(qref, slot) {
            Some(req) => {
                self.stats.capsules += 1;
                h.capsule(self, req);
            }
            None => {
                self.stats.queued_for_request += 1;
                let Some(q) = live_mut(&mut self.qpairs, qref) else {
                    self.recv.release(slot);
                    return;
                };
                q.waiting_capsules.push_back(&mut self.recv.links, slot);
                if !q.in_waiting_list {
                    q.in_waiting_list = true;
                    self.waiting.push_back(qref);
                }
            }
        }
    }

    /// Capsules that waited for a request object, oldest qpair first.
    fn run_waiting<H: Handler<R>>(&mut self, h: &mut H) {
        while self.reqs.len() < self.cfg.max_requests as usize {
            let Some(qref) = self.waiting.pop_front() else {
                break;
            };
            let Some(q) = live_mut(&mut self.qpairs, qref) else {
                continue;
            };
            let Some(slot) = q.waiting_capsules.pop_front(&mut self.recv.links) else {
                q.in_waiting_list = false;
                continue;
            };
            if q.waiting_capsules.is_empty() {
                q.in_waiting_list = false;
            } else {
                self.waiting.push_back(qref);
            }
            if let Some(req) = self.new_request(qref, slot) {
                self.stats.capsules += 1;
                h.capsule(self, req);
            }
        }
    }

    fn on_send_side<H: Handler<R>>(&mut self, h: &mut H, wc: &WorkCompletion, id: WrId) {
        let index = id.index;
        let live = self.req_generation.get(index as usize) == Some(&id.generation)
            && self.reqs.get(index as usize).is_some_and(|r| {
                !r.aborted() && r.state == RequestState::Posted && r.qp_num() == wc.qp_num
            })
            && self.chains[index as usize].kind_at(id.position) == Some(id.kind);
        if !live {
            self.stats.stale_completions += 1;
            tracing::debug!(?id, qp_num = wc.qp_num, status = ?wc.status, "stale send-side completion dropped");
            return;
        }
        let qref = self.reqs[index as usize].qpair;
        if live_mut(&mut self.qpairs, qref).is_some_and(|q| !q.silent.is_empty()) {
            self.retire_silent_before(h, qref, index);
            // The handler heard of those chains: what it called may have ended this request
            // or its qpair meanwhile.
            let live = self.req_generation[index as usize] == id.generation
                && self
                    .reqs
                    .get(index as usize)
                    .is_some_and(|r| !r.aborted() && r.state == RequestState::Posted);
            if !live {
                return;
            }
        }
        let chain = &mut self.chains[index as usize];
        let retired = chain.retire_through(id.position, wc.status);
        let over = chain.is_over();
        self.retired_on(qref, retired);
        if wc.status != WcStatus::Success {
            if wc.status != WcStatus::WrFlushErr {
                tracing::debug!(qp_num = wc.qp_num, status = ?wc.status, ?id, "work request failed");
            }
            self.start_drain(h, qref, DrainReason::ErrorCompletion);
        }
        if over {
            self.chain_over(h, index);
        }
    }

    /// WRs left `qref`'s send queue: room for whatever waits there.
    // Once per send completion: out of line it costs more than the lookup it saves.
    #[inline(always)]
    pub(super) fn retired_on(&mut self, qref: QpRef, retired: Retired) {
        if let Some(q) = live_mut(&mut self.qpairs, qref) {
            q.release(retired.wrs, retired.reads);
            super::mark_dirty_held(&mut self.dirty, q, qref.index);
        }
    }

    fn on_marker<H: Handler<R>>(&mut self, h: &mut H, wc: &WorkCompletion, id: WrId) {
        let qref = QpRef {
            index: id.index,
            generation: id.generation,
        };
        let now = std::time::Instant::now();
        let Some(q) = self.qpair_at_mut(qref).filter(|q| q.qp_num == wc.qp_num) else {
            self.stats.stale_completions += 1;
            return;
        };
        if let Some(d) = q.drain.as_mut() {
            d.marker_done = true;
            d.sends_quiet_at = Some(now);
        }
        // Every WR posted before the marker is done: unsignaled ones whose signaled tail
        // never reached the QP (a partly posted chain, silent chains) are retired here.
        self.clear_silent(qref);
        let posted: Vec<u32> = self
            .reqs
            .iter()
            .filter(|(_, r)| r.qpair == qref && !r.aborted() && r.state == RequestState::Posted)
            .map(|(i, _)| i as u32)
            .collect();
        for index in posted {
            let retired = self.chains[index as usize].retire_all();
            self.retired_on(qref, retired);
            self.chain_over(h, index);
        }
    }

    /// Posts the chains waiting for their qpairs now, as the end of `poll` does, without
    /// reaping the CQ: for a submitter whose batch should leave at once, not at its next poll
    /// (over a stream fabric a held acknowledgement then rides on it). A failed group posts
    /// nothing.
    pub fn post_waiting<H: Handler<R>>(&mut self, h: &mut H) {
        if self.failed.is_some() {
            return;
        }
        if !self.dirty.is_empty() {
            self.flush_sends(h);
        }
        if !self.completed.is_empty() {
            self.report_completed(h);
        }
    }

    /// Posts each dirty qpair's waiting chains, in order, while they fit.
    fn flush_sends<H: Handler<R>>(&mut self, h: &mut H) {
        // Handlers called from here may dirty qpairs again: pop until none is left.
        while let Some(index) = self.dirty.pop() {
            let Some(q) = self.qpairs.get_mut(index as usize) else {
                continue;
            };
            q.dirty = false;
            let qref = QpRef {
                index,
                generation: q.generation,
            };
            if q.phase == QpairPhase::Draining || q.qp.is_none() {
                self.flush_to_post(h, qref);
            } else {
                self.post_to_qp(h, qref);
            }
        }
    }

    /// The qpair is draining: chains waiting never reach the QP; they complete as flushed.
    fn flush_to_post<H: Handler<R>>(&mut self, h: &mut H, qref: QpRef) {
        loop {
            let Some(q) = live_mut(&mut self.qpairs, qref) else {
                return;
            };
            let Some(index) = q.to_post.pop_front(&mut self.req_links) else {
                return;
            };
            self.reqs[index as usize].state = RequestState::Posted;
            self.chains[index as usize].refused_from(0, WcStatus::WrFlushErr);
            self.chain_over(h, index);
        }
    }

    fn post_to_qp<H: Handler<R>>(&mut self, h: &mut H, qref: QpRef) {
        // The last list went with `post_send_more`: its transmission waits for the next one.
        let mut held = false;
        loop {
            // Read before the qpair is borrowed; the last list's silent chains are in it.
            let room = self.silent_room();
            // Only the entries used are written.
            let mut batch = ArrayVec::<u32, POST_WRS>::new();
            // The FIFO emptied into this batch: no pass after it (nothing below adds to it).
            let emptied;
            // Bit k: `batch[k]` was posted without a completion of its own.
            let silent;
            // The batch ended at the list's length, with the next chain fitting the send
            // queue: the next turn of this loop posts it at once.
            let more;
            // One pass over the FIFO with the qpair looked up once: with many qpairs each
            // holds a chain or two per poll, so what costs per qpair (not per WR) counts.
            let (posted, fault, at) = {
                let Some(q) = self.qpairs.get_mut(qref.index as usize) else {
                    return;
                };
                let mut wrs = ArrayVec::<SendWr, POST_WRS>::new();
                // Where each chain of the batch ends in `wrs` (its signaled WR).
                let mut ends = ArrayVec::<u8, POST_WRS>::new();
                loop {
                    let Some(index) = q.to_post.front() else {
                        (emptied, more) = (true, false);
                        break;
                    };
                    let chain = &self.chains[index as usize];
                    let (n, reads) = (chain.len(), chain.reads());
                    if !q.has_room(n, reads) {
                        self.stats.post_stalls += 1;
                        (emptied, more) = (false, false);
                        break;
                    }
                    if wrs.len() as u32 + n > POST_WRS as u32 {
                        (emptied, more) = (false, true);
                        break;
                    }
                    q.to_post.pop_front(&mut self.req_links);
                    q.reserve(n, reads);
                    // `chain_posted`, with the qpair in hand (the request is on its FIFO).
                    let r = &mut self.reqs[index as usize];
                    debug_assert_eq!(r.qpair, qref);
                    if r.mark_posted() {
                        q.outstanding = q.outstanding.saturating_sub(1);
                    }
                    r.post_seq = q.next_post();
                    // Every chain holds at least one WR, so `batch` never overflows.
                    batch.push(index);
                    let generation = self.req_generation[index as usize];
                    chain.work_requests(generation, index, &mut wrs);
                    ends.push((wrs.len() - 1) as u8);
                }
                if batch.is_empty() {
                    if held {
                        // Not reached (a batch ended by length is followed by a post); the
                        // held list must not wait for a post that does not come.
                        if let Some(qp) = q.qp.as_mut() {
                            let _ = qp.post_send(&[]);
                        }
                    }
                    return;
                }
                // A list of one answer may go silent past it: see `silent.rs`.
                let lone = emptied
                    && q.lone_silent < self.cfg.silent_answers
                    && q.sq_slots.saturating_sub(q.sq_used) >= MAX_CHAIN_WRS as u32;
                let reqs = &self.reqs;
                silent = silence(
                    &self.chains,
                    &batch,
                    &ends,
                    &mut wrs,
                    room.filter(|_| lone),
                    |index| {
                        let r = &reqs[index as usize];
                        r.owned.then(|| r.buffer_count() as u32)
                    },
                );
                q.lone_silent = if silent >> (batch.len() - 1) & 1 != 0 {
                    q.lone_silent + 1
                } else {
                    0
                };
                let at = wrs.len();
                self.stats.send_post_calls += 1;
                self.stats.send_wrs_posted += at as u64;
                let fault = match self.post_fault {
                    Some((i, after)) if i == qref.index => {
                        self.post_fault = None;
                        Some(after.min(at))
                    }
                    _ => None,
                };
                let to_post = fault.unwrap_or(at);
                held = more && fault.is_none();
                self.stats.send_lists_held += u64::from(held);
                let posted = match q.qp.as_mut() {
                    Some(qp) if held => qp.post_send_more(&wrs[..to_post]),
                    Some(qp) => qp.post_send(&wrs[..to_post]),
                    None => Err(crate::error::PostError {
                        failed_index: 0,
                        error: TransportError::InvalidArgument("no QP".into()),
                    }),
                };
                (posted, fault, at)
            };
            // Before a refusal is applied: it takes back what did not reach the QP.
            for &index in &batch {
                self.chains[index as usize].all_posted();
            }
            // The error is matched here, not mapped into a tuple in the block above: carrying
            // it out of the block cost a dozen moves per post on the path that never fails.
            match (posted, fault) {
                (Ok(()), None) => self.went_silent(qref, &batch, silent),
                (Ok(()), Some(after)) if after >= at => self.went_silent(qref, &batch, silent),
                (Ok(()), Some(after)) => {
                    let error = TransportError::InvalidArgument("injected post failure".into());
                    self.post_failed(h, qref, &batch, after, error);
                    return;
                }
                (Err(e), _) => {
                    self.post_failed(h, qref, &batch, e.failed_index, e.error);
                    return;
                }
            }
            if emptied {
                return;
            }
        }
    }

    /// A post refused WR `failed_index` of the list built from `batch`: that WR and the rest
    /// never reached the QP. They fail here without touching the QP's completion accounting;
    /// the qpair drains (its marker retires what did reach the QP silently).
    fn post_failed<H: Handler<R>>(
        &mut self,
        h: &mut H,
        qref: QpRef,
        batch: &[u32],
        failed_index: usize,
        error: TransportError,
    ) {
        let qp_num = self.qpair_at(qref).map_or(0, |q| q.qp_num);
        tracing::warn!(qp_num, %error, failed_index, "posting sends failed: draining the qpair");
        let mut at = 0usize;
        let mut over = [0u32; POST_WRS];
        let mut n_over = 0;
        for &index in batch {
            let chain = &mut self.chains[index as usize];
            let len = chain.len() as usize;
            if failed_index < at + len {
                let position = failed_index.saturating_sub(at) as u8;
                let retired = chain.refused_from(position, WcStatus::GeneralErr);
                if chain.is_over() {
                    over[n_over] = index;
                    n_over += 1;
                }
                if let Some(q) = self.qpair_at_mut(qref) {
                    q.release(retired.wrs, retired.reads);
                }
            }
            at += len;
        }
        self.start_drain(h, qref, DrainReason::ErrorCompletion);
        for &index in &over[..n_over] {
            self.chain_over(h, index);
        }
    }
}

#[cfg(all(test, feature = "soft"))]
mod tests {
    use super::*;
    use crate::device::{Context, DeviceSpec};
    use crate::pollgroup::chain::{Chain, ChainWr, SgeLimits};
    use crate::pollgroup::lifecycle::QpairEvent;
    use crate::pollgroup::request::ReqId;
    use crate::pollgroup::{BufferGrant, PollGroupConfig, SlotState};
    use crate::types::SendFlags;
    use crate::types::SendOp;
    use crate::types::{SoftConfig, SoftFabric, WcOpcode};

    #[derive(Default)]
    struct Record {
        chains: Vec<ReqId>,
        statuses: Vec<WcStatus>,
    }

    impl Handler<()> for Record {
        fn capsule(&mut self, _: &mut PollGroup<()>, _: ReqId) {}
        fn chain_done(&mut self, _: &mut PollGroup<()>, req: ReqId, _: WrKind, s: WcStatus) {
            self.chains.push(req);
            self.statuses.push(s);
        }
        fn qpair_event(&mut self, _: &mut PollGroup<()>, _: u32, _: u64, _: QpairEvent) {}
        fn aborted(&mut self, _: &mut PollGroup<()>, _: ReqId) {}
        fn buffers_ready(&mut self, _: &mut PollGroup<()>, _: ReqId) {}
    }

    /// A soft in-process device and a tiny group configuration for unit tests.
    fn tiny(name: &str) -> (Context, PollGroupConfig) {
        let ctx = Context::open(&DeviceSpec::Soft(SoftConfig {
            name: format!("pg-unit-{name}-{}", std::process::id()),
            fabric: SoftFabric::InProcess,
            ..SoftConfig::default()
        }))
        .unwrap();
        let cfg = PollGroupConfig {
            srq_depth: 8,
            max_qpairs: 2,
            max_queue_depth: 4,
            max_requests: 2,
            data_buffers: 2,
            io_unit_size: 4096,
            in_capsule_data_size: 0,
            ..PollGroupConfig::default()
        };
        (ctx, cfg)
    }

    fn group(name: &str) -> (PollGroup<()>, u32) {
        let (ctx, cfg) = tiny(name);
        let mut pg = PollGroup::<()>::new(&ctx, cfg).unwrap();
        let qp = pg.create_qp().unwrap();
        let qpn = pg.add_qp(qp, 4, 4, 0).unwrap();
        (pg, qpn)
    }

    /// A request with a one-SEND chain marked posted (as the end-of-poll post would).
    fn posted_request(pg: &mut PollGroup<()>, qpn: u32) -> ReqId {
        let qref = pg.lookup(qpn).unwrap();
        let req = pg.new_request(qref, u32::MAX).unwrap();
        let chain = [ChainWr {
            op: SendOp::Send,
            sges: &[],
            inline: false,
        }];
        pg.chains[req.index as usize]
            .set(&chain, 0, SgeLimits::default())
            .unwrap();
        pg.chain_posted(req.index);
        pg.qpairs[qref.index as usize].reserve(1, 0);
        req
    }

    /// A request's data buffers go back before it finishes (its response carries no data), but
    /// never while its chain may be on the send queue.
    #[test]
    fn buffers_go_back_before_the_response_but_not_from_a_posted_chain() {
        let (mut pg, qpn) = group("release-buffers");
        let qref = pg.lookup(qpn).unwrap();
        let req = pg.new_request(qref, u32::MAX).unwrap();
        assert_eq!(pg.alloc_buffers(req, 8192).unwrap(), BufferGrant::Ready);
        assert_eq!(pg.buffers_free(), 0);
        assert!(pg.release_buffers(req));
        assert_eq!(pg.buffers_free(), 2);
        assert_eq!(pg.request(req).unwrap().buffer_count(), 0);
        // Finishing frees nothing twice.
        pg.finish(req);
        assert_eq!(pg.buffers_free(), 2);

        let posted = posted_request(&mut pg, qpn);
        assert!(!pg.release_buffers(posted), "its chain may still read them");
    }

    /// `req`'s SEND completion with an error `status`.
    fn failed_send_wc(req: ReqId, qpn: u32, status: WcStatus) -> WorkCompletion {
        WorkCompletion {
            status,
            ..send_wc(req, req.generation, qpn)
        }
    }

    fn send_wc(req: ReqId, generation: u32, qpn: u32) -> WorkCompletion {
        WorkCompletion {
            wr_id: wrid::encode(WrKind::Send, 0, generation, req.index),
            status: WcStatus::Success,
            opcode: WcOpcode::Send,
            qp_num: qpn,
            ..WorkCompletion::default()
        }
    }

    #[test]
    fn a_stale_generation_is_counted_and_never_applied() {
        let (mut pg, qpn) = group("stale");
        let mut h = Record::default();
        let old = posted_request(&mut pg, qpn);
        // The request finishes (its SEND completion is reaped) and its index is reused.
        pg.dispatch(&mut h, &send_wc(old, old.generation, qpn));
        assert_eq!(h.chains, vec![old]);
        pg.finish(old);
        let new = posted_request(&mut pg, qpn);
        assert_eq!(new.index, old.index, "the slab reuses the index");
        assert_ne!(new.generation, old.generation);
        // A completion naming the old generation (a duplicate, or one from a destroyed QP).
        pg.dispatch(&mut h, &send_wc(old, old.generation, qpn));
        assert_eq!(pg.stats().stale_completions, 1);
        assert_eq!(h.chains, vec![old], "never applied to the new request");
        assert_eq!(pg.request(new).unwrap().state(), RequestState::Posted);
        // A send-side wr_id arriving with a receive opcode is refused by kind.
        let mut wrong = send_wc(new, new.generation, qpn);
        wrong.opcode = WcOpcode::Recv;
        pg.dispatch(&mut h, &wrong);
        assert_eq!(pg.stats().kind_mismatches, 1);
        pg.dispatch(&mut h, &send_wc(new, new.generation, qpn));
        assert_eq!(h.chains, vec![old, new]);
    }

    /// A group whose qpair holds `n` posted one-SEND chains, in post order.
    fn posted_requests(name: &str, n: usize) -> (PollGroup<()>, u32, Vec<ReqId>) {
        let (ctx, cfg) = tiny(name);
        let cfg = PollGroupConfig {
            max_requests: n as u32,
            ..cfg
        };
        let mut pg = PollGroup::<()>::new(&ctx, cfg).unwrap();
        let qp = pg.create_qp().unwrap();
        let qpn = pg.add_qp(qp, 4, 4, 0).unwrap();
        let reqs = (0..n).map(|_| posted_request(&mut pg, qpn)).collect();
        (pg, qpn, reqs)
    }

    /// Only the run of answers that ends a list goes silent, its last one signaled.
    #[test]
    fn only_the_answers_that_end_a_list_go_silent() {
        let mut chains: Vec<Chain> = (0..5).map(|_| Chain::new()).collect();
        let one = |op: SendOp| ChainWr {
            op,
            sges: &[],
            inline: false,
        };
        let read = SendOp::RdmaRead {
            remote_addr: 0,
            rkey: 1,
        };
        let silent_of = |chains: &mut [Chain], ops: &[SendOp]| {
            for (c, op) in chains.iter_mut().zip(ops) {
                c.set(&[one(*op)], 0, SgeLimits::default()).unwrap();
            }
            let batch: Vec<u32> = (0..ops.len() as u32).collect();
            let mut wrs = ArrayVec::<SendWr, POST_WRS>::new();
            for (i, c) in chains.iter().take(ops.len()).enumerate() {
                c.work_requests(1, i as u32, &mut wrs);
            }
            let ends: Vec<u8> = (0..ops.len() as u8).collect();
            let mask = silence(&chains[..], &batch, &ends, &mut wrs, None, |_| Some(0));
            let signaled: Vec<bool> = wrs
                .iter()
                .map(|w| w.flags.contains(SendFlags::SIGNALED))
                .collect();
            (mask, signaled)
        };
        let send = SendOp::Send;
        assert_eq!(
            silent_of(&mut chains, &[send, read, send, send, send]),
            (0b01100, vec![true, true, false, false, true])
        );
        assert_eq!(
            silent_of(&mut chains, &[send, send, read]),
            (0, vec![true; 3]),
            "a READ ends the list"
        );
        assert_eq!(silent_of(&mut chains, &[send]), (0, vec![true]));
    }

    /// `reqs` went as one list: every one but the last silent.
    fn as_one_list(pg: &mut PollGroup<()>, qpn: u32, reqs: &[ReqId]) {
        let qref = pg.lookup(qpn).unwrap();
        let batch: Vec<u32> = reqs.iter().map(|r| r.index).collect();
        pg.went_silent(qref, &batch, (1 << (reqs.len() - 1)) - 1);
    }

    /// Silent chains of a list are done when a later chain's completion comes, in post order
    /// and before it; a silent chain of a later list waits for a completion posted after it.
    #[test]
    fn silent_chains_end_at_a_later_chains_completion_in_post_order() {
        let (mut pg, qpn, r) = posted_requests("silent", 4);
        let qref = pg.lookup(qpn).unwrap();
        let mut h = Record::default();
        // List one: r0 r1 silent, r2 signaled; list two: r3 silent (its signaled tail to come).
        as_one_list(&mut pg, qpn, &r[..3]);
        pg.went_silent(qref, &[r[3].index], 0b1);
        pg.dispatch(&mut h, &send_wc(r[2], r[2].generation, qpn));
        assert_eq!(h.chains, vec![r[0], r[1], r[2]]);
        assert_eq!(h.statuses, vec![WcStatus::Success; 3]);
        assert_eq!(pg.stats().silent_retired, 2);
        assert_eq!(pg.request(r[3]).unwrap().state(), RequestState::Posted);
        assert_eq!(
            pg.qpair_send_usage(qpn).unwrap().0,
            1,
            "r3's slot still used"
        );
        // r3 fails on its own (a flush completes every WR): it reports itself and leaves the
        // silent FIFO.
        pg.dispatch(&mut h, &failed_send_wc(r[3], qpn, WcStatus::WrFlushErr));
        assert_eq!(h.chains, vec![r[0], r[1], r[2], r[3]]);
        assert_eq!(h.statuses[3], WcStatus::WrFlushErr);
        assert!(pg.qpairs[qref.index as usize].silent.is_empty());
        assert_eq!(pg.stats().silent_retired, 2);
        assert_eq!(pg.qpair_send_usage(qpn).unwrap().0, 0);
    }

    /// A silent chain's own error: the silent ones before it succeeded (an error would have
    /// completed first), it reports its error, and the list's last chain reports its flush.
    #[test]
    fn a_failed_silent_chain_ends_with_its_error_and_the_ones_before_succeed() {
        let (mut pg, qpn, r) = posted_requests("silent-err", 3);
        as_one_list(&mut pg, qpn, &r);
        let mut h = Record::default();
        pg.dispatch(&mut h, &failed_send_wc(r[1], qpn, WcStatus::RemAccessErr));
        assert_eq!(h.chains, vec![r[0], r[1]]);
        assert_eq!(h.statuses, vec![WcStatus::Success, WcStatus::RemAccessErr]);
        let qref = pg.lookup(qpn).unwrap();
        assert!(pg.qpairs[qref.index as usize].silent.is_empty());
        pg.dispatch(&mut h, &failed_send_wc(r[2], qpn, WcStatus::WrFlushErr));
        assert_eq!(h.chains, vec![r[0], r[1], r[2]]);
        assert_eq!(h.statuses[2], WcStatus::WrFlushErr);
        assert_eq!(pg.stats().silent_retired, 1);
    }

    /// A host initiator: matches every response to the one command in flight.
    #[derive(Default)]
    struct Host {
        in_flight: Option<ReqId>,
        complete: Vec<ReqId>,
    }

    impl Handler<()> for Host {
        fn capsule(&mut self, _: &mut PollGroup<()>, _: ReqId) {}
        fn chain_done(&mut self, _: &mut PollGroup<()>, _: ReqId, _: WrKind, _: WcStatus) {
            panic!("host SENDs complete through request_complete");
        }
        fn qpair_event(&mut self, _: &mut PollGroup<()>, _: u32, _: u64, _: QpairEvent) {}
        fn aborted(&mut self, _: &mut PollGroup<()>, _: ReqId) {}
        fn buffers_ready(&mut self, _: &mut PollGroup<()>, _: ReqId) {}
        fn response(&mut self, pg: &mut PollGroup<()>, _: u32, _: u64, _: &[u8]) {
            pg.response_received(self.in_flight.unwrap()).unwrap();
        }
        fn request_complete(&mut self, pg: &mut PollGroup<()>, req: ReqId, s: WcStatus) {
            assert_eq!(s, WcStatus::Success);
            self.complete.push(req);
            pg.finish(req);
        }
    }

    /// A host request completes only with both its SEND completion and its response, in
    /// either order.
    #[test]
    fn a_host_request_needs_its_send_and_its_response_in_either_order() {
        let (ctx, cfg) = tiny("host");
        let mut pg = PollGroup::<()>::new_host(&ctx, cfg, crate::pollgroup::RecvMode::Srq).unwrap();
        let qp = pg.create_qp().unwrap();
        let qpn = pg.add_qp(qp, 4, 1, 0).unwrap();
        let handle = pg.qpair_handle(qpn).unwrap();
        let mut h = Host::default();
        for (slot, response_first) in [(0u32, true), (1, false)] {
            let req = pg.submit(handle).unwrap();
            pg.chains[req.index as usize]
                .set(
                    &[ChainWr {
                        op: SendOp::Send,
                        sges: &[],
                        inline: false,
                    }],
                    0,
                    SgeLimits::default(),
                )
                .unwrap();
            pg.chain_posted(req.index);
            pg.qpairs[handle.0.index as usize].reserve(1, 0);
            h.in_flight = Some(req);
            let response = WorkCompletion {
                wr_id: wrid::recv(slot),
                status: WcStatus::Success,
                opcode: WcOpcode::Recv,
                qp_num: qpn,
                byte_len: 16,
                ..WorkCompletion::default()
            };
            let send = send_wc(req, req.generation, qpn);
            let (first, second) = if response_first {
                (response, send)
            } else {
                (send, response)
            };
            pg.dispatch(&mut h, &first);
            if !pg.completed.is_empty() {
                pg.report_completed(&mut h);
            }
            assert!(
                h.complete.is_empty(),
                "complete after one half ({response_first})"
            );
            pg.dispatch(&mut h, &second);
            pg.report_completed(&mut h);
            assert_eq!(h.complete, vec![req], "response first: {response_first}");
            h.complete.clear();
        }
        assert_eq!(pg.requests_in_use(), 0);
    }

    /// A host command whose SEND went silent holding only its request's memory completes at
    /// its response: `finish` gives its depth slot back (the next command fits a depth-1
    /// qpair), and the object stays until a later completion on the qpair retires the SEND.
    #[test]
    fn a_silent_owned_host_command_completes_at_its_response() {
        let (ctx, cfg) = tiny("host-silent");
        let mut pg = PollGroup::<()>::new_host(&ctx, cfg, crate::pollgroup::RecvMode::Srq).unwrap();
        let qp = pg.create_qp().unwrap();
        let qpn = pg.add_qp(qp, 1, 1, 0).unwrap();
        let handle = pg.qpair_handle(qpn).unwrap();
        let mut h = Host::default();
        let send = [ChainWr {
            op: SendOp::Send,
            sges: &[],
            inline: false,
        }];
        let post = |pg: &mut PollGroup<()>, req: ReqId| {
            pg.chains[req.index as usize]
                .set(&send, 0, SgeLimits::default())
                .unwrap();
            pg.reqs[req.index as usize].owned = true;
            pg.chain_posted(req.index);
            pg.qpairs[handle.0.index as usize].reserve(1, 0);
        };
        let first = pg.submit(handle).unwrap();
        post(&mut pg, first);
        pg.went_silent(handle.0, &[first.index], 0b1);
        h.in_flight = Some(first);
        pg.dispatch(
            &mut h,
            &WorkCompletion {
                wr_id: wrid::recv(0),
                status: WcStatus::Success,
                opcode: WcOpcode::Recv,
                qp_num: qpn,
                byte_len: 16,
                ..WorkCompletion::default()
            },
        );
        pg.report_completed(&mut h);
        assert_eq!(h.complete, vec![first], "complete at its response");
        assert!(
            pg.request(first).is_some(),
            "held until its SEND is retired"
        );
        let second = pg.submit(handle).expect("the depth slot is back");
        post(&mut pg, second);
        h.complete.clear();
        h.in_flight = Some(second);
        pg.dispatch(&mut h, &send_wc(second, second.generation, qpn));
        assert!(pg.request(first).is_none(), "retired and freed");
        assert_eq!(pg.stats().silent_retired, 1);
        assert!(h.complete.is_empty(), "the second waits for its response");
        assert_eq!(pg.requests_in_use(), 1);
    }

    /// A target group keeps posted what its qpairs' peers may send plus a margin (two
    /// batches), the other slots spare; a slot the pass freed goes back on the SRQ before any
    /// spare one (its lines are the warm ones), and beyond the limit it waits as spare.
    #[test]
    fn a_target_group_posts_its_peers_depth_and_reuses_warm_slots() {
        let (ctx, cfg) = tiny("post_limit");
        let cfg = PollGroupConfig {
            srq_depth: 64,
            batch: 4,
            max_queue_depth: 16,
            ..cfg
        };
        let mut pg = PollGroup::<()>::new(&ctx, cfg).unwrap();
        assert_eq!(pg.recv_post_limit(), 8, "no qpair: the margin");
        assert_eq!(pg.recv_accounting(), (8, 0, 0));
        let qp = pg.create_qp().unwrap();
        let qpn = pg.add_qp(qp, 16, 4, 0).unwrap();
        assert_eq!(pg.recv_post_limit(), 24);
        assert_eq!(
            pg.recv_accounting(),
            (24, 0, 0),
            "posted as the qpair joined"
        );
        assert_eq!(pg.recv.spare_count(), 40);
        let mut h = Record::default();
        let orphan = |slot: u32| WorkCompletion {
            wr_id: wrid::recv(slot),
            status: WcStatus::Success,
            opcode: WcOpcode::Recv,
            qp_num: 0xdead,
            byte_len: 64,
            ..WorkCompletion::default()
        };
        // The first slots posted (the top of the pool) come back first.
        let warm = 63;
        assert_eq!(pg.slot_state(warm), Some(SlotState::Posted));
        pg.dispatch(&mut h, &orphan(warm));
        pg.flush_recvs();
        assert_eq!(pg.slot_state(warm), Some(SlotState::Posted), "re-posted");
        assert_eq!(pg.recv.spare_count(), 40, "no spare slot taken instead");
        // The qpair goes: what is posted stays (the SRQ cannot take it back), and a slot
        // freed now stays spare, as the limit is the margin again.
        pg.destroy_qpair(&mut h, qpn);
        assert_eq!(pg.recv_post_limit(), 8);
        pg.dispatch(&mut h, &orphan(warm));
        pg.flush_recvs();
        assert_eq!(pg.slot_state(warm), Some(SlotState::Spare));
        assert_eq!(pg.recv_accounting(), (23, 0, 0));
    }

    #[test]
    fn a_gone_qpairs_number_never_finds_the_qpair_that_took_its_place() {
        let (mut pg, first) = group("qpn_cache");
        let mut h = Record::default();
        let index = pg.lookup(first).unwrap().index;
        // Added qpairs are in the cache: their lookups walk no tree.
        assert_eq!(pg.stats().tree_walks, 0);
        pg.destroy_qpair(&mut h, first);
        let qp = pg.create_qp().unwrap();
        let second = pg.add_qp(qp, 4, 4, 0).unwrap();
        assert_ne!(first, second);
        assert_eq!(
            pg.lookup(second).unwrap().index,
            index,
            "the slab slot is reused"
        );
        assert_eq!(pg.stats().tree_walks, 0);
        // The gone number misses the cache and the tree: its completions are orphans.
        assert!(pg.lookup(first).is_none());
        assert_eq!(pg.stats().tree_walks, 1);
        let recv = WorkCompletion {
            wr_id: wrid::recv(3),
            status: WcStatus::Success,
            opcode: WcOpcode::Recv,
            qp_num: first,
            byte_len: 64,
            ..WorkCompletion::default()
        };
        let orphans = pg.stats().orphans;
        pg.dispatch(&mut h, &recv);
        assert_eq!(pg.stats().orphans, orphans + 1);
    }

    #[test]
    fn a_slot_is_never_posted_twice() {
        let (mut pg, _) = group("slots");
        let mut h = Record::default();
        assert_eq!(pg.slot_state(3), Some(SlotState::Posted));
        let recv = WorkCompletion {
            wr_id: wrid::recv(3),
            status: WcStatus::Success,
            opcode: WcOpcode::Recv,
            qp_num: 0xdead,
            byte_len: 64,
            ..WorkCompletion::default()
        };
        // An orphan: the slot is queued for re-posting once.
        pg.dispatch(&mut h, &recv);
        assert_eq!(pg.slot_state(3), Some(SlotState::QueuedForPost));
        assert_eq!(pg.recv_accounting(), (7, 1, 0));
        // The same completion again: the slot is not Posted, so it is an error, not a repost.
        pg.dispatch(&mut h, &recv);
        assert_eq!(pg.stats().recv_slot_errors, 1);
        assert_eq!(pg.recv_accounting(), (7, 1, 0));
        // A slot number the group never made.
        pg.dispatch(
            &mut h,
            &WorkCompletion {
                wr_id: wrid::recv(999),
                ..recv
            },
        );
        assert_eq!(pg.stats().recv_slot_errors, 2);
        // Releasing a slot that is not held does nothing either.
        assert!(!pg.recv.release(3));
        assert_eq!(pg.recv.queued(), 1);
    }

    #[test]
    fn a_capsule_is_writable_only_while_its_request_holds_the_slot() {
        let (mut pg, qpn) = group("capsule_mut");
        assert!(
            pg.recv.bytes_mut(2).is_empty(),
            "a posted slot is the device's"
        );
        // The tiny group's slots hold the 64-byte SQE only.
        assert!(pg.recv.completed(2, 64));
        let qref = pg.lookup(qpn).unwrap();
        let req = pg.new_request(qref, 2).unwrap();
        let data = pg.capsule_mut(req);
        assert_eq!(data.len(), 64);
        data.fill(0x5A);
        assert!(pg.capsule(req).iter().all(|&b| b == 0x5A));
        assert_eq!(
            pg.recv_accounting(),
            (7, 0, 1),
            "held while the request keeps it"
        );
        pg.release_capsule(req);
        assert!(
            pg.capsule_mut(req).is_empty(),
            "released: queued for the SRQ"
        );
        assert!(pg.recv.bytes_mut(2).is_empty());
        assert_eq!(pg.recv_accounting(), (7, 1, 0));
    }
}
