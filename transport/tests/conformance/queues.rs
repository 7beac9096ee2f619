//! Queue semantics: an SRQ shared by many QPs on one CQ, flush on error, LAST_WQE_REACHED,
//! RNR, completion channels, and a thousand QPs on one CQ.

use std::collections::HashMap;
use std::time::Duration;

use nvmf_transport::*;

use crate::fixture::*;

/// The manual's SRQ example: several QPs share one SRQ and one CQ; each completion names its
/// QP by qp_num, and the data that arrived must be the data that QP's peer sent.
pub fn srq_shared_by_many_qps(flavor: Flavor) {
    let Some(fx) = Fx::open(flavor) else { return };
    const QPS: usize = 8;
    const ROUNDS: usize = 16;
    const MSG: usize = 64;
    let pd = fx.ctx.alloc_pd().unwrap();
    let srv_cq = fx.cq(1024);
    let cli_cq = fx.cq(1024);
    let srq = pd
        .create_srq(&SrqInit {
            max_wr: 512,
            max_sge: 1,
            limit: 0,
        })
        .unwrap();
    let recv_mr = pd.alloc_mr(QPS * ROUNDS * MSG, all_access()).unwrap();
    let slots = QPS * ROUNDS;
    let sges: Vec<Sge> = (0..slots)
        .map(|i| recv_mr.sge(i * MSG, MSG as u32))
        .collect();
    let wrs: Vec<RecvWr> = (0..slots)
        .map(|i| RecvWr {
            wr_id: i as u64,
            sges: std::slice::from_ref(&sges[i]),
        })
        .collect();
    srq.post_recv(&wrs).unwrap();

    let mut servers = Vec::new();
    let mut clients = Vec::new();
    for _ in 0..QPS {
        let mut s = fx.qp(&pd, &srv_cq, &srv_cq, Some(&srq));
        let mut c = fx.qp(&pd, &cli_cq, &cli_cq, None);
        fx.connect(&mut c, &mut s, 7);
        servers.push(s);
        clients.push(c);
    }
    // Client i sends messages filled with byte i, interleaved across QPs.
    let send_mr = pd.alloc_mr(QPS * MSG, all_access()).unwrap();
    for i in 0..QPS {
        send_mr.write_at(i * MSG, &[i as u8 + 1; MSG]).unwrap();
    }
    for round in 0..ROUNDS {
        for (i, c) in clients.iter_mut().enumerate() {
            c.post_send(&[SendWr {
                wr_id: (round * QPS + i) as u64,
                op: SendOp::Send,
                sges: &[send_mr.sge(i * MSG, MSG as u32)],
                flags: SendFlags::SIGNALED,
            }])
            .unwrap();
        }
    }
    let sent = fx.wait_wcs(&cli_cq, slots);
    assert!(
        sent.iter().all(|w| w.status == WcStatus::Success),
        "{sent:?}"
    );
    let owner: HashMap<u32, usize> = servers
        .iter()
        .enumerate()
        .map(|(i, s)| (s.qp_num(), i))
        .collect();
    let got = fx.wait_wcs(&srv_cq, slots);
    let mut per_qp = [0usize; QPS];
    for w in &got {
        assert_eq!(
            (w.status, w.opcode, w.byte_len),
            (WcStatus::Success, WcOpcode::Recv, MSG as u32)
        );
        let i = *owner
            .get(&w.qp_num)
            .unwrap_or_else(|| panic!("unknown qp_num {}", w.qp_num));
        let slot = w.wr_id as usize;
        let data = &recv_mr.read_vec(slot * MSG..(slot + 1) * MSG).unwrap()[..];
        assert!(
            data.iter().all(|&b| b == i as u8 + 1),
            "slot {slot} from qp {i} holds {data:?}"
        );
        per_qp[i] += 1;
    }
    assert_eq!(per_qp, [ROUNDS; QPS]);
}

