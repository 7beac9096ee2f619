//! The connection manager of the soft device, in the rdma_cm model: event channels (pollable
//! fd), listening ids with a backlog, resolve, connect / accept / reject with private data,
//! disconnect, and the events CONNECT_REQUEST, ESTABLISHED, REJECTED, UNREACHABLE,
//! DISCONNECTED, TIMEWAIT_EXIT and DEVICE_REMOVAL.
//!
//! Messages are IB-CM-like: REQ (private data, depths, retry counts, the QP's endpoint), REP,
//! REJ, RTU, DREQ, DREP. The CM drives the QPs it created through INIT (at create_qp), RTR and
//! RTS (passive side at accept, active side on REP), like rdma_cm. As in IB CM, each side's
//! RNR retry count is the one the *other* side asked for (REQ for the passive QP, REP for the
//! active QP): a target accepting with rnr_retry 7 makes the host retry forever.
//!
//! Fabrics: in-process, a process-global listener table keyed by address and messages handed
//! over by direct calls; TCP, a real listener on ip:port and one TCP connection per CM id pair
//! carrying length-prefixed messages, read by a small control-path thread per connection.

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use super::channel::EventQueue;
use super::cm_threads;
use super::device::{self, DeviceInner};
use super::qp::QpShared;
use super::{Soft, SoftContext, SoftPd, SoftQp};
use crate::error::{Result, TransportError};
use crate::provider::{CmChannelOps, CmEvent, CmIdOps, PdOps, QpInit};
use crate::types::*;

/// IB CM reject reasons used by the soft CM.
const REJ_NO_RESOURCES: u32 = 1;
const REJ_INVALID_SERVICE_ID: u32 = 8;
const REJ_CONSUMER: u32 = 28;

const MIN_RNR_TIMER: u8 = 12;
const ACK_TIMEOUT: u8 = 14;

static LISTENERS: Mutex<Vec<(SocketAddr, Weak<IdInner>)>> = Mutex::new(Vec::new());
static IDS: Mutex<Vec<Weak<IdInner>>> = Mutex::new(Vec::new());
static NEXT_PORT: AtomicU16 = AtomicU16::new(40000);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn ephemeral_port() -> u16 {
    let p = NEXT_PORT.fetch_add(1, Ordering::Relaxed);
    if p < 40000 { 40000 + p % 20000 } else { p }
}

// ---------------------------------------------------------------------------------------------
// Messages

#[derive(Clone, Debug, PartialEq, Eq)]
enum Msg {
    Req {
        pd: Vec<u8>,
        resp_res: u8,
        init_depth: u8,
        retry: u8,
        rnr_retry: u8,
        ep: QpEndpoint,
    },
    Rep {
        pd: Vec<u8>,
        resp_res: u8,
        init_depth: u8,
        rnr_retry: u8,
        ep: QpEndpoint,
    },
    Rej {
        reason: u32,
        pd: Vec<u8>,
    },
    Rtu,
    Dreq,
    Drep,
}

