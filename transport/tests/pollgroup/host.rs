//! The host personality against the target one, both poll groups on one device: the host's
//! qpairs use their own receive queues, requests are born by `submit`, and a request completes
//! only when both its SEND completion and its response are in; `post_waiting` puts a submit
//! batch on the wire without a poll.

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use nvmf_transport::pollgroup::*;
use nvmf_transport::*;

use crate::fixture::{Flavor, Fx, patience};
use crate::script::{OP_SEND, Scripted};

#[derive(Default)]
struct Initiator {
    by_seq: HashMap<u32, ReqId>,
    responded: HashSet<ReqId>,
    completed: Vec<u32>,
    early: u64,
}

impl Handler<()> for Initiator {
    fn capsule(&mut self, _: &mut PollGroup<()>, _: ReqId) {
        panic!("a host group never makes requests from capsules");
    }
    fn chain_done(&mut self, _: &mut PollGroup<()>, _: ReqId, _: WrKind, _: WcStatus) {
        panic!("a host request's SEND completes through request_complete");
    }
    fn qpair_event(&mut self, _: &mut PollGroup<()>, _: u32, _: u64, _: QpairEvent) {}
    fn aborted(&mut self, pg: &mut PollGroup<()>, req: ReqId) {
        pg.finish(req);
    }
    fn buffers_ready(&mut self, _: &mut PollGroup<()>, _: ReqId) {}
    fn response(&mut self, pg: &mut PollGroup<()>, _qp_num: u32, _token: u64, capsule: &[u8]) {
        let seq = u32::from_le_bytes(capsule[..4].try_into().unwrap());
        let req = self
            .by_seq
            .remove(&seq)
            .expect("a response for a command in flight");
        self.responded.insert(req);
        pg.response_received(req).unwrap();
    }
    fn request_complete(&mut self, pg: &mut PollGroup<()>, req: ReqId, status: WcStatus) {
        assert_eq!(status, WcStatus::Success);
        if !self.responded.remove(&req) {
            self.early += 1;
        }
        let seq = u32::from_le_bytes(pg.buffer(req, 0)[4..8].try_into().unwrap());
        self.completed.push(seq);
        pg.finish(req);
    }
}

/// Submits command `seq` on `handle`: a 64-byte capsule the scripted target answers with a
/// SEND.
fn submit(host: &mut PollGroup<()>, handle: QpairHandle, i: &mut Initiator, seq: u32) {
    let req = host.submit(handle).unwrap();
    assert_eq!(host.alloc_buffers(req, 64).unwrap(), BufferGrant::Ready);
    let b = host.buffer_mut(req, 0);
    b[..64].fill(0);
    b[4..8].copy_from_slice(&seq.to_le_bytes());
    b[8] = OP_SEND;
    let mut sge = [Sge::default(); 1];
    host.buffer_sges(req, 64, &mut sge);
    host.post_chain(
        req,
        &[ChainWr {
            op: SendOp::Send,
            sges: &sge,
            inline: false,
        }],
        false,
    )
    .unwrap();
    i.by_seq.insert(seq, req);
}

/// The fault injector of `fx`'s device: soft flavors only.
fn soft_faults(fx: &Fx) -> nvmf_transport::soft::FaultInjector {
    fx.ctx
        .as_soft()
        .expect("soft flavors only: holding completions is a soft fault")
        .faults()
}

/// A target group and a host group (16 receives per qpair) on `fx`'s device, both sized by
/// `cfg`, with one qpair of `depth` between them: (target, host, the host qpair's qp_num).
fn connected_groups(
    fx: &Fx,
    cfg: PollGroupConfig,
    depth: u32,
) -> (PollGroup<()>, PollGroup<()>, u32) {
    let mut target = PollGroup::<()>::new(&fx.ctx, cfg.clone()).unwrap();
    let mut host =
        PollGroup::<()>::new_host(&fx.ctx, cfg, RecvMode::PerQpair { recvs: 16 }).unwrap();
    let mut tq = target.create_qp().unwrap();
    let mut hq = host.create_qp().unwrap();
    fx.connect(&mut hq, &mut tq, 7);
    target.add_qp(tq, depth, 16, 0).unwrap();
    let hqpn = host.add_qp(hq, depth, 16, 0).unwrap();
    (target, host, hqpn)
}

