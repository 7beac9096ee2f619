//! The initiator against the real target in one process, over the soft RDMA fabrics (in-process
//! and TCP):
//! nvmf-rs host (controller bring-up, block API, nvmf-perf's verified engine on two reactors)
//! to nvmf-rs target (RDMA transport on two reactors, the NVMe layer, a malloc bdev), also with
//! both sides' SEND completions held back in turns (late ACKs).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use nvmf_initiator::block::BlockDevice;
use nvmf_initiator::clock::SystemClock;
use nvmf_initiator::controller::{Controller, ControllerOptions, ReconnectPolicy};
use nvmf_initiator::perf::job::JobSpec;
use nvmf_initiator::perf::runner::{RunConfig, run};
use nvmf_initiator::perf::workload::Pattern;
use nvmf_initiator::queue::TransportAddress;
use nvmf_initiator::rdma::RdmaFabric;
use nvmf_poller::{Runtime, RuntimeConfig};
use nvmf_target::config::Config;
use nvmf_target::nvme::{ReactorIo, Target};
use nvmf_target::rdma::{DeviceListen, RdmaConfig, RdmaTransport};
use nvmf_target::transport_glue::NvmeHandler;
use nvmf_transport::{Context, DeviceSpec, SoftConfig, SoftFabric};

const NQN: &str = "nqn.2016-06.io.nvmf-rs:e2e";

fn config(ip: Ipv4Addr) -> Config {
    let text = format!(
        r#"
[reactors]
cores = [0, 1]

[transport]
provider = "soft"
fabric = "inproc"
listen = ["{ip}:4420"]

[[bdev]]
name = "malloc0"
kind = "malloc"
size = 16777216
block_size = 512

[[subsystem]]
nqn = "{NQN}"
serial = "E2E0001"
model = "nvmf-rs e2e"
allow_any_host = true

[[subsystem.namespace]]
nsid = 1
bdev = "malloc0"
"#
    );
    Config::parse(&text, "e2e.toml").unwrap_or_else(|e| panic!("{:?}", e.0))
}

type Transport = RdmaTransport<nvmf_target::transport_glue::Command, NvmeHandler>;

/// The target's RDMA transport on `runtime`, serving `target` at `addr` of `ctx`.
fn serve(runtime: &Runtime, target: &Arc<Target>, ctx: &Context, addr: SocketAddr) -> Transport {
    serve_invalidating(runtime, target, ctx, addr, true)
}

/// As `serve`; `remote_invalidate` false answers with plain SENDs where the host asked for its
/// key to be invalidated (`[transport] remote_invalidate`).
fn serve_invalidating(
    runtime: &Runtime,
    target: &Arc<Target>,
    ctx: &Context,
    addr: SocketAddr,
    remote_invalidate: bool,
) -> Transport {
    let mut rdma = RdmaConfig::new(vec![DeviceListen {
        ctx: ctx.clone(),
        listen: vec![addr],
    }]);
    rdma.max_qid = target.limits().max_io_queues;
    let t = target.clone();
    RdmaTransport::start(runtime.reactors(), rdma, move |_| {
        NvmeHandler::new(t.clone(), ReactorIo::new(t.clone()))
            .with_remote_invalidate(remote_invalidate)
    })
    .expect("RDMA transport")
}

/// A target serving `config(ip)` over an in-process soft device, on its own reactors.
struct Served {
    target: Arc<Target>,
    runtime: Runtime,
    ctx: Context,
    addr: SocketAddr,
    transport: Transport,
}

fn serve_in_process(ip: Ipv4Addr, cores: Vec<usize>, device: &str) -> Served {
    let target = Arc::new(Target::from_config(&config(ip)).expect("target"));
    let runtime = Runtime::start(RuntimeConfig {
        cores,
        pin: false,
        ..RuntimeConfig::default()
    })
    .expect("target reactors");
    let ctx = Context::open(&DeviceSpec::Soft(SoftConfig {
        name: format!("{device}{}", std::process::id()),
        fabric: SoftFabric::InProcess,
        ip,
        ..SoftConfig::default()
    }))
    .expect("soft device");
    let addr = SocketAddr::new(IpAddr::V4(ip), 4420);
    let transport = serve(&runtime, &target, &ctx, addr);
    Served {
        target,
        runtime,
        ctx,
        addr,
        transport,
    }
}

