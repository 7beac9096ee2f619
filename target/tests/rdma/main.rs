//! The target's RDMA transport on the soft provider, in-process and TCP fabrics: connections
//! placed over reactors (round robin, least loaded) with their QPs on the chosen group's CQ and
//! SRQ; CM and async events reaching the owning reactor as messages; NVMe-oF connect requests
//! with bad private data rejected with the NVMe-oF status while the acceptor keeps serving.
//! Every handler callback is checked to have run on its own reactor's thread.
#![forbid(unsafe_code)]

mod echo;
mod host;
mod host_group;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU32, Ordering};
use std::thread::ThreadId;
use std::time::Duration;

use echo::{Echo, Shared};
use host::{Host, Refused, patience, request, wait_until};
use nvmf_poller::{Runtime, RuntimeConfig};
use nvmf_protocol::cm::RejectStatus;
use nvmf_target::rdma::*;
use nvmf_transport::pollgroup::{DrainReason, QpairEvent};
use nvmf_transport::*;

static NEXT: AtomicU32 = AtomicU32::new(0);

/// A runtime of `reactors` unpinned reactors, a soft device on its own loopback address, and the
/// transport listening on it with one poll group per reactor.
struct Rig {
    rt: Option<Runtime>,
    tr: Option<RdmaTransport<(), Echo>>,
    ctx: Context,
    addr: SocketAddr,
    log: Shared,
    /// Thread of each reactor.
    threads: Vec<ThreadId>,
}

fn small_groups() -> PollGroupConfig {
    PollGroupConfig {
        srq_depth: 256,
        max_qpairs: 16,
        max_queue_depth: 32,
        in_capsule_data_size: 0,
        io_unit_size: 4096,
        data_buffers: 256,
        max_requests: 256,
        batch: 32,
        drain_timeout: Duration::from_secs(20),
        drain_grace: Duration::from_millis(20),
        ..PollGroupConfig::default()
    }
}

impl Rig {
    fn new(fabric: SoftFabric, reactors: usize, policy: PlacementPolicy) -> Rig {
        Rig::with_device(fabric, reactors, policy, true)
    }

    /// `last_wqe_reached: false` makes the device behave like rxe / iWARP.
    fn with_device(
        fabric: SoftFabric,
        reactors: usize,
        policy: PlacementPolicy,
        last_wqe_reached: bool,
    ) -> Rig {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let ip = Ipv4Addr::new(127, 0, 2, 2 + (n % 250) as u8);
        let ctx = Context::open(&DeviceSpec::Soft(SoftConfig {
            name: format!("tgt{}-{n}", std::process::id()),
            fabric,
            ip,
            last_wqe_reached,
            ..SoftConfig::default()
        }))
        .expect("soft device");
        let rt = Runtime::start(RuntimeConfig {
            cores: (0..reactors).collect(),
            pin: false,
            ..RuntimeConfig::default()
        })
        .expect("runtime");
        let threads = rt
            .reactors()
            .iter()
            .map(|h| h.call(|_| std::thread::current().id()).unwrap())
            .collect();
        let addr = SocketAddr::new(IpAddr::V4(ip), 4420);
        let mut cfg = RdmaConfig::new(vec![DeviceListen {
            ctx: ctx.clone(),
            listen: vec![addr],
        }]);
        cfg.group = small_groups();
        cfg.placement = policy;
        let log = Shared::default();
        let l = log.clone();
        let tr = RdmaTransport::start(rt.reactors(), cfg, |info| Echo {
            info,
            log: l.clone(),
        })
        .expect("transport");
        assert_eq!(tr.listening(), &[addr]);
        Rig {
            rt: Some(rt),
            tr: Some(tr),
            ctx,
            addr,
            log,
            threads,
        }
    }

    fn tr(&self) -> &RdmaTransport<(), Echo> {
        self.tr.as_ref().unwrap()
    }

