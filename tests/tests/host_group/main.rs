//! Many queues of many controllers on ONE host poll group: two controllers with three I/O
//! queues each (and their admin queues) connected from one thread share a single group (one
//! CQ); verified I/O on every queue; the CQ is polled once per pass over the queues; a
//! target-side disconnect of one I/O qpair fails only that queue's in-flight commands while
//! the other queues' held commands complete when released. On both soft fabrics.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use nvmf_initiator::Error;
use nvmf_initiator::clock::SystemClock;
use nvmf_initiator::controller::{Controller, ControllerOptions, ReconnectPolicy};
use nvmf_initiator::io::{IoCompletion, IoQueue, NsTarget, ReadyQueues};
use nvmf_initiator::queue::TransportAddress;
use nvmf_initiator::rdma::{RdmaFabric, RdmaQueue};
use nvmf_poller::{Runtime, RuntimeConfig};
use nvmf_target::bdev::MallocBdev;
use nvmf_target::bdev::gate::GateBdev;
use nvmf_target::nvme::{Limits, Namespace, ReactorIo, Subsystem, Target};
use nvmf_target::rdma::{DeviceListen, RdmaConfig, RdmaTransport};
use nvmf_target::transport_glue::{Command, NvmeHandler};
use nvmf_transport::{Context, DeviceSpec, SoftConfig, SoftFabric};

const NQN: &str = "nqn.2016-06.io.nvmf-rs:shared-group";
const BLOCKS: u64 = 8192;
const IO_DEPTH: u16 = 16;
const QUEUES_PER_CONTROLLER: u16 = 3;
const TARGET_REACTORS: usize = 2;

struct Rig {
    gate: Arc<AtomicBool>,
    runtime: Option<Runtime>,
    transport: Option<RdmaTransport<Command, NvmeHandler>>,
    address: TransportAddress,
    _ctx: Context,
}

impl Rig {
    /// nvmf-rs target on two reactors: namespace 1 malloc, namespace 2 a gate that holds I/O.
    fn start(fabric: SoftFabric, ip: Ipv4Addr) -> Rig {
        let addr = SocketAddr::from((ip, 4420));
        let mut t = Target::new(Limits::default(), vec![addr]);
        let malloc = Arc::new(MallocBdev::new("m0", 512, BLOCKS * 512).expect("malloc"));
        let gate = Arc::new(AtomicBool::new(true));
        let gated = Arc::new(GateBdev::new("gate", BLOCKS, gate.clone()));
        let sub = Arc::new(Subsystem::new(
            NQN,
            "SN-SHARED",
            "nvmf-rs shared group",
            true,
            vec![],
            4,
            vec![addr],
        ));
        for (nsid, bdev) in [
            (1, malloc as Arc<dyn nvmf_target::bdev::Bdev>),
            (2, gated as Arc<dyn nvmf_target::bdev::Bdev>),
        ] {
            let index = t.add_bdev(&bdev.info().name.clone(), bdev.clone());
            sub.add_namespace(Namespace {
                nsid,
                bdev_index: index,
                info: bdev.info().clone(),
                bdev,
                uuid: None,
                nguid: None,
            })
            .expect("namespace");
        }
        t.add_subsystem(sub);
        let target = Arc::new(t);
        let ctx = Context::open(&DeviceSpec::Soft(SoftConfig {
            name: format!("shared{}-{ip}", std::process::id()),
            fabric,
            ip,
            ..SoftConfig::default()
        }))
        .expect("soft device");
        let runtime = Runtime::start(RuntimeConfig {
            cores: (0..TARGET_REACTORS).collect(),
            pin: false,
            ..RuntimeConfig::default()
        })
        .expect("target reactors");
        let mut cfg = RdmaConfig::new(vec![DeviceListen {
            ctx: ctx.clone(),
            listen: vec![addr],
        }]);
        cfg.max_qid = target.limits().max_io_queues;
        let transport = RdmaTransport::start(runtime.reactors(), cfg, move |_| {
            NvmeHandler::new(target.clone(), ReactorIo::new(target.clone()))
        })
        .expect("transport");
        Rig {
            gate,
            runtime: Some(runtime),
            transport: Some(transport),
            address: TransportAddress {
                transport: String::new(),
                address: ip.to_string(),
                service: "4420".into(),
            },
            _ctx: ctx,
        }
    }

