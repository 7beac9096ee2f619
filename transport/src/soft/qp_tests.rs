//! Data-path tests of the soft QP, run on both fabrics.

use std::time::Duration;

use super::super::testutil::*;
use crate::provider::*;
use crate::soft::*;
use crate::types::*;

both_fabrics!(
    send_recv,
    inline_send,
    write_read_good,
    read_sge_limit,
    bad_rkey_write,
    bad_rkey_read_bounds_access,
    wrong_lkey,
    wrong_lkey_on_a_large_payload,
    srq_many_qps_one_cq,
    flush_on_error,
    last_wqe_on,
    last_wqe_off,
    rnr_forever,
    rnr_retry_exceeded,
    send_with_inv,
    send_with_inv_then_write_in_one_list,
    send_with_inv_region_rkey,
    cq_overrun,
    depth_limits,
    unsignaled,
    recv_too_small,
    recv_with_a_bad_lkey,
    a_failed_receive_follows_the_ones_before_it,
    thousand_qps_one_cq,
);

fn send_recv(f: SoftFabric) {
    let (mut a, mut b) = pair(f, &Opts::default());
    let net = Net::new(&[&a.cq, &b.cq]);
    b.qp.post_recv(&[RecvWr {
        wr_id: 7,
        sges: &[b.mr.sge(0, 64)],
    }])
    .unwrap();
    b.qp.post_recv(&[RecvWr {
        wr_id: 8,
        sges: &[b.mr.sge(64, 64)],
    }])
    .unwrap();
    a.mr.write_at(0, b"hello").unwrap();
    a.mr.write_at(5, b"world").unwrap();
    a.qp.post_send(&[
        send_wr(1, SendOp::Send, &[a.mr.sge(0, 5)], SendFlags::SIGNALED),
        send_wr(
            2,
            SendOp::SendWithImm { imm: 0xabcd },
            &[a.mr.sge(5, 5)],
            SendFlags::SIGNALED,
        ),
    ])
    .unwrap();
    let s = net.wait(&a.cq, 2);
    assert_eq!(
        (s[0].wr_id, s[0].status, s[0].opcode),
        (1, WcStatus::Success, WcOpcode::Send)
    );
    assert_eq!((s[1].wr_id, s[1].status), (2, WcStatus::Success));
    assert_eq!(s[0].qp_num, a.qp.qp_num());
    let r = net.wait(&b.cq, 2);
    assert_eq!(
        (r[0].wr_id, r[0].status, r[0].opcode, r[0].byte_len),
        (7, WcStatus::Success, WcOpcode::Recv, 5)
    );
    assert_eq!(
        (r[0].qp_num, r[0].src_qp, r[0].imm_data),
        (b.qp.qp_num(), a.qp.qp_num(), None)
    );
    assert_eq!((r[1].wr_id, r[1].imm_data), (8, Some(0xabcd)));
    assert_eq!(&b.mr.read_vec(0..5).unwrap()[..], b"hello");
    assert_eq!(&b.mr.read_vec(64..69).unwrap()[..], b"world");
}

fn inline_send(f: SoftFabric) {
    let (mut a, mut b) = pair(f, &Opts::default());
    let net = Net::new(&[&a.cq, &b.cq]);
    b.qp.post_recv(&[RecvWr {
        wr_id: 1,
        sges: &[b.mr.sge(0, 128)],
    }])
    .unwrap();
    a.mr.write_at(0, b"abcd").unwrap();
    a.qp.post_send(&[send_wr(
        1,
        SendOp::Send,
        &[a.mr.sge(0, 4)],
        SendFlags::SIGNALED | SendFlags::INLINE,
    )])
    .unwrap();
    // The buffer may be reused right after posting an inline send.
    a.mr.write_at(0, b"XXXX").unwrap();
    assert_eq!(net.wait(&a.cq, 1)[0].status, WcStatus::Success);
    assert_eq!(net.wait(&b.cq, 1)[0].byte_len, 4);
    assert_eq!(&b.mr.read_vec(0..4).unwrap()[..], b"abcd");
    // Beyond max_inline_data: refused at post.
    let e =
        a.qp.post_send(&[send_wr(
            2,
            SendOp::Send,
            &[a.mr.sge(0, 129)],
            SendFlags::INLINE,
        )])
        .unwrap_err();
    assert_eq!(e.failed_index, 0);
}

/// A device's `max_sge_rd` below its `max_sge` (iWARP's 1): an RDMA READ with more SGEs is
/// refused at post, as a device refuses it; one within the limit, and a WRITE with more, go.
fn read_sge_limit(f: SoftFabric) {
    let narrow = |c: &mut SoftConfig| {
        c.max_sge = 4;
        c.max_sge_rd = 1;
    };
    let o = Opts::default();
    let (da, db) = (device_with(f, narrow), device_with(f, narrow));
    assert_eq!(da.query_device().unwrap().max_sge_rd, 1);
    let (mut a, mut b) = (side(&da, &o), side(&db, &o));
    connect(&mut a.qp, &mut b.qp, &o);
    let net = Net::new(&[&a.cq, &b.cq]);
    let rkey = b.mr.rkey();
    b.mr.write_at(0, b"readme").unwrap();
    let read = SendOp::RdmaRead {
        remote_addr: b.mr.addr(),
        rkey,
    };
    let two = [a.mr.sge(100, 3), a.mr.sge(200, 3)];
    let e =
        a.qp.post_send(&[send_wr(1, read, &two, SendFlags::SIGNALED)])
            .unwrap_err();
    assert_eq!(e.failed_index, 0);
    a.qp.post_send(&[send_wr(2, read, &two[..1], SendFlags::SIGNALED)])
        .unwrap();
    let c = net.wait(&a.cq, 1);
    assert_eq!((c[0].wr_id, c[0].status), (2, WcStatus::Success));
    assert_eq!(&a.mr.read_vec(100..103).unwrap()[..], b"rea");
    let write = SendOp::RdmaWrite {
        remote_addr: b.mr.addr() + 64,
        rkey,
    };
    a.qp.post_send(&[send_wr(3, write, &two, SendFlags::SIGNALED)])
        .unwrap();
    let c = net.wait(&a.cq, 1);
    assert_eq!((c[0].wr_id, c[0].status), (3, WcStatus::Success));
    assert_eq!(&b.mr.read_vec(64..67).unwrap()[..], b"rea");
    for bad in [0, 5] {
        let refused = Soft::open(&SoftConfig {
            name: format!("rd-limit-{bad}-{f:?}"),
            fabric: f,
            max_sge: 4,
            max_sge_rd: bad,
            ..SoftConfig::default()
        });
        let message = refused.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(
            message.contains("max_sge_rd"),
            "max_sge_rd {bad}: {message:?}"
        );
    }
}

