//! The RDMA glue ([`RdmaFabric`] / [`RdmaQueue`]) against a fake responder on the in-process
//! soft fabric: the `HostQueue` contract end to end (CM connect with NVMe-oF private data,
//! keyed-SGL data both ways through the registered region, in-capsule data, a full queue,
//! every CQE once, loss reported as `Disconnected`).

mod fake_target;

use std::time::{Duration, Instant};

use fake_target::{FakeTarget, READ, WRITE};
use nvmf_initiator::queue::{
    ConnectError, Fabric, HostQueue, QueueConnectParams, QueueError, TransportAddress,
};
use nvmf_initiator::rdma::{RdmaFabric, RdmaQueue};
use nvmf_protocol::{Cqe, SglDescriptor, Sqe, Status};

const REGION: usize = 256 * 1024;
const DEPTH: u16 = 16;

fn params(target: &FakeTarget) -> QueueConnectParams {
    QueueConnectParams {
        address: TransportAddress {
            transport: "soft".into(),
            address: target.addr.ip().to_string(),
            service: target.addr.port().to_string(),
        },
        qid: 1,
        hrqsize: DEPTH,
        hsqsize: DEPTH - 1,
        cntlid: 1,
        data_region_len: REGION,
        in_capsule_data: 4096,
    }
}

fn connect(target: &FakeTarget) -> RdmaQueue {
    connect_with(&RdmaFabric::new("soft", None).expect("fabric"), target)
}

fn connect_with(fabric: &RdmaFabric, target: &FakeTarget) -> RdmaQueue {
    fabric.connect(&params(target)).expect("connected")
}

/// A command on `queue` moving `len` bytes at region `at` by keyed SGL, disk offset `disk`.
fn keyed(queue: &RdmaQueue, opcode: u8, cid: u16, at: usize, len: usize, disk: u32) -> Sqe {
    let region = queue.region();
    let mut sqe = Sqe::new(opcode, cid, 1);
    let sgl = SglDescriptor::keyed(region.address + at as u64, len as u32, region.key, false);
    sqe.set_sgl1(sgl.unwrap());
    sqe.cdw10 = disk;
    sqe
}

/// Polls until `n` CQEs came, returning them.
fn reap(queue: &mut RdmaQueue, n: usize) -> Vec<Cqe> {
    let mut got = Vec::new();
    let mut out = [Cqe::default(); 4];
    let deadline = Instant::now() + Duration::from_secs(30);
    while got.len() < n {
        let k = queue.poll(&mut out).expect("connected");
        got.extend_from_slice(&out[..k]);
        assert!(Instant::now() < deadline, "{} of {n} CQEs", got.len());
        if k == 0 {
            std::thread::yield_now();
        }
    }
    got
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(7) ^ seed).collect()
}

#[test]
fn keyed_write_then_read_moves_the_bytes() {
    let target = FakeTarget::start();
    let mut q = connect(&target);
    assert_eq!(q.depth(), DEPTH);
    assert!(q.is_connected());
    let data = pattern(0x3c, 8192);
    q.region_bytes_mut()[..8192].copy_from_slice(&data);
    q.submit(&keyed(&q, WRITE, 5, 0, 8192, 4096), None).unwrap();
    let cqes = reap(&mut q, 1);
    assert_eq!((cqes[0].cid, cqes[0].status), (5, Status::SUCCESS));
    // Read it back elsewhere in the region.
    q.submit(&keyed(&q, READ, 6, 65536, 8192, 4096), None)
        .unwrap();
    let cqes = reap(&mut q, 1);
    assert_eq!(cqes[0].cid, 6);
    assert_eq!(&q.region_bytes()[65536..65536 + 8192], &data[..]);
}

#[test]
fn in_capsule_write_reads_back() {
    let target = FakeTarget::start();
    let mut q = connect(&target);
    let data = pattern(0x81, 1024);
    q.region_bytes_mut()[4096..5120].copy_from_slice(&data);
    let mut sqe = Sqe::new(WRITE, 9, 1);
    sqe.set_sgl1(SglDescriptor::DataBlockOffset {
        offset: 0,
        length: 1024,
    });
    sqe.cdw10 = 100;
    q.submit(&sqe, Some(4096..5120)).unwrap();
    assert_eq!(reap(&mut q, 1)[0].cid, 9);
    q.submit(&keyed(&q, READ, 10, 0, 1024, 100), None).unwrap();
    reap(&mut q, 1);
    assert_eq!(&q.region_bytes()[..1024], &data[..]);
    // Too much in-capsule data is refused up front.
    let err = q.submit(&sqe, Some(0..8192)).unwrap_err();
    assert!(matches!(err, QueueError::Invalid(_)), "{err:?}");
}

