//! The connection manager over librdmacm: event channels, listening, resolving, connecting,
//! accepting / rejecting with private data, disconnecting, and event conversion.
//!
//! - A channel's fd is O_NONBLOCK; `poll_event` copies everything out of the event, adopts the
//!   new id of a CONNECT_REQUEST, then acknowledges it (`rdma_ack_cm_event`) before returning.
//! - `resolve` creates its id without a channel (librdmacm's synchronous mode), resolves address
//!   and route, then migrates the id onto the caller's channel, so the caller can build its
//!   PD/CQ/QP on `context()` before `connect`.
//! - An id's `context` pointer names its inner object, which holds the caller's token; an id
//!   is destroyed when its last holder (the `VerbsCmId` or its QP) goes, after the QP.

use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::os::raw::c_void;
use std::ptr::null_mut;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rdma_sys::*;

use super::pd::VerbsPd;
use super::qp::VerbsQp;
use super::sockaddr::{from_sockaddr, to_storage};
use super::{Verbs, VerbsContext, set_nonblocking};
use crate::error::{Result, TransportError};
use crate::provider::{CmChannelOps, CmEvent, CmIdOps, QpInit};
use crate::types::*;

pub(crate) struct CmChannelInner {
    ch: *mut rdma_event_channel,
    /// Held from `rdma_get_cm_event` to its ack, and around `rdma_destroy_qp` of a QP of an id
    /// on this channel: librdmacm uses `id->qp` inside `rdma_get_cm_event` (REJECTED moves it
    /// to ERR, CONNECT_RESPONSE to RTR/RTS) without a lock, and `rdma_destroy_qp` frees it
    /// and clears the pointer, also without one. The target reads events on its acceptor
    /// thread while a reactor destroys the QP.
    pub(crate) qp_lock: std::sync::Mutex<()>,
}

impl CmChannelInner {
    /// [`CmChannelInner::qp_lock`], poison or not (it guards no data).
    pub(crate) fn lock_qps(&self) -> std::sync::MutexGuard<'_, ()> {
        self.qp_lock
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

// SAFETY: an event channel is an fd plus librdmacm calls that lock internally; what they do
// not lock (an id's QP) is serialised by `qp_lock`.
unsafe impl Send for CmChannelInner {}
// SAFETY: as above.
unsafe impl Sync for CmChannelInner {}

impl Drop for CmChannelInner {
    fn drop(&mut self) {
        // SAFETY: every id on this channel held an Arc of it, so all are destroyed; the channel
        // is destroyed exactly once.
        unsafe { rdma_destroy_event_channel(self.ch) };
    }
}

/// A connection-manager event channel.
#[derive(Clone)]
pub struct VerbsCmChannel {
    inner: Arc<CmChannelInner>,
}

pub(crate) struct CmIdInner {
    pub(crate) id: *mut rdma_cm_id,
    token: AtomicU64,
    pub(crate) channel: Arc<CmChannelInner>,
}

// SAFETY: a cm id is driven through librdmacm calls, which lock internally, but for its QP
// pointer, which the channel's `qp_lock` covers (event processing and `rdma_destroy_qp`); the
// token is atomic because the channel's reader reads it.
unsafe impl Send for CmIdInner {}
// SAFETY: as above.
unsafe impl Sync for CmIdInner {}

impl Drop for CmIdInner {
    fn drop(&mut self) {
        // SAFETY: the id's QP (if any) held an Arc of this inner, so it is destroyed; events
        // are acknowledged before poll_event returns. Destroyed exactly once, before its
        // channel.
        let rc = unsafe { rdma_destroy_id(self.id) };
        if rc != 0 {
            tracing::warn!(error = %std::io::Error::last_os_error(), "rdma_destroy_id failed");
        }
    }
}

/// A connection-manager id.
pub struct VerbsCmId {
    inner: Arc<CmIdInner>,
}

impl std::fmt::Debug for VerbsCmId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerbsCmId")
            .field("token", &self.token())
            .field("local", &self.local_addr())
            .field("peer", &self.peer_addr())
            .finish()
    }
}

impl std::fmt::Debug for VerbsCmChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerbsCmChannel")
            .field("fd", &self.fd())
            .finish()
    }
}

