//! Helpers shared by the integration tests: small pollers and a condition waiter.
#![allow(dead_code)]

use std::io::Read;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use nvmf_poller::{Arm, PollStatus, Poller, ReactorCtx, RuntimeConfig, WakeFds};

/// Generous: this machine has 2 cores and other builds running.
pub const PATIENCE: Duration = Duration::from_secs(10);

/// Unpinned config on the given cores (tests must not fight over pinned cores).
pub fn cfg(cores: &[usize]) -> RuntimeConfig {
    RuntimeConfig::new(cores.to_vec()).pin(false)
}

/// Poll `cond` every millisecond until it holds or `PATIENCE` passes.
pub fn wait_for(mut cond: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + PATIENCE;
    while Instant::now() < end {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    cond()
}

/// Counts its polls; reports work or not as told. No wake-up source.
pub struct Counting {
    pub polls: Arc<AtomicU64>,
    pub busy: bool,
}

impl Counting {
    pub fn new(busy: bool) -> (Self, Arc<AtomicU64>) {
        let polls = Arc::new(AtomicU64::new(0));
        (
            Counting {
                polls: Arc::clone(&polls),
                busy,
            },
            polls,
        )
    }
}

impl Poller for Counting {
    fn poll(&mut self, _ctx: &mut ReactorCtx) -> PollStatus {
        self.polls.fetch_add(1, Relaxed);
        if self.busy {
            PollStatus::Busy(1)
        } else {
            PollStatus::Idle
        }
    }
}

/// Reads bytes from a non-blocking socket; arms the socket's fd for idle sleep.
pub struct SocketPoller {
    pub sock: UnixStream,
    pub received: Arc<AtomicU64>,
}

impl SocketPoller {
    /// The poller and the peer end to write to.
    pub fn pair() -> (Self, UnixStream, Arc<AtomicU64>) {
        let (a, b) = UnixStream::pair().expect("socketpair");
        a.set_nonblocking(true).expect("nonblocking");
        let received = Arc::new(AtomicU64::new(0));
        (
            SocketPoller {
                sock: a,
                received: Arc::clone(&received),
            },
            b,
            received,
        )
    }
}

impl Poller for SocketPoller {
    fn poll(&mut self, _ctx: &mut ReactorCtx) -> PollStatus {
        let mut buf = [0u8; 64];
        match self.sock.read(&mut buf) {
            Ok(n) => {
                self.received.fetch_add(n as u64, Relaxed);
                PollStatus::from_count(n)
            }
            Err(_) => PollStatus::Idle,
        }
    }

    fn arm(&mut self, fds: &mut WakeFds) -> Arm {
        fds.watch(&self.sock);
        Arm::Armed
    }

    fn name(&self) -> &str {
        "socket"
    }
}