    /// Disconnects, from the target's side, one I/O qpair (the first found of the I/O
    /// queues' depth; admin queues are deeper). Returns its target-side qp_num.
    fn disconnect_one_io_qpair(&self) -> u32 {
        let tr = self.transport.as_ref().expect("running");
        for reactor in 0..TARGET_REACTORS {
            let found = tr
                .with_group(0, reactor, |g| {
                    let qp = g
                        .poll_group()
                        .qpair_nums()
                        .find(|&q| g.poll_group().qpair_depth(q) == Some(u32::from(IO_DEPTH)))?;
                    g.disconnect(qp);
                    Some(qp)
                })
                .expect("reactor")
                .flatten();
            if let Some(qp) = found {
                return qp;
            }
        }
        panic!("no I/O qpair on the target");
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        self.gate.store(true, Ordering::Release);
        if let Some(tr) = self.transport.take() {
            let _ = tr.stop(Duration::from_secs(5));
        }
        if let Some(rt) = self.runtime.take() {
            let _ = rt.stop();
        }
    }
}

fn controller(fabric: &RdmaFabric, address: &TransportAddress, host: u8) -> Controller<RdmaFabric> {
    let mut options = ControllerOptions::new(
        NQN,
        format!("nqn.2014-08.org.nvmexpress:uuid:0000000{host}-0000-0000-0000-000000000000"),
        [host; 16],
    );
    options.io_queues = QUEUES_PER_CONTROLLER;
    options.io_queue_depth = IO_DEPTH;
    options.reconnect = ReconnectPolicy::never();
    Controller::connect(
        fabric.clone(),
        address.clone(),
        options,
        Arc::new(SystemClock),
    )
    .expect("controller")
}

/// Every I/O queue of the controllers, in order.
fn io_queues(controllers: [&mut Controller<RdmaFabric>; 2]) -> Vec<IoQueue<RdmaQueue>> {
    let mut queues = Vec::new();
    for c in controllers {
        for i in 0..usize::from(QUEUES_PER_CONTROLLER) {
            queues.push(c.take_io_queue(i).expect("I/O queue"));
        }
    }
    queues
}

/// Each queue's block tag for block `i` of round `round`.
fn tag(queue: usize, round: u32, i: usize) -> u8 {
    (queue as u8).wrapping_mul(31) ^ (round as u8).wrapping_mul(7) ^ i as u8
}

/// Polls every queue once per pass until `want[q]` completions came on queue `q`; returns
/// them per queue and the passes it took.
fn reap_all(
    queues: &mut [IoQueue<RdmaQueue>],
    want: &[usize],
    mut on_data: impl FnMut(usize, &IoCompletion, &[u8]),
) -> (Vec<Vec<IoCompletion>>, u64) {
    let mut got: Vec<Vec<IoCompletion>> = queues.iter().map(|_| Vec::new()).collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut passes = 0;
    while got.iter().zip(want).any(|(g, w)| g.len() < *w) {
        passes += 1;
        for (q, queue) in queues.iter_mut().enumerate() {
            queue.poll(|c, data| {
                on_data(q, &c, data);
                got[q].push(c);
            });
        }
        assert!(
            Instant::now() < deadline,
            "completions per queue {:?}, wanted {want:?}",
            got.iter().map(Vec::len).collect::<Vec<_>>()
        );
    }
    (got, passes)
}

/// One verified round on every queue: write 8 blocks tagged per queue, read them back.
fn verified_round(queues: &mut [IoQueue<RdmaQueue>], ns: &NsTarget, round: u32, skip: &[usize]) {
    let live: Vec<usize> = (0..queues.len()).filter(|q| !skip.contains(q)).collect();
    let lba = |q: usize| q as u64 * 64;
    for &q in &live {
        queues[q]
            .submit_write(ns, lba(q), 8, q as u64, |buf| {
                for (i, b) in buf.iter_mut().enumerate() {
                    *b = tag(q, round, i);
                }
            })
            .expect("write");
    }
    let want: Vec<usize> = (0..queues.len())
        .map(|q| usize::from(live.contains(&q)))
        .collect();
    let (done, _) = reap_all(queues, &want, |_, _, _| {});
    for c in done.iter().flatten() {
        assert!(c.result.is_ok(), "write: {c:?}");
    }
    for &q in &live {
        queues[q]
            .submit_read(ns, lba(q), 8, q as u64)
            .expect("read");
    }
    let mut checked = 0;
    reap_all(queues, &want, |q, c, data| {
        assert!(c.result.is_ok(), "read: {c:?}");
        assert_eq!(data.len(), 4096);
        for (i, b) in data.iter().enumerate() {
            assert_eq!(*b, tag(q, round, i), "queue {q} byte {i} round {round}");
        }
        checked += 1;
    });
    assert_eq!(checked, live.len());
}

