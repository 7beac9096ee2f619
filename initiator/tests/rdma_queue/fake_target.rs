//! A minimal NVMe-oF RDMA responder for testing the host glue without the real target: it
//! accepts one connection on the in-process soft fabric, and for each capsule (one at a time)
//! moves data the way a target does (keyed SGL: RDMA READ for writes, RDMA WRITE before the
//! response for reads; in-capsule data for small writes), then SENDs a CQE with the command's
//! CID. The "disk" is a byte array addressed by CDW10 (a byte offset here, not an LBA).

use std::collections::VecDeque;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nvmf_protocol::cm::{RdmaAccept, RdmaConnectRequest};
use nvmf_protocol::{Cqe, SglDescriptor, Sqe, Status};
use nvmf_transport::*;

pub const WRITE: u8 = 0x01;
pub const READ: u8 = 0x02;
pub const DISK: usize = 1 << 20;
const SLOTS: usize = 64;
const SLOT: usize = 64 + 4096;
const STAGING: usize = SLOTS * SLOT;
const STAGING_LEN: usize = 128 * 1024;
const RESPONSE: usize = STAGING + STAGING_LEN;

/// Give up waiting after this long (never reached when things work).
fn patience() -> Duration {
    Duration::from_secs(30)
}

pub struct FakeTarget {
    pub addr: SocketAddr,
    /// Set by the test: the target disconnects the connection.
    drop_now: Arc<AtomicBool>,
    /// Commands answered.
    pub answered: Arc<AtomicU32>,
    thread: Option<JoinHandle<()>>,
}

impl FakeTarget {
    /// Listens on a fresh in-process soft device; serves one connection.
    pub fn start() -> FakeTarget {
        FakeTarget::start_on(SoftFabric::InProcess)
    }

    /// As `start`, on a soft device of `fabric` (a host resolving to it shares its fabric).
    pub fn start_on(fabric: SoftFabric) -> FakeTarget {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let ip = Ipv4Addr::new(127, 0, 7, 2 + (n % 250) as u8);
        let addr = SocketAddr::new(IpAddr::V4(ip), 4420);
        let ctx = Context::open(&DeviceSpec::Soft(SoftConfig {
            name: format!("fake{}-{n}", std::process::id()),
            fabric,
            ip,
            ..SoftConfig::default()
        }))
        .expect("soft device");
        let ch = CmChannel::new(ProviderKind::Soft).expect("CM channel");
        let listener = ch.listen(addr, 8, 1).expect("listen");
        let drop_now = Arc::new(AtomicBool::new(false));
        let answered = Arc::new(AtomicU32::new(0));
        let (d, a) = (drop_now.clone(), answered.clone());
        let thread = std::thread::spawn(move || serve(ctx, ch, listener, d, a));
        FakeTarget {
            addr,
            drop_now,
            answered,
            thread: Some(thread),
        }
    }

    /// The target drops the connection (as a crash or a target-side disconnect would).
    pub fn disconnect(&self) {
        self.drop_now.store(true, Ordering::Relaxed);
    }
}

