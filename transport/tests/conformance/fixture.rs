//! What every conformance test starts from: a device of one provider, an address on it, and
//! helpers to build connected QP pairs and to wait for completions.

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use nvmf_transport::*;

/// The providers the suite runs against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flavor {
    SoftInProcess,
    SoftTcp,
    Verbs,
}

pub struct Fx {
    #[allow(dead_code)] // read by the pollgroup suite, which shares this fixture
    pub flavor: Flavor,
    pub ctx: Context,
    pub ip: IpAddr,
    pub port: u8,
    pub gid_index: u8,
    /// Every CQ the test made: waiting polls them all, as reactors on both sides would (the
    /// soft TCP fabric progresses a QP only when its CQ is polled).
    cqs: RefCell<Vec<Cq>>,
    stash: RefCell<HashMap<u32, VecDeque<WorkCompletion>>>,
}

/// How long a completion may take: generous, because the verbs runs happen under emulation.
pub fn patience() -> Duration {
    Duration::from_secs(match std::env::var("NVMF_TEST_PATIENCE_SECS") {
        Ok(s) => s.parse().unwrap_or(30),
        Err(_) => 30,
    })
}

static NEXT_DEVICE: AtomicU32 = AtomicU32::new(0);

impl Fx {
    /// A fixture for `flavor`. Panics for `Verbs` when there is no verbs device: those tests
    /// are `#[ignore]`d and run only where one exists. (Still an `Option` for the callers'
    /// `let Some(fx) = .. else` form.)
    pub fn open(flavor: Flavor) -> Option<Fx> {
        Fx::open_with(flavor, true)
    }

    /// `last_wqe_reached` only affects soft devices (verbs devices are what they are).
    pub fn open_with(flavor: Flavor, last_wqe_reached: bool) -> Option<Fx> {
        // A device per test, each on its own loopback address: tests run in parallel threads,
        // and the CM resolves an address to the device that owns it.
        let n = NEXT_DEVICE.fetch_add(1, Ordering::Relaxed);
        let own_ip = Ipv4Addr::new(127, 0, 1 + (n / 250) as u8, 2 + (n % 250) as u8);
        let soft = |fabric| {
            DeviceSpec::Soft(SoftConfig {
                name: format!("conf{}-{n}", std::process::id()),
                fabric,
                ip: own_ip,
                last_wqe_reached,
                ..SoftConfig::default()
            })
        };
        let (spec, ip) = match flavor {
            Flavor::SoftInProcess => (soft(SoftFabric::InProcess), IpAddr::V4(own_ip)),
            Flavor::SoftTcp => (soft(SoftFabric::Tcp), IpAddr::V4(own_ip)),
            Flavor::Verbs => {
                let has_verbs = devices()
                    .map(|d| d.iter().any(|d| d.provider == ProviderKind::Verbs))
                    .unwrap_or(false);
                // Verbs cases are #[ignore]d where there is no device: one that runs anyway
                // was asked for, and must not pass having tested nothing.
                assert!(
                    has_verbs,
                    "a verbs test ran without a verbs device: run it in the QEMU lab (rxe)"
                );
                let ip = std::env::var("NVMF_TEST_IP")
                    .ok()
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(IpAddr::V4(Ipv4Addr::new(10, 10, 0, 1)));
                (
                    DeviceSpec::Verbs(std::env::var("NVMF_TEST_DEVICE").ok()),
                    ip,
                )
            }
        };
        let ctx = Context::open(&spec).expect("open device");
        let port = 1;
        let gid_index = ctx
            .gid_index_for(port, ip)
            .expect("GID index for the test address") as u8;
        Some(Fx {
            flavor,
            ctx,
            ip,
            port,
            gid_index,
            cqs: RefCell::default(),
            stash: RefCell::default(),
        })
    }

    pub fn cq(&self, depth: u32) -> Cq {
        let cq = self.ctx.create_cq(depth, None).expect("create cq");
        self.register(&cq);
        cq
    }

    /// Have the wait helpers service `cq` too.
    pub fn register(&self, cq: &Cq) {
        self.cqs.borrow_mut().push(cq.clone());
    }

