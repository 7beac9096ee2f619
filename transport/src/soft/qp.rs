//! Queue pairs: the state machine, posting, the stalled send queue (RNR and not-ready peers,
//! with their retry budgets and timers), flush on ERR and LAST_WQE_REACHED.
//!
//! A QP is split in two. [`SoftQp`] is the owner's handle (`&mut self`: one reactor posts and
//! transitions). [`QpShared`] is what other threads touch: the state word, the receive queue
//! (consumed by whoever delivers an incoming message), completion attribution, and a mutex-held
//! slow part (`Slow`) with the stalled send queue and, on TCP, the connection. In-process, a
//! send that can execute right away does so on the owner's thread without touching `Slow`.
//! Any thread may move a QP to ERR (a peer detecting a responder error, the CM, a fault); the
//! flush then happens under `Slow` by whoever holds it.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::cq::{CqInner, Cqe};
use super::device::{self, DeviceInner, SoftPd};
use super::inproc::{self, Data, ListScope, Outcome, WrView};
use super::mem::{self, SOFT_MAX_SGE};
use super::retire::RetireSlot;
use super::srq::{RecvQueue, SrqInner};
use super::tcp::{self, Conn};
use super::{Soft, SoftCq, SoftSrq};
use crate::error::{PostError, Result, TransportError};
use crate::provider::{QpInit, QpOps};
use crate::types::*;

fn st_to_u8(s: QpState) -> u8 {
    match s {
        QpState::Reset => 0,
        QpState::Init => 1,
        QpState::Rtr => 2,
        QpState::Rts => 3,
        QpState::Sqd => 4,
        QpState::Sqe => 5,
        QpState::Err => 6,
    }
}

fn u8_to_st(v: u8) -> QpState {
    match v {
        0 => QpState::Reset,
        1 => QpState::Init,
        2 => QpState::Rtr,
        3 => QpState::Rts,
        4 => QpState::Sqd,
        5 => QpState::Sqe,
        _ => QpState::Err,
    }
}

/// The requester completion opcode of a send operation.
pub(crate) fn send_opcode(op: &SendOp) -> WcOpcode {
    match op {
        SendOp::Send | SendOp::SendWithImm { .. } | SendOp::SendWithInv { .. } => WcOpcode::Send,
        SendOp::RdmaWrite { .. } | SendOp::RdmaWriteWithImm { .. } => WcOpcode::RdmaWrite,
        SendOp::RdmaRead { .. } => WcOpcode::RdmaRead,
        SendOp::LocalInv { .. } => WcOpcode::LocalInv,
        SendOp::BindMw { .. } => WcOpcode::BindMw,
    }
}

/// Whether `op` executes on this side alone (memory-window bind, local invalidation).
pub(crate) fn is_local(op: &SendOp) -> bool {
    matches!(op, SendOp::LocalInv { .. } | SendOp::BindMw { .. })
}

fn local_outcome(r: std::result::Result<(), WcStatus>) -> Outcome {
    match r {
        Ok(()) => Outcome::Done { byte_len: 0 },
        Err(status) => Outcome::Fail(status),
    }
}

/// IB RNR NAK timer encoding (o9-... table): code -> delay.
pub(crate) fn rnr_delay(code: u8) -> Duration {
    const US: [u32; 32] = [
        655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1280, 1920, 2560, 3840,
        5120, 7680, 10240, 15360, 20480, 30720, 40960, 61440, 81920, 122_880, 163_840, 245_760,
        327_680, 491_520,
    ];
    Duration::from_micros(u64::from(US[usize::from(code & 31)]))
}

/// Local ACK timeout: 4.096 us * 2^code (0 = infinite in IB; the soft device uses 1 ms then).
pub(crate) fn ack_timeout(code: u8) -> Duration {
    if code == 0 {
        return Duration::from_millis(1);
    }
    Duration::from_nanos(4096u64 << code.min(31))
}

/// A send WR kept by the device (stalled, or in flight on TCP). Always boxed
/// ([`PooledEntry`]): an entry moves several times on its way (out of the pool, into and out
/// of the send queue, back), and the device's full SGE count inline makes it a few hundred
/// bytes; a moved box is a pointer (memmove was a tenth of the TCP target's time at depth with
/// entries and SGE lists moved by value). Pooled entries keep their box.
pub(crate) struct SqEntry {
    /// Send-queue sequence (every posted WR; the CQ's retire accounting).
    pub(crate) seq: u64,
    /// TCP: the request sequence on the wire. Local operations (window bind, local
    /// invalidate) send no frame, so they take none: they carry the sequence of the next
    /// wire request, which they precede.
    pub(crate) wire_seq: u64,
    pub(crate) wr_id: u64,
    pub(crate) op: SendOp,
    pub(crate) signaled: bool,
    pub(crate) solicited: bool,
    n: u8,
    sges: [Sge; SOFT_MAX_SGE],
    is_inline: bool,
    pub(crate) inline: Vec<u8>,
    /// TCP: transmitted since the last go-back.
    pub(crate) sent: bool,
    /// TCP: a local operation already executed (a go-back must not run it twice).
    pub(crate) local_done: bool,
}

/// A send-queue entry as the device keeps it (see [`SqEntry`]).
pub(crate) type PooledEntry = Box<SqEntry>;

impl SqEntry {
    fn empty() -> PooledEntry {
        Box::new(SqEntry {
            seq: 0,
            wire_seq: 0,
            wr_id: 0,
            op: SendOp::Send,
            signaled: false,
            solicited: false,
            n: 0,
            sges: [Sge::default(); SOFT_MAX_SGE],
            is_inline: false,
            inline: Vec::new(),
            sent: false,
            local_done: false,
        })
    }

    pub(crate) fn sges(&self) -> &[Sge] {
        &self.sges[..self.n as usize]
    }

    pub(crate) fn view(&self) -> WrView<'_> {
        WrView {
            op: self.op,
            data: if self.is_inline {
                Data::Bytes(&self.inline)
            } else {
                Data::Sges(self.sges())
            },
            solicited: self.solicited,
        }
    }

    /// Local length of the WR (bytes to send, or to read).
    pub(crate) fn len(&self) -> u64 {
        if self.is_inline {
            self.inline.len() as u64
        } else {
            self.sges().iter().map(|s| u64::from(s.length)).sum()
        }
    }
}

/// What `admit` made of a posted WR.
enum Admitted {
    /// The QP is in ERR: the WR is to complete flushed, after any send the QP still holds
    /// (`QpShared::flush_after_held`).
    InError { seq: u64 },
    /// To execute or queue, with its send-queue sequence.
    Queued { seq: u64, signaled: bool },
}

