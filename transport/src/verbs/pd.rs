//! Protection domains: the scope of memory regions, SRQs and QPs.

use std::sync::Arc;

use rdma_sys::*;

use super::mr::VerbsMr;
use super::qp::VerbsQp;
use super::srq::VerbsSrq;
use super::{Verbs, VerbsContext};
use crate::error::{Result, TransportError};
use crate::provider::{PdOps, QpInit};
use crate::types::{Access, SrqInit};

pub(crate) struct PdInner {
    pub(crate) pd: *mut ibv_pd,
    pub(crate) ctx: VerbsContext,
}

// SAFETY: an ibv_pd is used only through thread-safe libibverbs calls.
unsafe impl Send for PdInner {}
// SAFETY: as above.
unsafe impl Sync for PdInner {}

impl Drop for PdInner {
    fn drop(&mut self) {
        // SAFETY: `pd` is live and every MR/SRQ/QP made on it held an Arc of this inner, so
        // they are gone; deallocated exactly once.
        let rc = unsafe { ibv_dealloc_pd(self.pd) };
        if rc != 0 {
            tracing::warn!(rc, "ibv_dealloc_pd failed");
        }
    }
}

/// A protection domain.
#[derive(Clone)]
pub struct VerbsPd {
    pub(crate) inner: Arc<PdInner>,
}

impl VerbsPd {
    pub(crate) fn new(ctx: &VerbsContext) -> Result<VerbsPd> {
        // SAFETY: the context is live.
        let pd = unsafe { ibv_alloc_pd(ctx.raw()) };
        if pd.is_null() {
            return Err(TransportError::last_os("ibv_alloc_pd"));
        }
        Ok(VerbsPd {
            inner: Arc::new(PdInner {
                pd,
                ctx: ctx.clone(),
            }),
        })
    }

    /// The device this PD belongs to.
    pub fn context(&self) -> &VerbsContext {
        &self.inner.ctx
    }
}

impl std::fmt::Debug for VerbsPd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerbsPd")
            .field("device", &self.inner.ctx)
            .finish()
    }
}

impl PdOps<Verbs> for VerbsPd {
    fn alloc_mr(&self, len: usize, access: Access) -> Result<VerbsMr> {
        VerbsMr::alloc(self, len, access)
    }

    fn reg_mr(&self, buf: Box<[u8]>, access: Access) -> Result<VerbsMr> {
        VerbsMr::register(self, buf, access)
    }

    fn create_srq(&self, init: &SrqInit) -> Result<VerbsSrq> {
        VerbsSrq::new(self, init)
    }

    fn create_qp(&self, init: &QpInit<'_, Verbs>) -> Result<VerbsQp> {
        VerbsQp::new(self, init)
    }
}
