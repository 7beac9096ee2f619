//! End to end: the NVMe target's request path over the RDMA transport, on both soft fabrics
//! and several reactors, driven by a raw host built from the protocol crate and the transport.
//! Connect (its data by keyed SGL, RDMA READ by the target), properties, Identify, Set
//! Features, an I/O queue, Write by keyed SGL and in capsule, Read back by keyed SGL (RDMA
//! WRITE by the target) with the data verified, Flush, an LBA out of range, Disconnect, and a
//! wrong rkey (the target's READ fails: the qpair drains and nothing leaks).
//! The other admin and NVM commands over the fabric are in `commands`.
#![forbid(unsafe_code)]

mod commands;
mod daemon;
mod host;
mod in_capsule;

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use host::{HostQueue, wait_until};
use nvmf_poller::{Runtime, RuntimeConfig};
use nvmf_protocol::fabrics::{
    CNTLID_DYNAMIC, ConnectCmd, ConnectData, DisconnectCmd, PropertyGetCmd, PropertySetCmd,
    PropertySize,
};
use nvmf_protocol::identify::IdentifyController;
use nvmf_protocol::log::DiscoveryLog;
use nvmf_protocol::properties::{Cc, Csts, PropertyOffset};
use nvmf_protocol::status::GenericStatus;
use nvmf_protocol::{DISCOVERY_NQN, FixedStr, SglDescriptor, Sqe, StatusCode};
use nvmf_target::bdev::gate::GateBdev;
use nvmf_target::bdev::{MallocBdev, NullBdev};
use nvmf_target::nvme::{Limits, Namespace, Subsystem, Target};
use nvmf_target::rdma::{DeviceListen, PollGroupConfig, RdmaConfig, RdmaTransport};
use nvmf_target::transport_glue::{CONNECT_DEADLINE, Command, NvmeHandler};
use nvmf_transport::{Context, DeviceSpec, SoftConfig, SoftFabric};

pub(crate) const SUBNQN: &str = "nqn.2016-06.io.nvmf-rs:e2e";
const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:2b4c8d1e-0f3a-4e5b-9c6d-7e8f9a0b1c2d";
const BLOCK: u32 = 512;
const BLOCKS: u64 = 2048;
const REACTORS: usize = 2;
const BUFFERS: u32 = 128;
/// Receive slots per group.
const SRQ_DEPTH: u32 = 128;

static NEXT: AtomicU32 = AtomicU32::new(0);

struct Rig {
    target: Arc<Target>,
    /// Namespace 2's I/O completes only while this is true.
    gate: Arc<AtomicBool>,
    /// Namespace 2's I/O reaped so far.
    gate_reaped: Arc<std::sync::atomic::AtomicUsize>,
    /// Namespace 2's I/O fails (EIO at completion) while this is true.
    gate_failing: Arc<AtomicBool>,
    rt: Option<Runtime>,
    tr: Option<RdmaTransport<Command, NvmeHandler>>,
    addr: SocketAddr,
    _ctx: Context,
}

impl Rig {
    /// A live controller: admin queue connected and enabled, and I/O queue 1 (depth 32).
    fn controller(&self) -> (HostQueue, u16, HostQueue) {
        let mut admin = HostQueue::connect(self.addr, 0, 32);
        let cntlid = connect(&mut admin, 0, CNTLID_DYNAMIC);
        enable(&mut admin);
        let mut io = HostQueue::connect(self.addr, 1, 32);
        connect(&mut io, 1, cntlid);
        (admin, cntlid, io)
    }

    fn new(fabric: SoftFabric) -> Rig {
        Rig::with_group(fabric, |_| {})
    }

    /// A rig whose poll-group configuration `adjust` changes first.
    fn with_group(fabric: SoftFabric, adjust: impl FnOnce(&mut PollGroupConfig)) -> Rig {
        Rig::with_device(fabric, |_| {}, adjust)
    }

    /// A rig whose soft device's configuration `device` changes first (its limits), and its
    /// poll groups' `adjust`.
    fn with_device(
        fabric: SoftFabric,
        device: impl FnOnce(&mut SoftConfig),
        adjust: impl FnOnce(&mut PollGroupConfig),
    ) -> Rig {
        Rig::build(fabric, device, adjust, CONNECT_DEADLINE)
    }

    /// `with_device`, the handlers disconnecting a qpair without a successful Connect after
    /// `connect_deadline`.
    fn build(
        fabric: SoftFabric,
        device: impl FnOnce(&mut SoftConfig),
        adjust: impl FnOnce(&mut PollGroupConfig),
        connect_deadline: Duration,
    ) -> Rig {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        // One address per rig, in-process and TCP rigs in separate ranges: soft devices are
        // found by address, so two live rigs must never share one (with more than 20 rigs an
        // offset of 20 between the ranges made them collide).
        let ip = Ipv4Addr::new(
            127,
            0,
            3 + (fabric == SoftFabric::Tcp) as u8,
            2 + (n % 250) as u8,
        );
        let addr = SocketAddr::from((ip, 4420));
        let mut t = Target::new(Limits::default(), vec![addr]);
        let bdev = Arc::new(MallocBdev::new("m0", BLOCK, BLOCKS * u64::from(BLOCK)).unwrap());
        let index = t.add_bdev("m0", bdev.clone());
        let sub = Arc::new(Subsystem::new(
            SUBNQN,
            "SN-E2E",
            "nvmf-rs e2e",
            true,
            vec![],
            4,
            vec![addr],
        ));
        sub.add_namespace(Namespace {
            nsid: 1,
            bdev_index: index,
            info: nvmf_target::bdev::Bdev::info(&*bdev).clone(),
            bdev,
            uuid: None,
            nguid: None,
        })
        .unwrap();
        let gate = Arc::new(AtomicBool::new(true));
        let gated = Arc::new(GateBdev::new("gate", BLOCKS, gate.clone()));
        let gate_reaped = gated.reaped.clone();
        let gate_failing = gated.failing.clone();
        let index = t.add_bdev("gate", gated.clone());
        sub.add_namespace(Namespace {
            nsid: 2,
            bdev_index: index,
            info: nvmf_target::bdev::Bdev::info(&*gated).clone(),
            bdev: gated,
            uuid: None,
            nguid: None,
        })
        .unwrap();
        t.add_subsystem(sub);
        let target = Arc::new(t);
        let mut soft = SoftConfig {
            name: format!("e2e{}-{n}", std::process::id()),
            fabric,
            ip,
            ..SoftConfig::default()
        };
        device(&mut soft);
        let ctx = Context::open(&DeviceSpec::Soft(soft)).expect("soft device");
        let rt = Runtime::start(RuntimeConfig {
            cores: (0..REACTORS).collect(),
            pin: false,
            ..RuntimeConfig::default()
        })
        .expect("runtime");
        let mut cfg = RdmaConfig::new(vec![DeviceListen {
            ctx: ctx.clone(),
            listen: vec![addr],
        }]);
        cfg.group = PollGroupConfig {
            srq_depth: SRQ_DEPTH,
            max_qpairs: 8,
            max_queue_depth: 32,
            in_capsule_data_size: 4096,
            io_unit_size: 4096,
            data_buffers: BUFFERS,
            max_requests: 128,
            // Lone responses go silent here (off by default): every case runs with them held
            // and flushed.
            silent_answers: 3,
            ..PollGroupConfig::default()
        };
        adjust(&mut cfg.group);
        let tr = RdmaTransport::start(rt.reactors(), cfg, |_| {
            NvmeHandler::new(
                target.clone(),
                nvmf_target::nvme::ReactorIo::new(target.clone()),
            )
            .with_connect_deadline(connect_deadline)
        })
        .expect("transport");
        Rig {
            target: target.clone(),
            gate,
            gate_reaped,
            gate_failing,
            rt: Some(rt),
            tr: Some(tr),
            addr,
            _ctx: ctx,
        }
    }