/// Destroys a raw id unless released (error paths before the id is adopted).
struct RawId(*mut rdma_cm_id);

impl RawId {
    fn release(self) -> *mut rdma_cm_id {
        let p = self.0;
        std::mem::forget(self);
        p
    }
}

impl Drop for RawId {
    fn drop(&mut self) {
        // SAFETY: the id was created by rdma_create_id and not adopted by a CmIdInner.
        unsafe { rdma_destroy_id(self.0) };
    }
}

/// Wrap a raw id on `channel`: its `context` now names the inner (and so the token).
fn adopt(id: *mut rdma_cm_id, channel: &Arc<CmChannelInner>, token: u64) -> Arc<CmIdInner> {
    let inner = Arc::new(CmIdInner {
        id,
        token: AtomicU64::new(token),
        channel: channel.clone(),
    });
    // SAFETY: `id` is live and ours; `context` is a user field librdmacm only copies around.
    // The inner outlives the id (its Drop destroys the id), so the pointer stays valid for
    // every event of the id.
    unsafe { (*id).context = Arc::as_ptr(&inner) as *mut c_void };
    inner
}

/// The token of the id whose `context` is `ctx` (0 for an id we did not adopt).
///
/// # Safety
/// `ctx` must be NULL or the context pointer of an id set by `adopt`, whose inner is alive
/// (true while an event of that id is unacknowledged: destroying the id waits for the ack).
unsafe fn token_of(ctx: *mut c_void) -> u64 {
    if ctx.is_null() {
        return 0;
    }
    // SAFETY: per the function contract.
    unsafe { (*(ctx as *const CmIdInner)).token.load(Ordering::Relaxed) }
}

/// Refuse private data over an IB CM limit with a clear error (verbs says only EINVAL).
pub(crate) fn check_private_data(what: &'static str, data: &[u8], max: usize) -> Result<u8> {
    if data.len() > max {
        return Err(TransportError::InvalidArgument(format!(
            "{what} private data is {} bytes, at most {max} are allowed",
            data.len()
        )));
    }
    Ok(data.len() as u8)
}

/// Validate `p` for `what` (connect or accept) and build the verbs parameters, which borrow
/// `p.private_data`.
pub(crate) fn conn_param(
    what: &'static str,
    p: &ConnParam,
    max_private: usize,
) -> Result<rdma_conn_param> {
    let len = check_private_data(what, &p.private_data, max_private)?;
    if p.retry_count > 7 || p.rnr_retry_count > 7 {
        return Err(TransportError::InvalidArgument(format!(
            "{what}: retry_count {} / rnr_retry_count {} must be at most 7",
            p.retry_count, p.rnr_retry_count
        )));
    }
    Ok(rdma_conn_param {
        private_data: if len == 0 {
            std::ptr::null()
        } else {
            p.private_data.as_ptr().cast()
        },
        private_data_len: len,
        responder_resources: p.responder_resources,
        initiator_depth: p.initiator_depth,
        flow_control: 1,
        retry_count: p.retry_count,
        rnr_retry_count: p.rnr_retry_count,
        srq: 0,
        qp_num: 0,
    })
}

/// The kind of every event but CONNECT_REQUEST (which needs the new id's addresses). None for
/// events an RC user never sees on an async channel (resolution is synchronous here).
pub(crate) fn event_kind(
    code: rdma_cm_event_type::Type,
    status: i32,
    private_data: &[u8],
) -> Option<CmEventKind> {
    use rdma_cm_event_type::*;
    Some(match code {
        RDMA_CM_EVENT_ESTABLISHED => CmEventKind::Established {
            private_data: private_data.to_vec(),
        },
        RDMA_CM_EVENT_REJECTED => CmEventKind::Rejected {
            reason: status as u32,
            private_data: private_data.to_vec(),
        },
        RDMA_CM_EVENT_UNREACHABLE | RDMA_CM_EVENT_ADDR_ERROR | RDMA_CM_EVENT_ROUTE_ERROR => {
            CmEventKind::Unreachable
        }
        RDMA_CM_EVENT_CONNECT_ERROR => CmEventKind::ConnectError,
        RDMA_CM_EVENT_DISCONNECTED => CmEventKind::Disconnected,
        RDMA_CM_EVENT_TIMEWAIT_EXIT => CmEventKind::TimewaitExit,
        RDMA_CM_EVENT_DEVICE_REMOVAL => CmEventKind::DeviceRemoval,
        RDMA_CM_EVENT_ADDR_CHANGE => CmEventKind::AddrChange,
        _ => return None,
    })
}

