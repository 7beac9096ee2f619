//! Connection manager: listen, connect, accept / reject, disconnect, private data both ways.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU16, Ordering};

use nvmf_transport::*;

use crate::fixture::*;

static NEXT_PORT: AtomicU16 = AtomicU16::new(0);

/// A listen address on the fixture's IP; ports differ per test (tests run in parallel).
fn listen_addr(fx: &Fx) -> SocketAddr {
    let base = 20000 + (std::process::id() % 20000) as u16;
    SocketAddr::new(fx.ip, base + NEXT_PORT.fetch_add(1, Ordering::Relaxed))
}

fn kind(fx: &Fx) -> ProviderKind {
    fx.ctx.kind()
}

fn wait(ch: &CmChannel) -> CmEvent {
    ch.wait_event(patience()).expect("CM event")
}

struct Conn {
    _ctx: Context,
    _pd: Pd,
    cq: Cq,
    qp: Qp,
}

/// PD, CQ and QP on the id's own device, as a real server/client must.
fn conn_on(fx: &Fx, id: &mut CmId) -> Conn {
    let ctx = id.context().expect("id is bound to a device");
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64, None).unwrap();
    fx.register(&cq);
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
        .expect("create qp on the CM id");
    Conn {
        _ctx: ctx,
        _pd: pd,
        cq,
        qp,
    }
}

pub fn connect_accept_disconnect(flavor: Flavor) {
    let Some(fx) = Fx::open(flavor) else { return };
    let addr = listen_addr(&fx);
    let srv_ch = CmChannel::new(kind(&fx)).unwrap();
    let cli_ch = CmChannel::new(kind(&fx)).unwrap();
    let _listener = srv_ch.listen(addr, 16, 1).unwrap();

    let mut cid = cli_ch.resolve(addr, None, patience(), 2).unwrap();
    assert_eq!(
        cid.context().unwrap().name(),
        fx.ctx.name(),
        "resolved to the fixture's device"
    );
    let mut cconn = conn_on(&fx, &mut cid);
    let req = b"nvme connect request private data, 32 bytes long!!".to_vec();
    cid.connect(&ConnParam {
        private_data: req.clone(),
        responder_resources: 0,
        initiator_depth: 4,
        retry_count: 7,
        rnr_retry_count: 7,
    })
    .unwrap();

    let ev = wait(&srv_ch);
    assert_eq!(ev.token, 1, "event is for the listener");
    let CmEventKind::ConnectRequest {
        private_data,
        initiator_depth,
        remote,
        local,
        ..
    } = &ev.kind
    else {
        panic!("expected CONNECT_REQUEST, got {ev:?}")
    };
    assert_eq!(
        &private_data[..req.len()],
        &req[..],
        "private data arrives intact"
    );
    assert_eq!(*initiator_depth, 4, "the peer's offered read depth");
    assert_eq!(local.port(), addr.port());
    assert_eq!(remote.ip(), fx.ip);
    let mut sid = ev.id.expect("a connect request carries the new id");
    sid.set_token(3);
    let mut sconn = conn_on(&fx, &mut sid);
    let rep = vec![0xAB; 32];
    sid.accept(&ConnParam {
        private_data: rep.clone(),
        responder_resources: 4,
        initiator_depth: 0,
        retry_count: 7,
        rnr_retry_count: 7,
    })
    .unwrap();

    let ev = wait(&cli_ch);
    assert_eq!(ev.token, 2);
    let CmEventKind::Established { private_data } = &ev.kind else {
        panic!("expected ESTABLISHED, got {ev:?}")
    };
    assert_eq!(
        &private_data[..rep.len()],
        &rep[..],
        "accept private data reaches the client"
    );
    let ev = wait(&srv_ch);
    assert_eq!(
        (ev.token, matches!(ev.kind, CmEventKind::Established { .. })),
        (3, true),
        "{ev:?}"
    );

    // The connection carries data.
    let pd = &cconn._pd;
    let mr = pd.alloc_mr(64, all_access()).unwrap();
    mr.write_at(0, b"hello").unwrap();
    let smr = sconn._pd.alloc_mr(64, all_access()).unwrap();
    sconn
        .qp
        .post_recv(&[RecvWr {
            wr_id: 9,
            sges: &[smr.sge(0, 64)],
        }])
        .unwrap();
    cconn
        .qp
        .post_send(&[SendWr {
            wr_id: 8,
            op: SendOp::Send,
            sges: &[mr.sge(0, 5)],
            flags: SendFlags::SIGNALED,
        }])
        .unwrap();
    assert_eq!(fx.wait_wcs(&cconn.cq, 1)[0].status, WcStatus::Success);
    let r = fx.wait_wcs(&sconn.cq, 1)[0];
    assert_eq!((r.wr_id, r.byte_len), (9, 5));
    assert_eq!(&smr.read_vec(0..5).unwrap()[..], b"hello");

    // Disconnect from the client: both sides see DISCONNECTED, and the QP is in ERR.
    cid.disconnect().unwrap();
    let ev = wait(&srv_ch);
    assert!(matches!(ev.kind, CmEventKind::Disconnected), "{ev:?}");
    assert_eq!(ev.token, 3);
    sid.disconnect().ok();
    let ev = wait(&cli_ch);
    assert!(matches!(ev.kind, CmEventKind::Disconnected), "{ev:?}");
    assert_eq!(cconn.qp.state(), QpState::Err);
}

pub fn reject_with_private_data(flavor: Flavor) {
    let Some(fx) = Fx::open(flavor) else { return };
    let addr = listen_addr(&fx);
    let srv_ch = CmChannel::new(kind(&fx)).unwrap();
    let cli_ch = CmChannel::new(kind(&fx)).unwrap();
    let _listener = srv_ch.listen(addr, 16, 1).unwrap();
    let mut cid = cli_ch.resolve(addr, None, patience(), 2).unwrap();
    let _cconn = conn_on(&fx, &mut cid);
    cid.connect(&ConnParam {
        private_data: vec![1; 32],
        initiator_depth: 1,
        retry_count: 7,
        rnr_retry_count: 7,
        ..Default::default()
    })
    .unwrap();
    let ev = wait(&srv_ch);
    assert!(
        matches!(ev.kind, CmEventKind::ConnectRequest { .. }),
        "{ev:?}"
    );
    let mut sid = ev.id.unwrap();
    // NVMe-oF reject: RECFMT 0, STS 3 (invalid QID).
    sid.reject(&[0, 0, 3, 0]).unwrap();
    let ev = wait(&cli_ch);
    let CmEventKind::Rejected { private_data, .. } = &ev.kind else {
        panic!("expected REJECTED, got {ev:?}")
    };
    assert_eq!(&private_data[..4], &[0, 0, 3, 0]);
}

pub fn private_data_limits(flavor: Flavor) {
    let Some(fx) = Fx::open(flavor) else { return };
    let addr = listen_addr(&fx);
    let srv_ch = CmChannel::new(kind(&fx)).unwrap();
    let cli_ch = CmChannel::new(kind(&fx)).unwrap();
    let _listener = srv_ch.listen(addr, 16, 1).unwrap();
    let mut cid = cli_ch.resolve(addr, None, patience(), 2).unwrap();
    let _cconn = conn_on(&fx, &mut cid);
    let too_long = ConnParam {
        private_data: vec![0; MAX_CONNECT_PRIVATE_DATA + 1],
        ..Default::default()
    };
    let err = cid.connect(&too_long).unwrap_err();
    assert!(err.to_string().contains("private data"), "{err}");
}
