//! Memory regions: registering caller memory or an allocated, page-aligned pool.
//!
//! The region owns its memory and deregisters before freeing it, so the device can never DMA
//! into freed memory.

use std::sync::Arc;

use rdma_sys::*;

use super::pd::{PdInner, VerbsPd};
use crate::error::{Result, TransportError};
use crate::mapped::MappedMemory;
use crate::provider::{MrOps, MwOps, OwnedMemory, bind_op};
use crate::types::{Access, SendOp};

/// The memory behind a region, owned only to be freed after deregistration.
#[allow(dead_code, reason = "held for its Drop")]
enum Backing {
    Owned(Box<dyn std::any::Any + Send>),
    Mapped(MappedMemory),
    /// `reg_mr_raw`: the caller keeps the memory (its safety contract).
    Borrowed,
}

/// A registered memory region.
pub struct VerbsMr {
    mr: *mut ibv_mr,
    addr: *mut u8,
    len: usize,
    access: Access,
    // Fields drop after `Drop::drop` deregistered the region: memory first, then the PD.
    _backing: Backing,
    _pd: Arc<PdInner>,
}

// SAFETY: the MR handle is used only by its owner (`&mut self` for writes), and deregistering
// from another thread is allowed by libibverbs.
unsafe impl Send for VerbsMr {}

/// verbs refuses REMOTE_WRITE without LOCAL_WRITE with a bare EINVAL: say why.
pub(crate) fn check_access(access: Access) -> Result<()> {
    if access.contains(Access::REMOTE_WRITE) && !access.contains(Access::LOCAL_WRITE) {
        return Err(TransportError::InvalidArgument(
            "memory region access REMOTE_WRITE requires LOCAL_WRITE (a verbs rule)".into(),
        ));
    }
    Ok(())
}

/// Access flags in verbs encoding (the bit values are the same).
pub(crate) fn access_bits(access: Access) -> u32 {
    let mut b = 0;
    if access.contains(Access::LOCAL_WRITE) {
        b |= ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0;
    }
    if access.contains(Access::REMOTE_WRITE) {
        b |= ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0;
    }
    if access.contains(Access::REMOTE_READ) {
        b |= ibv_access_flags::IBV_ACCESS_REMOTE_READ.0;
    }
    if access.contains(Access::MW_BIND) {
        b |= ibv_access_flags::IBV_ACCESS_MW_BIND.0;
    }
    b
}

impl VerbsMr {
    pub(crate) fn alloc(pd: &VerbsPd, len: usize, access: Access) -> Result<VerbsMr> {
        if len == 0 {
            return Err(TransportError::InvalidArgument(
                "memory region of 0 bytes".into(),
            ));
        }
        check_access(access)?;
        let mut map = MappedMemory::new(len)?;
        let addr = map.as_mut_ptr();
        Self::finish(pd, addr, len, access, Backing::Mapped(map))
    }

    pub(crate) fn register<B: OwnedMemory>(
        pd: &VerbsPd,
        mut buf: B,
        access: Access,
    ) -> Result<VerbsMr> {
        if buf.is_empty() {
            return Err(TransportError::InvalidArgument(
                "memory region of 0 bytes".into(),
            ));
        }
        check_access(access)?;
        let addr = buf.as_mut_ptr();
        let len = buf.len();
        Self::finish(pd, addr, len, access, Backing::Owned(Box::new(buf)))
    }

    /// # Safety
    /// `PdOps::reg_mr_raw`'s contract: `addr..addr+len` stays valid until the region drops.
    pub(crate) unsafe fn register_raw(
        pd: &VerbsPd,
        addr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<VerbsMr> {
        if len == 0 {
            return Err(TransportError::InvalidArgument(
                "memory region of 0 bytes".into(),
            ));
        }
        check_access(access)?;
        Self::finish(pd, addr, len, access, Backing::Borrowed)
    }

    /// Register `addr..addr+len`, owned by `backing` (freed by it on error).
    fn finish(
        pd: &VerbsPd,
        addr: *mut u8,
        len: usize,
        access: Access,
        backing: Backing,
    ) -> Result<VerbsMr> {
        // SAFETY: the PD is live and `addr..addr+len` is memory owned by `backing`, which the
        // returned region keeps until after it deregisters.
        let mr = unsafe { ibv_reg_mr(pd.inner.pd, addr.cast(), len, access_bits(access) as i32) };
        if mr.is_null() {
            return Err(TransportError::last_os("ibv_reg_mr"));
        }
        if access.contains(Access::MW_BIND) {
            // SAFETY: `mr` is live.
            pd.inner.add_region(unsafe { (*mr).lkey }, mr);
        }
        Ok(VerbsMr {
            mr,
            addr,
            len,
            access,
            _backing: backing,
            _pd: pd.inner.clone(),
        })
    }
}

impl Drop for VerbsMr {
    fn drop(&mut self) {
        if self.access.contains(Access::MW_BIND) {
            self._pd.remove_region(self.lkey());
        }
        // SAFETY: `mr` is live and deregistered exactly once, before its memory is freed.
        let rc = unsafe { ibv_dereg_mr(self.mr) };
        if rc != 0 {
            // Still registered (rxe refuses while windows are bound to it): its keys stay
            // valid, so a peer may still write the memory. Leak it rather than free it.
            tracing::error!(
                rc,
                len = self.len,
                "ibv_dereg_mr failed: the region stays registered; its memory is leaked"
            );
            std::mem::forget(std::mem::replace(&mut self._backing, Backing::Borrowed));
            std::mem::forget(self._pd.clone());
        }
    }
}

impl std::fmt::Debug for VerbsMr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerbsMr")
            .field("addr", &self.addr)
            .field("len", &self.len)
            .field("lkey", &self.lkey())
            .field("rkey", &self.rkey())
            .finish()
    }
}

