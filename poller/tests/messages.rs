//! Messages: from the control thread and between reactors, run on the right thread; per-poller
//! state reached by id; blocking calls; no lost wake-ups.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::thread;
use std::time::Duration;

use common::{Counting, PATIENCE, cfg, wait_for};
use nvmf_poller::{PollStatus, Poller, PollerError, ReactorCtx, Runtime};

fn thread_name() -> String {
    thread::current().name().unwrap_or("?").to_owned()
}

#[test]
fn control_messages_run_on_the_target_reactor_thread() {
    let rt = Runtime::start(cfg(&[0, 1])).expect("start");
    let (tx, rx) = crossbeam_channel::unbounded();
    for h in rt.reactors() {
        let tx = tx.clone();
        h.send(move |r| tx.send((r.id(), thread_name())).expect("reply"))
            .expect("send");
    }
    let mut got: Vec<_> = (0..2)
        .map(|_| rx.recv_timeout(PATIENCE).expect("reply"))
        .collect();
    got.sort();
    assert_eq!(
        got,
        vec![
            (0, "nvmf-reactor-0".to_owned()),
            (1, "nvmf-reactor-1".to_owned())
        ]
    );
    rt.stop().expect("stop");
}

#[test]
fn reactors_message_each_other() {
    let rt = Runtime::start(cfg(&[0, 1])).expect("start");
    let (tx, rx) = crossbeam_channel::unbounded();
    rt.reactors()[0]
        .send(move |r| {
            let from = (r.id(), thread_name());
            let peer = r.handles()[1].clone();
            let back = r.handle().clone();
            peer.send(move |r1| {
                let hop = (r1.id(), thread_name());
                // And back again to reactor 0.
                back.send(move |r0| {
                    tx.send((from, hop, (r0.id(), thread_name())))
                        .expect("reply")
                })
                .expect("send back");
            })
            .expect("send to peer");
        })
        .expect("send");
    let (from, hop, back) = rx.recv_timeout(PATIENCE).expect("round trip");
    assert_eq!(from, (0, "nvmf-reactor-0".to_owned()));
    assert_eq!(hop, (1, "nvmf-reactor-1".to_owned()));
    assert_eq!(back, (0, "nvmf-reactor-0".to_owned()));
    let stats = rt.stop().expect("stop");
    // Plus one stop message each.
    assert_eq!(stats[0].messages, 3);
    assert_eq!(stats[1].messages, 2);
}

/// A poller that owns state a message wants to change.
struct Accumulator {
    total: u64,
    pending: u64,
}

impl Poller for Accumulator {
    fn poll(&mut self, _ctx: &mut ReactorCtx) -> PollStatus {
        let n = self.pending;
        self.total += n;
        self.pending = 0;
        PollStatus::from_count(n as usize)
    }
}

#[test]
fn messages_reach_poller_state_by_id() {
    let rt = Runtime::start(cfg(&[1])).expect("start");
    let h = &rt.reactors()[0];
    let id = h
        .call(|r| {
            r.add_poller(Box::new(Accumulator {
                total: 0,
                pending: 0,
            }))
        })
        .expect("add");
    h.call(move |r| r.poller_mut::<Accumulator>(id).expect("poller").pending = 5)
        .expect("call");
    assert!(wait_for(|| {
        h.call(move |r| r.poller_ref::<Accumulator>(id).map(|a| a.total))
            .expect("call")
            == Some(5)
    }));
    // Wrong type or unknown id: None, and the poller stays.
    let wrong = h
        .call(move |r| {
            r.poller_mut::<Counting>(id).is_none() && r.take_poller::<Counting>(id).is_none()
        })
        .expect("call");
    assert!(wrong);
    let taken = h
        .call(move |r| r.take_poller::<Accumulator>(id).map(|a| a.total))
        .expect("call");
    assert_eq!(taken, Some(5));
    assert_eq!(h.call(|r| r.poller_count()).expect("call"), 0);
    assert_eq!(h.stats().pollers, 0);
    rt.stop().expect("stop");
}