fn event_name(code: rdma_cm_event_type::Type) -> String {
    // SAFETY: rdma_event_str returns a static string for any code.
    super::cstr_to_string(unsafe { rdma_event_str(code) })
}

fn millis(t: Duration) -> i32 {
    t.as_millis().clamp(1, i32::MAX as u128) as i32
}

/// The source / destination address of an id.
fn id_addr(id: *mut rdma_cm_id, local: bool) -> Option<SocketAddr> {
    // SAFETY: `id` is live; the address unions are sockaddr_storage-sized, filled by librdmacm
    // (AF_UNSPEC until bound / resolved).
    unsafe {
        let addr = std::ptr::addr_of!((*id).route.addr);
        if local {
            from_sockaddr(std::ptr::addr_of!((*addr).src_addr_union).cast())
        } else {
            from_sockaddr(std::ptr::addr_of!((*addr).dst_addr_union).cast())
        }
    }
}

impl VerbsCmChannel {
    pub(crate) fn new() -> Result<VerbsCmChannel> {
        // SAFETY: no arguments; returns NULL with errno on failure.
        let ch = unsafe { rdma_create_event_channel() };
        if ch.is_null() {
            let e = std::io::Error::last_os_error();
            return Err(TransportError::Os {
                op: "rdma_create_event_channel (is the rdma_ucm module loaded?)",
                source: e,
            });
        }
        let inner = Arc::new(CmChannelInner {
            ch,
            qp_lock: std::sync::Mutex::new(()),
        });
        // SAFETY: the channel is live; reading its fd number.
        set_nonblocking(unsafe { (*ch).fd }, "fcntl(cm_channel, O_NONBLOCK)")?;
        Ok(VerbsCmChannel { inner })
    }

    fn create_id(&self) -> Result<RawId> {
        let mut id = null_mut();
        // SAFETY: the channel is live; `id` is a valid out pointer.
        let rc = unsafe {
            rdma_create_id(
                self.inner.ch,
                &mut id,
                null_mut(),
                rdma_port_space::RDMA_PS_TCP,
            )
        };
        if rc != 0 {
            return Err(super::rc_error("rdma_create_id", rc));
        }
        Ok(RawId(id))
    }
}

/// ENODEV / EADDRNOTAVAIL from bind or resolve: no RDMA device serves the address.
fn addr_error(op: &'static str, addr: SocketAddr) -> TransportError {
    match super::errno() {
        libc::ENODEV | libc::EADDRNOTAVAIL => TransportError::AddressNotServed(addr),
        e => TransportError::from_errno(op, e),
    }
}

impl CmChannelOps<Verbs> for VerbsCmChannel {
    fn fd(&self) -> RawFd {
        // SAFETY: the channel is live while self is.
        unsafe { (*self.inner.ch).fd }
    }

