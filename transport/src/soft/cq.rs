//! Completion queues: two lock-free bounded lanes of completions, the arming state for the
//! completion channel, and the progress engine that polling drives.
//!
//! Lanes: send-queue completions (requester side) and receive completions (responder side) are
//! queued apart, each lane `depth` deep. On the in-process fabric the two are written by
//! different cores (a QP's own sends complete on the poster's core, its receives on the
//! peer's), and one shared queue made both cores write its tail for every I/O: that line
//! moving between them was the largest share of the in-process fabric's time. The receive
//! lane, the one that crosses cores, is a ring whose consumer reads only the next slot
//! (recv_ring.rs); the send lane, filled on the owner's core, a crossbeam queue. Order is kept
//! within each work queue (a QP's send queue, its receive queue or SRQ), which is what verbs
//! promises; there is no order between a QP's send and receive completions, as on hardware. A
//! poll takes the send lane first (it frees send-queue slots and the requests behind them).
//!
//! Overrun, as on hardware: a completion that finds its lane full is lost, CQ_ERR is raised,
//! and every poll of that CQ from then on fails (`TransportError::CqOverrun`), so the loss is
//! never silent: the owner must tear down what uses the CQ. A CQ thus holds at least `depth`
//! completions (up to `depth` of each kind), as hardware rounds a CQ's size up.
//!
//! Progress: polling a CQ first runs the QPs that asked for it (a send stalled on RNR or on a
//! peer that is not ready yet, with its retry timer) and, on the TCP fabric, reads the sockets
//! of the QPs attached to this CQ that epoll reports ready. With nothing pending, a poll is a
//! relaxed load or two plus the queue pops: no lock, no syscall (in-process).
//!
//! Faults: with a completion delay or cross-QP reordering switched on, completions go through a
//! held list (locked, timestamped) instead; per-QP order is kept.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use crossbeam_queue::ArrayQueue;

use super::channel::{EventQueue, SoftCompChannel};
use super::device::DeviceInner;
use super::qp::QpShared;
use super::recv_ring::RecvRing;
use super::retire::{RetireMark, RetireTable};
use super::tcp::TcpPoller;
use crate::error::{Result, TransportError};
use crate::provider::CqOps;
use crate::types::*;

/// A completion as queued: the verbs completion plus send-queue retirement (polling a send
/// completion frees the send queue slots up to and including its WR, as a verbs driver does:
/// retire.rs).
pub(crate) struct Cqe {
    pub(crate) wc: WorkCompletion,
    pub(crate) retire: Option<RetireMark>,
}

/// Which lane a completion goes to.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Lane {
    Send,
    Recv,
}

const FAULT_DELAY: u8 = 1;
const FAULT_REORDER: u8 = 2;
/// Send completions stay held while receive completions go (`set_hold_sends`).
const FAULT_HOLD_SENDS: u8 = 4;

const ARM_NONE: u8 = 0;
const ARM_ANY: u8 = 1;
const ARM_SOLICITED: u8 = 2;

#[derive(Default)]
struct Held {
    delay: Duration,
    /// Each completion with when it was pushed and the lane it came by.
    q: VecDeque<(Instant, Lane, Cqe)>,
}

pub(crate) struct CqInner {
    pub(crate) id: u32,
    depth: u32,
    dev: Arc<DeviceInner>,
    /// Send-queue completions (requester side).
    send_lane: ArrayQueue<Cqe>,
    /// Receive completions (responder side).
    recv_lane: RecvRing,
    /// How far each QP sending into this CQ has had its send queue retired.
    pub(crate) retire_table: RetireTable,
    channel: Option<Arc<EventQueue<u32>>>,
    armed: AtomicU8,
    overrun: AtomicBool,
    progress: Mutex<Vec<Weak<QpShared>>>,
    progress_n: AtomicUsize,
    pub(crate) tcp: Option<TcpPoller>,
    /// TCP: polls so far, so the device's ACK timer can tell a CQ nobody polls.
    polls: AtomicU32,
    /// The count the ACK timer saw at its last tick.
    polls_seen: AtomicU32,
    faults: AtomicU8,
    /// Set once a fault was ever switched on: only then can the held list be non-empty.
    faults_used: AtomicBool,
    held: Mutex<Held>,
}

impl CqInner {
    pub(crate) fn dev(&self) -> Arc<DeviceInner> {
        self.dev.clone()
    }