/// A target on `fabric_kind` at `ip`, a host fabric of `transport` and the address to reach
/// the target by it.
fn rig_and_host(
    fabric_kind: SoftFabric,
    transport: &str,
    ip: Ipv4Addr,
) -> (Rig, RdmaFabric, TransportAddress) {
    let rig = Rig::start(fabric_kind, ip);
    let mut address = rig.address.clone();
    address.transport = transport.into();
    let fabric = RdmaFabric::new(transport, None).expect("fabric");
    (rig, fabric, address)
}

fn shared_group(fabric_kind: SoftFabric, transport: &str, ip: Ipv4Addr) {
    let (rig, fabric, address) = rig_and_host(fabric_kind, transport, ip);
    let mut a = controller(&fabric, &address, 1);
    let mut b = controller(&fabric, &address, 2);

    // Both admin queues and all six I/O queues joined one group (one CQ).
    let groups = fabric.host_groups();
    assert_eq!(groups.len(), 1, "{groups:?}");
    assert_eq!(groups[0].queues, 2 + 2 * usize::from(QUEUES_PER_CONTROLLER));

    let ns = a.namespace(1).expect("namespace 1").target();
    let gated = a.namespace(2).expect("namespace 2").target();
    let mut queues = io_queues([&mut a, &mut b]);
    for round in 0..4 {
        verified_round(&mut queues, &ns, round, &[]);
    }

    // One CQ poll per pass over the queues, however many queues reaped nothing.
    for (q, queue) in queues.iter_mut().enumerate() {
        queue.submit_read(&ns, q as u64 * 64, 8, 0).expect("read");
    }
    let before = fabric.host_groups()[0].polls;
    let (_, passes) = reap_all(&mut queues, &[1; 6], |_, _, _| {});
    let polls = fabric.host_groups()[0].polls - before;
    assert!(
        polls <= passes,
        "{polls} CQ polls in {passes} passes over {} queues",
        queues.len()
    );

    // Every I/O queue has a read held in the target's block device; the target then drops
    // one I/O qpair.
    rig.gate.store(false, Ordering::Release);
    for (q, queue) in queues.iter_mut().enumerate() {
        queue
            .submit_read(&gated, q as u64, 1, 100 + q as u64)
            .expect("held read");
    }
    let reserved = fabric.host_groups()[0].reserved;
    let victim_qp = rig.disconnect_one_io_qpair();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut failed: Vec<(usize, IoCompletion)> = Vec::new();
    while failed.is_empty() {
        for (q, queue) in queues.iter_mut().enumerate() {
            queue.poll(|c, _| failed.push((q, c)));
        }
        assert!(
            Instant::now() < deadline,
            "target disconnected qpair {victim_qp:#x}; no host queue noticed"
        );
    }
    // Keep polling a while: nothing else may fail.
    for _ in 0..2000 {
        for (q, queue) in queues.iter_mut().enumerate() {
            queue.poll(|c, _| failed.push((q, c)));
        }
    }
    assert_eq!(
        failed.len(),
        1,
        "only the victim's command fails: {failed:?}"
    );
    let (victim, lost) = &failed[0];
    assert_eq!(lost.token, 100 + *victim as u64);
    assert!(
        matches!(lost.result, Err(Error::ConnectionLost(_))),
        "{:?}",
        lost.result
    );
    let disconnected: Vec<usize> = (0..queues.len())
        .filter(|&q| !queues[q].is_connected())
        .collect();
    assert_eq!(disconnected, vec![*victim]);
    // The lost queue left the group as soon as it noticed (its QP and the request objects it
    // reserved with it), not when it was dropped: a reconnect's new queues must fit.
    let groups = fabric.host_groups();
    assert_eq!(
        (groups[0].queues, groups[0].reserved),
        (
            1 + 2 * usize::from(QUEUES_PER_CONTROLLER),
            reserved - u32::from(IO_DEPTH)
        ),
        "{groups:?}"
    );
    for (q, queue) in queues.iter().enumerate() {
        if q != *victim {
            assert_eq!(
                queue.in_flight(),
                1,
                "queue {q}'s held read is still in flight"
            );
        }
    }

    // Released: the others' held reads complete, and verified I/O goes on.
    rig.gate.store(true, Ordering::Release);
    let want: Vec<usize> = (0..queues.len())
        .map(|q| usize::from(q != *victim))
        .collect();
    let (done, _) = reap_all(&mut queues, &want, |_, _, _| {});
    for (q, c) in done.iter().enumerate() {
        for c in c {
            assert!(c.result.is_ok(), "queue {q}: {c:?}");
            assert_eq!(c.token, 100 + q as u64);
        }
    }
    verified_round(&mut queues, &ns, 9, &[*victim]);

    // The lost queue leaves; the group lives on for the others.
    queues.remove(*victim);
    let groups = fabric.host_groups();
    assert_eq!(groups.len(), 1);
    assert_eq!(groups[0].queues, 1 + 2 * usize::from(QUEUES_PER_CONTROLLER));
    verified_round(&mut queues, &ns, 10, &[]);
    drop(queues);
    a.shutdown().expect("shutdown a");
    b.shutdown().expect("shutdown b");
    drop((a, b));
    assert!(
        fabric.host_groups().is_empty(),
        "the group goes with its last queue"
    );
}