impl Msg {
    fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; 4];
        let ep = |b: &mut Vec<u8>, ep: &QpEndpoint| {
            b.extend_from_slice(&ep.qp_num.to_le_bytes());
            b.extend_from_slice(&ep.lid.to_le_bytes());
            b.extend_from_slice(&ep.gid.0);
            b.extend_from_slice(&ep.psn.to_le_bytes());
        };
        match self {
            Msg::Req {
                pd,
                resp_res,
                init_depth,
                retry,
                rnr_retry,
                ep: e,
            } => {
                b.push(1);
                b.extend_from_slice(&[*resp_res, *init_depth, *retry, *rnr_retry]);
                ep(&mut b, e);
                b.push(pd.len() as u8);
                b.extend_from_slice(pd);
            }
            Msg::Rep {
                pd,
                resp_res,
                init_depth,
                rnr_retry,
                ep: e,
            } => {
                b.push(2);
                b.extend_from_slice(&[*resp_res, *init_depth, 0, *rnr_retry]);
                ep(&mut b, e);
                b.push(pd.len() as u8);
                b.extend_from_slice(pd);
            }
            Msg::Rej { reason, pd } => {
                b.push(3);
                b.extend_from_slice(&reason.to_le_bytes());
                b.push(pd.len() as u8);
                b.extend_from_slice(pd);
            }
            Msg::Rtu => b.push(4),
            Msg::Dreq => b.push(5),
            Msg::Drep => b.push(6),
        }
        let len = (b.len() - 4) as u32;
        b[..4].copy_from_slice(&len.to_le_bytes());
        b
    }

    /// Parse one message body (untrusted: never panics).
    fn decode(b: &[u8]) -> Option<Msg> {
        let mut r = Reader(b);
        let ty = r.u8()?;
        let ep = |r: &mut Reader<'_>| -> Option<QpEndpoint> {
            let qp_num = r.u32()?;
            let lid = u16::from_le_bytes(r.take(2)?.try_into().ok()?);
            let gid = Gid(r.take(16)?.try_into().ok()?);
            let psn = r.u32()?;
            Some(QpEndpoint {
                qp_num,
                psn,
                lid,
                gid,
            })
        };
        Some(match ty {
            1 | 2 => {
                let d = r.take(4)?;
                let e = ep(&mut r)?;
                let n = r.u8()? as usize;
                let pd = r.take(n)?.to_vec();
                if ty == 1 {
                    Msg::Req {
                        pd,
                        resp_res: d[0],
                        init_depth: d[1],
                        retry: d[2],
                        rnr_retry: d[3],
                        ep: e,
                    }
                } else {
                    Msg::Rep {
                        pd,
                        resp_res: d[0],
                        init_depth: d[1],
                        rnr_retry: d[3],
                        ep: e,
                    }
                }
            }
            3 => {
                let reason = r.u32()?;
                let n = r.u8()? as usize;
                Msg::Rej {
                    reason,
                    pd: r.take(n)?.to_vec(),
                }
            }
            4 => Msg::Rtu,
            5 => Msg::Dreq,
            6 => Msg::Drep,
            _ => return None,
        })
    }
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Some(a)
    }
    fn u8(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
}

fn read_msg(s: &mut TcpStream) -> Option<Msg> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len).ok()?;
    let len = u32::from_le_bytes(len) as usize;
    if len > 1024 {
        return None;
    }
    let mut b = vec![0u8; len];
    s.read_exact(&mut b).ok()?;
    Msg::decode(&b)
}

// ---------------------------------------------------------------------------------------------
// Ids

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Idle,
    Listening,
    Resolved,
    Connecting,
    ReqReceived,
    Accepted,
    Established,
    Disconnecting,
    Disconnected,
    Rejected,
}

/// Where the other side of a connection is.
#[derive(Clone)]
enum Link {
    InProc(Weak<IdInner>),
    Tcp(Arc<Mutex<TcpStream>>),
}

struct IdState {
    state: State,
    dev: Option<SoftContext>,
    local: Option<SocketAddr>,
    peer: Option<SocketAddr>,
    qp: Option<Arc<QpShared>>,
    link: Option<Link>,
    /// Passive: the REQ being answered; active: what connect asked for.
    req: Option<Msg>,
    param: Option<ConnParam>,
    /// Listener: connection requests not yet accepted or rejected.
    pending: u32,
    backlog: u32,
    listener: Weak<IdInner>,
}

pub(crate) struct IdInner {
    /// The channel its events go to. Weak: a queued event holds its id, so a strong link back
    /// would keep a channel its user dropped with events unread (and its socket pair) alive.
    chan: Weak<EventQueue<RawEvent>>,
    token: AtomicU64,
    closed: AtomicBool,
    st: Mutex<IdState>,
}

struct RawEvent {
    token_of: Arc<IdInner>,
    kind: CmEventKind,
    new_id: Option<Arc<IdInner>>,
}

impl IdInner {
    fn new(chan: &Arc<EventQueue<RawEvent>>, token: u64, state: State) -> Arc<IdInner> {
        let id = Arc::new(IdInner {
            chan: Arc::downgrade(chan),
            token: AtomicU64::new(token),
            closed: AtomicBool::new(false),
            st: Mutex::new(IdState {
                state,
                dev: None,
                local: None,
                peer: None,
                qp: None,
                link: None,
                req: None,
                param: None,
                pending: 0,
                backlog: 0,
                listener: Weak::new(),
            }),
        });
        let mut ids = lock(&IDS);
        ids.retain(|w| w.strong_count() > 0);
        ids.push(Arc::downgrade(&id));
        id
    }

    fn st(&self) -> MutexGuard<'_, IdState> {
        lock(&self.st)
    }

    fn event(self: &Arc<Self>, kind: CmEventKind, new_id: Option<Arc<IdInner>>) {
        tracing::debug!(?kind, "soft CM event");
        // A channel nobody holds any more: nobody can read the event (rdma_cm delivers nothing
        // to a destroyed channel either).
        if let Some(chan) = self.chan.upgrade() {
            chan.push(RawEvent {
                token_of: self.clone(),
                kind,
                new_id,
            });
        }
    }
}