    /// Sum over the groups of two of their counters (`pick`), since they started.
    fn counters(&self, pick: fn(&nvmf_target::rdma::GroupCounters) -> (u64, u64)) -> (u64, u64) {
        let tr = self.tr.as_ref().unwrap();
        tr.each_group(move |g| pick(&g.snapshot().counters))
            .unwrap()
            .into_iter()
            .fold((0, 0), |sum, (_, c)| (sum.0 + c.0, sum.1 + c.1))
    }

    /// (completions reaped, capsules received).
    fn reaped(&self) -> (u64, u64) {
        self.counters(|c| (c.completions, c.capsules))
    }

    /// (lone responses sent silent, silent flushes).
    fn silent(&self) -> (u64, u64) {
        self.counters(|c| (c.silent_answers, c.silent_flushes))
    }

    /// Sum over the groups of (requests in use, free buffers, NVMe queues).
    fn usage(&self) -> (usize, u32, usize) {
        let u = self.usage_full();
        (u.0, u.1, u.2)
    }

    /// What waits in the groups (summed).
    fn waiting(&self) -> nvmf_transport::pollgroup::Waiting {
        let tr = self.tr.as_ref().unwrap();
        let mut w = nvmf_transport::pollgroup::Waiting::default();
        for (_, s) in tr.each_group(|g| g.snapshot()).unwrap() {
            w.buffers += s.requests.waiting_buffers;
            w.to_post += s.requests.waiting_to_post;
            w.capsules += s.requests.capsules_waiting;
        }
        w
    }

    /// Times a request waited for data buffers, over the groups.
    fn buffer_waits(&self) -> u64 {
        let tr = self.tr.as_ref().unwrap();
        (0..REACTORS)
            .map(|r| {
                tr.with_group(0, r, |g| g.poll_group().stats().buffer_waits)
                    .unwrap()
                    .unwrap()
            })
            .sum()
    }

    /// Receive slots over the groups, by state: (free: posted or spare, queued for re-posting,
    /// held).
    fn recv_slots(&self) -> (u32, u32, u32) {
        let tr = self.tr.as_ref().unwrap();
        let mut total = (0, 0, 0);
        for (_, s) in tr.each_group(|g| g.snapshot()).unwrap() {
            // Free: posted, or spare (kept off the SRQ by the group's post limit).
            total.0 += s.recv_slots.posted + s.recv_slots.spare;
            total.1 += s.recv_slots.queued;
            total.2 += s.recv_slots.held;
        }
        total
    }

    /// Sum over the groups of (requests in use, free buffers, NVMe queues, pending
    /// completions, qpairs).
    fn usage_full(&self) -> (usize, u32, usize, usize, usize) {
        let tr = self.tr.as_ref().unwrap();
        let mut total = (0, 0, 0, 0, 0);
        for r in 0..REACTORS {
            let u = tr
                .with_group(0, r, |g| {
                    (
                        g.poll_group().requests_in_use(),
                        g.poll_group().buffers_free(),
                        g.handler().queue_count(),
                        g.handler().pending_count(),
                        g.poll_group().qpair_count(),
                    )
                })
                .unwrap()
                .unwrap();
            total.0 += u.0;
            total.1 += u.1;
            total.2 += u.2;
            total.3 += u.3;
            total.4 += u.4;
        }
        total
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        if let Some(tr) = self.tr.take() {
            let _ = tr.stop(Duration::from_secs(10));
        }
        if let Some(rt) = self.rt.take() {
            let _ = rt.stop();
        }
    }
}

fn connect_sqe(host: &HostQueue, qid: u16, sqsize: u16) -> Sqe {
    ConnectCmd {
        cid: 0,
        recfmt: 0,
        qid,
        sqsize,
        cattr: 0,
        // Keep-alive on the admin queue: 2 minutes (no test waits for it; expiry is forced).
        kato: if qid == 0 { 120_000 } else { 0 },
        sgl: host.keyed(0, 1024),
    }
    .to_sqe()
}

pub(crate) fn connect(host: &mut HostQueue, qid: u16, cntlid: u16) -> u16 {
    connect_to(host, qid, cntlid, SUBNQN)
}

fn connect_to(host: &mut HostQueue, qid: u16, cntlid: u16, subnqn: &str) -> u16 {
    connect_sized(host, qid, cntlid, subnqn, 32)
}

/// Connect with a queue of `depth` entries.
pub(crate) fn connect_sized(
    host: &mut HostQueue,
    qid: u16,
    cntlid: u16,
    subnqn: &str,
    depth: u16,
) -> u16 {
    let data = ConnectData {
        hostid: [7; 16],
        cntlid,
        subnqn: FixedStr::new(subnqn, "SUBNQN").unwrap(),
        hostnqn: FixedStr::new(HOSTNQN, "HOSTNQN").unwrap(),
    }
    .to_bytes();
    host.write_data(0, &data);
    let c = host
        .exec(connect_sqe(host, qid, depth - 1), &[])
        .expect("connect answered");
    assert!(c.status.is_success(), "connect qid {qid}: {c:?}");
    c.dw0 as u16
}