#[test]
fn a_full_queue_reports_every_cqe_once() {
    let target = FakeTarget::start();
    let mut q = connect(&target);
    for round in 0..4u16 {
        for i in 0..DEPTH {
            let cid = round * DEPTH + i;
            let at = i as usize * 4096;
            q.submit(&keyed(&q, READ, cid, at, 4096, at as u32), None)
                .unwrap();
        }
        // Past the granted depth the queue says so instead of overrunning the target.
        let extra = keyed(&q, READ, 999, 0, 512, 0);
        assert_eq!(q.submit(&extra, None), Err(QueueError::Full));
        let mut cids: Vec<u16> = reap(&mut q, DEPTH as usize).iter().map(|c| c.cid).collect();
        cids.sort_unstable();
        let want: Vec<u16> = (round * DEPTH..(round + 1) * DEPTH).collect();
        assert_eq!(cids, want);
    }
    assert_eq!(
        target.answered.load(std::sync::atomic::Ordering::Relaxed),
        64
    );
}

#[test]
fn a_lazy_submit_sends_what_the_registered_region_holds() {
    let target = FakeTarget::start();
    let mut q = connect(&target);
    let sent = pattern(0x11, 4096);
    q.region_bytes_mut()[..4096].copy_from_slice(&sent);
    q.submit(&keyed(&q, WRITE, 1, 0, 4096, 0), None).unwrap();
    reap(&mut q, 1);
    // The host view changes but is not brought into the registered region: the target gets
    // what the region holds, by keyed SGL and in the capsule alike.
    q.region_bytes_mut()[..4096].copy_from_slice(&pattern(0x22, 4096));
    q.submit_lazy(&keyed(&q, WRITE, 2, 0, 4096, 8192), None)
        .unwrap();
    reap(&mut q, 1);
    let mut in_capsule = Sqe::new(WRITE, 3, 1);
    in_capsule.set_sgl1(SglDescriptor::DataBlockOffset {
        offset: 0,
        length: 1024,
    });
    in_capsule.cdw10 = 16384;
    q.submit_lazy(&in_capsule, Some(0..1024)).unwrap();
    reap(&mut q, 1);
    q.submit(&keyed(&q, READ, 4, 65536, 4096, 8192), None)
        .unwrap();
    reap(&mut q, 1);
    assert_eq!(&q.region_bytes()[65536..69632], &sent[..], "keyed SGL");
    q.submit(&keyed(&q, READ, 5, 65536, 1024, 16384), None)
        .unwrap();
    reap(&mut q, 1);
    assert_eq!(&q.region_bytes()[65536..66560], &sent[..1024], "in capsule");
}

#[test]
fn a_target_disconnect_is_reported_as_loss() {
    let target = FakeTarget::start();
    let mut q = connect(&target);
    q.submit(&keyed(&q, READ, 1, 0, 512, 0), None).unwrap();
    reap(&mut q, 1);
    target.disconnect();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut out = [Cqe::default(); 4];
    let err = loop {
        match q.poll(&mut out) {
            Ok(0) => {}
            Ok(n) => panic!("{n} CQEs from nothing in flight"),
            Err(e) => break e,
        }
        assert!(Instant::now() < deadline, "loss never reported");
        std::thread::yield_now();
    };
    assert!(matches!(err, QueueError::Disconnected(_)), "{err:?}");
    assert!(!q.is_connected());
    let again = q.submit(&keyed(&q, READ, 2, 0, 512, 0), None);
    assert!(
        matches!(again, Err(QueueError::Disconnected(_))),
        "{again:?}"
    );
}

#[test]
fn nobody_listening_is_unreachable() {
    let target = FakeTarget::start();
    let mut p = params(&target);
    p.address.service = "4999".into();
    let err = RdmaFabric::new("soft", None)
        .unwrap()
        .connect(&p)
        .err()
        .expect("refused");
    assert!(matches!(err, ConnectError::Unreachable(_)), "{err:?}");
}