/// The target at `ip`, port 4420, over the host transport `transport` ("soft", "soft-tcp").
fn address(transport: &str, ip: Ipv4Addr) -> TransportAddress {
    TransportAddress {
        transport: transport.into(),
        address: ip.to_string(),
        service: "4420".into(),
    }
}

/// nvmf-perf's verified 4 KiB random read/write at depth 16 on two host reactors, two queues
/// per namespace, for 1.5 s.
fn verified_randrw(seed: u64) -> RunConfig {
    RunConfig {
        spec: JobSpec {
            pattern: Pattern::RandRw,
            mix: 50,
            io_size: 4096,
            depth: 16,
            verify: true,
        },
        duration: Duration::from_millis(1500),
        cores: vec![0, 1],
        pin: false,
        qpairs_per_namespace: 2,
        nsids: Vec::new(),
        seed,
        progress_every: None,
    }
}

/// Controller options for host number `id` (its own host NQN and host ID).
fn host_options(id: u8) -> ControllerOptions {
    ControllerOptions::new(
        NQN,
        format!("nqn.2014-08.org.nvmexpress:uuid:07070707-0707-0707-0707-07070707070{id}"),
        [id; 16],
    )
}

#[test]
fn in_process_fabric_moves_verified_data() {
    host_and_target_move_verified_data(
        SoftFabric::InProcess,
        "soft",
        Ipv4Addr::new(127, 0, 9, 2),
        Keys::Long,
    );
}

#[test]
fn tcp_fabric_moves_verified_data() {
    host_and_target_move_verified_data(
        SoftFabric::Tcp,
        "soft-tcp",
        Ipv4Addr::new(127, 0, 9, 3),
        Keys::Long,
    );
}

/// Every I/O's data behind its own memory window, invalidated by the target's response.
#[test]
fn per_io_keys_move_verified_data() {
    host_and_target_move_verified_data(
        SoftFabric::InProcess,
        "soft",
        Ipv4Addr::new(127, 0, 9, 5),
        Keys::PerIo {
            target_invalidates: true,
        },
    );
}

/// Every I/O's window left valid by the target (`remote_invalidate = false`): the host
/// invalidates each one itself before it reports the command.
#[test]
fn per_io_keys_the_target_leaves_valid_are_invalidated_by_the_host() {
    host_and_target_move_verified_data(
        SoftFabric::InProcess,
        "soft",
        Ipv4Addr::new(127, 0, 9, 8),
        Keys::PerIo {
            target_invalidates: false,
        },
    );
}

/// How the host keys its data.
#[derive(Clone, Copy, PartialEq)]
enum Keys {
    /// One long-lived key per queue.
    Long,
    /// A memory window per I/O; the target invalidates it with its response or not.
    PerIo { target_invalidates: bool },
}

