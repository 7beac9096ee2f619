//! Shared receive queues and the receive-entry type shared with per-QP receive queues: a
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

/// A posted receive, copied out of the caller's `RecvWr` (fixed size: posting never allocates).
#[derive(Clone, Copy)]
pub(crate) struct RecvEntry {
    pub(crate) wr_id: u64,
    n: u8,
    sges: [Sge; SOFT_MAX_SGE],
}

impl RecvEntry {
    pub(crate) fn new(wr: &RecvWr<'_>) -> RecvEntry {
        let mut sges = [Sge::default(); SOFT_MAX_SGE];
        let n = wr.sges.len().min(SOFT_MAX_SGE);
        sges[..n].copy_from_slice(&wr.sges[..n]);
        RecvEntry {
            wr_id: wr.wr_id,
            n: n as u8,
            sges,
        }
    }
    pub(crate) fn sges(&self) -> &[Sge] {
        &self.sges[..self.n as usize]
    }
}

pub(crate) struct SrqInner {
    pub(crate) id: u32,
    pub(crate) pd: u32,
    max_wr: u32,
    max_sge: u32,
    q: ArrayQueue<RecvEntry>,
    limit: AtomicU32,
    dev: Arc<DeviceInner>,
}

impl SrqInner {
    pub(crate) fn dev(&self) -> &Arc<DeviceInner> {
        &self.dev
    }

    /// Take a receive for an incoming message (any thread).
    pub(crate) fn pop(&self) -> Option<RecvEntry> {
        let r = self.q.pop()?;
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
            if self.q.push(RecvEntry::new(wr)).is_err() {
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
            q: ArrayQueue::new(init.max_wr as usize),
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