#[test]
fn pollers_run_until_removed_and_can_defer_work() {
    let rt = Runtime::start(cfg(&[0])).expect("start");
    let h = &rt.reactors()[0];
    let (p, polls) = Counting::new(false);
    let id = h.call(move |r| r.add_poller(Box::new(p))).expect("add");
    assert!(wait_for(|| polls.load(Relaxed) > 100));
    assert_eq!(h.stats().pollers, 1);
    assert!(
        h.call(move |r| r.remove_poller(id).is_some())
            .expect("remove")
    );
    let after = polls.load(Relaxed);
    thread::sleep(Duration::from_millis(20));
    assert_eq!(polls.load(Relaxed), after, "removed poller still polled");

    /// Removes itself (through `defer`) after three polls.
    struct SelfRemoving {
        polls: u32,
        done: Arc<AtomicU64>,
    }
    impl Poller for SelfRemoving {
        fn poll(&mut self, ctx: &mut ReactorCtx) -> PollStatus {
            self.polls += 1;
            if self.polls == 3 {
                let done = Arc::clone(&self.done);
                ctx.defer(move |r| {
                    let ids: Vec<_> = r.poller_ids().collect();
                    for id in ids {
                        if r.take_poller::<SelfRemoving>(id).is_some() {
                            done.store(1, Relaxed);
                        }
                    }
                });
            }
            PollStatus::Busy(1)
        }
    }
    let done = Arc::new(AtomicU64::new(0));
    let d = Arc::clone(&done);
    h.send(move |r| {
        r.add_poller(Box::new(SelfRemoving { polls: 0, done: d }));
    })
    .expect("send");
    assert!(wait_for(|| done.load(Relaxed) == 1));
    assert_eq!(h.call(|r| r.poller_count()).expect("call"), 0);
    rt.stop().expect("stop");
}

#[test]
fn blocking_call_from_the_reactor_itself_is_refused() {
    let rt = Runtime::start(cfg(&[0])).expect("start");
    let h = &rt.reactors()[0];
    let res = h
        .call(|r| {
            matches!(
                r.handle().call(|_| ()),
                Err(PollerError::WouldDeadlock { reactor: 0 })
            )
        })
        .expect("call");
    assert!(res);
    assert!(!h.is_current_thread());
    rt.stop().expect("stop");
}

/// A bounded call to a reactor stuck in one message gives up with `NoAnswer` instead of
/// blocking its caller; once the reactor is free again, plain calls work.
#[test]
fn bounded_call_to_a_stuck_reactor_gives_up() {
    let rt = Runtime::start(cfg(&[0])).expect("start");
    let h = &rt.reactors()[0];
    let (release_tx, release_rx) = crossbeam_channel::bounded::<()>(1);
    h.send(move |_| {
        let _ = release_rx.recv_timeout(PATIENCE);
    })
    .expect("send");
    let res = h.call_timeout(Duration::from_millis(50), |r| r.id());
    assert!(
        matches!(res, Err(PollerError::NoAnswer { reactor: 0, .. })),
        "{res:?}"
    );
    release_tx.send(()).expect("release");
    assert_eq!(h.call_timeout(PATIENCE, |r| r.id()).expect("answer"), 0);
    rt.stop().expect("stop");
}

/// Many senders against a reactor that sleeps whenever it finds nothing to do (idle_after = 0):
/// every message must run, and promptly — a lost wake-up would leave one stuck.
#[test]
fn no_lost_wakeups_under_concurrent_senders() {
    let rt = Runtime::start(cfg(&[0]).idle_after(Duration::ZERO)).expect("start");
    let h = rt.reactors()[0].clone();
    let ran = Arc::new(AtomicU64::new(0));
    const SENDERS: u64 = 3;
    const EACH: u64 = 2_000;
    let threads: Vec<_> = (0..SENDERS)
        .map(|t| {
            let h = h.clone();
            let ran = Arc::clone(&ran);
            thread::spawn(move || {
                for i in 0..EACH {
                    let ran = Arc::clone(&ran);
                    h.send(move |_| {
                        ran.fetch_add(1, Relaxed);
                    })
                    .expect("send");
                    // Now and then give the reactor time to fall asleep, then send one and wait
                    // for it: each of these is a message landing on a (nearly) sleeping reactor.
                    if (i + t) % 50 == 0 {
                        thread::sleep(Duration::from_micros(200));
                        let (tx, rx) = crossbeam_channel::bounded(1);
                        h.send(move |_| tx.send(()).expect("ack")).expect("send");
                        rx.recv_timeout(PATIENCE)
                            .expect("message stuck behind a sleeping reactor");
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("sender");
    }
    assert!(wait_for(|| ran.load(Relaxed) == SENDERS * EACH));
    let s = h.stats();
    assert!(s.sleeps > 0, "reactor never slept: {s:?}");
    rt.stop().expect("stop");
}

#[test]
fn send_to_a_stopped_reactor_fails() {
    let rt = Runtime::start(cfg(&[0])).expect("start");
    let h = rt.reactors()[0].clone();
    rt.stop().expect("stop");
    assert!(matches!(
        h.send(|_| {}),
        Err(PollerError::ReactorStopped { reactor: 0 })
    ));
    assert!(matches!(
        h.call(|_| 1),
        Err(PollerError::ReactorStopped { reactor: 0 })
    ));
}