#[test]
fn per_command_windows_carry_the_data_and_are_rebound() {
    windows_round_trips(FakeTarget::start());
}

#[test]
fn per_command_windows_over_the_tcp_fabric() {
    windows_round_trips(FakeTarget::start_on(nvmf_transport::SoftFabric::Tcp));
}

fn windows_round_trips(target: FakeTarget) {
    let mut q = connect(&target);
    let region_key = q.region().key;
    // More commands than windows: every window is bound again, after the host's own LOCAL_INV
    // ended its key before the command was reported (this responder never sends
    // SEND_WITH_INVALIDATE).
    for n in 0..3 * DEPTH {
        let at = (n as usize % 8) * 8192;
        let data = pattern(n as u8, 4096);
        q.region_bytes_mut()[at..at + 4096].copy_from_slice(&data);
        let (address, key) = q
            .bind_window(at..at + 4096)
            .unwrap()
            .expect("soft has windows");
        assert_ne!(key, region_key);
        let mut write = Sqe::new(WRITE, 2 * n, 1);
        write.set_sgl1(SglDescriptor::keyed(address, 4096, key, true).unwrap());
        write.cdw10 = 4096 * u32::from(n);
        q.submit(&write, None).unwrap();
        assert_eq!(reap(&mut q, 1)[0].cid, 2 * n);
        let back = at + 4096;
        let (address, key) = q.bind_window(back..back + 4096).unwrap().unwrap();
        let mut read = Sqe::new(READ, 2 * n + 1, 1);
        read.set_sgl1(SglDescriptor::keyed(address, 4096, key, true).unwrap());
        read.cdw10 = 4096 * u32::from(n);
        q.submit(&read, None).unwrap();
        assert_eq!(reap(&mut q, 1)[0].cid, 2 * n + 1);
        assert_eq!(
            &q.region_bytes()[back..back + 4096],
            &data[..],
            "command {n}"
        );
    }
    // A key no window was bound under is refused.
    let mut stray = Sqe::new(READ, 999, 1);
    stray.set_sgl1(SglDescriptor::keyed(q.region().address, 512, 0x1234_5600, false).unwrap());
    assert!(matches!(
        q.submit(&stray, None),
        Err(QueueError::Invalid(_))
    ));
}

#[test]
fn a_full_host_group_refuses_a_queue_and_names_the_knob() {
    let target = FakeTarget::start();
    let fabric = RdmaFabric::new("soft", None).unwrap().group_config(
        nvmf_initiator::rdma::HostGroupConfig {
            requests: u32::from(DEPTH) + 4,
            ..Default::default()
        },
    );
    let q = fabric.connect(&params(&target)).expect("first queue fits");
    let groups = fabric.host_groups();
    assert_eq!(groups.len(), 1);
    assert_eq!(
        (groups[0].queues, groups[0].reserved),
        (1, u32::from(DEPTH))
    );
    // A second queue of the same depth would oversubscribe the request objects.
    let err = fabric.connect(&params(&target)).err().expect("refused");
    match err {
        ConnectError::Resources(why) => assert!(why.contains("HostGroupConfig::requests"), "{why}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        fabric.host_groups()[0].queues,
        1,
        "the refused queue left no trace"
    );
    drop(q);
    assert!(fabric.host_groups().is_empty());
}

/// With nobody else in the process reading the device's async events (the fake target never
/// does), the host group reads them itself while a queue drains: the teardown ends on
/// LAST_WQE_REACHED, not on the poll group's grace.
#[test]
fn a_disconnect_ends_on_last_wqe_read_by_the_host_itself() {
    let target = FakeTarget::start();
    let fabric = RdmaFabric::new("soft", None).expect("fabric");
    let queue = connect_with(&fabric, &target);
    // The queue's completion-group handle keeps the group (and its counters) after it leaves.
    let _group = queue.completion_group().expect("a group");
    let drains = |fabric: &RdmaFabric| {
        let stats = fabric.host_groups()[0].stats;
        (
            stats.drained_last_wqe,
            stats.drained_flush,
            stats.drained_timeout,
        )
    };
    assert_eq!(drains(&fabric), (0, 0, 0));
    drop(queue);
    assert_eq!(
        drains(&fabric),
        (1, 0, 0),
        "drains ended on (LAST_WQE_REACHED, flush or grace, timeout)"
    );
}