/// QP to ERR flushes its receive queue and the sends stuck behind an RNR, in order; WRs posted
/// in ERR flush too.
pub fn flush_on_error(flavor: Flavor) {
    let Some(fx) = Fx::open(flavor) else { return };
    let pd = fx.ctx.alloc_pd().unwrap();
    let cq_a = fx.cq(256);
    let cq_b = fx.cq(256);
    let mut a = fx.qp(&pd, &cq_a, &cq_a, None);
    let mut b = fx.qp(&pd, &cq_b, &cq_b, None);
    fx.connect(&mut a, &mut b, 7);
    let mr = pd.alloc_mr(4096, all_access()).unwrap();
    for i in 0..5 {
        a.post_recv(&[RecvWr {
            wr_id: 100 + i,
            sges: &[mr.sge(0, 64)],
        }])
        .unwrap();
    }
    // b has no receive posted: these sends wait on RNR (retry forever).
    for i in 0..3 {
        a.post_send(&[SendWr {
            wr_id: i,
            op: SendOp::Send,
            sges: &[mr.sge(0, 16)],
            flags: SendFlags::SIGNALED,
        }])
        .unwrap();
    }
    std::thread::sleep(Duration::from_millis(50));
    a.modify_to_err().unwrap();
    assert_eq!(a.state(), QpState::Err);
    let got = fx.wait_wcs(&cq_a, 8);
    assert!(
        got.iter().all(|w| w.status == WcStatus::WrFlushErr),
        "{got:?}"
    );
    let mut sends: Vec<u64> = got.iter().map(|w| w.wr_id).filter(|&id| id < 100).collect();
    let recvs: Vec<u64> = got
        .iter()
        .map(|w| w.wr_id)
        .filter(|&id| id >= 100)
        .collect();
    assert_eq!(
        recvs,
        vec![100, 101, 102, 103, 104],
        "receives flush in order"
    );
    sends.sort_unstable();
    assert_eq!(sends, vec![0, 1, 2]);
    // Posting in ERR is allowed, and the spec flushes the new WR at once. Soft-RoCE (rxe) in
    // Linux 6.1 flushes a QP's receive queue only at the ERR transition, never a receive posted
    // later: on verbs we report what the device does instead of failing (nothing above relies
    // on it: the poll group's receives live on an SRQ and its drain marker is a send).
    a.post_recv(&[RecvWr {
        wr_id: 200,
        sges: &[mr.sge(0, 64)],
    }])
    .unwrap();
    if flavor == Flavor::Verbs {
        std::thread::sleep(Duration::from_millis(500));
        let mut wc = [WorkCompletion::default(); 1];
        match cq_a.poll(&mut wc).unwrap() {
            0 => eprintln!(
                "NOTE: this device does not flush a receive posted in ERR (rxe on Linux < 6.4)"
            ),
            _ => assert_eq!((wc[0].wr_id, wc[0].status), (200, WcStatus::WrFlushErr)),
        }
    } else {
        let w = fx.wait_wcs(&cq_a, 1)[0];
        assert_eq!((w.wr_id, w.status), (200, WcStatus::WrFlushErr));
    }
    // A send posted in ERR flushes on every device (the poll group's drain marker relies on it).
    a.post_send(&[SendWr {
        wr_id: 300,
        op: SendOp::Send,
        sges: &[],
        flags: SendFlags::SIGNALED,
    }])
    .unwrap();
    let w = fx.wait_wcs(&cq_a, 1)[0];
    assert_eq!((w.wr_id, w.status), (300, WcStatus::WrFlushErr));
}

/// An SRQ-attached QP in ERR raises LAST_WQE_REACHED on devices that do; on the others (rxe,
/// iWARP, a soft device configured like them) it never comes, and the SRQ's receives stay
/// posted for the other QPs.
pub fn last_wqe_reached(flavor: Flavor) {
    let configs: &[bool] = match flavor {
        Flavor::Verbs => &[true],
        _ => &[true, false],
    };
    for &flag in configs {
        let Some(fx) = Fx::open_with(flavor, flag) else {
            return;
        };
        let raises = fx.ctx.query_device().unwrap().raises_last_wqe_reached;
        if flavor != Flavor::Verbs {
            assert_eq!(
                raises, flag,
                "soft device reports its LAST_WQE_REACHED setting"
            );
        }
        let pd = fx.ctx.alloc_pd().unwrap();
        let cq = fx.cq(256);
        let srq = pd
            .create_srq(&SrqInit {
                max_wr: 64,
                max_sge: 1,
                limit: 0,
            })
            .unwrap();
        let mr = pd.alloc_mr(4096, all_access()).unwrap();
        srq.post_recv(&[RecvWr {
            wr_id: 1,
            sges: &[mr.sge(0, 64)],
        }])
        .unwrap();
        let mut s = fx.qp(&pd, &cq, &cq, Some(&srq));
        let mut c = fx.qp(&pd, &cq, &cq, None);
        fx.connect(&mut c, &mut s, 7);
        let qpn = s.qp_num();
        s.modify_to_err().unwrap();
        if raises {
            let ev = fx.wait_async(|k| matches!(k, AsyncEventKind::QpLastWqeReached { .. }));
            assert_eq!(ev, AsyncEventKind::QpLastWqeReached { qp_num: qpn });
        } else {
            std::thread::sleep(Duration::from_millis(100));
            while let Some(ev) = fx.ctx.poll_async_event().unwrap() {
                assert!(
                    !matches!(ev.kind, AsyncEventKind::QpLastWqeReached { .. }),
                    "device says it never raises LAST_WQE_REACHED but did: {ev:?}"
                );
            }
        }
        // The SRQ's receive was not flushed by the QP's error: no completion for it.
        fx.assert_no_wc(&cq, Duration::from_millis(50));
    }
}

