//! Completion queues and completion channels.
//!
//! A CQ is polled in batches straight into the caller's slice (through a small stack buffer
//! of `ibv_wc`, no allocation). For idle sleep a CQ is armed (`req_notify`) and its completion
//! channel fd (O_NONBLOCK) becomes readable; `get_event` reads and acknowledges one event. A
//! CQ's id is its kernel handle, unique on the device, which is also how async events name it.

use std::mem::MaybeUninit;
use std::os::fd::RawFd;
use std::sync::Arc;

use rdma_sys::*;

use super::{VerbsContext, set_nonblocking, wc};
use crate::error::{Result, TransportError};
use crate::provider::{CompChannelOps, ContextOps, CqOps};
use crate::types::WorkCompletion;

pub(crate) struct CompChannelInner {
    ch: *mut ibv_comp_channel,
    _ctx: VerbsContext,
}

// SAFETY: the channel is used only through thread-safe libibverbs calls and a read-only fd.
unsafe impl Send for CompChannelInner {}
// SAFETY: as above.
unsafe impl Sync for CompChannelInner {}

impl Drop for CompChannelInner {
    fn drop(&mut self) {
        // SAFETY: every CQ attached to this channel held an Arc of it, so none is left;
        // destroyed exactly once.
        let rc = unsafe { ibv_destroy_comp_channel(self.ch) };
        if rc != 0 {
            tracing::warn!(rc, "ibv_destroy_comp_channel failed");
        }
    }
}

/// A completion channel: one fd for sleeping on any armed CQ attached to it.
#[derive(Clone)]
pub struct VerbsCompChannel {
    inner: Arc<CompChannelInner>,
}

impl VerbsCompChannel {
    pub(crate) fn new(ctx: &VerbsContext) -> Result<VerbsCompChannel> {
        // SAFETY: the context is live.
        let ch = unsafe { ibv_create_comp_channel(ctx.raw()) };
        if ch.is_null() {
            return Err(TransportError::last_os("ibv_create_comp_channel"));
        }
        let inner = Arc::new(CompChannelInner {
            ch,
            _ctx: ctx.clone(),
        });
        // on error `inner` drops and destroys the channel
        // SAFETY: `ch` is live; reading its fd number.
        set_nonblocking(unsafe { (*ch).fd }, "fcntl(comp_channel, O_NONBLOCK)")?;
        Ok(VerbsCompChannel { inner })
    }
}

impl std::fmt::Debug for VerbsCompChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerbsCompChannel")
            .field("fd", &self.fd())
            .finish()
    }
}

impl CompChannelOps for VerbsCompChannel {
    fn fd(&self) -> RawFd {
        // SAFETY: the channel is live while self is.
        unsafe { (*self.inner.ch).fd }
    }

    fn get_event(&self) -> Result<Option<u32>> {
        let mut cq: *mut ibv_cq = std::ptr::null_mut();
        let mut cq_ctx = std::ptr::null_mut();
        // SAFETY: the channel is live; both out pointers are valid.
        let rc = unsafe { ibv_get_cq_event(self.inner.ch, &mut cq, &mut cq_ctx) };
        if rc != 0 {
            let e = super::errno();
            if e == libc::EAGAIN || e == libc::EWOULDBLOCK {
                return Ok(None);
            }
            return Err(TransportError::from_errno("ibv_get_cq_event", e));
        }
        // SAFETY: the CQ cannot be destroyed before this event is acknowledged (destroy waits
        // for it), so reading its handle and acknowledging are valid.
        let id = unsafe {
            let id = (*cq).handle;
            ibv_ack_cq_events(cq, 1);
            id
        };
        Ok(Some(id))
    }
}

pub(crate) struct CqInner {
    pub(crate) cq: *mut ibv_cq,
    pub(crate) ctx: VerbsContext,
    depth: u32,
    /// rxe: see `wc::convert`.
    rxe_inv_flag: bool,
    _channel: Option<Arc<CompChannelInner>>,
}

// SAFETY: libibverbs providers serialise polling and arming of one CQ internally.
unsafe impl Send for CqInner {}
// SAFETY: as above.
unsafe impl Sync for CqInner {}

impl Drop for CqInner {
    fn drop(&mut self) {
        // SAFETY: every QP using this CQ held an Arc of it, so none is left; channel events
        // are acknowledged as they are read. Destroyed exactly once, before the channel.
        let rc = unsafe { ibv_destroy_cq(self.cq) };
        if rc != 0 {
            tracing::warn!(rc, "ibv_destroy_cq failed");
        }
    }
}

