//! Idle mode: an idle reactor sleeps instead of spinning; messages and readable fds wake it;
//! a poller that finds work while arming keeps it awake; busy pollers never let it sleep.

mod common;

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::thread;
use std::time::{Duration, Instant};

use common::{Counting, SocketPoller, cfg, wait_for};
use nvmf_poller::{Arm, PollStatus, Poller, ReactorCtx, Runtime, WakeFds};

#[test]
fn idle_reactor_sleeps_instead_of_spinning() {
    let rt = Runtime::start(cfg(&[0])).expect("start");
    let h = &rt.reactors()[0];
    let (a, polled) = Counting::new(false);
    let (b, _) = Counting::new(false);
    h.send(move |r| {
        r.add_poller(Box::new(a));
        r.add_poller(Box::new(b));
    })
    .expect("send");
    assert!(wait_for(|| h.is_sleeping()), "never went to sleep");
    let before = h.stats();
    let p0 = polled.load(Relaxed);
    thread::sleep(Duration::from_millis(300));
    let after = h.stats();
    assert!(after.sleeping, "{after:?}");
    assert!(after.sleeps >= 1);
    // Spinning would be millions of iterations in 300 ms; asleep it is (nearly) none.
    assert!(
        after.polls - before.polls < 1_000,
        "{before:?} -> {after:?}"
    );
    assert!(polled.load(Relaxed) - p0 < 1_000);
    assert!(after.idle_polls <= after.polls);
    rt.stop().expect("stop");
}

#[test]
fn reactor_without_idle_mode_keeps_polling() {
    let rt = Runtime::start(cfg(&[1]).idle_after(Duration::MAX)).expect("start");
    let h = &rt.reactors()[0];
    let (a, polled) = Counting::new(false);
    h.send(move |r| {
        r.add_poller(Box::new(a));
    })
    .expect("send");
    thread::sleep(Duration::from_millis(100));
    let before = h.stats();
    thread::sleep(Duration::from_millis(200));
    let after = h.stats();
    assert_eq!(after.sleeps, 0);
    assert!(
        after.polls - before.polls > 1_000,
        "{before:?} -> {after:?}"
    );
    assert!(polled.load(Relaxed) > 1_000);
    // Nothing did work: every iteration but the message's was idle, none counted busy time
    // beyond that one. The snapshot may see a pass's poll count and not yet its idle count
    // (two counters, published one after the other while the reactor runs): one pass of slack.
    assert!(after.idle_polls + 2 >= after.polls, "{after:?}");
    rt.stop().expect("stop");
}

#[test]
fn busy_pollers_keep_the_reactor_awake() {
    let rt = Runtime::start(cfg(&[1])).expect("start");
    let h = &rt.reactors()[0];
    let (a, _) = Counting::new(true);
    // (With no poller yet the reactor may already have slept once; count from here.)
    h.call(move |r| {
        r.add_poller(Box::new(a));
    })
    .expect("call");
    let before = h.stats();
    thread::sleep(Duration::from_millis(200));
    let after = h.stats();
    assert_eq!(after.sleeps, before.sleeps, "{before:?} -> {after:?}");
    assert_eq!(
        after.idle_polls, before.idle_polls,
        "{before:?} -> {after:?}"
    );
    assert!(
        after.busy - before.busy > Duration::from_millis(50),
        "{after:?}"
    );
    assert!(
        after.polls - before.polls > 1_000,
        "{before:?} -> {after:?}"
    );
    rt.stop().expect("stop");
}

#[test]
fn a_message_wakes_a_sleeping_reactor_promptly() {
    let rt = Runtime::start(cfg(&[0])).expect("start");
    let h = &rt.reactors()[0];
    for _ in 0..5 {
        assert!(wait_for(|| h.is_sleeping()));
        let before = h.stats();
        let t0 = Instant::now();
        h.call(|_| ()).expect("call");
        let took = t0.elapsed();
        assert!(took < Duration::from_millis(500), "wake-up took {took:?}");
        assert!(h.stats().wakeups > before.wakeups);
    }
    rt.stop().expect("stop");
}

#[test]
fn a_readable_fd_wakes_a_sleeping_reactor() {
    let rt = Runtime::start(cfg(&[1])).expect("start");
    let h = &rt.reactors()[0];
    let (p, mut peer, received) = SocketPoller::pair();
    h.send(move |r| {
        r.add_poller(Box::new(p));
    })
    .expect("send");
    for round in 1..=5u64 {
        assert!(wait_for(|| h.is_sleeping()), "round {round}: never slept");
        let before = h.stats();
        let t0 = Instant::now();
        peer.write_all(b"x").expect("write");
        assert!(wait_for(|| received.load(Relaxed) == round));
        let took = t0.elapsed();
        assert!(took < Duration::from_millis(500), "round {round}: {took:?}");
        let after = h.stats();
        assert!(after.wakeups > before.wakeups, "{before:?} -> {after:?}");
        assert_eq!(after.messages, before.messages, "woken by a message?");
    }
    rt.stop().expect("stop");
}

