//! The public verbs API: an enum over providers for every object (context, PD, MR, completion
//! channel, CQ, SRQ, QP). Each call is one `match` on the provider (a predictable branch, no
//! virtual call), then the provider's own method from `provider`.
//!
//! Objects of different providers never mix: creating a QP on a soft PD with a verbs CQ is a
//! `TransportError::Mismatch`.

use std::net::IpAddr;
use std::os::fd::RawFd;

use crate::error::{PostError, Result, TransportError};
use crate::provider::{
    CompChannelOps, ContextOps, CqOps, MrOps, MwOps, OwnedMemory, PdOps, Provider, QpInit, QpOps,
    SrqOps,
};
use crate::types::*;

#[cfg(feature = "soft")]
use crate::soft::{self, Soft};
#[cfg(feature = "rdma")]
use crate::verbs::{self, Verbs};

#[cfg(not(any(feature = "soft", feature = "rdma")))]
compile_error!("nvmf-transport needs at least one provider: enable feature `soft` or `rdma`");

/// `match` an enum façade value and run the same expression on whichever provider object it
/// holds.
macro_rules! dispatch {
    ($value:expr, $inner:ident => $body:expr) => {
        match $value {
            #[cfg(feature = "soft")]
            Self::Soft($inner) => $body,
            #[cfg(feature = "rdma")]
            Self::Verbs($inner) => $body,
        }
    };
}
pub(crate) use dispatch;