    /// An I/O queue connection (QID 1, depth 32), proven by one round trip.
    fn connect(&self, host: u32) -> Host {
        let mut h = Host::connect(self.addr, request(1, 32, 31), 4).expect("accepted");
        assert_eq!(h.crqsize, 32);
        assert!(h.round_trip(host), "host {host}: round trip");
        h
    }

    /// Reactor and target qp_num of `host`.
    fn placed(&self, host: u32) -> (usize, u32) {
        self.log.placed(host).expect("host seen by a group")
    }

    fn qpairs(&self, reactor: usize) -> usize {
        self.tr()
            .with_group(0, reactor, |g| g.poll_group().qpair_count())
            .unwrap()
            .unwrap()
    }

    /// Waits until reactor `r`'s group has no request alive: every answer SEND completed, so
    /// a QP moving to ERR now flushes nothing (no error completion races the event under test).
    fn quiet(&self, r: usize) {
        wait_until("answers acknowledged", || {
            self.tr()
                .with_group(0, r, |g| g.poll_group().requests_in_use())
                .unwrap()
                .unwrap()
                == 0
        });
    }

    /// Every handler callback ran on the thread of the reactor owning its group.
    fn assert_threads(&self) {
        let log = self.log.lock();
        assert!(!log.threads.is_empty());
        for &(reactor, thread) in &log.threads {
            assert_eq!(
                thread, self.threads[reactor],
                "a callback of reactor {reactor}'s group ran on another thread"
            );
        }
    }

    fn stop(mut self) {
        self.tr
            .take()
            .unwrap()
            .stop(patience())
            .expect("transport drains");
        self.rt.take().unwrap().stop().expect("runtime stops");
    }
}

fn placement_round_robin(fabric: SoftFabric) {
    let rig = Rig::new(fabric, 2, PlacementPolicy::RoundRobin);
    let mut hosts: Vec<Host> = (0..4).map(|i| rig.connect(i)).collect();
    for i in 0..4u32 {
        assert_eq!(
            rig.placed(i).0,
            i as usize % 2,
            "host {i} placed round robin"
        );
    }
    assert_eq!((rig.tr().load(0, 0), rig.tr().load(0, 1)), (2, 2));
    assert_eq!((rig.qpairs(0), rig.qpairs(1)), (2, 2));
    // More traffic: each host's capsules keep landing on the same group (its QP's CQ/SRQ).
    for _ in 0..5 {
        for (i, h) in hosts.iter_mut().enumerate() {
            assert!(h.round_trip(i as u32));
        }
    }
    {
        let log = rig.log.lock();
        assert_eq!(log.capsules.len(), 24);
        for s in &log.capsules {
            assert_eq!(s.reactor, s.host as usize % 2, "{s:?}");
        }
        let active = log
            .events
            .iter()
            .filter(|e| e.2 == QpairEvent::Active)
            .count();
        assert_eq!(active, 4, "ESTABLISHED reached every owning group");
    }
    rig.assert_threads();
    rig.stop();
}

fn placement_least_loaded(fabric: SoftFabric) {
    let rig = Rig::new(fabric, 2, PlacementPolicy::LeastLoaded);
    let a = rig.connect(0);
    let mut b = rig.connect(1);
    let _c = rig.connect(2);
    let at = |i| rig.placed(i).0;
    assert_eq!((at(0), at(1), at(2)), (0, 1, 0));
    // B leaves: reactor 1 empties.
    let (_, b_qpn) = rig.placed(1);
    b.disconnect();
    wait_until("B's qpair gone", || rig.log.gone(b_qpn));
    wait_until("reactor 1's slot released", || rig.tr().load(0, 1) == 0);
    assert_eq!(rig.tr().load(0, 0), 2);
    // The emptier reactor fills up first, then ties go to the lowest index.
    let _d = rig.connect(3);
    let _e = rig.connect(4);
    let _f = rig.connect(5);
    assert_eq!((at(3), at(4), at(5)), (1, 1, 0));
    assert_eq!((rig.qpairs(0), rig.qpairs(1)), (3, 2));
    drop(a);
    rig.assert_threads();
    rig.stop();
}