    /// Queue a send-queue completion (any thread).
    ///
    /// The common case (not armed, no fault injection) is inlined into the caller, so the
    /// completion is built straight into the lane's slot: passed by value to an out-of-line
    /// push, it was copied through the stack, its 16-byte loads stalling on the caller's
    /// narrower stores (store-forwarding), a third of this function's samples.
    #[inline]
    pub(crate) fn push_send(&self, cqe: Cqe) {
        if self.slow_push() {
            self.push_slow(Lane::Send, cqe, false);
        } else if let Err(lost) = self.send_lane.push(cqe) {
            self.overran(&lost.wc);
        }
    }

    /// Queue a receive completion (any thread). `solicited`: the message asked for a solicited
    /// event.
    #[inline]
    pub(crate) fn push_recv(&self, wc: WorkCompletion, solicited: bool) {
        if self.slow_push() {
            self.push_slow(Lane::Recv, Cqe { wc, retire: None }, solicited);
        } else if !self.recv_lane.push(&wc) {
            self.overran(&wc);
        }
    }

    /// Queue receive completions in order (one in-process list's deliveries into one QP):
    /// one claim of the ring for them all. Bit `i` of `solicited` is `wcs[i]`'s.
    #[inline]
    pub(crate) fn push_recvs(&self, wcs: &[WorkCompletion], solicited: u64) {
        if self.slow_push() {
            for (i, wc) in wcs.iter().enumerate() {
                self.push_recv(*wc, solicited >> i & 1 != 0);
            }
            return;
        }
        let queued = self.recv_lane.push_all(wcs);
        if let Some(lost) = wcs.get(queued) {
            self.overran(lost);
        }
    }

    /// Armed for an event, or a fault switched on.
    #[inline(always)]
    fn slow_push(&self) -> bool {
        self.armed.load(Ordering::Acquire) != ARM_NONE || self.faults.load(Ordering::Acquire) != 0
    }

    /// A push when armed or with faults switched on.
    #[inline(never)]
    fn push_slow(&self, lane: Lane, cqe: Cqe, solicited: bool) {
        let notify = self.armed.load(Ordering::Acquire) != ARM_NONE
            && (self.armed.load(Ordering::Acquire) == ARM_ANY
                || solicited
                || cqe.wc.status != WcStatus::Success);
        if self.faults.load(Ordering::Acquire) != 0 {
            self.held
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .q
                .push_back((Instant::now(), lane, cqe));
        } else {
            let queued = match lane {
                Lane::Send => self.send_lane.push(cqe).map_err(|lost| lost.wc),
                Lane::Recv => {
                    if self.recv_lane.push(&cqe.wc) {
                        Ok(())
                    } else {
                        Err(cqe.wc)
                    }
                }
            };
            if let Err(lost) = queued {
                self.overran(&lost);
                return;
            }
        }
        if notify && self.armed.swap(ARM_NONE, Ordering::AcqRel) != ARM_NONE {
            if let Some(ch) = &self.channel {
                ch.push(self.id);
            }
        }
    }

    /// A completion found the queue full: it is lost and the CQ is in error from now on.
    #[cold]
    fn overran(&self, lost: &WorkCompletion) {
        if !self.overrun.swap(true, Ordering::AcqRel) {
            tracing::error!(
                cq = self.id,
                depth = self.depth,
                qp = lost.qp_num,
                wr_id = lost.wr_id,
                "soft CQ overrun: completion lost; the CQ is in error"
            );
            self.dev.raise(AsyncEventKind::CqErr { cq_id: self.id });
        }
    }

    /// Where the receive completions queued so far end (a position in the receive lane).
    pub(crate) fn recv_queued_end(&self) -> u64 {
        self.recv_lane.claimed()
    }

    /// Whether the consumer has taken every receive completion queued before `end`.
    pub(crate) fn recv_reaped(&self, end: u64) -> bool {
        self.recv_lane.taken() >= end
    }

