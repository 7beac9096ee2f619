//! Clean stop: queued messages run, pollers drain in-flight work, the drain timeout bounds a
//! poller that never drains, and a panicking reactor is reported.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use common::cfg;
use nvmf_poller::{PollStatus, Poller, PollerError, ReactorCtx, Runtime};

/// Has in-flight work that completes one unit per 5 ms; drained when none is left.
struct Draining {
    in_flight: u64,
    last: Option<Instant>,
    completed: Arc<AtomicU64>,
    stop_calls: Arc<AtomicU64>,
    polled_while_stopping: Arc<AtomicU64>,
    dropped: Arc<AtomicBool>,
    never_drains: bool,
}

impl Poller for Draining {
    fn poll(&mut self, ctx: &mut ReactorCtx) -> PollStatus {
        if ctx.is_stopping() {
            self.polled_while_stopping.fetch_add(1, Relaxed);
        }
        let due = self
            .last
            .is_none_or(|t| ctx.now().duration_since(t) >= Duration::from_millis(5));
        if self.in_flight > 0 && due {
            self.in_flight -= 1;
            self.last = Some(ctx.now());
            self.completed.fetch_add(1, Relaxed);
            return PollStatus::Busy(1);
        }
        PollStatus::Idle
    }

    fn stop(&mut self, _ctx: &mut ReactorCtx) -> bool {
        self.stop_calls.fetch_add(1, Relaxed);
        !self.never_drains && self.in_flight == 0
    }

    fn name(&self) -> &str {
        if self.never_drains {
            "stuck"
        } else {
            "draining"
        }
    }
}

impl Drop for Draining {
    fn drop(&mut self) {
        self.dropped.store(true, Relaxed);
    }
}

struct Probes {
    completed: Arc<AtomicU64>,
    stop_calls: Arc<AtomicU64>,
    polled_while_stopping: Arc<AtomicU64>,
    dropped: Arc<AtomicBool>,
}

fn draining(in_flight: u64, never_drains: bool) -> (Draining, Probes) {
    let p = Probes {
        completed: Arc::default(),
        stop_calls: Arc::default(),
        polled_while_stopping: Arc::default(),
        dropped: Arc::default(),
    };
    (
        Draining {
            in_flight,
            last: None,
            completed: Arc::clone(&p.completed),
            stop_calls: Arc::clone(&p.stop_calls),
            polled_while_stopping: Arc::clone(&p.polled_while_stopping),
            dropped: Arc::clone(&p.dropped),
            never_drains,
        },
        p,
    )
}

#[test]
fn stop_finishes_in_flight_work_before_exiting() {
    let rt = Runtime::start(cfg(&[0, 1])).expect("start");
    let (p, probes) = draining(0, false);
    let id = rt.reactors()[1]
        .call(move |r| r.add_poller(Box::new(p)))
        .expect("add");
    // Give it work right before the stop: 20 units at 5 ms each, ~100 ms to drain.
    rt.reactors()[1]
        .send(move |r| {
            r.poller_mut::<Draining>(id).expect("poller").in_flight = 20;
        })
        .expect("send");
    let stats = rt.stop().expect("stop");
    assert_eq!(
        probes.completed.load(Relaxed),
        20,
        "stopped with work in flight"
    );
    assert!(
        probes.stop_calls.load(Relaxed) >= 2,
        "drain took more than one round"
    );
    assert!(probes.polled_while_stopping.load(Relaxed) > 0);
    assert!(probes.dropped.load(Relaxed), "poller not dropped at exit");
    assert!(
        stats.iter().all(|s| s.exited && !s.drain_timed_out),
        "{stats:?}"
    );
}

#[test]
fn drain_timeout_bounds_a_poller_that_never_drains() {
    let timeout = Duration::from_millis(200);
    let rt = Runtime::start(cfg(&[0]).drain_timeout(timeout)).expect("start");
    let (p, probes) = draining(0, true);
    rt.reactors()[0]
        .send(move |r| {
            r.add_poller(Box::new(p));
        })
        .expect("send");
    let t0 = Instant::now();
    let stats = rt.stop().expect("stop");
    let took = t0.elapsed();
    assert!(took >= timeout, "exited before the drain timeout: {took:?}");
    assert!(
        took < Duration::from_secs(5),
        "drain timeout not enforced: {took:?}"
    );
    assert!(stats[0].drain_timed_out);
    assert!(stats[0].exited);
    assert!(probes.stop_calls.load(Relaxed) > 1);
    assert!(probes.dropped.load(Relaxed));
}

#[test]
fn messages_queued_before_stop_run() {
    let rt = Runtime::start(cfg(&[1])).expect("start");
    let ran = Arc::new(AtomicU64::new(0));
    for _ in 0..100 {
        let ran = Arc::clone(&ran);
        rt.reactors()[0]
            .send(move |_| {
                ran.fetch_add(1, Relaxed);
            })
            .expect("send");
    }
    rt.stop().expect("stop");
    assert_eq!(ran.load(Relaxed), 100);
}

#[test]
fn a_panicking_reactor_is_reported_by_stop() {
    let rt = Runtime::start(cfg(&[0, 1])).expect("start");
    let (tx, rx) = crossbeam_channel::bounded::<()>(1);
    rt.reactors()[1]
        .send(move |_| {
            let _tx = tx; // dropped by the unwinding
            panic!("test: message panics on purpose");
        })
        .expect("send");
    // Wait for the panic to have happened.
    assert_eq!(
        rx.recv_timeout(common::PATIENCE),
        Err(crossbeam_channel::RecvTimeoutError::Disconnected)
    );
    assert!(matches!(
        rt.stop(),
        Err(PollerError::ReactorPanicked { reactor: 1 })
    ));
}
