//! Silent chains: send-side chains posted without a completion of their own, what they hold
//! until a later completion on their qpair retires them, and that retirement.
//!
//! RC completes a send queue in order, and a failed WR completes on its own whatever its
//! flags: a chain's completion says every chain posted before it on the same qpair is done,
//! successfully. So a chain whose completion would only free it (its last WR a SEND: a
//! response, or a host's command) may go unsignaled when a later completion is sure to come:
//!
//! - Within a list: the run of such chains that ends it, all but the last. Only the run that
//!   ends the list: a READ chain keeps its completion (it moves its command on), and an answer
//!   posted before a READ is not held behind the READ's round trip. A list of N responses costs
//!   one completion instead of N.
//! - Across lists (lone answers), when `PollGroupConfig::silent_answers` is set (off by
//!   default: see the field): at depth 1 per qpair each list is one answer, and each costs a
//!   completion of its own (two per I/O on each side with the capsule's). A list of one answer
//!   goes silent too, up to `silent_answers` lists in a row per qpair, when the chain holds
//!   only its request's own memory (`post_chain_owned`), the list emptied its qpair's FIFO, the
//!   send queue keeps room for a whole chain after it (a chain that waited for room behind
//!   silent chains alone would wait for ever), and the group's hold budget allows. Its request
//!   stays allocated until the next completion on its qpair, or its drain, retires it: the
//!   device may read its memory until then. Longer lists keep their last completion: it
//!   already serves them all, and holding all their requests (and data buffers) past it would
//!   save one completion in many.
//!
//! A lone silent chain waits for a later post on its qpair, which may never come (the host goes
//! quiet). So when the group has reaped nothing for `silent_flush_idle_polls` polls in a row,
//! or its reactor is about to sleep (`arm`), each qpair with silent chains gets a signaled
//! zero-length RDMA WRITE (no memory touched, no rkey checked: IBTA C9-88; no receive consumed
//! at the peer) whose completion retires the chains posted before it (over soft TCP the peer
//! acknowledges it when its consumer next polls). Meanwhile what they hold is bounded so that
//! everything else still moves: a target group's at most half its request objects and at most
//! half its data buffers, leaving at least one request's largest want; a host group's at most
//! the request objects no qpair's depth claims (`max_requests` less the depths summed), so a
//! submit within depth always finds an object. Requests outside the budget complete by their
//! own completions.

use crate::types::{SendFlags, SendOp, SendWr, WcStatus, WorkCompletion};

use super::PollGroup;
use super::chain::Chain;
use super::host::Role;
use super::qpair::{DrainReason, QpRef, QpairPhase, live_mut};
use super::request::{Handler, MAX_REQUEST_BUFFERS, RequestState};
use super::wrid::{self, WrId, WrKind};

/// What the chains in the qpairs' silent FIFOs hold now.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Held {
    pub requests: u32,
    pub buffers: u32,
}

/// Room left in the hold budget (see the module documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Room {
    pub requests: u32,
    pub buffers: u32,
}