/// Sets CC.EN and checks CSTS.RDY.
pub(crate) fn enable(admin: &mut HostQueue) {
    let cc = Cc::enabled_nvm();
    let set = PropertySetCmd {
        cid: 0,
        size: PropertySize::Four,
        offset: PropertyOffset::Cc,
        value: u64::from(cc.to_u32()),
    };
    assert!(admin.exec(set.to_sqe(), &[]).unwrap().status.is_success());
    let get = PropertyGetCmd {
        cid: 0,
        size: PropertySize::Four,
        offset: PropertyOffset::Csts,
    };
    let c = admin.exec(get.to_sqe(), &[]).unwrap();
    assert!(Csts::from_u32(c.dw0).rdy, "{c:?}");
}

pub(crate) fn rw(opcode: u8, lba: u64, blocks: u32, sgl: SglDescriptor) -> Sqe {
    let mut s = Sqe::new(opcode, 0, 1);
    s.cdw10 = lba as u32;
    s.cdw11 = (lba >> 32) as u32;
    s.cdw12 = blocks - 1;
    s.set_sgl1(sgl);
    s
}

/// The bytes of a descriptor list carried in the capsule.
fn descriptors(list: &[SglDescriptor]) -> Vec<u8> {
    list.iter().flat_map(|d| d.to_bytes()).collect()
}

pub(crate) fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

fn full_session(fabric: SoftFabric) {
    let rig = Rig::new(fabric);
    let mut admin = HostQueue::connect(rig.addr, 0, 32);
    let cntlid = connect(&mut admin, 0, CNTLID_DYNAMIC);

    // CC.EN, then CSTS.RDY.
    enable(&mut admin);

    // Identify Controller: 4 KiB written by the target into the host's memory.
    admin.write_data(0, &[0xEE; 4096]);
    let mut identify = Sqe::new(0x06, 0, 0);
    identify.cdw10 = 1;
    identify.set_sgl1(admin.keyed(0, 4096));
    assert!(admin.exec(identify, &[]).unwrap().status.is_success());
    let id = IdentifyController::decode(&admin.read_data(0, 4096)).unwrap();
    assert_eq!(id.cntlid, cntlid);

    // Number of Queues: 3 I/O queues.
    let mut features = Sqe::new(0x09, 0, 0);
    features.cdw10 = 0x07;
    features.cdw11 = 2 | (2 << 16);
    assert!(admin.exec(features, &[]).unwrap().status.is_success());

    let mut io = HostQueue::connect(rig.addr, 1, 32);
    assert_eq!(connect(&mut io, 1, cntlid), cntlid);

    // Write 4 KiB by keyed SGL (the target READs it), 4 KiB in the capsule.
    let a = pattern(0xA5, 4096);
    let b = pattern(0x3C, 4096);
    io.write_data(0, &a);
    let c = io.exec(rw(0x01, 0, 8, io.keyed(0, 4096)), &[]).unwrap();
    assert!(c.status.is_success(), "{c:?}");
    let in_capsule = SglDescriptor::DataBlockOffset {
        offset: 0,
        length: 4096,
    };
    let c = io.exec(rw(0x01, 8, 8, in_capsule), &b).unwrap();
    assert!(c.status.is_success(), "{c:?}");
    assert_eq!(c.sqid, 1);

    // Read both back (the target WRITEs 8 KiB then SENDs).
    io.write_data(16384, &[0; 8192]);
    let c = io
        .exec(rw(0x02, 0, 16, io.keyed(16384, 8192)), &[])
        .unwrap();
    assert!(c.status.is_success(), "{c:?}");
    let back = io.read_data(16384, 8192);
    assert!(back[..4096] == a[..], "keyed write read back");
    assert!(back[4096..] == b[..], "in-capsule write read back");

    // The host asks for its window's key to be invalidated: the target answers with
    // SEND_WITH_INV of that key, after WRITing the data through it. On the soft TCP fabric
    // the host's window bind (a local operation, no frame on the wire) once took a wire
    // sequence number: every later request looked like a gap and was never answered.
    {
        let window = io.window(49152, 4096);
        let SglDescriptor::KeyedDataBlock { key, .. } = window else {
            unreachable!()
        };
        let c = io.exec(rw(0x02, 0, 8, window), &[]).unwrap();
        assert!(c.status.is_success(), "{c:?}");
        assert!(io.read_data(49152, 4096) == a, "read through a window");
        assert_eq!(
            io.last_invalidated,
            Some(key),
            "SEND_WITH_INV of the host's key"
        );
    }

    // Two windows in one descriptor list, each asking for its key to be invalidated: one
    // SEND invalidates one key, so the answer is a plain SEND and the host invalidates both
    // itself (invalidating only the first left the second valid, unknown to the host).
    {
        let first = io.window(49152, 2048);
        let second = io.window(51200, 2048);
        let list = descriptors(&[first, second]);
        let segment = SglDescriptor::LastSegmentOffset {
            offset: 0,
            length: list.len() as u32,
        };
        io.write_data(49152, &[0; 4096]);
        let c = io.exec(rw(0x02, 0, 8, segment), &list).unwrap();
        assert!(c.status.is_success(), "{c:?}");
        assert!(io.read_data(49152, 4096) == a, "read through two windows");
        assert_eq!(io.last_invalidated, None, "no SEND_WITH_INV for two keys");
    }

    // Flush.
    assert!(
        io.exec(Sqe::new(0x00, 0, 1), &[])
            .unwrap()
            .status
            .is_success()
    );

    // Multi-descriptor SGLs (a Last Segment list in the capsule): a write from 6 KiB + 2 KiB
    // (one RDMA READ each, the first over two io units), read back into 2 + 4 + 2 KiB.
    let c = pattern(0x81, 8192);
    io.write_data(65536, &c[..6144]);
    io.write_data(98304, &c[6144..]);
    let list = descriptors(&[io.keyed(65536, 6144), io.keyed(98304, 2048)]);
    let segment = SglDescriptor::LastSegmentOffset {
        offset: 0,
        length: list.len() as u32,
    };
    let r = io.exec(rw(0x01, 128, 16, segment), &list).unwrap();
    assert!(r.status.is_success(), "{r:?}");
    io.write_data(131072, &[0; 12288]);
    let list = descriptors(&[
        io.keyed(131072, 2048),
        io.keyed(135168, 4096),
        io.keyed(143360, 2048),
    ]);
    let segment = SglDescriptor::LastSegmentOffset {
        offset: 0,
        length: list.len() as u32,
    };
    let r = io.exec(rw(0x02, 128, 16, segment), &list).unwrap();
    assert!(r.status.is_success(), "{r:?}");
    let mut back = io.read_data(131072, 2048);
    back.extend(io.read_data(135168, 4096));
    back.extend(io.read_data(143360, 2048));
    assert!(back == c, "multi-descriptor write read back");

    // Past the end: status, no data moved.
    io.write_data(32768, &[0x77; 512]);
    let c = io
        .exec(rw(0x02, BLOCKS, 1, io.keyed(32768, 512)), &[])
        .unwrap();
    assert!(
        matches!(
            c.status.code,
            StatusCode::Generic(GenericStatus::LbaOutOfRange)
        ),
        "{c:?}"
    );
    assert_eq!(io.read_data(32768, 512), vec![0x77; 512]);

    // Malformed SGL: a bit bucket. Status, the queue keeps working.
    let c = io
        .exec(
            rw(0x01, 0, 1, SglDescriptor::BitBucket { length: 512 }),
            &[],
        )
        .unwrap();
    assert!(
        matches!(
            c.status.code,
            StatusCode::Generic(GenericStatus::SglDescriptorTypeInvalid)
        ),
        "{c:?}"
    );

    // Disconnect the I/O queue: answered, then the target drops the qpair.
    let d = DisconnectCmd { cid: 0, recfmt: 0 };
    assert!(io.exec(d.to_sqe(), &[]).unwrap().status.is_success());
    io.wait_disconnected();

    // A wrong rkey on a new I/O queue: the target's READ fails, the qpair drains.
    let mut bad = HostQueue::connect(rig.addr, 2, 32);
    connect(&mut bad, 2, cntlid);
    let wrong = bad.rkey() ^ 0x5a5a_0000;
    assert!(
        bad.exec(rw(0x01, 64, 8, bad.keyed_with(0, 4096, wrong)), &[])
            .is_none(),
        "a write from a wrong rkey must not be answered"
    );
    bad.wait_disconnected();
    drop(bad);
    // Nothing was written: the blocks are still zero (read on a fresh I/O queue).
    let mut check = HostQueue::connect(rig.addr, 3, 32);
    connect(&mut check, 3, cntlid);
    check.write_data(0, &[0xFF; 4096]);
    let c = check
        .exec(rw(0x02, 64, 8, check.keyed(0, 4096)), &[])
        .unwrap();
    assert!(c.status.is_success(), "{c:?}");
    assert_eq!(
        check.read_data(0, 4096),
        vec![0; 4096],
        "the failed write moved no data"
    );
    drop(check);

    drop(admin);
    // Nothing leaks: every request object, buffer and NVMe queue goes back.
    wait_until("every qpair gone and its resources back", || {
        rig.usage() == (0, BUFFERS * REACTORS as u32, 0)
    });
}

