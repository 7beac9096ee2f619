//! Protection domains: the scope of memory regions, SRQs and QPs.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use rdma_sys::*;

use super::mr::{VerbsMr, VerbsMw};
use super::qp::VerbsQp;
use super::srq::VerbsSrq;
use super::{Verbs, VerbsContext};
use crate::error::{Result, TransportError};
use crate::provider::{OwnedMemory, PdOps, QpInit};
use crate::types::{Access, SrqInit};

pub(crate) struct PdInner {
    pub(crate) pd: *mut ibv_pd,
    pub(crate) ctx: VerbsContext,
    /// What a `SendOp::BindMw` names by number, for its post: live windows by handle and
    /// bindable regions (MW_BIND) by lkey. An entry leaves before its object is freed, so a
    /// stale number is refused, never dereferenced.
    binding: Mutex<Binding>,
}

#[derive(Default)]
struct Binding {
    windows: HashMap<u32, usize>,
    regions: HashMap<u32, usize>,
}

impl PdInner {
    pub(crate) fn add_window(&self, handle: u32, mw: *mut ibv_mw) {
        self.bindings().windows.insert(handle, mw as usize);
    }
    pub(crate) fn remove_window(&self, handle: u32) {
        self.bindings().windows.remove(&handle);
    }
    pub(crate) fn add_region(&self, lkey: u32, mr: *mut ibv_mr) {
        self.bindings().regions.insert(lkey, mr as usize);
    }
    pub(crate) fn remove_region(&self, lkey: u32) {
        self.bindings().regions.remove(&lkey);
    }
    /// Post `wr` (a bind) with the window and region it names looked up. The lock is held
    /// across the post so neither can be freed meanwhile.
    pub(crate) fn with_bind_targets(
        &self,
        mw: u32,
        lkey: u32,
        post: impl FnOnce(*mut ibv_mw, *mut ibv_mr) -> Result<(), TransportError>,
    ) -> Result<(), TransportError> {
        let b = self.bindings();
        let (Some(&w), Some(&r)) = (b.windows.get(&mw), b.regions.get(&lkey)) else {
            return Err(TransportError::InvalidArgument(format!(
                "bind: no memory window {mw} or MW_BIND region with lkey {lkey:#x} on this PD"
            )));
        };
        post(w as *mut ibv_mw, r as *mut ibv_mr)
    }
    fn bindings(&self) -> std::sync::MutexGuard<'_, Binding> {
        self.binding.lock().unwrap_or_else(|e| e.into_inner())
    }
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
                binding: Mutex::default(),
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

    fn reg_mr_owned<B: OwnedMemory>(&self, buf: B, access: Access) -> Result<VerbsMr> {
        VerbsMr::register(self, buf, access)
    }

    unsafe fn reg_mr_raw(&self, ptr: *mut u8, len: usize, access: Access) -> Result<VerbsMr> {
        // SAFETY: the caller's contract is `register_raw`'s.
        unsafe { VerbsMr::register_raw(self, ptr, len, access) }
    }

    fn alloc_mw(&self) -> Result<VerbsMw> {
        VerbsMw::alloc(self)
    }

    fn create_srq(&self, init: &SrqInit) -> Result<VerbsSrq> {
        VerbsSrq::new(self, init)
    }

    fn create_qp(&self, init: &QpInit<'_, Verbs>) -> Result<VerbsQp> {
        VerbsQp::new(self, init)
    }
}
