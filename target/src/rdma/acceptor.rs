//! The control path: one thread (not a reactor) owning the CM event channels and the
//! listeners, watching each device's async-event fd, and routing everything to the reactor that
//! owns the qpair as messages. It never touches a qpair or a poll group itself.
//!
//! - CONNECT_REQUEST: the NVMe-oF private data is checked (`connect::decide`); a bad request is
//!   rejected with the NVMe-oF reject status. A good one gets a token, a group chosen by the
//!   device's `Placement`, and a message to that group's reactor, which creates the QP on its
//!   own CQ and SRQ and accepts (the `CmId` moves inside the message).
//! - Later CM events name the connection's token: the table token -> (device, group) sends
//!   them to the owning reactor.
//! - Async events name only a qp_num. They are read through the device's `AsyncHub` (a host
//!   in the same process owns QPs on the device too): the hub hands this acceptor, as a
//!   `Control::Async` message, the events no host route claims. Routing: the table (device,
//!   qp_num) -> group, filled by the reactor's `Placed` report and emptied by `Gone`. An event
//!   for a qp_num not in the table (it raced the `Placed` report, or is not ours) and
//!   device-wide events are broadcast to every group of that device: a poll group ignores
//!   qp_nums it does not hold, so a broadcast is always safe, and the table keeps the common
//!   case to one message.
//!
//! The thread sleeps in epoll on the CM channel fds, the async fds and a waker the reactors
//! (and `RdmaTransport`) ring after queueing a `Control` message; a 250 ms timeout bounds any
//! missed edge.

use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crossbeam_channel::Receiver;
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token};
use nvmf_poller::{PollerId, ReactorHandle};
use nvmf_protocol::cm::{RdmaReject, RejectStatus};
use nvmf_transport::pollgroup::{Handler, Placement};
use nvmf_transport::{
    AsyncEventKind, AsyncHub, AsyncListener, CmChannel, CmEvent, CmEventKind, CmId, Context,
};

use super::connect::{self, ConnectLimits};
use super::group_poller::GroupPoller;
use super::link::Control;

/// Listener tokens have this bit set; connection tokens do not.
pub(crate) const LISTENER_BIT: u64 = 1 << 63;

pub(crate) const WAKER: Token = Token(usize::MAX);
const CHANNEL_BASE: usize = 0;
const ASYNC_BASE: usize = 1 << 20;
const MISSED_EDGE_BOUND: Duration = Duration::from_millis(250);

/// What the acceptor has done so far (control-path counters, readable from any thread).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AcceptorStats {
    /// Connect requests placed on a group (the group may still refuse them).
    pub placed: u64,
    /// Connect requests rejected here (bad private data, quiesced, unknown device).
    pub rejected: u64,
    /// CM events forwarded to the reactor owning their connection.
    pub cm_routed: u64,
    /// Async events sent to the one group holding their QP.
    pub async_routed: u64,
    /// Async events broadcast to every group of their device (device-wide, or QP unknown).
    pub async_broadcast: u64,
}

#[derive(Default)]
pub(crate) struct Counters {
    placed: AtomicU64,
    rejected: AtomicU64,
    cm_routed: AtomicU64,
    async_routed: AtomicU64,
    async_broadcast: AtomicU64,
}

