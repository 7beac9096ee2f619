//! Timers: one-shot and periodic, cancel (also from the callback), and timers waking a
//! sleeping reactor without making it spin.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::thread;
use std::time::{Duration, Instant};

use common::{PATIENCE, cfg, wait_for};
use nvmf_poller::Runtime;

#[test]
fn one_shot_fires_once_after_its_delay() {
    let rt = Runtime::start(cfg(&[0])).expect("start");
    let h = &rt.reactors()[0];
    let (tx, rx) = crossbeam_channel::unbounded();
    let t0 = Instant::now();
    h.send(move |r| {
        r.add_timer(Duration::from_millis(50), None, move |r| {
            tx.send((Instant::now(), r.id())).expect("fired");
        });
    })
    .expect("send");
    let (at, id) = rx.recv_timeout(PATIENCE).expect("timer fired");
    let waited = at - t0;
    assert_eq!(id, 0);
    assert!(
        waited >= Duration::from_millis(50),
        "fired early: {waited:?}"
    );
    assert!(
        waited < Duration::from_secs(2),
        "fired very late: {waited:?}"
    );
    thread::sleep(Duration::from_millis(100));
    assert!(rx.try_recv().is_err(), "one-shot fired twice");
    let s = h.stats();
    assert_eq!(s.timers_fired, 1);
    assert_eq!(s.timers, 0);
    rt.stop().expect("stop");
}

#[test]
fn periodic_fires_repeatedly_until_cancelled() {
    let rt = Runtime::start(cfg(&[1])).expect("start");
    let h = &rt.reactors()[0];
    let ticks = Arc::new(AtomicU64::new(0));
    let t = Arc::clone(&ticks);
    let id = h
        .call(move |r| {
            r.add_timer(
                Duration::from_millis(10),
                Some(Duration::from_millis(10)),
                move |_| {
                    t.fetch_add(1, Relaxed);
                },
            )
        })
        .expect("add");
    thread::sleep(Duration::from_millis(300));
    let n = ticks.load(Relaxed);
    // 30 expected; be generous about a loaded 2-core machine, but it must be periodic.
    assert!((5..=40).contains(&n), "{n} ticks in 300 ms at 10 ms");
    assert!(h.call(move |r| r.cancel_timer(id)).expect("cancel"));
    let after = ticks.load(Relaxed);
    thread::sleep(Duration::from_millis(50));
    assert_eq!(ticks.load(Relaxed), after, "cancelled timer still fires");
    assert!(!h.call(move |r| r.cancel_timer(id)).expect("cancel again"));
    rt.stop().expect("stop");
}

#[test]
fn periodic_timer_can_cancel_itself() {
    let rt = Runtime::start(cfg(&[0])).expect("start");
    let h = &rt.reactors()[0];
    let ticks = Arc::new(AtomicU64::new(0));
    let t = Arc::clone(&ticks);
    h.send(move |r| {
        let id = Arc::new(std::sync::OnceLock::new());
        let my_id = Arc::clone(&id);
        let timer = r.add_timer(Duration::ZERO, Some(Duration::from_millis(1)), move |r| {
            if t.fetch_add(1, Relaxed) + 1 == 3 {
                assert!(r.cancel_timer(*my_id.get().expect("id set")));
            }
        });
        id.set(timer).expect("set once");
    })
    .expect("send");
    assert!(wait_for(|| ticks.load(Relaxed) >= 3));
    thread::sleep(Duration::from_millis(30));
    assert_eq!(ticks.load(Relaxed), 3);
    rt.stop().expect("stop");
}

/// An idle reactor with a periodic timer sleeps between ticks instead of spinning: few loop
/// iterations, one sleep per tick, and the ticks still come.
#[test]
fn timers_wake_a_sleeping_reactor_without_spinning() {
    let rt = Runtime::start(cfg(&[0])).expect("start");
    let h = &rt.reactors()[0];
    let ticks = Arc::new(AtomicU64::new(0));
    let t = Arc::clone(&ticks);
    h.send(move |r| {
        r.add_timer(
            Duration::from_millis(20),
            Some(Duration::from_millis(20)),
            move |_| {
                t.fetch_add(1, Relaxed);
            },
        );
    })
    .expect("send");
    assert!(wait_for(|| h.is_sleeping()));
    let before = h.stats();
    let t0 = ticks.load(Relaxed);
    thread::sleep(Duration::from_millis(300));
    let after = h.stats();
    let n = ticks.load(Relaxed) - t0;
    assert!(n >= 5, "only {n} ticks in 300 ms at 20 ms");
    assert!(after.sleeps - before.sleeps >= 5, "{before:?} -> {after:?}");
    // A busy loop would do millions of iterations; a sleeping one a handful per tick.
    assert!(
        after.polls - before.polls < 5_000,
        "{before:?} -> {after:?}"
    );
    rt.stop().expect("stop");
}

/// While every pass does work the loop reads the clock only now and then (CLOCK_PASSES):
/// timers still fire, never before their deadline.
#[test]
fn timers_fire_while_every_pass_is_busy() {
    let rt = Runtime::start(cfg(&[0])).expect("start");
    let h = &rt.reactors()[0];
    let (busy, polled) = common::Counting::new(true);
    let (tx, rx) = crossbeam_channel::unbounded();
    let t0 = Instant::now();
    h.send(move |r| {
        r.add_poller(Box::new(busy));
        r.add_timer(Duration::from_millis(20), None, move |r| {
            tx.send(r.now()).expect("fired");
        });
    })
    .expect("send");
    let at = rx.recv_timeout(PATIENCE).expect("timer fired");
    assert!(at - t0 >= Duration::from_millis(20), "fired early");
    assert!(polled.load(Relaxed) > 0);
    rt.stop().expect("stop");
}