/// Stats of reactor `r`'s group.
fn stats(rig: &Rig, r: usize) -> nvmf_transport::pollgroup::PollGroupStats {
    rig.tr()
        .with_group(0, r, |g| g.poll_group().stats())
        .unwrap()
        .unwrap()
}

fn events_as_messages(fabric: SoftFabric) {
    let rig = Rig::new(fabric, 2, PlacementPolicy::RoundRobin);
    let mut hosts: Vec<Host> = (0..3).map(|i| rig.connect(i)).collect();
    let (r1, q1) = rig.placed(1);
    let (r2, q2) = rig.placed(2);
    assert_eq!((r1, r2), (1, 0));

    // Host 1 disconnects. Its target QP goes to ERR at once (as rdma_cm does on a DREQ), so
    // DISCONNECTED or LAST_WQE_REACHED, whichever the owning reactor hears first, starts the
    // drain (`disconnect_routed` shows the CM event alone suffices). The drain ends on
    // LAST_WQE_REACHED: the async event reached the owning reactor.
    rig.quiet(1);
    hosts[1].disconnect();
    wait_until("host 1's qpair gone", || rig.log.gone(q1));
    let reason = rig.log.drain_reason(q1);
    assert!(
        matches!(
            reason,
            Some(DrainReason::PeerDisconnected | DrainReason::AsyncError)
        ),
        "{reason:?}"
    );
    assert_eq!(rig.qpairs(1), 0);
    let s1 = stats(&rig, 1);
    assert_eq!((s1.drained_last_wqe, s1.drained_timeout), (1, 0), "{s1:?}");
    // The others are unaffected.
    assert!(hosts[0].round_trip(0));
    assert!(hosts[2].round_trip(2));

    // A QP fault on host 2's target QP: QP_FATAL (the only signal: nothing is in flight) is
    // routed to reactor 0, which drains the qpair and disconnects the host.
    rig.quiet(0);
    rig.ctx.as_soft().unwrap().faults().fail_qp(q2).unwrap();
    wait_until("host 2's qpair gone", || rig.log.gone(q2));
    assert_eq!(rig.log.drain_reason(q2), Some(DrainReason::AsyncError));
    hosts[2].wait_cm("host 2 disconnected by the target", |k| {
        matches!(k, CmEventKind::Disconnected)
    });
    // Host 0 on the same reactor still works; the groups hold exactly what is left.
    assert!(hosts[0].round_trip(0));
    assert_eq!((rig.qpairs(0), rig.qpairs(1)), (1, 0));
    wait_until("slots released", || {
        (rig.tr().load(0, 0), rig.tr().load(0, 1)) == (1, 0)
    });
    assert_eq!(stats(&rig, 0).drained_timeout, 0);
    // LAST_WQE_REACHED of host 1's QP and QP_FATAL of host 2's went to their owner only
    // (the acceptor's qp_num table), not broadcast.
    let a = rig.tr().acceptor_stats();
    assert!(a.async_routed >= 2, "{a:?}");
    assert_eq!(a.placed, 3, "{a:?}");
    // ESTABLISHED x3; host 1's DISCONNECTED too unless its qpair was gone by then.
    assert!(a.cm_routed >= 3, "{a:?}");
    // Nothing of host 1 or 2 ever reached the other reactor.
    {
        let log = rig.log.lock();
        for &(r, q, e) in &log.events {
            if q == q1 {
                assert_eq!(r, 1, "{e:?}");
            }
            if q == q2 {
                assert_eq!(r, 0, "{e:?}");
            }
        }
    }
    rig.assert_threads();
    rig.stop();
}

