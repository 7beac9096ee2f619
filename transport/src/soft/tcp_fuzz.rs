//! The soft TCP fabric's frame handling under a fuzzer (`soft::fuzzing::tcp_stream`, the
//! `fuzz_soft_tcp` target): what a buggy or hostile peer's stream may do to the QP reading it.
//!
//! A QP pair on two TCP devices exchanges a SEND each way (both ends of the data connection
//! attached), then the victim (`b`) posts two receives and two requests of its own that its
//! peer never answers (an RDMA READ and a SEND), so requests, responses and NAKs in the stream
//! all meet real state. The frames a fuzz input describes are written into the connection from
//! the peer's end, bypassing the peer's QP, and the stream is closed. Once the victim has read
//! to the end (or dropped the connection at a violation) the run checks: no panic; the
//! victim's memory changed only where its peer may write (its posted receives, its READ's
//! destination, and RDMA WRITEs carrying its real rkey that lie wholly inside its region);
//! completions only of its own work requests; its QP in RTS or ERR; and the stream read to its
//! end within 10 s (a hang fails too).
//!
//! Input: frames, each a control byte, a 32-byte header as on the wire, then its payload; what
//! is left at the end (under a control byte and a header) goes out raw, a cut frame. Control
//! bits steer the header past the checks a random one would rarely pass:
//! - 0: the sequence the victim expects next (requests) or one of its own requests' (0-3: the
//!   exchange's SEND, the READ, the SEND) for responses; clear: the header's sequence mod 8
//!   unless bit 4 is set, which keeps it whole;
//! - 1: the address inside the victim's region or up to 64 bytes either side of it;
//! - 2: the victim's real rkey (clear: any other key);
//! - 3: the header's payload length kept as it is (clear: the length mod 129, the payload
//!   taken from the input), so a frame may claim more bytes than follow it.

use std::io::Write;
use std::net::Shutdown;
use std::ops::Range;
use std::time::{Duration, Instant};

use super::{HDR, Hdr, T_READ_REQ, T_SEND, T_WRITE, T_WRITE_IMM};
use crate::provider::*;
use crate::soft::testutil::{Net, Opts, Side, connect, device, send_wr, side};
use crate::soft::{SoftContext, SoftFabric};
use crate::types::*;

const SEQ_STEERED: u8 = 1;
const ADDR_NEAR: u8 = 1 << 1;
const REAL_KEY: u8 = 1 << 2;
const RAW_LEN: u8 = 1 << 3;
const SEQ_WHOLE: u8 = 1 << 4;

/// The victim's posted receives (two of `RECV_LEN`) and its READ's destination.
const RECV_AT: usize = 2048;
const RECV_LEN: usize = 256;
const READ_AT: usize = 3072;
const READ_LEN: usize = 64;
/// The victim's work requests: receives, then the READ and the SEND it posts.
const RECV_IDS: [u64; 2] = [100, 101];
const READ_ID: u64 = 200;
const SEND_ID: u64 = 201;

thread_local! {
    /// Devices live across inputs (each input connects a fresh QP pair on them): opening two
    /// TCP devices per input would spend the run on listeners and acceptor threads.
    static DEVICES: (SoftContext, SoftContext) =
        (device(SoftFabric::Tcp, true), device(SoftFabric::Tcp, true));
}

/// Run one input; panics when the victim breaks one of the module's rules.
pub fn hostile_stream(data: &[u8]) {
    let seen = DEVICES.with(|(peer, victim)| run(peer, victim, data));
    seen.check();
}

/// What one input did to the victim.
struct Seen {
    /// Offsets in the victim's region whose byte changed.
    changed: Vec<usize>,
    /// Where the peer may write in that region.
    writable: Vec<Range<usize>>,
    completions: Vec<WorkCompletion>,
    state: QpState,
}

impl Seen {
    fn check(&self) {
        for &i in &self.changed {
            assert!(
                self.writable.iter().any(|r| r.contains(&i)),
                "byte {i} of the victim's region changed; the peer may write {:?}",
                self.writable
            );
        }
        let own = [RECV_IDS[0], RECV_IDS[1], READ_ID, SEND_ID];
        for wc in &self.completions {
            assert!(
                own.contains(&wc.wr_id),
                "a completion of no work request of the victim's: {wc:?}"
            );
        }
        assert!(
            matches!(self.state, QpState::Rts | QpState::Err),
            "victim's QP in {:?}",
            self.state
        );
    }
}