/// Declares a façade enum with one variant per enabled provider, and its `kind()`.
macro_rules! facade {
    ($(#[$meta:meta])* $name:ident, $soft:ty, $verbs:ty) => {
        $(#[$meta])*
        pub enum $name {
            #[cfg(feature = "soft")]
            Soft($soft),
            #[cfg(feature = "rdma")]
            Verbs($verbs),
        }
        impl $name {
            /// Which provider this object belongs to.
            pub fn kind(&self) -> ProviderKind {
                match self {
                    #[cfg(feature = "soft")]
                    Self::Soft(_) => ProviderKind::Soft,
                    #[cfg(feature = "rdma")]
                    Self::Verbs(_) => ProviderKind::Verbs,
                }
            }
        }
    };
}
pub(crate) use facade;

facade!(
    /// An opened RDMA device.
    #[derive(Clone)]
    Context, <Soft as Provider>::Context, <Verbs as Provider>::Context
);
facade!(
    /// A protection domain.
    #[derive(Clone)]
    Pd, <Soft as Provider>::Pd, <Verbs as Provider>::Pd
);
facade!(
    /// A registered memory region.
    Mr, <Soft as Provider>::Mr, <Verbs as Provider>::Mr
);
facade!(
    /// A type-2 memory window.
    Mw, <Soft as Provider>::Mw, <Verbs as Provider>::Mw
);
facade!(
    /// A completion channel (one fd for many CQs).
    #[derive(Clone)]
    CompChannel, <Soft as Provider>::CompChannel, <Verbs as Provider>::CompChannel
);
facade!(
    /// A completion queue.
    #[derive(Clone)]
    Cq, <Soft as Provider>::Cq, <Verbs as Provider>::Cq
);
facade!(
    /// A shared receive queue.
    #[derive(Clone)]
    Srq, <Soft as Provider>::Srq, <Verbs as Provider>::Srq
);
facade!(
    /// A reliable-connected queue pair.
    Qp, <Soft as Provider>::Qp, <Verbs as Provider>::Qp
);

/// Which device to open.
#[derive(Clone, Debug)]
pub enum DeviceSpec {
    /// The first verbs device when one exists, else the default soft device.
    Auto,
    /// A verbs device by name (`rxe0`, `mlx5_0`), or the first one.
    Verbs(Option<String>),
    /// A soft device.
    Soft(SoftConfig),
}

/// Every device of every enabled provider.
pub fn devices() -> Result<Vec<DeviceInfo>> {
    #[allow(unused_mut)]
    let mut all = Vec::new();
    #[cfg(feature = "rdma")]
    all.extend(Verbs::devices()?);
    #[cfg(feature = "soft")]
    all.extend(Soft::devices()?);
    Ok(all)
}

impl Context {
    /// Opens the device `spec` names. `Auto` logs which provider it chose.
    pub fn open(spec: &DeviceSpec) -> Result<Context> {
        match spec {
            DeviceSpec::Auto => {
                #[cfg(feature = "rdma")]
                if let Some(first) = Verbs::devices()?.into_iter().next() {
                    tracing::info!(device = %first.name, "auto: using verbs provider");
                    return Ok(Context::Verbs(verbs::Verbs::open(&first.name)?));
                }
                #[cfg(feature = "soft")]
                {
                    tracing::info!("auto: no verbs device present, using the soft provider");
                    Context::open(&DeviceSpec::Soft(SoftConfig::default()))
                }
                #[cfg(not(feature = "soft"))]
                Err(TransportError::NoDevice(
                    "any (no verbs device present)".into(),
                ))
            }
            #[cfg(feature = "rdma")]
            DeviceSpec::Verbs(name) => {
                let name = match name {
                    Some(n) => n.clone(),
                    None => Verbs::devices()?
                        .into_iter()
                        .next()
                        .map(|d| d.name)
                        .ok_or_else(|| TransportError::NoDevice("any verbs device".into()))?,
                };
                Ok(Context::Verbs(verbs::Verbs::open(&name)?))
            }
            #[cfg(feature = "soft")]
            DeviceSpec::Soft(cfg) => Ok(Context::Soft(soft::Soft::open(cfg)?)),
            #[allow(unreachable_patterns)]
            _ => Err(TransportError::Unsupported("this provider (not built in)")),
        }
    }

    pub fn name(&self) -> &str {
        dispatch!(self, c => c.name())
    }
    pub fn query_device(&self) -> Result<DeviceAttr> {
        dispatch!(self, c => c.query_device())
    }
    pub fn query_port(&self, port: u8) -> Result<PortAttr> {
        dispatch!(self, c => c.query_port(port))
    }
    pub fn gid_table(&self, port: u8) -> Result<Vec<GidEntry>> {
        dispatch!(self, c => c.gid_table(port))
    }
    /// The RoCE v2 GID index carrying `ip` on `port`, or an error listing the table.
    pub fn gid_index_for(&self, port: u8, ip: IpAddr) -> Result<u32> {
        crate::gid::roce_v2_index(&self.gid_table(port)?, ip)
    }
    pub fn alloc_pd(&self) -> Result<Pd> {
        dispatch!(self, c => c.alloc_pd().map(Pd::from))
    }
    pub fn create_comp_channel(&self) -> Result<CompChannel> {
        dispatch!(self, c => c.create_comp_channel().map(CompChannel::from))
    }
    pub fn create_cq(&self, depth: u32, channel: Option<&CompChannel>) -> Result<Cq> {
        match self {
            #[cfg(feature = "soft")]
            Self::Soft(c) => {
                let ch = channel.map(|ch| ch.as_soft()).transpose()?;
                c.create_cq(depth, ch).map(Cq::Soft)
            }
            #[cfg(feature = "rdma")]
            Self::Verbs(c) => {
                let ch = channel.map(|ch| ch.as_verbs()).transpose()?;
                c.create_cq(depth, ch).map(Cq::Verbs)
            }
        }
    }
    /// Non-blocking: the next async event, already acknowledged.
    pub fn poll_async_event(&self) -> Result<Option<AsyncEvent>> {
        dispatch!(self, c => c.poll_async_event())
    }
    pub fn async_fd(&self) -> RawFd {
        dispatch!(self, c => c.async_fd())
    }
    #[cfg(feature = "soft")]
    pub fn as_soft(&self) -> Result<&soft::SoftContext> {
        match self {
            Self::Soft(c) => Ok(c),
            #[allow(unreachable_patterns)]
            _ => Err(TransportError::Unsupported(
                "soft-device operation on a non-soft device",
            )),
        }
    }
}

/// Façade form of `provider::QpInit`.
pub struct QpInitAttr<'a> {
    pub send_cq: &'a Cq,
    pub recv_cq: &'a Cq,
    pub srq: Option<&'a Srq>,
    pub caps: QpCaps,
    pub sq_sig_all: bool,
}

impl Pd {
    pub fn alloc_mr(&self, len: usize, access: Access) -> Result<Mr> {
        dispatch!(self, p => p.alloc_mr(len, access).map(Mr::from))
    }
    /// Register a caller's buffer, kept by the region until it drops.
    pub fn reg_mr(&self, buf: Box<[u8]>, access: Access) -> Result<Mr> {
        self.reg_mr_owned(buf, access)
    }
    /// Register memory the region keeps alive until it drops (see `provider::OwnedMemory`).
    pub fn reg_mr_owned<B: OwnedMemory>(&self, buf: B, access: Access) -> Result<Mr> {
        dispatch!(self, p => p.reg_mr_owned(buf, access).map(Mr::from))
    }
    /// Register `ptr..ptr + len`, memory the caller keeps.
    ///
    /// # Safety
    /// As `provider::PdOps::reg_mr_raw`: the memory stays valid (not freed or unmapped) until
    /// the returned region is dropped, and is touched meanwhile only as `Mr::view` allows.
    pub unsafe fn reg_mr_raw(&self, ptr: *mut u8, len: usize, access: Access) -> Result<Mr> {
        // SAFETY: the caller's contract is the provider method's.
        dispatch!(self, p => unsafe { p.reg_mr_raw(ptr, len, access) }.map(Mr::from))
    }
    /// A type-2 memory window (`Unsupported` where the device has no MEM_WINDOW).
    pub fn alloc_mw(&self) -> Result<Mw> {
        dispatch!(self, p => p.alloc_mw().map(Mw::from))
    }
    pub fn create_srq(&self, init: &SrqInit) -> Result<Srq> {
        dispatch!(self, p => p.create_srq(init).map(Srq::from))
    }
    pub fn create_qp(&self, init: &QpInitAttr<'_>) -> Result<Qp> {
        match self {
            #[cfg(feature = "soft")]
            Self::Soft(p) => p.create_qp(&soft_qp_init(init)?).map(Qp::Soft),
            #[cfg(feature = "rdma")]
            Self::Verbs(p) => p.create_qp(&verbs_qp_init(init)?).map(Qp::Verbs),
        }
    }
}

#[cfg(feature = "soft")]
pub(crate) fn soft_qp_init<'a>(init: &QpInitAttr<'a>) -> Result<QpInit<'a, Soft>> {
    Ok(QpInit {
        send_cq: init.send_cq.as_soft()?,
        recv_cq: init.recv_cq.as_soft()?,
        srq: init.srq.map(|s| s.as_soft()).transpose()?,
        caps: init.caps,
        sq_sig_all: init.sq_sig_all,
    })
}