fn host_and_target_move_verified_data(
    fabric_kind: SoftFabric,
    transport_name: &str,
    ip: Ipv4Addr,
    keys: Keys,
) {
    let config = config(ip);
    let target = Arc::new(Target::from_config(&config).expect("target"));
    let runtime = Runtime::start(RuntimeConfig {
        cores: vec![0, 1],
        pin: false,
        ..RuntimeConfig::default()
    })
    .expect("target reactors");
    let ctx = Context::open(&DeviceSpec::Soft(SoftConfig {
        name: format!("e2e-tgt{}-{ip}", std::process::id()),
        fabric: fabric_kind,
        ip,
        ..SoftConfig::default()
    }))
    .expect("soft device");
    let addr = SocketAddr::new(IpAddr::V4(ip), 4420);
    let remote_invalidate = keys
        != Keys::PerIo {
            target_invalidates: false,
        };
    let transport = serve_invalidating(&runtime, &target, &ctx, addr, remote_invalidate);

    let address = address(transport_name, ip);
    let mut options = ControllerOptions::new(
        NQN,
        "nqn.2014-08.org.nvmexpress:uuid:07070707-0707-0707-0707-070707070707",
        [7; 16],
    );
    options.io_queues = 2;
    options.io_queue_depth = 32;
    options.per_io_keys = keys != Keys::Long;
    options.reconnect = ReconnectPolicy::never();
    let fabric = RdmaFabric::new(transport_name, None).expect("fabric");
    let controller = Controller::connect(
        fabric.clone(),
        address.clone(),
        options.clone(),
        Arc::new(SystemClock),
    )
    .expect("controller");
    assert_eq!(controller.namespaces().len(), 1);

    // Block API: an unaligned write by keyed SGL and in-capsule data, read back.
    let mut block = BlockDevice::new(controller, 1).expect("block device");
    assert_eq!(block.size(), 16 * 1024 * 1024);
    let data: Vec<u8> = (0..20_000u32).map(|i| (i * 31 % 251) as u8).collect();
    block.write_at(1000, &data).expect("write");
    block.write_at(70_000, &data[..300]).expect("small write");
    let mut back = vec![0; data.len()];
    block.read_at(1000, &mut back).expect("read");
    assert_eq!(back, data);
    let mut small = vec![0; 300];
    block.read_at(70_000, &mut small).expect("read");
    assert_eq!(small, data[..300]);
    block.flush().expect("flush");
    let mut controller = block.into_controller();
    controller.shutdown().expect("clean shutdown");

    // nvmf-perf's engine: verified random read/write on two host reactors.
    let mut controller = Controller::connect(
        fabric.clone().spread(2),
        address,
        options,
        Arc::new(SystemClock),
    )
    .expect("again");
    let cfg = verified_randrw(3);
    let report = run(&mut controller, &cfg, |_| {}).expect("perf run");
    assert!(report.passed(), "{}", report.to_text());
    assert!(report.total.ios > 0);
    // Both host reactors ran jobs and did work: one busy share each, within (0, 100].
    assert_eq!(report.host_busy_percent.len(), 2, "{report:?}");
    assert!(
        report
            .host_busy_percent
            .iter()
            .all(|&p| p > 0.0 && p <= 100.0),
        "{report:?}"
    );
    assert!(report.to_text().contains("host reactor busy"));
    let host_invalidated: u64 = fabric
        .host_groups()
        .iter()
        .map(|g| g.local_invalidations)
        .sum();
    if keys
        == (Keys::PerIo {
            target_invalidates: false,
        })
    {
        assert!(host_invalidated > 0, "the host invalidated no window");
    } else {
        assert_eq!(host_invalidated, 0, "the target left keys valid");
    }
    controller.shutdown().expect("clean shutdown");
    transport
        .stop(Duration::from_secs(5))
        .expect("transport stop");
    runtime.stop().expect("reactors stop");
}

#[test]
fn the_host_reconnects_after_the_target_restarts_and_reads_its_data() {
    let ip = Ipv4Addr::new(127, 0, 9, 4);
    let Served {
        target,
        runtime,
        ctx,
        addr,
        transport,
    } = serve_in_process(ip, vec![0, 1], "e2e-restart");
    let mut options = host_options(8);
    options.reconnect = ReconnectPolicy {
        reconnect_delay: Duration::from_millis(200),
        ctrl_loss_timeout: Some(Duration::from_secs(30)),
        fast_io_fail: None,
    };
    let address = address("soft", ip);
    let fabric = RdmaFabric::new("soft", None).expect("fabric");
    let controller =
        Controller::connect(fabric, address, options, Arc::new(SystemClock)).expect("controller");
    let mut block = BlockDevice::new(controller, 1).expect("block device");
    let data: Vec<u8> = (0..64 * 1024u32).map(|i| (i % 253) as u8).collect();
    block.write_at(4096, &data).expect("write");
    block.flush().expect("flush");

    // The fabric goes away (every connection dropped) and comes back on the same address.
    transport
        .stop(Duration::from_secs(5))
        .expect("transport stop");
    let transport = serve(&runtime, &target, &ctx, addr);

    let mut back = vec![0; data.len()];
    block
        .read_at(4096, &mut back)
        .expect("read after the restart");
    assert_eq!(back, data);
    assert!(
        block.controller().reconnects() >= 1,
        "the loss went unnoticed"
    );
    let mut controller = block.into_controller();
    controller.shutdown().expect("clean shutdown");
    transport
        .stop(Duration::from_secs(5))
        .expect("transport stop");
    runtime.stop().expect("reactors stop");
}