fn write_read_good(f: SoftFabric) {
    let (mut a, mut b) = pair(f, &Opts::default());
    let net = Net::new(&[&a.cq, &b.cq]);
    a.mr.write_at(0, b"rdmawrit").unwrap();
    let (raddr, rkey) = (b.mr.addr() + 100, b.mr.rkey());
    a.qp.post_send(&[send_wr(
        1,
        SendOp::RdmaWrite {
            remote_addr: raddr,
            rkey,
        },
        &[a.mr.sge(0, 8)],
        SendFlags::SIGNALED,
    )])
    .unwrap();
    let c = net.wait(&a.cq, 1);
    assert_eq!(
        (c[0].status, c[0].opcode),
        (WcStatus::Success, WcOpcode::RdmaWrite)
    );
    assert_eq!(&b.mr.read_vec(100..108).unwrap()[..], b"rdmawrit");
    b.mr.write_at(2000, b"readme").unwrap();
    a.qp.post_send(&[send_wr(
        2,
        SendOp::RdmaRead {
            remote_addr: b.mr.addr() + 2000,
            rkey,
        },
        &[a.mr.sge(500, 3), a.mr.sge(1000, 3)],
        SendFlags::SIGNALED,
    )])
    .unwrap();
    let c = net.wait(&a.cq, 1);
    assert_eq!(
        (c[0].wr_id, c[0].status, c[0].opcode, c[0].byte_len),
        (2, WcStatus::Success, WcOpcode::RdmaRead, 6)
    );
    assert_eq!(&a.mr.read_vec(500..503).unwrap()[..], b"rea");
    assert_eq!(&a.mr.read_vec(1000..1003).unwrap()[..], b"dme");
    // RDMA WRITE with immediate consumes a receive and reports the immediate.
    b.qp.post_recv(&[RecvWr {
        wr_id: 9,
        sges: &[],
    }])
    .unwrap();
    a.qp.post_send(&[send_wr(
        3,
        SendOp::RdmaWriteWithImm {
            remote_addr: b.mr.addr(),
            rkey,
            imm: 42,
        },
        &[a.mr.sge(0, 4)],
        SendFlags::SIGNALED,
    )])
    .unwrap();
    assert_eq!(net.wait(&a.cq, 1)[0].status, WcStatus::Success);
    let r = net.wait(&b.cq, 1);
    assert_eq!(
        (r[0].wr_id, r[0].opcode, r[0].imm_data, r[0].byte_len),
        (9, WcOpcode::RecvRdmaWithImm, Some(42), 4)
    );
    assert!(async_events(&a.ctx).is_empty());
}

fn bad_rkey_write(f: SoftFabric) {
    let (mut a, b) = pair(f, &Opts::default());
    let net = Net::new(&[&a.cq, &b.cq]);
    let bad = b.mr.rkey() ^ 0x100;
    a.qp.post_send(&[
        send_wr(
            1,
            SendOp::RdmaWrite {
                remote_addr: b.mr.addr(),
                rkey: bad,
            },
            &[a.mr.sge(0, 8)],
            SendFlags::empty(),
        ),
        send_wr(2, SendOp::Send, &[a.mr.sge(0, 8)], SendFlags::SIGNALED),
        send_wr(
            3,
            SendOp::RdmaWrite {
                remote_addr: b.mr.addr(),
                rkey: b.mr.rkey(),
            },
            &[a.mr.sge(0, 8)],
            SendFlags::empty(),
        ),
    ])
    .unwrap();
    let c = net.wait(&a.cq, 3);
    assert_eq!((c[0].wr_id, c[0].status), (1, WcStatus::RemAccessErr));
    assert_eq!((c[1].wr_id, c[1].status), (2, WcStatus::WrFlushErr));
    // Flushed even though unsignaled: errors always complete.
    assert_eq!((c[2].wr_id, c[2].status), (3, WcStatus::WrFlushErr));
    assert_eq!(a.qp.state(), QpState::Err);
    // Posting in ERR is accepted and flushed.
    a.qp.post_send(&[send_wr(4, SendOp::Send, &[], SendFlags::empty())])
        .unwrap();
    assert_eq!(net.wait(&a.cq, 1)[0].status, WcStatus::WrFlushErr);
    // The responder detected an access violation: it is in ERR too, with QP_ACCESS_ERR.
    let qpn = b.qp.qp_num();
    assert!(wait_event(&b.ctx, &net, |k| *k
        == AsyncEventKind::QpAccessErr { qp_num: qpn }));
    assert_eq!(b.qp.state(), QpState::Err);
}