    /// Ask to be progressed on every poll until `QpShared::progress` says it is idle.
    pub(crate) fn want_progress(&self, qp: &Arc<QpShared>) {
        if !qp.claim_progress() {
            return;
        }
        self.progress
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Arc::downgrade(qp));
        self.progress_n.fetch_add(1, Ordering::Release);
    }

    /// TCP: send the ACKs that QPs progressed by this CQ hold for a frame to ride on (tcp.rs),
    /// for a consumer that stops polling: on arming, and from the device's ACK timer.
    fn send_held_acks(&self) {
        if self.tcp.is_none() || self.progress_n.load(Ordering::Acquire) == 0 {
            return;
        }
        // A copy: the QP lock is not taken under the list's (`want_progress` runs under it).
        let list = self
            .progress
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        for qp in list.iter().filter_map(Weak::upgrade) {
            super::tcp::send_held_ack(&qp);
        }
    }

    /// Armed for a completion event: the consumer waits instead of polling.
    pub(crate) fn is_armed(&self) -> bool {
        self.armed.load(Ordering::Acquire) != ARM_NONE
    }

    /// The device's ACK timer: a CQ nobody polled since the last tick sends its held ACKs.
    pub(crate) fn ack_timer_tick(&self) {
        let polls = self.polls.load(Ordering::Relaxed);
        if self.polls_seen.swap(polls, Ordering::Relaxed) == polls {
            self.send_held_acks();
        }
    }

    fn run_progress(&self) {
        let mut list =
            std::mem::take(&mut *self.progress.lock().unwrap_or_else(|e| e.into_inner()));
        let now = Instant::now();
        list.retain(|w| {
            let Some(qp) = w.upgrade() else { return false };
            // Clear first: a concurrent registration after this point re-adds it.
            qp.release_progress();
            if qp.progress(now) {
                qp.keep_progress();
                true
            } else {
                false
            }
        });
        let mut cur = self.progress.lock().unwrap_or_else(|e| e.into_inner());
        // Registrations that raced in while the list was out.
        cur.retain(|w| !list.iter().any(|x| x.ptr_eq(w)));
        list.append(&mut cur);
        *cur = list;
        self.progress_n.store(cur.len(), Ordering::Release);
    }

    fn poll(&self, out: &mut [WorkCompletion]) -> usize {
        if self.progress_n.load(Ordering::Acquire) > 0 {
            self.run_progress();
        }
        if let Some(t) = &self.tcp {
            // Only the owner polls as a rule: a plain increment, no locked instruction.
            self.polls.store(
                self.polls.load(Ordering::Relaxed).wrapping_add(1),
                Ordering::Relaxed,
            );
            t.poll();
        }
        let faults = self.faults.load(Ordering::Acquire);
        let mut n = 0;
        if faults == 0 {
            if self.faults_used.load(Ordering::Acquire) && self.held_nonempty() {
                n = self.poll_held(out, 0);
            }
            n += self.pop_sends(&mut out[n..]);
            n += self.recv_lane.pop(&mut out[n..]);
        } else {
            n = self.poll_held(out, faults);
        }
        n
    }

    /// Pops only what is there: a pop that finds the lane empty costs a SeqCst fence
    /// (crossbeam's emptiness check), which a busy poller would pay on every poll.
    #[inline(always)]
    fn pop_sends(&self, out: &mut [WorkCompletion]) -> usize {
        let ready = self.send_lane.len().min(out.len());
        let mut n = 0;
        while n < ready {
            let Some(c) = self.send_lane.pop() else { break };
            out[n] = self.reap(c);
            n += 1;
        }
        n
    }

    fn held_nonempty(&self) -> bool {
        !self
            .held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .q
            .is_empty()
    }

    #[inline(always)]
    fn reap(&self, c: Cqe) -> WorkCompletion {
        if let Some(mark) = c.retire {
            self.retire_table.retire(mark);
        }
        c.wc
    }

    fn poll_held(&self, out: &mut [WorkCompletion], faults: u8) -> usize {
        let mut h = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        // Each lane in its order; the held list keeps per-QP order across them (a QP's sends
        // among themselves, its receives among themselves).
        while let Some(c) = self.send_lane.pop() {
            h.q.push_back((now, Lane::Send, c));
        }
        let mut recvs = [WorkCompletion::default(); 16];
        loop {
            let n = self.recv_lane.pop(&mut recvs);
            if n == 0 {
                break;
            }
            h.q.extend(
                recvs[..n]
                    .iter()
                    .map(|&wc| (now, Lane::Recv, Cqe { wc, retire: None })),
            );
        }
        let delay = if faults & FAULT_DELAY != 0 {
            h.delay
        } else {
            Duration::ZERO
        };
        if faults & FAULT_HOLD_SENDS != 0 {
            // Receives overtake the held sends (as on a NIC whose ACK for a SEND comes after
            // the peer's answer to it); each lane keeps its order. No reordering meanwhile.
            let mut n = 0;
            let mut i = 0;
            while n < out.len() && i < h.q.len() {
                let (pushed, lane, _) = h.q[i];
                if lane == Lane::Send || pushed + delay > now {
                    i += 1;
                    continue;
                }
                if let Some((_, _, c)) = h.q.remove(i) {
                    out[n] = self.reap(c);
                    n += 1;
                }
            }
            return n;
        }
        let ready = h.q.iter().take_while(|(t, _, _)| *t + delay <= now).count();
        if ready == 0 {
            return 0;
        }
        if faults & FAULT_REORDER != 0 && ready > 1 {
            // Reverse the order of QPs inside the ready batch, keeping each QP's own order: a
            // stable sort by descending qp_num.
            let (batch, _) = h.q.as_mut_slices();
            if batch.len() >= ready {
                batch[..ready].sort_by_key(|c| std::cmp::Reverse(c.2.wc.qp_num));
            } else {
                h.q.make_contiguous()[..ready].sort_by_key(|c| std::cmp::Reverse(c.2.wc.qp_num));
            }
        }
        let mut n = 0;
        while n < out.len() && n < ready {
            let Some((_, _, c)) = h.q.pop_front() else {
                break;
            };
            out[n] = self.reap(c);
            n += 1;
        }
        n
    }

    pub(crate) fn set_delay(&self, delay: Duration) {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        held.delay = delay;
        self.switch_fault(FAULT_DELAY, !delay.is_zero());
    }

    pub(crate) fn set_hold_sends(&self, on: bool) {
        let _held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        self.switch_fault(FAULT_HOLD_SENDS, on);
    }

    pub(crate) fn set_reorder(&self, on: bool) {
        let _held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        self.switch_fault(FAULT_REORDER, on);
    }

    /// Turns fault `bit` on or off (under the held list's lock, taken by the caller, so that a
    /// poll sees the list and the bits change together).
    fn switch_fault(&self, bit: u8, on: bool) {
        self.faults_used.store(true, Ordering::Release);
        if on {
            self.faults.fetch_or(bit, Ordering::AcqRel);
        } else {
            self.faults.fetch_and(!bit, Ordering::AcqRel);
        }
    }
}

