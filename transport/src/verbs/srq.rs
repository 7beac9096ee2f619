//! Shared receive queues: one receive pool for many QPs, with a low-water limit event.

use std::sync::Arc;

use rdma_sys::*;

use super::pd::{PdInner, VerbsPd};
use super::wr;
use crate::error::{PostError, Result, TransportError};
use crate::provider::SrqOps;
use crate::types::{RecvWr, SrqInit};

pub(crate) struct SrqInner {
    pub(crate) srq: *mut ibv_srq,
    pub(crate) pd: Arc<PdInner>,
    max_wr: u32,
}

// SAFETY: providers serialise posting to one SRQ internally.
unsafe impl Send for SrqInner {}
// SAFETY: as above.
unsafe impl Sync for SrqInner {}

impl Drop for SrqInner {
    fn drop(&mut self) {
        // SAFETY: every QP attached to this SRQ held an Arc of it, so none is left; async
        // events are acknowledged as read. Destroyed exactly once, before its PD.
        let rc = unsafe { ibv_destroy_srq(self.srq) };
        if rc != 0 {
            tracing::warn!(rc, "ibv_destroy_srq failed");
        }
    }
}

/// A shared receive queue.
#[derive(Clone)]
pub struct VerbsSrq {
    pub(crate) inner: Arc<SrqInner>,
}

impl VerbsSrq {
    pub(crate) fn new(pd: &VerbsPd, init: &SrqInit) -> Result<VerbsSrq> {
        let mut attr = ibv_srq_init_attr {
            srq_context: std::ptr::null_mut(),
            // srq_limit is ignored at creation by verbs: armed below
            attr: ibv_srq_attr {
                max_wr: init.max_wr,
                max_sge: init.max_sge,
                srq_limit: 0,
            },
        };
        // SAFETY: the PD is live; `attr` is a valid init struct the call may update.
        let srq = unsafe { ibv_create_srq(pd.inner.pd, &mut attr) };
        if srq.is_null() {
            return Err(TransportError::last_os("ibv_create_srq"));
        }
        let s = VerbsSrq {
            inner: Arc::new(SrqInner {
                srq,
                pd: pd.inner.clone(),
                max_wr: attr.attr.max_wr,
            }),
        };
        if init.limit > 0 {
            // on error `s` drops and destroys the SRQ
            s.set_limit(init.limit)?;
        }
        Ok(s)
    }
}

impl std::fmt::Debug for VerbsSrq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerbsSrq")
            .field("id", &self.id())
            .field("max_wr", &self.max_wr())
            .finish()
    }
}

impl SrqOps for VerbsSrq {
    fn id(&self) -> u32 {
        // SAFETY: the SRQ is live while self is.
        unsafe { (*self.inner.srq).handle }
    }

    fn max_wr(&self) -> u32 {
        self.inner.max_wr
    }

    fn post_recv(&self, wrs: &[RecvWr<'_>]) -> std::result::Result<(), PostError> {
        let srq = self.inner.srq;
        wr::post_recv_chunked(wrs, "ibv_post_srq_recv", |head, bad| {
            // SAFETY: the SRQ is live; `head` is a well-formed chain valid for this call.
            unsafe { ibv_post_srq_recv(srq, head, bad) }
        })
    }

    fn set_limit(&self, limit: u32) -> Result<()> {
        let mut attr = ibv_srq_attr {
            max_wr: 0,
            max_sge: 0,
            srq_limit: limit,
        };
        // SAFETY: the SRQ is live; only the limit is modified.
        let rc = unsafe {
            ibv_modify_srq(
                self.inner.srq,
                &mut attr,
                ibv_srq_attr_mask::IBV_SRQ_LIMIT.0 as i32,
            )
        };
        if rc != 0 {
            return Err(super::rc_error("ibv_modify_srq(limit)", rc));
        }
        Ok(())
    }
}