impl MrOps for VerbsMr {
    fn addr(&self) -> u64 {
        self.addr as u64
    }
    fn len(&self) -> usize {
        self.len
    }
    fn lkey(&self) -> u32 {
        // SAFETY: `mr` is live while self is.
        unsafe { (*self.mr).lkey }
    }
    fn rkey(&self) -> u32 {
        // SAFETY: `mr` is live while self is.
        unsafe { (*self.mr).rkey }
    }
    fn access(&self) -> Access {
        self.access
    }
    fn as_ptr(&self) -> *mut u8 {
        self.addr
    }
}

/// A type-2 memory window.
pub struct VerbsMw {
    mw: *mut ibv_mw,
    /// The rkey of the latest bind built (`bind`), or the initial one.
    rkey: u32,
    pd: Arc<PdInner>,
}

// SAFETY: the MW handle is used only by its owner and by posts naming it; libibverbs allows
// deallocating it from any thread.
unsafe impl Send for VerbsMw {}

impl VerbsMw {
    pub(crate) fn alloc(pd: &VerbsPd) -> Result<VerbsMw> {
        // SAFETY: the PD is live.
        let mw = unsafe { ibv_alloc_mw(pd.inner.pd, ibv_mw_type::IBV_MW_TYPE_2) };
        let mw = match mw {
            None => return Err(TransportError::Unsupported("memory windows")),
            Some(p) if p.is_null() => return Err(TransportError::last_os("ibv_alloc_mw")),
            Some(p) => p,
        };
        // SAFETY: `mw` is live.
        let (handle, rkey) = unsafe { ((*mw).handle, (*mw).rkey) };
        pd.inner.add_window(handle, mw);
        Ok(VerbsMw {
            mw,
            rkey,
            pd: pd.inner.clone(),
        })
    }
}

impl MwOps<super::Verbs> for VerbsMw {
    fn handle(&self) -> u32 {
        // SAFETY: `mw` is live while self is.
        unsafe { (*self.mw).handle }
    }
    fn rkey(&self) -> u32 {
        self.rkey
    }
    fn bind(&mut self, mr: &VerbsMr, offset: usize, len: usize, access: Access) -> Result<SendOp> {
        let op = bind_op(self.handle(), self.rkey, mr, offset, len, access)?;
        if let SendOp::BindMw { rkey, .. } = op {
            self.rkey = rkey;
        }
        Ok(op)
    }
}

impl Drop for VerbsMw {
    fn drop(&mut self) {
        self.pd.remove_window(self.handle());
        // SAFETY: `mw` is live, deallocated exactly once, after leaving the PD's table.
        let rc = unsafe { ibv_dealloc_mw(self.mw) };
        if rc != 0 {
            tracing::warn!(rc, "ibv_dealloc_mw failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn access_mapping() {
        assert_eq!(access_bits(Access::LOCAL_WRITE), 1);
        assert_eq!(access_bits(Access::REMOTE_WRITE | Access::LOCAL_WRITE), 3);
        assert_eq!(access_bits(Access::REMOTE_READ), 4);
        assert_eq!(access_bits(Access::all()), Access::all().bits());
        assert!(check_access(Access::REMOTE_WRITE).is_err());
        assert!(check_access(Access::REMOTE_WRITE | Access::LOCAL_WRITE).is_ok());
        assert!(check_access(Access::REMOTE_READ).is_ok());
    }
}