/// A completion queue of a soft device.
#[derive(Clone)]
pub struct SoftCq {
    pub(crate) inner: Arc<CqInner>,
}

impl SoftCq {
    pub(crate) fn new(
        dev: &Arc<DeviceInner>,
        depth: u32,
        channel: Option<&SoftCompChannel>,
    ) -> Result<SoftCq> {
        let tcp = match dev.cfg.fabric {
            SoftFabric::Tcp => Some(TcpPoller::new()?),
            SoftFabric::InProcess => None,
        };
        let inner = Arc::new(CqInner {
            id: dev.next_id(),
            depth,
            dev: dev.clone(),
            send_lane: ArrayQueue::new(depth as usize),
            recv_lane: RecvRing::new(depth),
            retire_table: RetireTable::new(dev.cfg.max_qp),
            channel: channel.map(|c| c.inner.clone()),
            armed: AtomicU8::new(ARM_NONE),
            overrun: AtomicBool::new(false),
            progress: Mutex::new(Vec::new()),
            progress_n: AtomicUsize::new(0),
            tcp,
            polls: AtomicU32::new(0),
            polls_seen: AtomicU32::new(0),
            faults: AtomicU8::new(0),
            faults_used: AtomicBool::new(false),
            held: Mutex::new(Held::default()),
        });
        dev.register_cq(&inner);
        Ok(SoftCq { inner })
    }

    /// Fault injection: hold every completion for `delay` before polling can reap it
    /// (zero switches it off).
    pub fn set_completion_delay(&self, delay: Duration) {
        self.inner.set_delay(delay);
    }

    /// Fault injection: reorder completions of different QPs within each polled batch (each
    /// QP's own completions stay in order).
    pub fn set_reorder(&self, on: bool) {
        self.inner.set_reorder(on);
    }

    /// Whether this CQ overran (a completion was lost and CQ_ERR raised).
    pub fn overrun(&self) -> bool {
        self.inner.overrun.load(Ordering::Acquire)
    }
}

impl CqOps for SoftCq {
    fn id(&self) -> u32 {
        self.inner.id
    }
    fn depth(&self) -> u32 {
        self.inner.depth
    }
    fn poll(&self, out: &mut [WorkCompletion]) -> Result<usize> {
        let n = self.inner.poll(out);
        // Checked after reaping: progress run by this poll may itself overrun the CQ.
        if self.inner.overrun.load(Ordering::Acquire) {
            return Err(TransportError::CqOverrun {
                cq_id: self.inner.id,
            });
        }
        Ok(n)
    }
    fn req_notify(&self, solicited_only: bool) -> Result<()> {
        // The consumer is about to wait for an event instead of polling.
        self.inner.send_held_acks();
        self.inner.armed.store(
            if solicited_only {
                ARM_SOLICITED
            } else {
                ARM_ANY
            },
            Ordering::Release,
        );
        Ok(())
    }
    fn progress_fd(&self) -> Option<std::os::fd::RawFd> {
        self.inner.tcp.as_ref().map(|t| t.fd())
    }
}
