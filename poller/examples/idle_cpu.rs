//! How much CPU does an idle reactor burn? Starts one reactor with four fd-armed pollers and a
//! 100 ms periodic timer (a keep-alive check), leaves it idle, and prints the reactor thread's
//! CPU use as a % of one core (from /proc/self/task/<tid>/schedstat, nanosecond resolution).
//! For contrast it then does the same with idle mode off (pure busy polling).
//!
//! `cargo run --release -p nvmf-poller --example idle_cpu -- [seconds] [core]` (default 5 s, core 0)

use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use nvmf_poller::{Arm, PollStatus, Poller, ReactorCtx, Runtime, RuntimeConfig, WakeFds};

/// A poller with a wake-up fd and never any work (like an idle poll group's CQ channel).
struct Quiet {
    sock: UnixStream,
    _peer: UnixStream,
}

impl Poller for Quiet {
    fn poll(&mut self, _ctx: &mut ReactorCtx) -> PollStatus {
        PollStatus::Idle
    }
    fn arm(&mut self, fds: &mut WakeFds) -> Arm {
        fds.watch(&self.sock);
        Arm::Armed
    }
}

/// Nanoseconds the thread `tid` of this process has run on a CPU.
fn thread_cpu_ns(tid: u32) -> u64 {
    nvmf_poller::cputime::thread_cpu_time(tid)
        .expect("thread CPU time")
        .as_nanos() as u64
}

fn measure(cfg: RuntimeConfig, secs: u64, label: &str) {
    let rt = Runtime::start(cfg).expect("start");
    let h = rt.reactors()[0].clone();
    h.call(|r| {
        for _ in 0..4 {
            let (sock, peer) = UnixStream::pair().expect("socketpair");
            r.add_poller(Box::new(Quiet { sock, _peer: peer }));
        }
        r.add_timer(
            Duration::from_millis(100),
            Some(Duration::from_millis(100)),
            |_| {},
        );
    })
    .expect("setup");
    let tid = h.os_tid().expect("reactor thread id");
    // Let it settle (the setup itself was work).
    std::thread::sleep(Duration::from_millis(100));
    let s0 = h.stats();
    let c0 = thread_cpu_ns(tid);
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_secs(secs));
    let wall = t0.elapsed();
    let c1 = thread_cpu_ns(tid);
    let s1 = h.stats();
    let pct = (c1 - c0) as f64 * 100.0 / wall.as_nanos() as f64;
    println!(
        "{label}: reactor CPU {pct:.3}% of a core over {:.1} s  (loop iterations {}, sleeps {}, \
         wake-ups by fd/message {}, timer ticks {})",
        wall.as_secs_f64(),
        s1.polls - s0.polls,
        s1.sleeps - s0.sleeps,
        s1.wakeups - s0.wakeups,
        s1.timers_fired - s0.timers_fired,
    );
    rt.stop().expect("stop");
}

fn main() {
    let mut args = std::env::args().skip(1);
    let secs: u64 = args.next().and_then(|v| v.parse().ok()).unwrap_or(5);
    let core: usize = args.next().and_then(|v| v.parse().ok()).unwrap_or(0);
    let cfg = RuntimeConfig::new([core]);
    println!(
        "one reactor on core {core}, 4 idle fd pollers + 100 ms periodic timer, idle_after {:?}",
        cfg.idle_after
    );
    measure(cfg.clone(), secs, "idle mode on ");
    measure(cfg.idle_after(Duration::MAX), secs.min(2), "idle mode off");
}