/// Which chains of `batch` (posted as one list, `ends[k]` the index in `wrs` of chain k's last
/// WR) go without a completion: their last WR's SIGNALED flag is cleared. `lone`: room for a
/// list of one answer to go silent too (None: it may not); `owned(index)` is the data buffers
/// of a request that holds all its chain's memory, None for one that does not. Returns the
/// silent chains as bits of `batch`.
pub(super) fn silence(
    chains: &[Chain],
    batch: &[u32],
    ends: &[u8],
    wrs: &mut [SendWr<'_>],
    lone: Option<Room>,
    owned: impl Fn(u32) -> Option<u32>,
) -> u32 {
    let answers = |index: u32| chains[index as usize].last_kind() == WrKind::Send;
    let mut silent = 0u32;
    let Some((&tail, before)) = batch.split_last() else {
        return 0;
    };
    if !answers(tail) {
        return 0;
    }
    for (k, (&index, &end)) in before.iter().zip(ends).enumerate().rev() {
        if !answers(index) {
            break;
        }
        wrs[end as usize].flags.remove(SendFlags::SIGNALED);
        silent |= 1 << k;
    }
    // A list of one answer waits for a later list's completion, within the room left.
    let Some(room) = lone.filter(|_| before.is_empty()) else {
        return silent;
    };
    match owned(tail) {
        Some(buffers) if room.requests >= 1 && buffers <= room.buffers => {
            wrs[ends[0] as usize].flags.remove(SendFlags::SIGNALED);
            1
        }
        _ => silent,
    }
}

impl<R: Default> PollGroup<R> {
    /// Room in the hold budget now; None when lone answers are always signaled.
    pub(super) fn silent_room(&self) -> Option<Room> {
        if self.cfg.silent_answers == 0 {
            return None;
        }
        let (requests, buffers) = match self.role {
            Role::Target => (
                self.cfg.max_requests / 2,
                (self.cfg.data_buffers / 2).min(
                    self.cfg
                        .data_buffers
                        .saturating_sub(MAX_REQUEST_BUFFERS as u32),
                ),
            ),
            Role::Host => (self.cfg.max_requests.saturating_sub(self.depth_sum), 0),
        };
        Some(Room {
            requests: requests.saturating_sub(self.held.requests),
            buffers: buffers.saturating_sub(self.held.buffers),
        })
    }

    /// The chains `silent` names reached the QP without a completion of their own: they wait,
    /// in post order, for the next completion of a later chain on `qref`.
    pub(super) fn went_silent(&mut self, qref: QpRef, batch: &[u32], silent: u32) {
        if silent == 0 {
            return;
        }
        let Some(q) = live_mut(&mut self.qpairs, qref) else {
            return;
        };
        for (k, &index) in batch.iter().enumerate() {
            if silent >> k & 1 != 0 {
                q.silent.push_back(&mut self.req_links, index);
                let r = &mut self.reqs[index as usize];
                r.silent = true;
                self.held.requests += 1;
                self.held.buffers += r.buffer_count() as u32;
            }
        }
        self.stats.silent_chains += u64::from(silent.count_ones());
        self.stats.silent_lone += u64::from(silent >> (batch.len() - 1) & 1);
    }
}

impl<R> PollGroup<R> {
    /// Request `index` left its qpair's silent FIFO.
    fn unhold(&mut self, index: u32) {
        let r = &mut self.reqs[index as usize];
        r.silent = false;
        self.held.requests -= 1;
        self.held.buffers -= r.buffer_count() as u32;
    }

    /// `qref`'s silent FIFO emptied at once (its drain marker is back, or it is going): the
    /// caller retires or aborts the chains.
    pub(super) fn clear_silent(&mut self, qref: QpRef) {
        while let Some(index) =
            live_mut(&mut self.qpairs, qref).and_then(|q| q.silent.pop_front(&mut self.req_links))
        {
            self.unhold(index);
        }
    }

    /// Posts a silent flush on every active qpair with silent chains and none in flight.
    pub(super) fn flush_silent(&mut self) {
        for (index, q) in self.qpairs.iter_mut() {
            if q.silent.is_empty()
                || q.silent_flush.is_some()
                || q.phase != QpairPhase::Active
                || !q.has_room(1, 0)
            {
                continue;
            }
            let Some(qp) = q.qp.as_mut() else {
                continue;
            };
            let flush = SendWr {
                wr_id: wrid::encode(WrKind::SilentFlush, 0, q.generation, index as u32),
                op: SendOp::RdmaWrite {
                    remote_addr: 0,
                    rkey: 0,
                },
                sges: &[],
                flags: SendFlags::SIGNALED,
            };
            match qp.post_send(&[flush]) {
                Ok(()) => {
                    q.reserve(1, 0);
                    q.silent_flush = Some(q.next_post());
                    self.stats.silent_flushes += 1;
                }
                // Its drain (or its next completion) retires them instead.
                Err(e) => {
                    tracing::debug!(qp_num = q.qp_num, error = %e.error, "silent flush not posted")
                }
            }
        }
    }
}

impl<R: Default> PollGroup<R> {
    /// A completion for chain `index` (posted, live) on `qref`: every silent chain posted
    /// before it is done, successfully (a failed WR would have completed on its own, before
    /// this one). If `index` itself was silent, it reports on its own from now on (a flush or
    /// an error completes each WR).
    pub(super) fn retire_silent_before<H: Handler<R>>(
        &mut self,
        h: &mut H,
        qref: QpRef,
        index: u32,
    ) {
        self.retire_silent_posted_before(h, qref, self.reqs[index as usize].post_seq);
        if let Some(q) = live_mut(&mut self.qpairs, qref) {
            if q.silent.front() == Some(index) {
                q.silent.unlink(&mut self.req_links, index);
                self.unhold(index);
            }
        }
    }

    /// Retires `qref`'s silent chains posted before post number `seq` (in post order).
    fn retire_silent_posted_before<H: Handler<R>>(&mut self, h: &mut H, qref: QpRef, seq: u32) {
        loop {
            let Some(q) = live_mut(&mut self.qpairs, qref) else {
                return;
            };
            let Some(front) = q.silent.front() else {
                return;
            };
            // Wrapping order: the front was posted at `seq` or after it.
            if (self.reqs[front as usize].post_seq.wrapping_sub(seq) as i32) >= 0 {
                return;
            }
            q.silent.pop_front(&mut self.req_links);
            self.unhold(front);
            let r = &self.reqs[front as usize];
            if r.state != RequestState::Posted || r.aborted() {
                continue;
            }
            let retired = self.chains[front as usize].retire_all();
            self.retired_on(qref, retired);
            self.stats.silent_retired += 1;
            self.chain_over(h, front);
        }
    }

    /// A silent flush came back: the chains posted before it are done.
    pub(super) fn on_silent_flush<H: Handler<R>>(
        &mut self,
        h: &mut H,
        wc: &WorkCompletion,
        id: WrId,
    ) {
        let qref = QpRef {
            index: id.index,
            generation: id.generation,
        };
        let Some(q) = live_mut(&mut self.qpairs, qref).filter(|q| q.qp_num == wc.qp_num) else {
            self.stats.stale_completions += 1;
            return;
        };
        let Some(seq) = q.silent_flush.take() else {
            self.stats.stale_completions += 1;
            return;
        };
        q.release(1, 0);
        // In error too: a silent chain that failed completed on its own, before this.
        self.retire_silent_posted_before(h, qref, seq);
        if wc.status != WcStatus::Success {
            if wc.status != WcStatus::WrFlushErr {
                tracing::debug!(qp_num = wc.qp_num, status = ?wc.status, "silent flush failed");
            }
            self.start_drain(h, qref, DrainReason::ErrorCompletion);
        }
    }
}