/// The discovery subsystem answers on the listener: Connect, CC.EN, and the discovery log
/// (by RDMA WRITE) lists the subsystem.
fn discovery(fabric: SoftFabric) {
    let rig = Rig::new(fabric);
    let mut admin = HostQueue::connect(rig.addr, 0, 32);
    connect_to(&mut admin, 0, CNTLID_DYNAMIC, DISCOVERY_NQN);
    enable(&mut admin);
    let mut log = Sqe::new(0x02, 0, 0);
    let numd = 4096u32 / 4 - 1;
    log.cdw10 = 0x70 | (numd << 16);
    log.set_sgl1(admin.keyed(0, 4096));
    let c = admin.exec(log, &[]).unwrap();
    assert!(c.status.is_success(), "{c:?}");
    let page = DiscoveryLog::decode(&admin.read_data(0, 4096)).unwrap();
    assert!(
        page.entries.iter().any(|e| e.subnqn.as_str() == SUBNQN),
        "{page:?}"
    );
}

/// The groups' `completions` counter counts every completion reaped, the send side's too: once
/// commands were answered it has grown by more than the capsules (whose receive completions it
/// counts as well), and a command was counted as a capsule.
fn completions_counted(fabric: SoftFabric) {
    let rig = Rig::new(fabric);
    let mut admin = HostQueue::connect(rig.addr, 0, 32);
    connect_to(&mut admin, 0, CNTLID_DYNAMIC, DISCOVERY_NQN);
    enable(&mut admin);
    let before = rig.reaped();
    let mut log = Sqe::new(0x02, 0, 0);
    log.cdw10 = 0x70 | ((4096u32 / 4 - 1) << 16);
    log.set_sgl1(admin.keyed(0, 4096));
    let c = admin.exec(log, &[]).unwrap();
    assert!(c.status.is_success(), "{c:?}");
    // The response's send completion (or the silent flush that retires it once the group is
    // idle: over soft TCP acknowledged when this host polls) comes in a later pass.
    wait_until("the response's send completion reaped", || {
        admin.poll_once();
        let after = rig.reaped();
        after.0 - before.0 > after.1 - before.1
    });
    let after = rig.reaped();
    assert!(
        after.1 > before.1,
        "the capsule counted: {before:?} -> {after:?}"
    );
}

/// With `silent_answers` (3 in this rig) an admin queue's lone responses go without a
/// completion of their own and the group's statistics count them; once the host is quiet the
/// group flushes them (counted too) and every request comes back.
fn silent_responses_counted(fabric: SoftFabric) {
    let rig = Rig::new(fabric);
    let mut admin = HostQueue::connect(rig.addr, 0, 32);
    connect_to(&mut admin, 0, CNTLID_DYNAMIC, DISCOVERY_NQN);
    enable(&mut admin);
    // Over soft TCP the flush is acknowledged when this host polls.
    wait_until("the lone responses counted and flushed", || {
        admin.poll_once();
        let (answers, flushes) = rig.silent();
        answers >= 1 && flushes >= 1 && rig.usage().0 == 0
    });
}

/// The host drops its I/O qpair while a write's block I/O is in flight: the request keeps its
/// buffers and the NVMe queue stays until the block device completes, then everything goes
/// back.
fn abort_in_flight(fabric: SoftFabric) {
    let rig = Rig::new(fabric);
    let (mut admin, _, mut io) = rig.controller();
    rig.gate.store(false, Ordering::Release);
    let mut write = rw(0x01, 0, 16, io.keyed(0, 8192));
    write.nsid = 2;
    io.send_only(write);
    wait_until("the write's block I/O in flight", || {
        io.poll_once();
        rig.usage_full().3 == 1
    });
    io.disconnect();
    // The qpair goes; the request (and its two 4 KiB buffers) and the queue stay. The admin
    // queue's answers went silent: the host polls, so soft TCP acknowledges their flush.
    wait_until("the I/O qpair gone, its write still held", || {
        admin.poll_once();
        let (reqs, free, queues, pending, qpairs) = rig.usage_full();
        qpairs == 1 && reqs == 1 && pending == 1 && queues == 2 && free == BUFFERS * 2 - 2
    });
    rig.gate.store(true, Ordering::Release);
    wait_until("the write finished and its queue dropped", || {
        rig.usage_full() == (0, BUFFERS * REACTORS as u32, 1, 0, 1)
    });
    drop(io);
    drop(admin);
    wait_until("everything back", || {
        rig.usage() == (0, BUFFERS * REACTORS as u32, 0)
    });
}