/// Send `msg` over `link` (never called with an id lock held: in-process delivery is direct).
fn send(link: &Link, msg: Msg) -> bool {
    match link {
        Link::InProc(w) => match w.upgrade() {
            Some(peer) => {
                handle(&peer, msg);
                true
            }
            None => false,
        },
        Link::Tcp(s) => lock(s).write_all(&msg.encode()).is_ok(),
    }
}

/// A message arrived for `id`.
fn handle(id: &Arc<IdInner>, msg: Msg) {
    match msg {
        Msg::Req { .. } => {}
        Msg::Rep {
            pd,
            resp_res,
            init_depth,
            rnr_retry,
            ep,
        } => {
            let (qp, param, link) = {
                let st = id.st();
                if st.state != State::Connecting {
                    return;
                }
                (
                    st.qp.clone(),
                    st.param.clone().unwrap_or_default(),
                    st.link.clone(),
                )
            };
            let _ = (resp_res, init_depth);
            let ok = qp.as_ref().is_some_and(|qp| {
                qp.to_rtr(&RtrAttr {
                    remote: ep,
                    port_num: 1,
                    sgid_index: 0,
                    path_mtu: Mtu::Mtu4096,
                    max_dest_rd_atomic: param.responder_resources,
                    min_rnr_timer: MIN_RNR_TIMER,
                })
                .and_then(|_| {
                    qp.to_rts(&RtsAttr {
                        sq_psn: 0,
                        timeout: ACK_TIMEOUT,
                        retry_cnt: param.retry_count,
                        rnr_retry,
                        max_rd_atomic: param.initiator_depth,
                    })
                })
                .map_err(|e| tracing::warn!(error = %e, "soft CM: QP transition on REP failed"))
                .is_ok()
            });
            if !ok {
                id.st().state = State::Rejected;
                if let Some(l) = &link {
                    send(
                        l,
                        Msg::Rej {
                            reason: REJ_NO_RESOURCES,
                            pd: Vec::new(),
                        },
                    );
                }
                id.event(CmEventKind::ConnectError, None);
                return;
            }
            id.st().state = State::Established;
            if let Some(l) = &link {
                send(l, Msg::Rtu);
            }
            id.event(CmEventKind::Established { private_data: pd }, None);
        }
        Msg::Rej { reason, pd } => {
            {
                let mut st = id.st();
                if !matches!(st.state, State::Connecting | State::Accepted) {
                    return;
                }
                st.state = State::Rejected;
            }
            id.event(
                CmEventKind::Rejected {
                    reason,
                    private_data: pd,
                },
                None,
            );
        }
        Msg::Rtu => {
            {
                let mut st = id.st();
                if st.state != State::Accepted {
                    return;
                }
                st.state = State::Established;
            }
            id.event(
                CmEventKind::Established {
                    private_data: Vec::new(),
                },
                None,
            );
        }
        Msg::Dreq => {
            let (qp, link, was) = {
                let mut st = id.st();
                let was = st.state;
                if !matches!(
                    was,
                    State::Established | State::Accepted | State::Connecting | State::Disconnecting
                ) {
                    return;
                }
                st.state = State::Disconnected;
                (st.qp.clone(), st.link.clone(), was)
            };
            if let Some(qp) = qp {
                qp.enter_err(true);
            }
            if let Some(l) = &link {
                send(l, Msg::Drep);
            }
            id.event(CmEventKind::Disconnected, None);
            id.event(CmEventKind::TimewaitExit, None);
            let _ = was;
        }
        Msg::Drep => {
            {
                let mut st = id.st();
                if st.state != State::Disconnecting {
                    return;
                }
                st.state = State::Disconnected;
            }
            id.event(CmEventKind::Disconnected, None);
            id.event(CmEventKind::TimewaitExit, None);
        }
    }
}

/// The peer of a TCP CM connection went away without a DREQ.
fn link_lost(id: &Arc<IdInner>) {
    let state = id.st().state;
    match state {
        State::Established | State::Accepted | State::Disconnecting => handle_lost_established(id),
        State::Connecting => {
            id.st().state = State::Rejected;
            id.event(CmEventKind::Unreachable, None);
        }
        _ => {}
    }
}

