//! CM tests, on both fabrics; the CM messages decoded from any bytes (proptest).

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use super::super::testutil::*;
use crate::provider::*;
use crate::soft::*;
use crate::types::*;

both_fabrics!(
    connect_accept_disconnect,
    reject_and_limits,
    no_listener,
    backlog,
    device_removal,
    unread_events_free_their_channel
);

/// The next CM event on `ch`, pumping `net` meanwhile (TCP progress).
fn next(ch: &SoftCmChannel, net: Option<&Net>) -> CmEvent<Soft> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(e) = ch.poll_event().unwrap() {
            return e;
        }
        if let Some(n) = net {
            n.pump();
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for a CM event"
        );
        std::thread::sleep(Duration::from_micros(200));
    }
}

fn qp_init<'a>(cq: &'a SoftCq) -> QpInit<'a, Soft> {
    QpInit {
        send_cq: cq,
        recv_cq: cq,
        srq: None,
        caps: caps(&Opts::default()),
        sq_sig_all: true,
    }
}

fn param(pd: &[u8], rnr: u8) -> ConnParam {
    ConnParam {
        private_data: pd.to_vec(),
        responder_resources: 4,
        initiator_depth: 8,
        retry_count: 7,
        rnr_retry_count: rnr,
    }
}

fn listen(f: SoftFabric, backlog: u32) -> (SoftContext, SoftCmChannel, SoftCmId, SocketAddr) {
    let sdev = device(f, true);
    let sch = Soft::create_cm_channel().unwrap();
    let l = sch
        .listen(SocketAddr::new(IpAddr::V4(sdev.ip()), 0), backlog, 77)
        .unwrap();
    let addr = l.local_addr().unwrap();
    assert_ne!(addr.port(), 0);
    (sdev, sch, l, addr)
}

fn connect_accept_disconnect(f: SoftFabric) {
    let (sdev, sch, _l, addr) = listen(f, 8);
    let cdev = device(f, true);
    let cch = Soft::create_cm_channel().unwrap();
    let mut cid = cch
        .resolve(
            addr,
            Some(SocketAddr::new(IpAddr::V4(cdev.ip()), 0)),
            DEFAULT_CM_TIMEOUT,
            5,
        )
        .unwrap();
    assert_eq!(
        cid.context().unwrap().name(),
        cdev.name(),
        "bound to the device owning src"
    );
    let cctx = cid.context().unwrap();
    let cpd = cctx.alloc_pd().unwrap();
    let ccq = cctx.create_cq(64, None).unwrap();
    let mut cqp = cid.create_qp(&cpd, &qp_init(&ccq)).unwrap();
    assert_eq!(cqp.state(), QpState::Init);
    let req_pd = [0xa5u8; MAX_CONNECT_PRIVATE_DATA];
    cid.connect(&param(&req_pd, 7)).unwrap();

    let ev = next(&sch, None);
    assert_eq!(ev.token, 77);
    let CmEventKind::ConnectRequest {
        private_data,
        responder_resources,
        initiator_depth,
        remote,
        ..
    } = &ev.kind
    else {
        panic!("{:?}", ev.kind)
    };
    assert_eq!(private_data.as_slice(), &req_pd[..]);
    assert_eq!((*responder_resources, *initiator_depth), (4, 8));
    assert_eq!(remote.ip(), IpAddr::V4(cdev.ip()));
    let mut sid = ev.id.unwrap();
    sid.set_token(9);
    let sctx = sid.context().unwrap();
    assert_eq!(sctx.name(), sdev.name());
    let spd = sctx.alloc_pd().unwrap();
    let scq = sctx.create_cq(64, None).unwrap();
    let mut sqp = sid.create_qp(&spd, &qp_init(&scq)).unwrap();
    let rep_pd = [0x5au8; MAX_ACCEPT_PRIVATE_DATA];
    sid.accept(&param(&rep_pd, 7)).unwrap();
    assert_eq!(sqp.state(), QpState::Rts);

    let net = Net::new(&[&ccq, &scq]);
    let ev = next(&cch, Some(&net));
    assert_eq!(ev.token, 5);
    assert_eq!(
        ev.kind,
        CmEventKind::Established {
            private_data: rep_pd.to_vec()
        }
    );
    let ev = next(&sch, Some(&net));
    assert_eq!(
        (ev.token, ev.kind),
        (
            9,
            CmEventKind::Established {
                private_data: Vec::new()
            }
        )
    );
    assert_eq!(cqp.state(), QpState::Rts);

    // The CM-built QPs carry traffic.
    let smr = spd.alloc_mr(64, ALL).unwrap();
    let cmr = cpd.alloc_mr(64, ALL).unwrap();
    smr.write_at(0, b"cm!").unwrap();
    cqp.post_recv(&[RecvWr {
        wr_id: 1,
        sges: &[cmr.sge(0, 64)],
    }])
    .unwrap();
    sqp.post_send(&[send_wr(
        2,
        SendOp::Send,
        &[smr.sge(0, 3)],
        SendFlags::SIGNALED,
    )])
    .unwrap();
    assert_eq!(net.wait(&scq, 1)[0].status, WcStatus::Success);
    assert_eq!(net.wait(&ccq, 1)[0].byte_len, 3);
    assert_eq!(&cmr.read_vec(0..3).unwrap()[..], b"cm!");

    // Disconnect: both sides see DISCONNECTED then TIMEWAIT_EXIT; the QPs are in ERR.
    cid.disconnect().unwrap();
    assert_eq!(cqp.state(), QpState::Err);
    assert_eq!(next(&sch, Some(&net)).kind, CmEventKind::Disconnected);
    assert_eq!(next(&sch, Some(&net)).kind, CmEventKind::TimewaitExit);
    assert_eq!(next(&cch, Some(&net)).kind, CmEventKind::Disconnected);
    assert_eq!(next(&cch, Some(&net)).kind, CmEventKind::TimewaitExit);
    assert_eq!(sqp.state(), QpState::Err);
    // Private data limits.
    assert!(
        cid.connect(&param(&[0; MAX_CONNECT_PRIVATE_DATA + 1], 7))
            .is_err()
    );
}