/// The part of a QP behind a mutex: stalled sends, peer link, TCP connection. qp.rs owns the
/// peer link and the retry budget (`reset_budget`, `stall_accounting`); the send queue is
/// appended by posts (qp.rs) and retired by either fabric; `conn`, `conn_wait_since`,
/// `expect` and `seq_nak_sent` belong to tcp.rs.
pub(crate) struct Slow {
    /// In-process: the peer QP (resolved lazily from `peer_addr`).
    pub(crate) peer: Option<Arc<QpShared>>,
    peer_addr: Option<(u16, u32)>,
    /// Posted, not yet finished sends (in-process: stalled; TCP: in flight or waiting).
    pub(crate) sq: VecDeque<PooledEntry>,
    pool: Vec<PooledEntry>,
    /// When the head may be retried (RNR timer / ACK timeout).
    pub(crate) retry_at: Option<Instant>,
    rnr_left: u8,
    retry_left: u8,
    /// Boxed: progress and posts take it out and put it back (a few hundred bytes by value).
    pub(crate) conn: Option<Box<Conn>>,
    /// TCP passive side: since when a posted WR has waited for the peer's data connection.
    pub(crate) conn_wait_since: Option<Instant>,
    /// TCP responder: the next request sequence accepted. Kept by the QP, not the connection,
    /// so a replacement connection continues where the old one stopped.
    pub(crate) expect: u64,
    /// TCP requester: the wire sequence of the next request frame (local operations take
    /// none, so the responder's `expect` sees no gap).
    pub(crate) next_wire: u64,
    /// TCP responder: a sequence-error NAK was sent for the current gap.
    pub(crate) seq_nak_sent: bool,
}

impl Slow {
    pub(crate) fn reset_budget(&mut self, qp: &QpShared) {
        self.rnr_left = qp.rnr_retry.load(Ordering::Relaxed);
        self.retry_left = qp.retry_cnt.load(Ordering::Relaxed);
        self.retry_at = None;
    }

    pub(crate) fn recycle(&mut self, e: PooledEntry) {
        self.pool.push(e);
    }
}

/// A value on a cache line of its own (128 bytes: the adjacent-line prefetcher pairs lines),
/// so writes to it do not invalidate its neighbours in other cores' caches.
#[repr(align(128))]
#[derive(Default)]
struct OwnLine<T>(T);

impl<T> std::ops::Deref for OwnLine<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

/// What the retry accounting decided for a stalled head.
pub(crate) enum Stall {
    Wait(Instant),
    Fail(WcStatus),
}

/// The cross-thread part of a QP. Its fields are private: the fixed ones (set at creation)
/// are read through accessors; the changing ones are changed only by the methods below, in
/// this file: the state word and the transitions, the link flag (`set_link_down`, fault.rs),
/// delivery counting (`delivering`, both fabrics' responders), the progress registration
/// (`claim_progress` and friends, cq.rs), and `Slow` under `lock()` (this file's send queue
/// and retry budget; tcp.rs's connection and responder sequence).
pub(crate) struct QpShared {
    qp_num: u32,
    dev: Arc<DeviceInner>,
    pd: u32,
    fabric: SoftFabric,
    state: AtomicU8,
    destroyed: AtomicBool,
    /// Fault: the link to the peer is down (sends fail with RETRY_EXC_ERR).
    link_down: AtomicBool,
    send_cq: Arc<CqInner>,
    recv_cq: Arc<CqInner>,
    rq: Option<RecvQueue>,
    srq: Option<Arc<SrqInner>>,
    caps: QpCaps,
    sig_all: bool,
    remote_access: AtomicU32,
    min_rnr_timer: AtomicU8,
    rnr_retry: AtomicU8,
    retry_cnt: AtomicU8,
    timeout: AtomicU8,
    /// The PSN of the endpoint this QP last published: on TCP, the peer's HELLO must carry it
    /// (the soft CM makes it random), so only who was given the endpoint can attach.
    published_psn: AtomicU32,
    /// Initiator depth (RTS `max_rd_atomic`): RDMA READs this QP keeps outstanding at most;
    /// the next one waits in the send queue, and everything behind it, as on hardware.
    max_rd_atomic: AtomicU8,
    /// Responder resources (RTR `max_dest_rd_atomic`). The soft responder answers each READ
    /// as it arrives, so it never holds more than one; recorded for completeness.
    max_dest_rd_atomic: AtomicU8,
    /// Deliveries into this QP's receive side in progress (for LAST_WQE_REACHED). Written by
    /// the peer's thread twice per message: on a line of its own, so the owner's reads of the
    /// fields around it (state, caps, ...) on every post do not miss the cache.
    in_delivery: OwnLine<AtomicU32>,
    last_wqe_raised: AtomicBool,
    /// A thread is flushing the receive queue (`flush_recvs`: one at a time keeps the order).
    flushing: AtomicBool,
    /// This QP's counter in its send CQ's retire table (`RetireSlot` as a word: the owner
    /// changes it on reset, any thread completing a send reads it). Relaxed is enough: a WR
    /// posted after a reset reaches another thread only through the send queue's lock, which
    /// orders the owner's store before that thread's load.
    retire_slot: AtomicU64,
    /// Sends are stalled: new ones queue behind the head (RC order).
    stalled: AtomicBool,
    progress_registered: AtomicBool,
    /// Bumped when the peer link changes, so the owner refreshes its cached peer.
    link_epoch: AtomicU64,
    remote: Mutex<Option<QpEndpoint>>,
    slow: Mutex<Slow>,
}