fn run(peer_dev: &SoftContext, victim_dev: &SoftContext, data: &[u8]) -> Seen {
    let o = Opts::default();
    let mut a = side(peer_dev, &o);
    let mut b = side(victim_dev, &o);
    connect(&mut a.qp, &mut b.qp, &o);
    exchange(&mut a, &mut b);

    let len = b.mr.len();
    let before: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
    b.mr.write_at(0, &before).unwrap();
    for (i, wr_id) in RECV_IDS.into_iter().enumerate() {
        let at = RECV_AT + i * RECV_LEN;
        b.qp.post_recv(&[RecvWr {
            wr_id,
            sges: &[b.mr.sge(at, RECV_LEN as u32)],
        }])
        .unwrap();
    }
    let read = SendOp::RdmaRead {
        remote_addr: a.mr.addr(),
        rkey: a.mr.rkey(),
    };
    let read_into = [b.mr.sge(READ_AT, READ_LEN as u32)];
    let send_from = [b.mr.sge(0, 16)];
    b.qp.post_send(&[
        send_wr(READ_ID, read, &read_into, SendFlags::SIGNALED),
        send_wr(SEND_ID, SendOp::Send, &send_from, SendFlags::SIGNALED),
    ])
    .unwrap();

    let mut writable = vec![RECV_AT..RECV_AT + 2 * RECV_LEN, READ_AT..READ_AT + READ_LEN];
    let stream = frames(data, &b, &mut writable);
    {
        let guard = a.qp.sh.lock();
        let conn = &guard
            .conn
            .as_ref()
            .expect("the peer's data connection")
            .stream;
        let mut out = conn;
        let mut written = 0;
        while written < stream.len() {
            match out.write(&stream[written..]) {
                Ok(n) => written += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::thread::yield_now(),
                Err(e) => panic!("writing the peer's end: {e}"),
            }
        }
        conn.shutdown(Shutdown::Write)
            .expect("closing the peer's end");
    }

    let victim = Net::new(&[&b.cq]);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        victim.pump();
        if b.qp.sh.lock().conn.as_ref().is_none_or(|c| c.dead) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the victim did not read its stream to the end in 10 s"
        );
        std::thread::yield_now();
    }
    // Completions the last run queued.
    victim.pump();
    let completions = victim.settle(&b.cq, Duration::ZERO);
    let after = b.mr.read_vec(0..len).unwrap();
    Seen {
        changed: (0..len).filter(|&i| before[i] != after[i]).collect(),
        writable,
        completions,
        state: b.qp.state(),
    }
}

/// A SEND each way, so both ends of the data connection are attached; the victim (`b`) then
/// expects request 1 and has sent request 0.
fn exchange(a: &mut Side, b: &mut Side) {
    let net = Net::new(&[&a.cq, &b.cq]);
    one_send(a, b, &net);
    one_send(b, a, &net);
}

fn one_send(from: &mut Side, to: &mut Side, net: &Net) {
    to.qp
        .post_recv(&[RecvWr {
            wr_id: 1,
            sges: &[to.mr.sge(0, 8)],
        }])
        .unwrap();
    from.qp
        .post_send(&[send_wr(
            1,
            SendOp::Send,
            &[from.mr.sge(0, 8)],
            SendFlags::SIGNALED,
        )])
        .unwrap();
    for side in [&*from, &*to] {
        let c = net.wait(&side.cq, 1);
        assert_eq!(c[0].status, WcStatus::Success, "exchange: {c:?}");
    }
}