fn handle_lost_established(id: &Arc<IdInner>) {
    let qp = {
        let mut st = id.st();
        st.state = State::Disconnected;
        st.link = None;
        st.qp.clone()
    };
    if let Some(qp) = qp {
        qp.enter_err(true);
    }
    id.event(CmEventKind::Disconnected, None);
    id.event(CmEventKind::TimewaitExit, None);
}

/// A REQ reached `listener`: make the passive id and raise CONNECT_REQUEST (or refuse).
/// `linked` runs before the event is raised, so the active side can link back first.
fn incoming_req(
    listener: &Arc<IdInner>,
    req: Msg,
    link: Link,
    local: SocketAddr,
    remote: SocketAddr,
    linked: impl FnOnce(&Arc<IdInner>),
) -> Option<Arc<IdInner>> {
    let Msg::Req {
        ref pd,
        resp_res,
        init_depth,
        ep,
        ..
    } = req
    else {
        return None;
    };
    // The requester's address is its device's (the GID in the REQ), as IB CM reports it,
    // whatever source address the kernel picked for a TCP CM connection.
    let remote = ep
        .gid
        .to_ipv4()
        .map_or(remote, |ip| SocketAddr::new(IpAddr::V4(ip), remote.port()));
    let (dev, chan) = {
        let mut st = listener.st();
        let chan = listener.chan.upgrade();
        let open = st.state == State::Listening && !listener.closed.load(Ordering::Acquire);
        let Some(chan) = chan.filter(|_| open) else {
            drop(st);
            send(
                &link,
                Msg::Rej {
                    reason: REJ_INVALID_SERVICE_ID,
                    pd: Vec::new(),
                },
            );
            return None;
        };
        if st.pending >= st.backlog.max(1) {
            drop(st);
            tracing::debug!(%local, "soft CM: backlog full, connection refused");
            send(
                &link,
                Msg::Rej {
                    reason: REJ_NO_RESOURCES,
                    pd: Vec::new(),
                },
            );
            return None;
        }
        st.pending += 1;
        (st.dev.clone(), chan)
    };
    let id = IdInner::new(&chan, 0, State::ReqReceived);
    {
        let mut st = id.st();
        st.dev = device_for_ip(local.ip()).or(dev);
        st.local = Some(local);
        st.peer = Some(remote);
        st.link = Some(link);
        st.listener = Arc::downgrade(listener);
        st.req = Some(req.clone());
    }
    linked(&id);
    listener.event(
        CmEventKind::ConnectRequest {
            private_data: pd.clone(),
            responder_resources: resp_res,
            initiator_depth: init_depth,
            local,
            remote,
        },
        Some(id.clone()),
    );
    Some(id)
}

fn device_for_ip(ip: IpAddr) -> Option<SoftContext> {
    device::devices()
        .into_iter()
        .find(|d| IpAddr::V4(d.ip()) == ip)
        .map(|inner| SoftContext { inner })
}

fn find_listener(addr: SocketAddr) -> Option<Arc<IdInner>> {
    let mut l = lock(&LISTENERS);
    l.retain(|(_, w)| w.strong_count() > 0);
    let exact = l
        .iter()
        .find(|(a, _)| *a == addr)
        .and_then(|(_, w)| w.upgrade());
    exact.or_else(|| {
        l.iter()
            .find(|(a, _)| a.ip().is_unspecified() && a.port() == addr.port())
            .and_then(|(_, w)| w.upgrade())
    })
}

