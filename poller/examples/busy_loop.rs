//! Busy-loop overhead: nanoseconds per reactor loop iteration with N trivial pollers (idle mode
//! off, so the reactor spins). Prints the figure for 0, 1, 4 and 16 pollers, per CPU time the
//! reactor thread got (from /proc/self/task/<tid>/schedstat, robust to a shared machine) and per
//! wall time.
//!
//! `cargo run --release -p nvmf-poller --example busy_loop -- [seconds per case] [core]`
//! (default 2 s, core 1)

use std::hint::black_box;
use std::time::{Duration, Instant};

use nvmf_poller::{PollStatus, Poller, ReactorCtx, Runtime, RuntimeConfig};

/// Does (almost) nothing, like a poll group with an empty CQ.
struct Nop(u64);

impl Poller for Nop {
    fn poll(&mut self, _ctx: &mut ReactorCtx) -> PollStatus {
        self.0 = black_box(self.0.wrapping_add(1));
        PollStatus::Idle
    }
}

/// Nanoseconds the calling thread has run on a CPU (first field of its schedstat).
fn thread_cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(0)
}

fn main() {
    let mut args = std::env::args().skip(1);
    let secs: u64 = args.next().and_then(|v| v.parse().ok()).unwrap_or(2);
    let core: usize = args.next().and_then(|v| v.parse().ok()).unwrap_or(1);
    for pollers in [0usize, 1, 4, 16] {
        let cfg = RuntimeConfig::new([core]).idle_after(Duration::MAX);
        let rt = Runtime::start(cfg).expect("start");
        let h = rt.reactors()[0].clone();
        h.call(move |r| {
            for _ in 0..pollers {
                r.add_poller(Box::new(Nop(0)));
            }
        })
        .expect("setup");
        std::thread::sleep(Duration::from_millis(200));
        // Counters and CPU time read together on the reactor thread itself.
        let sample = || {
            h.call(|r| (r.stats().polls, thread_cpu_ns()))
                .expect("sample")
        };
        let (p0, c0) = sample();
        let t0 = Instant::now();
        std::thread::sleep(Duration::from_secs(secs));
        let (p1, c1) = sample();
        let wall = t0.elapsed();
        let iters = (p1 - p0) as f64;
        let cpu = (c1 - c0) as f64;
        println!(
            "{pollers:>2} trivial pollers: {:.1} ns CPU per loop iteration ({:.1} ns wall; reactor \
             got {:.0}% of a core; {:.1} M iterations/s)",
            cpu / iters,
            wall.as_nanos() as f64 / iters,
            cpu * 100.0 / wall.as_nanos() as f64,
            iters / wall.as_secs_f64() / 1e6,
        );
        rt.stop().expect("stop");
    }
}