pub fn host_group_round_trips(flavor: Flavor) {
    let Some(fx) = Fx::open(flavor) else { return };
    let cfg = crate::chains::cfg(1);
    let depth = 8;
    let (mut target, mut host, hqpn) = connected_groups(&fx, cfg, depth);
    assert!(host.srq().is_none());
    let handle = host.qpair_handle(hqpn).unwrap();
    let mut t = Scripted::default();
    let mut i = Initiator::default();
    let rounds = 5u32;
    for round in 0..rounds {
        // A full queue: one more is refused.
        for k in 0..depth {
            submit(&mut host, handle, &mut i, round * depth + k);
        }
        assert!(host.submit(handle).is_err(), "depth {depth} reached");
        if round % 2 == 1 {
            // The batch leaves at once, without a poll of the host's CQ; else at its next poll.
            let (posted, polls) = (host.stats().send_post_calls, host.stats().polls);
            host.post_waiting(&mut i);
            assert!(
                host.stats().send_post_calls > posted,
                "post_waiting posted nothing"
            );
            assert_eq!(host.stats().polls, polls, "post_waiting polled the CQ");
        }
        let want = ((round + 1) * depth) as usize;
        let deadline = Instant::now() + patience();
        while i.completed.len() < want || target.requests_in_use() > 0 {
            let a = host.poll(&mut i).unwrap();
            let b = target.poll(&mut t).unwrap();
            if a + b == 0 {
                assert!(Instant::now() < deadline, "host {:?}", host.stats());
            }
        }
    }
    let mut seen = i.completed.clone();
    seen.sort_unstable();
    assert_eq!(seen, (0..rounds * depth).collect::<Vec<_>>());
    assert_eq!(i.early, 0, "a request completed before its response");
    assert_eq!(host.requests_in_use(), 0);
    assert_eq!(host.buffers_free(), host.config().data_buffers);
    // The host's receives are on its QP: 16 assigned, all posted again.
    assert_eq!(host.recv_accounting().0, 16);
    // The qpair goes: its slots return to the pool.
    host.destroy_qpair(&mut i, hqpn);
    assert_eq!(host.recv_accounting(), (0, 0, 0));
}

/// A response that comes before its command's SEND completion (a NIC whose ACK comes after
/// the target's answer; the soft fault `hold_send_completions` holds them on the host's CQ):
/// the request waits for both, is reported once the SEND completes, and its objects and slots
/// come back. Soft flavors only (the hold is a soft fault).
pub fn host_response_before_send_completion(flavor: Flavor) {
    let Some(fx) = Fx::open(flavor) else { return };
    let faults = soft_faults(&fx);
    let cfg = crate::chains::cfg(1);
    let (mut target, mut host, hqpn) = connected_groups(&fx, cfg, 4);
    let handle = host.qpair_handle(hqpn).unwrap();
    let (mut t, mut i) = (Scripted::default(), Initiator::default());
    faults.hold_send_completions(host.cq().id(), true).unwrap();
    for seq in 0..3 {
        submit(&mut host, handle, &mut i, seq);
    }
    let deadline = Instant::now() + patience();
    while i.responded.len() < 3 || target.requests_in_use() > 0 {
        host.poll(&mut i).unwrap();
        target.poll(&mut t).unwrap();
        assert!(
            Instant::now() < deadline,
            "no responses: {:?}",
            host.stats()
        );
    }
    for _ in 0..100 {
        host.poll(&mut i).unwrap();
    }
    assert!(
        i.completed.is_empty(),
        "reported before the SEND completed: {:?}",
        i.completed
    );
    assert_eq!(
        host.requests_in_use(),
        3,
        "the requests wait for their SENDs"
    );
    faults.hold_send_completions(host.cq().id(), false).unwrap();
    while i.completed.len() < 3 {
        host.poll(&mut i).unwrap();
        assert!(Instant::now() < deadline, "held SENDs never completed");
    }
    i.completed.sort_unstable();
    assert_eq!(i.completed, vec![0, 1, 2]);
    assert_eq!(i.early, 0, "a request completed before its response");
    assert!(i.responded.is_empty());
    assert_eq!(host.requests_in_use(), 0);
    assert_eq!(host.buffers_free(), host.config().data_buffers);
    assert_eq!(host.stats().stale_completions, 0);
}

