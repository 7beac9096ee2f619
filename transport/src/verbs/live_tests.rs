//! Live tests against a real verbs device (Soft-RoCE in the QEMU lab guest:
//! scripts/interop.sh verbs). Each one is `#[ignore]`d, so the build host reports it
//! as skipped; the lab runs them with `--include-ignored`, and there a missing device fails. The address the device serves comes from
//! `NVMF_LAB_IP` (default 10.10.0.1, the guest's).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use super::*;
use crate::provider::*;
use crate::types::*;

const T: Duration = Duration::from_secs(20);

fn lab_ip() -> Ipv4Addr {
    std::env::var("NVMF_LAB_IP")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(Ipv4Addr::new(10, 10, 0, 1))
}

/// Why every live test is ignored outside the lab.
macro_rules! needs_device {
    () => {
        "needs an RDMA device: run in the QEMU lab (scripts/interop.sh verbs)"
    };
}

/// The first verbs device. These tests are `#[ignore]`d, so they run only when asked
/// (`--include-ignored` in the lab): there a missing device is a failure, not a skip.
fn device(test: &str) -> VerbsContext {
    let devs = Verbs::devices().unwrap();
    let Some(d) = devs.first() else {
        panic!("{test}: no verbs device (Verbs::devices() is empty); it must run where one exists");
    };
    Verbs::open(&d.name).unwrap()
}

