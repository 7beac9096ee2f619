//! The contract every RDMA provider (verbs, soft) implements.
//!
//! Providers implement these traits on their own types; the crate's public API (`device`, `cm`)
//! is an enum over providers that dispatches to them, so the fast path pays a predictable
//! branch, never a virtual call, and layers above are not generic.
//!
//! Semantics are those of ibverbs / librdmacm; where a provider cannot honour one it says so
//! with `TransportError::Unsupported`, never silently.
//!
//! Ownership and drop order: handles that others depend on (context, PD, CQ, SRQ, completion
//! channel, CM id) are cheap clones of a shared inner object, and a dependent object keeps
//! clones of what it was created from. So a QP is destroyed before its CQs, SRQ and PD; an MR
//! before its PD; a CM id after its QP, whatever order the caller drops them in.
//!
//! Threading: `Context`, `Pd`, `Cq`, `Srq`, `CompChannel` and `CmChannel` are `Send + Sync`.
//! `Qp`, `Mr` and `CmId` are `Send` and used through `&mut self` where they change state, so
//! only their owner (one reactor) can post or transition them.

use std::net::SocketAddr;
use std::os::fd::RawFd;

use crate::error::{PostError, Result};
use crate::types::*;

/// A provider: lists and opens devices, creates CM channels.
pub trait Provider: Sized + 'static {
    type Context: ContextOps<Self>;
    type Pd: PdOps<Self>;
    type Mr: MrOps;
    type Mw: MwOps<Self>;
    type CompChannel: CompChannelOps;
    type Cq: CqOps;
    type Srq: SrqOps;
    type Qp: QpOps;
    type CmChannel: CmChannelOps<Self>;
    type CmId: CmIdOps<Self>;

    const KIND: ProviderKind;

    /// The devices this provider can open.
    fn devices() -> Result<Vec<DeviceInfo>>;
    /// A connection-manager event channel for this provider.
    fn create_cm_channel() -> Result<Self::CmChannel>;
}

/// An opened device.
pub trait ContextOps<P: Provider>: Clone + Send + Sync {
    fn name(&self) -> &str;
    fn query_device(&self) -> Result<DeviceAttr>;
    fn query_port(&self, port: u8) -> Result<PortAttr>;
    /// The populated entries of a port's GID table (zero GIDs skipped).
    fn gid_table(&self, port: u8) -> Result<Vec<GidEntry>>;
    fn alloc_pd(&self) -> Result<P::Pd>;
    fn create_comp_channel(&self) -> Result<P::CompChannel>;
    /// A CQ of at least `depth` entries, optionally signalling `channel` when armed.
    fn create_cq(&self, depth: u32, channel: Option<&P::CompChannel>) -> Result<P::Cq>;
    /// Non-blocking: the next async event, already acknowledged.
    fn poll_async_event(&self) -> Result<Option<AsyncEvent>>;
    /// Readable when an async event is pending (for epoll / idle sleep).
    fn async_fd(&self) -> RawFd;
}