pub fn rnr_retry_forever(flavor: Flavor) {
    let Some(fx) = Fx::open(flavor) else { return };
    let pd = fx.ctx.alloc_pd().unwrap();
    let cq_a = fx.cq(64);
    let cq_b = fx.cq(64);
    let mut a = fx.qp(&pd, &cq_a, &cq_a, None);
    let mut b = fx.qp(&pd, &cq_b, &cq_b, None);
    fx.connect(&mut a, &mut b, 7);
    let mr = pd.alloc_mr(4096, all_access()).unwrap();
    mr.write_at(0, b"ping").unwrap();
    a.post_send(&[SendWr {
        wr_id: 1,
        op: SendOp::Send,
        sges: &[mr.sge(0, 4)],
        flags: SendFlags::SIGNALED,
    }])
    .unwrap();
    // No receive yet: the sender keeps retrying and nothing completes.
    fx.assert_no_wc(&cq_a, Duration::from_millis(200));
    b.post_recv(&[RecvWr {
        wr_id: 2,
        sges: &[mr.sge(1024, 64)],
    }])
    .unwrap();
    let w = fx.wait_wcs(&cq_a, 1)[0];
    assert_eq!((w.wr_id, w.status), (1, WcStatus::Success));
    let r = fx.wait_wcs(&cq_b, 1)[0];
    assert_eq!((r.wr_id, r.byte_len), (2, 4));
    assert_eq!(&mr.read_vec(1024..1028).unwrap()[..], b"ping");
}

pub fn rnr_retry_exceeded(flavor: Flavor) {
    let Some(fx) = Fx::open(flavor) else { return };
    let pd = fx.ctx.alloc_pd().unwrap();
    let cq_a = fx.cq(64);
    let cq_b = fx.cq(64);
    let mut a = fx.qp(&pd, &cq_a, &cq_a, None);
    let mut b = fx.qp(&pd, &cq_b, &cq_b, None);
    fx.connect(&mut a, &mut b, 1);
    let mr = pd.alloc_mr(4096, all_access()).unwrap();
    a.post_send(&[SendWr {
        wr_id: 3,
        op: SendOp::Send,
        sges: &[mr.sge(0, 4)],
        flags: SendFlags::SIGNALED,
    }])
    .unwrap();
    let w = fx.wait_wcs(&cq_a, 1)[0];
    assert_eq!((w.wr_id, w.status), (3, WcStatus::RnrRetryExcErr));
    assert_eq!(a.state(), QpState::Err);
}