/// A qpair goes while its write is held in the block device, so its NVMe queue lingers; the
/// poll group gives its slot to a later qpair on the same reactor (round robin: the fourth
/// connection), which must get a queue of its own: it does I/O while the old queue lingers,
/// and after the old write completes and its queue is dropped.
fn qpair_slot_reused_while_queue_lingers(fabric: SoftFabric) {
    let rig = Rig::new(fabric);
    let (admin, cntlid, mut io1) = rig.controller();
    rig.gate.store(false, Ordering::Release);
    let mut write = rw(0x01, 0, 8, io1.keyed(0, 4096));
    write.nsid = 2;
    io1.send_only(write);
    wait_until("the write's block I/O in flight", || {
        io1.poll_once();
        rig.usage_full().3 == 1
    });
    io1.disconnect();
    wait_until("the qpair gone, its queue still there", || {
        let (_, _, queues, pending, qpairs) = rig.usage_full();
        qpairs == 1 && queues == 2 && pending == 1
    });
    // Connections 3 and 4: reactor 0, then reactor 1 in the slot the first I/O qpair had.
    let mut io2 = HostQueue::connect(rig.addr, 2, 32);
    connect(&mut io2, 2, cntlid);
    let mut io3 = HostQueue::connect(rig.addr, 3, 32);
    connect(&mut io3, 3, cntlid);
    assert_eq!(rig.usage_full().2, 4, "a queue each, the old one included");
    let roundtrip = |io: &mut HostQueue, lba: u64, seed: u8| {
        let data = pattern(seed, 4096);
        io.write_data(0, &data);
        let c = io.exec(rw(0x01, lba, 8, io.keyed(0, 4096)), &[]).unwrap();
        assert!(c.status.is_success(), "{c:?}");
        let c = io
            .exec(rw(0x02, lba, 8, io.keyed(8192, 4096)), &[])
            .unwrap();
        assert!(c.status.is_success(), "{c:?}");
        assert!(io.read_data(8192, 4096) == data);
    };
    roundtrip(&mut io3, 64, 0x31);
    rig.gate.store(true, Ordering::Release);
    wait_until("the old write done, its queue dropped", || {
        let (_, _, queues, pending, _) = rig.usage_full();
        queues == 3 && pending == 0
    });
    roundtrip(&mut io3, 80, 0x32);
    roundtrip(&mut io2, 96, 0x33);
    drop((io1, io2, io3, admin));
    wait_until("everything back", || {
        rig.usage() == (0, BUFFERS * REACTORS as u32, 0)
    });
}

/// Stopping the transport while an aborted request's block I/O is in flight waits for it: the
/// group (and the buffers the device writes into) is not dropped under the I/O.
fn stop_waits_for_block_io(fabric: SoftFabric) {
    let mut rig = Rig::new(fabric);
    let (admin, _, mut io) = rig.controller();
    rig.gate.store(false, Ordering::Release);
    let mut write = rw(0x01, 0, 16, io.keyed(0, 8192));
    write.nsid = 2;
    io.send_only(write);
    wait_until("the write's block I/O in flight", || {
        io.poll_once();
        rig.usage_full().3 == 1
    });
    let gate = rig.gate.clone();
    let reaped = rig.gate_reaped.clone();
    let opener = std::thread::spawn(move || {
        // Only once the stop has begun (the qpairs are being drained).
        std::thread::sleep(Duration::from_millis(200));
        gate.store(true, Ordering::Release);
    });
    let tr = rig.tr.take().unwrap();
    tr.stop(Duration::from_secs(20)).expect("a clean stop");
    assert_eq!(
        reaped.load(Ordering::Acquire),
        1,
        "the stop waited for the block I/O"
    );
    opener.join().unwrap();
    drop(io);
    drop(admin);
}

/// A controller whose keep-alive expired is torn down: the target disconnects its admin and
/// I/O qpairs by itself and frees everything.
fn keep_alive_expiry(fabric: SoftFabric) {
    let rig = Rig::new(fabric);
    let (mut admin, cntlid, mut io) = rig.controller();
    // The daemon sweeps on a timer; here the clock is moved past KATO instead of waited for.
    let later = std::time::Instant::now() + Duration::from_secs(3600);
    assert_eq!(rig.target.reap_expired(later), vec![cntlid]);
    admin.wait_disconnected();
    io.wait_disconnected();
    wait_until("everything back", || {
        rig.usage() == (0, BUFFERS * REACTORS as u32, 0)
    });
}

/// An Asynchronous Event Request waits in the target (the reactors may sleep meanwhile) and is
/// answered when a namespace is added: the notice arrives as a SEND.
fn async_event(fabric: SoftFabric) {
    let rig = Rig::new(fabric);
    let mut admin = HostQueue::connect(rig.addr, 0, 32);
    connect(&mut admin, 0, CNTLID_DYNAMIC);
    enable(&mut admin);
    // Async Event Configuration: namespace attribute notices on.
    let mut aec = Sqe::new(0x09, 0, 0);
    aec.cdw10 = 0x0B;
    aec.cdw11 = 1 << 8;
    assert!(admin.exec(aec, &[]).unwrap().status.is_success());
    admin.send_only(Sqe::new(0x0C, 0, 0));
    wait_until("the AER held by the target", || {
        admin.poll_once();
        rig.usage_full().3 == 1
    });
    // Let the reactors go idle before the event.
    std::thread::sleep(Duration::from_millis(100));
    rig.target.add_namespace(SUBNQN, 3, "m0").unwrap();
    let c = admin.wait_response();
    assert!(c.status.is_success(), "{c:?}");
    // Notice type (bits 2:0) 2, information 0 (namespace attribute changed).
    assert_eq!(c.dw0 & 0x7, 2, "{c:?}");
    drop(admin);
    wait_until("everything back", || {
        rig.usage() == (0, BUFFERS * REACTORS as u32, 0)
    });
}

