//! A raw NVMe-oF host for the tests: one CM connection per queue with its own QP and CQ, a
//! registered region the target reads from and writes into (keyed SGLs), and commands run one
//! at a time (capsule SEND, response RECV).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use nvmf_protocol::cm::{RdmaAccept, RdmaConnectRequest};
use nvmf_protocol::{Cqe, SglDescriptor, Sqe};
use nvmf_transport::*;

/// Where the capsule is built in the host's region.
const CAPSULE_AT: usize = 0;
/// Where the response lands.
const RESPONSE_AT: usize = 16 * 1024;
/// Start of the data area keyed SGLs point into.
pub const DATA_AT: usize = 64 * 1024;
const REGION: usize = 4 << 20;

pub fn patience() -> Duration {
    Duration::from_secs(30)
}

/// Polls `done` until it holds, or panics naming `what`.
pub fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + patience();
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

pub struct HostQueue {
    ch: CmChannel,
    id: CmId,
    _ctx: Context,
    pd: Pd,
    /// Memory windows bound for invalidation tests (kept alive).
    windows: Vec<Mw>,
    /// The rkey the target invalidated with its last response (SEND_WITH_INV).
    pub last_invalidated: Option<u32>,
    cq: Cq,
    qp: Qp,
    mr: Mr,
    next_cid: u16,
    /// Commands sent by `send_tracked` (their response slot rotates).
    tracked: usize,
    /// The QP failed (a command got no answer).
    pub broken: bool,
}

impl HostQueue {
    /// Connects queue `qid` of depth `depth` to `addr`.
    pub fn connect(addr: SocketAddr, qid: u16, depth: u16) -> HostQueue {
        HostQueue::connect_reads(addr, qid, depth, 16)
    }

    /// Connects with `reads` as the RDMA READs this host answers at once (responder
    /// resources): the target's read depth on this queue is at most that.
    pub fn connect_reads(addr: SocketAddr, qid: u16, depth: u16, reads: u8) -> HostQueue {
        let ch = CmChannel::new(ProviderKind::Soft).expect("CM channel");
        let mut id = ch.resolve(addr, None, patience(), 9).expect("resolve");
        let ctx = id.context().expect("id bound to a device");
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(64, None).unwrap();
        let qp = id
            .create_qp(
                &pd,
                &QpInitAttr {
                    send_cq: &cq,
                    recv_cq: &cq,
                    srq: None,
                    caps: QpCaps {
                        max_send_wr: 16,
                        max_recv_wr: 16,
                        max_send_sge: 1,
                        max_recv_sge: 1,
                        max_inline_data: 0,
                    },
                    sq_sig_all: false,
                },
            )
            .expect("host QP");
        let access =
            Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE | Access::MW_BIND;
        let mr = pd.alloc_mr(REGION, access).unwrap();
        let private_data = RdmaConnectRequest {
            recfmt: 0,
            qid,
            hrqsize: depth,
            hsqsize: depth - 1,
            cntlid: 0xFFFF,
        }
        .to_bytes()
        .to_vec();
        id.connect(&ConnParam {
            private_data,
            responder_resources: reads,
            initiator_depth: 16,
            retry_count: 7,
            rnr_retry_count: 7,
        })
        .expect("connect");
        let ev = ch.wait_event(patience()).expect("an answer to the connect");
        match ev.kind {
            CmEventKind::Established { private_data } => {
                RdmaAccept::decode(&private_data).expect("accept private data");
            }
            other => panic!("connect refused: {other:?}"),
        }
        HostQueue {
            ch,
            id,
            _ctx: ctx,
            pd,
            windows: Vec::new(),
            last_invalidated: None,
            cq,
            qp,
            mr,
            next_cid: 1,
            tracked: 0,
            broken: false,
        }
    }

    /// A keyed SGL for `len` bytes at `offset` of the data area.
    pub fn keyed(&self, offset: usize, len: u32) -> SglDescriptor {
        self.keyed_with(offset, len, self.mr.rkey())
    }

    /// The same with any key (a wrong one, say).
    pub fn keyed_with(&self, offset: usize, len: u32, key: u32) -> SglDescriptor {
        let addr = self.mr.addr() + (DATA_AT + offset) as u64;
        SglDescriptor::keyed(addr, len, key, false).unwrap()
    }