/// A protection domain.
pub trait PdOps<P: Provider>: Clone + Send + Sync {
    /// Allocate `len` bytes of page-aligned, zeroed memory and register it.
    fn alloc_mr(&self, len: usize, access: Access) -> Result<P::Mr>;
    /// Register memory the caller owns and hands over: the region keeps `buf` alive until it
    /// is deregistered (dropped), so the device can never write to freed memory.
    fn reg_mr_owned<B: OwnedMemory>(&self, buf: B, access: Access) -> Result<P::Mr>;
    /// Register `ptr..ptr + len`, memory the caller keeps (a block client's buffers, huge
    /// pages, an io_uring-registered buffer).
    ///
    /// # Safety
    /// The memory is valid for reads and writes for `len` bytes, and stays allocated (not
    /// freed, unmapped or remapped) until the returned region is dropped; the device and any
    /// peer holding the rkey may access it at any time until then. While it is registered the
    /// caller touches it only as `MrOps::view` / `view_mut` allow (no reference to a range a
    /// work request or an rkey may write), or through the region's `read_at` / `write_at`.
    /// On the soft provider, memory registered more than once must be registered with the
    /// same bounds (the bounds fix the access size of the race-free copies, `shared_mem`).
    unsafe fn reg_mr_raw(&self, ptr: *mut u8, len: usize, access: Access) -> Result<P::Mr>;
    /// A type-2 memory window (bound by a `SendOp::BindMw` work request). `Unsupported` where
    /// the device does not report `DeviceCapFlags::MEM_WINDOW`.
    fn alloc_mw(&self) -> Result<P::Mw>;
    fn create_srq(&self, init: &SrqInit) -> Result<P::Srq>;
    fn create_qp(&self, init: &QpInit<'_, P>) -> Result<P::Qp>;
}

/// What a QP is created with.
pub struct QpInit<'a, P: Provider> {
    pub send_cq: &'a P::Cq,
    pub recv_cq: &'a P::Cq,
    /// Receives come from this SRQ instead of a per-QP receive queue.
    pub srq: Option<&'a P::Srq>,
    pub caps: QpCaps,
    /// Every send is signaled, whatever its flags say.
    pub sq_sig_all: bool,
}

/// A registered memory region.
///
/// The device, and a remote peer through the rkey, may read or write the memory whenever a
/// posted work request or a granted rkey allows it, concurrently with the CPU. So the region
/// never hands out a safe reference to its memory: the CPU copies in and out with
/// [`read_at`](MrOps::read_at) / [`write_at`](MrOps::write_at) (race-free in Rust's model,
/// see `shared_mem`), takes the raw pointer for FFI ([`as_ptr`](MrOps::as_ptr)), or borrows a
/// range with the `unsafe` [`view`](MrOps::view) / [`view_mut`](MrOps::view_mut) when it knows
/// that nothing else can touch that range while the borrow lives.
pub trait MrOps: Send {
    fn addr(&self) -> u64;
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    fn lkey(&self) -> u32;
    fn rkey(&self) -> u32;
    fn access(&self) -> Access;
    /// The region's first byte, for FFI consumers (io_uring buffer registration, a block
    /// device's DMA). Valid for `len()` bytes while the region lives; whoever dereferences it
    /// takes on the contract of [`view_mut`](MrOps::view_mut).
    fn as_ptr(&self) -> *mut u8;

    /// Copy `dst.len()` bytes at `offset` out of the region. A range outside the region is
    /// `TransportError::OutOfBounds`. Bytes the device or a peer writes during the copy are
    /// unspecified, never undefined behaviour.
    fn read_at(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        // SAFETY: `as_ptr()..+len()` is the region's memory, live while `self` is.
        unsafe { crate::shared_mem::read_at(self.as_ptr(), self.len(), offset, dst) }
    }

    /// Copy `src` into the region at `offset`. A range outside the region is
    /// `TransportError::OutOfBounds`.
    fn write_at(&self, offset: usize, src: &[u8]) -> Result<()> {
        // SAFETY: as in `read_at`; region memory is CPU-writable.
        unsafe { crate::shared_mem::write_at(self.as_ptr(), self.len(), offset, src) }
    }

    /// Copy `range` out of the region into a new vector (control path, tests, tools).
    fn read_vec(&self, range: std::ops::Range<usize>) -> Result<Vec<u8>> {
        let mut out = vec![0; range.end.saturating_sub(range.start)];
        self.read_at(range.start, &mut out)?;
        Ok(out)
    }

