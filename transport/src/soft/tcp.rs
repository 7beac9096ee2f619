//! The TCP fabric: QPs of soft devices in different processes (or hosts) talk over one TCP
//! connection per QP pair, carrying RC-like frames, and all progress is driven by polling CQs.
//!
//! - Each TCP device listens on `ip:fabric_port` (reported as the port's `lid`). At RTR the QP
//!   with the smaller (ip, lid, qp_num) starts a non-blocking connect to the other device's
//!   listener and queues a HELLO naming both QPs and the PSN the peer published; the device's
//!   acceptor (a polling loop, never blocked by a slow peer) hands the stream to the named QP
//!   once that QP is in RTR, connected to that peer, and published that PSN (the soft CM
//!   makes PSNs random, so only the CM peer can attach).
//! - RC sequence: the responder's expected sequence lives in the QP, so a replacement
//!   connection continues it (the requester re-sends what was not acknowledged; duplicates are
//!   acknowledged again, a duplicate READ answered again). A gap is NAKed (sequence error) once
//!   and the requester re-sends from the expected request.
//! - Frames: a 32-byte header (type, flags, NAK code, payload length, sequence, address, key,
//!   immediate) plus payload. Requests: SEND (+IMM / +INV), WRITE (+IMM), READ_REQ. Responses:
//!   ACK, READ_RESP, NAK (RNR with the responder's timer, remote access, invalid request,
//!   remote operational, dead responder). A requester completes a WR only when the responder
//!   acknowledged it, as in RC.
//! - Go-back-N: after an RNR NAK the responder drops every request until the NAK'd one comes
//!   back; the requester re-sends from it when the RNR timer expires.
//! - Progress: every CQ owns a mio `Poll`; the sockets of the QPs attached to it are registered
//!   (edge-triggered). Polling the CQ polls epoll with a zero timeout and
//!   runs the ready QPs only, so thousands of idle QPs cost nothing. Writes are non-blocking
//!   with a per-connection output buffer, flushed on writable readiness.
//! - Syscalls are per batch, not per frame: a `post_send` list is written with one write at its
//!   end, a progress run reads until a short read (edge-triggered epoll reports later data; once
//!   an event said the peer closed, until the end of the stream, which may have come with the
//!   last data) and writes once, a responder sends one cumulative ACK per batch of requests it read, runs
//!   without a readiness event read nothing, and write-space events run nothing unless output
//!   waits.
//! - A pure ACK rides on the next frame out: the run that read the requests holds it (when
//!   the QP's sends and receives complete on one CQ), so the response the application posts
//!   after reaping carries it in the same write; with nothing posted it goes alone on a later
//!   poll, once the consumer has taken the requests' completions (or after one ACK timer
//!   tick: a consumer that polls without reaping them). A consumer may stop polling once it
//!   reaped what it wanted, and RC still owes the peer its ACK (a NIC acknowledges on its
//!   own): arming the CQ for an event sends the held ACKs at once, closing a connection sends
//!   its own, and the device's acceptor thread is the ACK timer: each tick it sends those of
//!   a CQ nobody polled since the last tick.
//! - Payloads of 1 KiB or more leave straight from their registered spans (one `sendmsg` over
//!   the headers and the pinned spans), not gathered into the output buffer first.

use std::collections::{HashMap, VecDeque};
use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Registry, Token};

use super::delivery_batch::DeliveryBatch;
use super::device::DeviceInner;
use super::mem;
use super::qp::{PooledEntry, QpShared, Slow, SqEntry, Stall};
use crate::error::{Result, TransportError};
use crate::types::*;

const HDR: usize = 32;
/// Largest payload a frame may carry (a bigger length is a corrupt or hostile stream): the
/// soft device's largest message.
const MAX_PAYLOAD: usize = 256 << 20;

/// A payload from registered memory at least this long is written from there (`OutRef`);
/// a shorter one is copied into the output buffer (a key lookup costs more than the copy).
const DIRECT_MIN: usize = 1024;
/// Most spans waiting for one flush (each pinned for the flush's write); past it, payloads are
/// copied. With bytes between and around them they fill one `sendmsg`'s iovecs (at 64 a full
/// flush's last part took a second call).
const MAX_REFS: usize = (mem::MAX_IOV - 1) / 2;

/// A connection's input buffer starts this small (thousands of idle connections each keep
/// one: 64 KiB each was most of nvmf-tgt's memory per qpair) and doubles whenever a read
/// fills it, up to `INB_MAX`, so a busy connection takes what the socket holds in one read.
const INB_START: usize = 4 * 1024;
/// Largest input buffer reads grow to (a single frame may still need more: it grows to fit).
const INB_MAX: usize = 256 * 1024;

const T_HELLO: u8 = 1;
const T_SEND: u8 = 2;
const T_SEND_IMM: u8 = 3;
const T_SEND_INV: u8 = 4;
const T_WRITE: u8 = 5;
const T_WRITE_IMM: u8 = 6;
const T_READ_REQ: u8 = 7;
const T_READ_RESP: u8 = 8;
const T_ACK: u8 = 9;
const T_NAK: u8 = 10;

const F_SOLICITED: u8 = 1;

const NAK_RNR: u16 = 1;
const NAK_REM_ACCESS: u16 = 2;
const NAK_REM_INV_REQ: u16 = 3;
const NAK_REM_OP: u16 = 4;
const NAK_DEAD: u16 = 5;
/// Sequence error: the responder expected the request whose sequence the NAK carries.
const NAK_SEQ: u16 = 6;

#[derive(Clone, Copy, Default, Debug)]
struct Hdr {
    ty: u8,
    flags: u8,
    code: u16,
    len: u32,
    seq: u64,
    addr: u64,
    key: u32,
    imm: u32,
}

impl Hdr {
    fn encode(&self, out: &mut Vec<u8>) {
        out.push(self.ty);
        out.push(self.flags);
        out.extend_from_slice(&self.code.to_le_bytes());
        out.extend_from_slice(&self.len.to_le_bytes());
        out.extend_from_slice(&self.seq.to_le_bytes());
        out.extend_from_slice(&self.addr.to_le_bytes());
        out.extend_from_slice(&self.key.to_le_bytes());
        out.extend_from_slice(&self.imm.to_le_bytes());
    }

    fn decode(b: &[u8]) -> Option<Hdr> {
        let b: &[u8; HDR] = b.get(..HDR)?.try_into().ok()?;
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let u64_at = |i: usize| u64::from(u32_at(i)) | u64::from(u32_at(i + 4)) << 32;
        Some(Hdr {
            ty: b[0],
            flags: b[1],
            code: u16::from_le_bytes([b[2], b[3]]),
            len: u32_at(4),
            seq: u64_at(8),
            addr: u64_at(16),
            key: u32_at(24),
            imm: u32_at(28),
        })
    }
}

// ---------------------------------------------------------------------------------------------
// Device side: the listener and acceptor thread.

pub(crate) struct TcpFabric {
    port: u16,
}