/// A channel its user drops with events unread (a host that disconnected and went without
/// reading its DISCONNECTED) is freed with its socket pair: the queued events hold their ids,
/// which must not hold the channel.
fn unread_events_free_their_channel(f: SoftFabric) {
    let (_sdev, sch, _l, addr) = listen(f, 8);
    let cdev = device(f, true);
    let cch = Soft::create_cm_channel().unwrap();
    let src = SocketAddr::new(IpAddr::V4(cdev.ip()), 0);
    let mut cid = cch.resolve(addr, Some(src), DEFAULT_CM_TIMEOUT, 5).unwrap();
    let cctx = cid.context().unwrap();
    let cpd = cctx.alloc_pd().unwrap();
    let ccq = cctx.create_cq(64, None).unwrap();
    let cqp = cid.create_qp(&cpd, &qp_init(&ccq)).unwrap();
    cid.connect(&param(&[], 7)).unwrap();
    let mut sid = next(&sch, None).id.unwrap();
    let sctx = sid.context().unwrap();
    let spd = sctx.alloc_pd().unwrap();
    let scq = sctx.create_cq(64, None).unwrap();
    let _sqp = sid.create_qp(&spd, &qp_init(&scq)).unwrap();
    sid.accept(&param(&[], 7)).unwrap();
    let net = Net::new(&[&ccq, &scq]);
    assert!(matches!(
        next(&cch, Some(&net)).kind,
        CmEventKind::Established { .. }
    ));
    cid.disconnect().unwrap();
    // DISCONNECTED and TIMEWAIT_EXIT queue on the client's channel; nobody reads them.
    let deadline = Instant::now() + Duration::from_secs(10);
    while cch.inner.queued() < 2 {
        net.pump();
        assert!(Instant::now() < deadline, "the client's events never came");
        std::thread::sleep(Duration::from_micros(200));
    }
    let queue = std::sync::Arc::downgrade(&cch.inner);
    drop((cqp, cid, cch));
    assert!(
        queue.upgrade().is_none(),
        "the channel outlived its user, held by its own unread events"
    );
}