impl Drop for FakeTarget {
    fn drop(&mut self) {
        self.drop_now.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

struct Conn {
    id: CmId,
    qp: Qp,
    cq: Cq,
    mr: Mr,
    disk: Vec<u8>,
    qid: u16,
    sqhd: u16,
    depth: u16,
    /// Receive slots whose capsules wait their turn.
    pending: VecDeque<usize>,
}

fn serve(
    _ctx: Context,
    ch: CmChannel,
    _listener: CmId,
    drop_now: Arc<AtomicBool>,
    answered: Arc<AtomicU32>,
) {
    let deadline = Instant::now() + patience();
    let ev = loop {
        if drop_now.load(Ordering::Relaxed) || Instant::now() > deadline {
            return;
        }
        if let Ok(Some(ev)) = ch.poll_event() {
            break ev;
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    let CmEventKind::ConnectRequest { private_data, .. } = &ev.kind else {
        panic!("expected a connect request, got {:?}", ev.kind);
    };
    let request = RdmaConnectRequest::decode(private_data).expect("NVMe-oF private data");
    let mut id = ev.id.expect("a new id");
    let dev = id.context().expect("device");
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(1024, None).unwrap();
    let qp = id
        .create_qp(
            &pd,
            &QpInitAttr {
                send_cq: &cq,
                recv_cq: &cq,
                srq: None,
                caps: QpCaps {
                    max_send_wr: 256,
                    max_recv_wr: SLOTS as u32,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: 0,
                },
                sq_sig_all: true,
            },
        )
        .unwrap();
    let access = Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE;
    let mr = pd.alloc_mr(RESPONSE + 64, access).unwrap();
    let depth = request.hsqsize + 1;
    let mut conn = Conn {
        id,
        qp,
        cq,
        mr,
        disk: vec![0; DISK],
        qid: request.qid,
        sqhd: 0,
        depth,
        pending: VecDeque::new(),
    };
    for slot in 0..SLOTS {
        conn.post_recv(slot);
    }
    conn.id
        .accept(&ConnParam {
            private_data: RdmaAccept {
                recfmt: 0,
                crqsize: depth,
            }
            .to_bytes()
            .to_vec(),
            responder_resources: 0,
            initiator_depth: 16,
            retry_count: 7,
            rnr_retry_count: 7,
        })
        .expect("accept");
    while !drop_now.load(Ordering::Relaxed) {
        while let Ok(Some(ev)) = ch.poll_event() {
            if matches!(ev.kind, CmEventKind::Disconnected) {
                return;
            }
        }
        conn.reap(None);
        match conn.pending.pop_front() {
            Some(slot) => {
                if !conn.execute(slot) {
                    return;
                }
                answered.fetch_add(1, Ordering::Relaxed);
            }
            None => std::thread::yield_now(),
        }
    }
    let _ = conn.id.disconnect();
}

impl Conn {
    fn post_recv(&mut self, slot: usize) {
        let sge = self.mr.sge(slot * SLOT, SLOT as u32);
        self.qp
            .post_recv(&[RecvWr {
                wr_id: slot as u64,
                sges: &[sge],
            }])
            .expect("post recv");
    }

    /// Polls the CQ: capsules go to `pending`; returns the status of `wait_for` (a send wr_id)
    /// once it completes, or None.
    fn reap(&mut self, wait_for: Option<u64>) -> Option<WcStatus> {
        let mut wcs = [WorkCompletion::default(); 16];
        let n = self.cq.poll(&mut wcs).unwrap_or(0);
        let mut found = None;
        for w in &wcs[..n] {
            if w.wr_id < SLOTS as u64 {
                if w.status == WcStatus::Success {
                    self.pending.push_back(w.wr_id as usize);
                }
            } else if Some(w.wr_id) == wait_for {
                found = Some(w.status);
            }
        }
        found
    }

    fn post_and_wait(&mut self, wr_id: u64, op: SendOp, sge: Sge) -> bool {
        if self
            .qp
            .post_send(&[SendWr {
                wr_id,
                op,
                sges: &[sge],
                flags: SendFlags::SIGNALED,
            }])
            .is_err()
        {
            return false;
        }
        let deadline = Instant::now() + patience();
        loop {
            if let Some(status) = self.reap(Some(wr_id)) {
                return status == WcStatus::Success;
            }
            if Instant::now() > deadline {
                return false;
            }
            std::thread::yield_now();
        }
    }

    /// Runs the capsule in `slot`; false when the connection failed.
    fn execute(&mut self, slot: usize) -> bool {
        let mut capsule = vec![0u8; SLOT];
        self.mr.read_at(slot * SLOT, &mut capsule).unwrap();
        self.post_recv(slot);
        let sqe = Sqe::decode(&capsule[..64]).expect("an SQE");
        let offset = sqe.cdw10 as usize;
        let ok = match (sqe.opcode, sqe.sgl1()) {
            (
                WRITE,
                Ok(SglDescriptor::KeyedDataBlock {
                    address,
                    length,
                    key,
                    ..
                }),
            ) => {
                let len = length.get() as usize;
                let read = SendOp::RdmaRead {
                    remote_addr: address,
                    rkey: key,
                };
                let ok = self.post_and_wait(1000, read, self.mr.sge(STAGING, len as u32));
                self.mr
                    .read_at(STAGING, &mut self.disk[offset..offset + len])
                    .unwrap();
                ok
            }
            (WRITE, Ok(SglDescriptor::DataBlockOffset { offset: at, length })) => {
                let start = 64 + at as usize;
                self.disk[offset..offset + length as usize]
                    .copy_from_slice(&capsule[start..start + length as usize]);
                true
            }
            (
                READ,
                Ok(SglDescriptor::KeyedDataBlock {
                    address,
                    length,
                    key,
                    ..
                }),
            ) => {
                let len = length.get() as usize;
                self.mr
                    .write_at(STAGING, &self.disk[offset..offset + len])
                    .unwrap();
                let write = SendOp::RdmaWrite {
                    remote_addr: address,
                    rkey: key,
                };
                self.post_and_wait(1001, write, self.mr.sge(STAGING, len as u32))
            }
            _ => true,
        };
        if !ok {
            return false;
        }
        self.sqhd = (self.sqhd + 1) % self.depth;
        let cqe = Cqe {
            dw0: 0,
            dw1: 0,
            sqhd: self.sqhd,
            sqid: self.qid,
            cid: sqe.cid,
            status: Status::SUCCESS,
            phase: false,
        };
        self.mr.write_at(RESPONSE, &cqe.to_bytes()).unwrap();
        self.post_and_wait(1002, SendOp::Send, self.mr.sge(RESPONSE, 16))
    }
}