/// DEVICE_REMOVAL on every id bound to `dev`.
pub(crate) fn device_removed(dev: &Arc<DeviceInner>) {
    let ids: Vec<Arc<IdInner>> = lock(&IDS).iter().filter_map(Weak::upgrade).collect();
    for id in ids {
        let bound = id
            .st()
            .dev
            .as_ref()
            .is_some_and(|d| Arc::ptr_eq(&d.inner, dev));
        if bound {
            id.event(CmEventKind::DeviceRemoval, None);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Public types

/// A CM event channel of the soft provider.
#[derive(Clone)]
pub struct SoftCmChannel {
    inner: Arc<EventQueue<RawEvent>>,
}

impl SoftCmChannel {
    pub(crate) fn new() -> Result<Self> {
        Ok(SoftCmChannel {
            inner: Arc::new(EventQueue::new()?),
        })
    }
}

/// A CM id of the soft provider.
pub struct SoftCmId {
    inner: Arc<IdInner>,
}

impl CmChannelOps<Soft> for SoftCmChannel {
    fn fd(&self) -> RawFd {
        self.inner.fd()
    }

    fn poll_event(&self) -> Result<Option<CmEvent<Soft>>> {
        Ok(self.inner.pop().map(|e| CmEvent {
            token: e.token_of.token.load(Ordering::Acquire),
            kind: e.kind,
            id: e.new_id.map(|inner| SoftCmId { inner }),
        }))
    }

    fn listen(&self, addr: SocketAddr, backlog: u32, token: u64) -> Result<SoftCmId> {
        let devs = device::devices();
        let dev = if addr.ip().is_unspecified() {
            devs.first().cloned()
        } else {
            devs.iter()
                .find(|d| IpAddr::V4(d.ip()) == addr.ip())
                .cloned()
        };
        let Some(dev) = dev else {
            tracing::warn!(%addr, devices = ?devs.iter().map(|d| (d.name().to_string(), d.ip())).collect::<Vec<_>>(),
                "no soft device owns the listen address");
            return Err(TransportError::AddressNotServed(addr));
        };
        let id = IdInner::new(&self.inner, token, State::Listening);
        let bound = match dev.cfg.fabric {
            SoftFabric::InProcess => {
                let addr = if addr.port() == 0 {
                    SocketAddr::new(addr.ip(), ephemeral_port())
                } else {
                    addr
                };
                let mut l = lock(&LISTENERS);
                l.retain(|(_, w)| w.strong_count() > 0);
                if l.iter().any(|(a, _)| *a == addr) {
                    return Err(TransportError::Os {
                        op: "soft rdma_bind_addr",
                        source: std::io::Error::from(std::io::ErrorKind::AddrInUse),
                    });
                }
                l.push((addr, Arc::downgrade(&id)));
                addr
            }
            SoftFabric::Tcp => {
                let listener = TcpListener::bind(addr).map_err(|e| TransportError::Os {
                    op: "soft CM listen",
                    source: e,
                })?;
                let bound = listener.local_addr()?;
                let weak = Arc::downgrade(&id);
                cm_threads::spawn("soft-cm-listen", move || tcp_accept_loop(listener, weak))
                    .map_err(|e| TransportError::Os {
                        op: "spawn soft CM listener",
                        source: e,
                    })?;
                bound
            }
        };
        {
            let mut st = id.st();
            st.dev = Some(SoftContext { inner: dev });
            st.local = Some(bound);
            st.backlog = backlog;
        }
        Ok(SoftCmId { inner: id })
    }

    fn resolve(
        &self,
        dst: SocketAddr,
        src: Option<SocketAddr>,
        _timeout: Duration,
        token: u64,
    ) -> Result<SoftCmId> {
        let devs = device::devices();
        let dev = match src.filter(|s| !s.ip().is_unspecified()) {
            Some(s) => devs
                .iter()
                .find(|d| IpAddr::V4(d.ip()) == s.ip())
                .cloned()
                .ok_or(TransportError::AddressNotServed(s)),
            None => devs
                .iter()
                .find(|d| IpAddr::V4(d.ip()) == dst.ip())
                .or_else(|| {
                    devs.iter().find(|d| match d.cfg.fabric {
                        SoftFabric::Tcp => true,
                        SoftFabric::InProcess => find_listener(dst).is_some(),
                    })
                })
                .cloned()
                .ok_or(TransportError::AddressNotServed(dst)),
        };
        let dev = dev.inspect_err(|_| {
            tracing::warn!(%dst, ?src, devices = ?devs.iter().map(|d| (d.name().to_string(), d.ip(), d.cfg.fabric)).collect::<Vec<_>>(),
                "no soft device serves this address (open one with Soft::open and an ip on that path)");
        })?;
        let id = IdInner::new(&self.inner, token, State::Resolved);
        {
            let mut st = id.st();
            st.local = Some(SocketAddr::new(
                IpAddr::V4(dev.ip()),
                src.map_or(0, |s| s.port()),
            ));
            st.peer = Some(dst);
            st.dev = Some(SoftContext { inner: dev });
        }
        Ok(SoftCmId { inner: id })
    }
}

fn tcp_accept_loop(listener: TcpListener, id: Weak<IdInner>) {
    for stream in listener.incoming() {
        let Some(l) = id.upgrade() else { return };
        if l.closed.load(Ordering::Acquire) {
            return;
        }
        let Ok(stream) = stream else { continue };
        let _ = stream.set_nodelay(true);
        let weak = Arc::downgrade(&l);
        drop(l);
        let spawned = cm_threads::spawn("soft-cm-conn", move || tcp_passive_conn(stream, weak));
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "soft CM: cannot spawn a connection thread");
        }
    }
}

fn tcp_passive_conn(mut stream: TcpStream, listener: Weak<IdInner>) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    let Some(req @ Msg::Req { .. }) = read_msg(&mut stream) else {
        return;
    };
    let _ = stream.set_read_timeout(None);
    let (Ok(local), Ok(remote), Ok(w)) =
        (stream.local_addr(), stream.peer_addr(), stream.try_clone())
    else {
        return;
    };
    let Some(l) = listener.upgrade() else { return };
    let link = Link::Tcp(Arc::new(Mutex::new(w)));
    let id = incoming_req(&l, req, link, local, remote, |_| {});
    drop(l);
    let Some(id) = id else { return };
    let weak = Arc::downgrade(&id);
    drop(id);
    tcp_read_loop(stream, weak);
}