impl TcpFabric {
    pub(crate) fn start(dev: &Arc<DeviceInner>) -> Result<Arc<TcpFabric>> {
        raise_nofile();
        let addr = SocketAddr::from((dev.cfg.ip, dev.cfg.fabric_port));
        let listener = TcpListener::bind(addr).map_err(|e| TransportError::Os {
            op: "soft TCP fabric bind",
            source: e,
        })?;
        let port = listener.local_addr()?.port();
        let weak = Arc::downgrade(dev);
        std::thread::Builder::new()
            .name(format!("soft-fabric-{}", dev.cfg.name))
            .stack_size(256 * 1024)
            .spawn(move || accept_loop(listener, weak))
            .map_err(|e| TransportError::Os {
                op: "spawn soft fabric acceptor",
                source: e,
            })?;
        Ok(Arc::new(TcpFabric { port }))
    }

    pub(crate) fn port(&self) -> u16 {
        self.port
    }
}

/// 1000 QPs over TCP in one process need thousands of fds: lift the soft limit to the hard one.
fn raise_nofile() {
    if let Err(e) = rlimit::increase_nofile_limit(u64::MAX) {
        tracing::debug!(error = %e, "could not raise RLIMIT_NOFILE");
    }
}

/// How long an accepted connection may take to name its QP (HELLO), and to wait for that QP to
/// reach RTR, before it is dropped.
const HELLO_WAIT: Duration = Duration::from_secs(5);
/// How often the acceptor looks at pending connections and whether its device still exists,
/// and the ACK timer's period (a held ACK of a CQ nobody polls waits one to two ticks).
const ACCEPT_TICK: Duration = Duration::from_millis(10);

/// An accepted connection whose HELLO is not complete or not yet accepted.
struct Pending {
    stream: std::net::TcpStream,
    hello: [u8; HDR],
    got: usize,
    since: Instant,
}

/// What to do with a pending connection.
enum Verdict {
    Attach(Arc<QpShared>),
    Wait,
    Drop,
}