impl QpShared {
    pub(crate) fn qp_num(&self) -> u32 {
        self.qp_num
    }
    pub(crate) fn dev(&self) -> &Arc<DeviceInner> {
        &self.dev
    }
    pub(crate) fn pd(&self) -> u32 {
        self.pd
    }
    pub(crate) fn fabric(&self) -> SoftFabric {
        self.fabric
    }
    /// This QP's place in its send CQ's retire table.
    #[inline(always)]
    fn retire_slot(&self) -> RetireSlot {
        RetireSlot::from_word(self.retire_slot.load(Ordering::Relaxed))
    }
    pub(crate) fn send_cq(&self) -> &Arc<CqInner> {
        &self.send_cq
    }
    pub(crate) fn recv_cq(&self) -> &Arc<CqInner> {
        &self.recv_cq
    }
    /// The peer this QP was connected to at RTR (None before RTR and after reset).
    pub(crate) fn remote(&self) -> Option<QpEndpoint> {
        *self.remote.lock().unwrap_or_else(|e| e.into_inner())
    }
    /// Whether the access granted to the peer at INIT includes `need`.
    pub(crate) fn grants_remote(&self, need: Access) -> bool {
        Access::from_bits_truncate(self.remote_access.load(Ordering::Acquire)).contains(need)
    }
    /// The RNR NAK timer code this QP (as responder) asks requesters to wait.
    pub(crate) fn min_rnr_timer(&self) -> u8 {
        self.min_rnr_timer.load(Ordering::Relaxed)
    }
    /// Fault: the link to the peer is down from now on.
    pub(crate) fn set_link_down(&self) {
        self.link_down.store(true, Ordering::Release);
    }
    pub(crate) fn link_is_down(&self) -> bool {
        self.link_down.load(Ordering::Acquire)
    }
    /// A delivery (or an in-process list of them, `inproc::ListScope`, or a soft TCP input
    /// batch's, `DeliveryBatch`) into this QP begins.
    #[inline(always)]
    pub(crate) fn begin_delivery(&self) {
        self.in_delivery.fetch_add(1, Ordering::SeqCst);
    }
    /// ... and ends: in ERR, the receive flush and LAST_WQE_REACHED may be due now (both wait
    /// for the deliveries in progress: `flush_recvs`, `maybe_last_wqe`).
    #[inline(always)]
    pub(crate) fn end_delivery(&self) {
        self.in_delivery.fetch_sub(1, Ordering::SeqCst);
        if self.state.load(Ordering::SeqCst) == st_to_u8(QpState::Err) {
            self.after_err();
        }
    }
    /// A CQ's progress list: true if this QP was not on it yet (the caller adds it).
    pub(crate) fn claim_progress(&self) -> bool {
        !self.progress_registered.swap(true, Ordering::AcqRel)
    }
    /// Taken off the progress list before a run (a registration racing in re-adds it).
    pub(crate) fn release_progress(&self) {
        self.progress_registered.store(false, Ordering::Release);
    }
    /// Stays on the progress list after a run that wants another.
    pub(crate) fn keep_progress(&self) {
        self.progress_registered.store(true, Ordering::Release);
    }

    pub(crate) fn state(&self) -> QpState {
        u8_to_st(self.state.load(Ordering::SeqCst))
    }

