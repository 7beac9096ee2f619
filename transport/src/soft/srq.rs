//! Shared receive queues and the receive queue type shared with per-QP receive queues: a
//! lock-free bounded queue posted by the owner and consumed by whichever thread delivers an
//! incoming message (the peer's, in-process), plus the SRQ limit event (one-shot, re-armed by
//! `set_limit`, as in verbs).

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use crossbeam_queue::ArrayQueue;

use super::device::{DeviceInner, SoftPd};
use super::mem::SOFT_MAX_SGE;
use crate::error::{PostError, Result, TransportError};
use crate::provider::SrqOps;
use crate::types::*;

/// A posted receive, copied out of the caller's `RecvWr` (fixed size: posting never
/// allocates), holding at most `N` SGEs.
#[derive(Clone, Copy)]
struct RecvEntry<const N: usize> {
    wr_id: u64,
    n: u8,
    sges: [Sge; N],
}

impl<const N: usize> RecvEntry<N> {
    /// `wr.sges.len() <= N` (the queue's max SGEs, checked by the poster).
    fn new(wr: &RecvWr<'_>) -> RecvEntry<N> {
        let mut sges = [Sge::default(); N];
        let n = wr.sges.len().min(N);
        sges[..n].copy_from_slice(&wr.sges[..n]);
        RecvEntry {
            wr_id: wr.wr_id,
            n: n as u8,
            sges,
        }
    }
    fn sges(&self) -> &[Sge] {
        &self.sges[..usize::from(self.n)]
    }
}

/// A receive queue (a QP's own or an SRQ's): lock-free and bounded, posted by the owner and
/// popped by whichever thread delivers a message. Its entries are sized for the queue's max
/// SGEs: an entry is copied in on post and out on pop, across cores, and a one-SGE entry (what
/// NVMe-oF posts) is 32 bytes where a 16-SGE one is 272.
pub(crate) struct RecvQueue(Entries);

/// A [`RecvQueue`]'s queue, by entry size.
enum Entries {
    One(ArrayQueue<RecvEntry<1>>),
    Four(ArrayQueue<RecvEntry<4>>),
    Max(ArrayQueue<RecvEntry<SOFT_MAX_SGE>>),
}

impl RecvQueue {
    /// `depth` receives of up to `max_sge` SGEs (at most [`SOFT_MAX_SGE`]).
    pub(crate) fn new(depth: usize, max_sge: u32) -> RecvQueue {
        RecvQueue(match max_sge {
            0 | 1 => Entries::One(ArrayQueue::new(depth)),
            2..=4 => Entries::Four(ArrayQueue::new(depth)),
            _ => Entries::Max(ArrayQueue::new(depth)),
        })
    }

    /// Post `wr` (its SGEs within the queue's max, checked by the caller); false when full.
    #[inline]
    pub(crate) fn push(&self, wr: &RecvWr<'_>) -> bool {
        match &self.0 {
            Entries::One(q) => q.push(RecvEntry::new(wr)).is_ok(),
            Entries::Four(q) => q.push(RecvEntry::new(wr)).is_ok(),
            Entries::Max(q) => q.push(RecvEntry::new(wr)).is_ok(),
        }
    }

    /// Take the oldest receive and hand its `wr_id` and SGEs to `use_recv` (a callback, so the
    /// entry is not moved again on its way out).
    #[inline]
    pub(crate) fn pop_with<R>(&self, use_recv: impl FnOnce(u64, &[Sge]) -> R) -> Option<R> {
        match &self.0 {
            Entries::One(q) => q.pop().map(|e| use_recv(e.wr_id, e.sges())),
            Entries::Four(q) => q.pop().map(|e| use_recv(e.wr_id, e.sges())),
            Entries::Max(q) => q.pop().map(|e| use_recv(e.wr_id, e.sges())),
        }
    }

