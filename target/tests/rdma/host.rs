//! The host side of the tests: a CM connection with NVMe-oF connect private data, a plain QP on
//! its own CQ, and capsule round trips (a 64-byte capsule out, the 16-byte answer back).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use nvmf_protocol::cm::{RdmaAccept, RdmaConnectRequest, RdmaReject};
use nvmf_transport::*;

pub fn patience() -> Duration {
    Duration::from_secs(30)
}

/// Polls `done` until it holds, or panics naming `what` after `patience()`.
pub fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + patience();
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

pub fn request(qid: u16, hrqsize: u16, hsqsize: u16) -> Vec<u8> {
    RdmaConnectRequest {
        recfmt: 0,
        qid,
        hrqsize,
        hsqsize,
        cntlid: 0xFFFF,
    }
    .to_bytes()
    .to_vec()
}

pub struct Host {
    pub ch: CmChannel,
    pub id: CmId,
    _ctx: Context,
    _pd: Pd,
    pub cq: Cq,
    pub qp: Qp,
    mr: Mr,
    /// CRQSIZE of the accept.
    pub crqsize: u16,
}

/// How a connect ended when it was not accepted.
#[derive(Debug)]
pub enum Refused {
    Rejected(Option<RdmaReject>),
    Other(#[allow(dead_code)] CmEventKind),
}

impl Host {
    /// Connects to `addr` with `private_data`, offering `ird` incoming RDMA READs.
    pub fn connect(addr: SocketAddr, private_data: Vec<u8>, ird: u8) -> Result<Host, Refused> {
        let ch = CmChannel::new(ProviderKind::Soft).expect("CM channel");
        let mut id = ch.resolve(addr, None, patience(), 7).expect("resolve");
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
        let access = Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE;
        let mr = pd.alloc_mr(4096, access).unwrap();
        id.connect(&ConnParam {
            private_data,
            responder_resources: ird,
            initiator_depth: 0,
            retry_count: 7,
            rnr_retry_count: 7,
        })
        .expect("connect");
        let ev = ch.wait_event(patience()).expect("an answer to the connect");
        match ev.kind {
            CmEventKind::Established { private_data } => {
                let crqsize = RdmaAccept::decode(&private_data)
                    .expect("accept private data")
                    .crqsize;
                Ok(Host {
                    ch,
                    id,
                    _ctx: ctx,
                    _pd: pd,
                    cq,
                    qp,
                    mr,
                    crqsize,
                })
            }
            CmEventKind::Rejected { private_data, .. } => {
                Err(Refused::Rejected(RdmaReject::decode(&private_data).ok()))
            }
            other => Err(Refused::Other(other)),
        }
    }

    /// Sends one capsule carrying `host` and waits for its answer. False if either failed.
    pub fn round_trip(&mut self, host: u32) -> bool {
        let mut capsule = [0u8; 64];
        capsule[..4].copy_from_slice(&host.to_le_bytes());
        self.mr.write_at(0, &capsule).unwrap();
        let recv = self.mr.sge(1024, 64);
        let send = self.mr.sge(0, 64);
        if self
            .qp
            .post_recv(&[RecvWr {
                wr_id: 2,
                sges: &[recv],
            }])
            .is_err()
        {
            return false;
        }
        if self
            .qp
            .post_send(&[SendWr {
                wr_id: 1,
                op: SendOp::Send,
                sges: &[send],
                flags: SendFlags::SIGNALED,
            }])
            .is_err()
        {
            return false;
        }
        let (mut sent, mut answered) = (None, None);
        let deadline = Instant::now() + patience();
        let mut wcs = [WorkCompletion::default(); 8];
        while sent.is_none() || answered.is_none() {
            // Polling the host CQ also drives the soft TCP fabric on this side.
            let n = self.cq.poll(&mut wcs).unwrap();
            for w in &wcs[..n] {
                match w.wr_id {
                    1 => sent = Some(w.status),
                    _ => answered = Some((w.status, w.byte_len)),
                }
            }
            if sent.is_some_and(|s| s != WcStatus::Success)
                || answered.is_some_and(|(s, _)| s != WcStatus::Success)
            {
                return false;
            }
            if n == 0 {
                assert!(Instant::now() < deadline, "no answer to a capsule");
                std::thread::yield_now();
            }
        }
        let mut response = [0u8; 16];
        self.mr.read_at(1024, &mut response).unwrap();
        answered == Some((WcStatus::Success, 16)) && response == [0x5a; 16]
    }

    /// Disconnects from the target (its side sees DISCONNECTED).
    pub fn disconnect(&mut self) {
        self.id.disconnect().expect("disconnect");
    }

    /// Waits for a CM event on this host's channel matching `want`.
    pub fn wait_cm(&self, what: &str, want: impl Fn(&CmEventKind) -> bool) {
        let deadline = Instant::now() + patience();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let ev = self
                .ch
                .wait_event(left)
                .unwrap_or_else(|e| panic!("waiting for {what}: {e}"));
            if want(&ev.kind) {
                return;
            }
        }
    }
}