fn tcp_read_loop(mut stream: TcpStream, id: Weak<IdInner>) {
    loop {
        let msg = read_msg(&mut stream);
        let Some(id) = id.upgrade() else { return };
        match msg {
            Some(m) => handle(&id, m),
            None => {
                link_lost(&id);
                return;
            }
        }
    }
}

impl SoftCmId {
    fn param_check(pd: &[u8], max: usize, what: &str) -> Result<()> {
        if pd.len() > max {
            return Err(TransportError::InvalidArgument(format!(
                "{what} private data is {} bytes, at most {max} allowed",
                pd.len()
            )));
        }
        Ok(())
    }

    fn qp_endpoint(st: &IdState) -> Result<(Arc<QpShared>, QpEndpoint)> {
        let qp = st
            .qp
            .clone()
            .ok_or_else(|| TransportError::Cm("create_qp on this id first".into()))?;
        // A random PSN: on the TCP fabric it is the credential the peer's HELLO must carry
        // (`tcp::accept_loop`), so only the CM peer can attach to this QP.
        let psn = {
            use std::hash::BuildHasher;
            std::collections::hash_map::RandomState::new()
                .hash_one((qp.qp_num(), std::time::Instant::now())) as u32
                & 0x00ff_ffff
        };
        let ep = qp.endpoint(1, 0, psn)?;
        Ok((qp, ep))
    }
}

impl CmIdOps<Soft> for SoftCmId {
    fn token(&self) -> u64 {
        self.inner.token.load(Ordering::Acquire)
    }

    fn set_token(&mut self, token: u64) {
        self.inner.token.store(token, Ordering::Release);
    }

    fn context(&self) -> Result<SoftContext> {
        self.inner
            .st()
            .dev
            .clone()
            .ok_or_else(|| TransportError::Cm("CM id not bound to a device".into()))
    }

    fn port_num(&self) -> u8 {
        1
    }

    fn local_addr(&self) -> Option<SocketAddr> {
        self.inner.st().local
    }

    fn peer_addr(&self) -> Option<SocketAddr> {
        self.inner.st().peer
    }

    fn create_qp(&mut self, pd: &SoftPd, init: &QpInit<'_, Soft>) -> Result<SoftQp> {
        let dev = self.context()?;
        if !Arc::ptr_eq(pd.dev(), &dev.inner) {
            return Err(TransportError::Mismatch("PD is not on the CM id's device"));
        }
        let qp = pd.create_qp(init)?;
        qp.sh.to_init(
            1,
            Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
        )?;
        self.inner.st().qp = Some(qp.sh.clone());
        Ok(qp)
    }

