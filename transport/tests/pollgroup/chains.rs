//! Chains under failure and pressure: exact send accounting (drains end by their own
//! condition, never the timeout), backpressure (send-queue slots, RDMA READ depth), aborts that
//! keep buffers until the layer above lets go, a CQ error failing the group, and a
//! LAST_WQE_REACHED for a healthy qpair ignored.

use std::time::Duration;

use nvmf_transport::pollgroup::*;
use nvmf_transport::*;

use crate::fixture::{Flavor, Fx, all_access};
use crate::script::*;

pub fn cfg(qpairs: u32) -> PollGroupConfig {
    PollGroupConfig {
        // Short: a drain that needed it fails the test well inside the patience.
        drain_timeout: Duration::from_secs(5),
        ..crate::harness::config(qpairs)
    }
}

fn shape() -> QpairShape {
    QpairShape {
        depth: 16,
        read_depth: 16,
        rnr_retry: 7,
        send_queue: None,
    }
}

/// One qpair whose host allows no RNR retry: a SEND that finds no receive fails at once.
fn rig_without_rnr_retry(fx: Fx) -> ScriptRig {
    ScriptRig::new(
        fx,
        1,
        cfg(1),
        QpairShape {
            rnr_retry: 0,
            ..shape()
        },
    )
}

fn drained_by_itself(rig: &ScriptRig) {
    let s = rig.pg.stats();
    assert_eq!(s.drained_timeout, 0, "a drain needed its timeout: {s:?}");
    assert_eq!(s.stale_completions, 0, "{s:?}");
}

/// WRITE (unsignaled) succeeds silently, then the SEND fails (the host posted no receive and
/// allows no RNR retry): the one error completion must retire both WRs, so the drain ends by
/// itself.
pub fn write_ok_then_send_fails(flavor: Flavor) {
    let Some(fx) = Fx::open(flavor) else { return };
    let mut rig = rig_without_rnr_retry(fx);
    let qpn = rig.pg_qpn[0];
    assert!(rig.cmd(0, Cmd::new(1, OP_WRITE, 2), false));
    rig.run_until("the qpair to drain and go", |r| r.gone(qpn));
    drained_by_itself(&rig);
    assert_eq!((rig.h.chains_ok, rig.h.chains_failed), (0, 1));
    rig.assert_nothing_leaked();
}

/// A chain of four RDMA READs failing at each position in turn (bad rkey): every WR retired
/// exactly once, the request hears one failed chain, the drain ends by itself.
pub fn read_chain_errors_at_every_position(flavor: Flavor) {
    for bad in 0..4u8 {
        let Some(fx) = Fx::open(flavor) else { return };
        let mut rig = ScriptRig::new(fx, 1, cfg(1), shape());
        let qpn = rig.pg_qpn[0];
        // A good chain first: READs work.
        assert!(rig.cmd(0, Cmd::new(7, OP_READ, 4), true));
        rig.run_until("the good READ chain's answer", |r| r.answers[0] == [7]);
        let cmd = Cmd {
            bad_at: bad,
            ..Cmd::new(8, OP_READ, 4)
        };
        assert!(rig.cmd(0, cmd, true));
        rig.run_until("the qpair to drain and go", |r| r.gone(qpn));
        drained_by_itself(&rig);
        assert_eq!(rig.h.chains_failed, 1, "bad READ at {bad}");
        rig.assert_nothing_leaked();
    }
}

/// A post that hands over only part of a chain (WRITE x3 + SEND, refused from each position):
/// the refused WRs fail without touching the send-queue accounting, the posted unsignaled ones
/// are retired by the drain marker, and the drain ends by itself.
pub fn partially_posted_chain(flavor: Flavor) {
    for after in 0..4usize {
        let Some(fx) = Fx::open(flavor) else { return };
        let mut rig = ScriptRig::new(fx, 1, cfg(1), shape());
        let qpn = rig.pg_qpn[0];
        rig.pg.fail_next_post(qpn, after).unwrap();
        assert!(rig.cmd(0, Cmd::new(1, OP_WRITE, 3), true));
        rig.run_until("the qpair to drain and go", |r| r.gone(qpn));
        drained_by_itself(&rig);
        assert_eq!(rig.h.chains_failed, 1, "refused from {after}");
        rig.assert_nothing_leaked();
    }
}