    /// Binds a memory window over `len` bytes at `offset` of the data area (posted on this
    /// QP and waited for); returns a keyed SGL through it asking for invalidation.
    pub fn window(&mut self, offset: usize, len: u32) -> SglDescriptor {
        let mut mw = self.pd.alloc_mw().expect("memory window");
        let access = Access::REMOTE_READ | Access::REMOTE_WRITE;
        let op = mw
            .bind(&self.mr, DATA_AT + offset, len as usize, access)
            .expect("bind");
        self.qp
            .post_send(&[SendWr {
                wr_id: 3,
                op,
                sges: &[],
                flags: SendFlags::SIGNALED,
            }])
            .expect("post bind");
        let mut wcs = [WorkCompletion::default(); 4];
        let deadline = Instant::now() + patience();
        loop {
            let n = self.cq.poll(&mut wcs).unwrap();
            if let Some(w) = wcs[..n].iter().find(|w| w.wr_id == 3) {
                assert_eq!(w.status, WcStatus::Success, "bind");
                break;
            }
            assert!(Instant::now() < deadline, "no bind completion");
            std::thread::yield_now();
        }
        let rkey = mw.rkey();
        self.windows.push(mw);
        let addr = self.mr.addr() + (DATA_AT + offset) as u64;
        SglDescriptor::keyed(addr, len, rkey, true).unwrap()
    }

    pub fn rkey(&self) -> u32 {
        self.mr.rkey()
    }

    pub fn write_data(&self, offset: usize, bytes: &[u8]) {
        self.mr.write_at(DATA_AT + offset, bytes).unwrap();
    }

    pub fn read_data(&self, offset: usize, len: usize) -> Vec<u8> {
        self.mr
            .read_vec(DATA_AT + offset..DATA_AT + offset + len)
            .unwrap()
    }

    /// Runs up to 16 commands (no in-capsule data) at once; their responses by CID order of
    /// `sqes`. Panics if the connection fails.
    pub fn exec_many(&mut self, sqes: &[Sqe]) -> Vec<Cqe> {
        assert!(sqes.len() <= 16, "the host QP takes 16 at a time");
        let mut cids = Vec::new();
        for (i, sqe) in sqes.iter().enumerate() {
            let mut sqe = *sqe;
            sqe.cid = self.next_cid;
            self.next_cid = self.next_cid.wrapping_add(1);
            cids.push(sqe.cid);
            self.mr
                .write_at(CAPSULE_AT + i * 128, &sqe.to_bytes())
                .unwrap();
            let recv = self.mr.sge(RESPONSE_AT + i * 16, 16);
            self.qp
                .post_recv(&[RecvWr {
                    wr_id: 100 + i as u64,
                    sges: &[recv],
                }])
                .unwrap();
        }
        for i in 0..sqes.len() {
            let send = self.mr.sge(CAPSULE_AT + i * 128, 64);
            self.qp
                .post_send(&[SendWr {
                    wr_id: 200 + i as u64,
                    op: SendOp::Send,
                    sges: &[send],
                    flags: SendFlags::SIGNALED,
                }])
                .unwrap();
        }
        let (mut sent, mut answered) = (0, 0);
        let mut wcs = [WorkCompletion::default(); 16];
        let deadline = Instant::now() + patience();
        while sent < sqes.len() || answered < sqes.len() {
            let n = self.cq.poll(&mut wcs).unwrap();
            for w in &wcs[..n] {
                assert_eq!(w.status, WcStatus::Success, "{w:?}");
                if w.wr_id >= 200 {
                    sent += 1;
                } else {
                    answered += 1;
                }
            }
            assert!(
                Instant::now() < deadline,
                "{answered} of {} answered",
                sqes.len()
            );
            if n == 0 {
                std::thread::yield_now();
            }
        }
        let mut by_cid = Vec::new();
        for i in 0..sqes.len() {
            let mut response = [0u8; 16];
            self.mr
                .read_at(RESPONSE_AT + i * 16, &mut response)
                .unwrap();
            by_cid.push(Cqe::decode(&response).unwrap());
        }
        cids.iter()
            .map(|cid| {
                *by_cid
                    .iter()
                    .find(|c| c.cid == *cid)
                    .expect("a response for every command")
            })
            .collect()
    }

    /// Sends `sqe` (a response receive posted) without waiting for anything.
    pub fn send_only(&mut self, sqe: Sqe) {
        self.send_only_with(sqe, &[]);
    }

