//! Data movement: SEND/RECV (plain, inline, with immediate, unsignaled) and RDMA READ/WRITE
//! with good and bad remote keys.

use std::time::Duration;

use nvmf_transport::*;

use crate::fixture::*;

/// A connected pair on one device with one CQ each and a buffer each.
struct Pair {
    fx: Fx,
    _pd: Pd,
    cq_a: Cq,
    cq_b: Cq,
    a: Qp,
    b: Qp,
    mr_a: Mr,
    mr_b: Mr,
}

fn pair(flavor: Flavor, rnr_retry: u8) -> Option<Pair> {
    let fx = Fx::open(flavor)?;
    let pd = fx.ctx.alloc_pd().unwrap();
    let cq_a = fx.cq(256);
    let cq_b = fx.cq(256);
    let mut a = fx.qp(&pd, &cq_a, &cq_a, None);
    let mut b = fx.qp(&pd, &cq_b, &cq_b, None);
    fx.connect(&mut a, &mut b, rnr_retry);
    let mr_a = pd.alloc_mr(64 * 1024, all_access()).unwrap();
    let mr_b = pd.alloc_mr(64 * 1024, all_access()).unwrap();
    Some(Pair {
        fx,
        _pd: pd,
        cq_a,
        cq_b,
        a,
        b,
        mr_a,
        mr_b,
    })
}

pub fn send_recv(flavor: Flavor) {
    let Some(mut p) = pair(flavor, 7) else { return };
    let data = pattern(4096, 1);
    p.mr_a.write_at(0, &data).unwrap();
    p.b.post_recv(&[RecvWr {
        wr_id: 77,
        sges: &[p.mr_b.sge(0, 8192)],
    }])
    .unwrap();
    p.a.post_send(&[SendWr {
        wr_id: 11,
        op: SendOp::Send,
        sges: &[p.mr_a.sge(0, 4096)],
        flags: SendFlags::SIGNALED,
    }])
    .unwrap();
    let s = p.fx.wait_wcs(&p.cq_a, 1)[0];
    assert_eq!(
        (s.wr_id, s.status, s.opcode),
        (11, WcStatus::Success, WcOpcode::Send)
    );
    let r = p.fx.wait_wcs(&p.cq_b, 1)[0];
    assert_eq!(
        (r.wr_id, r.status, r.opcode),
        (77, WcStatus::Success, WcOpcode::Recv)
    );
    assert_eq!(r.byte_len, 4096);
    assert_eq!(r.qp_num, p.b.qp_num());
    assert_eq!(&p.mr_b.read_vec(0..4096).unwrap()[..], &data[..]);
    // Two SGEs gather into one message and scatter into two.
    p.b.post_recv(&[RecvWr {
        wr_id: 78,
        sges: &[p.mr_b.sge(100, 10), p.mr_b.sge(200, 100)],
    }])
    .unwrap();
    p.a.post_send(&[SendWr {
        wr_id: 12,
        op: SendOp::Send,
        sges: &[p.mr_a.sge(0, 5), p.mr_a.sge(1000, 15)],
        flags: SendFlags::SIGNALED,
    }])
    .unwrap();
    p.fx.wait_wcs(&p.cq_a, 1);
    let r = p.fx.wait_wcs(&p.cq_b, 1)[0];
    assert_eq!((r.wr_id, r.byte_len), (78, 20));
    let mut want = data[..5].to_vec();
    want.extend_from_slice(&data[1000..1015]);
    assert_eq!(&p.mr_b.read_vec(100..110).unwrap()[..], &want[..10]);
    assert_eq!(&p.mr_b.read_vec(200..210).unwrap()[..], &want[10..]);
}