/// An armed CQ makes its completion channel's fd readable, and the event names the CQ.
pub fn completion_channel_wakes(flavor: Flavor) {
    let Some(fx) = Fx::open(flavor) else { return };
    let pd = fx.ctx.alloc_pd().unwrap();
    let ch = fx.ctx.create_comp_channel().unwrap();
    let cq_a = fx.cq(64);
    let cq_b = fx.ctx.create_cq(64, Some(&ch)).unwrap();
    fx.register(&cq_b);
    let mut a = fx.qp(&pd, &cq_a, &cq_a, None);
    let mut b = fx.qp(&pd, &cq_b, &cq_b, None);
    fx.connect(&mut a, &mut b, 7);
    let mr = pd.alloc_mr(4096, all_access()).unwrap();
    b.post_recv(&[RecvWr {
        wr_id: 1,
        sges: &[mr.sge(0, 64)],
    }])
    .unwrap();
    cq_b.req_notify(false).unwrap();
    assert!(!nvmf_transport::fdwait::wait_readable(ch.fd(), Duration::from_millis(50)).unwrap());
    a.post_send(&[SendWr {
        wr_id: 2,
        op: SendOp::Send,
        sges: &[mr.sge(0, 8)],
        flags: SendFlags::SIGNALED,
    }])
    .unwrap();
    // Service the CQs (the soft TCP fabric delivers only when polled) until the channel fires.
    let deadline = std::time::Instant::now() + patience();
    loop {
        fx.pump();
        if nvmf_transport::fdwait::wait_readable(ch.fd(), Duration::from_millis(10)).unwrap() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "completion channel never fired"
        );
    }
    assert_eq!(ch.get_event().unwrap(), Some(cq_b.id()));
    let r = fx.wait_wcs(&cq_b, 1)[0];
    assert_eq!((r.wr_id, r.status), (1, WcStatus::Success));
    assert_eq!(ch.get_event().unwrap(), None, "one event per arming");
}

/// A thousand QPs whose receives all complete on one CQ, each attributed to its QP.
pub fn thousand_qps_one_cq(flavor: Flavor) {
    let Some(fx) = Fx::open(flavor) else { return };
    let n: usize = std::env::var("NVMF_TEST_MANY_QPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1000);
    let pd = fx.ctx.alloc_pd().unwrap();
    let srv_cq = fx.cq(n as u32 * 2);
    let cli_cq = fx.cq(n as u32 * 2);
    let srq = pd
        .create_srq(&SrqInit {
            max_wr: n as u32 * 2,
            max_sge: 1,
            limit: 0,
        })
        .unwrap();
    let recv_mr = pd.alloc_mr(n * 16, all_access()).unwrap();
    let sges: Vec<Sge> = (0..n).map(|i| recv_mr.sge(i * 16, 16)).collect();
    let wrs: Vec<RecvWr> = (0..n)
        .map(|i| RecvWr {
            wr_id: i as u64,
            sges: std::slice::from_ref(&sges[i]),
        })
        .collect();
    srq.post_recv(&wrs).unwrap();
    let send_mr = pd.alloc_mr(n * 4, all_access()).unwrap();
    let mut servers = Vec::with_capacity(n);
    let mut clients = Vec::with_capacity(n);
    for i in 0..n {
        let mut s = fx.qp(&pd, &srv_cq, &srv_cq, Some(&srq));
        let mut c = fx.qp(&pd, &cli_cq, &cli_cq, None);
        fx.connect(&mut c, &mut s, 7);
        send_mr.write_at(i * 4, &(i as u32).to_le_bytes()).unwrap();
        servers.push(s);
        clients.push(c);
    }
    for (i, c) in clients.iter_mut().enumerate().rev() {
        c.post_send(&[SendWr {
            wr_id: i as u64,
            op: SendOp::Send,
            sges: &[send_mr.sge(i * 4, 4)],
            flags: SendFlags::SIGNALED,
        }])
        .unwrap();
    }
    let sent = fx.wait_wcs(&cli_cq, n);
    assert!(
        sent.iter().all(|w| w.status == WcStatus::Success),
        "{:?}",
        sent.iter()
            .filter(|w| w.status != WcStatus::Success)
            .take(5)
            .collect::<Vec<_>>()
    );
    let owner: HashMap<u32, usize> = servers
        .iter()
        .enumerate()
        .map(|(i, s)| (s.qp_num(), i))
        .collect();
    assert_eq!(owner.len(), n, "qp_nums are unique");
    let got = fx.wait_wcs(&srv_cq, n);
    let mut seen = vec![false; n];
    for w in got {
        assert_eq!(w.status, WcStatus::Success);
        let i = owner[&w.qp_num];
        let slot = w.wr_id as usize;
        let v = u32::from_le_bytes(
            recv_mr
                .read_vec(slot * 16..slot * 16 + 4)
                .unwrap()
                .try_into()
                .unwrap(),
        );
        assert_eq!(v as usize, i, "qp {i}'s receive holds qp {v}'s message");
        assert!(!seen[i]);
        seen[i] = true;
    }
    assert!(seen.iter().all(|&s| s));
}
