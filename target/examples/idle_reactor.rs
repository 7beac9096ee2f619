//! How much CPU does an idle reactor hosting a real poll group burn? One reactor with the RDMA
//! transport's poll group on a soft TCP device, one host connected through the CM (one capsule
//! answered, then silence), idle for N seconds; prints the reactor thread's CPU use as % of one
//! core (from /proc/self/task/<tid>/schedstat, nanosecond resolution) and the reactor's sleep
//! counters. Idle mode sleeps on the group's completion channel and the TCP fabric's progress
//! fd, so the figure should be far below 5 %.
//!
//! `cargo run --release -p nvmf-target --example idle_reactor -- [seconds] [core] [pin]`
//! (default 5 s, core 0, unpinned)
#![forbid(unsafe_code)]

#[allow(dead_code)] // shared with the tests; only part is used here
#[path = "../tests/rdma/echo.rs"]
mod echo;
#[allow(dead_code)]
#[path = "../tests/rdma/host.rs"]
mod host;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use nvmf_poller::{Runtime, RuntimeConfig};
use nvmf_target::rdma::*;
use nvmf_transport::*;

/// Nanoseconds the thread `tid` of this process has run on a CPU.
fn thread_cpu_ns(tid: u32) -> u64 {
    nvmf_poller::cputime::thread_cpu_time(tid)
        .expect("thread CPU time")
        .as_nanos() as u64
}

fn main() {
    let mut args = std::env::args().skip(1);
    let secs: u64 = args.next().and_then(|v| v.parse().ok()).unwrap_or(5);
    let core: usize = args.next().and_then(|v| v.parse().ok()).unwrap_or(0);
    let pin = args.next().is_some_and(|v| v == "pin");

    let ip = Ipv4Addr::new(127, 0, 3, 2);
    let ctx = Context::open(&DeviceSpec::Soft(SoftConfig {
        name: "idle0".into(),
        fabric: SoftFabric::Tcp,
        ip,
        ..SoftConfig::default()
    }))
    .expect("soft TCP device");
    let rt = Runtime::start(RuntimeConfig {
        cores: vec![core],
        pin,
        ..RuntimeConfig::default()
    })
    .expect("runtime");
    let h = rt.reactors()[0].clone();
    let addr = SocketAddr::new(IpAddr::V4(ip), 4420);
    let mut cfg = RdmaConfig::new(vec![DeviceListen {
        ctx: ctx.clone(),
        listen: vec![addr],
    }]);
    // A production-sized group (SRQ 4096, CQ 3x): idleness must not depend on a small group.
    cfg.group = PollGroupConfig::default();
    let log = echo::Shared::default();
    let tr = RdmaTransport::start(rt.reactors(), cfg, |info| echo::Echo {
        info,
        log: log.clone(),
    })
    .expect("transport");

    let mut conn = host::Host::connect(addr, host::request(1, 128, 127), 16).expect("connect");
    assert!(conn.round_trip(0), "one capsule answered");
    println!(
        "one reactor (core {core}, {}), poll group on soft TCP device {} (SRQ {}), one host \
         connected (CRQSIZE {}), idle_after {:?}",
        if pin { "pinned" } else { "unpinned" },
        ctx.name(),
        PollGroupConfig::default().srq_depth,
        conn.crqsize,
        nvmf_poller::DEFAULT_IDLE_AFTER,
    );

    let tid = h.os_tid().expect("reactor thread id");
    // Let it settle: the connection set-up was work.
    std::thread::sleep(Duration::from_millis(200));
    let s0 = h.stats();
    let c0 = thread_cpu_ns(tid);
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_secs(secs));
    let wall = t0.elapsed();
    let c1 = thread_cpu_ns(tid);
    let s1 = h.stats();
    let pct = (c1 - c0) as f64 * 100.0 / wall.as_nanos() as f64;
    println!(
        "idle reactor with a poll group: CPU {pct:.3}% of a core over {:.1} s  (loop iterations \
         {}, sleeps {}, wake-ups by fd/message {}, sleep aborts {})",
        wall.as_secs_f64(),
        s1.polls - s0.polls,
        s1.sleeps - s0.sleeps,
        s1.wakeups - s0.wakeups,
        s1.sleep_aborts - s0.sleep_aborts,
    );

    // Still serving after the sleep: the first capsule wakes the reactor.
    let t = Instant::now();
    assert!(conn.round_trip(0), "answered after idling");
    println!("first round trip after idling: {:?}", t.elapsed());
    drop(conn);
    tr.stop(Duration::from_secs(5)).expect("transport stop");
    rt.stop().expect("runtime stop");
    if pct >= 5.0 {
        eprintln!("FAIL: an idle reactor must use under 5% of a core");
        std::process::exit(1);
    }
}