/// A completion queue.
#[derive(Clone)]
pub struct VerbsCq {
    pub(crate) inner: Arc<CqInner>,
}

impl VerbsCq {
    pub(crate) fn new(
        ctx: &VerbsContext,
        depth: u32,
        channel: Option<&VerbsCompChannel>,
    ) -> Result<VerbsCq> {
        let cqe = i32::try_from(depth.max(1)).map_err(|_| TransportError::Limit {
            what: "CQ depth",
            asked: u64::from(depth),
            max: i32::MAX as u64,
        })?;
        if let Some(ch) = channel {
            if !ch.inner._ctx.same_device(ctx) {
                return Err(TransportError::Mismatch(
                    "completion channel of another device",
                ));
            }
        }
        let ch = channel.map_or(std::ptr::null_mut(), |c| c.inner.ch);
        // SAFETY: the context (and channel, if any) are live.
        let cq = unsafe { ibv_create_cq(ctx.raw(), cqe, std::ptr::null_mut(), ch, 0) };
        if cq.is_null() {
            return Err(TransportError::last_os("ibv_create_cq"));
        }
        // SAFETY: `cq` was just created; cqe is what the device granted.
        let granted = unsafe { (*cq).cqe }.max(0) as u32;
        const RXE_VENDOR_ID: u32 = 0x00ff_ffff;
        let rxe_inv_flag = ctx.name().starts_with("rxe")
            || ctx
                .query_device()
                .is_ok_and(|a| a.vendor_id == RXE_VENDOR_ID);
        Ok(VerbsCq {
            inner: Arc::new(CqInner {
                cq,
                ctx: ctx.clone(),
                depth: granted,
                rxe_inv_flag,
                _channel: channel.map(|c| c.inner.clone()),
            }),
        })
    }
}

impl std::fmt::Debug for VerbsCq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerbsCq")
            .field("id", &self.id())
            .field("depth", &self.depth())
            .finish()
    }
}

/// Completions polled per `ibv_poll_cq` call.
const POLL_BATCH: usize = 32;

impl CqOps for VerbsCq {
    fn id(&self) -> u32 {
        // SAFETY: the CQ is live while self is.
        unsafe { (*self.inner.cq).handle }
    }

    fn depth(&self) -> u32 {
        self.inner.depth
    }

    fn poll(&self, out: &mut [WorkCompletion]) -> Result<usize> {
        // Uninitialised (no 1.5 KiB cleared per poll): providers write only some fields of an
        // error completion, and `wc::convert` reads only those a completion's status defines.
        let mut buf = [const { MaybeUninit::<ibv_wc>::uninit() }; POLL_BATCH];
        let mut done = 0;
        while done < out.len() {
            let want = (out.len() - done).min(POLL_BATCH);
            // SAFETY: the CQ is live; `buf` has room for `want` <= POLL_BATCH entries.
            let n = unsafe {
                ibv_poll_cq(
                    self.inner.cq,
                    want as i32,
                    buf.as_mut_ptr().cast::<ibv_wc>(),
                )
            };
            if n < 0 {
                // What earlier batches took off the CQ is handed over; the error (which a
                // failed CQ keeps returning) comes with the next call.
                if done > 0 {
                    return Ok(done);
                }
                // providers return -1 or a negative errno
                let e = if n < -1 { -n } else { libc::EIO };
                return Err(TransportError::from_errno("ibv_poll_cq", e));
            }
            let n = n as usize;
            for (slot, wc) in out[done..done + n].iter_mut().zip(&buf[..n]) {
                // SAFETY: ibv_poll_cq filled the first `n` entries (what their status defines).
                *slot = unsafe { wc::convert(wc.as_ptr(), self.inner.rxe_inv_flag) };
            }
            done += n;
            if n < want {
                break;
            }
        }
        Ok(done)
    }

    fn req_notify(&self, solicited_only: bool) -> Result<()> {
        // SAFETY: the CQ is live.
        let rc = unsafe { ibv_req_notify_cq(self.inner.cq, i32::from(solicited_only)) };
        if rc != 0 {
            return Err(super::rc_error("ibv_req_notify_cq", rc));
        }
        Ok(())
    }
}