    fn poll_event(&self) -> Result<Option<CmEvent<Verbs>>> {
        loop {
            // Until the event is acknowledged: no QP of this channel's ids is destroyed while
            // librdmacm may be using it for the event.
            let _qps = self.inner.lock_qps();
            let mut ev: *mut rdma_cm_event = null_mut();
            // SAFETY: the channel is live; `ev` is a valid out pointer.
            let rc = unsafe { rdma_get_cm_event(self.inner.ch, &mut ev) };
            if rc != 0 {
                let e = super::errno();
                if e == libc::EAGAIN || e == libc::EWOULDBLOCK {
                    return Ok(None);
                }
                return Err(TransportError::from_errno("rdma_get_cm_event", e));
            }
            // SAFETY: `ev` is a live event until acknowledged below; everything needed is
            // copied out of it first. Its ids are live (they cannot be destroyed before the
            // ack), so reading their context and addresses is valid.
            let out = unsafe {
                let e = &*ev;
                let pdata = if e.param.conn.private_data.is_null() {
                    &[][..]
                } else {
                    std::slice::from_raw_parts(
                        e.param.conn.private_data.cast::<u8>(),
                        usize::from(e.param.conn.private_data_len),
                    )
                };
                if e.event == rdma_cm_event_type::RDMA_CM_EVENT_CONNECT_REQUEST {
                    let token = token_of((*e.listen_id).context);
                    let local = id_addr(e.id, true);
                    let remote = id_addr(e.id, false);
                    // The kernel reports a request's depths from the listener's side (its
                    // responder_resources is the peer's initiator_depth and vice versa); the
                    // event carries the peer's own offer, so swap them back.
                    let kind = CmEventKind::ConnectRequest {
                        private_data: pdata.to_vec(),
                        responder_resources: e.param.conn.initiator_depth,
                        initiator_depth: e.param.conn.responder_resources,
                        local: local.unwrap_or(SocketAddr::from(([0, 0, 0, 0], 0))),
                        remote: remote.unwrap_or(SocketAddr::from(([0, 0, 0, 0], 0))),
                    };
                    let id = VerbsCmId {
                        inner: adopt(e.id, &self.inner, token),
                    };
                    Some(CmEvent {
                        token,
                        kind,
                        id: Some(id),
                    })
                } else {
                    let token = token_of((*e.id).context);
                    match event_kind(e.event, e.status, pdata) {
                        Some(kind) => Some(CmEvent {
                            token,
                            kind,
                            id: None,
                        }),
                        None => {
                            tracing::debug!(event = %event_name(e.event), "ignored CM event");
                            None
                        }
                    }
                }
            };
            // SAFETY: acknowledges exactly the event returned above, once, after the copy.
            unsafe { rdma_ack_cm_event(ev) };
            if let Some(ev) = out {
                tracing::debug!(token = ev.token, kind = ?ev.kind, "CM event");
                return Ok(Some(ev));
            }
        }
    }

    fn listen(&self, addr: SocketAddr, backlog: u32, token: u64) -> Result<VerbsCmId> {
        let raw = self.create_id()?;
        let id = VerbsCmId {
            inner: adopt(raw.release(), &self.inner, token),
        };
        let mut ss = to_storage(&addr);
        // SAFETY: the id is live; `ss` holds a valid socket address.
        let rc = unsafe { rdma_bind_addr(id.inner.id, std::ptr::addr_of_mut!(ss).cast()) };
        if rc != 0 {
            return Err(addr_error("rdma_bind_addr", addr));
        }
        let backlog = i32::try_from(backlog).unwrap_or(i32::MAX);
        // SAFETY: the id is live and bound.
        if unsafe { rdma_listen(id.inner.id, backlog) } != 0 {
            return Err(TransportError::last_os("rdma_listen"));
        }
        Ok(id)
    }

    fn resolve(
        &self,
        dst: SocketAddr,
        src: Option<SocketAddr>,
        timeout: Duration,
        token: u64,
    ) -> Result<VerbsCmId> {
        let mut id = null_mut();
        // SAFETY: a NULL channel asks for a synchronous id; `id` is a valid out pointer.
        let rc = unsafe {
            rdma_create_id(
                null_mut(),
                &mut id,
                null_mut(),
                rdma_port_space::RDMA_PS_TCP,
            )
        };
        if rc != 0 {
            return Err(super::rc_error("rdma_create_id", rc));
        }
        let raw = RawId(id);
        let mut dss = to_storage(&dst);
        let mut sss = src.map(|s| to_storage(&s));
        let sp = sss
            .as_mut()
            .map_or(null_mut(), |s| std::ptr::addr_of_mut!(*s).cast());
        // SAFETY: the id is live; both addresses are valid for the call (blocking, sync id).
        let rc = unsafe {
            rdma_resolve_addr(
                raw.0,
                sp,
                std::ptr::addr_of_mut!(dss).cast(),
                millis(timeout),
            )
        };
        if rc != 0 {
            return Err(match super::errno() {
                libc::ETIMEDOUT => TransportError::Timeout("rdma_resolve_addr"),
                _ => addr_error("rdma_resolve_addr", dst),
            });
        }
        // SAFETY: the id is live with its address resolved.
        if unsafe { rdma_resolve_route(raw.0, millis(timeout)) } != 0 {
            return Err(match super::errno() {
                libc::ETIMEDOUT => TransportError::Timeout("rdma_resolve_route"),
                e => TransportError::from_errno("rdma_resolve_route", e),
            });
        }
        // SAFETY: the id and channel are live; pending sync events are acknowledged by it.
        if unsafe { rdma_migrate_id(raw.0, self.inner.ch) } != 0 {
            return Err(TransportError::last_os("rdma_migrate_id"));
        }
        Ok(VerbsCmId {
            inner: adopt(raw.release(), &self.inner, token),
        })
    }
}