    /// A shared borrow of `range` of the region.
    ///
    /// # Safety
    /// While the returned slice lives, nothing may write to `range`: no posted work request
    /// that writes it (a receive, an RDMA READ into it), no rkey (of this region or of a
    /// memory window over it) through which a peer can write it, and no CPU write through
    /// `write_at`, `as_ptr` or a [`view_mut`](MrOps::view_mut) overlapping it.
    ///
    /// # Panics
    /// When `range` is not inside the region (a programming error).
    unsafe fn view(&self, range: std::ops::Range<usize>) -> &[u8] {
        let base = self.as_ptr();
        assert!(
            range.start <= range.end && range.end <= self.len(),
            "memory view out of bounds"
        );
        // SAFETY: in bounds (checked above) of memory the region owns while `self` is
        // borrowed; the caller guarantees no concurrent writer for the borrow's lifetime.
        unsafe { std::slice::from_raw_parts(base.add(range.start), range.len()) }
    }

    /// An exclusive borrow of `range` of the region.
    ///
    /// # Safety
    /// While the returned slice lives, nothing else may read or write `range`: no posted work
    /// request that reads or writes it (a send from it, an RDMA WRITE from it, a receive or
    /// RDMA READ into it), no rkey through which a peer can reach it, and no other CPU access
    /// (`read_at`, `write_at`, `as_ptr`, another view) overlapping it.
    ///
    /// # Panics
    /// When `range` is not inside the region (a programming error).
    #[allow(
        clippy::mut_from_ref,
        reason = "the memory is the device's; exclusivity is the caller's contract"
    )]
    unsafe fn view_mut(&self, range: std::ops::Range<usize>) -> &mut [u8] {
        let base = self.as_ptr();
        assert!(
            range.start <= range.end && range.end <= self.len(),
            "memory view out of bounds"
        );
        // SAFETY: in bounds (checked above); the caller guarantees exclusivity.
        unsafe { std::slice::from_raw_parts_mut(base.add(range.start), range.len()) }
    }

    /// An SGE covering `offset..offset + len` of this region. Panics if out of bounds: a
    /// programming error, never input from the network.
    fn sge(&self, offset: usize, len: u32) -> Sge {
        assert!(
            offset
                .checked_add(len as usize)
                .is_some_and(|end| end <= self.len()),
            "sge out of MR bounds"
        );
        Sge {
            addr: self.addr() + offset as u64,
            length: len,
            lkey: self.lkey(),
        }
    }
}

/// Memory an owner hands to a region to keep until the region is dropped.
///
/// # Safety
/// `as_mut_ptr()` returns the same pointer every time, valid for reads and writes for `len()`
/// bytes for as long as the value lives, and moving the value does not move that memory
/// (heap- or mmap-backed, or `'static`).
pub unsafe trait OwnedMemory: Send + 'static {
    fn as_mut_ptr(&mut self) -> *mut u8;
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

// SAFETY: a boxed slice's heap memory does not move with the box.
unsafe impl OwnedMemory for Box<[u8]> {
    fn as_mut_ptr(&mut self) -> *mut u8 {
        <[u8]>::as_mut_ptr(self)
    }
    fn len(&self) -> usize {
        <[u8]>::len(self)
    }
}

// SAFETY: the vector is never grown or shrunk through this trait, so its heap buffer stays.
unsafe impl OwnedMemory for Vec<u8> {
    fn as_mut_ptr(&mut self) -> *mut u8 {
        Vec::as_mut_ptr(self)
    }
    fn len(&self) -> usize {
        Vec::len(self)
    }
}

// SAFETY: 'static memory is never freed; the exclusive borrow is held by the region.
unsafe impl OwnedMemory for &'static mut [u8] {
    fn as_mut_ptr(&mut self) -> *mut u8 {
        <[u8]>::as_mut_ptr(self)
    }
    fn len(&self) -> usize {
        <[u8]>::len(self)
    }
}