pub fn send_recv_inline(flavor: Flavor) {
    let Some(mut p) = pair(flavor, 7) else { return };
    let max_inline = p.a.caps().max_inline_data;
    assert!(
        max_inline >= 32,
        "device granted only {max_inline} inline bytes"
    );
    let data = pattern(32, 9);
    p.mr_a.write_at(0, &data).unwrap();
    p.b.post_recv(&[RecvWr {
        wr_id: 1,
        sges: &[p.mr_b.sge(0, 64)],
    }])
    .unwrap();
    p.a.post_send(&[SendWr {
        wr_id: 2,
        op: SendOp::Send,
        sges: &[p.mr_a.sge(0, 32)],
        flags: SendFlags::SIGNALED | SendFlags::INLINE,
    }])
    .unwrap();
    // Inline data is copied at post time: overwriting the buffer now must not change the message.
    p.mr_a.write_at(0, &[0xEE; 32]).unwrap();
    assert_eq!(p.fx.wait_wcs(&p.cq_a, 1)[0].status, WcStatus::Success);
    let r = p.fx.wait_wcs(&p.cq_b, 1)[0];
    assert_eq!((r.status, r.byte_len), (WcStatus::Success, 32));
    assert_eq!(&p.mr_b.read_vec(0..32).unwrap()[..], &data[..]);
}

pub fn send_with_imm(flavor: Flavor) {
    let Some(mut p) = pair(flavor, 7) else { return };
    p.b.post_recv(&[RecvWr {
        wr_id: 1,
        sges: &[p.mr_b.sge(0, 64)],
    }])
    .unwrap();
    p.a.post_send(&[SendWr {
        wr_id: 2,
        op: SendOp::SendWithImm { imm: 0xdead_beef },
        sges: &[p.mr_a.sge(0, 16)],
        flags: SendFlags::SIGNALED,
    }])
    .unwrap();
    p.fx.wait_wcs(&p.cq_a, 1);
    let r = p.fx.wait_wcs(&p.cq_b, 1)[0];
    assert_eq!(r.status, WcStatus::Success);
    assert_eq!(r.imm_data, Some(0xdead_beef));
}

pub fn unsignaled_sends(flavor: Flavor) {
    let Some(mut p) = pair(flavor, 7) else { return };
    for i in 0..4 {
        p.b.post_recv(&[RecvWr {
            wr_id: 100 + i,
            sges: &[p.mr_b.sge(0, 64)],
        }])
        .unwrap();
    }
    let sge = [p.mr_a.sge(0, 8)];
    let wrs: Vec<SendWr> = (0..4)
        .map(|i| SendWr {
            wr_id: i,
            op: SendOp::Send,
            sges: &sge,
            flags: if i == 3 {
                SendFlags::SIGNALED
            } else {
                SendFlags::empty()
            },
        })
        .collect();
    p.a.post_send(&wrs).unwrap();
    let got = p.fx.wait_wcs(&p.cq_a, 1);
    assert_eq!(got[0].wr_id, 3, "only the signaled send completes");
    let recvs = p.fx.wait_wcs(&p.cq_b, 4);
    let ids: Vec<u64> = recvs.iter().map(|w| w.wr_id).collect();
    assert_eq!(ids, vec![100, 101, 102, 103], "receives complete in order");
    p.fx.assert_no_wc(&p.cq_a, Duration::from_millis(50));
}

pub fn rdma_write_good_rkey(flavor: Flavor) {
    let Some(mut p) = pair(flavor, 7) else { return };
    let data = pattern(20000, 3);
    p.mr_a.write_at(0, &data).unwrap();
    p.a.post_send(&[SendWr {
        wr_id: 5,
        op: SendOp::RdmaWrite {
            remote_addr: p.mr_b.addr() + 1000,
            rkey: p.mr_b.rkey(),
        },
        sges: &[p.mr_a.sge(0, 20000)],
        flags: SendFlags::SIGNALED,
    }])
    .unwrap();
    let w = p.fx.wait_wcs(&p.cq_a, 1)[0];
    assert_eq!(
        (w.wr_id, w.status, w.opcode),
        (5, WcStatus::Success, WcOpcode::RdmaWrite)
    );
    assert_eq!(&p.mr_b.read_vec(1000..21000).unwrap()[..], &data[..]);
    assert!(
        p.mr_b.read_vec(0..1000).unwrap().iter().all(|&b| b == 0),
        "nothing written before the target"
    );
    // The responder consumed no receive and saw no completion.
    p.fx.assert_no_wc(&p.cq_b, Duration::from_millis(20));
}