/// The target's response SEND completions held back (a NIC's late ACK; the soft fault on the
/// target group's CQ) while the host, having the responses, sends a whole queue depth of new
/// commands: each answer gave its command's depth slot back when it was posted, so none of the
/// new ones is an overrun, and they are answered while the old requests still wait for their
/// SENDs. Soft flavors only (the hold is a soft fault).
pub fn target_depth_comes_back_with_the_answer(flavor: Flavor) {
    let Some(fx) = Fx::open(flavor) else { return };
    let faults = soft_faults(&fx);
    // Every answer signaled, so that each waits for its own SEND completion.
    let cfg = PollGroupConfig {
        silent_answers: 0,
        ..crate::chains::cfg(1)
    };
    let depth = 4;
    let (mut target, mut host, hqpn) = connected_groups(&fx, cfg, depth);
    let handle = host.qpair_handle(hqpn).unwrap();
    let (mut t, mut i) = (Scripted::default(), Initiator::default());
    faults
        .hold_send_completions(target.cq().id(), true)
        .unwrap();
    let deadline = Instant::now() + patience();
    for round in 0..2 {
        for k in 0..depth {
            submit(&mut host, handle, &mut i, round * depth + k);
        }
        while i.completed.len() < ((round + 1) * depth) as usize {
            host.poll(&mut i).unwrap();
            target.poll(&mut t).unwrap();
            assert!(
                Instant::now() < deadline,
                "round {round}: host {:?}, target {:?}",
                host.stats(),
                target.stats()
            );
        }
    }
    assert_eq!(target.stats().overruns, 0, "{:?}", target.stats());
    assert_eq!(
        target.requests_in_use(),
        2 * depth as usize,
        "every answer's request waits for its held SEND"
    );
    faults
        .hold_send_completions(target.cq().id(), false)
        .unwrap();
    while target.requests_in_use() > 0 {
        target.poll(&mut t).unwrap();
        assert!(Instant::now() < deadline, "held SENDs never completed");
    }
    t.assert_each_ended_once();
    assert_eq!(target.stats().stale_completions, 0);
    assert_eq!(target.buffers_free(), target.config().data_buffers);
}

/// A host qpair's drain ends once its receives have flushed back from its own receive queue:
/// LAST_WQE_REACHED exists only for SRQ-attached QPs, and the grace that stands in for it is
/// set here far beyond the test's patience, so only the receive count can end the drain.
pub fn host_drain_ends_when_its_receives_flush(flavor: Flavor) {
    let Some(fx) = Fx::open(flavor) else { return };
    let cfg = PollGroupConfig {
        drain_grace: std::time::Duration::from_secs(3600),
        drain_timeout: std::time::Duration::from_secs(7200),
        ..crate::chains::cfg(1)
    };
    let (mut target, mut host, hqpn) = connected_groups(&fx, cfg, 8);
    let (mut t, mut i) = (Scripted::default(), Initiator::default());
    // Its 16 receives go on the QP at the first poll.
    host.poll(&mut i).unwrap();
    assert_eq!(host.recv_accounting().0, 16);
    host.disconnect(&mut i, hqpn);
    let deadline = Instant::now() + patience();
    while host.qpair_phase(hqpn).is_some() {
        let a = host.poll(&mut i).unwrap();
        let b = target.poll(&mut t).unwrap();
        if a + b == 0 {
            assert!(
                Instant::now() < deadline,
                "the drain did not end: {:?}",
                host.stats()
            );
        }
    }
    let s = host.stats();
    assert_eq!((s.drained_flush, s.drained_timeout), (1, 0), "{s:?}");
    assert_eq!(host.recv_accounting(), (0, 0, 0));
}