/// A type-2 memory window: an rkey over part of a region, pointed by a bind work request and
/// withdrawn by an invalidation (`SendOp::LocalInv` here, or the peer's `SendWithInv`). The
/// NVMe-oF host's keyed SGLs use one per command.
pub trait MwOps<P: Provider>: Send {
    /// What `SendOp::BindMw::mw` names this window by.
    fn handle(&self) -> u32;
    /// The rkey of the latest bind built by [`bind`](MwOps::bind) (valid once that bind WR
    /// has executed, until it is invalidated).
    fn rkey(&self) -> u32;
    /// The work request that binds this window over `offset..offset + len` of `mr` (which
    /// must have `Access::MW_BIND`) granting `access` (REMOTE_READ / REMOTE_WRITE); post it
    /// on a QP of the same PD. The window's rkey becomes the returned op's `rkey`.
    fn bind(&mut self, mr: &P::Mr, offset: usize, len: usize, access: Access) -> Result<SendOp>;
}

/// `MwOps::bind` for every provider: checks, and the next rkey (low byte incremented, as
/// `ibv_inc_rkey`).
pub(crate) fn bind_op(
    handle: u32,
    rkey: u32,
    mr: &impl MrOps,
    offset: usize,
    len: usize,
    access: Access,
) -> Result<SendOp> {
    use crate::error::TransportError;
    if offset.checked_add(len).is_none_or(|end| end > mr.len()) {
        return Err(TransportError::OutOfBounds {
            offset,
            len,
            size: mr.len(),
        });
    }
    if !mr.access().contains(Access::MW_BIND) {
        return Err(TransportError::InvalidArgument(
            "binding a memory window needs a region registered with Access::MW_BIND".into(),
        ));
    }
    if !(Access::REMOTE_READ | Access::REMOTE_WRITE).contains(access) {
        return Err(TransportError::InvalidArgument(format!(
            "a memory window grants only REMOTE_READ / REMOTE_WRITE, not {access:?}"
        )));
    }
    Ok(SendOp::BindMw {
        mw: handle,
        rkey: (rkey & !0xff) | (rkey.wrapping_add(1) & 0xff),
        lkey: mr.lkey(),
        addr: mr.addr() + offset as u64,
        length: len as u64,
        access,
    })
}

/// A completion channel: one fd that becomes readable when any armed CQ attached to it gets a
/// completion.
pub trait CompChannelOps: Clone + Send + Sync {
    fn fd(&self) -> RawFd;
    /// Non-blocking: the id of a CQ that fired (acknowledged), or None.
    fn get_event(&self) -> Result<Option<u32>>;
}

/// A completion queue.
pub trait CqOps: Clone + Send + Sync {
    /// Unique per device; names the CQ in async events and channel events.
    fn id(&self) -> u32;
    fn depth(&self) -> u32;
    /// Reap up to `out.len()` completions; returns how many were written.
    fn poll(&self, out: &mut [WorkCompletion]) -> Result<usize>;
    /// Arm the CQ: the next completion signals its completion channel.
    fn req_notify(&self, solicited_only: bool) -> Result<()>;
    /// An fd that becomes readable when polling this CQ may make progress, for providers whose
    /// completions are produced by polling (the soft TCP fabric: the CQ's epoll over its QPs'
    /// sockets). A sleeper must watch it beside the completion channel. None for hardware.
    fn progress_fd(&self) -> Option<RawFd> {
        None
    }
}