/// One qpair, `n` commands at once, each answered by `writes` RDMA WRITEs and a SEND: runs
/// until every answer arrived and every chain ended, and checks their order.
fn all_answered(fx: Fx, n: u32, writes: u8) -> ScriptRig {
    let mut rig = ScriptRig::new(fx, 1, cfg(1), shape());
    for seq in 0..n {
        assert!(rig.cmd(0, Cmd::new(seq, OP_WRITE, writes), true));
    }
    rig.run_until("every answer and its chain's end", |r| {
        r.answers[0].len() == n as usize && r.pg.requests_in_use() == 0
    });
    assert_eq!(rig.answers[0], (0..n).collect::<Vec<u32>>());
    assert_eq!(rig.h.chains_ok, u64::from(n), "{:?}", rig.pg.stats());
    rig
}

/// Commands that arrive together are answered as one list: every answer but the last goes
/// without a completion of its own (a silent chain), and the last one's completion retires
/// them all. Where the device delivers the capsules before the group's poll (in-process) the
/// list is exact: 8 answers, 7 silent, one SEND completion.
pub fn answers_of_one_list_share_one_completion(flavor: Flavor) {
    let Some(fx) = Fx::open(flavor) else { return };
    let mut rig = all_answered(fx, 8, 1);
    let qpn = rig.pg_qpn[0];
    let s = rig.pg.stats();
    assert_eq!(
        s.silent_retired, s.silent_chains,
        "a silent chain left: {s:?}"
    );
    // Receives (8) plus one send-side completion per chain that asked for one.
    assert_eq!(s.completions, 8 + 8 - s.silent_chains, "{s:?}");
    if flavor == Flavor::SoftInProcess {
        assert_eq!(s.silent_chains, 7, "one list of 8: {s:?}");
    }
    let (used, _, _, _) = rig.pg.qpair_send_usage(qpn).unwrap();
    assert_eq!(used, 0, "send-queue room given back");
    rig.assert_nothing_leaked();
}

/// More answers than one list holds (12 chains of 3 WRITEs + SEND: 48 WRs, lists of 32): the
/// first list goes with `post_send_more` (the soft TCP fabric writes both lists at once) and
/// every answer arrives, in order. In-process, where the capsules are all there for the
/// group's first poll, the lists are exact: two posts, the first held.
pub fn answers_beyond_one_list_go_with_the_next(flavor: Flavor) {
    let Some(fx) = Fx::open(flavor) else { return };
    let mut rig = all_answered(fx, 12, 3);
    let s = rig.pg.stats();
    assert_eq!(s.send_wrs_posted, 48, "{s:?}");
    if flavor == Flavor::SoftInProcess {
        assert_eq!((s.send_post_calls, s.send_lists_held), (2, 1), "{s:?}");
    }
    rig.assert_nothing_leaked();
}

/// A list of three answers (WRITE + SEND each) whose middle WRITE has a bad rkey: the first
/// answer went silently and is done (the failure's own completion says so), the second fails
/// with its error, the third is flushed; each chain ends once and the drain ends by itself.
pub fn a_failing_silent_chain_reports_itself(flavor: Flavor) {
    let Some(fx) = Fx::open(flavor) else { return };
    let mut rig = rig_without_rnr_retry(fx);
    let qpn = rig.pg_qpn[0];
    assert!(rig.cmd(0, Cmd::new(0, OP_WRITE, 1), true));
    let bad = Cmd {
        bad_at: 0,
        ..Cmd::new(1, OP_WRITE, 1)
    };
    assert!(rig.cmd(0, bad, true));
    assert!(rig.cmd(0, Cmd::new(2, OP_WRITE, 1), true));
    rig.run_until("the qpair to drain and go", |r| r.gone(qpn));
    drained_by_itself(&rig);
    assert_eq!((rig.h.chains_ok, rig.h.chains_failed), (1, 2));
    assert_eq!(rig.answers[0], vec![0], "only the first answer went");
    let s = rig.pg.stats();
    if flavor == Flavor::SoftInProcess {
        // One list: the first two went silent; the first was retired by the second's error.
        assert_eq!((s.silent_chains, s.silent_retired), (2, 1), "{s:?}");
    }
    rig.assert_nothing_leaked();
}