    fn set_state(&self, s: QpState) {
        self.state.store(st_to_u8(s), Ordering::SeqCst);
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Slow> {
        self.slow.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn is_live(&self) -> bool {
        !self.destroyed.load(Ordering::Acquire) && !self.link_down.load(Ordering::Acquire)
    }

    /// Take a receive for an incoming message (any thread) and hand its `wr_id` and SGEs to
    /// `use_recv` (see `RecvQueue::pop_with`); None when no receive is posted.
    #[inline]
    pub(crate) fn pop_recv_with<R>(&self, use_recv: impl FnOnce(u64, &[Sge]) -> R) -> Option<R> {
        match (&self.rq, &self.srq) {
            (Some(rq), _) => rq.pop_with(use_recv),
            (None, Some(srq)) => srq.pop_with(use_recv),
            (None, None) => None,
        }
    }

    /// Execute a local operation (see `is_local`) when the send queue reaches it.
    pub(crate) fn execute_local(&self, op: &SendOp) -> std::result::Result<(), WcStatus> {
        match *op {
            SendOp::LocalInv { rkey } => {
                if self.dev.keys.invalidate_rkey(rkey, self.pd) {
                    Ok(())
                } else {
                    Err(WcStatus::LocQpOpErr)
                }
            }
            SendOp::BindMw {
                mw,
                rkey,
                lkey,
                addr,
                length,
                access,
            } => {
                if rkey >> 8 != mw {
                    return Err(WcStatus::MwBindErr);
                }
                self.dev
                    .keys
                    .bind_window(self.pd, rkey, lkey, addr, length, access)
                    .map_err(|_| WcStatus::MwBindErr)
            }
            _ => Ok(()),
        }
    }

    /// See `published_psn`.
    pub(crate) fn published_psn(&self) -> u32 {
        self.published_psn.load(Ordering::Relaxed)
    }

    /// RDMA READs this QP may have outstanding (see `max_rd_atomic`).
    pub(crate) fn read_depth(&self) -> u8 {
        self.max_rd_atomic.load(Ordering::Relaxed)
    }

    /// RDMA READs on the wire and not yet answered (TCP; in-process READs complete at once).
    #[cfg(test)]
    pub(crate) fn reads_in_flight(&self) -> usize {
        let g = self.lock();
        g.sq.iter()
            .filter(|e| e.sent && matches!(e.op, SendOp::RdmaRead { .. }))
            .count()
    }

    /// The PD receive buffers are checked against (the SRQ's, when attached).
    pub(crate) fn recv_pd(&self) -> u32 {
        self.srq.as_ref().map_or(self.pd, |s| s.pd)
    }

    /// A send WR is done: its completion, unless it succeeded unsignaled. The check is inlined
    /// at the call (an NVMe read's RDMA WRITE is unsignaled: no call for it).
    #[inline(always)]
    pub(crate) fn complete_send(
        &self,
        seq: u64,
        wr_id: u64,
        op: &SendOp,
        status: WcStatus,
        byte_len: u32,
        signaled: bool,
    ) {
        if status == WcStatus::Success && !signaled {
            return;
        }
        self.push_send_completion(seq, wr_id, op, status, byte_len);
    }

    fn push_send_completion(
        &self,
        seq: u64,
        wr_id: u64,
        op: &SendOp,
        status: WcStatus,
        byte_len: u32,
    ) {
        self.send_cq.push_send(Cqe {
            wc: WorkCompletion {
                wr_id,
                status,
                opcode: send_opcode(op),
                byte_len,
                qp_num: self.qp_num,
                ..Default::default()
            },
            retire: Some(self.retire_slot().mark(seq)),
        });
    }

    #[inline]
    pub(crate) fn complete_recv(&self, wc: WorkCompletion, solicited: bool) {
        self.recv_cq.push_recv(
            WorkCompletion {
                qp_num: self.qp_num,
                ..wc
            },
            solicited,
        );
    }

    /// Receive completions (their `qp_num` this QP's) of an in-process list's deliveries
    /// (`inproc::ListScope`), in order; bit `i` of `solicited` is `wcs[i]`'s.
    #[inline]
    pub(crate) fn complete_recvs(&self, wcs: &[WorkCompletion], solicited: u64) {
        debug_assert!(wcs.iter().all(|wc| wc.qp_num == self.qp_num));
        self.recv_cq.push_recvs(wcs, solicited);
    }

    fn flush_recv(&self, wr_id: u64) {
        self.complete_recv(
            WorkCompletion {
                wr_id,
                status: WcStatus::WrFlushErr,
                opcode: WcOpcode::Recv,
                ..Default::default()
            },
            false,
        );
    }

    /// Move to ERR from any thread. The stalled send queue is flushed now if its lock is free
    /// (always when `wait`), else by the next progress, which the lock holder runs anyway.
    pub(crate) fn enter_err(self: &Arc<Self>, wait: bool) {
        if self.state.swap(st_to_u8(QpState::Err), Ordering::SeqCst) == st_to_u8(QpState::Err) {
            return;
        }
        tracing::debug!(qp = self.qp_num, "soft QP -> ERR");
        self.after_err();
        let guard = if wait {
            Some(self.lock())
        } else {
            match self.slow.try_lock() {
                Ok(g) => Some(g),
                Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
                Err(std::sync::TryLockError::WouldBlock) => None,
            }
        };
        match guard {
            Some(mut g) => self.flush_sq(&mut g),
            None => self.send_cq.want_progress(self),
        }
    }

    /// Move to ERR while holding `slow` (progress, TCP input handling).
    pub(crate) fn enter_err_locked(&self, slow: &mut Slow) {
        if self.state.swap(st_to_u8(QpState::Err), Ordering::SeqCst) != st_to_u8(QpState::Err) {
            tracing::debug!(qp = self.qp_num, "soft QP -> ERR");
            self.after_err();
        }
        self.flush_sq(slow);
    }

    #[cold]
    fn after_err(&self) {
        self.flush_recvs();
        self.maybe_last_wqe();
    }

    /// In ERR, the receive queue's remaining receives complete as flushed: after every
    /// delivery in progress has queued its completions (an in-process list holds those of the
    /// receives it consumed until its end), so a receive queue's completions keep their order.
    /// While deliveries run, the last one's end flushes (`end_delivery`); one thread flushes
    /// at a time, and it looks again after letting go, for receives posted meanwhile.
    fn flush_recvs(&self) {
        let Some(rq) = &self.rq else { return };
        // SeqCst against `begin_delivery` and the state swap in `enter_err`: a delivery either
        // counted itself before this load (its end flushes) or sees ERR and consumes nothing.
        while self.in_delivery.load(Ordering::SeqCst) == 0
            && !self.flushing.swap(true, Ordering::SeqCst)
        {
            while let Some(wr_id) = rq.pop_with(|wr_id, _| wr_id) {
                self.flush_recv(wr_id);
            }
            self.flushing.store(false, Ordering::SeqCst);
            if rq.len() == 0 {
                return;
            }
        }
    }

    /// A WR posted in ERR (send-queue number `seq`) completes flushed after every send the QP
    /// still holds: RC completes in post order into ERR too, and a QP moved to ERR by a thread
    /// that found its lock taken leaves its stalled sends' flush to the next progress.
    fn flush_after_held(&self, slow: &mut Slow, seq: u64, wr: &SendWr<'_>) {
        self.flush_sq(slow);
        self.complete_send(seq, wr.wr_id, &wr.op, WcStatus::WrFlushErr, 0, true);
    }

    /// Flush every send the device still holds (in order).
    pub(crate) fn flush_sq(&self, slow: &mut Slow) {
        while let Some(e) = slow.sq.pop_front() {
            self.complete_send(e.seq, e.wr_id, &e.op, WcStatus::WrFlushErr, 0, true);
            slow.pool.push(e);
        }
        slow.retry_at = None;
        self.stalled.store(false, Ordering::Release);
    }

    /// LAST_WQE_REACHED: an SRQ-attached QP in ERR that will consume no more SRQ receives.
    pub(crate) fn maybe_last_wqe(&self) {
        if self.srq.is_none()
            || !self.dev.cfg.last_wqe_reached
            || self.destroyed.load(Ordering::Acquire)
            || self.state.load(Ordering::SeqCst) != st_to_u8(QpState::Err)
            || self.in_delivery.load(Ordering::SeqCst) != 0
        {
            return;
        }
        if !self.last_wqe_raised.swap(true, Ordering::AcqRel) {
            self.dev.raise(AsyncEventKind::QpLastWqeReached {
                qp_num: self.qp_num,
            });
        }
    }

    /// Called by the CQs this QP asked for progress: retry stalled sends, run TCP I/O. Returns
    /// whether it wants to be called again.
    pub(crate) fn progress(self: &Arc<Self>, now: Instant) -> bool {
        let mut g = self.lock();
        match self.fabric {
            SoftFabric::InProcess => self.progress_inproc(&mut g, now),
            SoftFabric::Tcp => tcp::progress(self, &mut g, now),
        }
    }

    fn progress_inproc(self: &Arc<Self>, slow: &mut Slow, now: Instant) -> bool {
        loop {
            if slow.sq.is_empty() {
                self.stalled.store(false, Ordering::Release);
                return false;
            }
            if self.state() == QpState::Err {
                self.flush_sq(slow);
                return false;
            }
            if let Some(t) = slow.retry_at {
                if now < t {
                    return true;
                }
            }
            let peer = self.peer_locked(slow);
            let outcome = {
                let Some(head) = slow.sq.front() else {
                    continue;
                };
                if is_local(&head.op) {
                    local_outcome(self.execute_local(&head.op))
                } else {
                    match &peer {
                        Some(p) => inproc::execute(self, p, &head.view(), &ListScope::new(false)),
                        None => Outcome::Fail(WcStatus::RetryExcErr),
                    }
                }
            };
            match outcome {
                Outcome::Done { byte_len } => {
                    let Some(e) = slow.sq.pop_front() else {
                        continue;
                    };
                    self.complete_send(
                        e.seq,
                        e.wr_id,
                        &e.op,
                        WcStatus::Success,
                        byte_len,
                        e.signaled,
                    );
                    slow.pool.push(e);
                    slow.reset_budget(self);
                }
                Outcome::Fail(status) => {
                    self.fail_head(slow, status);
                    return false;
                }
                Outcome::Rnr { timer } | Outcome::NotReady { timer } => {
                    let rnr = matches!(outcome, Outcome::Rnr { .. });
                    match self.stall_accounting(slow, rnr, timer, now) {
                        Stall::Wait(t) => {
                            slow.retry_at = Some(t);
                            return true;
                        }
                        Stall::Fail(status) => {
                            self.fail_head(slow, status);
                            return false;
                        }
                    }
                }
            }
        }
    }

    /// Complete the head with an error and move to ERR (flushing the rest).
    pub(crate) fn fail_head(&self, slow: &mut Slow, status: WcStatus) {
        if let Some(e) = slow.sq.pop_front() {
            self.complete_send(e.seq, e.wr_id, &e.op, status, 0, true);
            slow.pool.push(e);
        }
        self.enter_err_locked(slow);
    }

    /// Count one RNR NAK (or one unanswered attempt) against the head's budget.
    pub(crate) fn stall_accounting(
        &self,
        slow: &mut Slow,
        rnr: bool,
        timer: u8,
        now: Instant,
    ) -> Stall {
        if rnr {
            let rnr_retry = self.rnr_retry.load(Ordering::Relaxed);
            if rnr_retry != 7 {
                if slow.rnr_left == 0 {
                    return Stall::Fail(WcStatus::RnrRetryExcErr);
                }
                slow.rnr_left -= 1;
            }
            Stall::Wait(now + rnr_delay(timer))
        } else {
            if slow.retry_left == 0 {
                return Stall::Fail(WcStatus::RetryExcErr);
            }
            slow.retry_left -= 1;
            Stall::Wait(now + ack_timeout(self.timeout.load(Ordering::Relaxed)))
        }
    }

    /// The in-process peer, resolving it on first use.
    fn peer_locked(&self, slow: &mut Slow) -> Option<Arc<QpShared>> {
        if slow.peer.is_none() {
            let (lid, qpn) = slow.peer_addr?;
            slow.peer = device::inproc_device_by_lid(lid).and_then(|d| d.qp(qpn));
        }
        slow.peer.clone()
    }

    fn entry_from(
        &self,
        slow: &mut Slow,
        seq: u64,
        wr: &SendWr<'_>,
        signaled: bool,
    ) -> std::result::Result<PooledEntry, WcStatus> {
        let mut e = slow.pool.pop().unwrap_or_else(SqEntry::empty);
        e.seq = seq;
        e.wr_id = wr.wr_id;
        e.op = wr.op;
        e.signaled = signaled;
        e.solicited = wr.flags.contains(SendFlags::SOLICITED);
        e.sent = false;
        e.local_done = false;
        let n = wr.sges.len().min(SOFT_MAX_SGE);
        e.n = n as u8;
        e.sges[..n].copy_from_slice(&wr.sges[..n]);
        e.is_inline =
            wr.flags.contains(SendFlags::INLINE) && !matches!(wr.op, SendOp::RdmaRead { .. });
        e.inline.clear();
        if e.is_inline {
            // Inline data is captured at post time: the caller may reuse its buffer at once.
            let list = match mem::resolve_local(&self.dev.keys, self.pd, wr.sges, Access::empty()) {
                Ok(l) => l,
                Err(_) => {
                    slow.pool.push(e);
                    return Err(WcStatus::LocProtErr);
                }
            };
            e.inline.resize(list.total() as usize, 0);
            mem::gather(&list, &mut e.inline);
        }
        Ok(e)
    }

    // ---- transitions (shared so the CM can drive them) ----

    pub(crate) fn to_init(&self, port: u8, access: Access) -> Result<()> {
        device::check_port(port)?;
        match self.state() {
            QpState::Reset | QpState::Init => {}
            s => {
                return Err(TransportError::BadQpState {
                    op: "modify_qp(INIT)",
                    state: s,
                });
            }
        }
        self.remote_access.store(access.bits(), Ordering::Release);
        self.set_state(QpState::Init);
        Ok(())
    }

    pub(crate) fn to_rtr(self: &Arc<Self>, attr: &RtrAttr) -> Result<()> {
        device::check_port(attr.port_num)?;
        let st = self.state();
        if st != QpState::Init {
            return Err(TransportError::BadQpState {
                op: "modify_qp(RTR)",
                state: st,
            });
        }
        if attr.sgid_index != 0 {
            return Err(TransportError::NoGidForAddress {
                ip: self.dev.ip().into(),
                candidates: vec![GidEntry {
                    index: 0,
                    gid: Gid::from_ipv4(self.dev.ip()),
                    gid_type: GidType::RoceV2,
                    netdev: None,
                }],
            });
        }
        let Some(ip) = attr.remote.gid.to_ipv4() else {
            return Err(TransportError::InvalidArgument(format!(
                "soft device: remote GID {} is not IPv4-mapped",
                attr.remote.gid
            )));
        };
        self.min_rnr_timer
            .store(attr.min_rnr_timer, Ordering::Relaxed);
        self.max_dest_rd_atomic
            .store(attr.max_dest_rd_atomic, Ordering::Relaxed);
        *self.remote.lock().unwrap_or_else(|e| e.into_inner()) = Some(attr.remote);
        match self.fabric {
            SoftFabric::InProcess => {
                let Some(dev) = device::inproc_device_by_lid(attr.remote.lid) else {
                    return Err(TransportError::InvalidArgument(format!(
                        "no in-process soft device has lid {} (remote GID {ip})",
                        attr.remote.lid
                    )));
                };
                if dev.ip() != ip {
                    return Err(TransportError::InvalidArgument(format!(
                        "in-process soft device lid {} has IP {}, not the remote GID's {ip}",
                        attr.remote.lid,
                        dev.ip()
                    )));
                }
                let mut g = self.lock();
                g.peer_addr = Some((attr.remote.lid, attr.remote.qp_num));
                g.peer = dev.qp(attr.remote.qp_num);
                self.link_epoch.fetch_add(1, Ordering::AcqRel);
            }
            SoftFabric::Tcp => tcp::connect_qp(self, ip, &attr.remote)?,
        }
        self.set_state(QpState::Rtr);
        if self.fabric == SoftFabric::Tcp {
            // Input is read only from RTR on: a progress run before this point (another thread
            // polling the CQ) may have used up the socket's edge-triggered readiness without
            // reading, so run it once more now that requests are accepted.
            self.send_cq.want_progress(self);
        }
        Ok(())
    }

    pub(crate) fn to_rts(&self, attr: &RtsAttr) -> Result<()> {
        let st = self.state();
        if st != QpState::Rtr && st != QpState::Rts {
            return Err(TransportError::BadQpState {
                op: "modify_qp(RTS)",
                state: st,
            });
        }
        self.rnr_retry
            .store(attr.rnr_retry.min(7), Ordering::Relaxed);
        self.retry_cnt
            .store(attr.retry_cnt.min(7), Ordering::Relaxed);
        self.timeout.store(attr.timeout, Ordering::Relaxed);
        self.max_rd_atomic
            .store(attr.max_rd_atomic, Ordering::Relaxed);
        self.lock().reset_budget(self);
        self.set_state(QpState::Rts);
        Ok(())
    }

    fn to_reset(&self, destroy: bool) {
        self.set_state(QpState::Reset);
        if let Some(rq) = &self.rq {
            while rq.pop_with(|_, _| ()).is_some() {}
        }
        let mut g = self.lock();
        while let Some(e) = g.sq.pop_front() {
            g.pool.push(e);
        }
        g.peer = None;
        g.peer_addr = None;
        g.retry_at = None;
        g.expect = 0;
        g.next_wire = 0;
        g.seq_nak_sent = false;
        if let Some(c) = g.conn.take() {
            tcp::close(self, *c);
        }
        if destroy {
            g.pool.clear();
        }
        drop(g);
        self.stalled.store(false, Ordering::Release);
        self.last_wqe_raised.store(false, Ordering::Release);
        self.link_epoch.fetch_add(1, Ordering::AcqRel);
        *self.remote.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    pub(crate) fn endpoint(&self, port: u8, gid_index: u8, psn: u32) -> Result<QpEndpoint> {
        device::check_port(port)?;
        if gid_index != 0 {
            return Err(TransportError::InvalidArgument(format!(
                "soft devices have one GID (index 0), not {gid_index}"
            )));
        }
        self.published_psn.store(psn, Ordering::Relaxed);
        Ok(QpEndpoint {
            qp_num: self.qp_num,
            psn,
            lid: self.dev.lid(),
            gid: Gid::from_ipv4(self.dev.ip()),
        })
    }
}

/// A reliable-connected QP of a soft device (the owner's handle).
pub struct SoftQp {
    pub(crate) sh: Arc<QpShared>,
    next_seq: u64,
    peer: Option<Arc<QpShared>>,
    peer_epoch: u64,
    _pd: SoftPd,
    _send_cq: SoftCq,
    _recv_cq: SoftCq,
    _srq: Option<SoftSrq>,
}

impl SoftQp {
    /// Post a list; `doorbell`: write it out now (TCP), else it waits for the next list's.
    fn post_list(
        &mut self,
        wrs: &[SendWr<'_>],
        doorbell: bool,
    ) -> std::result::Result<(), PostError> {
        if self.sh.fabric == SoftFabric::Tcp {
            return self.post_list_tcp(wrs, doorbell);
        }
        let mut result = Ok(());
        if self.sh.fabric == SoftFabric::InProcess {
            // Once per list: the link changes on the control path, not between a list's WRs.
            self.refresh_peer();
        }
        {
            // Lists of one or two WRs (QD 1, a response per qpair) gain nothing from sharing.
            let mut scope = ListScope::new(wrs.len() > 2);
            let (sh, peer) = (&self.sh, self.peer.as_ref());
            for (i, wr) in wrs.iter().enumerate() {
                let last = i + 1 == wrs.len();
                if let Err(error) =
                    Self::post_one(sh, peer, &mut self.next_seq, &mut scope, wr, last)
                {
                    result = Err(PostError {
                        failed_index: i,
                        error,
                    });
                    break;
                }
            }
        }
        result
    }

    /// `post_list` on the TCP fabric: every WR is encoded into the connection's output under
    /// the QP lock, taken once for the list (not per WR).
    fn post_list_tcp(
        &mut self,
        wrs: &[SendWr<'_>],
        doorbell: bool,
    ) -> std::result::Result<(), PostError> {
        let sh = &self.sh;
        let mut result = Ok(());
        let mut g = sh.lock();
        for (i, wr) in wrs.iter().enumerate() {
            match Self::admit(sh, &mut self.next_seq, wr) {
                Err(error) => {
                    result = Err(PostError {
                        failed_index: i,
                        error,
                    });
                    break;
                }
                Ok(Admitted::InError { seq }) => sh.flush_after_held(&mut g, seq, wr),
                Ok(Admitted::Queued { seq, signaled }) => {
                    match sh.entry_from(&mut g, seq, wr, signaled) {
                        Ok(e) => tcp::post(sh, &mut g, e),
                        Err(status) => {
                            sh.complete_send(seq, wr.wr_id, &wr.op, status, 0, true);
                            sh.enter_err_locked(&mut g);
                        }
                    }
                }
            }
        }
        if doorbell || result.is_err() {
            // One write for the whole list, and for the lists posted with `post_send_more`
            // before it (the WRs before a failed one were posted too; after a refusal the
            // caller posts no more, so they go now).
            tcp::flush_posted(sh, &mut g);
        }
        result
    }

    pub(crate) fn new(pd: &SoftPd, init: &QpInit<'_, Soft>) -> Result<SoftQp> {
        let dev = pd.dev();
        let c = &dev.cfg;
        let caps = init.caps;
        let same = |d: &Arc<DeviceInner>| Arc::ptr_eq(d, dev);
        if !same(&init.send_cq.inner_dev()) || !same(&init.recv_cq.inner_dev()) {
            return Err(TransportError::Mismatch(
                "QP and CQ on different soft devices",
            ));
        }
        if let Some(s) = init.srq {
            if !Arc::ptr_eq(s.inner.dev(), dev) {
                return Err(TransportError::Mismatch(
                    "QP and SRQ on different soft devices",
                ));
            }
        }
        let lim = |what: &'static str, asked: u32, max: u32| -> Result<()> {
            if asked > max {
                return Err(TransportError::Limit {
                    what,
                    asked: asked.into(),
                    max: max.into(),
                });
            }
            Ok(())
        };
        lim("max_send_wr", caps.max_send_wr, c.max_qp_wr)?;
        lim("max_send_sge", caps.max_send_sge, c.max_sge)?;
        lim("max_inline_data", caps.max_inline_data, c.max_inline_data)?;
        if init.srq.is_none() {
            lim("max_recv_wr", caps.max_recv_wr, c.max_qp_wr)?;
            lim("max_recv_sge", caps.max_recv_sge, c.max_sge)?;
        }
        let granted = QpCaps {
            max_send_wr: caps.max_send_wr.max(1),
            max_recv_wr: if init.srq.is_some() {
                0
            } else {
                caps.max_recv_wr.max(1)
            },
            max_send_sge: caps.max_send_sge.max(1),
            max_recv_sge: if init.srq.is_some() {
                0
            } else {
                caps.max_recv_sge.max(1)
            },
            max_inline_data: caps.max_inline_data,
        };
        let qp_num = dev.reserve_qpn()?;
        let retire_slot = match init.send_cq.inner.retire_table.attach() {
            Ok(slot) => slot,
            Err(e) => {
                dev.release_qpn(qp_num);
                return Err(e);
            }
        };
        let sh = Arc::new(QpShared {
            qp_num,
            dev: dev.clone(),
            pd: pd.id(),
            fabric: c.fabric,
            state: AtomicU8::new(st_to_u8(QpState::Reset)),
            destroyed: AtomicBool::new(false),
            link_down: AtomicBool::new(false),
            send_cq: init.send_cq.inner.clone(),
            recv_cq: init.recv_cq.inner.clone(),
            rq: if init.srq.is_some() {
                None
            } else {
                Some(RecvQueue::new(
                    granted.max_recv_wr as usize,
                    granted.max_recv_sge,
                ))
            },
            srq: init.srq.map(|s| s.inner.clone()),
            caps: granted,
            sig_all: init.sq_sig_all,
            remote_access: AtomicU32::new(0),
            min_rnr_timer: AtomicU8::new(12),
            rnr_retry: AtomicU8::new(7),
            retry_cnt: AtomicU8::new(7),
            timeout: AtomicU8::new(14),
            published_psn: AtomicU32::new(0),
            max_rd_atomic: AtomicU8::new(0),
            max_dest_rd_atomic: AtomicU8::new(0),
            in_delivery: OwnLine(AtomicU32::new(0)),
            last_wqe_raised: AtomicBool::new(false),
            flushing: AtomicBool::new(false),
            retire_slot: AtomicU64::new(retire_slot.to_word()),
            stalled: AtomicBool::new(false),
            progress_registered: AtomicBool::new(false),
            link_epoch: AtomicU64::new(0),
            remote: Mutex::new(None),
            slow: Mutex::new(Slow {
                peer: None,
                peer_addr: None,
                sq: VecDeque::new(),
                pool: Vec::new(),
                retry_at: None,
                conn_wait_since: None,
                expect: 0,
                next_wire: 0,
                seq_nak_sent: false,
                rnr_left: 7,
                retry_left: 7,
                conn: None,
            }),
        });
        dev.publish_qp(qp_num, Arc::downgrade(&sh));
        if let Some(t) = &sh.send_cq.tcp {
            t.attach(&sh);
        }
        if !Arc::ptr_eq(&sh.send_cq, &sh.recv_cq) {
            if let Some(t) = &sh.recv_cq.tcp {
                t.attach(&sh);
            }
        }
        Ok(SoftQp {
            sh,
            next_seq: 0,
            peer: None,
            peer_epoch: u64::MAX,
            _pd: pd.clone(),
            _send_cq: init.send_cq.clone(),
            _recv_cq: init.recv_cq.clone(),
            _srq: init.srq.cloned(),
        })
    }

    /// Fault injection: move this QP to ERR and raise QP_FATAL.
    pub fn inject_fatal(&self) {
        super::fault::fail_qp(&self.sh);
    }

    /// Refresh `peer` when the link changed. Callers borrow it rather than clone it: an `Arc`
    /// clone is two atomic read-modify-writes per work request.
    fn refresh_peer(&mut self) {
        let epoch = self.sh.link_epoch.load(Ordering::Acquire);
        if epoch != self.peer_epoch || self.peer.is_none() {
            self.peer = self.sh.peer_locked(&mut self.sh.lock());
            self.peer_epoch = epoch;
        }
    }

    /// Post one WR of a list. `peer` is the list's in-process responder (looked up once per
    /// list); `scope` the list's pins and delivery count, released before any path that may
    /// wait (the send queue's lock, a local bind).
    /// The checks every posted WR passes before it is executed or queued, and its send-queue
    /// sequence. On a QP in ERR it completes flushed at once. Inlined: it is each WR's first
    /// step on the in-process fast path.
    #[inline(always)]
    fn admit(sh: &QpShared, next_seq: &mut u64, wr: &SendWr<'_>) -> Result<Admitted> {
        let st = sh.state();
        if st != QpState::Rts && st != QpState::Err {
            return Err(TransportError::BadQpState {
                op: "post_send",
                state: st,
            });
        }
        if wr.sges.len() > sh.caps.max_send_sge as usize {
            return Err(TransportError::InvalidArgument(format!(
                "{} SGEs, QP max_send_sge {}",
                wr.sges.len(),
                sh.caps.max_send_sge
            )));
        }
        // A READ may carry fewer SGEs than the send queue (`max_sge_rd`, 1 on iWARP).
        if wr.sges.len() > 1
            && matches!(wr.op, SendOp::RdmaRead { .. })
            && wr.sges.len() > sh.dev.cfg.max_sge_rd as usize
        {
            return Err(TransportError::InvalidArgument(format!(
                "RDMA READ with {} SGEs, device max_sge_rd {}",
                wr.sges.len(),
                sh.dev.cfg.max_sge_rd
            )));
        }
        if wr.flags.contains(SendFlags::INLINE) {
            let len: u64 = wr.sges.iter().map(|s| u64::from(s.length)).sum();
            if len > u64::from(sh.caps.max_inline_data) {
                return Err(TransportError::InvalidArgument(format!(
                    "inline send of {len} bytes, QP max_inline_data {}",
                    sh.caps.max_inline_data
                )));
            }
        }
        let outstanding = sh
            .send_cq
            .retire_table
            .outstanding(sh.retire_slot(), *next_seq);
        if outstanding >= sh.caps.max_send_wr {
            return Err(TransportError::QueueFull("send"));
        }
        let seq = *next_seq;
        *next_seq += 1;
        let signaled = sh.sig_all || wr.flags.contains(SendFlags::SIGNALED);
        if st == QpState::Err {
            return Ok(Admitted::InError { seq });
        }
        Ok(Admitted::Queued { seq, signaled })
    }

    fn post_one<'a>(
        sh: &'a Arc<QpShared>,
        peer: Option<&'a Arc<QpShared>>,
        next_seq: &mut u64,
        scope: &mut ListScope<'a>,
        wr: &SendWr<'_>,
        last: bool,
    ) -> Result<()> {
        let (seq, signaled) = match Self::admit(sh, next_seq, wr)? {
            Admitted::InError { seq } => {
                // Only a QP with stalled sends holds any (their flush may be a progress away).
                if sh.stalled.load(Ordering::Acquire) {
                    scope.release();
                    sh.flush_after_held(&mut sh.lock(), seq, wr);
                } else {
                    sh.complete_send(seq, wr.wr_id, &wr.op, WcStatus::WrFlushErr, 0, true);
                }
                return Ok(());
            }
            Admitted::Queued { seq, signaled } => (seq, signaled),
        };
        if sh.stalled.load(Ordering::Acquire) {
            scope.release();
            let mut g = sh.lock();
            if sh.stalled.load(Ordering::Acquire) {
                match sh.entry_from(&mut g, seq, wr, signaled) {
                    Ok(e) => g.sq.push_back(e),
                    Err(status) => {
                        // The WR itself is bad; RC order still holds: it fails when it is reached,
                        // so keep it queued as a failing entry is not expressible: fail now.
                        sh.complete_send(seq, wr.wr_id, &wr.op, status, 0, true);
                        sh.enter_err_locked(&mut g);
                        return Ok(());
                    }
                }
                // Posting again is a chance to make progress.
                let again = sh.progress_inproc(&mut g, Instant::now());
                drop(g);
                if again {
                    sh.send_cq.want_progress(sh);
                }
                return Ok(());
            }
        }
        // Fast path: execute now on this thread.
        let view = WrView {
            op: wr.op,
            data: Data::Sges(wr.sges),
            solicited: wr.flags.contains(SendFlags::SOLICITED),
        };
        let outcome = match peer {
            _ if is_local(&wr.op) => {
                // A bind waits for the window's pins: this list's among them.
                scope.release();
                local_outcome(sh.execute_local(&wr.op))
            }
            Some(p) => inproc::execute(sh, p, &view, scope),
            None => Outcome::Fail(WcStatus::RetryExcErr),
        };
        if last {
            // The responder sees the list's receives before this side's own completion is
            // queued (at QD 1 that is the I/O's latency).
            scope.queue_completions();
        }
        match outcome {
            Outcome::Done { byte_len } => {
                sh.complete_send(seq, wr.wr_id, &wr.op, WcStatus::Success, byte_len, signaled)
            }
            Outcome::Fail(status) => {
                scope.release();
                sh.complete_send(seq, wr.wr_id, &wr.op, status, 0, true);
                sh.enter_err(true);
            }
            Outcome::Rnr { timer } | Outcome::NotReady { timer } => {
                scope.release();
                let rnr = matches!(outcome, Outcome::Rnr { .. });
                let mut g = sh.lock();
                g.reset_budget(sh);
                match sh.stall_accounting(&mut g, rnr, timer, Instant::now()) {
                    Stall::Fail(status) => {
                        sh.complete_send(seq, wr.wr_id, &wr.op, status, 0, true);
                        sh.enter_err_locked(&mut g);
                    }
                    Stall::Wait(t) => match sh.entry_from(&mut g, seq, wr, signaled) {
                        Ok(e) => {
                            g.sq.push_back(e);
                            g.retry_at = Some(t);
                            sh.stalled.store(true, Ordering::Release);
                            drop(g);
                            sh.send_cq.want_progress(sh);
                        }
                        Err(status) => {
                            sh.complete_send(seq, wr.wr_id, &wr.op, status, 0, true);
                            sh.enter_err_locked(&mut g);
                        }
                    },
                }
            }
        }
        Ok(())
    }

    /// Receives currently posted on this QP's own receive queue.
    pub fn posted_recvs(&self) -> usize {
        self.sh.rq.as_ref().map_or(0, RecvQueue::len)
    }
}

impl SoftCq {
    fn inner_dev(&self) -> Arc<DeviceInner> {
        self.inner.dev()
    }
}

impl QpOps for SoftQp {
    fn qp_num(&self) -> u32 {
        self.sh.qp_num
    }
    fn state(&self) -> QpState {
        self.sh.state()
    }
    fn caps(&self) -> QpCaps {
        self.sh.caps
    }
    fn endpoint(&self, port: u8, gid_index: u8, psn: u32) -> Result<QpEndpoint> {
        self.sh.endpoint(port, gid_index, psn)
    }
    fn modify_to_init(&mut self, port: u8, access: Access) -> Result<()> {
        self.sh.to_init(port, access)
    }
    fn modify_to_rtr(&mut self, attr: &RtrAttr) -> Result<()> {
        self.sh.to_rtr(attr)
    }
    fn modify_to_rts(&mut self, attr: &RtsAttr) -> Result<()> {
        self.sh.to_rts(attr)
    }
    fn modify_to_err(&mut self) -> Result<()> {
        self.sh.enter_err(true);
        Ok(())
    }
    fn modify_to_reset(&mut self) -> Result<()> {
        self.sh.to_reset(false);
        self.next_seq = 0;
        let slot = self.sh.send_cq.retire_table.reset(self.sh.retire_slot());
        self.sh.retire_slot.store(slot.to_word(), Ordering::Relaxed);
        self.peer = None;
        Ok(())
    }
    fn post_send(&mut self, wrs: &[SendWr<'_>]) -> std::result::Result<(), PostError> {
        self.post_list(wrs, true)
    }
    fn post_send_more(&mut self, wrs: &[SendWr<'_>]) -> std::result::Result<(), PostError> {
        self.post_list(wrs, false)
    }
    fn post_recv(&mut self, wrs: &[RecvWr<'_>]) -> std::result::Result<(), PostError> {
        let sh = &self.sh;
        let Some(rq) = &sh.rq else {
            return Err(PostError {
                failed_index: 0,
                error: TransportError::InvalidArgument(
                    "QP uses an SRQ: post receives to the SRQ".into(),
                ),
            });
        };
        for (i, wr) in wrs.iter().enumerate() {
            let st = sh.state();
            if st == QpState::Reset {
                return Err(PostError {
                    failed_index: i,
                    error: TransportError::BadQpState {
                        op: "post_recv",
                        state: st,
                    },
                });
            }
            if wr.sges.len() > sh.caps.max_recv_sge as usize {
                return Err(PostError {
                    failed_index: i,
                    error: TransportError::InvalidArgument(format!(
                        "{} SGEs, QP max_recv_sge {}",
                        wr.sges.len(),
                        sh.caps.max_recv_sge
                    )),
                });
            }
            if !rq.push(wr) {
                return Err(PostError {
                    failed_index: i,
                    error: TransportError::QueueFull("receive"),
                });
            }
            // In ERR (or entering it meanwhile) the receive is flushed, queued behind any
            // receive a delivery in progress consumed earlier (`flush_recvs`).
            if sh.state() == QpState::Err {
                sh.flush_recvs();
            }
        }
        Ok(())
    }
}

impl Drop for SoftQp {
    fn drop(&mut self) {
        self.sh.destroyed.store(true, Ordering::Release);
        self.sh.to_reset(true);
        self.peer = None;
        if let Some(t) = &self.sh.send_cq.tcp {
            t.detach(self.sh.qp_num);
        }
        if let Some(t) = &self.sh.recv_cq.tcp {
            t.detach(self.sh.qp_num);
        }
        self.sh.send_cq.retire_table.detach(self.sh.retire_slot());
        self.sh.dev.release_qpn(self.sh.qp_num);
    }
}

#[cfg(test)]
#[path = "qp_tests.rs"]
mod tests;