    /// Receives posted and not yet consumed.
    pub(crate) fn len(&self) -> usize {
        match &self.0 {
            Entries::One(q) => q.len(),
            Entries::Four(q) => q.len(),
            Entries::Max(q) => q.len(),
        }
    }
}

pub(crate) struct SrqInner {
    pub(crate) id: u32,
    pub(crate) pd: u32,
    max_wr: u32,
    max_sge: u32,
    q: RecvQueue,
    limit: AtomicU32,
    dev: Arc<DeviceInner>,
}

impl SrqInner {
    pub(crate) fn dev(&self) -> &Arc<DeviceInner> {
        &self.dev
    }

    /// Take a receive for an incoming message (any thread): see [`RecvQueue::pop_with`].
    #[inline]
    pub(crate) fn pop_with<R>(&self, use_recv: impl FnOnce(u64, &[Sge]) -> R) -> Option<R> {
        let r = self.q.pop_with(use_recv)?;
        let limit = self.limit.load(Ordering::Relaxed);
        if limit != 0 && (self.q.len() as u32) < limit && self.limit.swap(0, Ordering::AcqRel) != 0
        {
            self.dev
                .raise(AsyncEventKind::SrqLimitReached { srq_id: self.id });
        }
        Some(r)
    }

    pub(crate) fn post(&self, wrs: &[RecvWr<'_>]) -> std::result::Result<(), PostError> {
        for (i, wr) in wrs.iter().enumerate() {
            if wr.sges.len() > self.max_sge as usize {
                return Err(PostError {
                    failed_index: i,
                    error: TransportError::InvalidArgument(format!(
                        "{} SGEs, SRQ max_sge {}",
                        wr.sges.len(),
                        self.max_sge
                    )),
                });
            }
            if !self.q.push(wr) {
                return Err(PostError {
                    failed_index: i,
                    error: TransportError::QueueFull("SRQ"),
                });
            }
        }
        Ok(())
    }
}

/// A shared receive queue of a soft device.
#[derive(Clone)]
pub struct SoftSrq {
    pub(crate) inner: Arc<SrqInner>,
    _pd: SoftPd,
}

impl SoftSrq {
    pub(crate) fn new(pd: &SoftPd, init: &SrqInit) -> Result<SoftSrq> {
        let dev = pd.dev();
        let c = &dev.cfg;
        if init.max_wr > c.max_srq_wr || init.max_wr == 0 {
            return Err(TransportError::Limit {
                what: "max_srq_wr",
                asked: init.max_wr.into(),
                max: c.max_srq_wr.into(),
            });
        }
        if init.max_sge > c.max_sge {
            return Err(TransportError::Limit {
                what: "max_srq_sge",
                asked: init.max_sge.into(),
                max: c.max_sge.into(),
            });
        }
        let inner = Arc::new(SrqInner {
            id: dev.next_id(),
            pd: pd.id(),
            max_wr: init.max_wr,
            max_sge: init.max_sge.max(1),
            q: RecvQueue::new(init.max_wr as usize, init.max_sge.max(1)),
            limit: AtomicU32::new(init.limit),
            dev: dev.clone(),
        });
        Ok(SoftSrq {
            inner,
            _pd: pd.clone(),
        })
    }

    /// Receives currently posted and not yet consumed.
    pub fn posted(&self) -> usize {
        self.inner.q.len()
    }
}

impl SrqOps for SoftSrq {
    fn id(&self) -> u32 {
        self.inner.id
    }
    fn max_wr(&self) -> u32 {
        self.inner.max_wr
    }
    fn post_recv(&self, wrs: &[RecvWr<'_>]) -> std::result::Result<(), PostError> {
        self.inner.post(wrs)
    }
    fn set_limit(&self, limit: u32) -> Result<()> {
        if limit > self.inner.max_wr {
            return Err(TransportError::InvalidArgument(format!(
                "SRQ limit {limit} > max_wr {}",
                self.inner.max_wr
            )));
        }
        self.inner.limit.store(limit, Ordering::Release);
        Ok(())
    }
}