/// 16 writes of 64 KiB at once need twice the group's data buffers: the later ones wait for
/// buffers in order, none is dropped; 16 reads at once bring every byte back.
fn queue_full(fabric: SoftFabric) {
    let rig = Rig::new(fabric);
    let (admin, _, mut io) = rig.controller();
    const UNIT: usize = 65536;
    let mut writes = Vec::new();
    let mut data = Vec::new();
    for i in 0..16 {
        let d = pattern(i as u8, UNIT);
        io.write_data(i * UNIT, &d);
        data.push(d);
        writes.push(rw(
            0x01,
            (i * 128) as u64,
            128,
            io.keyed(i * UNIT, UNIT as u32),
        ));
    }
    for c in io.exec_many(&writes) {
        assert!(c.status.is_success(), "{c:?}");
    }
    assert!(rig.buffer_waits() > 0, "the writes had to wait for buffers");
    let mut reads = Vec::new();
    for i in 0..16 {
        io.write_data(i * UNIT, &vec![0; UNIT]);
        reads.push(rw(
            0x02,
            (i * 128) as u64,
            128,
            io.keyed(i * UNIT, UNIT as u32),
        ));
    }
    for c in io.exec_many(&reads) {
        assert!(c.status.is_success(), "{c:?}");
    }
    for (i, d) in data.iter().enumerate() {
        assert!(
            io.read_data(i * UNIT, UNIT) == *d,
            "64 KiB unit {i} read back"
        );
    }
    drop(io);
    drop(admin);
    wait_until("everything back", || {
        rig.usage() == (0, BUFFERS * REACTORS as u32, 0)
    });
}

/// CC (and CSTS.RDY) by Property Get.
fn property(admin: &mut HostQueue, offset: PropertyOffset) -> u32 {
    let get = PropertyGetCmd {
        cid: 0,
        size: PropertySize::Four,
        offset,
    };
    let c = admin.exec(get.to_sqe(), &[]).unwrap();
    assert!(c.status.is_success(), "{c:?}");
    c.dw0
}

/// Writes CC with EN = `en` (I/O queue entry sizes 64 / 16).
fn set_cc_en(en: bool) -> Sqe {
    let cc = Cc {
        en,
        ..Cc::enabled_nvm()
    };
    PropertySetCmd {
        cid: 0,
        size: PropertySize::Four,
        offset: PropertyOffset::Cc,
        value: u64::from(cc.to_u32()),
    }
    .to_sqe()
}

/// CC.EN 1 -> 0 on a live controller (a controller reset): its I/O queues are disconnected
/// (a write held in the block device ends with them), the outstanding AER is answered as
/// aborted, CSTS.RDY stays 1 until the last I/O queue has closed and then reads 0; the admin
/// queue stays, and after enabling again the host creates an I/O queue and does I/O.
fn controller_reset(fabric: SoftFabric) {
    let rig = Rig::new(fabric);
    let (mut admin, cntlid, mut io1) = rig.controller();
    let mut io2 = HostQueue::connect(rig.addr, 2, 32);
    connect(&mut io2, 2, cntlid);
    let aer = admin.send_tracked(Sqe::new(0x0C, 0, 0));
    rig.gate.store(false, Ordering::Release);
    let mut write = rw(0x01, 0, 8, io1.keyed(0, 4096));
    write.nsid = 2;
    io1.send_only(write);
    wait_until("the AER and the write pending", || {
        io1.poll_once();
        rig.usage_full().3 == 2
    });

    let reset = admin.send_tracked(set_cc_en(false));
    let answers = admin.collect(2);
    let by_cid = |cid| *answers.iter().find(|c| c.cid == cid).unwrap();
    assert!(by_cid(reset).status.is_success(), "{answers:?}");
    assert_eq!(
        by_cid(aer).status.code,
        StatusCode::Generic(GenericStatus::AbortedSqDeletion),
        "the outstanding AER ends with the reset: {answers:?}"
    );
    io1.wait_disconnected();
    io2.wait_disconnected();
    // The write still holds its buffers in the block device: its queue has not closed, so the
    // reset is not complete.
    let csts = Csts::from_u32(property(&mut admin, PropertyOffset::Csts));
    assert!(csts.rdy, "ready until every I/O queue is gone: {csts:?}");
    assert!(!Cc::from_u32(property(&mut admin, PropertyOffset::Cc)).en);
    rig.gate.store(true, Ordering::Release);
    wait_until("CSTS.RDY 0 once the I/O queues closed", || {
        !Csts::from_u32(property(&mut admin, PropertyOffset::Csts)).rdy
    });
    // Disabled: admin commands other than Fabrics are refused, I/O queues cannot connect.
    let c = admin.exec(Sqe::new(0x18, 0, 0), &[]).unwrap();
    assert_eq!(
        c.status.code,
        StatusCode::Generic(GenericStatus::CommandSequenceError),
        "Keep Alive while disabled: {c:?}"
    );
    drop(io1);
    drop(io2);

    enable(&mut admin);
    let mut io = HostQueue::connect(rig.addr, 1, 32);
    assert_eq!(connect(&mut io, 1, cntlid), cntlid, "same controller");
    let data = pattern(0x77, 4096);
    io.write_data(0, &data);
    let c = io.exec(rw(0x01, 64, 8, io.keyed(0, 4096)), &[]).unwrap();
    assert!(c.status.is_success(), "{c:?}");
    let c = io.exec(rw(0x02, 64, 8, io.keyed(8192, 4096)), &[]).unwrap();
    assert!(c.status.is_success(), "{c:?}");
    assert!(io.read_data(8192, 4096) == data, "I/O after the reset");
    drop(io);
    drop(admin);
    wait_until("everything back", || {
        rig.usage() == (0, BUFFERS * REACTORS as u32, 0)
    });
}

/// A qpair that never sends a Fabrics Connect, or whose Connect was refused (an unknown
/// subsystem), is disconnected by the target after its deadline, its slot freed; a
/// controller's qpairs stay.
fn unconnected_qpairs_expire(fabric: SoftFabric) {
    // Long enough for the rig's own controller to connect its queues on a loaded machine.
    let rig = Rig::build(fabric, |_| {}, |_| {}, Duration::from_millis(1500));
    let (admin, _, mut io) = rig.controller();
    let mut silent = HostQueue::connect(rig.addr, 0, 32);
    let mut refused = HostQueue::connect(rig.addr, 0, 32);
    refused.write_data(
        0,
        &ConnectData {
            hostid: [7; 16],
            cntlid: CNTLID_DYNAMIC,
            subnqn: FixedStr::new("nqn.2016-06.io.nvmf-rs:nowhere", "SUBNQN").unwrap(),
            hostnqn: FixedStr::new(HOSTNQN, "HOSTNQN").unwrap(),
        }
        .to_bytes(),
    );
    let c = refused
        .exec(connect_sqe(&refused, 0, 31), &[])
        .expect("connect answered");
    assert!(!c.status.is_success(), "{c:?}");
    silent.wait_disconnected();
    refused.wait_disconnected();
    wait_until("the two slots freed", || rig.usage_full().4 == 2);
    // The controller's queues were connected in time: they stay and work.
    io.write_data(0, &[0x33; 512]);
    let c = io.exec(rw(0x01, 3, 1, io.keyed(0, 512)), &[]).unwrap();
    assert!(c.status.is_success(), "{c:?}");
    drop(io);
    drop(admin);
}