/// A host poll group whose CQ fails (CQ_ERR) loses every queue in it. The reconnect must get
/// a new group: the failed one refuses every qpair, yet the lost queues kept it alive, and
/// the reconnect was handed it again until ctrl-loss-tmo.
#[test]
fn the_host_reconnects_on_a_new_group_after_its_cq_fails() {
    let ip = Ipv4Addr::new(127, 0, 9, 10);
    let Served {
        target: _target,
        runtime,
        ctx,
        addr: _addr,
        transport,
    } = serve_in_process(ip, vec![0, 1], "e2e-cq-err");
    let mut options = host_options(9);
    options.reconnect = ReconnectPolicy {
        reconnect_delay: Duration::from_millis(100),
        ctrl_loss_timeout: Some(Duration::from_secs(10)),
        fast_io_fail: None,
    };
    let fabric = RdmaFabric::new("soft", None).expect("fabric");
    let controller = Controller::connect(
        fabric.clone(),
        address("soft", ip),
        options,
        Arc::new(SystemClock),
    )
    .expect("controller");
    let mut block = BlockDevice::new(controller, 1).expect("block device");
    let data: Vec<u8> = (0..32 * 1024u32).map(|i| (i % 251) as u8).collect();
    block.write_at(8192, &data).expect("write");
    block.flush().expect("flush");

    let failed: Vec<u32> = fabric.host_groups().iter().map(|g| g.cq).collect();
    let faults = ctx.as_soft().expect("a soft device").faults();
    for &cq in &failed {
        faults.fail_cq(cq).expect("CQ_ERR");
    }
    // The group reads the event on one of its polls: read until the loss was seen and mended.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut back = vec![0; data.len()];
    while block.controller().reconnects() == 0 {
        block
            .read_at(8192, &mut back)
            .expect("read while the group fails");
        assert_eq!(back, data);
        assert!(
            std::time::Instant::now() < deadline,
            "the failed CQ went unnoticed"
        );
    }
    block.read_at(8192, &mut back).expect("read after");
    assert_eq!(back, data);
    let mut controller = block.into_controller();
    controller.shutdown().expect("clean shutdown");
    transport
        .stop(Duration::from_secs(5))
        .expect("transport stop");
    runtime.stop().expect("reactors stop");
}

/// Per-I/O windows over the soft TCP fabric (the host's "soft" fabric resolves to the target's
/// TCP device here, so windows stay on).
#[test]
fn per_io_keys_over_the_tcp_fabric_move_verified_data() {
    host_and_target_move_verified_data(
        SoftFabric::Tcp,
        "soft",
        Ipv4Addr::new(127, 0, 9, 6),
        Keys::PerIo {
            target_invalidates: true,
        },
    );
}

/// nvmf-perf's lazy read path (`IoQueue::poll_lazy`) over a real registered region: whatever
/// reads before it left unfetched, and whichever slot a read lands in, the data a read fetches
/// is its own LBA range's (never the host view's stale bytes from an earlier command of the
/// slot, never another range's).
#[test]
fn lazy_reads_hand_each_read_its_own_data() {
    let ip = Ipv4Addr::new(127, 0, 9, 7);
    // Bound to names so the target and its device live to the end of the test.
    let Served {
        target: _target,
        runtime,
        ctx: _ctx,
        addr: _addr,
        transport,
    } = serve_in_process(ip, vec![0], "e2e-lazy");
    let mut options = host_options(9);
    options.io_queues = 1;
    options.io_queue_depth = 3;
    options.reconnect = ReconnectPolicy::never();
    let address = address("soft", ip);
    let fabric = RdmaFabric::new("soft", None).expect("fabric");
    let mut controller =
        Controller::connect(fabric, address, options, Arc::new(SystemClock)).expect("controller");
    let ns = controller.namespace(1).expect("namespace 1").target();
    let queue = controller.io_queue_mut(0).expect("I/O queue");
    const RANGES: u64 = 7;
    const BLOCKS: u32 = 8;
    let byte = |range: u64, i: usize| (range as u8).wrapping_mul(37) ^ (i as u8) ^ 0x5a;
    let lba = |range: u64| range * 64;
    for range in 0..RANGES {
        queue
            .submit_write(&ns, lba(range), BLOCKS, range, |slot| {
                for (i, b) in slot.iter_mut().enumerate() {
                    *b = byte(range, i);
                }
            })
            .expect("write");
        while queue.in_flight() > 0 {
            queue.poll(|c, _| c.result.expect("write"));
        }
    }
    // Reads two at a time over the ranges in an order that moves each range through every
    // slot; every third one is left unfetched.
    let mut fetched = 0;
    let mut next = 0u64;
    while next < 60 || queue.in_flight() > 0 {
        while next < 60 && queue.in_flight() < 2 {
            let range = next * 3 % RANGES;
            queue
                .submit_read(&ns, lba(range), BLOCKS, next)
                .expect("read");
            next += 1;
        }
        queue.poll_lazy(|c, mut data| {
            c.result.clone().expect("read");
            if c.token % 3 == 2 {
                return;
            }
            let range = c.token * 3 % RANGES;
            let bytes = data.bytes().expect("read data");
            assert_eq!(bytes.len(), BLOCKS as usize * 512);
            for (i, b) in bytes.iter().enumerate() {
                assert_eq!(
                    *b,
                    byte(range, i),
                    "read {} (range {range}) byte {i}",
                    c.token
                );
            }
            fetched += 1;
        });
    }
    assert_eq!(fetched, 40);
    controller.shutdown().expect("clean shutdown");
    transport
        .stop(Duration::from_secs(5))
        .expect("transport stop");
    runtime.stop().expect("reactors stop");
}

