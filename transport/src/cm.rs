//! The public connection manager (rdma_cm model): an event channel per provider, ids that
//! listen, resolve, connect, accept, reject and disconnect, with private data both ways.
//!
//! Server: `CmChannel::new(kind)?.listen(addr, backlog, token)`, then CONNECT_REQUEST events
//! carry a new `CmId`; build the QP on `id.context()`, then `accept` or `reject`.
//! Client: `channel.resolve(dst, ..)` gives an id bound to its device; create the QP on it,
//! `connect`, and wait for ESTABLISHED / REJECTED / UNREACHABLE.

use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::time::Duration;

use crate::device::{Context, Pd, Qp, QpInitAttr, dispatch, facade};
use crate::error::{Result, TransportError};
use crate::provider::{self, CmChannelOps, CmIdOps, Provider};
use crate::types::*;

#[cfg(feature = "soft")]
use crate::soft::Soft;
#[cfg(feature = "rdma")]
use crate::verbs::Verbs;

facade!(
    /// A CM event channel: one pollable fd for the events of every id created on it.
    #[derive(Clone)]
    CmChannel, <Soft as Provider>::CmChannel, <Verbs as Provider>::CmChannel
);
facade!(
    /// A connection-manager id: a listener, or one connection.
    CmId, <Soft as Provider>::CmId, <Verbs as Provider>::CmId
);

/// A CM event: `token` names the id it is for (for CONNECT_REQUEST, the listener); `id` is the
/// new connection's id on CONNECT_REQUEST.
pub struct CmEvent {
    pub token: u64,
    pub kind: CmEventKind,
    pub id: Option<CmId>,
}

impl std::fmt::Debug for CmEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CmEvent")
            .field("token", &self.token)
            .field("kind", &self.kind)
            .field("new_id", &self.id.is_some())
            .finish()
    }
}

fn convert<P: Provider>(ev: provider::CmEvent<P>, wrap: fn(P::CmId) -> CmId) -> CmEvent {
    CmEvent {
        token: ev.token,
        kind: ev.kind,
        id: ev.id.map(wrap),
    }
}

impl CmChannel {
    /// A channel of the given provider.
    pub fn new(kind: ProviderKind) -> Result<CmChannel> {
        match kind {
            #[cfg(feature = "soft")]
            ProviderKind::Soft => Ok(CmChannel::Soft(Soft::create_cm_channel()?)),
            #[cfg(feature = "rdma")]
            ProviderKind::Verbs => Ok(CmChannel::Verbs(Verbs::create_cm_channel()?)),
            #[allow(unreachable_patterns)]
            _ => Err(TransportError::Unsupported("this provider (not built in)")),
        }
    }
    pub fn fd(&self) -> RawFd {
        dispatch!(self, c => c.fd())
    }
    /// Non-blocking: the next event, or None.
    pub fn poll_event(&self) -> Result<Option<CmEvent>> {
        match self {
            #[cfg(feature = "soft")]
            Self::Soft(c) => Ok(c.poll_event()?.map(|e| convert(e, CmId::Soft))),
            #[cfg(feature = "rdma")]
            Self::Verbs(c) => Ok(c.poll_event()?.map(|e| convert(e, CmId::Verbs))),
        }
    }
    /// Waits up to `timeout` for the next event (control path: sleeps on the channel fd).
    pub fn wait_event(&self, timeout: Duration) -> Result<CmEvent> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if let Some(ev) = self.poll_event()? {
                return Ok(ev);
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return Err(TransportError::Timeout("waiting for a CM event"));
            }
            crate::fdwait::wait_readable(self.fd(), left.min(Duration::from_millis(10)))?;
        }
    }
    pub fn listen(&self, addr: SocketAddr, backlog: u32, token: u64) -> Result<CmId> {
        dispatch!(self, c => c.listen(addr, backlog, token).map(CmId::from))
    }
    /// An id whose address and route to `dst` are resolved: it knows its device.
    pub fn resolve(
        &self,
        dst: SocketAddr,
        src: Option<SocketAddr>,
        timeout: Duration,
        token: u64,
    ) -> Result<CmId> {
        dispatch!(self, c => c.resolve(dst, src, timeout, token).map(CmId::from))
    }
}

impl std::fmt::Debug for CmId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CmId")
            .field("provider", &self.kind())
            .field("token", &self.token())
            .field("local", &self.local_addr())
            .field("peer", &self.peer_addr())
            .finish()
    }
}

impl CmId {
    pub fn token(&self) -> u64 {
        dispatch!(self, i => i.token())
    }
    pub fn set_token(&mut self, token: u64) {
        dispatch!(self, i => i.set_token(token))
    }
    /// The device this id is bound to.
    pub fn context(&self) -> Result<Context> {
        dispatch!(self, i => i.context().map(Context::from))
    }
    pub fn port_num(&self) -> u8 {
        dispatch!(self, i => i.port_num())
    }
    pub fn local_addr(&self) -> Option<SocketAddr> {
        dispatch!(self, i => i.local_addr())
    }
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        dispatch!(self, i => i.peer_addr())
    }
    /// This connection's QP; the CM drives its transitions.
    pub fn create_qp(&mut self, pd: &Pd, init: &QpInitAttr<'_>) -> Result<Qp> {
        match self {
            #[cfg(feature = "soft")]
            Self::Soft(i) => i
                .create_qp(pd.as_soft()?, &crate::device::soft_qp_init(init)?)
                .map(Qp::Soft),
            #[cfg(feature = "rdma")]
            Self::Verbs(i) => i
                .create_qp(pd.as_verbs()?, &crate::device::verbs_qp_init(init)?)
                .map(Qp::Verbs),
        }
    }
    pub fn connect(&mut self, param: &ConnParam) -> Result<()> {
        dispatch!(self, i => i.connect(param))
    }
    pub fn accept(&mut self, param: &ConnParam) -> Result<()> {
        dispatch!(self, i => i.accept(param))
    }
    pub fn reject(&mut self, private_data: &[u8]) -> Result<()> {
        dispatch!(self, i => i.reject(private_data))
    }
    pub fn disconnect(&mut self) -> Result<()> {
        dispatch!(self, i => i.disconnect())
    }
}

#[cfg(feature = "soft")]
impl From<<Soft as Provider>::CmId> for CmId {
    fn from(x: <Soft as Provider>::CmId) -> Self {
        CmId::Soft(x)
    }
}
#[cfg(feature = "rdma")]
impl From<<Verbs as Provider>::CmId> for CmId {
    fn from(x: <Verbs as Provider>::CmId) -> Self {
        CmId::Verbs(x)
    }
}