/// `RecvRepost::NextPass` on a host SRQ: the slots a poll freed stay queued until the next
/// poll starts, and the SRQ's batch of slack covers the worst case: every command answered
/// while the host does not poll, then a poll freeing a whole batch whose requests carry new
/// commands that are answered before the host polls again. No RNR retry is allowed, so a
/// response finding no receive posted fails its chain. Needs a device that moves data while
/// its owner does not poll (in-process, verbs; not soft TCP, where responses land only inside
/// the host's own poll, after its re-posts).
pub fn host_srq_reposts_at_the_next_poll(flavor: Flavor) {
    let Some(fx) = Fx::open(flavor) else { return };
    let (requests, batch) = (8u32, 4usize);
    let cfg = PollGroupConfig {
        max_requests: requests,
        batch,
        srq_depth: requests + batch as u32,
        recv_repost: RecvRepost::NextPass,
        ..crate::chains::cfg(1)
    };
    let mut target = PollGroup::<()>::new(&fx.ctx, crate::chains::cfg(1)).unwrap();
    let mut host = PollGroup::<()>::new_host(&fx.ctx, cfg, RecvMode::Srq).unwrap();
    let mut tq = target.create_qp().unwrap();
    let mut hq = host.create_qp().unwrap();
    fx.connect(&mut hq, &mut tq, 0);
    target.add_qp(tq, requests, 16, 0).unwrap();
    let hqpn = host.add_qp(hq, requests, 16, 0).unwrap();
    let handle = host.qpair_handle(hqpn).unwrap();
    let (mut t, mut i) = (Scripted::default(), Initiator::default());
    let answered = |target: &mut PollGroup<()>, t: &mut Scripted, want: u64| {
        let deadline = Instant::now() + patience();
        while t.chains_ok + t.chains_failed < want || target.requests_in_use() > 0 {
            if target.poll(t).unwrap() == 0 {
                assert!(Instant::now() < deadline, "target {:?}", target.stats());
            }
        }
    };
    let mut seq = 0;
    for round in 0..4 {
        // A full group with its SEND completions reaped (the CQ then holds responses only),
        // every command answered while the host does not poll: the SRQ holds only its slack.
        while host.requests_in_use() < requests as usize {
            submit(&mut host, handle, &mut i, seq);
            seq += 1;
        }
        host.post_waiting(&mut i);
        let deadline = Instant::now() + patience();
        let responses = u64::from(seq) - i.by_seq.len() as u64;
        // One SEND completion per posted list: the list's other commands go silent.
        let sends = |host: &PollGroup<()>| u64::from(seq) - host.stats().silent_chains;
        while host.stats().completions - responses < sends(&host) {
            host.poll(&mut i).unwrap();
            assert!(Instant::now() < deadline, "host {:?}", host.stats());
        }
        answered(&mut target, &mut t, u64::from(seq));
        // One poll: a batch of responses; their slots wait, their requests are free.
        let done = i.completed.len();
        host.poll(&mut i).unwrap();
        let freed = i.completed.len() - done;
        assert_eq!(freed, batch, "round {round}: a whole batch of responses");
        assert_eq!(
            host.recv_accounting().1,
            batch as u32,
            "round {round}: the poll's slots wait for the next poll"
        );
        // New commands on the freed requests, answered before the host polls again: the
        // slack's receives take them.
        for _ in 0..freed {
            submit(&mut host, handle, &mut i, seq);
            seq += 1;
        }
        host.post_waiting(&mut i);
        answered(&mut target, &mut t, u64::from(seq));
        assert_eq!(
            t.chains_failed, 0,
            "round {round}: a response found no receive"
        );
        // The next poll posts the waiting slots before it reads the CQ: only the slots of
        // the responses it reaped wait after it.
        let (calls, waiting) = (host.stats().recv_post_calls, i.by_seq.len());
        host.poll(&mut i).unwrap();
        assert!(
            host.stats().recv_post_calls > calls,
            "round {round}: nothing re-posted"
        );
        let reaped = waiting - i.by_seq.len();
        assert_eq!(host.recv_accounting().1, reaped as u32, "round {round}");
        let deadline = Instant::now() + patience();
        while i.completed.len() < seq as usize || host.requests_in_use() > 0 {
            if host.poll(&mut i).unwrap() == 0 {
                assert!(Instant::now() < deadline, "host {:?}", host.stats());
            }
        }
    }
    let mut seen = i.completed.clone();
    seen.sort_unstable();
    assert_eq!(seen, (0..seq).collect::<Vec<_>>());
    assert_eq!(t.chains_failed, 0);
    host.poll(&mut i).unwrap();
    assert_eq!(host.recv_accounting(), (requests + batch as u32, 0, 0));
}

/// `RecvRepost::NextPass` is refused where its slack cannot be had: on a target group, on
/// per-qpair receive queues, and on an SRQ smaller than max_requests + batch.
pub fn next_pass_repost_needs_a_host_srq_with_slack(flavor: Flavor) {
    let Some(fx) = Fx::open(flavor) else { return };
    let cfg = |srq_depth: u32| PollGroupConfig {
        max_requests: 8,
        batch: 4,
        srq_depth,
        recv_repost: RecvRepost::NextPass,
        ..crate::chains::cfg(1)
    };
    let refused = |r: Result<PollGroup<()>>, what: &str| match r {
        Err(TransportError::InvalidArgument(m)) => assert!(m.contains("NextPass"), "{what}: {m}"),
        Err(e) => panic!("{what}: {e}"),
        Ok(_) => panic!("{what}: accepted"),
    };
    refused(PollGroup::new(&fx.ctx, cfg(64)), "a target group");
    refused(
        PollGroup::new_host(&fx.ctx, cfg(64), RecvMode::PerQpair { recvs: 8 }),
        "per-qpair receive queues",
    );
    refused(
        PollGroup::new_host(&fx.ctx, cfg(11), RecvMode::Srq),
        "an SRQ one slot short",
    );
    assert!(PollGroup::<()>::new_host(&fx.ctx, cfg(12), RecvMode::Srq).is_ok());
}
