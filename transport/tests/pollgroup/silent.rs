//! Lone answers posted without a completion of their own (the poll group's `silent.rs`): each
//! holds its request until a later completion on its qpair, every `silent_answers + 1`-th is
//! signaled, what they hold stays within the group's budget, and a quiet group (or one about
//! to sleep) flushes them with a zero-length RDMA WRITE that leaves the qpair working.

use crate::fixture::{Flavor, Fx};
use crate::harness::*;
use nvmf_transport::pollgroup::*;

/// Polls in a row before a flush that no test here reaches by idling.
const NEVER: u32 = u32::MAX;

/// `qpairs` qpairs of depth 1; None without the flavor's device.
fn rig(flavor: Flavor, qpairs: usize, cfg: PollGroupConfig) -> Option<Rig> {
    Some(Rig::new(Fx::open(flavor)?, qpairs, cfg, 1, 7))
}

/// One qpair at depth 1, so each answer is a list of its own: with `silent_answers` 3 the
/// answers go silent, silent, silent, signaled, and so on; a silent one's request stays in use
/// until the signaled one's completion retires it (nothing else could: no flush by idling).
pub fn lone_answers_are_held_until_a_later_completion(flavor: Flavor) {
    let cfg = PollGroupConfig {
        silent_answers: 3,
        silent_flush_idle_polls: NEVER,
        ..config(1)
    };
    let Some(mut rig) = rig(flavor, 1, cfg) else {
        return;
    };
    for seq in 0..8u32 {
        assert!(rig.send(0, seq));
        rig.run_until("the answer", |r| r.host.recvs == u64::from(seq) + 1);
        if seq % 4 == 3 {
            rig.run_until("the signaled answer retiring the silent ones", |r| {
                r.pg.requests_in_use() == 0
            });
            assert_eq!(rig.h.chains_ok, u64::from(seq) + 1);
        } else {
            assert_eq!(
                rig.pg.requests_in_use(),
                seq as usize % 4 + 1,
                "answer {seq}: the silent answers' requests held"
            );
            assert_eq!(rig.h.chains_ok, u64::from(seq / 4 * 4));
        }
    }
    let stats = rig.pg.stats();
    assert_eq!(
        (
            stats.silent_lone,
            stats.silent_retired,
            stats.silent_flushes
        ),
        (6, 6, 0)
    );
    assert_eq!(rig.h.chains_failed, 0);
    rig.assert_nothing_leaked();
}

/// A quiet group flushes: the silent answer's request comes back without another command,
/// and the qpair keeps working after the flush.
pub fn a_quiet_group_flushes_its_silent_answers(flavor: Flavor) {
    let cfg = PollGroupConfig {
        silent_flush_idle_polls: 64,
        ..config(1)
    };
    let Some(mut rig) = rig(flavor, 1, cfg) else {
        return;
    };
    for seq in 0..2u32 {
        assert!(rig.send(0, seq));
        rig.run_until("the answer", |r| r.host.recvs == u64::from(seq) + 1);
        rig.run_until("the silent answer flushed", |r| r.pg.requests_in_use() == 0);
        let stats = rig.pg.stats();
        assert_eq!(
            (
                stats.silent_lone,
                stats.silent_retired,
                stats.silent_flushes
            ),
            (u64::from(seq) + 1, u64::from(seq) + 1, u64::from(seq) + 1)
        );
        assert_eq!(rig.h.chains_ok, u64::from(seq) + 1);
    }
    assert!(
        rig.h
            .events
            .iter()
            .all(|(_, e)| matches!(e, QpairEvent::Active)),
        "the qpair stays up: {:?}",
        rig.h.events
    );
    assert_eq!(rig.host.failed[0], 0);
    rig.assert_nothing_leaked();
}

/// Eight qpairs answered once each, a group of 8 request objects: silent answers hold at most
/// half of them, the rest are signaled and free; a reactor about to sleep (`arm`) flushes
/// the held ones.
pub fn silent_answers_hold_at_most_the_budget(flavor: Flavor) {
    let cfg = PollGroupConfig {
        max_requests: 8,
        silent_flush_idle_polls: NEVER,
        ..config(8)
    };
    let Some(mut rig) = rig(flavor, 8, cfg) else {
        return;
    };
    for i in 0..8 {
        assert!(rig.send(i, 0));
    }
    rig.run_until("every answer, the signaled ones retired", |r| {
        r.host.recvs == 8 && r.h.chains_ok == 4
    });
    assert_eq!(rig.pg.requests_in_use(), 4, "half the requests held");
    assert_eq!(rig.pg.stats().silent_lone, 4);
    // Armed to sleep: the held answers are flushed first.
    let _ = rig.pg.arm().expect("arm");
    rig.run_until("the held answers flushed", |r| r.pg.requests_in_use() == 0);
    let _ = rig.pg.ack_wakeups();
    assert_eq!(rig.pg.stats().silent_flushes, 4);
    assert_eq!(rig.h.chains_ok, 8);
    rig.assert_nothing_leaked();
}