    /// As [`HostQueue::send_only`], with `in_capsule` data after the SQE.
    pub fn send_only_with(&mut self, sqe: Sqe, in_capsule: &[u8]) {
        self.post_answer_receive();
        self.send_capsule(sqe, in_capsule);
    }

    /// Sends `sqe` without a receive for its answer: a host slow to take it (the target's SEND
    /// meets RNR and retries) until [`HostQueue::take_held_answer`]. Returns the CID given.
    pub fn send_without_receive(&mut self, sqe: Sqe) -> u16 {
        self.send_capsule(sqe, &[])
    }

    /// The receive for one answer (`wr_id` 2, into the response slot).
    fn post_answer_receive(&mut self) {
        let recv = self.mr.sge(RESPONSE_AT, 16);
        self.qp
            .post_recv(&[RecvWr {
                wr_id: 2,
                sges: &[recv],
            }])
            .unwrap();
    }

    /// Gives `sqe` the next CID and sends it with `in_capsule` after it (`wr_id` 1); the CID.
    fn send_capsule(&mut self, mut sqe: Sqe, in_capsule: &[u8]) -> u16 {
        sqe.cid = self.next_cid;
        self.next_cid = self.next_cid.wrapping_add(1);
        self.mr.write_at(CAPSULE_AT, &sqe.to_bytes()).unwrap();
        self.mr.write_at(CAPSULE_AT + 64, in_capsule).unwrap();
        let send = self.mr.sge(CAPSULE_AT, 64 + in_capsule.len() as u32);
        self.qp
            .post_send(&[SendWr {
                wr_id: 1,
                op: SendOp::Send,
                sges: &[send],
                flags: SendFlags::SIGNALED,
            }])
            .unwrap();
        sqe.cid
    }

    /// Posts the receive an answer was held back for, and waits for the answer.
    pub fn take_held_answer(&mut self) -> Cqe {
        self.post_answer_receive();
        self.wait_response()
    }

    /// Sends `sqe` with a receive of its own for the answer (slot `n % 16` of the response
    /// area): several commands may be outstanding; [`HostQueue::collect`] gathers answers in
    /// any order. Returns the CID given.
    pub fn send_tracked(&mut self, sqe: Sqe) -> u16 {
        self.send_tracked_with(sqe, &[])
    }

    /// As [`HostQueue::send_tracked`], with up to 960 bytes of `in_capsule` data after the SQE
    /// (capsule slot `n % 16` is 1 KiB of the capsule area here).
    pub fn send_tracked_with(&mut self, mut sqe: Sqe, in_capsule: &[u8]) -> u16 {
        assert!(
            in_capsule.len() <= 960,
            "a tracked capsule holds 960 data bytes"
        );
        sqe.cid = self.next_cid;
        self.next_cid = self.next_cid.wrapping_add(1);
        let slot = self.tracked % 16;
        self.tracked = self.tracked.wrapping_add(1);
        let at = CAPSULE_AT + slot * 1024;
        self.mr.write_at(at, &sqe.to_bytes()).unwrap();
        self.mr.write_at(at + 64, in_capsule).unwrap();
        let recv = self.mr.sge(RESPONSE_AT + slot * 16, 16);
        self.qp
            .post_recv(&[RecvWr {
                wr_id: 100 + slot as u64,
                sges: &[recv],
            }])
            .unwrap();
        self.qp
            .post_send(&[SendWr {
                wr_id: 300,
                op: SendOp::Send,
                sges: &[self.mr.sge(at, 64 + in_capsule.len() as u32)],
                flags: SendFlags::SIGNALED,
            }])
            .unwrap();
        sqe.cid
    }

    /// Waits for `n` answers to commands sent by [`HostQueue::send_tracked`], in arrival order.
    pub fn collect(&mut self, n: usize) -> Vec<Cqe> {
        let mut out = Vec::new();
        let mut wcs = [WorkCompletion::default(); 8];
        let deadline = Instant::now() + patience();
        while out.len() < n {
            let got = self.cq.poll(&mut wcs).unwrap();
            for w in &wcs[..got] {
                assert_eq!(w.status, WcStatus::Success, "{w:?}");
                if (100..116).contains(&w.wr_id) {
                    let mut response = [0u8; 16];
                    let at = RESPONSE_AT + (w.wr_id - 100) as usize * 16;
                    self.mr.read_at(at, &mut response).unwrap();
                    out.push(Cqe::decode(&response).unwrap());
                }
            }
            assert!(Instant::now() < deadline, "{} of {n} answered", out.len());
            if got == 0 {
                std::thread::yield_now();
            }
        }
        out
    }

