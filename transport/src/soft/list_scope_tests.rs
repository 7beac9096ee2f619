//! What a `post_send` list shares (`ListScope`): pins kept across its WRs must not let a key
//! outlive an invalidation earlier in the list, nor hold up a bind the list itself posts; the
//! receive completions it queues together arrive all, in order, with their solicited events.
//! Run on both fabrics where the behaviour is the verbs contract (TCP has no list scope).

use std::time::Duration;

use super::super::testutil::*;
use super::ListScope;
use crate::provider::*;
use crate::types::*;

// An invalidation earlier in a list failing a later WR of it: `send_with_inv_then_write_in_one_list`
// in qp_tests.rs, beside the same case over two lists.
both_fabrics!(a_long_list_delivers_every_receive_in_order);

/// 40 SENDs in one list (past the 32 completions a scope holds before it queues them): the
/// responder gets 40 receive completions in posting order, each with its own length.
fn a_long_list_delivers_every_receive_in_order(f: SoftFabric) {
    const SENDS: u64 = 40;
    let (mut a, mut b) = pair(f, &Opts::default());
    let net = Net::new(&[&a.cq, &b.cq]);
    let recvs: Vec<_> = (0..SENDS)
        .map(|i| [b.mr.sge(64 * i as usize, 64)])
        .collect();
    for (i, sges) in recvs.iter().enumerate() {
        b.qp.post_recv(&[RecvWr {
            wr_id: 100 + i as u64,
            sges,
        }])
        .unwrap();
    }
    for i in 0..SENDS as usize {
        a.mr.write_at(i, &[i as u8]).unwrap();
    }
    let sges: Vec<_> = (0..SENDS as usize)
        .map(|i| [a.mr.sge(i, 1 + i as u32 % 7)])
        .collect();
    let wrs: Vec<_> = sges
        .iter()
        .enumerate()
        .map(|(i, sge)| send_wr(i as u64, SendOp::Send, sge, SendFlags::SIGNALED))
        .collect();
    a.qp.post_send(&wrs).unwrap();
    let sent = net.wait(&a.cq, SENDS as usize);
    assert!(
        sent.iter().all(|c| c.status == WcStatus::Success),
        "{sent:?}"
    );
    let got = net.wait(&b.cq, SENDS as usize);
    assert_eq!(
        got.iter()
            .map(|c| (c.wr_id, c.status, c.byte_len, c.qp_num))
            .collect::<Vec<_>>(),
        (0..SENDS)
            .map(|i| (100 + i, WcStatus::Success, 1 + i as u32 % 7, b.qp.qp_num()))
            .collect::<Vec<_>>()
    );
    for i in 0..SENDS as usize {
        assert_eq!(b.mr.read_vec(64 * i..64 * i + 1).unwrap(), [i as u8]);
    }
    let events = async_events(&b.ctx);
    assert!(events.is_empty(), "{events:?}");
}

/// A CQ armed for solicited events, fed by long lists: a list with no solicited SEND raises
/// no event; one whose only solicited SEND lies past the first 32 does.
#[test]
fn a_long_list_raises_the_solicited_event_of_the_send_that_asked() {
    const SENDS: usize = 40;
    let o = Opts::default();
    let mut a = side(&device(SoftFabric::InProcess, true), &o);
    let d = device(SoftFabric::InProcess, true);
    let channel = d.create_comp_channel().unwrap();
    let pd = d.alloc_pd().unwrap();
    let cq = d.create_cq(256, Some(&channel)).unwrap();
    let mut b = qp_on(&pd, &cq, &o, false);
    let mr = pd.alloc_mr(64 * SENDS, ALL).unwrap();
    connect(&mut a.qp, &mut b, &o);
    let sge = [a.mr.sge(0, 8)];
    for solicited_index in [None, Some(33)] {
        for i in 0..SENDS {
            b.post_recv(&[RecvWr {
                wr_id: i as u64,
                sges: &[mr.sge(64 * i, 64)],
            }])
            .unwrap();
        }
        cq.req_notify(true).unwrap();
        let wrs: Vec<_> = (0..SENDS)
            .map(|i| {
                let flags = if Some(i) == solicited_index {
                    SendFlags::SIGNALED | SendFlags::SOLICITED
                } else {
                    SendFlags::SIGNALED
                };
                send_wr(i as u64, SendOp::Send, &sge, flags)
            })
            .collect();
        a.qp.post_send(&wrs).unwrap();
        let event = channel.get_event().unwrap();
        assert_eq!(
            event,
            solicited_index.map(|_| cq.id()),
            "solicited SEND at {solicited_index:?}"
        );
        let mut got = [WorkCompletion::default(); SENDS];
        assert_eq!(cq.poll(&mut got).unwrap(), SENDS);
        // Free the send queue for the next round.
        assert_eq!(a.cq.poll(&mut got).unwrap(), SENDS);
    }
}