fn reject_and_limits(f: SoftFabric) {
    let (_sdev, sch, _l, addr) = listen(f, 8);
    let cch = Soft::create_cm_channel().unwrap();
    // Without src: the device that owns dst's IP.
    let mut cid = cch.resolve(addr, None, DEFAULT_CM_TIMEOUT, 1).unwrap();
    let ctx = cid.context().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16, None).unwrap();
    let _qp = cid.create_qp(&pd, &qp_init(&cq)).unwrap();
    assert!(
        cid.connect(&param(&[0; MAX_CONNECT_PRIVATE_DATA + 1], 7))
            .is_err()
    );
    cid.connect(&param(b"hello", 7)).unwrap();
    let ev = next(&sch, None);
    let mut sid = ev.id.unwrap();
    assert!(sid.reject(&[1; MAX_REJECT_PRIVATE_DATA + 1]).is_err());
    assert!(
        sid.accept(&param(&[1; MAX_ACCEPT_PRIVATE_DATA + 1], 7))
            .is_err()
    );
    let rej = [0x42u8; MAX_REJECT_PRIVATE_DATA];
    sid.reject(&rej).unwrap();
    assert_eq!(
        next(&cch, None).kind,
        CmEventKind::Rejected {
            reason: 28,
            private_data: rej.to_vec()
        }
    );
}

fn no_listener(f: SoftFabric) {
    let (sdev, _sch, l, addr) = listen(f, 8);
    drop(l);
    std::thread::sleep(Duration::from_millis(20));
    let cch = Soft::create_cm_channel().unwrap();
    let mut cid = cch.resolve(addr, None, DEFAULT_CM_TIMEOUT, 1).unwrap();
    let pd = sdev.alloc_pd().unwrap();
    let cq = sdev.create_cq(16, None).unwrap();
    let _qp = cid.create_qp(&pd, &qp_init(&cq)).unwrap();
    cid.connect(&param(&[], 7)).unwrap();
    assert!(matches!(
        next(&cch, None).kind,
        CmEventKind::Rejected { .. }
    ));
    // An address no soft device serves.
    let nowhere: SocketAddr = "10.255.255.1:4420".parse().unwrap();
    let src: SocketAddr = "10.255.255.2:0".parse().unwrap();
    let e = cch
        .resolve(nowhere, Some(src), DEFAULT_CM_TIMEOUT, 1)
        .err()
        .unwrap();
    assert!(
        matches!(e, crate::TransportError::AddressNotServed(a) if a == src),
        "{e}"
    );
    assert!(e.to_string().contains("no RDMA device serves"));
}

fn backlog(f: SoftFabric) {
    let (sdev, sch, _l, addr) = listen(f, 1);
    let cch = Soft::create_cm_channel().unwrap();
    let pd = sdev.alloc_pd().unwrap();
    let cq = sdev.create_cq(16, None).unwrap();
    let mut ids = Vec::new();
    for t in 0..2 {
        let mut cid = cch.resolve(addr, None, DEFAULT_CM_TIMEOUT, t).unwrap();
        let qp = cid.create_qp(&pd, &qp_init(&cq)).unwrap();
        cid.connect(&param(&[], 7)).unwrap();
        ids.push((cid, qp));
        if t == 0 {
            // Let the first request land before the second.
            let ev = next(&sch, None);
            assert!(matches!(ev.kind, CmEventKind::ConnectRequest { .. }));
            ids.push((ev.id.unwrap(), cq_dummy_qp(&pd, &cq)));
        }
    }
    let ev = next(&cch, None);
    assert_eq!(ev.token, 1);
    assert!(
        matches!(ev.kind, CmEventKind::Rejected { reason: 1, .. }),
        "{:?}",
        ev.kind
    );
}