/// A send queue of 6 (5 for chains): 8 commands answered by WRITE x2 + SEND (3 WRs) cannot all
/// be on it at once. They wait and go in FIFO order; nothing fails.
pub fn full_send_queue_waits_in_order(flavor: Flavor) {
    let Some(fx) = Fx::open(flavor) else { return };
    let mut rig = ScriptRig::new(
        fx,
        1,
        cfg(1),
        QpairShape {
            send_queue: Some(6),
            ..shape()
        },
    );
    let qpn = rig.pg_qpn[0];
    for seq in 0..8 {
        assert!(rig.cmd(0, Cmd::new(seq, OP_WRITE, 2), true));
    }
    rig.run_until("every answer and SEND completion", |r| {
        r.answers[0].len() == 8 && r.pg.requests_in_use() == 0
    });
    assert_eq!(rig.answers[0], (0..8).collect::<Vec<u32>>(), "FIFO order");
    let (used, high, _, _) = rig.pg.qpair_send_usage(qpn).unwrap();
    let s = rig.pg.stats();
    assert!(s.post_stalls > 0, "chains had to wait: {s:?}");
    assert!(high <= 5, "send queue high water {high}");
    assert_eq!(used, 0);
    assert_eq!(rig.h.chains_failed, 0);
    assert!(rig.h.events.is_empty(), "{:?}", rig.h.events);
    assert_eq!(rig.sends_failed[0], 0);
    rig.assert_nothing_leaked();
}

/// Read depth 3: chains of 2 and 1 READs never have more than 3 in flight on the qpair.
pub fn read_depth_limit(flavor: Flavor) {
    let Some(fx) = Fx::open(flavor) else { return };
    let mut rig = ScriptRig::new(
        fx,
        1,
        cfg(1),
        QpairShape {
            read_depth: 3,
            ..shape()
        },
    );
    let qpn = rig.pg_qpn[0];
    for seq in 0..12 {
        let count = if seq % 2 == 0 { 2 } else { 1 };
        assert!(rig.cmd(0, Cmd::new(seq, OP_READ, count), true));
    }
    rig.run_until("every answer and SEND completion", |r| {
        r.answers[0].len() == 12 && r.pg.requests_in_use() == 0
    });
    let (_, _, reads, reads_high) = rig.pg.qpair_send_usage(qpn).unwrap();
    assert_eq!(reads, 0);
    assert!(
        (2..=3).contains(&reads_high),
        "READs in flight high water {reads_high}"
    );
    assert!(rig.pg.stats().post_stalls > 0, "{:?}", rig.pg.stats());
    assert_eq!(rig.h.chains_failed, 0);
    rig.assert_nothing_leaked();
}

/// The qpair goes while a request's I/O is in flight: the handler hears `aborted`, the request
/// keeps its buffer (not given to anyone else while other traffic runs) until `finish`.
pub fn abort_keeps_buffers_until_finish(flavor: Flavor) {
    let Some(fx) = Fx::open(flavor) else { return };
    let mut rig = ScriptRig::new(fx, 2, cfg(2), shape());
    rig.h.keep_aborted = true;
    let total = rig.pg.config().data_buffers;
    assert!(rig.cmd(0, Cmd::new(1, OP_HOLD, 0), true));
    rig.run_until("the held request", |r| !r.h.held.is_empty());
    let req = rig.h.held[0];
    rig.pg.buffer_mut(req, 0)[..4096].fill(0xa7);
    let victim = rig.pg_qpn[0];
    rig.pg.destroy_qpair(&mut rig.h, victim);
    assert_eq!(rig.h.kept, vec![req], "the handler heard the abort");
    assert!(rig.pg.request(req).unwrap().aborted());
    assert_eq!(
        rig.pg.buffers_free(),
        total - 1,
        "the buffer is still the request's"
    );
    // Other traffic takes and gives back buffers meanwhile.
    for seq in 0..20 {
        assert!(rig.cmd(1, Cmd::new(seq, OP_WRITE, 1), true));
        rig.run_until("the answer and its SEND completion", |r| {
            r.answers[1].len() == seq as usize + 1 && r.pg.requests_in_use() == 1
        });
    }
    assert_eq!(rig.pg.buffers_free(), total - 1);
    assert!(rig.pg.buffer(req, 0)[..4096].iter().all(|&b| b == 0xa7));
    let chain = [ChainWr {
        op: SendOp::Send,
        sges: &[],
        inline: false,
    }];
    assert!(rig.pg.post_chain(req, &chain, true).is_err());
    // The I/O is over: the layer above lets go.
    rig.pg.finish(req);
    assert_eq!(rig.pg.buffers_free(), total);
    rig.h.ended.insert(req, 1);
    rig.assert_nothing_leaked();
}