#[cfg(feature = "rdma")]
pub(crate) fn verbs_qp_init<'a>(init: &QpInitAttr<'a>) -> Result<QpInit<'a, Verbs>> {
    Ok(QpInit {
        send_cq: init.send_cq.as_verbs()?,
        recv_cq: init.recv_cq.as_verbs()?,
        srq: init.srq.map(|s| s.as_verbs()).transpose()?,
        caps: init.caps,
        sq_sig_all: init.sq_sig_all,
    })
}

/// `as_soft()` / `as_verbs()` accessors and `From` conversions for a façade enum.
macro_rules! accessors {
    ($name:ident, $soft:ty, $verbs:ty) => {
        impl $name {
            #[cfg(feature = "soft")]
            #[allow(dead_code)]
            pub(crate) fn as_soft(&self) -> Result<&$soft> {
                match self {
                    Self::Soft(x) => Ok(x),
                    #[allow(unreachable_patterns)]
                    _ => Err(TransportError::Mismatch(concat!(
                        "expected a soft ",
                        stringify!($name)
                    ))),
                }
            }
            #[cfg(feature = "rdma")]
            #[allow(dead_code)]
            pub(crate) fn as_verbs(&self) -> Result<&$verbs> {
                match self {
                    Self::Verbs(x) => Ok(x),
                    #[allow(unreachable_patterns)]
                    _ => Err(TransportError::Mismatch(concat!(
                        "expected a verbs ",
                        stringify!($name)
                    ))),
                }
            }
        }
        #[cfg(feature = "soft")]
        impl From<$soft> for $name {
            fn from(x: $soft) -> Self {
                Self::Soft(x)
            }
        }
        #[cfg(feature = "rdma")]
        impl From<$verbs> for $name {
            fn from(x: $verbs) -> Self {
                Self::Verbs(x)
            }
        }
    };
}
accessors!(Pd, <Soft as Provider>::Pd, <Verbs as Provider>::Pd);
accessors!(Mr, <Soft as Provider>::Mr, <Verbs as Provider>::Mr);
accessors!(Mw, <Soft as Provider>::Mw, <Verbs as Provider>::Mw);
accessors!(
    CompChannel,
    <Soft as Provider>::CompChannel,
    <Verbs as Provider>::CompChannel
);
accessors!(Cq, <Soft as Provider>::Cq, <Verbs as Provider>::Cq);
accessors!(Srq, <Soft as Provider>::Srq, <Verbs as Provider>::Srq);
accessors!(Qp, <Soft as Provider>::Qp, <Verbs as Provider>::Qp);