fn bad_rkey_read_bounds_access(f: SoftFabric) {
    // Out of bounds.
    let (mut a, b) = pair(f, &Opts::default());
    let net = Net::new(&[&a.cq, &b.cq]);
    let wr = |addr, rkey| SendOp::RdmaRead {
        remote_addr: addr,
        rkey,
    };
    a.qp.post_send(&[send_wr(
        1,
        wr(b.mr.addr() + 4090, b.mr.rkey()),
        &[a.mr.sge(0, 8)],
        SendFlags::SIGNALED,
    )])
    .unwrap();
    assert_eq!(net.wait(&a.cq, 1)[0].status, WcStatus::RemAccessErr);
    assert_eq!(a.qp.state(), QpState::Err);
    // The lkey is not an rkey.
    let (mut a, b) = pair(f, &Opts::default());
    let net = Net::new(&[&a.cq, &b.cq]);
    a.qp.post_send(&[send_wr(
        1,
        wr(b.mr.addr(), b.mr.lkey()),
        &[a.mr.sge(0, 8)],
        SendFlags::SIGNALED,
    )])
    .unwrap();
    assert_eq!(net.wait(&a.cq, 1)[0].status, WcStatus::RemAccessErr);
    // An MR without REMOTE_READ.
    let (mut a, b) = pair(f, &Opts::default());
    let net = Net::new(&[&a.cq, &b.cq]);
    let ro =
        b.pd.alloc_mr(64, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
            .unwrap();
    a.qp.post_send(&[send_wr(
        1,
        wr(ro.addr(), ro.rkey()),
        &[a.mr.sge(0, 8)],
        SendFlags::SIGNALED,
    )])
    .unwrap();
    assert_eq!(net.wait(&a.cq, 1)[0].status, WcStatus::RemAccessErr);
    // A deregistered MR's rkey is stale.
    let (mut a, b) = pair(f, &Opts::default());
    let net = Net::new(&[&a.cq, &b.cq]);
    let gone = b.pd.alloc_mr(64, ALL).unwrap();
    let (addr, rkey) = (gone.addr(), gone.rkey());
    drop(gone);
    a.qp.post_send(&[send_wr(
        1,
        wr(addr, rkey),
        &[a.mr.sge(0, 8)],
        SendFlags::SIGNALED,
    )])
    .unwrap();
    assert_eq!(net.wait(&a.cq, 1)[0].status, WcStatus::RemAccessErr);
}

fn wrong_lkey(f: SoftFabric) {
    let (mut a, mut b) = pair(f, &Opts::default());
    let net = Net::new(&[&a.cq, &b.cq]);
    b.qp.post_recv(&[RecvWr {
        wr_id: 1,
        sges: &[b.mr.sge(0, 64)],
    }])
    .unwrap();
    let bad = Sge {
        addr: a.mr.addr(),
        length: 8,
        lkey: a.mr.lkey() + 0x100,
    };
    a.qp.post_send(&[
        send_wr(1, SendOp::Send, &[bad], SendFlags::empty()),
        send_wr(2, SendOp::Send, &[a.mr.sge(0, 8)], SendFlags::SIGNALED),
    ])
    .unwrap();
    let c = net.wait(&a.cq, 2);
    assert_eq!((c[0].wr_id, c[0].status), (1, WcStatus::LocProtErr));
    assert_eq!((c[1].wr_id, c[1].status), (2, WcStatus::WrFlushErr));
    assert_eq!(a.qp.state(), QpState::Err);
    // Out of the MR's bounds is a local protection error too; so is an rkey used as lkey.
    let (mut a, b) = pair(f, &Opts::default());
    let net = Net::new(&[&a.cq, &b.cq]);
    let past = Sge {
        addr: a.mr.addr() + 4000,
        length: 200,
        lkey: a.mr.lkey(),
    };
    a.qp.post_send(&[send_wr(
        1,
        SendOp::RdmaWrite {
            remote_addr: b.mr.addr(),
            rkey: b.mr.rkey(),
        },
        &[past],
        SendFlags::SIGNALED,
    )])
    .unwrap();
    assert_eq!(net.wait(&a.cq, 1)[0].status, WcStatus::LocProtErr);
}

/// Payloads of a KiB or more, which soft TCP writes straight from registered memory (its
/// flush pins them again): every bad key still fails the WR locally, and good ones arrive
/// whole, two spans in one write.
fn wrong_lkey_on_a_large_payload(f: SoftFabric) {
    const LEN: u32 = 2048;
    let opts = Opts {
        mr_len: 8192,
        ..Opts::default()
    };
    let sge = |lkey: u32, offset: u64, length: u32, mr: &SoftMr| Sge {
        addr: mr.addr() + offset,
        length,
        lkey,
    };
    // A wrong lkey, a range past the region's end, the rkey given as an lkey.
    for case in 0..3 {
        let (mut a, mut b) = pair(f, &opts);
        let net = Net::new(&[&a.cq, &b.cq]);
        b.qp.post_recv(&[RecvWr {
            wr_id: 1,
            sges: &[b.mr.sge(0, 4096)],
        }])
        .unwrap();
        let bad = match case {
            0 => sge(a.mr.lkey() + (100 << 8), 0, LEN, &a.mr),
            1 => sge(a.mr.lkey(), 8192 - 1024, LEN, &a.mr),
            _ => sge(a.mr.rkey(), 0, LEN, &a.mr),
        };
        a.qp.post_send(&[
            send_wr(1, SendOp::Send, &[bad], SendFlags::SIGNALED),
            send_wr(2, SendOp::Send, &[a.mr.sge(0, LEN)], SendFlags::SIGNALED),
        ])
        .unwrap();
        let c: Vec<_> = net
            .wait(&a.cq, 2)
            .iter()
            .map(|c| (c.wr_id, c.status))
            .collect();
        let want = [(1, WcStatus::LocProtErr), (2, WcStatus::WrFlushErr)];
        assert_eq!(c, want, "case {case}");
        assert_eq!(a.qp.state(), QpState::Err, "case {case}");
    }
    // Two good ones in one list (two spans in one write), bytes intact.
    let (mut a, mut b) = pair(f, &opts);
    let net = Net::new(&[&a.cq, &b.cq]);
    for i in 0..2u64 {
        b.qp.post_recv(&[RecvWr {
            wr_id: 10 + i,
            sges: &[b.mr.sge(4096 * i as usize, 4096)],
        }])
        .unwrap();
    }
    let pattern: Vec<u8> = (0..8192u32).map(|i| (i * 7 + 3) as u8).collect();
    a.mr.write_at(0, &pattern).unwrap();
    let (first, second) = ([a.mr.sge(0, LEN)], [a.mr.sge(4096, 4096)]);
    a.qp.post_send(&[
        send_wr(1, SendOp::Send, &first, SendFlags::SIGNALED),
        send_wr(2, SendOp::Send, &second, SendFlags::SIGNALED),
    ])
    .unwrap();
    let sent: Vec<_> = net.wait(&a.cq, 2).iter().map(|c| c.status).collect();
    assert_eq!(sent, [WcStatus::Success; 2]);
    let got: Vec<_> = net
        .wait(&b.cq, 2)
        .iter()
        .map(|c| (c.wr_id, c.byte_len))
        .collect();
    assert_eq!(got, [(10, LEN), (11, 4096)]);
    let len = LEN as usize;
    assert_eq!(b.mr.read_vec(0..len).unwrap(), &pattern[..len]);
    assert_eq!(b.mr.read_vec(4096..8192).unwrap(), &pattern[4096..]);
}

fn srq_many_qps_one_cq(f: SoftFabric) {
    const N: usize = 8;
    let o = Opts {
        srq: true,
        recv_wr: 256,
        ..Opts::default()
    };
    let ds = device(f, true);
    let dc = device(f, true);
    let pd = ds.alloc_pd().unwrap();
    let cq = ds.create_cq(1024, None).unwrap();
    let srq = pd
        .create_srq(&SrqInit {
            max_wr: 256,
            max_sge: 1,
            limit: 0,
        })
        .unwrap();
    let mr = pd.alloc_mr(64 * 256, ALL).unwrap();
    let ccq = dc.create_cq(1024, None).unwrap();
    let cpd = dc.alloc_pd().unwrap();
    let cmr = cpd.alloc_mr(4096, ALL).unwrap();
    let mut servers = Vec::new();
    let mut clients = Vec::new();
    for _ in 0..N {
        let mut s = pd
            .create_qp(&QpInit {
                send_cq: &cq,
                recv_cq: &cq,
                srq: Some(&srq),
                caps: caps(&o),
                sq_sig_all: false,
            })
            .unwrap();
        let mut c = qp_on(&cpd, &ccq, &o, true);
        connect(&mut c, &mut s, &o);
        servers.push(s);
        clients.push(c);
    }
    let wrs: Vec<_> = (0..256).map(|i| mr.sge(i * 64, 64)).collect();
    for (i, s) in wrs.iter().enumerate() {
        srq.post_recv(&[RecvWr {
            wr_id: i as u64,
            sges: std::slice::from_ref(s),
        }])
        .unwrap();
    }
    let net = Net::new(&[&cq, &ccq]);
    for (i, c) in clients.iter_mut().enumerate() {
        for k in 0..4u8 {
            cmr.write_at(i * 4 + k as usize, &[(i as u8) << 4 | k])
                .unwrap();
        }
        for k in 0..4 {
            c.post_send(&[send_wr(
                k,
                SendOp::Send,
                &[cmr.sge(i * 4 + k as usize, 1)],
                SendFlags::empty(),
            )])
            .unwrap();
        }
    }
    let cc = net.wait(&ccq, N * 4);
    assert!(
        cc.iter().all(|c| c.status == WcStatus::Success),
        "{:?}",
        &cc[..4]
    );
    let got = net.wait(&cq, N * 4);
    let mut per_qp = std::collections::HashMap::<u32, Vec<u8>>::new();
    for c in &got {
        assert_eq!(c.status, WcStatus::Success);
        let byte = mr
            .read_vec(c.wr_id as usize * 64..c.wr_id as usize * 64 + 1)
            .unwrap()[0];
        per_qp.entry(c.qp_num).or_default().push(byte);
    }
    for (i, s) in servers.iter().enumerate() {
        // Attributed to the right QP, and in that QP's order.
        let want: Vec<u8> = (0..4).map(|k| (i as u8) << 4 | k).collect();
        assert_eq!(per_qp[&s.qp_num()], want, "qp {i}");
        assert!(
            got.iter()
                .filter(|c| c.qp_num == s.qp_num())
                .all(|c| c.src_qp == clients[i].qp_num())
        );
    }
}

fn flush_on_error(f: SoftFabric) {
    let o = Opts {
        rnr_retry: 7,
        ..Opts::default()
    };
    let (mut a, mut b) = pair(f, &o);
    let net = Net::new(&[&a.cq, &b.cq]);
    // Sends stuck on RNR (no receive at b), receives posted at a.
    a.qp.post_recv(&[
        RecvWr {
            wr_id: 100,
            sges: &[a.mr.sge(0, 8)],
        },
        RecvWr {
            wr_id: 101,
            sges: &[a.mr.sge(8, 8)],
        },
    ])
    .unwrap();
    for i in 0..3 {
        a.qp.post_send(&[send_wr(
            i,
            SendOp::Send,
            &[a.mr.sge(0, 8)],
            SendFlags::empty(),
        )])
        .unwrap();
    }
    assert!(net.settle(&a.cq, Duration::from_millis(20)).is_empty());
    a.qp.modify_to_err().unwrap();
    let c = net.wait(&a.cq, 5);
    let mut sends: Vec<_> = c
        .iter()
        .filter(|c| c.wr_id < 100)
        .map(|c| (c.wr_id, c.status))
        .collect();
    let recvs: Vec<_> = c
        .iter()
        .filter(|c| c.wr_id >= 100)
        .map(|c| (c.wr_id, c.status))
        .collect();
    assert_eq!(
        sends,
        vec![
            (0, WcStatus::WrFlushErr),
            (1, WcStatus::WrFlushErr),
            (2, WcStatus::WrFlushErr)
        ]
    );
    assert_eq!(
        recvs,
        vec![(100, WcStatus::WrFlushErr), (101, WcStatus::WrFlushErr)]
    );
    // Posting in ERR flushes at once, receives too.
    a.qp.post_recv(&[RecvWr {
        wr_id: 102,
        sges: &[],
    }])
    .unwrap();
    a.qp.post_send(&[send_wr(3, SendOp::Send, &[], SendFlags::empty())])
        .unwrap();
    // Order holds within each work queue, not between the send and the receive queue (as in
    // verbs: the soft CQ queues each side's completions apart).
    sends = net
        .wait(&a.cq, 2)
        .iter()
        .map(|c| (c.wr_id, c.status))
        .collect();
    sends.sort_unstable_by_key(|&(wr_id, _)| wr_id);
    assert_eq!(
        sends,
        vec![(3, WcStatus::WrFlushErr), (102, WcStatus::WrFlushErr)]
    );
    let _ = &mut b;
}

fn last_wqe(f: SoftFabric, on: bool) {
    let o = Opts {
        srq: true,
        last_wqe: on,
        ..Opts::default()
    };
    let (a, mut b) = pair(f, &o);
    assert_eq!(b.ctx.query_device().unwrap().raises_last_wqe_reached, on);
    let srq = b.srq.clone().unwrap();
    srq.post_recv(&[RecvWr {
        wr_id: 1,
        sges: &[b.mr.sge(0, 64)],
    }])
    .unwrap();
    let net = Net::new(&[&a.cq, &b.cq]);
    b.qp.modify_to_err().unwrap();
    let qpn = b.qp.qp_num();
    // Absent: a fair while is enough (when raised at all, it is raised at the ERR transition).
    let d = Duration::from_millis(if on { 5000 } else { 300 });
    let seen = wait_event_for(&b.ctx, &net, d, |k| {
        *k == AsyncEventKind::QpLastWqeReached { qp_num: qpn }
    });
    assert_eq!(seen, on);
    // SRQ receives belong to the SRQ: not flushed by the QP's error.
    assert_eq!(srq.posted(), 1);
    assert!(net.settle(&b.cq, Duration::from_millis(5)).is_empty());
}

fn last_wqe_on(f: SoftFabric) {
    last_wqe(f, true);
}

fn last_wqe_off(f: SoftFabric) {
    last_wqe(f, false);
}

fn rnr_forever(f: SoftFabric) {
    let o = Opts {
        rnr_retry: 7,
        min_rnr_timer: 1,
        ..Opts::default()
    };
    let (mut a, mut b) = pair(f, &o);
    let net = Net::new(&[&a.cq, &b.cq]);
    a.mr.write_at(0, b"r1").unwrap();
    a.mr.write_at(2, b"r2").unwrap();
    a.qp.post_send(&[send_wr(
        1,
        SendOp::Send,
        &[a.mr.sge(0, 2)],
        SendFlags::SIGNALED,
    )])
    .unwrap();
    // A later WR waits behind the stalled one (RC is in order), even one needing no receive.
    a.qp.post_send(&[send_wr(
        2,
        SendOp::RdmaWrite {
            remote_addr: b.mr.addr() + 512,
            rkey: b.mr.rkey(),
        },
        &[a.mr.sge(2, 2)],
        SendFlags::SIGNALED,
    )])
    .unwrap();
    assert!(net.settle(&a.cq, Duration::from_millis(50)).is_empty());
    assert_ne!(&b.mr.read_vec(512..514).unwrap()[..], b"r2");
    b.qp.post_recv(&[RecvWr {
        wr_id: 5,
        sges: &[b.mr.sge(0, 64)],
    }])
    .unwrap();
    let c = net.wait(&a.cq, 2);
    assert_eq!((c[0].wr_id, c[0].status), (1, WcStatus::Success));
    assert_eq!((c[1].wr_id, c[1].status), (2, WcStatus::Success));
    assert_eq!(net.wait(&b.cq, 1)[0].wr_id, 5);
    assert_eq!(&b.mr.read_vec(0..2).unwrap()[..], b"r1");
    assert_eq!(&b.mr.read_vec(512..514).unwrap()[..], b"r2");
}

fn rnr_retry_exceeded(f: SoftFabric) {
    let o = Opts {
        rnr_retry: 2,
        min_rnr_timer: 1,
        ..Opts::default()
    };
    let (mut a, b) = pair(f, &o);
    let net = Net::new(&[&a.cq, &b.cq]);
    a.qp.post_send(&[
        send_wr(1, SendOp::Send, &[a.mr.sge(0, 2)], SendFlags::empty()),
        send_wr(2, SendOp::Send, &[a.mr.sge(0, 2)], SendFlags::empty()),
    ])
    .unwrap();
    let c = net.wait(&a.cq, 2);
    assert_eq!((c[0].wr_id, c[0].status), (1, WcStatus::RnrRetryExcErr));
    assert_eq!((c[1].wr_id, c[1].status), (2, WcStatus::WrFlushErr));
    assert_eq!(a.qp.state(), QpState::Err);
}

fn send_with_inv(f: SoftFabric) {
    write_after_send_with_inv(f, false);
}

/// The WRITE after the invalidation in the same list as it: a key the list pinned for its first
/// WRITE must not outlive the invalidation (`inproc::ListScope`).
fn send_with_inv_then_write_in_one_list(f: SoftFabric) {
    write_after_send_with_inv(f, true);
}

/// WRITE through a window, SEND_WITH_INV of its rkey, then a WRITE through it again (in the
/// same `post_send` list or in a list of its own): the last fails with REM_ACCESS_ERR and
/// writes nothing.
fn write_after_send_with_inv(f: SoftFabric, same_list: bool) {
    let (mut a, mut b) = pair(f, &Opts::default());
    let net = Net::new(&[&a.cq, &b.cq]);
    // b's data buffer, reached through a window whose rkey a will invalidate (the NVMe-oF
    // host's keyed SGL).
    let (data, mw) = window_for_writes(&mut b, &net);
    let rkey = mw.rkey();
    b.qp.post_recv(&[RecvWr {
        wr_id: 1,
        sges: &[b.mr.sge(0, 64)],
    }])
    .unwrap();
    a.mr.write_at(0, b"0123456789abcdef").unwrap();
    let sge = [a.mr.sge(0, 16)];
    let write = |wr_id, offset| {
        send_wr(
            wr_id,
            SendOp::RdmaWrite {
                remote_addr: data.addr() + offset,
                rkey,
            },
            &sge,
            SendFlags::SIGNALED,
        )
    };
    let first = [
        write(1, 0),
        send_wr(2, SendOp::SendWithInv { rkey }, &sge, SendFlags::SIGNALED),
        write(3, 32),
    ];
    let posted = if same_list { 3 } else { 2 };
    a.qp.post_send(&first[..posted]).unwrap();
    let mut c = net.wait(&a.cq, posted);
    let r = net.wait(&b.cq, 1);
    assert_eq!(
        (r[0].status, r[0].invalidated_rkey),
        (WcStatus::Success, Some(rkey))
    );
    if !same_list {
        // The key no longer works remotely.
        a.qp.post_send(&first[2..]).unwrap();
        c.extend(net.wait(&a.cq, 1));
    }
    assert_eq!(
        c.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
        [
            (1, WcStatus::Success),
            (2, WcStatus::Success),
            (3, WcStatus::RemAccessErr)
        ]
    );
    assert_eq!(&data.read_vec(0..16).unwrap()[..], b"0123456789abcdef");
    assert_eq!(
        data.read_vec(32..48).unwrap(),
        vec![0; 16],
        "no write after the invalidation"
    );
}

/// As on hardware, SEND_WITH_INV naming a plain region's rkey is a remote error: the receive
/// fails with REM_INV_REQ_ERR, the requester gets REM_OP_ERR, and the rkey stays valid.
fn send_with_inv_region_rkey(f: SoftFabric) {
    let (mut a, mut b) = pair(f, &Opts::default());
    let net = Net::new(&[&a.cq, &b.cq]);
    let data = b.pd.alloc_mr(256, ALL).unwrap();
    b.qp.post_recv(&[RecvWr {
        wr_id: 1,
        sges: &[b.mr.sge(0, 64)],
    }])
    .unwrap();
    a.qp.post_send(&[send_wr(
        2,
        SendOp::SendWithInv { rkey: data.rkey() },
        &[a.mr.sge(0, 16)],
        SendFlags::SIGNALED,
    )])
    .unwrap();
    assert_eq!(net.wait(&a.cq, 1)[0].status, WcStatus::RemOpErr);
    let r = net.wait(&b.cq, 1);
    assert_eq!(
        (r[0].status, r[0].invalidated_rkey),
        (WcStatus::RemInvReqErr, None)
    );
    let keys = &b.pd.dev().keys;
    assert!(
        keys.lookup(
            data.rkey(),
            true,
            b.pd.id(),
            data.addr(),
            8,
            Access::REMOTE_READ
        )
        .is_ok(),
        "a region's rkey must survive SEND_WITH_INV"
    );
}

fn depth_limits(f: SoftFabric) {
    // Send queue: slots are freed only by polled completions (unsignaled WRs by a later
    // signaled one), as on hardware.
    let o = Opts {
        send_wr: 4,
        recv_wr: 2,
        ..Opts::default()
    };
    let (mut a, mut b) = pair(f, &o);
    let net = Net::new(&[&a.cq, &b.cq]);
    let w = |id| {
        send_wr(
            id,
            SendOp::RdmaWrite {
                remote_addr: b.mr.addr(),
                rkey: b.mr.rkey(),
            },
            &[],
            SendFlags::empty(),
        )
    };
    a.qp.post_send(&[w(0), w(1), w(2)]).unwrap();
    let mut sig = w(3);
    sig.flags = SendFlags::SIGNALED;
    a.qp.post_send(&[sig]).unwrap();
    let e = a.qp.post_send(&[w(4)]).unwrap_err();
    assert!(
        matches!(e.error, crate::TransportError::QueueFull(_)),
        "{e}"
    );
    assert_eq!(net.wait(&a.cq, 1)[0].wr_id, 3);
    a.qp.post_send(&[w(4), w(5), w(6), w(7)]).unwrap();
    let e = a.qp.post_send(&[w(8), w(9)]).unwrap_err();
    assert_eq!(e.failed_index, 0);
    // Receive queue depth.
    b.qp.post_recv(&[
        RecvWr {
            wr_id: 1,
            sges: &[],
        },
        RecvWr {
            wr_id: 2,
            sges: &[],
        },
    ])
    .unwrap();
    let e =
        b.qp.post_recv(&[RecvWr {
            wr_id: 3,
            sges: &[],
        }])
        .unwrap_err();
    assert!(matches!(e.error, crate::TransportError::QueueFull(_)));
    // SRQ depth.
    let srq =
        b.pd.create_srq(&SrqInit {
            max_wr: 2,
            max_sge: 1,
            limit: 0,
        })
        .unwrap();
    let e = srq
        .post_recv(&[
            RecvWr {
                wr_id: 1,
                sges: &[],
            },
            RecvWr {
                wr_id: 2,
                sges: &[],
            },
            RecvWr {
                wr_id: 3,
                sges: &[],
            },
        ])
        .unwrap_err();
    assert_eq!(e.failed_index, 2);
    // Creation beyond device limits.
    let dev = device_with(f, |c| {
        c.max_qp = 2;
        c.max_qp_wr = 8;
        c.max_cqe = 16;
        c.max_srq_wr = 8;
    });
    let pd = dev.alloc_pd().unwrap();
    assert!(matches!(
        dev.create_cq(17, None),
        Err(crate::TransportError::Limit { .. })
    ));
    assert!(matches!(
        pd.create_srq(&SrqInit {
            max_wr: 9,
            max_sge: 1,
            limit: 0
        }),
        Err(crate::TransportError::Limit { .. })
    ));
    let cq = dev.create_cq(16, None).unwrap();
    let init = |wr| QpInit {
        send_cq: &cq,
        recv_cq: &cq,
        srq: None,
        caps: caps(&Opts {
            send_wr: wr,
            recv_wr: 1,
            ..o
        }),
        sq_sig_all: false,
    };
    assert!(matches!(
        pd.create_qp(&init(9)),
        Err(crate::TransportError::Limit { .. })
    ));
    let q1 = pd.create_qp(&init(8)).unwrap();
    let q2 = pd.create_qp(&init(8)).unwrap();
    assert!(matches!(
        pd.create_qp(&init(8)),
        Err(crate::TransportError::Limit { what: "max_qp", .. })
    ));
    drop(q1);
    let q3 = pd.create_qp(&init(8)).unwrap();
    assert_ne!(q3.qp_num(), q2.qp_num());
}

fn unsignaled(f: SoftFabric) {
    let (mut a, mut b) = pair(f, &Opts::default());
    let net = Net::new(&[&a.cq, &b.cq]);
    b.qp.post_recv(&[RecvWr {
        wr_id: 1,
        sges: &[b.mr.sge(0, 64)],
    }])
    .unwrap();
    a.qp.post_send(&[send_wr(
        1,
        SendOp::Send,
        &[a.mr.sge(0, 8)],
        SendFlags::empty(),
    )])
    .unwrap();
    assert_eq!(net.wait(&b.cq, 1)[0].status, WcStatus::Success);
    assert!(net.settle(&a.cq, Duration::from_millis(20)).is_empty());
    // sq_sig_all signals everything.
    let o = Opts::default();
    let d1 = device(f, true);
    let d2 = device(f, true);
    let mut x = side(&d1, &o);
    let mut y = side(&d2, &o);
    let all = qp_on(&x.pd, &x.cq, &o, true);
    x.qp = all;
    connect(&mut x.qp, &mut y.qp, &o);
    let net = Net::new(&[&x.cq, &y.cq]);
    x.qp.post_send(&[send_wr(
        9,
        SendOp::RdmaWrite {
            remote_addr: y.mr.addr(),
            rkey: y.mr.rkey(),
        },
        &[x.mr.sge(0, 8)],
        SendFlags::empty(),
    )])
    .unwrap();
    assert_eq!(net.wait(&x.cq, 1)[0].wr_id, 9);
}

/// `b` posts one receive (`recv_id`) of `recv`, and `a` sends it 8 bytes (a signaled SEND 1).
fn eight_bytes_into(a: &mut Side, b: &mut Side, recv_id: u64, recv: Sge) {
    b.qp.post_recv(&[RecvWr {
        wr_id: recv_id,
        sges: &[recv],
    }])
    .unwrap();
    a.qp.post_send(&[send_wr(
        1,
        SendOp::Send,
        &[a.mr.sge(0, 8)],
        SendFlags::SIGNALED,
    )])
    .unwrap();
}

fn recv_too_small(f: SoftFabric) {
    let (mut a, mut b) = pair(f, &Opts::default());
    let net = Net::new(&[&a.cq, &b.cq]);
    let small = b.mr.sge(0, 4);
    eight_bytes_into(&mut a, &mut b, 1, small);
    assert_eq!(net.wait(&a.cq, 1)[0].status, WcStatus::RemInvReqErr);
    let r = net.wait(&b.cq, 1);
    assert_eq!((r[0].wr_id, r[0].status), (1, WcStatus::LocLenErr));
    assert_eq!(b.qp.state(), QpState::Err);
}

/// 64 bytes of `side`'s region named by a key that does not exist.
fn bad_lkey(side: &Side) -> Sge {
    Sge {
        addr: side.mr.addr(),
        length: 64,
        lkey: side.mr.lkey() + 0x100,
    }
}

fn recv_with_a_bad_lkey(f: SoftFabric) {
    let (mut a, mut b) = pair(f, &Opts::default());
    let net = Net::new(&[&a.cq, &b.cq]);
    let bad = bad_lkey(&b);
    eight_bytes_into(&mut a, &mut b, 3, bad);
    // The receive names its own error; the sender learns the responder failed.
    let r = net.wait(&b.cq, 1);
    assert_eq!((r[0].wr_id, r[0].status), (3, WcStatus::LocProtErr));
    assert_eq!(net.wait(&a.cq, 1)[0].status, WcStatus::RemOpErr);
    assert_eq!(b.qp.state(), QpState::Err);
}

/// Four SENDs in one list into receives of which the third has a bad lkey: the receive
/// queue's completions keep their order (on soft TCP the four arrive in one read, whose
/// successful completions are queued together: the failure must not overtake them).
fn a_failed_receive_follows_the_ones_before_it(f: SoftFabric) {
    let (mut a, mut b) = pair(f, &Opts::default());
    let net = Net::new(&[&a.cq, &b.cq]);
    let bad = bad_lkey(&b);
    for (wr_id, sge) in [
        (1, b.mr.sge(0, 64)),
        (2, b.mr.sge(64, 64)),
        (3, bad),
        (4, b.mr.sge(128, 64)),
    ] {
        b.qp.post_recv(&[RecvWr {
            wr_id,
            sges: &[sge],
        }])
        .unwrap();
    }
    let sge = [a.mr.sge(0, 8)];
    let wrs: Vec<SendWr<'_>> = (1..=4)
        .map(|i| send_wr(i, SendOp::Send, &sge, SendFlags::SIGNALED))
        .collect();
    a.qp.post_send(&wrs).unwrap();
    let got: Vec<(u64, WcStatus)> = net
        .wait(&b.cq, 4)
        .iter()
        .map(|c| (c.wr_id, c.status))
        .collect();
    assert_eq!(
        got,
        [
            (1, WcStatus::Success),
            (2, WcStatus::Success),
            (3, WcStatus::LocProtErr),
            (4, WcStatus::WrFlushErr),
        ]
    );
    assert_eq!(b.qp.state(), QpState::Err);
}

fn thousand_qps_one_cq(f: SoftFabric) {
    const N: usize = 1000;
    let o = Opts {
        send_wr: 4,
        recv_wr: 4,
        ..Opts::default()
    };
    let ds = device(f, true);
    let dc = device(f, true);
    let (spd, cpd) = (ds.alloc_pd().unwrap(), dc.alloc_pd().unwrap());
    let scq = ds.create_cq(4096, None).unwrap();
    let ccq = dc.create_cq(4096, None).unwrap();
    let smr = spd.alloc_mr(N * 8, ALL).unwrap();
    let cmr = cpd.alloc_mr(8, ALL).unwrap();
    let mut pairs = Vec::with_capacity(N);
    for _ in 0..N {
        let mut s = qp_on(&spd, &scq, &o, false);
        let mut c = qp_on(&cpd, &ccq, &o, false);
        connect(&mut c, &mut s, &o);
        pairs.push((c, s));
    }
    let mut nums = std::collections::HashSet::new();
    for (i, (c, s)) in pairs.iter_mut().enumerate() {
        assert!(nums.insert(s.qp_num()));
        s.post_recv(&[RecvWr {
            wr_id: i as u64,
            sges: &[smr.sge(i * 8, 8)],
        }])
        .unwrap();
        c.post_send(&[send_wr(
            i as u64,
            SendOp::Send,
            &[cmr.sge(0, 8)],
            SendFlags::SIGNALED,
        )])
        .unwrap();
    }
    let net = Net::new(&[&scq, &ccq]);
    let got = net.wait(&scq, N);
    assert!(got.iter().all(|c| c.status == WcStatus::Success));
    let by_qp: std::collections::HashSet<u32> = got.iter().map(|c| c.qp_num).collect();
    if by_qp.len() != N {
        let mut cnt = std::collections::BTreeMap::<u32, Vec<u64>>::new();
        for c in &got {
            cnt.entry(c.qp_num).or_default().push(c.wr_id);
        }
        let dup: Vec<_> = cnt.iter().filter(|(_, v)| v.len() > 1).take(5).collect();
        let nums: Vec<u32> = pairs.iter().take(5).map(|(_, s)| s.qp_num()).collect();
        panic!("dups {dup:?} nums {nums:?}");
    }
    assert_eq!(net.wait(&ccq, N).len(), N);
}

#[test]
fn qp_numbers_24bit_unique_not_reused_at_once() {
    let d = device(SoftFabric::InProcess, true);
    let o = Opts::default();
    let pd = d.alloc_pd().unwrap();
    let cq = d.create_cq(16, None).unwrap();
    let mk = || qp_on(&pd, &cq, &o, false);
    let a = mk();
    let b = mk();
    assert!(a.qp_num() >= 2 && a.qp_num() <= 0xff_ffff);
    assert_ne!(a.qp_num(), b.qp_num());
    let old = a.qp_num();
    drop(a);
    let c = mk();
    assert_ne!(
        c.qp_num(),
        old,
        "a destroyed QP's number is not reused at once"
    );
}

#[test]
fn completion_channel_only_when_armed() {
    let d = device(SoftFabric::InProcess, true);
    let ch = d.create_comp_channel().unwrap();
    let o = Opts::default();
    let pd = d.alloc_pd().unwrap();
    let cq = d.create_cq(16, Some(&ch)).unwrap();
    let mut a = qp_on(&pd, &cq, &o, true);
    let mut b = side(&d, &o);
    connect(&mut a, &mut b.qp, &o);
    let mr = pd.alloc_mr(64, ALL).unwrap();
    let sg = [mr.sge(0, 8)];
    let w = send_wr(
        1,
        SendOp::RdmaWrite {
            remote_addr: b.mr.addr(),
            rkey: b.mr.rkey(),
        },
        &sg,
        SendFlags::empty(),
    );
    a.post_send(&[w]).unwrap();
    assert_eq!(ch.get_event().unwrap(), None, "not armed: no channel event");
    let mut wc = [WorkCompletion::default(); 4];
    assert_eq!(cq.poll(&mut wc).unwrap(), 1);
    cq.req_notify(false).unwrap();
    a.post_send(&[w]).unwrap();
    // The fd is readable (poll with zero timeout through mio).
    let mut poll = mio::Poll::new().unwrap();
    let fd = ch.fd();
    poll.registry()
        .register(
            &mut mio::unix::SourceFd(&fd),
            mio::Token(0),
            mio::Interest::READABLE,
        )
        .unwrap();
    let mut ev = mio::Events::with_capacity(4);
    poll.poll(&mut ev, Some(Duration::from_millis(100)))
        .unwrap();
    assert_eq!(ev.iter().count(), 1);
    assert_eq!(ch.get_event().unwrap(), Some(cq.id()));
    assert_eq!(ch.get_event().unwrap(), None);
    // Disarmed again after one event.
    a.post_send(&[w]).unwrap();
    assert_eq!(ch.get_event().unwrap(), None);
}

/// An overrun is never silent: CQ_ERR, and every poll of that CQ fails from then on.
fn cq_overrun(f: SoftFabric) {
    let d = device(f, true);
    let o = Opts {
        send_wr: 8,
        ..Opts::default()
    };
    let pd = d.alloc_pd().unwrap();
    let cq = d.create_cq(2, None).unwrap();
    let mut a = qp_on(&pd, &cq, &o, true);
    let mut b = side(&d, &o);
    connect(&mut a, &mut b.qp, &o);
    let w = send_wr(
        1,
        SendOp::RdmaWrite {
            remote_addr: b.mr.addr(),
            rkey: b.mr.rkey(),
        },
        &[],
        SendFlags::empty(),
    );
    a.post_send(&[w, w, w]).unwrap();
    // Polling drives the TCP fabric; with three completions due on a CQ of two, a poll fails.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let mut out = [WorkCompletion::default(); 1];
    let err = loop {
        match cq.poll(&mut out) {
            Err(e) => break e,
            Ok(_) => {
                b.cq.poll(&mut out).unwrap();
                assert!(std::time::Instant::now() < deadline, "no overrun reported");
                std::thread::yield_now();
            }
        }
    };
    assert!(
        matches!(err, crate::error::TransportError::CqOverrun { cq_id } if cq_id == cq.id()),
        "{err}"
    );
    assert!(cq.poll(&mut out).is_err(), "a CQ in error stays in error");
    assert!(async_events(&d).contains(&AsyncEventKind::CqErr { cq_id: cq.id() }));
    assert!(cq.overrun());
}

#[test]
fn srq_limit_event_one_shot() {
    let d = device(SoftFabric::InProcess, true);
    let o = Opts {
        srq: true,
        ..Opts::default()
    };
    let (mut a, b) = {
        let d2 = device(SoftFabric::InProcess, true);
        let mut a = side(&d2, &Opts::default());
        let mut b = side(&d, &o);
        connect(&mut a.qp, &mut b.qp, &o);
        (a, b)
    };
    let srq = b.srq.clone().unwrap();
    for i in 0..4 {
        srq.post_recv(&[RecvWr {
            wr_id: i,
            sges: &[b.mr.sge(0, 64)],
        }])
        .unwrap();
    }
    srq.set_limit(3).unwrap();
    let net = Net::new(&[&a.cq, &b.cq]);
    let sg = [a.mr.sge(0, 1)];
    let s = send_wr(1, SendOp::Send, &sg, SendFlags::empty());
    a.qp.post_send(&[s]).unwrap();
    assert!(async_events(&d).is_empty(), "3 left: not below the limit");
    a.qp.post_send(&[s, s]).unwrap();
    let ev = async_events(&d);
    assert_eq!(
        ev,
        vec![AsyncEventKind::SrqLimitReached { srq_id: srq.id() }]
    );
    net.wait(&b.cq, 3);
}

#[test]
fn a_cq_limit_past_the_rings_position_mark_is_refused_by_name() {
    let cfg = SoftConfig {
        name: "too-deep-cq".into(),
        max_cqe: 1 << 30,
        ..SoftConfig::default()
    };
    let Err(err) = Soft::open(&cfg) else {
        panic!("max_cqe past the limit opened");
    };
    let err = err.to_string();
    assert!(err.contains("max_cqe") && err.contains("at most"), "{err}");
}

#[test]
fn devices_registry() {
    let list = Soft::devices().unwrap();
    assert!(!list.is_empty());
    let cfg = SoftConfig {
        name: "reg-test".into(),
        ip: std::net::Ipv4Addr::new(127, 9, 9, 9),
        ..SoftConfig::default()
    };
    let a = Soft::open(&cfg).unwrap();
    let b = Soft::open(&cfg).unwrap();
    assert!(std::sync::Arc::ptr_eq(&a.inner, &b.inner));
    let other = SoftConfig {
        last_wqe_reached: false,
        ..cfg
    };
    assert!(Soft::open(&other).is_err());
    assert!(
        Soft::devices()
            .unwrap()
            .iter()
            .any(|d| d.name == "reg-test" && d.provider == ProviderKind::Soft)
    );
    let gids = a.gid_table(1).unwrap();
    assert_eq!(
        gids[0].gid.to_ipv4(),
        Some(std::net::Ipv4Addr::new(127, 9, 9, 9))
    );
    assert_eq!(a.query_port(1).unwrap().lid, a.lid());
}

/// Regression: on TCP, WRs posted before the QP's connection is attached (the passive side
/// waits for the device acceptor to hand it over) wait in the send queue unsent. A WR posted
/// once the connection is there must not overtake them on the wire: the responder accepts
/// only the next sequence and drops the rest, so an overtaking request was lost for good and
/// its requester waited forever. The acceptor's timing is simulated by holding the connection
/// back across the first post.
#[test]
fn tcp_post_after_late_connection_keeps_order() {
    let (mut a, mut b) = pair(SoftFabric::Tcp, &Opts::default());
    let net = Net::new(&[&a.cq, &b.cq]);
    for i in 0..3u64 {
        b.qp.post_recv(&[RecvWr {
            wr_id: i,
            sges: &[b.mr.sge(i as usize * 64, 64)],
        }])
        .unwrap();
    }
    a.mr.write_at(0, b"xyz").unwrap();
    let held = a.qp.sh.lock().conn.take();
    assert!(held.is_some(), "the active side connects at RTR");
    a.qp.post_send(&[send_wr(
        0,
        SendOp::Send,
        &[a.mr.sge(0, 1)],
        SendFlags::SIGNALED,
    )])
    .unwrap();
    a.qp.sh.lock().conn = held;
    a.qp.post_send(&[
        send_wr(1, SendOp::Send, &[a.mr.sge(1, 1)], SendFlags::SIGNALED),
        send_wr(2, SendOp::Send, &[a.mr.sge(2, 1)], SendFlags::SIGNALED),
    ])
    .unwrap();
    let got = net.settle(&a.cq, Duration::from_millis(300));
    let ids: Vec<_> = got.iter().map(|c| (c.wr_id, c.status)).collect();
    assert_eq!(
        ids,
        [0, 1, 2].map(|i| (i, WcStatus::Success)),
        "every send completes, in order"
    );
    let r = net.wait(&b.cq, 3);
    for (i, c) in r.iter().enumerate() {
        assert_eq!(
            (c.wr_id, c.status, c.byte_len),
            (i as u64, WcStatus::Success, 1)
        );
        assert_eq!(b.mr.read_vec(i * 64..i * 64 + 1).unwrap()[0], b"xyz"[i]);
    }
}

/// Initiator depth, as on hardware: with `max_rd_atomic` 1, only one RDMA READ is on the wire
/// at a time; the next waits in the send queue (it does not fail) and goes when the first is
/// answered. (TCP only: an in-process READ completes within its post.)
#[test]
fn read_depth_limits_reads_on_the_wire() {
    let o = Opts {
        read_depth: 1,
        mr_len: 8192,
        ..Opts::default()
    };
    let (mut a, b) = pair(SoftFabric::Tcp, &o);
    let net = Net::new(&[&a.cq, &b.cq]);
    b.mr.write_at(4096, &[1, 2, 3, 4, 5, 6]).unwrap();
    // A WRITE first, so the data connection is up before the READs are posted.
    a.qp.post_send(&[send_wr(
        9,
        SendOp::RdmaWrite {
            remote_addr: b.mr.addr(),
            rkey: b.mr.rkey(),
        },
        &[a.mr.sge(0, 8)],
        SendFlags::SIGNALED,
    )])
    .unwrap();
    assert_eq!(net.wait(&a.cq, 1)[0].status, WcStatus::Success);
    let reads: Vec<_> = (0..3u64)
        .map(|i| {
            send_wr(
                i,
                SendOp::RdmaRead {
                    remote_addr: b.mr.addr() + 4096 + 2 * i,
                    rkey: b.mr.rkey(),
                },
                &[],
                SendFlags::SIGNALED,
            )
        })
        .collect();
    let sges: Vec<[Sge; 1]> = (0..3).map(|i| [a.mr.sge(100 + 10 * i, 2)]).collect();
    let reads: Vec<SendWr<'_>> = reads
        .iter()
        .zip(&sges)
        .map(|(w, s)| SendWr { sges: s, ..*w })
        .collect();
    a.qp.post_send(&reads).unwrap();
    // Nothing was polled since: no response can have been handled yet.
    assert_eq!(
        a.qp.sh.reads_in_flight(),
        1,
        "READs beyond the initiator depth sent"
    );
    let c = net.wait(&a.cq, 3);
    assert!(
        c.iter()
            .enumerate()
            .all(|(i, c)| c.wr_id == i as u64 && c.status == WcStatus::Success),
        "{c:?}"
    );
    for i in 0..3 {
        let at = 100 + 10 * i;
        assert_eq!(
            a.mr.read_vec(at..at + 2).unwrap(),
            [2 * i as u8 + 1, 2 * i as u8 + 2]
        );
    }
}

/// A reset QP's send queue starts empty: a completion of its earlier life, still in the CQ and
/// polled after the reset, frees none of the new queue's slots (nor underflows its count).
#[test]
fn a_completion_polled_after_a_reset_frees_nothing_of_the_new_queue() {
    let o = Opts {
        send_wr: 2,
        ..Opts::default()
    };
    let (mut a, mut b) = pair(SoftFabric::InProcess, &o);
    let source = [a.mr.sge(0, 8)];
    let op = SendOp::RdmaWrite {
        remote_addr: b.mr.addr(),
        rkey: b.mr.rkey(),
    };
    let write = |wr_id, flags| send_wr(wr_id, op, &source, flags);
    // In-process, the WRITE completes inside the post; it is left in the CQ.
    a.qp.post_send(&[write(1, SendFlags::SIGNALED)]).unwrap();
    a.qp.modify_to_reset().unwrap();
    b.qp.modify_to_reset().unwrap();
    connect(&mut a.qp, &mut b.qp, &o);
    let mut wcs = [WorkCompletion::default(); 4];
    assert_eq!(a.cq.poll(&mut wcs).unwrap(), 1);
    assert_eq!((wcs[0].wr_id, wcs[0].status), (1, WcStatus::Success));
    // Unsignaled: both stay outstanding, filling the two-WR queue; a third does not fit.
    a.qp.post_send(&[write(2, SendFlags::empty()), write(3, SendFlags::empty())])
        .unwrap();
    let refused = a.qp.post_send(&[write(4, SendFlags::empty())]).unwrap_err();
    assert!(
        matches!(refused.error, crate::TransportError::QueueFull(_)),
        "{refused:?}"
    );
}

/// RC completes a send queue in order, also into ERR: a WR posted after the QP entered ERR
/// completes after the sends still stalled on it, even when the thread that moved it to ERR
/// found its lock taken and left their flush to the next progress (a peer's delivery failing
/// moves a QP to ERR that way, from the peer's thread). The target's drain marker relies on
/// it: its completion says every WR posted before it is done.
#[test]
fn a_send_posted_in_err_completes_after_the_stalled_ones() {
    let o = Opts {
        rnr_retry: 7,
        min_rnr_timer: 1,
        ..Opts::default()
    };
    let (mut a, b) = pair(SoftFabric::InProcess, &o);
    // No receive at b: the SEND stalls (RNR, for ever).
    a.qp.post_send(&[send_wr(
        1,
        SendOp::Send,
        &[a.mr.sge(0, 8)],
        SendFlags::SIGNALED,
    )])
    .unwrap();
    let net = Net::new(&[&a.cq, &b.cq]);
    assert!(net.settle(&a.cq, Duration::from_millis(20)).is_empty());
    {
        // Another thread holds the QP's lock (its progress) while the QP enters ERR.
        let _busy = a.qp.sh.lock();
        a.qp.sh.enter_err(false);
    }
    a.qp.post_send(&[send_wr(2, SendOp::Send, &[], SendFlags::SIGNALED)])
        .unwrap();
    let c = net.wait(&a.cq, 2);
    assert_eq!(
        [(c[0].wr_id, c[0].status), (c[1].wr_id, c[1].status)],
        [(1, WcStatus::WrFlushErr), (2, WcStatus::WrFlushErr)],
        "completions out of post order"
    );
}