/// Consecutive keyed descriptors of `lens` bytes over the host's data area from `base`, as a
/// Last Segment list carried in the capsule: (SGL1, the capsule's descriptor bytes).
fn split_sgl(host: &HostQueue, base: usize, lens: &[u32]) -> (SglDescriptor, Vec<u8>) {
    let mut at = base;
    let list: Vec<SglDescriptor> = lens
        .iter()
        .map(|&l| {
            let d = host.keyed(at, l);
            at += l as usize;
            d
        })
        .collect();
    let bytes = descriptors(&list);
    let segment = SglDescriptor::LastSegmentOffset {
        offset: 0,
        length: bytes.len() as u32,
    };
    (segment, bytes)
}

/// Transfers whose pieces need more SGEs or work requests than one chain holds, within
/// max_io_size (128 KiB) and MSDBD (16): in 4 KiB io units one 128 KiB descriptor is 32 SGEs
/// (two work requests, two chains), and 16 descriptors ending mid-unit are 47 pieces. Each is
/// written and read back intact, in several chains each way.
fn large_transfers(fabric: SoftFabric) {
    large_transfers_on(Rig::new(fabric));
}

/// `large_transfers` on a device narrower than the 16 SGEs a work request may carry at most:
/// four SGEs to a WR and one to an RDMA READ (iWARP's `max_sge_rd`). The target creates its
/// QPs within the device's limits (or no host could connect) and cuts the transfers into
/// more work requests (the soft device refuses a READ with two SGEs at post, as hardware
/// does).
fn large_transfers_on_a_narrow_device(fabric: SoftFabric) {
    let narrow = |d: &mut SoftConfig| {
        d.max_sge = 4;
        d.max_sge_rd = 1;
    };
    let rig = Rig::with_device(fabric, narrow, |_| {});
    let limits = rig
        .tr
        .as_ref()
        .unwrap()
        .with_group(0, 0, |g| g.poll_group().sge_limits())
        .unwrap()
        .unwrap();
    assert_eq!((limits.send, limits.read), (4, 1));
    large_transfers_on(rig);
}

fn large_transfers_on(rig: Rig) {
    let (admin, _, mut io) = rig.controller();
    const LEN: usize = 131072;
    let blocks = (LEN / BLOCK as usize) as u32;

    let data = pattern(0x3C, LEN);
    io.write_data(0, &data);
    let c = io
        .exec(rw(0x01, 256, blocks, io.keyed(0, LEN as u32)), &[])
        .unwrap();
    assert!(
        c.status.is_success(),
        "128 KiB write, one descriptor: {c:?}"
    );
    io.write_data(LEN, &vec![0; LEN]);
    let c = io
        .exec(rw(0x02, 256, blocks, io.keyed(LEN, LEN as u32)), &[])
        .unwrap();
    assert!(c.status.is_success(), "128 KiB read, one descriptor: {c:?}");
    assert!(io.read_data(LEN, LEN) == data, "one descriptor read back");

    let data = pattern(0xA7, LEN);
    let mut written = vec![100u32; 15];
    written.push(LEN as u32 - 1500);
    io.write_data(2 * LEN, &data);
    let (sgl, list) = split_sgl(&io, 2 * LEN, &written);
    let c = io.exec(rw(0x01, 512, blocks, sgl), &list).unwrap();
    assert!(c.status.is_success(), "16-descriptor write: {c:?}");
    let mut read = vec![4000u32];
    read.extend([300u32; 14]);
    read.push(LEN as u32 - 4000 - 14 * 300);
    io.write_data(3 * LEN, &vec![0; LEN]);
    let (sgl, list) = split_sgl(&io, 3 * LEN, &read);
    let c = io.exec(rw(0x02, 512, blocks, sgl), &list).unwrap();
    assert!(c.status.is_success(), "16-descriptor read: {c:?}");
    assert!(
        io.read_data(3 * LEN, LEN) == data,
        "16 descriptors read back"
    );
    drop(io);
    drop(admin);
    wait_until("everything back", || {
        rig.usage() == (0, BUFFERS * REACTORS as u32, 0)
    });
}

/// The null namespace reads zeroes through data buffers that writes used before: a group with
/// one data buffer sends every transfer through the same one. A null read fills it once and
/// later null reads skip the fill while it is known to hold zeroes; a keyed write (RDMA READ
/// into it) and a malloc read (the device writes it) in between must make the next null read
/// fill it again.
fn null_reads_never_see_stale_data(fabric: SoftFabric) {
    let rig = Rig::with_group(fabric, |g| g.data_buffers = 1);
    rig.target.add_bdev(
        "null0",
        Arc::new(NullBdev::new("null0", BLOCK, BLOCKS * u64::from(BLOCK)).unwrap()),
    );
    rig.target.add_namespace(SUBNQN, 3, "null0").unwrap();
    let (admin, _, mut io) = rig.controller();
    let read_null = |io: &mut HostQueue| {
        io.write_data(16384, &[0xEE; 4096]);
        let mut read = rw(0x02, 0, 8, io.keyed(16384, 4096));
        read.nsid = 3;
        let c = io.exec(read, &[]).unwrap();
        assert!(c.status.is_success(), "{c:?}");
        io.read_data(16384, 4096)
    };
    let zeroes = vec![0u8; 4096];
    assert!(read_null(&mut io) == zeroes, "first null read");
    assert!(
        read_null(&mut io) == zeroes,
        "null read of a buffer known zeroed"
    );
    // A keyed write to the null namespace: the host's data lands in the buffer.
    let a = pattern(0x5A, 4096);
    io.write_data(0, &a);
    let mut write = rw(0x01, 0, 8, io.keyed(0, 4096));
    write.nsid = 3;
    assert!(io.exec(write, &[]).unwrap().status.is_success());
    assert!(
        read_null(&mut io) == zeroes,
        "null read after a keyed write"
    );
    // A malloc write and read back: the device fills the buffer with the data.
    let c = io.exec(rw(0x01, 0, 8, io.keyed(0, 4096)), &[]).unwrap();
    assert!(c.status.is_success(), "{c:?}");
    assert!(read_null(&mut io) == zeroes);
    io.write_data(8192, &[0; 4096]);
    let c = io.exec(rw(0x02, 0, 8, io.keyed(8192, 4096)), &[]).unwrap();
    assert!(c.status.is_success(), "{c:?}");
    assert!(io.read_data(8192, 4096) == a, "malloc read back");
    assert!(
        read_null(&mut io) == zeroes,
        "null read after a malloc read"
    );
    drop(io);
    drop(admin);
}

