//! Test helpers: unique devices per test, connected QP pairs on a given fabric, and a poller
//! that drives every CQ of a test (TCP progress needs both sides polled) while collecting the
//! completions of each.

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use super::*;
use crate::provider::*;

static NEXT: AtomicU32 = AtomicU32::new(1);

/// A fresh device with its own name and loopback IP (127.1.x.y).
pub(crate) fn device(fabric: SoftFabric, last_wqe_reached: bool) -> SoftContext {
    device_with(fabric, |c| c.last_wqe_reached = last_wqe_reached)
}

pub(crate) fn device_with(fabric: SoftFabric, f: impl FnOnce(&mut SoftConfig)) -> SoftContext {
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let mut cfg = SoftConfig {
        name: format!("t{n}-{fabric:?}"),
        fabric,
        ip: Ipv4Addr::new(127, 1, (n >> 8) as u8, n as u8),
        ..SoftConfig::default()
    };
    f(&mut cfg);
    Soft::open(&cfg).expect("open soft device")
}

pub(crate) const ALL: Access = Access::LOCAL_WRITE
    .union(Access::REMOTE_WRITE)
    .union(Access::REMOTE_READ);

/// One side of a connection.
pub(crate) struct Side {
    pub(crate) ctx: SoftContext,
    pub(crate) pd: SoftPd,
    pub(crate) cq: SoftCq,
    pub(crate) srq: Option<SoftSrq>,
    pub(crate) qp: SoftQp,
    pub(crate) mr: SoftMr,
}

#[derive(Clone, Copy)]
pub(crate) struct Opts {
    pub(crate) send_wr: u32,
    pub(crate) recv_wr: u32,
    pub(crate) srq: bool,
    pub(crate) rnr_retry: u8,
    pub(crate) min_rnr_timer: u8,
    pub(crate) last_wqe: bool,
    pub(crate) mr_len: usize,
    pub(crate) cq_depth: u32,
    /// RDMA READs a QP may have outstanding as requester (and accept as responder).
    pub(crate) read_depth: u8,
}

impl Default for Opts {
    fn default() -> Self {
        Opts {
            send_wr: 64,
            recv_wr: 64,
            srq: false,
            rnr_retry: 7,
            min_rnr_timer: 1,
            last_wqe: true,
            mr_len: 4096,
            cq_depth: 1024,
            read_depth: 16,
        }
    }
}

pub(crate) fn caps(o: &Opts) -> QpCaps {
    QpCaps {
        max_send_wr: o.send_wr,
        max_recv_wr: o.recv_wr,
        max_send_sge: 4,
        max_recv_sge: 4,
        max_inline_data: 128,
    }
}

pub(crate) fn side(ctx: &SoftContext, o: &Opts) -> Side {
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(o.cq_depth, None).unwrap();
    let srq = o.srq.then(|| {
        pd.create_srq(&SrqInit {
            max_wr: o.recv_wr,
            max_sge: 4,
            limit: 0,
        })
        .unwrap()
    });
    let qp = pd
        .create_qp(&QpInit {
            send_cq: &cq,
            recv_cq: &cq,
            srq: srq.as_ref(),
            caps: caps(o),
            sq_sig_all: false,
        })
        .unwrap();
    let mr = pd.alloc_mr(o.mr_len, ALL).unwrap();
    Side {
        ctx: ctx.clone(),
        pd,
        cq,
        srq,
        qp,
        mr,
    }
}

/// A QP of `pd` whose sends and receives complete on `cq`, no SRQ, `o`'s capacities.
pub(crate) fn qp_on(pd: &SoftPd, cq: &SoftCq, o: &Opts, sq_sig_all: bool) -> SoftQp {
    pd.create_qp(&QpInit {
        send_cq: cq,
        recv_cq: cq,
        srq: None,
        caps: caps(o),
        sq_sig_all,
    })
    .unwrap()
}

/// Bring `a` and `b` to RTS against each other (pingpong-style endpoint exchange).
pub(crate) fn connect(a: &mut SoftQp, b: &mut SoftQp, o: &Opts) {
    // Distinct PSNs: on TCP a HELLO must carry the PSN its target published.
    let ea = a.endpoint(1, 0, 0x0a11ce).unwrap();
    let eb = b.endpoint(1, 0, 0x0b0b00).unwrap();
    for (qp, remote) in [(&mut *a, eb), (&mut *b, ea)] {
        qp.modify_to_init(1, ALL).unwrap();
        qp.modify_to_rtr(&RtrAttr {
            remote,
            port_num: 1,
            sgid_index: 0,
            path_mtu: Mtu::Mtu4096,
            max_dest_rd_atomic: o.read_depth,
            min_rnr_timer: o.min_rnr_timer,
        })
        .unwrap();
    }
    for qp in [a, b] {
        qp.modify_to_rts(&RtsAttr {
            sq_psn: 0,
            timeout: 10,
            retry_cnt: 7,
            rnr_retry: o.rnr_retry,
            max_rd_atomic: o.read_depth,
        })
        .unwrap();
    }
}