impl CmIdOps<Verbs> for VerbsCmId {
    fn token(&self) -> u64 {
        self.inner.token.load(Ordering::Relaxed)
    }

    fn set_token(&mut self, token: u64) {
        self.inner.token.store(token, Ordering::Relaxed);
    }

    fn context(&self) -> Result<VerbsContext> {
        // SAFETY: the id is live; reading the context it is bound to.
        let verbs = unsafe { (*self.inner.id).verbs };
        if verbs.is_null() {
            return Err(TransportError::Cm(
                "this CM id is not bound to a device (listening on a wildcard address?)".into(),
            ));
        }
        VerbsContext::from_raw(verbs)
    }

    fn port_num(&self) -> u8 {
        // SAFETY: the id is live.
        unsafe { (*self.inner.id).port_num }
    }

    fn local_addr(&self) -> Option<SocketAddr> {
        id_addr(self.inner.id, true)
    }

    fn peer_addr(&self) -> Option<SocketAddr> {
        id_addr(self.inner.id, false)
    }

    fn create_qp(&mut self, pd: &VerbsPd, init: &QpInit<'_, Verbs>) -> Result<VerbsQp> {
        // SAFETY: the id is live.
        if !unsafe { (*self.inner.id).qp }.is_null() {
            return Err(TransportError::InvalidArgument(
                "this CM id already has a QP".into(),
            ));
        }
        VerbsQp::new_cm(&self.inner, pd, init)
    }

    fn connect(&mut self, param: &ConnParam) -> Result<()> {
        let mut p = conn_param("connect", param, MAX_CONNECT_PRIVATE_DATA)?;
        // SAFETY: the id is live; `p` borrows `param.private_data`, which outlives the call.
        if unsafe { rdma_connect(self.inner.id, &mut p) } != 0 {
            return Err(TransportError::last_os("rdma_connect"));
        }
        Ok(())
    }

    fn accept(&mut self, param: &ConnParam) -> Result<()> {
        let mut p = conn_param("accept", param, MAX_ACCEPT_PRIVATE_DATA)?;
        // SAFETY: the id is live; `p` borrows `param.private_data`, which outlives the call.
        if unsafe { rdma_accept(self.inner.id, &mut p) } != 0 {
            return Err(TransportError::last_os("rdma_accept"));
        }
        Ok(())
    }

    fn reject(&mut self, private_data: &[u8]) -> Result<()> {
        let len = check_private_data("reject", private_data, MAX_REJECT_PRIVATE_DATA)?;
        let ptr = if len == 0 {
            std::ptr::null()
        } else {
            private_data.as_ptr().cast()
        };
        // SAFETY: the id is live; `ptr..ptr+len` is readable for the call.
        if unsafe { rdma_reject(self.inner.id, ptr, len) } != 0 {
            return Err(TransportError::last_os("rdma_reject"));
        }
        Ok(())
    }