impl Counters {
    pub fn snapshot(&self) -> AcceptorStats {
        AcceptorStats {
            placed: self.placed.load(Ordering::Relaxed),
            rejected: self.rejected.load(Ordering::Relaxed),
            cm_routed: self.cm_routed.load(Ordering::Relaxed),
            async_routed: self.async_routed.load(Ordering::Relaxed),
            async_broadcast: self.async_broadcast.load(Ordering::Relaxed),
        }
    }
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// One group as the acceptor reaches it.
#[derive(Clone)]
pub(crate) struct GroupRef {
    pub reactor: ReactorHandle,
    pub poller: PollerId,
}

/// One device as the acceptor sees it.
pub(crate) struct DeviceSlot {
    pub ctx: Context,
    /// The device's async events, shared with the rest of the process.
    pub hub: AsyncHub,
    /// What the hub hands this acceptor (as `Control::Async`), until the slot drops.
    pub _listener: AsyncListener,
    pub groups: Vec<GroupRef>,
    pub placement: Placement,
    pub limits: ConnectLimits,
}

pub(crate) struct Acceptor<R, H> {
    pub channels: Vec<CmChannel>,
    pub listeners: Vec<CmId>,
    pub devices: Vec<DeviceSlot>,
    pub rx: Receiver<Control>,
    pub poll: Poll,
    counters: Arc<Counters>,
    /// Connection token -> (device, group).
    conns: HashMap<u64, (usize, usize)>,
    /// (device, qp_num) -> group.
    qps: HashMap<(usize, u32), usize>,
    next_token: u64,
    quiesced: bool,
    _types: PhantomData<fn() -> (R, H)>,
}

impl<R, H> Acceptor<R, H>
where
    R: Default + Send + 'static,
    H: Handler<R> + Send + 'static,
{
    /// Registers the fds to sleep on. `waker` must have been made from `poll`'s registry.
    pub fn new(
        channels: Vec<CmChannel>,
        listeners: Vec<CmId>,
        devices: Vec<DeviceSlot>,
        rx: Receiver<Control>,
        poll: Poll,
        counters: Arc<Counters>,
    ) -> std::io::Result<Self> {
        let reg = poll.registry();
        for (i, ch) in channels.iter().enumerate() {
            reg.register(
                &mut SourceFd(&ch.fd()),
                Token(CHANNEL_BASE + i),
                Interest::READABLE,
            )?;
        }
        for (i, d) in devices.iter().enumerate() {
            reg.register(
                &mut SourceFd(&d.hub.fd()),
                Token(ASYNC_BASE + i),
                Interest::READABLE,
            )?;
        }
        Ok(Acceptor {
            channels,
            listeners,
            devices,
            rx,
            poll,
            counters,
            conns: HashMap::new(),
            qps: HashMap::new(),
            next_token: 1,
            quiesced: false,
            _types: PhantomData,
        })
    }

    /// The thread body: until `Control::Stop` (or every sender is gone).
    pub fn run(mut self) {
        let mut events = Events::with_capacity(64);
        loop {
            // Reports from reactors first: an async event for a QP just placed then finds it.
            if !self.drain_control() {
                break;
            }
            // CM before async: a peer's DISCONNECTED names the better drain reason than the
            // LAST_WQE_REACHED its QP's move to ERR raises at about the same time.
            self.drain_cm();
            self.drain_async();
            match self.poll.poll(&mut events, Some(MISSED_EDGE_BOUND)) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    tracing::error!(error = %e, "acceptor epoll failed; polling on a timer");
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
        }
        tracing::info!("acceptor stopped");
    }

    /// Returns false when the thread should leave.
    fn drain_control(&mut self) -> bool {
        loop {
            match self.rx.try_recv() {
                Ok(Control::Placed {
                    device,
                    token,
                    qp_num,
                }) => {
                    if let Some(&(_, g)) = self.conns.get(&token) {
                        self.qps.insert((device, qp_num), g);
                    }
                }
                Ok(Control::Async { device, kind }) => self.async_event(device, kind),
                Ok(Control::Failed { token }) => {
                    self.conns.remove(&token);
                }
                Ok(Control::Gone {
                    device,
                    token,
                    qp_num,
                }) => {
                    self.conns.remove(&token);
                    self.qps.remove(&(device, qp_num));
                }
                Ok(Control::Quiesce(ack)) => {
                    self.quiesced = true;
                    // Dropping a listener stops the CM from taking connections on it.
                    self.listeners.clear();
                    let _ = ack.send(());
                }
                Ok(Control::Stop) => return false,
                Err(crossbeam_channel::TryRecvError::Empty) => return true,
                Err(crossbeam_channel::TryRecvError::Disconnected) => return false,
            }
        }
    }

    fn drain_cm(&mut self) {
        for i in 0..self.channels.len() {
            loop {
                match self.channels[i].poll_event() {
                    Ok(Some(ev)) => self.cm_event(ev),
                    Ok(None) => break,
                    Err(e) => {
                        tracing::warn!(error = %e, "reading the CM channel failed");
                        break;
                    }
                }
            }
        }
    }

    /// Reads the devices' pending async events; the hub hands ours back as `Control::Async`
    /// (and wakes this thread), the others to their owners.
    fn drain_async(&self) {
        for d in &self.devices {
            d.hub.pump();
        }
    }

    fn cm_event(&mut self, ev: CmEvent) {
        let CmEvent { token, kind, id } = ev;
        if let CmEventKind::ConnectRequest {
            private_data,
            responder_resources,
            remote,
            ..
        } = &kind
        {
            match id {
                Some(id) => self.connect_request(id, private_data, *responder_resources, *remote),
                None => tracing::warn!("CONNECT_REQUEST without an id"),
            }
            return;
        }
        if token & LISTENER_BIT != 0 {
            tracing::debug!(token, ?kind, "listener event");
            return;
        }
        let Some(&(d, g)) = self.conns.get(&token) else {
            tracing::debug!(token, ?kind, "CM event for a connection that is gone");
            return;
        };
        let to = self.devices[d].groups[g].clone();
        let pid = to.poller;
        let sent = to.reactor.send(move |r| {
            if let Some(gp) = r.poller_mut::<GroupPoller<R, H>>(pid) {
                gp.cm_event(token, &kind);
            }
        });
        match sent {
            Ok(()) => bump(&self.counters.cm_routed),
            Err(_) => tracing::debug!(token, "owning reactor stopped; CM event dropped"),
        }
    }

    fn connect_request(
        &mut self,
        mut id: CmId,
        private_data: &[u8],
        host_ird: u8,
        remote: std::net::SocketAddr,
    ) {
        let device = id.context().ok().and_then(|ctx| {
            self.devices
                .iter()
                .position(|d| d.ctx.kind() == ctx.kind() && d.ctx.name() == ctx.name())
        });
        let Some(d) = device else {
            tracing::warn!(%remote, "connect request on a device this target does not serve");
            self.reject(&mut id, RejectStatus::NoResources);
            return;
        };
        if self.quiesced {
            self.reject(&mut id, RejectStatus::NoResources);
            return;
        }
        let dev = &self.devices[d];
        let grant = match connect::decide(private_data, host_ird, &dev.limits) {
            Ok(g) => g,
            Err(status) => {
                tracing::info!(%remote, ?status, "rejecting connect request");
                self.reject(&mut id, status);
                return;
            }
        };
        let token = self.next_token;
        self.next_token = (self.next_token + 1) & !LISTENER_BIT;
        // Set here, before the id leaves this thread: every later event carries it.
        id.set_token(token);
        let g = dev.placement.choose();
        let to = dev.groups[g].clone();
        let pid = to.poller;
        let depth = u32::from(grant.depth);
        let read_depth = u32::from(grant.read_depth);
        let param = grant.accept_param();
        self.conns.insert(token, (d, g));
        tracing::info!(
            %remote,
            qid = grant.request.qid,
            depth,
            read_depth = grant.read_depth,
            group = g,
            token,
            "placing connection"
        );
        let sent = to
            .reactor
            .send(move |r| match r.poller_mut::<GroupPoller<R, H>>(pid) {
                Some(gp) => gp.connect(id, token, depth, read_depth, param),
                // The group was removed (stopping): the id drops here, which rejects it.
                None => tracing::debug!(token, "no poll group any more; connection dropped"),
            });
        bump(&self.counters.placed);
        if sent.is_err() {
            // The message (and the id with it) is dropped, which rejects the request.
            tracing::warn!(token, group = g, "reactor stopped; connection refused");
            self.conns.remove(&token);
            self.devices[d].placement.release(g);
        }
    }

    fn async_event(&mut self, d: usize, kind: AsyncEventKind) {
        let owner = kind.qp_num().and_then(|q| self.qps.get(&(d, q)).copied());
        let groups: Vec<GroupRef> = match owner {
            Some(g) => vec![self.devices[d].groups[g].clone()],
            None => self.devices[d].groups.clone(),
        };
        tracing::debug!(device = d, ?kind, routed = owner.is_some(), "async event");
        bump(if owner.is_some() {
            &self.counters.async_routed
        } else {
            &self.counters.async_broadcast
        });
        for to in groups {
            let pid = to.poller;
            let _ = to.reactor.send(move |r| {
                if let Some(gp) = r.poller_mut::<GroupPoller<R, H>>(pid) {
                    gp.async_event(kind);
                }
            });
        }
    }
}

impl<R, H> Acceptor<R, H> {
    fn reject(&self, id: &mut CmId, status: RejectStatus) {
        bump(&self.counters.rejected);
        if let Err(e) = id.reject(&RdmaReject::new(status).to_bytes()) {
            tracing::warn!(error = %e, ?status, "reject failed");
        }
    }
}