impl Mr {
    pub fn addr(&self) -> u64 {
        dispatch!(self, m => m.addr())
    }
    pub fn len(&self) -> usize {
        dispatch!(self, m => m.len())
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    pub fn lkey(&self) -> u32 {
        dispatch!(self, m => m.lkey())
    }
    pub fn rkey(&self) -> u32 {
        dispatch!(self, m => m.rkey())
    }
    pub fn access(&self) -> Access {
        dispatch!(self, m => m.access())
    }
    /// See `provider::MrOps::as_ptr`.
    pub fn as_ptr(&self) -> *mut u8 {
        dispatch!(self, m => m.as_ptr())
    }
    /// Copy out of the region at `offset` (race-free; `OutOfBounds` outside the region).
    pub fn read_at(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        dispatch!(self, m => m.read_at(offset, dst))
    }
    /// Copy into the region at `offset` (race-free; `OutOfBounds` outside the region).
    pub fn write_at(&self, offset: usize, src: &[u8]) -> Result<()> {
        dispatch!(self, m => m.write_at(offset, src))
    }
    /// Copy `range` out of the region into a new vector (control path, tests, tools).
    pub fn read_vec(&self, range: std::ops::Range<usize>) -> Result<Vec<u8>> {
        dispatch!(self, m => m.read_vec(range))
    }
    /// A shared borrow of `range`.
    ///
    /// # Safety
    /// As `provider::MrOps::view`: nothing (device, peer, CPU) writes `range` while it lives.
    pub unsafe fn view(&self, range: std::ops::Range<usize>) -> &[u8] {
        // SAFETY: the caller's contract is the provider method's.
        dispatch!(self, m => unsafe { m.view(range) })
    }
    /// An exclusive borrow of `range`.
    ///
    /// # Safety
    /// As `provider::MrOps::view_mut`: nothing else (device, peer, CPU) reads or writes
    /// `range` while it lives.
    #[allow(
        clippy::mut_from_ref,
        reason = "the memory is the device's; exclusivity is the caller's contract"
    )]
    pub unsafe fn view_mut(&self, range: std::ops::Range<usize>) -> &mut [u8] {
        // SAFETY: the caller's contract is the provider method's.
        dispatch!(self, m => unsafe { m.view_mut(range) })
    }
    /// An SGE over `offset..offset + len` of this region (panics when out of bounds: a
    /// programming error).
    pub fn sge(&self, offset: usize, len: u32) -> Sge {
        dispatch!(self, m => m.sge(offset, len))
    }
}

impl Mw {
    /// What `SendOp::BindMw::mw` names this window by.
    pub fn handle(&self) -> u32 {
        dispatch!(self, w => w.handle())
    }
    /// The rkey of the latest bind built by `bind`.
    pub fn rkey(&self) -> u32 {
        dispatch!(self, w => w.rkey())
    }
    /// The `SendOp::BindMw` that binds this window over `offset..offset + len` of `mr`
    /// (registered with `Access::MW_BIND`), granting `access`; post it on a QP of the same PD.
    pub fn bind(&mut self, mr: &Mr, offset: usize, len: usize, access: Access) -> Result<SendOp> {
        match self {
            #[cfg(feature = "soft")]
            Self::Soft(w) => w.bind(mr.as_soft()?, offset, len, access),
            #[cfg(feature = "rdma")]
            Self::Verbs(w) => w.bind(mr.as_verbs()?, offset, len, access),
        }
    }
}