fn poll_n(cq: &VerbsCq, n: usize) -> Vec<WorkCompletion> {
    let mut out = Vec::new();
    let mut buf = [WorkCompletion::default(); 16];
    let start = Instant::now();
    while out.len() < n {
        let k = cq.poll(&mut buf).unwrap();
        out.extend_from_slice(&buf[..k]);
        if k == 0 {
            assert!(
                start.elapsed() < T,
                "timed out: {} of {n} completions: {out:?}",
                out.len()
            );
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    out
}

fn is_nonblocking(fd: std::os::fd::RawFd) -> bool {
    // SAFETY: F_GETFL on a live fd; no memory is passed.
    let fl = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    fl >= 0 && fl & libc::O_NONBLOCK != 0
}

fn assert_quiet(cq: &VerbsCq) {
    let mut buf = [WorkCompletion::default(); 4];
    assert_eq!(
        cq.poll(&mut buf).unwrap(),
        0,
        "unexpected completion {:?}",
        buf[0]
    );
}

const ALL: Access = Access::LOCAL_WRITE
    .union(Access::REMOTE_READ)
    .union(Access::REMOTE_WRITE);

fn caps() -> QpCaps {
    QpCaps {
        max_send_wr: 64,
        max_recv_wr: 64,
        max_send_sge: 2,
        max_recv_sge: 2,
        max_inline_data: 64,
    }
}

fn new_qp(pd: &VerbsPd, cq: &VerbsCq, srq: Option<&VerbsSrq>) -> VerbsQp {
    pd.create_qp(&QpInit {
        send_cq: cq,
        recv_cq: cq,
        srq,
        caps: caps(),
        sq_sig_all: false,
    })
    .unwrap()
}

/// Bring `a` and `b` (same device, port 1) to RTS against each other.
fn connect(ctx: &VerbsContext, a: &mut VerbsQp, b: &mut VerbsQp, gidx: u8) {
    let mtu = ctx.query_port(1).unwrap().active_mtu;
    let ea = a.endpoint(1, gidx, 0x1111).unwrap();
    let eb = b.endpoint(1, gidx, 0x2222).unwrap();
    for (qp, remote, own_psn) in [(&mut *a, eb, ea.psn), (&mut *b, ea, eb.psn)] {
        qp.modify_to_init(1, ALL).unwrap();
        assert_eq!(qp.state(), QpState::Init);
        qp.modify_to_rtr(&RtrAttr {
            remote,
            port_num: 1,
            sgid_index: gidx,
            path_mtu: mtu,
            max_dest_rd_atomic: 4,
            min_rnr_timer: 12,
        })
        .unwrap();
        qp.modify_to_rts(&RtsAttr {
            sq_psn: own_psn,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            max_rd_atomic: 4,
        })
        .unwrap();
        assert_eq!(qp.state(), QpState::Rts);
    }
}

struct Pair {
    ctx: VerbsContext,
    pd: VerbsPd,
    cq_a: VerbsCq,
    cq_b: VerbsCq,
    a: VerbsQp,
    b: VerbsQp,
}

fn pair(ctx: &VerbsContext) -> Pair {
    let gidx = ctx.gid_index_for(1, lab_ip().into()).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq_a = ctx.create_cq(256, None).unwrap();
    let cq_b = ctx.create_cq(256, None).unwrap();
    let mut a = new_qp(&pd, &cq_a, None);
    let mut b = new_qp(&pd, &cq_b, None);
    connect(ctx, &mut a, &mut b, gidx);
    Pair {
        ctx: ctx.clone(),
        pd,
        cq_a,
        cq_b,
        a,
        b,
    }
}

fn send(wr_id: u64, op: SendOp, sges: &[Sge], flags: SendFlags) -> SendWr<'_> {
    SendWr {
        wr_id,
        op,
        sges,
        flags: flags | SendFlags::SIGNALED,
    }
}

#[test]
#[ignore = needs_device!()]
fn verbs_live_device_port_gids() {
    let ctx = device("verbs_live_device_port_gids");
    let d = ctx.query_device().unwrap();
    println!("device {}: {d:#?}", ctx.name());
    assert!(d.max_qp > 0 && d.max_qp_wr > 0 && d.max_sge > 0 && d.max_srq_wr > 0);
    assert!(d.max_qp_rd_atom > 0 && d.max_qp_init_rd_atom > 0);
    // The poll group sizes its RDMA READs by it (rxe: 32 of 32).
    assert!(d.max_sge_rd > 0 && d.max_sge_rd <= d.max_sge, "{d:?}");
    assert!(d.phys_port_cnt >= 1);
    if ctx.name().starts_with("rxe") {
        assert!(
            !d.raises_last_wqe_reached,
            "rxe never raises LAST_WQE_REACHED"
        );
        assert!(d.cap_flags.contains(DeviceCapFlags::MEM_MGT_EXTENSIONS));
    }
    let p = ctx.query_port(1).unwrap();
    println!("port 1: {p:?}");
    assert_eq!(p.state, PortState::Active);
    assert_eq!(p.link_layer, LinkLayer::Ethernet);
    assert!(p.gid_tbl_len > 0);
    let t0 = Instant::now();
    let table = ctx.gid_table(1).unwrap();
    println!(
        "GID table ({} entries, read in {:?}):",
        table.len(),
        t0.elapsed()
    );
    for e in &table {
        println!(
            "  [{}] {} {:?} {:?} ipv4={:?}",
            e.index,
            e.gid,
            e.gid_type,
            e.netdev,
            e.gid.to_ipv4()
        );
        assert!(!e.gid.is_zero());
        assert!(e.index < p.gid_tbl_len);
    }
    let idx = ctx.gid_index_for(1, lab_ip().into()).unwrap();
    let e = table.iter().find(|e| e.index == u32::from(idx)).unwrap();
    assert_eq!(e.gid_type, GidType::RoceV2);
    assert_eq!(e.gid.to_ipv4(), Some(lab_ip()));
    println!("RoCE v2 GID index for {}: {idx}", lab_ip());
    let err = ctx
        .gid_index_for(1, IpAddr::V4(Ipv4Addr::new(192, 0, 2, 99)))
        .unwrap_err();
    assert!(matches!(err, TransportError::NoGidForAddress { .. }));
    println!("wrong address: {err}");
    // devices() lists it; opening again shares the context
    assert!(
        Verbs::devices()
            .unwrap()
            .iter()
            .any(|x| x.name == ctx.name())
    );
    assert!(Verbs::open(ctx.name()).unwrap().same_device(&ctx));
    assert!(matches!(
        Verbs::open("nope0"),
        Err(TransportError::NoDevice(_))
    ));
    // nothing pending on a quiet device
    assert!(ctx.poll_async_event().unwrap().is_none());
}

#[test]
#[ignore = needs_device!()]
fn verbs_live_mr_and_errors() {
    let ctx = device("verbs_live_mr_and_errors");
    let pd = ctx.alloc_pd().unwrap();
    let mr = pd.alloc_mr(3 * 4096 + 1, ALL).unwrap();
    assert_eq!(mr.addr() % 4096, 0);
    assert_eq!(mr.len(), 3 * 4096 + 1);
    assert!(mr.read_vec(0..mr.len()).unwrap().iter().all(|&b| b == 0));
    mr.write_at(0, &[7]).unwrap();
    assert_ne!(mr.lkey(), 0);
    let boxed = pd
        .reg_mr_owned(vec![5u8; 100].into_boxed_slice(), Access::LOCAL_WRITE)
        .unwrap();
    assert_eq!(boxed.read_vec(99..100).unwrap(), [5]);
    assert!(matches!(
        pd.alloc_mr(16, Access::REMOTE_WRITE),
        Err(TransportError::InvalidArgument(_))
    ));
    assert!(pd.alloc_mr(0, ALL).is_err());
    // a QP the device cannot give: error, nothing leaked, the PD still works
    let cq = ctx.create_cq(16, None).unwrap();
    let huge = QpCaps {
        max_send_wr: 1 << 30,
        ..caps()
    };
    let err = pd
        .create_qp(&QpInit {
            send_cq: &cq,
            recv_cq: &cq,
            srq: None,
            caps: huge,
            sq_sig_all: false,
        })
        .unwrap_err();
    println!("oversized QP: {err}");
    let srq_err = pd
        .create_srq(&SrqInit {
            max_wr: 1 << 30,
            max_sge: 1,
            limit: 0,
        })
        .unwrap_err();
    println!("oversized SRQ: {srq_err}");
    // RTR with an empty source GID index fails and names the index used
    let mut q1 = new_qp(&pd, &cq, None);
    let q2 = new_qp(&pd, &cq, None);
    let gidx = ctx.gid_index_for(1, lab_ip().into()).unwrap();
    let remote = q2.endpoint(1, gidx, 1).unwrap();
    q1.modify_to_init(1, ALL).unwrap();
    let bad = RtrAttr {
        remote,
        port_num: 1,
        sgid_index: 7,
        path_mtu: Mtu::Mtu1024,
        max_dest_rd_atomic: 1,
        min_rnr_timer: 12,
    };
    let err = q1.modify_to_rtr(&bad).unwrap_err();
    println!("RTR with GID index 7: {err}");
    assert!(err.to_string().contains("GID index 7"), "{err}");
    assert!(
        q2.endpoint(1, 7, 1).is_err(),
        "an empty GID index has no endpoint"
    );
    drop((q1, q2));
    // dependents outlive the handles they were made from: drop the PD and CQ handles first
    let qp = new_qp(&pd, &cq, None);
    drop(pd);
    drop(cq);
    drop(ctx);
    assert!(qp.qp_num() > 0);
    drop(qp);
    drop(mr);
    drop(boxed);
}

#[test]
#[ignore = needs_device!()]
fn verbs_live_send_recv_inline_imm() {
    let ctx = device("verbs_live_send_recv_inline_imm");
    let mut p = pair(&ctx);
    let ma = p.pd.alloc_mr(8192, ALL).unwrap();
    let mb = p.pd.alloc_mr(8192, ALL).unwrap();
    // b posts receives (a list of 3)
    let r: Vec<Sge> = (0..3).map(|i| mb.sge(i * 1024, 1024)).collect();
    let rwrs: Vec<RecvWr<'_>> = (0..3)
        .map(|i| RecvWr {
            wr_id: 100 + i as u64,
            sges: &r[i..i + 1],
        })
        .collect();
    p.b.post_recv(&rwrs).unwrap();
    ma.write_at(0, b"hello").unwrap();
    ma.write_at(5, b"world").unwrap();
    let s1 = [ma.sge(0, 5)];
    let s2 = [ma.sge(5, 5)];
    p.a.post_send(&[
        send(1, SendOp::Send, &s1, SendFlags::empty()),
        send(
            2,
            SendOp::SendWithImm { imm: 0xdead_beef },
            &s2,
            SendFlags::empty(),
        ),
        send(3, SendOp::Send, &s1, SendFlags::INLINE),
    ])
    .unwrap();
    let sc = poll_n(&p.cq_a, 3);
    for (i, c) in sc.iter().enumerate() {
        assert_eq!(c.status, WcStatus::Success, "{c:?}");
        assert_eq!(c.opcode, WcOpcode::Send);
        assert_eq!(c.wr_id, 1 + i as u64);
        assert_eq!(c.qp_num, p.a.qp_num());
    }
    let rc = poll_n(&p.cq_b, 3);
    assert_eq!(
        rc.iter().map(|c| c.wr_id).collect::<Vec<_>>(),
        [100, 101, 102]
    );
    for c in &rc {
        assert_eq!(c.status, WcStatus::Success);
        assert_eq!(c.opcode, WcOpcode::Recv);
        assert_eq!(c.byte_len, 5);
        assert_eq!(c.qp_num, p.b.qp_num());
        // src_qp is defined for UD only (rxe leaves it 0 on RC)
    }
    assert_eq!(rc[0].imm_data, None);
    assert_eq!(rc[1].imm_data, Some(0xdead_beef));
    assert_eq!(&mb.read_vec(0..5).unwrap()[..], b"hello");
    assert_eq!(&mb.read_vec(1024..1029).unwrap()[..], b"world");
    assert_eq!(&mb.read_vec(2048..2053).unwrap()[..], b"hello");
    // unsignaled sends complete silently; a signaled one after them reports
    p.b.post_recv(&rwrs[..2]).unwrap();
    p.a.post_send(&[SendWr {
        wr_id: 9,
        op: SendOp::Send,
        sges: &s1,
        flags: SendFlags::empty(),
    }])
    .unwrap();
    p.a.post_send(&[send(10, SendOp::Send, &s1, SendFlags::empty())])
        .unwrap();
    let sc = poll_n(&p.cq_a, 1);
    assert_eq!(sc[0].wr_id, 10);
    poll_n(&p.cq_b, 2);
    assert_quiet(&p.cq_a);
    // a long list goes out in several chunks
    let many: Vec<RecvWr<'_>> = (0..40)
        .map(|i| RecvWr {
            wr_id: 1000 + i,
            sges: &r[..1],
        })
        .collect();
    p.b.post_recv(&many).unwrap();
    let sends: Vec<SendWr<'_>> = (0..40)
        .map(|i| send(2000 + i, SendOp::Send, &s1, SendFlags::empty()))
        .collect();
    p.a.post_send(&sends).unwrap();
    let sc = poll_n(&p.cq_a, 40);
    assert!(sc.iter().all(|c| c.status == WcStatus::Success));
    assert_eq!(
        sc.iter().map(|c| c.wr_id).collect::<Vec<_>>(),
        (2000..2040).collect::<Vec<_>>()
    );
    let rc = poll_n(&p.cq_b, 40);
    assert_eq!(
        rc.iter().map(|c| c.wr_id).collect::<Vec<_>>(),
        (1000..1040).collect::<Vec<_>>()
    );
    let _ = &p.ctx;
}

#[test]
#[ignore = needs_device!()]
fn verbs_live_rdma_write_read_and_bad_rkey() {
    let ctx = device("verbs_live_rdma_write_read_and_bad_rkey");
    let mut p = pair(&ctx);
    let local = p.pd.alloc_mr(4096, ALL).unwrap();
    let remote = p.pd.alloc_mr(4096, ALL).unwrap();
    local.write_at(0, b"WRIT").unwrap();
    remote.write_at(100, b"READ").unwrap();
    let w = [local.sge(0, 4)];
    let rd = [local.sge(200, 4)];
    let (raddr, rkey) = (remote.addr(), remote.rkey());
    p.a.post_send(&[
        send(
            1,
            SendOp::RdmaWrite {
                remote_addr: raddr + 10,
                rkey,
            },
            &w,
            SendFlags::empty(),
        ),
        send(
            2,
            SendOp::RdmaRead {
                remote_addr: raddr + 100,
                rkey,
            },
            &rd,
            SendFlags::empty(),
        ),
    ])
    .unwrap();
    let c = poll_n(&p.cq_a, 2);
    assert_eq!(
        (c[0].status, c[0].opcode),
        (WcStatus::Success, WcOpcode::RdmaWrite),
        "{c:?}"
    );
    assert_eq!(
        (c[1].status, c[1].opcode),
        (WcStatus::Success, WcOpcode::RdmaRead),
        "{c:?}"
    );
    assert_eq!(c[1].byte_len, 4);
    assert_eq!(&remote.read_vec(10..14).unwrap()[..], b"WRIT");
    assert_eq!(&local.read_vec(200..204).unwrap()[..], b"READ");
    assert_quiet(&p.cq_b); // plain RDMA is invisible to the target
    // WRITE_WITH_IMM consumes a receive and carries the immediate
    let rs = [remote.sge(2048, 16)];
    p.b.post_recv(&[RecvWr {
        wr_id: 77,
        sges: &rs,
    }])
    .unwrap();
    p.a.post_send(&[send(
        3,
        SendOp::RdmaWriteWithImm {
            remote_addr: raddr + 20,
            rkey,
            imm: 42,
        },
        &w,
        SendFlags::empty(),
    )])
    .unwrap();
    assert_eq!(poll_n(&p.cq_a, 1)[0].status, WcStatus::Success);
    let rc = poll_n(&p.cq_b, 1);
    assert_eq!(
        (rc[0].wr_id, rc[0].opcode, rc[0].imm_data),
        (77, WcOpcode::RecvRdmaWithImm, Some(42))
    );
    assert_eq!(&remote.read_vec(20..24).unwrap()[..], b"WRIT");
    // a bad rkey: remote access error, then the QP is in error and later WRs flush
    p.a.post_send(&[
        send(
            4,
            SendOp::RdmaWrite {
                remote_addr: raddr,
                rkey: rkey ^ 0x5a5a_0000,
            },
            &w,
            SendFlags::empty(),
        ),
        send(
            5,
            SendOp::RdmaRead {
                remote_addr: raddr,
                rkey,
            },
            &rd,
            SendFlags::empty(),
        ),
    ])
    .unwrap();
    let c = poll_n(&p.cq_a, 2);
    println!("bad rkey completions: {c:?}");
    assert_eq!((c[0].wr_id, c[0].status), (4, WcStatus::RemAccessErr));
    assert_eq!((c[1].wr_id, c[1].status), (5, WcStatus::WrFlushErr));
    assert_eq!(p.a.state(), QpState::Err);
    // a bad rkey on READ, on a fresh pair
    let mut p2 = pair(&ctx);
    let (l2, r2) = (
        p2.pd.alloc_mr(64, ALL).unwrap(),
        p2.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap(),
    );
    let s = [l2.sge(0, 8)];
    // r2 grants no remote access: a READ with its rkey must fail
    p2.a.post_send(&[send(
        6,
        SendOp::RdmaRead {
            remote_addr: r2.addr(),
            rkey: r2.rkey(),
        },
        &s,
        SendFlags::empty(),
    )])
    .unwrap();
    let c = poll_n(&p2.cq_a, 1);
    println!("read without REMOTE_READ: {c:?}");
    assert_eq!(c[0].status, WcStatus::RemAccessErr);
    // async events are drained and acknowledged (rxe may or may not raise any here)
    while let Some(ev) = ctx.poll_async_event().unwrap() {
        println!("async event: {ev:?}");
    }
}

#[test]
#[ignore = needs_device!()]
fn verbs_live_srq_shared_and_flush() {
    let ctx = device("verbs_live_srq_shared_and_flush");
    let gidx = ctx.gid_index_for(1, lab_ip().into()).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let srq = pd
        .create_srq(&SrqInit {
            max_wr: 64,
            max_sge: 1,
            limit: 0,
        })
        .unwrap();
    assert!(srq.max_wr() >= 64);
    let tcq = ctx.create_cq(256, None).unwrap();
    let icq = ctx.create_cq(256, None).unwrap();
    let buf = pd.alloc_mr(64 * 256, ALL).unwrap();
    let sges: Vec<Sge> = (0..64).map(|i| buf.sge(i * 256, 256)).collect();
    let rwrs: Vec<RecvWr<'_>> = (0..16)
        .map(|i| RecvWr {
            wr_id: i as u64,
            sges: &sges[i..i + 1],
        })
        .collect();
    srq.post_recv(&rwrs).unwrap();
    // three target QPs on one SRQ and CQ, each connected to its own initiator QP
    let mut targets = Vec::new();
    let mut inits = Vec::new();
    for _ in 0..3 {
        let mut t = new_qp(&pd, &tcq, Some(&srq));
        let mut i = new_qp(&pd, &icq, None);
        connect(&ctx, &mut i, &mut t, gidx);
        targets.push(t);
        inits.push(i);
    }
    // an SRQ-attached QP refuses its own receives
    assert!(targets[0].post_recv(&rwrs[..1]).is_err());
    // initiator k sends the byte k: the receive's qp_num must name target k
    let msg = pd.alloc_mr(64, ALL).unwrap();
    for k in 0..3 {
        msg.write_at(k * 8, &[k as u8]).unwrap();
    }
    for (k, i) in inits.iter_mut().enumerate() {
        let s = [msg.sge(k * 8, 8)];
        for j in 0..2 {
            i.post_send(&[send(
                (k * 10 + j) as u64,
                SendOp::Send,
                &s,
                SendFlags::empty(),
            )])
            .unwrap();
        }
    }
    poll_n(&icq, 6)
        .iter()
        .for_each(|c| assert_eq!(c.status, WcStatus::Success));
    let rc = poll_n(&tcq, 6);
    for t in &targets {
        let n = rc.iter().filter(|c| c.qp_num == t.qp_num()).count();
        assert_eq!(
            n,
            2,
            "qp {} got {n} of the SRQ receives: {rc:?}",
            t.qp_num()
        );
    }
    let mut ids: Vec<u64> = rc.iter().map(|c| c.wr_id).collect();
    ids.sort();
    assert_eq!(
        ids,
        (0..6).collect::<Vec<_>>(),
        "each SRQ receive used once"
    );
    for c in &rc {
        assert_eq!(c.status, WcStatus::Success);
        let k = targets
            .iter()
            .position(|t| t.qp_num() == c.qp_num)
            .expect("qp_num names a target");
        let sent_by = buf
            .read_vec(c.wr_id as usize * 256..c.wr_id as usize * 256 + 1)
            .unwrap()[0];
        assert_eq!(
            usize::from(sent_by),
            k,
            "receive {} on target {k} came from initiator {sent_by}",
            c.wr_id
        );
    }
    let s = [msg.sge(0, 8)];
    // SRQ limit: arm at 8 with 10 left, consume 3 -> SRQ_LIMIT_REACHED for this SRQ
    srq.set_limit(8).unwrap();
    for j in 0..3 {
        inits[0]
            .post_send(&[send(100 + j, SendOp::Send, &s, SendFlags::empty())])
            .unwrap();
    }
    poll_n(&icq, 3);
    poll_n(&tcq, 3);
    let start = Instant::now();
    let mut limit_seen = false;
    while start.elapsed() < Duration::from_secs(5) && !limit_seen {
        match ctx.poll_async_event().unwrap() {
            Some(AsyncEvent {
                kind: AsyncEventKind::SrqLimitReached { srq_id },
            }) => {
                assert_eq!(srq_id, srq.id());
                limit_seen = true;
            }
            Some(other) => println!("async event: {other:?}"),
            None => std::thread::sleep(Duration::from_millis(5)),
        }
    }
    assert!(limit_seen, "no SRQ_LIMIT_REACHED");
    println!("SRQ_LIMIT_REACHED for srq {} seen", srq.id());
    // flush: a plain QP's posted receives complete with WR_FLUSH_ERR on ERR
    let fcq = ctx.create_cq(64, None).unwrap();
    let mut f = new_qp(&pd, &fcq, None);
    f.modify_to_init(1, ALL).unwrap();
    let fr: Vec<RecvWr<'_>> = (0..5)
        .map(|i| RecvWr {
            wr_id: 500 + i,
            sges: &sges[40..41],
        })
        .collect();
    f.post_recv(&fr).unwrap();
    f.modify_to_err().unwrap();
    assert_eq!(f.state(), QpState::Err);
    let c = poll_n(&fcq, 5);
    assert!(
        c.iter()
            .all(|c| c.status == WcStatus::WrFlushErr && c.qp_num == f.qp_num()),
        "{c:?}"
    );
    assert_eq!(
        c.iter().map(|c| c.wr_id).collect::<Vec<_>>(),
        (500..505).collect::<Vec<_>>()
    );
    // an SRQ QP to ERR: rxe raises no LAST_WQE_REACHED (the reason for the fallback)
    targets[1].modify_to_err().unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let mut last_wqe = false;
    while let Some(ev) = ctx.poll_async_event().unwrap() {
        println!("async event after SRQ QP -> ERR: {ev:?}");
        last_wqe |= matches!(ev.kind, AsyncEventKind::QpLastWqeReached { .. });
    }
    let d = ctx.query_device().unwrap();
    println!(
        "LAST_WQE_REACHED seen: {last_wqe}; device says raises_last_wqe_reached={}",
        d.raises_last_wqe_reached
    );
    if !d.raises_last_wqe_reached {
        assert!(!last_wqe);
    }
    // back to RESET works too
    f.modify_to_reset().unwrap();
    assert_eq!(f.state(), QpState::Reset);
}

#[test]
#[ignore = needs_device!()]
fn verbs_live_comp_channel_wakeup() {
    let ctx = device("verbs_live_comp_channel_wakeup");
    let gidx = ctx.gid_index_for(1, lab_ip().into()).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let ch = ctx.create_comp_channel().unwrap();
    let rcq = ctx.create_cq(64, Some(&ch)).unwrap();
    let scq = ctx.create_cq(64, None).unwrap();
    let mut a = new_qp(&pd, &scq, None);
    let mut b = pd
        .create_qp(&QpInit {
            send_cq: &scq,
            recv_cq: &rcq,
            srq: None,
            caps: caps(),
            sq_sig_all: true,
        })
        .unwrap();
    connect(&ctx, &mut a, &mut b, gidx);
    // the fd is non-blocking: nothing pending is None, not a hang
    assert_eq!(ch.get_event().unwrap(), None);
    let fd = ch.fd();
    assert!(is_nonblocking(fd));
    rcq.req_notify(false).unwrap();
    let mr = pd.alloc_mr(64, ALL).unwrap();
    let s = [mr.sge(0, 8)];
    b.post_recv(&[RecvWr { wr_id: 1, sges: &s }]).unwrap();
    let sender = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        a.post_send(&[send(2, SendOp::Send, &s, SendFlags::empty())])
            .unwrap();
        a
    });
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let t0 = Instant::now();
    // SAFETY: one valid pollfd.
    let n = unsafe { libc::poll(&mut pfd, 1, 20_000) };
    println!(
        "comp channel woke after {:?} (poll returned {n})",
        t0.elapsed()
    );
    assert_eq!(n, 1);
    assert_eq!(ch.get_event().unwrap(), Some(rcq.id()));
    assert_eq!(ch.get_event().unwrap(), None);
    let c = poll_n(&rcq, 1);
    assert_eq!((c[0].wr_id, c[0].status), (1, WcStatus::Success));
    let a = sender.join().unwrap();
    poll_n(&scq, 1);
    // async fd is non-blocking as well
    let afd = ctx.async_fd();
    assert!(is_nonblocking(afd));
    drop(ch); // the CQ keeps its channel alive
    rcq.req_notify(true).unwrap();
    drop((a, b));
}