/// The group's CQ overruns (the soft CQ raises CQ_ERR): the group fails, the owner is told,
/// every qpair is torn down and its live requests aborted, and the group takes no more work.
pub fn cq_error_fails_the_group(flavor: Flavor) {
    let Some(fx) = Fx::open(flavor) else { return };
    let small = PollGroupConfig {
        srq_depth: 16,
        max_qpairs: 2,
        max_queue_depth: 2,
        max_requests: 4,
        data_buffers: 8,
        ..cfg(1)
    };
    let mut rig = ScriptRig::new(
        fx,
        1,
        small,
        QpairShape {
            depth: 2,
            ..shape()
        },
    );
    let cq_depth = rig.pg.cq().depth();
    assert!(rig.cmd(0, Cmd::new(1, OP_HOLD, 0), true));
    rig.run_until("the held request", |r| !r.h.held.is_empty());
    // Something else on the group's CQ floods it: a QP of the test's own, with every WRITE
    // signaled, while the group is not polled.
    let pd = rig.pg.pd().clone();
    let mut flood = pd
        .create_qp(&QpInitAttr {
            send_cq: rig.pg.cq(),
            recv_cq: rig.pg.cq(),
            srq: rig.pg.srq(),
            caps: QpCaps {
                max_send_wr: 512,
                max_recv_wr: 0,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            sq_sig_all: true,
        })
        .unwrap();
    let host_pd = rig.fx.ctx.alloc_pd().unwrap();
    let peer_cq = rig.fx.cq(64);
    let mut peer = rig.fx.qp(&host_pd, &peer_cq, &peer_cq, None);
    rig.fx.connect(&mut flood, &mut peer, 7);
    let src = pd.alloc_mr(64, all_access()).unwrap();
    let (rkey, addr) = (rig.data.rkey(), rig.data.addr());
    for _ in 0..(cq_depth as usize + 64).min(500) {
        let wr = SendWr {
            wr_id: 0,
            op: SendOp::RdmaWrite {
                remote_addr: addr,
                rkey,
            },
            sges: &[src.sge(0, 8)],
            flags: SendFlags::SIGNALED,
        };
        if flood.post_send(&[wr]).is_err() {
            break;
        }
    }
    // The peer's CQ is polled too (the soft TCP fabric progresses a QP only then).
    let deadline = std::time::Instant::now() + crate::fixture::patience();
    let mut wcs = [WorkCompletion::default(); 64];
    while rig.h.group_failures.is_empty() {
        rig.poll_pg();
        rig.poll_host();
        peer_cq.poll(&mut wcs).unwrap();
        assert!(
            std::time::Instant::now() < deadline,
            "the group never failed: {:?}",
            rig.pg.stats()
        );
    }
    let qpn = rig.pg_qpn[0];
    assert!(rig.pg.failed().is_some());
    assert!(rig.gone(qpn), "{:?}", rig.h.events);
    assert!(
        rig.h
            .events
            .contains(&(qpn, QpairEvent::Gone { forced: true }))
    );
    assert_eq!(rig.h.aborted, 1, "the live request was aborted");
    assert_eq!(rig.pg.qpair_count(), 0);
    assert_eq!(
        rig.pg.poll(&mut rig.h).unwrap(),
        0,
        "a failed group polls idle"
    );
    assert!(
        rig.pg.check_room(1).is_err(),
        "a failed group takes no qpair"
    );
    assert_eq!(rig.h.group_failures.len(), 1);
    rig.h.assert_each_ended_once();
    drop(flood);
}

/// LAST_WQE_REACHED for a qp_num whose qpair is healthy (an earlier QP with the same number
/// drained): ignored, counted, the qpair keeps working.
pub fn last_wqe_for_healthy_qpair_ignored(flavor: Flavor) {
    let Some(fx) = Fx::open(flavor) else { return };
    let mut rig = ScriptRig::new(fx, 1, cfg(1), shape());
    let qpn = rig.pg_qpn[0];
    rig.pg
        .handle_async_event(&mut rig.h, AsyncEventKind::QpLastWqeReached { qp_num: qpn });
    assert!(rig.h.events.is_empty(), "{:?}", rig.h.events);
    assert_eq!(rig.pg.stats().last_wqe_ignored, 1);
    assert_eq!(rig.pg.qpair_phase(qpn), Some(QpairPhase::Active));
    assert!(rig.cmd(0, Cmd::new(3, OP_SEND, 0), true));
    rig.run_until("the answer", |r| r.answers[0] == [3]);
    rig.assert_nothing_leaked();
}