#[test]
fn queues_of_two_controllers_share_one_group_in_process() {
    shared_group(SoftFabric::InProcess, "soft", Ipv4Addr::new(127, 0, 11, 2));
}

#[test]
fn queues_of_two_controllers_share_one_group_over_tcp() {
    shared_group(SoftFabric::Tcp, "soft-tcp", Ipv4Addr::new(127, 0, 11, 3));
}

/// A queue the host disconnects ends its drain on LAST_WQE_REACHED: the group shares one
/// receive queue and routes its QPs' async events through the device's hub, though the target's
/// acceptor in the same process reads that device's events too (on both fabrics the CM
/// resolves the target's address to the target's device). A host reading them itself, with
/// nobody else there, is initiator/tests/rdma_queue's
/// `a_disconnect_ends_on_last_wqe_read_by_the_host_itself`.
fn host_drain_ends_on_last_wqe(fabric_kind: SoftFabric, transport: &str, ip: Ipv4Addr) {
    let (_rig, fabric, address) = rig_and_host(fabric_kind, transport, ip);
    let mut c = controller(&fabric, &address, 1);
    let before = fabric.host_groups()[0].stats;
    let queue = c.take_io_queue(0).expect("I/O queue");
    drop(queue);
    let after = fabric.host_groups()[0].stats;
    assert_eq!(
        (
            after.drained_last_wqe - before.drained_last_wqe,
            after.drained_flush - before.drained_flush,
            after.drained_timeout - before.drained_timeout,
        ),
        (1, 0, 0),
        "drains ended on (LAST_WQE_REACHED, flush or grace, timeout)"
    );
    c.shutdown().expect("shutdown");
}

#[test]
fn a_host_drain_ends_on_last_wqe_in_process() {
    host_drain_ends_on_last_wqe(SoftFabric::InProcess, "soft", Ipv4Addr::new(127, 0, 11, 5));
}

#[test]
fn a_host_drain_ends_on_last_wqe_over_tcp() {
    host_drain_ends_on_last_wqe(SoftFabric::Tcp, "soft-tcp", Ipv4Addr::new(127, 0, 11, 6));
}

/// Spread over two reactors: the admin queue joins the control thread's group, I/O queue qid q
/// the group of reactor (q - 1) % 2, where nvmf-perf's runner moves it.
#[test]
fn spread_places_admin_on_control_and_io_queues_by_qid() {
    use nvmf_initiator::rdma::QueueHome;
    let rig = Rig::start(SoftFabric::InProcess, Ipv4Addr::new(127, 0, 11, 4));
    let mut address = rig.address.clone();
    address.transport = "soft".into();
    let fabric = RdmaFabric::new("soft", None).expect("fabric").spread(2);
    let mut c = controller(&fabric, &address, 3);
    let mut groups: Vec<(QueueHome, usize)> = fabric
        .host_groups()
        .into_iter()
        .map(|g| (g.home, g.queues))
        .collect();
    groups.sort_by_key(|(home, _)| format!("{home:?}"));
    assert_eq!(
        groups,
        vec![
            (QueueHome::Control, 1),
            (QueueHome::Reactor(0), 2),
            (QueueHome::Reactor(1), 1),
        ]
    );
    c.shutdown().expect("shutdown");
}