/// The device's acceptor: a non-blocking loop (no read can hold it up) that hands each data
/// connection to the QP its HELLO names, once that QP is in RTR and the HELLO carries the
/// peer it was connected to and the PSN it published (`QpShared::published_psn`).
fn accept_loop(listener: TcpListener, dev: Weak<DeviceInner>) {
    let mut pending: Vec<Pending> = Vec::new();
    if listener.set_nonblocking(true).is_err() {
        return;
    }
    let mut listener = mio::net::TcpListener::from_std(listener);
    let (mut poll, mut events) = match Poll::new() {
        Ok(p) => (p, Events::with_capacity(16)),
        Err(_) => return,
    };
    if poll
        .registry()
        .register(&mut listener, Token(0), Interest::READABLE)
        .is_err()
    {
        return;
    }
    let mut ack_tick = Instant::now();
    loop {
        let _ = poll.poll(&mut events, Some(ACCEPT_TICK));
        let Some(dev) = dev.upgrade() else { return };
        if ack_tick.elapsed() >= ACCEPT_TICK {
            ack_tick = Instant::now();
            dev.ack_timer_tick();
        }
        loop {
            match listener.accept() {
                Ok((stream, _)) => {
                    // Into a std stream (still non-blocking) for the byte-wise HELLO reads.
                    let stream = std::net::TcpStream::from(std::os::fd::OwnedFd::from(stream));
                    let _ = stream.set_nodelay(true);
                    pending.push(Pending {
                        stream,
                        hello: [0; HDR],
                        got: 0,
                        since: Instant::now(),
                    });
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(_) => break,
            }
        }
        let now = Instant::now();
        pending.retain_mut(|p| match step_pending(&dev, p, now) {
            Verdict::Wait => true,
            Verdict::Drop => false,
            Verdict::Attach(qp) => {
                let Ok(stream) = p.stream.try_clone() else {
                    return false;
                };
                let mut g = qp.lock();
                if let Some(old) = g.conn.take() {
                    close(&qp, *old);
                }
                g.conn = Some(Box::new(Conn::new(
                    &qp,
                    mio::net::TcpStream::from_std(stream),
                )));
                replaced_connection(&mut g);
                g.reset_budget(&qp);
                drop(g);
                kick(&qp);
                false
            }
        });
    }
}

/// Read what there is of `p`'s HELLO and judge it.
fn step_pending(dev: &Arc<DeviceInner>, p: &mut Pending, now: Instant) -> Verdict {
    if now.duration_since(p.since) > HELLO_WAIT {
        tracing::debug!(
            device = dev.name(),
            "soft fabric: no valid HELLO in time, connection dropped"
        );
        return Verdict::Drop;
    }
    while p.got < HDR {
        match p.stream.read(&mut p.hello[p.got..]) {
            Ok(0) => return Verdict::Drop,
            Ok(n) => p.got += n,
            Err(e) if e.kind() == ErrorKind::WouldBlock => return Verdict::Wait,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => return Verdict::Drop,
        }
    }
    let Some(h) = Hdr::decode(&p.hello) else {
        return Verdict::Drop;
    };
    if h.ty != T_HELLO {
        tracing::debug!(
            device = dev.name(),
            "soft fabric: connection without HELLO dropped"
        );
        return Verdict::Drop;
    }
    let (src_qpn, dst_qpn, psn) = (h.addr as u32, h.key, h.imm);
    let Some(qp) = dev.qp(dst_qpn) else {
        tracing::debug!(
            device = dev.name(),
            qp = dst_qpn,
            "soft fabric: HELLO for an unknown QP"
        );
        return Verdict::Drop;
    };
    let remote = qp.remote();
    match remote {
        // Not in RTR yet: the peer may be faster than this QP's owner; wait for it.
        None => Verdict::Wait,
        Some(r) if r.qp_num == src_qpn && qp.published_psn() == psn => Verdict::Attach(qp),
        Some(_) => {
            tracing::debug!(
                qp = dst_qpn,
                from = src_qpn,
                "soft fabric: HELLO from a peer this QP was not connected to"
            );
            Verdict::Drop
        }
    }
}

/// Make the QP's CQs run its progress on their next poll (data may already be waiting).
fn kick(qp: &Arc<QpShared>) {
    // One progress run covers both directions of the connection.
    qp.send_cq().want_progress(qp);
}

/// RTR on the TCP fabric: the side with the smaller address connects, without blocking: the
/// connect completes and the HELLO (this QP, the peer QP and the PSN the peer published, which
/// only who was given the peer's endpoint knows) leaves when the CQ's poll finds the socket
/// writable. A peer that cannot be reached fails the WRs with RETRY_EXC_ERR, as on hardware.
pub(crate) fn connect_qp(qp: &Arc<QpShared>, ip: Ipv4Addr, remote: &QpEndpoint) -> Result<()> {
    let port = remote.lid;
    let me = (u32::from(qp.dev().ip()), qp.dev().lid(), qp.qp_num());
    let them = (u32::from(ip), port, remote.qp_num);
    if me == them {
        return Err(TransportError::Unsupported(
            "a soft TCP QP connected to itself",
        ));
    }
    if me > them {
        // The peer connects to us; the acceptor attaches the stream.
        kick(qp);
        return Ok(());
    }
    let addr = SocketAddr::from((ip, port));
    let stream = mio::net::TcpStream::connect(addr).map_err(|e| TransportError::Os {
        op: "soft fabric connect",
        source: e,
    })?;
    let _ = stream.set_nodelay(true);
    let mut g = qp.lock();
    if let Some(old) = g.conn.take() {
        close(qp, *old);
    }
    let mut conn = Conn::new(qp, stream);
    Hdr {
        ty: T_HELLO,
        addr: u64::from(qp.qp_num()),
        key: remote.qp_num,
        imm: remote.psn,
        ..Hdr::default()
    }
    .encode(&mut conn.out);
    g.conn = Some(Box::new(conn));
    replaced_connection(&mut g);
    drop(g);
    kick(qp);
    Ok(())
}

/// A new data connection replaced the QP's previous one (or is its first): requests that were
/// on the old wire may be lost, so everything not yet acknowledged goes again; the responder's
/// expected sequence lives in the QP (`Slow::expect`) and survives, so duplicates are answered
/// and nothing later is lost.
fn replaced_connection(slow: &mut Slow) {
    for e in slow.sq.iter_mut() {
        e.sent = false;
    }
}

// ---------------------------------------------------------------------------------------------
// CQ side: one epoll per CQ.

pub(crate) struct TcpPoller {
    /// The epoll fd: readable while a socket of this CQ's QPs is ready (idle sleepers watch it).
    epfd: RawFd,
    poll: Mutex<(Poll, Events)>,
    registry: Registry,
    qps: Mutex<HashMap<u32, Weak<QpShared>>>,
}

impl TcpPoller {
    pub(crate) fn new() -> Result<TcpPoller> {
        let poll = Poll::new().map_err(|e| TransportError::Os {
            op: "epoll_create",
            source: e,
        })?;
        let registry = poll.registry().try_clone()?;
        Ok(TcpPoller {
            epfd: poll.as_raw_fd(),
            poll: Mutex::new((poll, Events::with_capacity(256))),
            registry,
            qps: Mutex::new(HashMap::new()),
        })
    }

    pub(crate) fn fd(&self) -> RawFd {
        self.epfd
    }

    pub(crate) fn attach(&self, qp: &Arc<QpShared>) {
        self.qps
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(qp.qp_num(), Arc::downgrade(qp));
    }

    pub(crate) fn detach(&self, qpn: u32) {
        self.qps
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&qpn);
    }

    fn register(&self, fd: RawFd, qpn: u32) {
        if let Err(e) = self.registry.register(
            &mut SourceFd(&fd),
            Token(qpn as usize),
            Interest::READABLE | Interest::WRITABLE,
        ) {
            tracing::warn!(error = %e, qp = qpn, "soft fabric: epoll register failed");
        }
    }

    fn deregister(&self, fd: RawFd) {
        let _ = self.registry.deregister(&mut SourceFd(&fd));
    }

    /// Run the QPs whose sockets are ready (zero-timeout epoll).
    pub(crate) fn poll(&self) {
        let Ok(mut g) = self.poll.try_lock() else {
            return;
        };
        let (poll, events) = &mut *g;
        if poll.poll(events, Some(Duration::ZERO)).is_err() {
            return;
        }
        if events.is_empty() {
            return;
        }
        let now = Instant::now();
        for ev in events.iter() {
            let closing = ev.is_read_closed() || ev.is_error() || ev.is_write_closed();
            let readable = ev.is_readable() || closing;
            let qp = self
                .qps
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(&(ev.token().0 as u32))
                .and_then(Weak::upgrade);
            let Some(qp) = qp else { continue };
            let mut g = qp.lock();
            match g.conn.as_mut() {
                Some(c) if readable => {
                    c.readable = true;
                    c.closing |= closing;
                }
                // Write space only (the peer's TCP ACKs free it after every send): progress
                // has work only if output waits for that space.
                Some(c) if !c.output_pending() && !c.dead => continue,
                _ => {}
            }
            let want = progress(&qp, &mut g, now);
            drop(g);
            if want {
                qp.send_cq().want_progress(&qp);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The connection of one QP.

/// A request's payload in registered memory, written by the next flush straight from there
/// (one `sendmsg` over the output buffer's headers and these spans) instead of gathered into
/// the buffer. The key is looked up (and the span pinned) again for that write, so nothing
/// holds a registration between calls; the flush follows in the same call that encoded it
/// (`post_send`'s list, a progress run), and what the socket does not take then is copied.
struct OutRef {
    /// Offset in `Conn::out` the span goes before.
    at: usize,
    lkey: u32,
    pd: u32,
    addr: u64,
    len: u64,
}

pub(crate) struct Conn {
    stream: mio::net::TcpStream,
    fd: RawFd,
    out: Vec<u8>,
    out_pos: usize,
    /// Responder: the cumulative ACK not encoded yet. ACKs are cumulative (one acknowledges
    /// every request up to its sequence), so the requests of one read share one ACK; any other
    /// frame, and every flush, encodes it first, keeping the stream's order.
    ack: Option<u64>,
    /// `ack` waits for a frame to ride on: set by the progress run that read the requests,
    /// cleared when a frame or a flush takes the ACK. A later run sends it alone once the
    /// consumer has reaped the requests' completions (`ack_covers`) and not answered them, or
    /// the hold is older than `ACK_HOLD_MAX`.
    ack_held: bool,
    /// The receive lane's position after the completions of the requests last read: until
    /// the consumer has taken them it cannot have answered them (a consumer reaping in
    /// batches smaller than the QPs one run read gets to them over several polls).
    ack_covers: u64,
    /// When `ack_held` was set.
    ack_held_since: Instant,
    /// Payload spans interleaved with `out` (in order; empty after every flush).
    refs: Vec<OutRef>,
    inb: Vec<u8>,
    in_len: usize,
    /// The socket may hold unread bytes: set by a readiness event (and for a new connection),
    /// cleared by a read that drained it. Runs without it (a deferred ACK, an RNR timer, write
    /// space) make no read syscall just to see WouldBlock.
    readable: bool,
    /// A readiness event said the peer closed its end (or the socket failed): read on to the
    /// end (0 or an error) even after a short read. The close may have arrived with the last
    /// data, under the same edge, and no later event would report it.
    closing: bool,
    /// Requester: re-send from this sequence when the RNR timer expires.
    go_back: Option<u64>,
    dead: bool,
    /// Fault: the next request frame is lost on the wire.
    lose_next: bool,
    /// Write syscalls made (tests count them).
    writes: u64,
    /// The receive completions of the frames being handled (empty between `handle_frames`
    /// runs).
    batch: DeliveryBatch,
}

impl Conn {
    fn new(qp: &QpShared, stream: mio::net::TcpStream) -> Conn {
        let fd = stream.as_raw_fd();
        if let Some(t) = &qp.send_cq().tcp {
            t.register(fd, qp.qp_num());
        }
        if !Arc::ptr_eq(qp.send_cq(), qp.recv_cq()) {
            if let Some(t) = &qp.recv_cq().tcp {
                t.register(fd, qp.qp_num());
            }
        }
        Conn {
            stream,
            fd,
            out: Vec::new(),
            out_pos: 0,
            ack: None,
            ack_held: false,
            ack_covers: 0,
            ack_held_since: Instant::now(),
            refs: Vec::new(),
            inb: vec![0; INB_START],
            in_len: 0,
            readable: true,
            closing: false,
            go_back: None,
            dead: false,
            lose_next: false,
            writes: 0,
            batch: DeliveryBatch::default(),
        }
    }

    fn flush(&mut self, keys: &mem::KeyTable) {
        self.frame();
        if !self.refs.is_empty() {
            self.flush_parts(keys);
            return;
        }
        while self.out_pos < self.out.len() {
            self.writes += 1;
            match self.stream.write(&self.out[self.out_pos..]) {
                Ok(0) => {
                    self.dead = true;
                    return;
                }
                Ok(n) => self.out_pos += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => {
                    self.dead = true;
                    return;
                }
            }
        }
        self.out.clear();
        self.out_pos = 0;
    }

    /// Write `out` with the payload spans of `refs` between its bytes, in one `sendmsg` where
    /// the socket takes it all; the rest is copied into `out` (refs empty after).
    fn flush_parts(&mut self, keys: &mem::KeyTable) {
        // One pin per key for the write, not per span: a pass's payloads mostly come from one
        // region (the target's data buffers). Dropped last: the spans borrow it.
        let pins = mem::PinCache::new(self.refs.len() > 1);
        let mut pinned: arrayvec::ArrayVec<mem::KeyRef<'_>, MAX_REFS> = arrayvec::ArrayVec::new();
        for r in &self.refs {
            match pins.lookup(keys, r.lkey, false, r.pd, r.addr, r.len, Access::empty()) {
                Ok(k) => pinned.push(k),
                Err(_) => {
                    // Checked when encoded, in this same call: only an MR deregistered
                    // meanwhile by another thread (while its WR was posted) gets here. Its
                    // bytes cannot be sent: the connection fails, as on a broken wire.
                    tracing::warn!("soft fabric: a posted payload's MR went away before its write");
                    self.dead = true;
                    self.refs.clear();
                    return;
                }
            }
        }
        let mut parts: arrayvec::ArrayVec<mem::Part<'_, '_>, { 2 * MAX_REFS + 1 }> =
            arrayvec::ArrayVec::new();
        let mut prev = self.out_pos;
        for (r, k) in self.refs.iter().zip(pinned.iter()) {
            if r.at > prev {
                parts.push(mem::Part::Bytes(&self.out[prev..r.at]));
                prev = r.at;
            }
            parts.push(mem::Part::Span(k));
        }
        if self.out.len() > prev {
            parts.push(mem::Part::Bytes(&self.out[prev..]));
        }
        let total =
            self.out.len() - self.out_pos + self.refs.iter().map(|r| r.len as usize).sum::<usize>();
        let mut done = 0;
        while done < total {
            self.writes += 1;
            match mem::send_parts(self.fd, &parts, done) {
                Ok(0) => {
                    self.dead = true;
                    break;
                }
                Ok(n) => done += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => {
                    self.dead = true;
                    break;
                }
            }
        }
        let mut rest = Vec::new();
        if done < total && !self.dead {
            // The socket is full: keep the rest as bytes (the spans are pinned only now).
            rest.reserve(total - done);
            mem::gather_parts(&parts, done, &mut rest);
        }
        drop(parts);
        drop(pinned);
        self.refs.clear();
        self.out_pos = 0;
        if rest.is_empty() {
            self.out.clear();
        } else {
            self.out = rest;
        }
    }

    /// Whether encoded frames (bytes or payload spans) wait to be written.
    fn frames_pending(&self) -> bool {
        self.out_pos < self.out.len() || !self.refs.is_empty()
    }

    /// Whether anything waits to be written (encoded or a pending ACK).
    fn output_pending(&self) -> bool {
        self.frames_pending() || self.ack.is_some()
    }

    /// The output buffer, to encode a frame other than an ACK into: the pending ACK goes first.
    fn frame(&mut self) -> &mut Vec<u8> {
        if let Some(seq) = self.ack.take() {
            self.ack_held = false;
            Hdr {
                ty: T_ACK,
                seq,
                ..Hdr::default()
            }
            .encode(&mut self.out);
        }
        &mut self.out
    }

    fn ctl(&mut self, ty: u8, seq: u64, code: u16, key: u32) {
        if ty == T_ACK {
            // Cumulative: a later ACK covers an earlier one (a duplicate's included).
            self.ack = Some(self.ack.map_or(seq, |a| a.max(seq)));
            return;
        }
        Hdr {
            ty,
            code,
            seq,
            key,
            ..Hdr::default()
        }
        .encode(self.frame());
    }
}

/// Close a QP's connection (reset, destroy, replacement). A held ACK leaves first: the
/// requests it acknowledges were executed. Requests not written yet are not (a replacement
/// connection re-sends them; a reset drops them).
pub(crate) fn close(qp: &QpShared, mut c: Conn) {
    if c.ack_held && !c.dead && !c.frames_pending() {
        c.flush(&qp.dev().keys);
    }
    if let Some(t) = &qp.send_cq().tcp {
        t.deregister(c.fd);
    }
    if let Some(t) = &qp.recv_cq().tcp {
        t.deregister(c.fd);
    }
    let _ = c.stream.shutdown(std::net::Shutdown::Both);
}

/// Fault: shut the QP's connection down; both sides see it drop.
pub(crate) fn drop_connection(qp: &Arc<QpShared>) -> Result<()> {
    let mut g = qp.lock();
    let Some(c) = g.conn.as_mut() else {
        return Err(TransportError::InvalidArgument(format!(
            "QP {:#x} has no connection",
            qp.qp_num()
        )));
    };
    let _ = c.stream.shutdown(std::net::Shutdown::Both);
    c.dead = true;
    lost(qp, &mut g);
    Ok(())
}

/// Fault: see `FaultInjector::lose_next_request`.
pub(crate) fn lose_next_request(qp: &Arc<QpShared>) -> Result<()> {
    let mut g = qp.lock();
    let Some(c) = g.conn.as_mut() else {
        return Err(TransportError::InvalidArgument(format!(
            "QP {:#x} has no connection",
            qp.qp_num()
        )));
    };
    c.lose_next = true;
    Ok(())
}

/// Fault: see `FaultInjector::reconnect`. Only the connecting side can open a new connection.
pub(crate) fn reconnect(qp: &Arc<QpShared>) -> Result<()> {
    let remote = qp.remote();
    let Some(remote) = remote else {
        return Err(TransportError::InvalidArgument(format!(
            "QP {:#x} is not connected",
            qp.qp_num()
        )));
    };
    let Some(ip) = remote.gid.to_ipv4() else {
        return Err(TransportError::Unsupported("a non-IPv4 soft peer"));
    };
    let me = (u32::from(qp.dev().ip()), qp.dev().lid(), qp.qp_num());
    if me > (u32::from(ip), remote.lid, remote.qp_num) {
        return Err(TransportError::InvalidArgument(format!(
            "QP {:#x} is the accepting side: reconnect its peer",
            qp.qp_num()
        )));
    }
    connect_qp(qp, ip, &remote)
}

/// The connection is gone: outstanding WRs fail as when retries are exhausted.
fn lost(qp: &QpShared, slow: &mut Slow) {
    if !slow.sq.is_empty() && qp.state() != QpState::Err {
        qp.fail_head(slow, WcStatus::RetryExcErr);
    }
}

/// Post one WR (under the QP lock). Its frame is encoded into the connection's output buffer;
/// it leaves with the next `flush_posted` (the end of the `post_send` list) or progress run, so
/// a list of WRs costs one write, not one per WR.
pub(crate) fn post(qp: &Arc<QpShared>, slow: &mut Slow, mut e: PooledEntry) {
    if slow.sq.is_empty() && super::qp::is_local(&e.op) {
        // Nothing before it: a local operation runs now, connection or not.
        match qp.execute_local(&e.op) {
            Ok(()) => qp.complete_send(e.seq, e.wr_id, &e.op, WcStatus::Success, 0, e.signaled),
            Err(status) => {
                qp.complete_send(e.seq, e.wr_id, &e.op, status, 0, true);
                qp.enter_err_locked(slow);
            }
        }
        e.local_done = true;
        slow.recycle(e);
        return;
    }
    e.wire_seq = slow.next_wire;
    if !super::qp::is_local(&e.op) {
        slow.next_wire += 1;
    }
    let dead = slow.conn.as_ref().is_some_and(|c| c.dead);
    slow.sq.push_back(e);
    if dead {
        qp.fail_head(slow, WcStatus::RetryExcErr);
        return;
    }
    if slow.sq.len() == 1 {
        slow.reset_budget(qp);
    }
    let Some(mut conn) = slow.conn.take() else {
        // The passive side before the peer's connection arrived: sent once it is attached.
        qp.send_cq().want_progress(qp);
        return;
    };
    if conn.go_back.is_none() {
        // Not just the new WR: earlier ones may still wait unsent (posted before the acceptor
        // attached the connection) and must go first.
        if let Err((i, status)) = transmit_pending(qp, &mut conn, &mut slow.sq) {
            fail_at(qp, slow, i, status);
        }
    }
    slow.conn = Some(conn);
    complete_local_heads(qp, slow);
}

/// The end of a `post_send` list (under the QP lock): write what its WRs encoded, in one
/// syscall. What the socket does not take now leaves on writable readiness (the CQ's poll).
pub(crate) fn flush_posted(qp: &Arc<QpShared>, slow: &mut Slow) {
    let Some(conn) = slow.conn.as_mut() else {
        return;
    };
    if !conn.output_pending() || conn.dead {
        return;
    }
    conn.flush(&qp.dev().keys);
    if conn.dead {
        // The write found the connection gone (e.g. refused): fail as when retries run out.
        lost(qp, slow);
    }
}

/// Local operations (window bind, local invalidation) at the head of the send queue that have
/// executed complete now: nothing remote acknowledges them.
pub(crate) fn complete_local_heads(qp: &QpShared, slow: &mut Slow) {
    while let Some(e) = slow.sq.front() {
        if !e.local_done || !super::qp::is_local(&e.op) {
            break;
        }
        let Some(e) = slow.sq.pop_front() else { break };
        qp.complete_send(e.seq, e.wr_id, &e.op, WcStatus::Success, 0, e.signaled);
        slow.recycle(e);
    }
}

/// Put the requests that are not on the wire yet onto it, oldest first. They always form the
/// tail of the send queue (posted while there was no connection, or rewound by a go-back), and
/// must leave in sequence order: the responder accepts only the next sequence and silently
/// drops any other, and a requester on a connected TCP fabric never times out, so a request
/// that overtook an unsent one would be lost for good. Err: the index that failed locally.
fn transmit_pending(
    qp: &QpShared,
    conn: &mut Conn,
    sq: &mut VecDeque<PooledEntry>,
) -> std::result::Result<(), (usize, WcStatus)> {
    let first = sq.iter().rposition(|e| e.sent).map_or(0, |i| i + 1);
    let is_read = |e: &SqEntry| matches!(e.op, SendOp::RdmaRead { .. });
    // READs on the wire, counted only when a READ is to go: every post comes here, and the
    // count walks the whole send queue.
    let mut reads: Option<usize> = None;
    let depth = usize::from(qp.read_depth());
    for i in first..sq.len() {
        if is_read(&sq[i]) {
            // Initiator depth: a READ past it waits (and all behind it) until a response
            // frees a slot; the READ_RESP handler's progress sends it then.
            let on_wire =
                reads.get_or_insert_with(|| sq.iter().take(i).filter(|e| is_read(e)).count());
            if *on_wire >= depth {
                break;
            }
            *on_wire += 1;
        }
        let e = &mut sq[i];
        transmit(qp, conn, e).map_err(|status| (i, status))?;
    }
    Ok(())
}

/// WR `i` of the send queue failed locally when it was reached: RC order says the ones before
/// it are reported first (flushed, as the QP goes to ERR), then it carries the error, then the
/// ERR transition flushes the rest.
fn fail_at(qp: &QpShared, slow: &mut Slow, i: usize, status: WcStatus) {
    for _ in 0..i {
        let Some(x) = slow.sq.pop_front() else { break };
        qp.complete_send(x.seq, x.wr_id, &x.op, WcStatus::WrFlushErr, 0, true);
        slow.recycle(x);
    }
    qp.fail_head(slow, status);
}

/// Encode a request frame for `e` into the connection's output buffer (or lose it, under the
/// `lose_next_request` fault).
fn transmit(qp: &QpShared, conn: &mut Conn, e: &mut SqEntry) -> std::result::Result<(), WcStatus> {
    conn.frame();
    let start = conn.out.len();
    encode_request(qp, conn, e)?;
    if conn.lose_next && conn.out.len() > start {
        conn.lose_next = false;
        conn.out.truncate(start);
        // A span at `start` is the previous frame's payload; later ones are this frame's.
        while conn.refs.last().is_some_and(|r| r.at > start) {
            conn.refs.pop();
        }
    }
    Ok(())
}

fn encode_request(
    qp: &QpShared,
    conn: &mut Conn,
    e: &mut SqEntry,
) -> std::result::Result<(), WcStatus> {
    let mut h = Hdr {
        seq: e.wire_seq,
        flags: if e.solicited { F_SOLICITED } else { 0 },
        ..Hdr::default()
    };
    let mut payload = true;
    match e.op {
        SendOp::Send => h.ty = T_SEND,
        SendOp::SendWithImm { imm } => (h.ty, h.imm) = (T_SEND_IMM, imm),
        SendOp::SendWithInv { rkey } => (h.ty, h.key) = (T_SEND_INV, rkey),
        SendOp::RdmaWrite { remote_addr, rkey } => {
            (h.ty, h.addr, h.key) = (T_WRITE, remote_addr, rkey)
        }
        SendOp::RdmaWriteWithImm {
            remote_addr,
            rkey,
            imm,
        } => (h.ty, h.addr, h.key, h.imm) = (T_WRITE_IMM, remote_addr, rkey, imm),
        SendOp::RdmaRead { remote_addr, rkey } => {
            // Validate the local sink now; it is checked again when the data comes back.
            let mut list = mem::SgList::new();
            mem::resolve_local_into(
                &mut list,
                &qp.dev().keys,
                qp.pd(),
                e.sges(),
                Access::LOCAL_WRITE,
            )
            .map_err(|_| WcStatus::LocProtErr)?;
            if list.total() > MAX_PAYLOAD as u64 {
                return Err(WcStatus::LocLenErr);
            }
            (h.ty, h.addr, h.key, h.imm) = (T_READ_REQ, remote_addr, rkey, list.total() as u32);
            payload = false;
        }
        SendOp::LocalInv { .. } | SendOp::BindMw { .. } => {
            // Executes here, in send-queue order; completes when it reaches the head.
            if !e.local_done {
                qp.execute_local(&e.op)?;
                e.local_done = true;
            }
            e.sent = true;
            return Ok(());
        }
    }
    if payload {
        let v = e.view();
        match v.data {
            super::inproc::Data::Bytes(b) => {
                h.len = b.len() as u32;
                h.encode(&mut conn.out);
                conn.out.extend_from_slice(b);
            }
            super::inproc::Data::Sges(sges) => {
                // Built in place: a list is a few hundred bytes, and a move copies them all.
                let mut list = mem::SgList::new();
                mem::resolve_local_into(&mut list, &qp.dev().keys, qp.pd(), sges, Access::empty())
                    .map_err(|_| WcStatus::LocProtErr)?;
                let n = list.total() as usize;
                if n > MAX_PAYLOAD {
                    return Err(WcStatus::LocLenErr);
                }
                h.len = n as u32;
                h.encode(&mut conn.out);
                let spans = sges.iter().filter(|s| s.length > 0).count();
                if n >= DIRECT_MIN && conn.refs.len() + spans <= MAX_REFS {
                    let at = conn.out.len();
                    let pd = qp.pd();
                    conn.refs
                        .extend(sges.iter().filter(|s| s.length > 0).map(|s| OutRef {
                            at,
                            lkey: s.lkey,
                            pd,
                            addr: s.addr,
                            len: u64::from(s.length),
                        }));
                } else {
                    let start = conn.out.len();
                    conn.out.resize(start + n, 0);
                    mem::gather(&list, &mut conn.out[start..]);
                }
            }
        }
    } else {
        h.encode(&mut conn.out);
    }
    e.sent = true;
    Ok(())
}

/// How long a passive-side QP waits for the peer's data connection before its WRs fail.
const CONNECT_WAIT: Duration = Duration::from_secs(5);
/// Longest a held ACK waits for the consumer to reap the completions it covers: as long as
/// the ACK timer lets a CQ nobody polls hold one (a consumer that keeps polling without
/// reaping them would otherwise hold it for good, and the requester's send completions).
const ACK_HOLD_MAX: Duration = ACCEPT_TICK;

/// Progress one TCP QP (under its lock). Returns whether it wants timer-driven progress.
pub(crate) fn progress(qp: &Arc<QpShared>, slow: &mut Slow, now: Instant) -> bool {
    let Some(mut conn) = slow.conn.take() else {
        // Passive side still waiting for the peer's data connection. Nothing was sent, so this
        // is not the RC retry budget (timeout x retry_cnt, a few ms): the peer is in RTR and the
        // device's acceptor hands the connection over when it gets to it. Only a peer that
        // never connects fails the WR, after CONNECT_WAIT.
        if slow.sq.is_empty() || qp.state() != QpState::Rts {
            slow.conn_wait_since = None;
            return false;
        }
        let since = *slow.conn_wait_since.get_or_insert(now);
        if now.duration_since(since) < CONNECT_WAIT {
            return true;
        }
        slow.conn_wait_since = None;
        qp.fail_head(slow, WcStatus::RetryExcErr);
        return false;
    };
    slow.conn_wait_since = None;
    if conn.dead {
        slow.conn = Some(conn);
        lost(qp, slow);
        return false;
    }
    if conn.out_pos < conn.out.len() {
        // Output the socket did not take earlier goes first.
        conn.flush(&qp.dev().keys);
    }
    let st = qp.state();
    let ack_before = conn.ack;
    if conn.readable && matches!(st, QpState::Rtr | QpState::Rts | QpState::Err) {
        // Read what is there, handle complete frames.
        loop {
            if conn.in_len == conn.inb.len() {
                // The buffer holds one partial frame: grow towards it, within the frame limit,
                // doubling as its bytes arrive rather than jumping to the length its header
                // claims, so a peer holds at most about twice what it sent of this side's memory
                // (a full read-ahead buffer of INB_MAX could otherwise claim MAX_PAYLOAD).
                let need =
                    Hdr::decode(&conn.inb[..conn.in_len]).map_or(HDR, |h| HDR + h.len as usize);
                if need > HDR + MAX_PAYLOAD {
                    tracing::warn!(
                        qp = qp.qp_num(),
                        need,
                        "soft fabric: oversized frame, dropping the connection"
                    );
                    conn.dead = true;
                    break;
                }
                let grown = (conn.inb.len() * 2).min(need.max(INB_MAX));
                conn.inb.resize(grown, 0);
            }
            let in_len = conn.in_len;
            let room = conn.inb.len() - in_len;
            let drained = match conn.stream.read(&mut conn.inb[in_len..]) {
                Ok(0) => {
                    conn.dead = true;
                    break;
                }
                Ok(n) => {
                    conn.in_len += n;
                    if n == room && conn.inb.len() < INB_MAX {
                        // More may wait: next time take it in one read.
                        let grown = (conn.inb.len() * 2).min(INB_MAX);
                        conn.inb.resize(grown, 0);
                    }
                    // A short read emptied the socket: what arrives later raises a new
                    // (edge-triggered) readiness event, so no read just to see WouldBlock.
                    // Unless the peer closed: then the next read returns the end.
                    n < room && !conn.closing
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    conn.readable = false;
                    break;
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(_) => {
                    conn.dead = true;
                    break;
                }
            };
            if !handle_frames(qp, slow, &mut conn) {
                conn.dead = true;
                break;
            }
            if drained {
                conn.readable = false;
                break;
            }
        }
    }
    // RNR timer expired: go back and re-send from the NAK'd request (the NAK marked it and
    // everything after it unsent).
    if let (Some(_), Some(at)) = (conn.go_back, slow.retry_at) {
        if now >= at && qp.state() == QpState::Rts {
            conn.go_back = None;
            slow.retry_at = None;
        }
    }
    // Requests not on the wire yet (posted before the connection was attached, or rewound).
    if conn.go_back.is_none() && qp.state() == QpState::Rts {
        if let Err((i, status)) = transmit_pending(qp, &mut conn, &mut slow.sq) {
            // E.g. the data's MR went away meanwhile: fail it in order.
            fail_at(qp, slow, i, status);
        }
    }
    if conn.ack != ack_before {
        // Requests read now: their receive completions (if any) are queued up to here.
        conn.ack_covers = qp.recv_cq().recv_queued_end();
    }
    // Only an ACK to send: it waits for the response the application posts after reaping
    // this run's completions (one write for both: at QD 1 a write of its own on each side of
    // every I/O), or goes alone on a later run (the CQ's polls: `want` below) once the
    // consumer has reaped those completions and not answered, or after ACK_HOLD_MAX (a
    // consumer that polls without reaping them). With the sends on another CQ, or the CQ armed
    // (its consumer waits for an event, not polling), the next run may be far off: then it
    // goes now.
    let only_ack = conn.ack.is_some() && !conn.frames_pending();
    let next_poll_near = Arc::ptr_eq(qp.send_cq(), qp.recv_cq()) && !qp.recv_cq().is_armed();
    let still_unreaped = || {
        !qp.recv_cq().recv_reaped(conn.ack_covers)
            && now.saturating_duration_since(conn.ack_held_since) < ACK_HOLD_MAX
    };
    if only_ack && next_poll_near && !conn.ack_held {
        conn.ack_held = true;
        conn.ack_held_since = now;
    } else if only_ack && next_poll_near && still_unreaped() {
        // Still held: the consumer has not reached the completions it would answer.
    } else {
        conn.flush(&qp.dev().keys);
    }
    let dead = conn.dead;
    let want = conn.go_back.is_some() || conn.output_pending();
    slow.conn = Some(conn);
    if dead {
        lost(qp, slow);
        return false;
    }
    want
}

/// Send the ACK the QP holds for a frame to ride on, if any (the CQ is armed, or the device's
/// ACK timer found the CQ unpolled).
pub(crate) fn send_held_ack(qp: &Arc<QpShared>) {
    let mut g = qp.lock();
    let Some(conn) = g.conn.as_mut() else {
        return;
    };
    if !conn.ack_held || conn.dead {
        return;
    }
    conn.flush(&qp.dev().keys);
    if conn.dead {
        lost(qp, &mut g);
    }
}

/// Handle every complete frame in the input buffer. False = protocol violation.
fn handle_frames(qp: &Arc<QpShared>, slow: &mut Slow, conn: &mut Conn) -> bool {
    let mut pos = 0;
    let inb = std::mem::take(&mut conn.inb);
    let ok = loop {
        let avail = &inb[pos..conn.in_len];
        let Some(h) = Hdr::decode(avail) else {
            break true;
        };
        let len = h.len as usize;
        if len > MAX_PAYLOAD {
            tracing::warn!(
                qp = qp.qp_num(),
                len,
                "soft fabric: oversized frame, dropping the connection"
            );
            break false;
        }
        if avail.len() < HDR + len {
            break true;
        }
        let payload = &avail[HDR..HDR + len];
        if !handle(qp, slow, conn, &h, payload) {
            break false;
        }
        pos += HDR + len;
    };
    conn.batch.finish(qp);
    conn.inb = inb;
    // Keep the unparsed tail at the front.
    conn.inb.copy_within(pos..conn.in_len, 0);
    conn.in_len -= pos;
    ok
}

fn handle(qp: &Arc<QpShared>, slow: &mut Slow, conn: &mut Conn, h: &Hdr, payload: &[u8]) -> bool {
    match h.ty {
        T_SEND | T_SEND_IMM | T_SEND_INV | T_WRITE | T_WRITE_IMM | T_READ_REQ => {
            respond(qp, slow, conn, h, payload);
            true
        }
        T_ACK => {
            while let Some(e) = slow.sq.front() {
                if e.wire_seq > h.seq || !e.sent || matches!(e.op, SendOp::RdmaRead { .. }) {
                    break;
                }
                let Some(e) = slow.sq.pop_front() else { break };
                let len = e.len() as u32;
                qp.complete_send(e.seq, e.wr_id, &e.op, WcStatus::Success, len, e.signaled);
                slow.recycle(e);
                slow.reset_budget(qp);
            }
            complete_local_heads(qp, slow);
            true
        }
        T_READ_RESP => {
            let Some(e) = slow.sq.front() else {
                return true;
            };
            if e.wire_seq != h.seq || !matches!(e.op, SendOp::RdmaRead { .. }) {
                return true;
            }
            let mut list = mem::SgList::new();
            let keys = &qp.dev().keys;
            match mem::resolve_local_into(&mut list, keys, qp.pd(), e.sges(), Access::LOCAL_WRITE) {
                Ok(()) if list.total() >= payload.len() as u64 => {
                    mem::scatter(&list, payload);
                }
                _ => {
                    qp.fail_head(slow, WcStatus::LocProtErr);
                    return true;
                }
            }
            if let Some(e) = slow.sq.pop_front() {
                qp.complete_send(
                    e.seq,
                    e.wr_id,
                    &e.op,
                    WcStatus::Success,
                    payload.len() as u32,
                    e.signaled,
                );
                slow.recycle(e);
                slow.reset_budget(qp);
            }
            complete_local_heads(qp, slow);
            true
        }
        T_NAK if h.code == NAK_SEQ => {
            // Re-send from the request the responder expects, unless an RNR timer already
            // governs the re-send.
            if conn.go_back.is_none() && qp.state() == QpState::Rts {
                for e in slow.sq.iter_mut().filter(|e| e.wire_seq >= h.seq) {
                    e.sent = false;
                }
                if let Err((i, status)) = transmit_pending(qp, conn, &mut slow.sq) {
                    fail_at(qp, slow, i, status);
                }
            }
            true
        }
        T_NAK => {
            // Local operations that executed ahead of the NAKed request are done.
            complete_local_heads(qp, slow);
            if slow.sq.front().is_none_or(|e| e.wire_seq != h.seq) || qp.state() == QpState::Err {
                return true;
            }
            let status = match h.code {
                NAK_RNR => match qp.stall_accounting(slow, true, h.key as u8, Instant::now()) {
                    Stall::Wait(t) => {
                        slow.retry_at = Some(t);
                        conn.go_back = Some(h.seq);
                        for e in slow.sq.iter_mut() {
                            e.sent = false;
                        }
                        qp.send_cq().want_progress(qp);
                        return true;
                    }
                    Stall::Fail(s) => s,
                },
                NAK_REM_ACCESS => WcStatus::RemAccessErr,
                NAK_REM_INV_REQ => WcStatus::RemInvReqErr,
                NAK_REM_OP => WcStatus::RemOpErr,
                _ => WcStatus::RetryExcErr,
            };
            qp.fail_head(slow, status);
            true
        }
        _ => false,
    }
}

/// Responder side of one request.
fn respond(qp: &Arc<QpShared>, slow: &mut Slow, conn: &mut Conn, h: &Hdr, payload: &[u8]) {
    if qp.state() == QpState::Err || !qp.is_live() {
        conn.ctl(T_NAK, h.seq, NAK_DEAD, 0);
        return;
    }
    if h.seq > slow.expect {
        // A request is missing (lost on a replaced connection, or dropped after an RNR NAK):
        // NAK the gap once (RC's sequence error NAK); the requester re-sends from there, or
        // after its RNR timer if it is waiting on one.
        if !slow.seq_nak_sent {
            slow.seq_nak_sent = true;
            conn.ctl(T_NAK, slow.expect, NAK_SEQ, 0);
        }
        return;
    }
    let duplicate = h.seq < slow.expect;
    if duplicate && h.ty != T_READ_REQ {
        // Executed already (its ACK was lost with a connection): acknowledge it again.
        conn.ctl(T_ACK, h.seq, 0, 0);
        return;
    }
    if !duplicate {
        slow.seq_nak_sent = false;
    }
    let access_violation = |slow: &mut Slow, conn: &mut Conn| {
        conn.ctl(T_NAK, h.seq, NAK_REM_ACCESS, 0);
        qp.dev().raise(AsyncEventKind::QpAccessErr {
            qp_num: qp.qp_num(),
        });
        qp.enter_err_locked(slow);
    };
    let remote_ok = |need: Access| qp.grants_remote(need);
    match h.ty {
        T_WRITE => {
            if !payload.is_empty() {
                if !remote_ok(Access::REMOTE_WRITE) {
                    return access_violation(slow, conn);
                }
                let Ok(r) = qp.dev().keys.lookup(
                    h.key,
                    true,
                    qp.pd(),
                    h.addr,
                    payload.len() as u64,
                    Access::REMOTE_WRITE,
                ) else {
                    return access_violation(slow, conn);
                };
                let mut dst = mem::SgList::new();
                dst.push(r);
                mem::scatter(&dst, payload);
            }
            slow.expect += 1;
            conn.ctl(T_ACK, h.seq, 0, 0);
        }
        T_READ_REQ => {
            let len = h.imm as usize;
            let mut resp = Hdr {
                ty: T_READ_RESP,
                seq: h.seq,
                len: h.imm,
                ..Hdr::default()
            };
            if len > 0 {
                if !remote_ok(Access::REMOTE_READ) {
                    return access_violation(slow, conn);
                }
                let Ok(r) = qp.dev().keys.lookup(
                    h.key,
                    true,
                    qp.pd(),
                    h.addr,
                    len as u64,
                    Access::REMOTE_READ,
                ) else {
                    return access_violation(slow, conn);
                };
                let mut src = mem::SgList::new();
                src.push(r);
                resp.encode(conn.frame());
                let start = conn.out.len();
                conn.out.resize(start + len, 0);
                mem::gather(&src, &mut conn.out[start..]);
            } else {
                resp.len = 0;
                resp.encode(conn.frame());
            }
            // A duplicate READ is answered again (from the memory as it is now), as in RC.
            if !duplicate {
                slow.expect += 1;
            }
        }
        _ => {
            conn.batch.begin(qp);
            deliver(qp, slow, conn, h, payload);
        }
    }
}

/// An incoming message that consumes a receive (counted as a delivery by the connection's
/// `batch`, which holds its successful completion).
fn deliver(qp: &Arc<QpShared>, slow: &mut Slow, conn: &mut Conn, h: &Hdr, payload: &[u8]) {
    if qp.state() == QpState::Err {
        conn.ctl(T_NAK, h.seq, NAK_DEAD, 0);
        return;
    }
    let write = h.ty == T_WRITE_IMM;
    // One list, built in place (a move copies its whole capacity): the WRITE's target, or the
    // receive's buffers.
    let mut dst = mem::SgList::new();
    if write && !payload.is_empty() {
        let ok = qp.grants_remote(Access::REMOTE_WRITE);
        match qp.dev().keys.lookup(
            h.key,
            true,
            qp.pd(),
            h.addr,
            payload.len() as u64,
            Access::REMOTE_WRITE,
        ) {
            Ok(r) if ok => dst.push(r),
            _ => {
                conn.ctl(T_NAK, h.seq, NAK_REM_ACCESS, 0);
                qp.dev().raise(AsyncEventKind::QpAccessErr {
                    qp_num: qp.qp_num(),
                });
                qp.enter_err_locked(slow);
                return;
            }
        }
    }
    let keys = &qp.dev().keys;
    let recv_pd = qp.recv_pd();
    let popped = qp.pop_recv_with(|wr_id, sges| {
        let resolved = write
            || mem::resolve_local_into(&mut dst, keys, recv_pd, sges, Access::LOCAL_WRITE).is_ok();
        (wr_id, resolved)
    });
    let Some((recv_wr_id, resolved)) = popped else {
        conn.ctl(T_NAK, h.seq, NAK_RNR, u32::from(qp.min_rnr_timer()));
        return;
    };
    let src_qp = qp.remote().map_or(0, |r| r.qp_num);
    let fail = |slow: &mut Slow, conn: &mut Conn, status, nak| {
        // The batch's earlier successes first: a receive queue's completions keep their order.
        conn.batch.queue(qp);
        qp.complete_recv(
            WorkCompletion {
                wr_id: recv_wr_id,
                status,
                opcode: WcOpcode::Recv,
                src_qp,
                ..Default::default()
            },
            false,
        );
        conn.ctl(T_NAK, h.seq, nak, 0);
        qp.enter_err_locked(slow);
    };
    if !resolved {
        return fail(slow, conn, WcStatus::LocProtErr, NAK_REM_OP);
    }
    if !write && payload.len() as u64 > dst.total() {
        return fail(slow, conn, WcStatus::LocLenErr, NAK_REM_INV_REQ);
    }
    let inv = (h.ty == T_SEND_INV).then_some(h.key);
    if let Some(rkey) = inv {
        if !qp.dev().keys.invalidate_rkey(rkey, qp.pd()) {
            return fail(slow, conn, WcStatus::RemInvReqErr, NAK_REM_OP);
        }
    }
    mem::scatter(&dst, payload);
    conn.batch.complete(
        qp,
        WorkCompletion {
            wr_id: recv_wr_id,
            status: WcStatus::Success,
            opcode: if write {
                WcOpcode::RecvRdmaWithImm
            } else {
                WcOpcode::Recv
            },
            byte_len: payload.len() as u32,
            src_qp,
            imm_data: matches!(h.ty, T_SEND_IMM | T_WRITE_IMM).then_some(h.imm),
            invalidated_rkey: inv,
            ..Default::default()
        },
        h.flags & F_SOLICITED != 0,
    );
    slow.expect += 1;
    conn.ctl(T_ACK, h.seq, 0, 0);
}

#[cfg(test)]
#[path = "tcp_tests.rs"]
mod tests;

#[cfg(any(test, feature = "fuzzing"))]
#[path = "tcp_fuzz.rs"]
pub(crate) mod fuzz;