/// Two QPs of one PD on one device: a list WRITEs through the PD's own window (the list pins
/// it), then invalidates and binds that window again. The bind waits for the window's pins;
/// the list must have given its own back first, or it would wait for itself for ever.
#[test]
fn a_list_rebinds_a_window_it_wrote_through() {
    let d = device(SoftFabric::InProcess, true);
    let o = Opts::default();
    let mut x = side(&d, &o);
    let mut y = qp_on(&x.pd, &x.cq, &o, false);
    connect(&mut x.qp, &mut y, &o);
    let data = x.pd.alloc_mr(256, ALL | Access::MW_BIND).unwrap();
    let mut mw = x.pd.alloc_mw().unwrap();
    let bind = mw.bind(&data, 0, 256, Access::REMOTE_WRITE).unwrap();
    x.qp.post_send(&[send_wr(1, bind, &[], SendFlags::SIGNALED)])
        .unwrap();
    let net = Net::new(&[&x.cq]);
    assert_eq!(net.wait(&x.cq, 1)[0].status, WcStatus::Success);
    let first = mw.rkey();
    let rebind = mw.bind(&data, 128, 128, Access::REMOTE_WRITE).unwrap();
    let second = mw.rkey();
    x.mr.write_at(0, b"window").unwrap();
    let addr = data.addr();
    // On a thread: a list waiting for itself would hang the test instead of failing it.
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let poster = std::thread::spawn(move || {
        let sge = [x.mr.sge(0, 6)];
        let wrs = [
            send_wr(
                2,
                SendOp::RdmaWrite {
                    remote_addr: addr,
                    rkey: first,
                },
                &sge,
                SendFlags::SIGNALED,
            ),
            send_wr(
                3,
                SendOp::LocalInv { rkey: first },
                &[],
                SendFlags::SIGNALED,
            ),
            send_wr(4, rebind, &[], SendFlags::SIGNALED),
            send_wr(
                5,
                SendOp::RdmaWrite {
                    remote_addr: addr + 128,
                    rkey: second,
                },
                &sge,
                SendFlags::SIGNALED,
            ),
        ];
        let result = x.qp.post_send(&wrs);
        done_tx.send(result.is_ok()).unwrap();
        x
    });
    match done_rx.recv_timeout(Duration::from_secs(20)) {
        Ok(posted) => assert!(posted, "post_send failed"),
        Err(_) => {
            // Dropping the window or the region would wait for the stuck list too.
            std::mem::forget(mw);
            std::mem::forget(data);
            panic!("the list's bind waited for the list's own pin");
        }
    }
    let x = poster.join().unwrap();
    let c = net.wait(&x.cq, 4);
    assert_eq!(
        c.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
        [
            (2, WcStatus::Success),
            (3, WcStatus::Success),
            (4, WcStatus::Success),
            (5, WcStatus::Success)
        ]
    );
    assert_eq!(&data.read_vec(0..6).unwrap()[..], b"window");
    assert_eq!(&data.read_vec(128..134).unwrap()[..], b"window");
}

/// The responder enters ERR on its own thread while another thread's list still holds the
/// completion of a receive it consumed: the flush of the receives behind it, and of one posted
/// in ERR meanwhile, waits for the list to queue it, so the receive queue's completions stay
/// in order (verbs orders completions per work queue). Driven step by step through the scope.
#[test]
fn a_flush_waits_for_the_completions_a_list_holds() {
    let (_a, mut b) = pair(SoftFabric::InProcess, &Opts::default());
    let recv = |b: &mut Side, wr_id: u64| {
        let sge = [b.mr.sge(64 * wr_id as usize, 64)];
        b.qp.post_recv(&[RecvWr { wr_id, sges: &sge }]).unwrap();
    };
    for wr_id in 0..3 {
        recv(&mut b, wr_id);
    }
    let shared = b.qp.sh.clone();
    let responder = &*shared;
    let scope = ListScope::new(true);
    scope.hold_delivery(responder);
    let wc = responder
        .pop_recv_with(|wr_id, _| WorkCompletion {
            wr_id,
            qp_num: responder.qp_num(),
            status: WcStatus::Success,
            opcode: WcOpcode::Recv,
            byte_len: 8,
            ..Default::default()
        })
        .unwrap();
    scope.complete_recv(responder, wc, false);
    shared.enter_err(true);
    recv(&mut b, 3);
    let polled = |b: &Side| {
        let mut got = [WorkCompletion::default(); 8];
        let n = b.cq.poll(&mut got).unwrap();
        got[..n]
            .iter()
            .map(|c| (c.wr_id, c.status))
            .collect::<Vec<_>>()
    };
    assert_eq!(polled(&b), []);
    drop(scope);
    assert_eq!(
        polled(&b),
        [
            (0, WcStatus::Success),
            (1, WcStatus::WrFlushErr),
            (2, WcStatus::WrFlushErr),
            (3, WcStatus::WrFlushErr)
        ]
    );
    // In ERR with no delivery running, a receive is flushed as it is posted.
    recv(&mut b, 4);
    assert_eq!(polled(&b), [(4, WcStatus::WrFlushErr)]);
}