fn wait_cm(ch: &VerbsCmChannel, what: &str) -> CmEvent<Verbs> {
    let start = Instant::now();
    loop {
        if let Some(ev) = ch.poll_event().unwrap() {
            println!("CM event ({what}): token {} {:?}", ev.token, ev.kind);
            return ev;
        }
        assert!(start.elapsed() < T, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

struct CmSide {
    id: VerbsCmId,
    qp: VerbsQp,
    cq: VerbsCq,
    pd: VerbsPd,
}

fn cm_side(mut id: VerbsCmId) -> CmSide {
    let ctx = id.context().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64, None).unwrap();
    let qp = id
        .create_qp(
            &pd,
            &QpInit {
                send_cq: &cq,
                recv_cq: &cq,
                srq: None,
                caps: caps(),
                sq_sig_all: true,
            },
        )
        .unwrap();
    CmSide { id, qp, cq, pd }
}

#[test]
#[ignore = needs_device!()]
fn verbs_live_cm_connect_accept_reject_disconnect() {
    let ctx = device("verbs_live_cm_connect_accept_reject_disconnect");
    let ch = Verbs::create_cm_channel().unwrap();
    let fd = ch.fd();
    assert!(is_nonblocking(fd));
    assert!(ch.poll_event().unwrap().is_none());
    let listener = ch
        .listen(SocketAddr::new(lab_ip().into(), 0), 16, 1)
        .unwrap();
    let laddr = listener.local_addr().unwrap();
    println!("listening on {laddr}");
    assert_ne!(laddr.port(), 0);
    assert!(
        listener.context().unwrap().same_device(&ctx),
        "listener bound to the opened device"
    );
    // an address no RDMA device serves
    match ch.listen("127.0.0.1:0".parse().unwrap(), 1, 9) {
        Err(e) => println!("listen on 127.0.0.1: {e}"),
        Ok(_) => println!("listen on 127.0.0.1 succeeded (loopback bound to an RDMA device?)"),
    }

    // --- accept ---
    let cid = ch.resolve(laddr, None, Duration::from_secs(10), 2).unwrap();
    assert_eq!(cid.token(), 2);
    assert!(
        cid.context().unwrap().same_device(&ctx),
        "CM id shares the opened context"
    );
    assert_eq!(cid.port_num(), 1);
    assert_eq!(cid.peer_addr(), Some(laddr));
    let mut client = cm_side(cid);
    // the context a CM QP uses is the opened one, so the CQ could come from there too
    let too_big = ConnParam {
        private_data: vec![0; 57],
        ..ConnParam::default()
    };
    assert!(matches!(
        client.id.connect(&too_big),
        Err(TransportError::InvalidArgument(_))
    ));
    let max_rd = ctx.query_device().unwrap().max_qp_rd_atom.min(255) as u8;
    client
        .id
        .connect(&ConnParam {
            private_data: b"nvmf-connect-request".to_vec(),
            responder_resources: max_rd,
            initiator_depth: 4,
            retry_count: 7,
            rnr_retry_count: 7,
        })
        .unwrap();
    let ev = wait_cm(&ch, "connect request");
    assert_eq!(ev.token, 1, "CONNECT_REQUEST carries the listener's token");
    let CmEventKind::ConnectRequest {
        private_data,
        responder_resources,
        initiator_depth,
        local,
        remote,
    } = ev.kind
    else {
        panic!("expected a connect request")
    };
    assert!(private_data.starts_with(b"nvmf-connect-request"));
    assert_eq!((responder_resources, initiator_depth), (max_rd, 4));
    assert_eq!(local, laddr);
    assert_eq!(remote, client.id.local_addr().unwrap());
    let mut sid = ev.id.expect("new id");
    sid.set_token(3);
    assert!(sid.context().unwrap().same_device(&ctx));
    let mut server = cm_side(sid);
    let rbuf = server.pd.alloc_mr(256, ALL).unwrap();
    let rs = [rbuf.sge(0, 256)];
    server
        .qp
        .post_recv(&[RecvWr {
            wr_id: 9,
            sges: &rs,
        }])
        .unwrap();
    let too_big = ConnParam {
        private_data: vec![0; 197],
        ..ConnParam::default()
    };
    assert!(matches!(
        server.id.accept(&too_big),
        Err(TransportError::InvalidArgument(_))
    ));
    server
        .id
        .accept(&ConnParam {
            private_data: b"accepted".to_vec(),
            responder_resources: 0,
            initiator_depth: 4,
            retry_count: 7,
            rnr_retry_count: 7,
        })
        .unwrap();
    let mut established = 0;
    let mut client_pdata = Vec::new();
    while established < 2 {
        let ev = wait_cm(&ch, "established");
        match ev.kind {
            CmEventKind::Established { private_data } => {
                if ev.token == 2 {
                    client_pdata = private_data;
                } else {
                    assert_eq!(ev.token, 3);
                }
                established += 1;
            }
            k => panic!("unexpected {k:?}"),
        }
    }
    assert!(client_pdata.starts_with(b"accepted"), "{client_pdata:?}");
    assert_eq!(client.qp.state(), QpState::Rts);
    // data over the CM-made connection
    let sbuf = client.pd.alloc_mr(64, ALL).unwrap();
    sbuf.write_at(0, b"ping").unwrap();
    let ss = [sbuf.sge(0, 4)];
    client
        .qp
        .post_send(&[send(1, SendOp::Send, &ss, SendFlags::empty())])
        .unwrap();
    assert_eq!(poll_n(&client.cq, 1)[0].status, WcStatus::Success);
    let rc = poll_n(&server.cq, 1);
    assert_eq!(
        (rc[0].wr_id, rc[0].byte_len, rc[0].qp_num),
        (9, 4, server.qp.qp_num())
    );
    assert_eq!(&rbuf.read_vec(0..4).unwrap()[..], b"ping");

    // --- reject ---
    let rid = ch
        .resolve(
            laddr,
            Some(SocketAddr::new(lab_ip().into(), 0)),
            Duration::from_secs(10),
            4,
        )
        .unwrap();
    let mut rejected = cm_side(rid);
    rejected
        .id
        .connect(&ConnParam {
            private_data: vec![1, 2],
            retry_count: 7,
            rnr_retry_count: 7,
            ..Default::default()
        })
        .unwrap();
    let ev = wait_cm(&ch, "second connect request");
    let mut rq = ev.id.expect("id");
    assert!(matches!(
        rq.reject(&[0; 149]),
        Err(TransportError::InvalidArgument(_))
    ));
    rq.reject(&[0, 0, 6, 0]).unwrap();
    let ev = wait_cm(&ch, "rejected");
    assert_eq!(ev.token, 4);
    match ev.kind {
        CmEventKind::Rejected {
            reason,
            private_data,
        } => {
            println!("rejected: reason {reason}, private data {private_data:?}");
            assert_eq!(reason, 28, "IB CM consumer reject");
            assert!(private_data.starts_with(&[0, 0, 6, 0]));
        }
        k => panic!("expected REJECTED, got {k:?}"),
    }
    drop(rq);

    // --- disconnect ---
    client.id.disconnect().unwrap();
    let mut disc = Vec::new();
    while disc.len() < 2 {
        let ev = wait_cm(&ch, "disconnected");
        match ev.kind {
            CmEventKind::Disconnected => {
                // the passive side answers the peer's DREQ (else the peer waits for a
                // DREP timeout before it sees DISCONNECTED)
                if ev.token == 3 {
                    server.id.disconnect().unwrap();
                }
                disc.push(ev.token)
            }
            CmEventKind::TimewaitExit => {}
            k => panic!("unexpected {k:?}"),
        }
    }
    disc.sort();
    assert_eq!(disc, [2, 3]);
    assert_eq!(client.qp.state(), QpState::Err);
    // the id outlives its QP whatever the order: drop the id handle first
    let CmSide { id, qp, cq, pd } = client;
    drop(id);
    assert!(qp.qp_num() > 0);
    drop(qp);
    drop((cq, pd));
    drop(server);
    drop(rejected);
    // --- unreachable: a connect to a port nobody listens on is rejected or unreachable ---
    let uid = ch
        .resolve(
            SocketAddr::new(lab_ip().into(), 1),
            None,
            Duration::from_secs(10),
            5,
        )
        .unwrap();
    let mut u = cm_side(uid);
    u.id.connect(&ConnParam {
        retry_count: 7,
        rnr_retry_count: 7,
        ..Default::default()
    })
    .unwrap();
    let ev = wait_cm(&ch, "connect to a closed port");
    assert_eq!(ev.token, 5);
    assert!(
        matches!(
            ev.kind,
            CmEventKind::Rejected { .. } | CmEventKind::Unreachable
        ),
        "{:?}",
        ev.kind
    );
    drop(u);
    drop(listener);
    // resolving an address no device serves fails cleanly
    let err = ch
        .resolve(
            "192.0.2.1:4420".parse().unwrap(),
            None,
            Duration::from_millis(500),
            6,
        )
        .unwrap_err();
    println!("resolve 192.0.2.1: {err}");
}

#[test]
#[ignore = needs_device!()]
fn verbs_live_send_with_inv_and_cq_overrun() {
    let ctx = device("verbs_live_send_with_inv_and_cq_overrun");
    // SEND_WITH_INV of an ordinary MR's rkey: the device accepts the opcode; invalidating a
    // key that is not a fast-registration MR or memory window is a remote error on rxe.
    let mut p = pair(&ctx);
    let mr = p.pd.alloc_mr(4096, ALL).unwrap();
    let rs = [mr.sge(0, 64)];
    p.b.post_recv(&[RecvWr {
        wr_id: 1,
        sges: &rs,
    }])
    .unwrap();
    let s = [mr.sge(1024, 16)];
    p.a.post_send(&[send(
        2,
        SendOp::SendWithInv { rkey: mr.rkey() },
        &s,
        SendFlags::empty(),
    )])
    .unwrap();
    let c = poll_n(&p.cq_a, 1);
    println!("SEND_WITH_INV (plain MR rkey): sender {c:?}");
    let mut buf = [WorkCompletion::default(); 4];
    std::thread::sleep(Duration::from_millis(100));
    let n = p.cq_b.poll(&mut buf).unwrap();
    println!("SEND_WITH_INV: receiver {:?}", &buf[..n]);
    for c in &buf[..n] {
        if c.status == WcStatus::Success {
            assert_eq!(c.invalidated_rkey, Some(mr.rkey()));
        }
    }
    // CQ overrun: more completions than the CQ holds -> CQ_ERR naming that CQ
    let gidx = ctx.gid_index_for(1, lab_ip().into()).unwrap();
    let small = ctx.create_cq(4, None).unwrap();
    let big = ctx.create_cq(256, None).unwrap();
    let mut a =
        p.pd.create_qp(&QpInit {
            send_cq: &small,
            recv_cq: &small,
            srq: None,
            caps: caps(),
            sq_sig_all: true,
        })
        .unwrap();
    let mut b = new_qp(&p.pd, &big, None);
    connect(&ctx, &mut a, &mut b, gidx);
    let n = small.depth() as usize + 4;
    println!(
        "small CQ depth {} (asked 4); posting {n} signaled WRITEs",
        small.depth()
    );
    let wrs: Vec<SendWr<'_>> = (0..n as u64)
        .map(|i| {
            send(
                i,
                SendOp::RdmaWrite {
                    remote_addr: mr.addr() + 2048,
                    rkey: mr.rkey(),
                },
                &s,
                SendFlags::empty(),
            )
        })
        .collect();
    a.post_send(&wrs).unwrap();
    let start = Instant::now();
    let mut cq_err = false;
    while start.elapsed() < Duration::from_secs(10) && !cq_err {
        match ctx.poll_async_event().unwrap() {
            Some(ev) => {
                println!("async event: {ev:?}");
                if ev.kind == (AsyncEventKind::CqErr { cq_id: small.id() }) {
                    cq_err = true;
                }
            }
            None => std::thread::sleep(Duration::from_millis(5)),
        }
    }
    assert!(cq_err, "no CQ_ERR for the overrun CQ {}", small.id());
    drop((a, b));
}