/// A connected pair on two devices of `fabric`.
pub(crate) fn pair(fabric: SoftFabric, o: &Opts) -> (Side, Side) {
    let da = device(fabric, o.last_wqe);
    let db = device(fabric, o.last_wqe);
    let mut a = side(&da, o);
    let mut b = side(&db, o);
    connect(&mut a.qp, &mut b.qp, o);
    (a, b)
}

/// A 256-byte region of `side`'s PD and a type-2 window over it, bound for remote writes by
/// `side`'s QP (the NVMe-oF host's keyed SGL): its rkey is live on return.
pub(crate) fn window_for_writes(side: &mut Side, net: &Net) -> (SoftMr, SoftMw) {
    let data = side.pd.alloc_mr(256, ALL | Access::MW_BIND).unwrap();
    let mut mw = side.pd.alloc_mw().unwrap();
    let bind = mw.bind(&data, 0, 256, Access::REMOTE_WRITE).unwrap();
    side.qp
        .post_send(&[send_wr(9, bind, &[], SendFlags::SIGNALED)])
        .unwrap();
    let c = net.wait(&side.cq, 1);
    assert_eq!(
        (c[0].status, c[0].opcode),
        (WcStatus::Success, WcOpcode::BindMw)
    );
    (data, mw)
}

/// Polls every CQ of a test and keeps what each returned.
pub(crate) struct Net {
    cqs: Vec<SoftCq>,
    got: RefCell<HashMap<usize, VecDeque<WorkCompletion>>>,
}

/// CQ ids are per device: tell CQs apart by identity.
fn key(cq: &SoftCq) -> usize {
    std::sync::Arc::as_ptr(&cq.inner) as usize
}

impl Net {
    pub(crate) fn new(cqs: &[&SoftCq]) -> Net {
        Net {
            cqs: cqs.iter().map(|c| (*c).clone()).collect(),
            got: RefCell::new(HashMap::new()),
        }
    }

    pub(crate) fn pump(&self) {
        let mut buf = [WorkCompletion::default(); 64];
        for cq in &self.cqs {
            let n = cq.poll(&mut buf).unwrap();
            self.got
                .borrow_mut()
                .entry(key(cq))
                .or_default()
                .extend(&buf[..n]);
        }
    }

    /// Exactly the next `n` completions of `cq` (panics after 20 s).
    pub(crate) fn wait(&self, cq: &SoftCq, n: usize) -> Vec<WorkCompletion> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            self.pump();
            {
                let mut g = self.got.borrow_mut();
                let q = g.entry(key(cq)).or_default();
                if q.len() >= n {
                    return q.drain(..n).collect();
                }
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {n} completions on CQ {}",
                cq.id()
            );
            std::thread::yield_now();
        }
    }

    /// Pump for `d`, then return everything `cq` got.
    pub(crate) fn settle(&self, cq: &SoftCq, d: Duration) -> Vec<WorkCompletion> {
        let end = Instant::now() + d;
        while Instant::now() < end {
            self.pump();
            std::thread::sleep(Duration::from_micros(200));
        }
        self.got
            .borrow_mut()
            .entry(key(cq))
            .or_default()
            .drain(..)
            .collect()
    }
}

pub(crate) fn send_wr(wr_id: u64, op: SendOp, sges: &[Sge], flags: SendFlags) -> SendWr<'_> {
    SendWr {
        wr_id,
        op,
        sges,
        flags,
    }
}

pub(crate) fn async_events(ctx: &SoftContext) -> Vec<AsyncEventKind> {
    let mut v = Vec::new();
    while let Some(e) = ctx.poll_async_event().unwrap() {
        v.push(e.kind);
    }
    v
}

/// Wait until an async event matching `f` shows up (pumping `net` meanwhile).
pub(crate) fn wait_event(
    ctx: &SoftContext,
    net: &Net,
    f: impl Fn(&AsyncEventKind) -> bool,
) -> bool {
    wait_event_for(ctx, net, Duration::from_secs(5), f)
}

/// As [`wait_event`], giving up after `d`.
pub(crate) fn wait_event_for(
    ctx: &SoftContext,
    net: &Net,
    d: Duration,
    f: impl Fn(&AsyncEventKind) -> bool,
) -> bool {
    let deadline = Instant::now() + d;
    while Instant::now() < deadline {
        net.pump();
        while let Some(e) = ctx.poll_async_event().unwrap() {
            if f(&e.kind) {
                return true;
            }
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    false
}

/// Generates `$name::inproc` and `$name::tcp` tests from `fn $name(fabric: SoftFabric)`.
macro_rules! both_fabrics {
    ($($name:ident),* $(,)?) => {
        $(
            mod $name {
                #[test]
                fn inproc() {
                    super::$name(crate::types::SoftFabric::InProcess);
                }
                #[test]
                fn tcp() {
                    super::$name(crate::types::SoftFabric::Tcp);
                }
            }
        )*
    };
}
pub(crate) use both_fabrics;