    fn connect(&mut self, param: &ConnParam) -> Result<()> {
        Self::param_check(&param.private_data, MAX_CONNECT_PRIVATE_DATA, "connect")?;
        let (ep, dst, fabric) = {
            let mut st = self.inner.st();
            if st.state != State::Resolved {
                return Err(TransportError::Cm(format!(
                    "connect in state {:?}",
                    st.state
                )));
            }
            let (_, ep) = Self::qp_endpoint(&st)?;
            let dst = st
                .peer
                .ok_or_else(|| TransportError::Cm("resolve first".into()))?;
            let fabric = st
                .dev
                .as_ref()
                .map_or(SoftFabric::InProcess, |d| d.inner.cfg.fabric);
            st.state = State::Connecting;
            st.param = Some(param.clone());
            (ep, dst, fabric)
        };
        let req = Msg::Req {
            pd: param.private_data.clone(),
            resp_res: param.responder_resources,
            init_depth: param.initiator_depth,
            retry: param.retry_count,
            rnr_retry: param.rnr_retry_count,
            ep,
        };
        match fabric {
            SoftFabric::InProcess => {
                let Some(l) = find_listener(dst) else {
                    self.inner.st().state = State::Rejected;
                    self.inner.event(
                        CmEventKind::Rejected {
                            reason: REJ_INVALID_SERVICE_ID,
                            private_data: Vec::new(),
                        },
                        None,
                    );
                    return Ok(());
                };
                let local = {
                    let mut st = self.inner.st();
                    let mut local = st
                        .local
                        .unwrap_or(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0));
                    if local.port() == 0 {
                        local.set_port(ephemeral_port());
                    }
                    st.local = Some(local);
                    local
                };
                let me = Link::InProc(Arc::downgrade(&self.inner));
                let inner = self.inner.clone();
                incoming_req(&l, req, me, dst, local, |p| {
                    inner.st().link = Some(Link::InProc(Arc::downgrade(p)));
                });
            }
            SoftFabric::Tcp => {
                let weak = Arc::downgrade(&self.inner);
                let spawned =
                    cm_threads::spawn("soft-cm-connect", move || tcp_active(weak, dst, req));
                if let Err(e) = spawned {
                    self.inner.st().state = State::Resolved;
                    return Err(TransportError::Os {
                        op: "spawn soft CM connect",
                        source: e,
                    });
                }
            }
        }
        Ok(())
    }

    fn accept(&mut self, param: &ConnParam) -> Result<()> {
        Self::param_check(&param.private_data, MAX_ACCEPT_PRIVATE_DATA, "accept")?;
        let (qp, ep, req, link, listener) = {
            let st = self.inner.st();
            if st.state != State::ReqReceived {
                return Err(TransportError::Cm(format!(
                    "accept in state {:?}",
                    st.state
                )));
            }
            let (qp, ep) = Self::qp_endpoint(&st)?;
            (qp, ep, st.req.clone(), st.link.clone(), st.listener.clone())
        };
        let Some(Msg::Req {
            retry,
            rnr_retry,
            ep: remote,
            ..
        }) = req
        else {
            return Err(TransportError::Cm("no connect request to accept".into()));
        };
        qp.to_rtr(&RtrAttr {
            remote,
            port_num: 1,
            sgid_index: 0,
            path_mtu: Mtu::Mtu4096,
            max_dest_rd_atomic: param.responder_resources,
            min_rnr_timer: MIN_RNR_TIMER,
        })?;
        qp.to_rts(&RtsAttr {
            sq_psn: 0,
            timeout: ACK_TIMEOUT,
            retry_cnt: retry,
            rnr_retry,
            max_rd_atomic: param.initiator_depth,
        })?;
        {
            let mut st = self.inner.st();
            st.state = State::Accepted;
            st.param = Some(param.clone());
        }
        if let Some(l) = listener.upgrade() {
            let mut st = l.st();
            st.pending = st.pending.saturating_sub(1);
        }
        let rep = Msg::Rep {
            pd: param.private_data.clone(),
            resp_res: param.responder_resources,
            init_depth: param.initiator_depth,
            rnr_retry: param.rnr_retry_count,
            ep,
        };
        if !link.as_ref().is_some_and(|l| send(l, rep)) {
            link_lost(&self.inner);
        }
        Ok(())
    }

    fn reject(&mut self, private_data: &[u8]) -> Result<()> {
        Self::param_check(private_data, MAX_REJECT_PRIVATE_DATA, "reject")?;
        let (link, listener) = {
            let mut st = self.inner.st();
            if st.state != State::ReqReceived {
                return Err(TransportError::Cm(format!(
                    "reject in state {:?}",
                    st.state
                )));
            }
            st.state = State::Rejected;
            (st.link.take(), st.listener.clone())
        };
        if let Some(l) = listener.upgrade() {
            let mut st = l.st();
            st.pending = st.pending.saturating_sub(1);
        }
        if let Some(l) = link {
            send(
                &l,
                Msg::Rej {
                    reason: REJ_CONSUMER,
                    pd: private_data.to_vec(),
                },
            );
        }
        Ok(())
    }

    fn disconnect(&mut self) -> Result<()> {
        let (qp, link) = {
            let mut st = self.inner.st();
            match st.state {
                State::Established | State::Accepted | State::Connecting => {}
                State::Disconnecting | State::Disconnected => return Ok(()),
                s => return Err(TransportError::Cm(format!("disconnect in state {s:?}"))),
            }
            st.state = State::Disconnecting;
            (st.qp.clone(), st.link.clone())
        };
        if let Some(qp) = qp {
            qp.enter_err(true);
        }
        if !link.as_ref().is_some_and(|l| send(l, Msg::Dreq)) {
            // No peer to answer: the DREQ times out.
            let mut st = self.inner.st();
            if st.state == State::Disconnecting {
                st.state = State::Disconnected;
                drop(st);
                self.inner.event(CmEventKind::Disconnected, None);
                self.inner.event(CmEventKind::TimewaitExit, None);
            }
        }
        Ok(())
    }
}