/// Late ACKs on both sides: while nvmf-perf's verified engine runs on two queues at depth 16,
/// the SEND completions of every target poll group and every host poll group are held back and
/// let go in turns of a few milliseconds (the soft fault a NIC's late ACK stands for), so
/// responses complete before their commands' SENDs and new commands arrive before the target
/// hears its answers went. Every I/O completes and verifies, no host is taken for an overrun,
/// and no group sees a stale completion or a forced drain.
#[test]
fn late_send_completions_on_both_sides_lose_nothing() {
    let ip = Ipv4Addr::new(127, 0, 9, 9);
    let Served {
        target: _target,
        runtime,
        ctx,
        addr: _addr,
        transport,
    } = serve_in_process(ip, vec![0, 1], "e2e-late");
    let mut options = host_options(8);
    options.io_queues = 2;
    options.io_queue_depth = 16;
    options.reconnect = ReconnectPolicy::never();
    let address = address("soft", ip);
    let fabric = RdmaFabric::new("soft", None).expect("fabric").spread(2);
    let mut controller =
        Controller::connect(fabric.clone(), address, options, Arc::new(SystemClock))
            .expect("controller");
    let mut cqs: Vec<u32> = transport
        .each_group(|g| g.snapshot().cq)
        .expect("target reactors")
        .into_iter()
        .map(|(_, cq)| cq)
        .collect();
    let host_cqs: Vec<u32> = fabric.host_groups().iter().map(|g| g.cq).collect();
    assert!(host_cqs.len() >= 2, "the I/O queues' groups: {host_cqs:?}");
    cqs.extend(host_cqs);
    let faults = ctx.as_soft().expect("a soft device").faults();
    let stop = Arc::new(AtomicBool::new(false));
    let toggler = {
        let (faults, cqs, stop) = (faults.clone(), cqs.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut turns = 0u32;
            while !stop.load(Ordering::Relaxed) {
                let on = turns % 2 == 0;
                for &cq in &cqs {
                    // A host group goes with its last queue: at the run's end, before this
                    // thread stops.
                    let _ = faults.hold_send_completions(cq, on);
                }
                turns += 1;
                std::thread::sleep(Duration::from_millis(3));
            }
            for &cq in &cqs {
                let _ = faults.hold_send_completions(cq, false);
            }
            turns
        })
    };
    let cfg = verified_randrw(8);
    let report = run(&mut controller, &cfg, |_| {});
    stop.store(true, Ordering::Relaxed);
    let turns = toggler.join().expect("toggler");
    let report = report.expect("perf run");
    assert!(report.passed(), "{}", report.to_text());
    // No queue went with its I/O (`passed` counts I/O lost with a connection as no failure).
    assert_eq!(
        (report.total.lost, report.reconnects),
        (0, 0),
        "{}",
        report.to_text()
    );
    assert!(report.total.ios > 0);
    assert!(turns >= 20, "the holds came and went {turns} times");
    for (info, snapshot) in transport
        .each_group(|g| g.snapshot())
        .expect("target reactors")
    {
        let c = &snapshot.counters;
        assert_eq!(
            (c.overruns, c.stale_completions, c.drained_timeout),
            (0, 0, 0),
            "target group {info:?}: {c:?}"
        );
    }
    for group in fabric.host_groups() {
        let s = &group.stats;
        assert_eq!(
            (s.stale_completions, s.drained_timeout),
            (0, 0),
            "host group {:?}: {s:?}",
            group.home
        );
    }
    controller.shutdown().expect("clean shutdown");
    transport
        .stop(Duration::from_secs(5))
        .expect("transport stop");
    runtime.stop().expect("reactors stop");
}