pub fn rdma_write_bad_rkey(flavor: Flavor) {
    let Some(mut p) = pair(flavor, 7) else { return };
    let bad = p.mr_b.rkey() ^ 0x5a5a_0000;
    p.a.post_send(&[
        SendWr {
            wr_id: 6,
            op: SendOp::RdmaWrite {
                remote_addr: p.mr_b.addr(),
                rkey: bad,
            },
            sges: &[p.mr_a.sge(0, 512)],
            flags: SendFlags::SIGNALED,
        },
        SendWr {
            wr_id: 7,
            op: SendOp::RdmaWrite {
                remote_addr: p.mr_b.addr(),
                rkey: p.mr_b.rkey(),
            },
            sges: &[p.mr_a.sge(0, 512)],
            flags: SendFlags::SIGNALED,
        },
    ])
    .unwrap();
    let w = p.fx.wait_wcs(&p.cq_a, 2);
    assert_eq!(
        (w[0].wr_id, w[0].status),
        (6, WcStatus::RemAccessErr),
        "{w:?}"
    );
    assert_eq!(
        (w[1].wr_id, w[1].status),
        (7, WcStatus::WrFlushErr),
        "{w:?}"
    );
    assert_eq!(p.a.state(), QpState::Err);
    let _ = &p.fx;
}

pub fn rdma_read_good_rkey(flavor: Flavor) {
    let Some(mut p) = pair(flavor, 7) else { return };
    let data = pattern(30000, 5);
    p.mr_b.write_at(0, &data).unwrap();
    p.a.post_send(&[SendWr {
        wr_id: 8,
        op: SendOp::RdmaRead {
            remote_addr: p.mr_b.addr(),
            rkey: p.mr_b.rkey(),
        },
        sges: &[p.mr_a.sge(100, 30000)],
        flags: SendFlags::SIGNALED,
    }])
    .unwrap();
    let w = p.fx.wait_wcs(&p.cq_a, 1)[0];
    assert_eq!(
        (w.wr_id, w.status, w.opcode),
        (8, WcStatus::Success, WcOpcode::RdmaRead)
    );
    assert_eq!(w.byte_len, 30000);
    assert_eq!(&p.mr_a.read_vec(100..30100).unwrap()[..], &data[..]);
}

pub fn rdma_read_bad_rkey(flavor: Flavor) {
    let Some(mut p) = pair(flavor, 7) else { return };
    p.a.post_send(&[SendWr {
        wr_id: 9,
        op: SendOp::RdmaRead {
            remote_addr: p.mr_b.addr(),
            rkey: p.mr_b.rkey().wrapping_add(0x100),
        },
        sges: &[p.mr_a.sge(0, 64)],
        flags: SendFlags::SIGNALED,
    }])
    .unwrap();
    let w = p.fx.wait_wcs(&p.cq_a, 1)[0];
    assert_eq!((w.wr_id, w.status), (9, WcStatus::RemAccessErr));
    assert_eq!(p.a.state(), QpState::Err);
}

pub fn rdma_read_out_of_bounds(flavor: Flavor) {
    let Some(mut p) = pair(flavor, 7) else { return };
    // The right key, but the range runs past the end of the region.
    let end = p.mr_b.addr() + p.mr_b.len() as u64;
    p.a.post_send(&[SendWr {
        wr_id: 10,
        op: SendOp::RdmaRead {
            remote_addr: end - 16,
            rkey: p.mr_b.rkey(),
        },
        sges: &[p.mr_a.sge(0, 64)],
        flags: SendFlags::SIGNALED,
    }])
    .unwrap();
    let w = p.fx.wait_wcs(&p.cq_a, 1)[0];
    assert_eq!((w.wr_id, w.status), (10, WcStatus::RemAccessErr));
}