    /// The CID given to the last command sent.
    pub fn last_cid(&self) -> u16 {
        self.next_cid.wrapping_sub(1)
    }

    /// Polls the host CQ once (drives the soft TCP fabric on this side).
    pub fn poll_once(&mut self) {
        let mut wcs = [WorkCompletion::default(); 8];
        let _ = self.cq.poll(&mut wcs);
    }

    /// Waits for the response to a command sent by `send_only`.
    pub fn wait_response(&mut self) -> Cqe {
        let mut wcs = [WorkCompletion::default(); 8];
        let deadline = Instant::now() + patience();
        loop {
            let n = self.cq.poll(&mut wcs).unwrap();
            if let Some(w) = wcs[..n].iter().find(|w| w.wr_id == 2) {
                assert_eq!(w.status, WcStatus::Success, "response receive");
                break;
            }
            assert!(Instant::now() < deadline, "no response");
            std::thread::yield_now();
        }
        let mut response = [0u8; 16];
        self.mr.read_at(RESPONSE_AT, &mut response).unwrap();
        Cqe::decode(&response).unwrap()
    }

    /// Tears the connection down from the host side.
    pub fn disconnect(&mut self) {
        self.id.disconnect().expect("disconnect");
    }

    /// Runs `sqe` (its CID set here) with `in_capsule` data after it; the response, or None
    /// when the connection failed instead of answering.
    pub fn exec(&mut self, mut sqe: Sqe, in_capsule: &[u8]) -> Option<Cqe> {
        sqe.cid = self.next_cid;
        self.next_cid = self.next_cid.wrapping_add(1);
        self.mr.write_at(CAPSULE_AT, &sqe.to_bytes()).unwrap();
        self.mr.write_at(CAPSULE_AT + 64, in_capsule).unwrap();
        let recv = self.mr.sge(RESPONSE_AT, 16);
        let send = self.mr.sge(CAPSULE_AT, 64 + in_capsule.len() as u32);
        self.qp
            .post_recv(&[RecvWr {
                wr_id: 2,
                sges: &[recv],
            }])
            .ok()?;
        self.qp
            .post_send(&[SendWr {
                wr_id: 1,
                op: SendOp::Send,
                sges: &[send],
                flags: SendFlags::SIGNALED,
            }])
            .ok()?;
        let mut sent = None;
        let mut answered = None;
        let deadline = Instant::now() + patience();
        let mut wcs = [WorkCompletion::default(); 8];
        // The response is what completes a command; the SEND's own completion may be flushed
        // when the target drops the connection right after answering (Disconnect).
        while answered.is_none() || (sent.is_none() && !self.broken) {
            // Polling the host CQ also drives the soft TCP fabric on this side.
            let n = self.cq.poll(&mut wcs).unwrap();
            for w in &wcs[..n] {
                match w.wr_id {
                    1 => sent = Some(w.status),
                    _ => {
                        answered = Some(w.status);
                        self.last_invalidated = w.invalidated_rkey;
                    }
                }
                if w.status != WcStatus::Success {
                    self.broken = true;
                }
            }
            if answered.is_some_and(|s| s != WcStatus::Success) {
                return None;
            }
            if self.broken && answered.is_none() {
                return None;
            }
            if n == 0 {
                if Instant::now() >= deadline {
                    self.broken = true;
                    return None;
                }
                std::thread::yield_now();
            }
        }
        let mut response = [0u8; 16];
        self.mr.read_at(RESPONSE_AT, &mut response).unwrap();
        let cqe = Cqe::decode(&response).unwrap();
        assert_eq!(cqe.cid, sqe.cid, "the response answers the command");
        Some(cqe)
    }

    /// Waits until the target disconnects this connection (CM DISCONNECTED).
    pub fn wait_disconnected(&mut self) {
        let deadline = Instant::now() + patience();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let ev = self
                .ch
                .wait_event(left)
                .expect("the target never dropped the qpair");
            if matches!(ev.kind, CmEventKind::Disconnected) {
                self.broken = true;
                return;
            }
        }
    }
}