fn tcp_active(id: Weak<IdInner>, dst: SocketAddr, req: Msg) {
    let conn = TcpStream::connect_timeout(&dst, DEFAULT_CM_TIMEOUT);
    let Some(me) = id.upgrade() else { return };
    let stream = match conn {
        Ok(s) => s,
        Err(e) => {
            me.st().state = State::Rejected;
            if e.kind() == std::io::ErrorKind::ConnectionRefused {
                me.event(
                    CmEventKind::Rejected {
                        reason: REJ_INVALID_SERVICE_ID,
                        private_data: Vec::new(),
                    },
                    None,
                );
            } else {
                me.event(CmEventKind::Unreachable, None);
            }
            return;
        }
    };
    let _ = stream.set_nodelay(true);
    let Ok(w) = stream.try_clone() else {
        return link_lost(&me);
    };
    if let Ok(local) = stream.local_addr() {
        let mut st = me.st();
        st.local = Some(SocketAddr::new(
            st.local.map_or(local.ip(), |l| l.ip()),
            local.port(),
        ));
    }
    let link = Link::Tcp(Arc::new(Mutex::new(w)));
    me.st().link = Some(link.clone());
    if !send(&link, req) {
        return link_lost(&me);
    }
    drop(me);
    tcp_read_loop(stream, id);
}

impl Drop for SoftCmId {
    fn drop(&mut self) {
        self.inner.closed.store(true, Ordering::Release);
        let (state, link, local, qp) = {
            let mut st = self.inner.st();
            let s = st.state;
            st.state = State::Idle;
            (s, st.link.take(), st.local, st.qp.take())
        };
        match state {
            State::Listening => {
                lock(&LISTENERS).retain(|(_, w)| !w.ptr_eq(&Arc::downgrade(&self.inner)));
                // Wake a TCP accept loop so it sees the id is gone.
                if let Some(a) = local {
                    if self
                        .inner
                        .st()
                        .dev
                        .as_ref()
                        .is_some_and(|d| d.inner.cfg.fabric == SoftFabric::Tcp)
                    {
                        let wake = if a.ip().is_unspecified() {
                            SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), a.port())
                        } else {
                            a
                        };
                        let _ = TcpStream::connect_timeout(&wake, Duration::from_millis(200));
                    }
                }
            }
            State::Established | State::Accepted | State::Connecting => {
                // rdma_destroy_id on a live connection sends a DREQ.
                if let Some(qp) = &qp {
                    qp.enter_err(true);
                }
                if let Some(l) = &link {
                    send(l, Msg::Dreq);
                }
            }
            State::ReqReceived => {
                if let Some(l) = &link {
                    send(
                        l,
                        Msg::Rej {
                            reason: REJ_CONSUMER,
                            pd: Vec::new(),
                        },
                    );
                }
                if let Some(l) = self.inner.st().listener.upgrade() {
                    let mut st = l.st();
                    st.pending = st.pending.saturating_sub(1);
                }
            }
            _ => {}
        }
        if let Some(Link::Tcp(s)) = &link {
            let _ = lock(s).shutdown(std::net::Shutdown::Both);
        }
        // Events still queued for this id stay readable; the id they name is gone.
    }
}

#[cfg(test)]
#[path = "cm_tests.rs"]
mod tests;

/// The CM's message decoding under a fuzzer (`soft::fuzzing::cm_message`, the
/// `fuzz_soft_cm_message` target): any bytes decode without panic, and what decodes re-encodes to
/// a message that decodes the same (nothing half-read).
#[cfg(feature = "fuzzing")]
pub(crate) mod fuzz {
    use super::Msg;

    pub fn message(body: &[u8]) {
        if let Some(m) = Msg::decode(body) {
            let framed = m.encode();
            assert_eq!(Msg::decode(&framed[4..]).as_ref(), Some(&m), "{body:?}");
        }
    }
}