/// Work that lands between the last poll and arming (the req_notify race): the poller's
/// post-arm re-check finds it and answers `WorkPending`, so the reactor must not sleep (it has
/// no fd that would ever fire for this work) and must poll the work at once.
struct Racy {
    pending: Arc<AtomicU64>,
    done: Arc<AtomicU64>,
    arms: u64,
}

impl Poller for Racy {
    fn poll(&mut self, _ctx: &mut ReactorCtx) -> PollStatus {
        let n = self.pending.swap(0, Relaxed);
        self.done.fetch_add(n, Relaxed);
        PollStatus::from_count(n as usize)
    }

    fn arm(&mut self, _fds: &mut WakeFds) -> Arm {
        self.arms += 1;
        if self.arms == 1 {
            // The "completion" arrives just as we arm.
            self.pending.fetch_add(1, Relaxed);
        }
        // Re-poll after arming.
        if self.pending.load(Relaxed) > 0 {
            Arm::WorkPending
        } else {
            Arm::Armed
        }
    }
}

#[test]
fn work_found_while_arming_keeps_the_reactor_awake() {
    let rt = Runtime::start(cfg(&[0])).expect("start");
    let h = &rt.reactors()[0];
    let pending = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicU64::new(0));
    let p = Racy {
        pending: Arc::clone(&pending),
        done: Arc::clone(&done),
        arms: 0,
    };
    h.send(move |r| {
        r.add_poller(Box::new(p));
    })
    .expect("send");
    // Without the WorkPending answer the reactor would sleep forever with this work unseen.
    assert!(
        wait_for(|| done.load(Relaxed) == 1),
        "raced work never polled"
    );
    assert!(wait_for(|| h.is_sleeping()), "never slept after the race");
    let s = h.stats();
    assert!(s.sleep_aborts >= 1, "{s:?}");
    assert!(s.sleeps >= 1, "{s:?}");
    rt.stop().expect("stop");
}

/// Busy one pass in `every`, and that pass takes `work` (a sleep standing in for work).
struct Sometimes {
    every: u64,
    work: Duration,
    polls: u64,
    busy_passes: Arc<AtomicU64>,
}

impl Poller for Sometimes {
    fn poll(&mut self, _ctx: &mut ReactorCtx) -> PollStatus {
        self.polls += 1;
        if self.polls % self.every != 0 {
            return PollStatus::Idle;
        }
        thread::sleep(self.work);
        self.busy_passes.fetch_add(1, Relaxed);
        PollStatus::Busy(1)
    }
}

/// Idle passes do not read the clock each time, so a busy pass between idle ones shares its
/// clock window with them: its time must still count as busy (not diluted by the idle passes).
#[test]
fn a_busy_pass_between_idle_ones_counts_its_time() {
    let rt = Runtime::start(cfg(&[1]).idle_after(Duration::from_secs(60))).expect("start");
    let h = &rt.reactors()[0];
    let busy_passes = Arc::new(AtomicU64::new(0));
    let poller = Sometimes {
        every: 1000,
        work: Duration::from_millis(2),
        polls: 0,
        busy_passes: Arc::clone(&busy_passes),
    };
    let before = h.call(move |r| {
        r.add_poller(Box::new(poller));
        r.stats()
    });
    let before = before.expect("call");
    assert!(wait_for(|| busy_passes.load(Relaxed) >= 40));
    let after = h.stats();
    let passes = busy_passes.load(Relaxed);
    // Each busy pass slept 2 ms; allow half for the estimate of the idle passes around them.
    assert!(
        after.busy - before.busy >= Duration::from_millis(passes.saturating_sub(2)),
        "{passes} busy passes of 2 ms: {before:?} -> {after:?}"
    );
    rt.stop().expect("stop");
}

#[test]
fn busy_window_counts_only_passes_that_found_work() {
    let rt = Runtime::start(cfg(&[1]).idle_after(Duration::MAX)).expect("start");
    let h = &rt.reactors()[0];
    let (idle, _) = Counting::new(false);
    h.call(move |r| {
        r.add_poller(Box::new(idle));
    })
    .expect("call");
    // The pass that ran the call (busy: it handled a message) publishes its counts first.
    thread::sleep(Duration::from_millis(20));
    let before = h.stats();
    let window = nvmf_poller::BusyWindow::start(h);
    thread::sleep(Duration::from_millis(100));
    // Nothing found work: among the many passes since the window opened, none was busy (a
    // read between the reactor's stores of its pass and idle counts may count one as busy).
    assert!(h.stats().polls - before.polls > 1_000);
    assert!(window.busy_passes() <= 1, "{}", window.busy_passes());

    let (busy, _) = Counting::new(true);
    h.call(move |r| {
        r.add_poller(Box::new(busy));
    })
    .expect("call");
    let before = h.stats();
    let window = nvmf_poller::BusyWindow::start(h);
    thread::sleep(Duration::from_millis(100));
    let passes = window.busy_passes();
    let after = h.stats();
    // Every pass now finds work: the window's busy passes are the passes it saw.
    assert!(passes > 1_000, "{passes}");
    assert!(
        passes <= after.polls - before.polls,
        "{passes} {before:?} {after:?}"
    );
    rt.stop().expect("stop");
}