    fn disconnect(&mut self) -> Result<()> {
        // SAFETY: the id is live.
        if unsafe { rdma_disconnect(self.inner.id) } != 0 {
            return Err(TransportError::last_os("rdma_disconnect"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdma_cm_event_type::*;

    #[test]
    fn private_data_limits() {
        assert_eq!(
            check_private_data("connect", &[0; 56], MAX_CONNECT_PRIVATE_DATA).unwrap(),
            56
        );
        let e = check_private_data("connect", &[0; 57], MAX_CONNECT_PRIVATE_DATA).unwrap_err();
        assert!(
            e.to_string()
                .contains("connect private data is 57 bytes, at most 56"),
            "{e}"
        );
        assert!(check_private_data("accept", &[0; 196], MAX_ACCEPT_PRIVATE_DATA).is_ok());
        assert!(check_private_data("accept", &[0; 197], MAX_ACCEPT_PRIVATE_DATA).is_err());
        assert!(check_private_data("reject", &[0; 148], MAX_REJECT_PRIVATE_DATA).is_ok());
        assert!(check_private_data("reject", &[0; 149], MAX_REJECT_PRIVATE_DATA).is_err());
        // 300 bytes must not wrap to a u8 length of 44
        assert!(check_private_data("accept", &[0; 300], MAX_ACCEPT_PRIVATE_DATA).is_err());
    }

    #[test]
    fn conn_param_conversion() {
        let p = ConnParam {
            private_data: vec![1, 2, 3],
            responder_resources: 16,
            initiator_depth: 8,
            retry_count: 7,
            rnr_retry_count: 7,
        };
        let c = conn_param("connect", &p, MAX_CONNECT_PRIVATE_DATA).unwrap();
        assert_eq!(c.private_data_len, 3);
        assert_eq!(c.private_data as usize, p.private_data.as_ptr() as usize);
        assert_eq!((c.responder_resources, c.initiator_depth), (16, 8));
        assert_eq!((c.retry_count, c.rnr_retry_count), (7, 7));
        let empty = conn_param("accept", &ConnParam::default(), MAX_ACCEPT_PRIVATE_DATA).unwrap();
        assert!(empty.private_data.is_null());
        let bad = ConnParam {
            rnr_retry_count: 8,
            ..ConnParam::default()
        };
        assert!(conn_param("connect", &bad, MAX_CONNECT_PRIVATE_DATA).is_err());
        let big = ConnParam {
            private_data: vec![0; 57],
            ..ConnParam::default()
        };
        assert!(matches!(
            conn_param("connect", &big, MAX_CONNECT_PRIVATE_DATA),
            Err(TransportError::InvalidArgument(_))
        ));
    }

    #[test]
    fn event_mapping() {
        assert_eq!(
            event_kind(RDMA_CM_EVENT_ESTABLISHED, 0, &[9]),
            Some(CmEventKind::Established {
                private_data: vec![9]
            })
        );
        assert_eq!(
            event_kind(RDMA_CM_EVENT_REJECTED, 28, &[1, 0, 6, 0]),
            Some(CmEventKind::Rejected {
                reason: 28,
                private_data: vec![1, 0, 6, 0]
            })
        );
        assert_eq!(
            event_kind(RDMA_CM_EVENT_UNREACHABLE, -110, &[]),
            Some(CmEventKind::Unreachable)
        );
        assert_eq!(
            event_kind(RDMA_CM_EVENT_CONNECT_ERROR, 0, &[]),
            Some(CmEventKind::ConnectError)
        );
        assert_eq!(
            event_kind(RDMA_CM_EVENT_DISCONNECTED, 0, &[]),
            Some(CmEventKind::Disconnected)
        );
        assert_eq!(
            event_kind(RDMA_CM_EVENT_TIMEWAIT_EXIT, 0, &[]),
            Some(CmEventKind::TimewaitExit)
        );
        assert_eq!(
            event_kind(RDMA_CM_EVENT_DEVICE_REMOVAL, 0, &[]),
            Some(CmEventKind::DeviceRemoval)
        );
        assert_eq!(
            event_kind(RDMA_CM_EVENT_ADDR_CHANGE, 0, &[]),
            Some(CmEventKind::AddrChange)
        );
        assert_eq!(event_kind(RDMA_CM_EVENT_MULTICAST_JOIN, 0, &[]), None);
        assert_eq!(event_kind(RDMA_CM_EVENT_ADDR_RESOLVED, 0, &[]), None);
    }

    #[test]
    fn timeouts_in_millis() {
        assert_eq!(millis(Duration::from_secs(5)), 5000);
        assert_eq!(millis(Duration::ZERO), 1);
        assert_eq!(millis(Duration::from_secs(u64::MAX)), i32::MAX);
    }
}