/// Runs `ready`'s passes until `done` says so; returns how many times each queue was visited,
/// and every completion with its queue.
fn ready_passes(
    ready: &mut ReadyQueues,
    queues: &mut [IoQueue<RdmaQueue>],
    mut done: impl FnMut(&[(usize, IoCompletion)], u64) -> bool,
) -> (Vec<u64>, Vec<(usize, IoCompletion)>) {
    let mut visits = vec![0; queues.len()];
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut passes = 0;
    while !done(&got, passes) {
        passes += 1;
        ready.pass(|q| {
            visits[q] += 1;
            let queue = &mut queues[q];
            queue.poll(|c, _| got.push((q, c)));
            queue.wants_poll()
        });
        assert!(Instant::now() < deadline, "{got:?} after {passes} passes");
    }
    (visits, got)
}

/// A poller over many queues of one host group visits only the queues with something to
/// report: a completion, or the loss of their connection (which fails only their commands).
#[test]
fn ready_queues_visit_only_the_queues_with_completions_or_a_loss() {
    let rig = Rig::start(SoftFabric::InProcess, Ipv4Addr::new(127, 0, 11, 7));
    let mut address = rig.address.clone();
    address.transport = "soft".into();
    let fabric = RdmaFabric::new("soft", None).expect("fabric");
    let mut a = controller(&fabric, &address, 4);
    let mut b = controller(&fabric, &address, 5);
    let ns = a.namespace(1).expect("namespace 1").target();
    let gated = a.namespace(2).expect("namespace 2").target();
    let mut queues = io_queues([&mut a, &mut b]);
    // No sweeps: every visit is one the group asked for.
    let mut ready =
        ReadyQueues::with_queues(queues.iter().map(IoQueue::queue)).sweep_every(u64::MAX);

    // The first pass visits every queue; with nothing in flight the next ones visit none.
    let (visits, _) = ready_passes(&mut ready, &mut queues, |_, passes| passes == 1);
    assert_eq!(visits, vec![1; 6]);
    let (visits, _) = ready_passes(&mut ready, &mut queues, |_, passes| passes == 200);
    assert_eq!(visits, vec![0; 6], "idle queues visited");

    // Reads on queues 1 and 4: only they are visited.
    for round in 0..50 {
        for q in [1, 4] {
            queues[q]
                .submit_read(&ns, q as u64 * 64 + round, 8, q as u64)
                .expect("read");
        }
        let (visits, got) = ready_passes(&mut ready, &mut queues, |got, _| got.len() == 2);
        assert!(
            got.iter()
                .all(|(q, c)| c.result.is_ok() && c.token == *q as u64)
        );
        for (q, v) in visits.iter().enumerate() {
            match q {
                1 | 4 => assert!(*v >= 1, "queue {q} round {round}: {visits:?}"),
                _ => assert_eq!(*v, 0, "queue {q} round {round}: {visits:?}"),
            }
        }
    }

    // Held reads everywhere, then the target drops one I/O qpair: only its queue is
    // visited, and only its command fails.
    rig.gate.store(false, Ordering::Release);
    for (q, queue) in queues.iter_mut().enumerate() {
        queue
            .submit_read(&gated, q as u64, 1, 100 + q as u64)
            .expect("held read");
    }
    rig.disconnect_one_io_qpair();
    let (visits, failed) = ready_passes(&mut ready, &mut queues, |got, _| !got.is_empty());
    let (victim, lost) = &failed[0];
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert_eq!(lost.token, 100 + *victim as u64);
    assert!(
        matches!(lost.result, Err(Error::ConnectionLost(_))),
        "{lost:?}"
    );
    for (q, v) in visits.iter().enumerate() {
        if q != *victim {
            assert_eq!(*v, 0, "queue {q}: {visits:?}");
        }
    }
    assert!(visits[*victim] >= 1);
    rig.gate.store(true, Ordering::Release);
    let (_, done) = ready_passes(&mut ready, &mut queues, |got, _| got.len() == 5);
    assert!(
        done.iter()
            .all(|(q, c)| c.result.is_ok() && c.token == 100 + *q as u64)
    );
    drop(queues);
    a.shutdown().expect("shutdown a");
    b.shutdown().expect("shutdown b");
}