/// The bytes `data` describes (module doc), aimed at `victim`; each RDMA WRITE carrying the
/// victim's rkey wholly inside its region adds its range to `writable`.
fn frames(data: &[u8], victim: &Side, writable: &mut Vec<Range<usize>>) -> Vec<u8> {
    let region = victim.mr.addr();
    let len = victim.mr.len() as u64;
    let mut out = Vec::new();
    let mut next_request = 1u64;
    let mut rest = data;
    while rest.len() > HDR {
        let control = rest[0];
        let Some(mut h) = Hdr::decode(&rest[1..]) else {
            break;
        };
        rest = &rest[1 + HDR..];
        let is_request = (T_SEND..=T_READ_REQ).contains(&h.ty);
        if control & SEQ_STEERED != 0 {
            if is_request {
                h.seq = next_request;
                next_request += 1;
            } else {
                h.seq %= 4;
            }
        } else if control & SEQ_WHOLE == 0 {
            h.seq %= 8;
        }
        if control & ADDR_NEAR != 0 {
            h.addr = region.wrapping_sub(64).wrapping_add(h.addr % (len + 128));
        }
        if control & REAL_KEY != 0 {
            h.key = victim.mr.rkey();
        } else if h.key == victim.mr.rkey() {
            h.key ^= 1;
        }
        let payload_len = if control & RAW_LEN != 0 {
            (h.len as usize).min(rest.len())
        } else {
            let n = (h.len as usize % 129).min(rest.len());
            h.len = n as u32;
            n
        };
        let (payload, tail) = rest.split_at(payload_len);
        rest = tail;
        if matches!(h.ty, T_WRITE | T_WRITE_IMM) && h.key == victim.mr.rkey() {
            let start = h.addr.wrapping_sub(region);
            if start <= len && u64::from(h.len) <= len - start {
                let start = start as usize;
                writable.push(start..start + h.len as usize);
            }
        }
        h.encode(&mut out);
        out.extend_from_slice(payload);
    }
    out.extend_from_slice(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One frame as the input encodes it.
    fn input(control: u8, h: Hdr, payload: &[u8]) -> Vec<u8> {
        let mut b = vec![control];
        h.encode(&mut b);
        b.extend_from_slice(payload);
        b
    }

    fn seen(data: &[u8]) -> Seen {
        DEVICES.with(|(peer, victim)| run(peer, victim, data))
    }

    fn write_at(offset: u64, len: u32) -> Hdr {
        Hdr {
            ty: T_WRITE,
            len,
            addr: offset + 64,
            ..Hdr::default()
        }
    }

    #[test]
    fn an_empty_stream_changes_nothing() {
        let s = seen(&[]);
        s.check();
        assert!(s.changed.is_empty(), "{:?}", s.changed);
    }

    /// The harness reaches the victim: a WRITE with its key lands, and the check would catch
    /// it where the peer may not write.
    #[test]
    fn a_keyed_write_lands_and_is_allowed_only_inside_the_region() {
        let control = SEQ_STEERED | ADDR_NEAR | REAL_KEY;
        let s = seen(&input(control, write_at(100, 16), &[0xEE; 16]));
        s.check();
        assert!(!s.changed.is_empty() && s.changed.iter().all(|i| (100..116).contains(i)));
        let mut stripped = s;
        stripped.writable.pop();
        let caught = std::panic::catch_unwind(|| stripped.check());
        assert!(
            caught.is_err(),
            "a change outside what the peer may write passed"
        );
    }

    #[test]
    fn unkeyed_and_straddling_writes_change_nothing() {
        let unkeyed = input(SEQ_STEERED | ADDR_NEAR, write_at(100, 16), &[0xEE; 16]);
        // With the real key but running past the region's end (4096 bytes).
        let straddling = input(
            SEQ_STEERED | ADDR_NEAR | REAL_KEY,
            write_at(4096 - 8, 16),
            &[0xEE; 16],
        );
        for data in [unkeyed, straddling] {
            let s = seen(&data);
            s.check();
            assert!(s.changed.is_empty(), "{:?}", s.changed);
            assert_eq!(s.state, QpState::Err, "a refused WRITE is a fatal error");
        }
    }

    /// A READ response to the victim's own READ lands in its destination; the READ completes.
    #[test]
    fn a_read_response_fills_the_victims_read() {
        let h = Hdr {
            ty: super::super::T_READ_RESP,
            seq: 1,
            len: READ_LEN as u32,
            ..Hdr::default()
        };
        // 0 is no byte of the region's fill pattern there, so every byte shows as changed.
        let s = seen(&input(SEQ_WHOLE, h, &[0; READ_LEN]));
        s.check();
        assert_eq!(s.changed.len(), READ_LEN, "{:?}", s.completions);
        assert!(
            s.completions
                .iter()
                .any(|c| c.wr_id == READ_ID && c.status == WcStatus::Success),
            "{:?}",
            s.completions
        );
    }

    #[test]
    fn a_cut_frame_and_garbage_end_the_stream() {
        let mut data = input(SEQ_STEERED, write_at(0, 16), &[1; 16]);
        data.extend([0xFF; 20]);
        hostile_stream(&data);
        hostile_stream(&[0x5A; 300]);
    }
}