    /// Polls every registered CQ once, keeping what it reaps. Returns how many it reaped.
    pub fn pump(&self) -> usize {
        let mut batch = [WorkCompletion::default(); 32];
        let mut total = 0;
        for cq in self.cqs.borrow().iter() {
            let k = cq.poll(&mut batch).expect("poll cq");
            self.stash
                .borrow_mut()
                .entry(cq.id())
                .or_default()
                .extend(&batch[..k]);
            total += k;
        }
        total
    }

    fn take(&self, cq: &Cq, max: usize) -> Vec<WorkCompletion> {
        let mut stash = self.stash.borrow_mut();
        let q = stash.entry(cq.id()).or_default();
        let n = q.len().min(max);
        q.drain(..n).collect()
    }

    /// Polls until `n` completions arrived on `cq` (or panics after `patience()`).
    pub fn wait_wcs(&self, cq: &Cq, n: usize) -> Vec<WorkCompletion> {
        let deadline = Instant::now() + patience();
        let mut got = Vec::with_capacity(n);
        loop {
            got.extend(self.take(cq, n - got.len()));
            if got.len() == n {
                return got;
            }
            if self.pump() == 0 {
                assert!(
                    Instant::now() < deadline,
                    "timed out: {} of {n} completions: {got:?}",
                    got.len()
                );
                std::thread::yield_now();
            }
        }
    }

    /// Polls for `quiet` and asserts nothing arrives on `cq`.
    pub fn assert_no_wc(&self, cq: &Cq, quiet: Duration) {
        let deadline = Instant::now() + quiet;
        while Instant::now() < deadline {
            self.pump();
            let got = self.take(cq, usize::MAX);
            assert!(got.is_empty(), "unexpected completions: {got:?}");
            std::thread::yield_now();
        }
    }

    /// Polls the device's async events (servicing the CQs meanwhile) until one matches `want`.
    pub fn wait_async(&self, want: impl Fn(&AsyncEventKind) -> bool) -> AsyncEventKind {
        let deadline = Instant::now() + patience();
        loop {
            if let Some(ev) = self.ctx.poll_async_event().expect("poll async event") {
                if want(&ev.kind) {
                    return ev.kind;
                }
            } else {
                self.pump();
                assert!(
                    Instant::now() < deadline,
                    "timed out waiting for an async event"
                );
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }

    /// A QP on `pd` with the given CQs (and SRQ), in RESET.
    pub fn qp(&self, pd: &Pd, send_cq: &Cq, recv_cq: &Cq, srq: Option<&Srq>) -> Qp {
        pd.create_qp(&QpInitAttr {
            send_cq,
            recv_cq,
            srq,
            caps: QpCaps {
                max_send_wr: 64,
                max_recv_wr: if srq.is_some() { 0 } else { 64 },
                max_send_sge: 2,
                max_recv_sge: 2,
                max_inline_data: 64,
            },
            sq_sig_all: false,
        })
        .expect("create qp")
    }

    /// Brings `a` and `b` (both in RESET, on this device) to RTS, connected to each other.
    pub fn connect(&self, a: &mut Qp, b: &mut Qp, rnr_retry: u8) {
        let access = Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE;
        a.modify_to_init(self.port, access).expect("a to INIT");
        b.modify_to_init(self.port, access).expect("b to INIT");
        let ea = a
            .endpoint(self.port, self.gid_index, 100)
            .expect("a endpoint");
        let eb = b
            .endpoint(self.port, self.gid_index, 200)
            .expect("b endpoint");
        for (qp, remote) in [(&mut *a, eb), (&mut *b, ea)] {
            qp.modify_to_rtr(&RtrAttr {
                remote,
                port_num: self.port,
                sgid_index: self.gid_index,
                path_mtu: Mtu::Mtu1024,
                max_dest_rd_atomic: 16,
                min_rnr_timer: 1,
            })
            .expect("to RTR");
        }
        for (qp, psn) in [(&mut *a, 100), (&mut *b, 200)] {
            qp.modify_to_rts(&RtsAttr {
                sq_psn: psn,
                timeout: 14,
                retry_cnt: 7,
                rnr_retry,
                max_rd_atomic: 16,
            })
            .expect("to RTS");
        }
    }
}

/// Receive-side access for test MRs.
pub fn all_access() -> Access {
    Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE
}

/// A recognisable pattern for `len` bytes, distinct per `seed`.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}