/// On a device that never raises LAST_WQE_REACHED (rxe, iWARP) a host disconnect is seen only
/// through the CM: DISCONNECTED routed to the owning reactor starts the drain, which ends on
/// the flush fallback.
fn disconnect_routed(fabric: SoftFabric) {
    let rig = Rig::with_device(fabric, 2, PlacementPolicy::RoundRobin, false);
    let mut a = rig.connect(0);
    let mut b = rig.connect(1);
    let (rb, qb) = rig.placed(1);
    assert_eq!(rb, 1);
    rig.quiet(1);
    b.disconnect();
    wait_until("host 1's qpair gone", || rig.log.gone(qb));
    assert_eq!(
        rig.log.drain_reason(qb),
        Some(DrainReason::PeerDisconnected)
    );
    let s = stats(&rig, 1);
    assert_eq!((s.drained_flush, s.drained_timeout), (1, 0), "{s:?}");
    assert!(a.round_trip(0));
    assert_eq!((rig.qpairs(0), rig.qpairs(1)), (1, 0));
    rig.assert_threads();
    rig.stop();
}

fn bad_connect_rejected(fabric: SoftFabric) {
    let rig = Rig::new(fabric, 1, PlacementPolicy::RoundRobin);
    let mut wrong_fmt = request(1, 32, 31);
    wrong_fmt[0] = 1;
    let cases = [
        ("RECFMT 1", wrong_fmt, 4, RejectStatus::InvalidRecfmt),
        ("QID 65", request(65, 32, 31), 4, RejectStatus::InvalidQid),
        (
            "HSQSIZE 0",
            request(1, 32, 0),
            4,
            RejectStatus::InvalidHsqsize,
        ),
        (
            "HRQSIZE 0",
            request(1, 0, 31),
            4,
            RejectStatus::InvalidHrqsize,
        ),
        (
            "8 bytes of private data",
            request(1, 32, 31)[..8].to_vec(),
            4,
            RejectStatus::InvalidPrivateDataLength,
        ),
        (
            "no RDMA READ depth",
            request(1, 32, 31),
            0,
            RejectStatus::InvalidIrd,
        ),
    ];
    for (what, pd, ird, want) in cases {
        match Host::connect(rig.addr, pd, ird) {
            Err(Refused::Rejected(Some(rej))) => {
                assert_eq!((rej.recfmt, rej.status), (0, want), "{what}")
            }
            Err(other) => panic!("{what}: {other:?}"),
            Ok(_) => panic!("{what}: accepted"),
        }
    }
    assert_eq!(rig.tr().load(0, 0), 0, "a rejected request takes no slot");
    let a = rig.tr().acceptor_stats();
    assert_eq!((a.rejected, a.placed), (6, 0), "{a:?}");
    // The acceptor keeps serving: the admin queue (QID 0, Linux sizes) and QID 64 connect, and
    // depths are negotiated with HSQSIZE 0's based.
    let mut admin = Host::connect(rig.addr, request(0, 32, 31), 16).expect("admin queue");
    assert_eq!(admin.crqsize, 32);
    assert!(admin.round_trip(7));
    let io = Host::connect(rig.addr, request(64, 128, 15), 16).expect("QID 64");
    assert_eq!(io.crqsize, 16, "min(own 32, HRQSIZE 128, HSQSIZE 15 + 1)");
    assert_eq!(rig.qpairs(0), 2);
    rig.assert_threads();
    rig.stop();
}

/// A host-side poll group (the initiator's) connects through the CM and completes commands.
fn host_group_connects_and_completes(fabric: SoftFabric) {
    let rig = Rig::new(fabric, 1, PlacementPolicy::RoundRobin);
    host_group::run(rig.addr, 20);
    rig.stop();
}

macro_rules! per_fabric {
    ($($name:ident),*) => {
        mod inprocess {
            $(#[test] fn $name() { super::$name(nvmf_transport::SoftFabric::InProcess) })*
        }
        mod tcp {
            $(#[test] fn $name() { super::$name(nvmf_transport::SoftFabric::Tcp) })*
        }
    };
}

per_fabric!(
    placement_round_robin,
    placement_least_loaded,
    events_as_messages,
    disconnect_routed,
    bad_connect_rejected,
    host_group_connects_and_completes
);