/// A host buffer longer than what its command moves is refused (SGLS bit 18 clear) and the
/// target writes none of it: answered with success, the whole buffer would have gone back, its
/// tail as the one pool buffer last held it (here a 4 KiB read of another pattern).
fn oversized_buffers_get_nothing(fabric: SoftFabric) {
    use commands::generic;
    let rig = Rig::with_group(fabric, |g| g.data_buffers = 1);
    let (mut admin, _, mut io) = rig.controller();
    let secret = pattern(0x3C, 4096);
    io.write_data(0, &secret);
    assert!(
        io.exec(rw(0x01, 0, 8, io.keyed(0, 4096)), &[])
            .unwrap()
            .status
            .is_success()
    );
    // The pool's one buffer now holds the pattern.
    assert!(
        io.exec(rw(0x02, 0, 8, io.keyed(8192, 4096)), &[])
            .unwrap()
            .status
            .is_success()
    );
    assert!(io.read_data(8192, 4096) == secret);
    let untouched = vec![0xEEu8; 4096];
    io.write_data(16384, &untouched);
    let c = io.exec(rw(0x02, 0, 1, io.keyed(16384, 4096)), &[]).unwrap();
    assert_eq!(
        generic(&c),
        Some(GenericStatus::DataSglLengthInvalid),
        "{c:?}"
    );
    assert!(
        io.read_data(16384, 4096) == untouched,
        "a 512 B read wrote the host"
    );
    // Admin commands through the same kind of buffer: one that moves nothing, a log page of
    // 512 bytes.
    admin.write_data(16384, &untouched);
    let mut get_features = Sqe::new(0x0A, 0, 0);
    get_features.cdw10 = 0x07;
    get_features.set_sgl1(admin.keyed(16384, 4096));
    let mut smart = Sqe::new(0x02, 0, 0xFFFF_FFFF);
    smart.cdw10 = 0x02 | (127 << 16);
    smart.set_sgl1(admin.keyed(16384, 4096));
    for sqe in [get_features, smart] {
        let c = admin.exec(sqe, &[]).unwrap();
        assert_eq!(
            generic(&c),
            Some(GenericStatus::DataSglLengthInvalid),
            "{c:?}"
        );
        assert!(
            admin.read_data(16384, 4096) == untouched,
            "opcode {:#x}",
            sqe.opcode
        );
    }
    drop(io);
    drop(admin);
}

/// A host slow to take an answer (no receive posted: the target's SEND meets RNR and retries for
/// ever) holds only that answer: a write's data buffers go back when its response is posted, so
/// other commands of the group do not wait for them meanwhile.
fn held_answer_holds_no_buffers(fabric: SoftFabric) {
    let rig = Rig::with_group(fabric, |g| g.data_buffers = 4);
    let all = (REACTORS * 4) as u32;
    let (admin, _, mut io) = rig.controller();
    // 16 KiB by keyed SGL: the four buffers of its group.
    let data = pattern(0x3C, 16384);
    io.write_data(0, &data);
    io.send_without_receive(rw(0x01, 0, 32, io.keyed(0, 16384)));
    wait_until("the write's buffers back while its answer waits", || {
        // The host's side of the soft TCP fabric moves (the target's READ of the data) when
        // it polls.
        io.poll_once();
        rig.usage().1 == all
    });
    let c = io.take_held_answer();
    assert!(c.status.is_success(), "{c:?}");
    io.write_data(32768, &[0; 16384]);
    let c = io
        .exec(rw(0x02, 0, 32, io.keyed(32768, 16384)), &[])
        .unwrap();
    assert!(c.status.is_success(), "{c:?}");
    assert!(io.read_data(32768, 16384) == data, "the write landed whole");
    drop(io);
    drop(admin);
}

#[test]
fn abort_waiting_for_read_depth_tcp() {
    commands::abort_waiting_for_read_depth();
}

/// Each scenario runs on both soft fabrics, as `NAME_inproc` and `NAME_tcp`.
macro_rules! on_both_fabrics {
    ($($inproc:ident, $tcp:ident => $scenario:path;)*) => {
        $(
            #[test]
            fn $inproc() {
                $scenario(SoftFabric::InProcess);
            }
            #[test]
            fn $tcp() {
                $scenario(SoftFabric::Tcp);
            }
        )*
    };
}

on_both_fabrics! {
    stop_waits_for_block_io_inproc, stop_waits_for_block_io_tcp => stop_waits_for_block_io;
    keep_alive_expiry_inproc, keep_alive_expiry_tcp => keep_alive_expiry;
    abort_in_flight_inproc, abort_in_flight_tcp => abort_in_flight;
    async_event_inproc, async_event_tcp => async_event;
    queue_full_inproc, queue_full_tcp => queue_full;
    controller_reset_inproc, controller_reset_tcp => controller_reset;
    large_transfers_inproc, large_transfers_tcp => large_transfers;
    narrow_device_inproc, narrow_device_tcp => large_transfers_on_a_narrow_device;
    unconnected_inproc, unconnected_tcp => unconnected_qpairs_expire;
    slot_reuse_inproc, slot_reuse_tcp => qpair_slot_reused_while_queue_lingers;
    discovery_inproc, discovery_tcp => discovery;
    completions_inproc, completions_tcp => completions_counted;
    silent_counted_inproc, silent_counted_tcp => silent_responses_counted;
    null_zeroes_inproc, null_zeroes_tcp => null_reads_never_see_stale_data;
    oversized_inproc, oversized_tcp => oversized_buffers_get_nothing;
    held_answer_inproc, held_answer_tcp => held_answer_holds_no_buffers;
    in_capsule_held_inproc, in_capsule_held_tcp => in_capsule::held_in_place;
    in_capsule_gone_inproc, in_capsule_gone_tcp => in_capsule::qpair_gone_while_held;
    in_capsule_srq_inproc, in_capsule_srq_tcp => in_capsule::srq_all_held;
    session_inproc, session_tcp => full_session;
    commands_inproc, commands_tcp => commands::commands;
    abort_outstanding_inproc, abort_outstanding_tcp => commands::abort_outstanding;
    abort_waiting_inproc, abort_waiting_tcp => commands::abort_waiting;
}