fn cq_dummy_qp(pd: &SoftPd, cq: &SoftCq) -> SoftQp {
    pd.create_qp(&qp_init(cq)).unwrap()
}

fn device_removal(f: SoftFabric) {
    let (sdev, sch, _l, _addr) = listen(f, 1);
    sdev.faults().device_fatal();
    assert_eq!(next(&sch, None).kind, CmEventKind::DeviceRemoval);
    assert!(async_events(&sdev).contains(&AsyncEventKind::DeviceFatal));
}

#[test]
fn cm_channel_fd_is_readable_with_events() {
    let (_sdev, sch, l, addr) = listen(SoftFabric::InProcess, 4);
    let cch = Soft::create_cm_channel().unwrap();
    let mut cid = cch.resolve(addr, None, DEFAULT_CM_TIMEOUT, 1).unwrap();
    let ctx = cid.context().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16, None).unwrap();
    let _qp = cid.create_qp(&pd, &qp_init(&cq)).unwrap();
    cid.connect(&param(&[], 7)).unwrap();
    let mut poll = mio::Poll::new().unwrap();
    let fd = sch.fd();
    poll.registry()
        .register(
            &mut mio::unix::SourceFd(&fd),
            mio::Token(0),
            mio::Interest::READABLE,
        )
        .unwrap();
    let mut ev = mio::Events::with_capacity(4);
    poll.poll(&mut ev, Some(Duration::from_millis(500)))
        .unwrap();
    assert_eq!(ev.iter().count(), 1);
    assert!(sch.poll_event().unwrap().is_some());
    drop(l);
}

/// The CM's messages come from whoever connects to the listener: decoding never panics, and
/// what is encoded decodes to itself.
mod wire {
    use proptest::prelude::*;

    use super::super::Msg;
    use crate::types::{Gid, QpEndpoint};

    fn endpoint() -> impl Strategy<Value = QpEndpoint> {
        (any::<u32>(), any::<u32>(), any::<u16>(), any::<[u8; 16]>()).prop_map(
            |(qp_num, psn, lid, gid)| QpEndpoint {
                qp_num,
                psn,
                lid,
                gid: Gid(gid),
            },
        )
    }

    fn message() -> impl Strategy<Value = Msg> {
        let pd = || proptest::collection::vec(any::<u8>(), 0..=255);
        prop_oneof![
            (pd(), any::<[u8; 4]>(), endpoint()).prop_map(|(pd, d, ep)| Msg::Req {
                pd,
                resp_res: d[0],
                init_depth: d[1],
                retry: d[2],
                rnr_retry: d[3],
                ep,
            }),
            (pd(), any::<[u8; 3]>(), endpoint()).prop_map(|(pd, d, ep)| Msg::Rep {
                pd,
                resp_res: d[0],
                init_depth: d[1],
                rnr_retry: d[2],
                ep,
            }),
            (pd(), any::<u32>()).prop_map(|(pd, reason)| Msg::Rej { reason, pd }),
            Just(Msg::Rtu),
            Just(Msg::Dreq),
            Just(Msg::Drep),
        ]
    }

    proptest! {
        #[test]
        fn a_message_decodes_to_itself(m in message()) {
            let framed = m.encode();
            let len = u32::from_le_bytes(framed[..4].try_into().unwrap()) as usize;
            prop_assert_eq!(len, framed.len() - 4);
            prop_assert_eq!(Msg::decode(&framed[4..]), Some(m));
        }

        #[test]
        fn any_bytes_decode_without_panic(body in proptest::collection::vec(any::<u8>(), 0..400)) {
            // What decodes re-encodes to a message that decodes the same (nothing half-read).
            if let Some(m) = Msg::decode(&body) {
                prop_assert_eq!(Msg::decode(&m.encode()[4..]), Some(m));
            }
        }

        #[test]
        fn a_cut_message_is_refused(m in message(), cut in 0usize..1000) {
            let framed = m.encode();
            let body = &framed[4..];
            let keep = cut % body.len();
            prop_assert_eq!(Msg::decode(&body[..keep]), None);
        }
    }
}