impl CompChannel {
    pub fn fd(&self) -> RawFd {
        dispatch!(self, c => c.fd())
    }
    /// Non-blocking: the id of a CQ that fired, or None.
    pub fn get_event(&self) -> Result<Option<u32>> {
        dispatch!(self, c => c.get_event())
    }
}

impl Cq {
    pub fn id(&self) -> u32 {
        dispatch!(self, c => c.id())
    }
    pub fn depth(&self) -> u32 {
        dispatch!(self, c => c.depth())
    }
    #[inline]
    pub fn poll(&self, out: &mut [WorkCompletion]) -> Result<usize> {
        dispatch!(self, c => c.poll(out))
    }
    pub fn req_notify(&self, solicited_only: bool) -> Result<()> {
        dispatch!(self, c => c.req_notify(solicited_only))
    }
    /// See `provider::CqOps::progress_fd`: watch it too when sleeping on this CQ.
    pub fn progress_fd(&self) -> Option<RawFd> {
        dispatch!(self, c => c.progress_fd())
    }
}

impl Srq {
    pub fn id(&self) -> u32 {
        dispatch!(self, s => s.id())
    }
    pub fn max_wr(&self) -> u32 {
        dispatch!(self, s => s.max_wr())
    }
    #[inline]
    pub fn post_recv(&self, wrs: &[RecvWr<'_>]) -> std::result::Result<(), PostError> {
        dispatch!(self, s => s.post_recv(wrs))
    }
    pub fn set_limit(&self, limit: u32) -> Result<()> {
        dispatch!(self, s => s.set_limit(limit))
    }
}

impl Qp {
    pub fn qp_num(&self) -> u32 {
        dispatch!(self, q => q.qp_num())
    }
    pub fn state(&self) -> QpState {
        dispatch!(self, q => q.state())
    }
    pub fn caps(&self) -> QpCaps {
        dispatch!(self, q => q.caps())
    }
    pub fn endpoint(&self, port: u8, gid_index: u8, psn: u32) -> Result<QpEndpoint> {
        dispatch!(self, q => q.endpoint(port, gid_index, psn))
    }
    pub fn modify_to_init(&mut self, port: u8, access: Access) -> Result<()> {
        dispatch!(self, q => q.modify_to_init(port, access))
    }
    pub fn modify_to_rtr(&mut self, attr: &RtrAttr) -> Result<()> {
        dispatch!(self, q => q.modify_to_rtr(attr))
    }
    pub fn modify_to_rts(&mut self, attr: &RtsAttr) -> Result<()> {
        dispatch!(self, q => q.modify_to_rts(attr))
    }
    pub fn modify_to_err(&mut self) -> Result<()> {
        dispatch!(self, q => q.modify_to_err())
    }
    pub fn modify_to_reset(&mut self) -> Result<()> {
        dispatch!(self, q => q.modify_to_reset())
    }
    #[inline]
    pub fn post_send(&mut self, wrs: &[SendWr<'_>]) -> std::result::Result<(), PostError> {
        dispatch!(self, q => q.post_send(wrs))
    }
    /// See [`QpOps::post_send_more`].
    #[inline]
    pub fn post_send_more(&mut self, wrs: &[SendWr<'_>]) -> std::result::Result<(), PostError> {
        dispatch!(self, q => q.post_send_more(wrs))
    }
    #[inline]
    pub fn post_recv(&mut self, wrs: &[RecvWr<'_>]) -> std::result::Result<(), PostError> {
        dispatch!(self, q => q.post_recv(wrs))
    }
}

#[cfg(feature = "soft")]
impl From<soft::SoftContext> for Context {
    fn from(c: soft::SoftContext) -> Self {
        Context::Soft(c)
    }
}
#[cfg(feature = "rdma")]
impl From<verbs::VerbsContext> for Context {
    fn from(c: verbs::VerbsContext) -> Self {
        Context::Verbs(c)
    }
}