/// A shared receive queue.
pub trait SrqOps: Clone + Send + Sync {
    fn id(&self) -> u32;
    fn max_wr(&self) -> u32;
    fn post_recv(&self, wrs: &[RecvWr<'_>]) -> std::result::Result<(), PostError>;
    /// Re-arm SRQ_LIMIT_REACHED at `limit` outstanding receives.
    fn set_limit(&self, limit: u32) -> Result<()>;
}

/// A reliable-connected queue pair.
pub trait QpOps: Send {
    /// 24-bit QP number, unique on its device while the QP exists.
    fn qp_num(&self) -> u32;
    fn state(&self) -> QpState;
    /// What the provider granted (may exceed what was asked for).
    fn caps(&self) -> QpCaps;
    /// This side's endpoint for an out-of-band exchange (pingpong), with the GID at `gid_index`.
    fn endpoint(&self, port: u8, gid_index: u8, psn: u32) -> Result<QpEndpoint>;
    /// RESET -> INIT with the access the remote side is granted on this QP.
    fn modify_to_init(&mut self, port: u8, access: Access) -> Result<()>;
    fn modify_to_rtr(&mut self, attr: &RtrAttr) -> Result<()>;
    fn modify_to_rts(&mut self, attr: &RtsAttr) -> Result<()>;
    /// Any state -> ERR: every outstanding work request completes with WR_FLUSH_ERR.
    fn modify_to_err(&mut self) -> Result<()>;
    fn modify_to_reset(&mut self) -> Result<()>;
    /// Post a list; on failure, the WRs before `failed_index` were posted, none after.
    fn post_send(&mut self, wrs: &[SendWr<'_>]) -> std::result::Result<(), PostError>;
    /// `post_send` for a list that another list to this QP follows at once (a caller with
    /// more WRs than one list holds): the provider may hold the list's transmission back
    /// until the following `post_send`, which the caller must make. Verbs rings each list's
    /// doorbell (the default); the soft TCP fabric makes one write of both.
    fn post_send_more(&mut self, wrs: &[SendWr<'_>]) -> std::result::Result<(), PostError> {
        self.post_send(wrs)
    }
    /// Post to the QP's own receive queue (an SRQ-attached QP refuses).
    fn post_recv(&mut self, wrs: &[RecvWr<'_>]) -> std::result::Result<(), PostError>;
}

/// A connection-manager event channel (rdma_event_channel): a pollable fd and a queue of
/// events for the ids created on it.
pub trait CmChannelOps<P: Provider>: Clone + Send + Sync {
    fn fd(&self) -> RawFd;
    /// Non-blocking: the next event (already acknowledged), or None.
    fn poll_event(&self) -> Result<Option<CmEvent<P>>>;
    /// A listening id bound to `addr` (port 0 = pick one).
    fn listen(&self, addr: SocketAddr, backlog: u32, token: u64) -> Result<P::CmId>;
    /// An id with its address and route to `dst` resolved (blocking up to `timeout`): it knows
    /// its device, so the caller can build the PD/CQ/QP on `context()` before `connect`.
    fn resolve(
        &self,
        dst: SocketAddr,
        src: Option<SocketAddr>,
        timeout: std::time::Duration,
        token: u64,
    ) -> Result<P::CmId>;
}

/// A CM event. `token` is the one given to the id the event is for (for CONNECT_REQUEST: the
/// listener's); `id` is the new connection's id, on CONNECT_REQUEST only.
pub struct CmEvent<P: Provider> {
    pub token: u64,
    pub kind: CmEventKind,
    pub id: Option<P::CmId>,
}

/// A connection-manager id (rdma_cm_id).
pub trait CmIdOps<P: Provider>: Send {
    fn token(&self) -> u64;
    fn set_token(&mut self, token: u64);
    /// The device this id is bound to (after listen-bind, resolve, or on a connect request).
    fn context(&self) -> Result<P::Context>;
    fn port_num(&self) -> u8;
    fn local_addr(&self) -> Option<SocketAddr>;
    fn peer_addr(&self) -> Option<SocketAddr>;
    /// Create this connection's QP; the CM drives its INIT/RTR/RTS transitions.
    fn create_qp(&mut self, pd: &P::Pd, init: &QpInit<'_, P>) -> Result<P::Qp>;
    /// Start connecting (after resolve + create_qp): ESTABLISHED or REJECTED / UNREACHABLE
    /// follow on the channel.
    fn connect(&mut self, param: &ConnParam) -> Result<()>;
    fn accept(&mut self, param: &ConnParam) -> Result<()>;
    fn reject(&mut self, private_data: &[u8]) -> Result<()>;
    /// Move the QP to ERR and tell the peer; DISCONNECTED follows on both sides.
    fn disconnect(&mut self) -> Result<()>;
}
