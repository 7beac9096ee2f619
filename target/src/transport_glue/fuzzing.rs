//! The whole request path under a hostile host (feature `fuzzing`; the `fuzz_target_hostile_host`
//! target in `fuzz/`): a running [`RdmaTransport`] with the NVMe handler on its reactors, on a
//! soft fabric, and raw host queues (CM connections with their own QP, CQ and registered region)
//! that connect, send capsules and disconnect as the input says. Unlike
//! `nvme::fuzzing`, which calls the execution interface, this goes through everything a network
//! peer reaches: the CM's private data, the acceptor, the poll group's SRQ and requests, data
//! buffers, RDMA READs and WRITEs against the host's keys, silent answers, drains.
//!
//! One rig lives for the process (starting reactors per input would be slow): a target with a
//! malloc namespace (nsid 1) and a null one (nsid 2), two reactors (the acceptor places
//! connections on them in turn, so a controller's admin and I/O queues often live on
//! different reactors, and a teardown or keep-alive expiry crosses between them), and three
//! transports on three soft devices: in-process answering every response with a completion
//! (`silent_answers` 0, the default), in-process with lone answers silent (2), and soft TCP (the
//! fabric between processes, here over loopback; the host's side moves when its queues poll);
//! the input's first byte picks (mod 3). The groups are small (64 receive slots, 48 request
//! objects, 16 data buffers of 4 KiB) so that waits for requests and buffers happen. Rules (a
//! panic is what libFuzzer reports):
//! - no panic on any thread (the reactor's included);
//! - a connect is answered (established or refused) and a capsule's SEND completes;
//! - the target sends only 16-byte responses, each naming a CID the host sent on that queue and
//!   has not had answered yet;
//! - every command is answered while its connection stands, once the host has posted a receive
//!   for each answer (an Asynchronous Event Request on an admin queue may stay pending). A
//!   host that holds receives back (RNR, retried for ever, as nvmet-rdma and SPDK accept) may
//!   hold up the group's other queues meanwhile: what its answers hold (data buffers, requests)
//!   waits with them, so the rule is checked at a settle, after the host caught up;
//! - a Read of the null namespace answered with success left zeroes where its blocks go in the
//!   host's memory (checked when it was its queue's only command in flight: a data buffer still
//!   holding another command's bytes, or a success without the data moved, shows here);
//! - after the host tears every connection down, the target returns to where it started: no
//!   qpairs, controllers, NVMe queues, requests, held or queued receive slots, pending block I/O;
//!   every data buffer free; no placement counted; and none of the counters that are bugs if
//!   they grow (stale completions, kind mismatches, receive-slot errors) moved, nor a drain
//!   forced by its timeout (the soft device always reports a drained QP).
//!
//! A wait that a working target ends at once (an answer, a teardown) gives up after
//! [`PATIENCE`]: a hang is reported as a panic naming what was awaited.
//!
//! Input: a first byte (which transport, mod 3), then records of a control byte (bits 0-2 the
//! operation, 3-4 the host queue slot, 5-7 flags) and the operation's bytes:
//! - 0 connect (the first 8 of an input): 2 bytes (qid, depth). Flag 0: the admin queue (else qid 1-3 of the controller
//!   last connected); flag 1: the CM private data is the next bytes (a length byte, up to 56),
//!   not a well-formed request; flag 2: no NVMe Connect after the CM's (the queue stays raw).
//!   An admin queue that connected is enabled (CC.EN = 1).
//! - 1 capsule: a 64-byte SQE, a little-endian u16 in-capsule length (mod 8193) and its bytes
//!   (as many as are left). Flag 0: SGL1 becomes a keyed descriptor into the host's data area
//!   (its real key; offset and length from the SQE's own SGL, kept inside the area), asking
//!   for the key's invalidation when flag 1 is set too; flag 1 alone: SGL1 becomes in-capsule
//!   data of the capsule's length; flag 2: no receive is posted for the answer (the target's
//!   answer waits, retrying for ever, holding what its command holds, until the next settle
//!   posts the receives held back).
//! - 2 short SEND: a length byte (mod 64) and the bytes: less than an SQE.
//! - 3 settle: post the receives held back, and wait until every command is answered (the rule
//!   above).
//! - 4 disconnect the slot (CM disconnect; the slot is free again).
//! - 5 capsule sent as SEND with immediate data (as 1, the immediate from the SQE's CID).
//! - 6 wait a byte's worth of milliseconds (mod 4), polling. Flag 1 instead: wait until the
//!   slot's commands are answered (at most a second; no rule). Flag 0 instead (the byte unused):
//!   the target's SEND completions are held on every poll group CQ of the side while its receive
//!   completions go past them, as when a NIC's ACK comes late: the host has its answers, and its
//!   next capsules arrive, before the target hears that the answers went. Capsules, short SENDs
//!   and waits keep the hold, at most 16 of them (the groups' 48 request objects outlast it);
//!   any other record releases it first (each may wait for what the held requests keep).
//! - 7 keep-alive expiry: the target reaps its controllers as if two keep-alive timeouts (the
//!   host's Connects ask for 60 s) went by without a Keep Alive, as nvmf-tgt's reactor timer
//!   does on its own clock: every controller is torn down while its queues stand.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use nvmf_poller::{Runtime, RuntimeConfig};
use nvmf_protocol::cm::{RdmaAccept, RdmaConnectRequest};
use nvmf_protocol::fabrics::{
    CNTLID_DYNAMIC, ConnectCmd, ConnectData, PropertySetCmd, PropertySize,
};
use nvmf_protocol::properties::{Cc, PropertyOffset};
use nvmf_protocol::{Cqe, FixedStr, SglDescriptor, Sqe};
use nvmf_transport::fuzz_input::take;
use nvmf_transport::{
    Access, CmChannel, CmEventKind, CmId, ConnParam, Context, Cq, DeviceSpec, Mr, Pd, ProviderKind,
    Qp, QpCaps, QpInitAttr, RecvWr, SendFlags, SendOp, SendWr, SoftConfig, SoftFabric, WcStatus,
    WorkCompletion,
};

use super::{Command, NvmeHandler};
use crate::bdev::{MallocBdev, NullBdev};
use crate::nvme::{Limits, ReactorIo, Subsystem, Target};
use crate::rdma::{DeviceListen, GroupSnapshot, PollGroupConfig, RdmaConfig, RdmaTransport};

const SUBNQN: &str = "nqn.2016-06.io.nvmf-rs:hostile";
const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:6a1c0e55-3b1e-4c0b-9d3f-5e7a8b9c0d1e";
/// How long a wait that a working target ends at once may take before it counts as a hang.
pub const PATIENCE: Duration = Duration::from_secs(10);
/// Transports (see the module doc).
const SIDES: usize = 3;
/// Host queue slots an input drives.
const SLOTS: usize = 4;
/// Receives (answers) a host queue keeps posted at most; also its capsule buffers.
const HOST_DEPTH: usize = 32;
/// Send WRs a host queue has outstanding at most: no more than its capsule buffers, since a
/// stalled SEND reads its buffer when it goes.
const HOST_SENDS: usize = HOST_DEPTH;
/// Connects an input makes at most (each costs a CM round trip: the fuzzer's time is better
/// spent on what goes over the connections); further connect records are skipped.
const MAX_CONNECTS: usize = 8;
/// Largest in-capsule length an input asks for (the target takes 4096).
const MAX_IN_CAPSULE: usize = 8192;
/// A capsule buffer: the SQE and the largest in-capsule data.
const CAPSULE_SLOT: usize = 64 + MAX_IN_CAPSULE;
const RESPONSES_AT: usize = HOST_DEPTH * CAPSULE_SLOT;
/// The host data area keyed descriptors point into.
const DATA_AT: usize = RESPONSES_AT + HOST_DEPTH * 16;
const DATA_SIZE: usize = 512 * 1024;
const REGION: usize = DATA_AT + DATA_SIZE;
/// The most private data an RDMA CM connect carries.
const MAX_PRIVATE_DATA: usize = 56;

const OP_CONNECT: u8 = 0;
const OP_CAPSULE: u8 = 1;
const OP_SHORT: u8 = 2;
const OP_SETTLE: u8 = 3;
const OP_DISCONNECT: u8 = 4;
const OP_CAPSULE_IMM: u8 = 5;
const OP_WAIT: u8 = 6;
const OP_EXPIRE: u8 = 7;
/// Keep-alive timeout of the host's NVMe Connects.
const KATO_MS: u32 = 60_000;

const FLAG_0: u8 = 1 << 5;
const FLAG_1: u8 = 1 << 6;
const FLAG_2: u8 = 1 << 7;

/// Receive WR ids are this plus the response slot; sends carry `SEND_WR`.
const RECV_WR: u64 = 0x100;
const SEND_WR: u64 = 1;

const AER_OPCODE: u8 = 0x0C;
const READ_OPCODE: u8 = 0x02;
/// The null namespace and its block size (reads return zeroes).
const NULL_NSID: u32 = 2;
const NULL_BLOCK: usize = 4096;
/// The group sizes (see the module doc).
const SRQ_DEPTH: u32 = 64;
const MAX_REQUESTS: u32 = 48;
const DATA_BUFFERS: u32 = 16;

/// Runs one input; panics when a rule of the module doc breaks.
pub fn hostile_host(data: &[u8]) {
    let rig = rig();
    // One input at a time: the rules compare the whole target before and after.
    let rig = rig.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let Some((&first, mut rest)) = data.split_first() else {
        return;
    };
    let side = &rig.sides[usize::from(first) % SIDES];
    let mut run = Run {
        addr: side.addr,
        slots: std::array::from_fn(|_| None),
        cntlid: CNTLID_DYNAMIC,
        connects: 0,
        held: None,
    };
    while let Some((&control, tail)) = rest.split_first() {
        rest = tail;
        let slot = usize::from(control >> 3) % SLOTS;
        let op = control & 0b111;
        let hold = op == OP_WAIT && control & FLAG_0 != 0;
        if let Some(records) = run.held {
            let keeps = matches!(op, OP_CAPSULE | OP_CAPSULE_IMM | OP_SHORT | OP_WAIT);
            if hold || records >= MAX_HELD_RECORDS || !keeps {
                run.hold_sends(side, false);
            } else {
                run.held = Some(records + 1);
            }
        }
        match op {
            OP_WAIT if hold => {
                let (_, tail) = take(rest, 1);
                rest = tail;
                run.hold_sends(side, true);
            }
            OP_CONNECT => {
                let (head, tail) = take(rest, 2);
                rest = tail;
                let (qid_byte, depth_byte) = (head[0], head[1]);
                let private = if control & FLAG_1 != 0 {
                    let (len, tail) = take(rest, 1);
                    let len = usize::from(len[0]) % (MAX_PRIVATE_DATA + 1);
                    let (bytes, tail) = tail.split_at(len.min(tail.len()));
                    rest = tail;
                    Some(bytes.to_vec())
                } else {
                    None
                };
                let qid = if control & FLAG_0 != 0 {
                    0
                } else {
                    1 + u16::from(qid_byte % 3)
                };
                let depth = 2 + u16::from(depth_byte) % (HOST_DEPTH as u16 - 1);
                if run.connects < MAX_CONNECTS {
                    run.connects += 1;
                    run.connect(slot, qid, depth, private, control & FLAG_2 == 0);
                }
            }
            OP_CAPSULE | OP_CAPSULE_IMM => {
                let (head, tail) = take(rest, 66);
                let len =
                    usize::from(u16::from_le_bytes([head[64], head[65]])) % (MAX_IN_CAPSULE + 1);
                let (payload, tail) = tail.split_at(len.min(tail.len()));
                rest = tail;
                let mut sqe = Sqe::decode(&head[..64]).expect("64 bytes decode");
                let imm = (control & 0b111 == OP_CAPSULE_IMM).then_some(u32::from(sqe.cid));
                if let Some(s) = run.slots[slot].as_mut() {
                    s.steer(control, &mut sqe, payload.len());
                    s.send_capsule(&sqe, payload, control & FLAG_2 == 0, imm);
                }
            }
            OP_SHORT => {
                let (len, tail) = take(rest, 1);
                let (bytes, tail) = tail.split_at((usize::from(len[0]) % 64).min(tail.len()));
                rest = tail;
                if let Some(s) = run.slots[slot].as_mut() {
                    s.send_raw(bytes, false, None);
                }
            }
            OP_SETTLE => run.settle(),
            OP_DISCONNECT => {
                if let Some(s) = run.slots[slot].take() {
                    s.close();
                }
            }
            OP_WAIT if control & FLAG_1 != 0 => {
                let (_, tail) = take(rest, 1);
                rest = tail;
                // Until the slot's commands are answered, as a host that waits for its
                // completions; bounded and no rule (a hold may keep what the answers need).
                let until = Instant::now() + ANSWER_WAIT;
                while Instant::now() < until
                    && run.slots[slot]
                        .as_ref()
                        .is_some_and(HostQueue::owes_answers)
                {
                    run.poll_all();
                    std::thread::yield_now();
                }
            }
            OP_WAIT => {
                let (ms, tail) = take(rest, 1);
                rest = tail;
                let until = Instant::now() + Duration::from_millis(u64::from(ms[0] % 4));
                while Instant::now() < until {
                    run.poll_all();
                    std::thread::yield_now();
                }
            }
            // What nvmf-tgt's reactor timer does on its own clock, as if two keep-alive timeouts
            // went by without a Keep Alive.
            OP_EXPIRE => {
                rig.target
                    .reap_expired(Instant::now() + 2 * Duration::from_millis(u64::from(KATO_MS)));
            }
            _ => unreachable!("three bits"),
        }
        run.poll_all();
    }
    run.hold_sends(side, false);
    run.settle();
    for queue in run.slots.into_iter().flatten() {
        queue.close();
    }
    rig.wait_idle(side);
    // The soft TCP CM's threads of the input's connections end on their own after the
    // connections went; joined here, so that nothing of theirs is held when the leak checker
    // looks after the input. (Other tests of a unit-test process may hold CM threads too: the
    // wait is bounded and not a rule.)
    nvmf_transport::soft::join_finished_cm_threads(rig.cm_threads, Duration::from_secs(1));
}

/// A TCP port on `ip` that nothing listens on now.
fn free_port(ip: Ipv4Addr) -> u16 {
    std::net::TcpListener::bind((ip, 0))
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .expect("a free loopback port")
}

/// One soft device with its transport.
struct Side {
    addr: SocketAddr,
    transport: RdmaTransport<Command, NvmeHandler>,
    /// The side's soft device (its faults reach the groups' CQs).
    ctx: Context,
}

/// The target, its reactor and its transports (see the module doc).
struct Rig {
    target: Arc<Target>,
    sides: [Side; SIDES],
    _runtime: Runtime,
    /// The soft TCP CM's threads the rig itself keeps (its listener's).
    cm_threads: usize,
}

/// The process's rig, started by the first input.
fn rig() -> &'static Mutex<Rig> {
    static RIG: OnceLock<Mutex<Rig>> = OnceLock::new();
    RIG.get_or_init(|| Mutex::new(Rig::start()))
}

impl Rig {
    fn start() -> Rig {
        // Addresses no other soft device of the process uses (unit tests share the process).
        // The soft TCP side's CM listens on a real socket: its port is one the kernel hands
        // out, so that this process and a running fuzzer (another process) do not collide. The
        // target must know the address before its transport starts (the subsystem's listeners
        // admit connects), hence a port probed free rather than one read back after the bind.
        let addrs = [1u8, 2, 3].map(|n| {
            let ip = Ipv4Addr::new(127, 0, 77, n);
            let port = if n == 3 { free_port(ip) } else { 4420 };
            SocketAddr::from((ip, port))
        });
        let mut target = Target::new(Limits::default(), addrs.to_vec());
        let malloc = MallocBdev::new("m0", 512, 1 << 20).expect("malloc bdev");
        let null = NullBdev::new("n0", NULL_BLOCK as u32, 1 << 30).expect("null bdev");
        target.add_bdev("m0", Arc::new(malloc));
        target.add_bdev("n0", Arc::new(null));
        let sub = Arc::new(Subsystem::new(
            SUBNQN,
            "HOSTILE",
            "MODEL",
            true,
            vec![],
            16,
            addrs.to_vec(),
        ));
        target.add_subsystem(sub);
        for (nsid, bdev) in [(1, "m0"), (2, "n0")] {
            target.add_namespace(SUBNQN, nsid, bdev).expect("namespace");
        }
        let target = Arc::new(target);
        let runtime = Runtime::start(RuntimeConfig {
            cores: vec![0, 1],
            pin: false,
            ..RuntimeConfig::default()
        })
        .expect("runtime");
        let kinds = [
            (SoftFabric::InProcess, 0),
            (SoftFabric::InProcess, 2),
            (SoftFabric::Tcp, 0),
        ];
        let sides = std::array::from_fn(|index| {
            let (fabric, silent_answers) = kinds[index];
            let addr = addrs[index];
            let SocketAddr::V4(v4) = addr else {
                unreachable!("v4 above")
            };
            let ctx = Context::open(&DeviceSpec::Soft(SoftConfig {
                name: format!("hostile{}-{index}", std::process::id()),
                fabric,
                ip: *v4.ip(),
                ..SoftConfig::default()
            }))
            .expect("soft device");
            let mut config = RdmaConfig::new(vec![DeviceListen {
                ctx: ctx.clone(),
                listen: vec![addr],
            }]);
            config.group = PollGroupConfig {
                srq_depth: SRQ_DEPTH,
                max_qpairs: 8,
                max_queue_depth: 32,
                in_capsule_data_size: 4096,
                io_unit_size: 4096,
                data_buffers: DATA_BUFFERS,
                max_requests: MAX_REQUESTS,
                silent_answers,
                ..PollGroupConfig::default()
            };
            config.max_qid = 3;
            let target = target.clone();
            let transport = RdmaTransport::start(runtime.reactors(), config, move |_| {
                NvmeHandler::new(target.clone(), ReactorIo::new(target.clone()))
            })
            .expect("transport");
            Side {
                addr,
                transport,
                ctx,
            }
        });
        let rig = Rig {
            target,
            sides,
            _runtime: runtime,
            cm_threads: nvmf_transport::soft::join_finished_cm_threads(0, Duration::ZERO),
        };
        for side in &rig.sides {
            rig.wait_idle(side);
        }
        rig
    }

    /// Waits until `side`'s groups and the target hold nothing of any connection (the last rule
    /// of the module doc).
    fn wait_idle(&self, side: &Side) {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let groups = side
                .transport
                .each_group(|g| {
                    (
                        g.snapshot(),
                        g.handler().queue_count(),
                        g.handler().pending_count(),
                    )
                })
                .expect("the reactor answers");
            let mut left = Vec::new();
            for (info, (snapshot, queues, pending)) in &groups {
                let c = &snapshot.counters;
                assert_eq!(
                    (c.stale_completions, c.kind_mismatches, c.recv_slot_errors),
                    (0, 0, 0),
                    "completions the group could not place: {snapshot:?}"
                );
                // The soft device always reports a drained QP (LAST_WQE_REACHED, the marker).
                assert_eq!(c.drained_timeout, 0, "a drain was forced: {snapshot:?}");
                assert_eq!(snapshot.failed, None, "the group failed");
                if !idle(snapshot) || *queues != 0 || *pending != 0 {
                    left.push(format!("{snapshot:?} queues {queues} pending {pending}"));
                }
                if side.transport.load(info.device, info.reactor) != 0 {
                    left.push(format!(
                        "placement counts {} connection(s)",
                        side.transport.load(info.device, info.reactor)
                    ));
                }
            }
            let controllers = self.target.controllers().len();
            if controllers != 0 {
                left.push(format!("{controllers} controller(s)"));
            }
            if left.is_empty() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the target kept state after every connection went: {left:#?}"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// A group that holds nothing of any connection.
fn idle(s: &GroupSnapshot) -> bool {
    s.qpairs == 0
        && s.requests.in_use == 0
        && s.requests.capsules_waiting == 0
        && s.recv_slots.held == 0
        && s.recv_slots.queued == 0
        && s.data_buffers.free == s.data_buffers.total
}

/// Answers the host had while the target's SEND completions were held (the seeds test shows
/// the hold lets answers through).
static HELD_ANSWERS: AtomicU64 = AtomicU64::new(0);

/// Longest operation 6 with flag 1 waits for a slot's answers.
const ANSWER_WAIT: Duration = Duration::from_secs(1);

/// Capsules, short SENDs and waits a hold of the target's SEND completions lasts at most.
const MAX_HELD_RECORDS: u8 = 16;

/// One input's host queues.
struct Run {
    addr: SocketAddr,
    slots: [Option<HostQueue>; SLOTS],
    /// The controller of the admin queue connected last (I/O queues join it).
    cntlid: u16,
    /// Connect records run so far (at most `MAX_CONNECTS`).
    connects: usize,
    /// The target's SEND completions are held (operation 6, flag 0): records run since.
    held: Option<u8>,
}

impl Run {
    /// Holds (or releases) the target's SEND completions on every poll group CQ of `side`.
    fn hold_sends(&mut self, side: &Side, on: bool) {
        if self.held.is_some() == on {
            return;
        }
        self.held = on.then_some(0);
        let faults = side.ctx.as_soft().expect("a soft device").faults();
        let cqs = side
            .transport
            .each_group(|g| g.snapshot().cq)
            .expect("the reactor answers");
        for (_, cq) in cqs {
            faults
                .hold_send_completions(cq, on)
                .expect("a group CQ of the side's device");
        }
    }

    fn connect(&mut self, slot: usize, qid: u16, depth: u16, private: Option<Vec<u8>>, nvme: bool) {
        if let Some(old) = self.slots[slot].take() {
            old.close();
        }
        let Some(mut queue) = HostQueue::connect(self.addr, qid, depth, private) else {
            return;
        };
        if nvme {
            let cntlid = if qid == 0 {
                CNTLID_DYNAMIC
            } else {
                self.cntlid
            };
            if let Some(c) = queue.connect_nvme(cntlid, KATO_MS) {
                if qid == 0 && c.status.is_success() {
                    self.cntlid = c.dw0 as u16;
                    queue.enable();
                }
            }
        }
        self.slots[slot] = Some(queue);
    }

    fn poll_all(&mut self) {
        for s in self.slots.iter_mut().flatten() {
            let answers = s.poll().len() as u64;
            if self.held.is_some() {
                HELD_ANSWERS.fetch_add(answers, Ordering::Relaxed);
            }
        }
    }

    /// Waits until every queue that stands has its commands answered (the answer rule), posting
    /// the receives held back as response slots free up.
    fn settle(&mut self) {
        let deadline = Instant::now() + PATIENCE;
        loop {
            self.poll_all();
            for s in self.slots.iter_mut().flatten() {
                s.repay_receives();
            }
            let waiting: Vec<String> = self
                .slots
                .iter()
                .flatten()
                .filter(|s| s.owes_answers())
                .map(|s| format!("qid {}: {:?}", s.qid, s.outstanding))
                .collect();
            if waiting.is_empty() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "commands unanswered on connected queues: {waiting:?}"
            );
            std::thread::yield_now();
        }
    }
}

/// A command the host sent and has no answer to yet.
#[derive(Debug)]
struct Sent {
    cid: u16,
    /// An Asynchronous Event Request on an admin queue: may stay pending.
    may_pend: bool,
    /// A Read of the null namespace into this range of the data area (offset, bytes the blocks
    /// fill): on success it must hold zeroes, unless `shared`.
    null_read: Option<(usize, usize)>,
    /// Another command of this queue was outstanding at some time during this one's life (its
    /// data may have landed in the same memory).
    shared: bool,
}

/// A raw host queue: a CM connection with its QP, CQ and registered region (capsule buffers,
/// response slots, a data area).
struct HostQueue {
    channel: CmChannel,
    id: CmId,
    cq: Cq,
    qp: Qp,
    mr: Mr,
    _pd: Pd,
    _ctx: Context,
    qid: u16,
    outstanding: Vec<Sent>,
    /// Which response slots have a receive posted.
    receive_posted: [bool; HOST_DEPTH],
    /// Round robin over capsule buffers (a stalled SEND reads its buffer later).
    next_capsule: usize,
    sends_in_flight: usize,
    /// An error completion or a CM disconnect came: answers are not owed any more.
    broken: bool,
    /// Capsules sent without a receive for their answers; a settle posts them.
    receives_owed: usize,
}

impl HostQueue {
    /// Connects at the CM level; None when the target refused (its answer must come).
    fn connect(
        addr: SocketAddr,
        qid: u16,
        depth: u16,
        private: Option<Vec<u8>>,
    ) -> Option<HostQueue> {
        let channel = CmChannel::new(ProviderKind::Soft).expect("CM channel");
        let mut id = channel.resolve(addr, None, PATIENCE, 1).expect("resolve");
        let ctx = id.context().expect("id bound to a device");
        let pd = ctx.alloc_pd().expect("pd");
        let cq = ctx
            .create_cq((HOST_DEPTH + HOST_SENDS) as u32, None)
            .expect("cq");
        let qp = id
            .create_qp(
                &pd,
                &QpInitAttr {
                    send_cq: &cq,
                    recv_cq: &cq,
                    srq: None,
                    caps: QpCaps {
                        max_send_wr: HOST_SENDS as u32,
                        max_recv_wr: HOST_DEPTH as u32,
                        max_send_sge: 1,
                        max_recv_sge: 1,
                        max_inline_data: 0,
                    },
                    sq_sig_all: false,
                },
            )
            .expect("host QP");
        let mr = pd
            .alloc_mr(
                REGION,
                Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE,
            )
            .expect("region");
        let private_data = private.unwrap_or_else(|| {
            RdmaConnectRequest {
                recfmt: 0,
                qid,
                hrqsize: depth,
                hsqsize: depth - 1,
                cntlid: 0xFFFF,
            }
            .to_bytes()
            .to_vec()
        });
        id.connect(&ConnParam {
            private_data,
            responder_resources: 16,
            initiator_depth: 16,
            retry_count: 7,
            rnr_retry_count: 7,
        })
        .expect("connect");
        let event = channel
            .wait_event(PATIENCE)
            .expect("the target answers a connect");
        match event.kind {
            CmEventKind::Established { private_data } => {
                assert!(
                    RdmaAccept::decode(&private_data).is_ok(),
                    "an accept carries the NVMe-oF accept private data"
                );
            }
            CmEventKind::Rejected { .. } => return None,
            other => panic!("a connect answered {other:?}"),
        }
        Some(HostQueue {
            channel,
            id,
            cq,
            qp,
            mr,
            _pd: pd,
            _ctx: ctx,
            qid,
            outstanding: Vec::new(),
            receive_posted: [false; HOST_DEPTH],
            next_capsule: 0,
            sends_in_flight: 0,
            broken: false,
            receives_owed: 0,
        })
    }

    /// The NVMe Connect (its data in the capsule) and its answer; None when the queue broke.
    fn connect_nvme(&mut self, cntlid: u16, kato: u32) -> Option<Cqe> {
        let cmd = ConnectCmd {
            cid: 0x7001,
            recfmt: 0,
            qid: self.qid,
            sqsize: 1,
            cattr: 0,
            kato,
            sgl: SglDescriptor::DataBlockOffset {
                offset: 0,
                length: 1024,
            },
        };
        let data = ConnectData {
            hostid: [9; 16],
            cntlid,
            subnqn: FixedStr::new(SUBNQN, "SUBNQN").expect("nqn"),
            hostnqn: FixedStr::new(HOSTNQN, "HOSTNQN").expect("nqn"),
        }
        .to_bytes();
        self.exec(&cmd.to_sqe(), &data)
    }

    /// CC.EN = 1 on an admin queue.
    fn enable(&mut self) {
        let set = PropertySetCmd {
            cid: 0x7002,
            size: PropertySize::Four,
            offset: PropertyOffset::Cc,
            value: u64::from(Cc::enabled_nvm().to_u32()),
        };
        self.exec(&set.to_sqe(), &[]);
    }

    /// Sends `sqe` and waits for its answer (bring-up); None when the queue broke first.
    fn exec(&mut self, sqe: &Sqe, in_capsule: &[u8]) -> Option<Cqe> {
        self.send_capsule(sqe, in_capsule, true, None);
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Some(c) = self.poll().into_iter().find(|c| c.cid == sqe.cid) {
                return Some(c);
            }
            if self.broken {
                return None;
            }
            assert!(Instant::now() < deadline, "no answer to {sqe:?}");
            std::thread::yield_now();
        }
    }

    /// Applies the control byte's SGL steering to `sqe` (see the module doc).
    fn steer(&self, control: u8, sqe: &mut Sqe, payload_len: usize) {
        if control & FLAG_0 != 0 {
            let raw = u64::from_le_bytes(sqe.dptr[..8].try_into().expect("8 bytes"));
            let offset = (raw % DATA_SIZE as u64) as usize;
            let raw_len = u32::from_le_bytes([sqe.dptr[8], sqe.dptr[9], sqe.dptr[10], 0]);
            let length = raw_len % (DATA_SIZE - offset + 1) as u32;
            let address = self.mr.addr() + (DATA_AT + offset) as u64;
            // With flag 1 too, the host asks for the key's invalidation with the answer: a
            // region's key, which a SEND with invalidate may not name (the host's QP fails).
            let invalidate = control & FLAG_1 != 0;
            let sgl = SglDescriptor::keyed(address, length, self.mr.rkey(), invalidate)
                .expect("the data area is under 16 MiB");
            sqe.set_sgl1(sgl);
        } else if control & FLAG_1 != 0 {
            sqe.set_sgl1(SglDescriptor::DataBlockOffset {
                offset: 0,
                length: payload_len as u32,
            });
        }
    }

    /// Sends a capsule: `sqe` and `in_capsule` after it, a receive posted for its answer first
    /// unless `answer` is false. Skipped when the host's queues are full.
    fn send_capsule(&mut self, sqe: &Sqe, in_capsule: &[u8], answer: bool, imm: Option<u32>) {
        let mut bytes = Vec::with_capacity(64 + in_capsule.len());
        bytes.extend_from_slice(&sqe.to_bytes());
        bytes.extend_from_slice(in_capsule);
        if self.send_raw(&bytes, answer, imm) {
            self.receives_owed += usize::from(!answer);
            let may_pend = self.qid == 0 && sqe.opcode == AER_OPCODE;
            let shared = !self.outstanding.is_empty();
            for s in &mut self.outstanding {
                s.shared = true;
            }
            self.outstanding.push(Sent {
                cid: sqe.cid,
                may_pend,
                null_read: self.null_read(sqe),
                shared,
            });
        }
    }

    /// Where a Read of the null namespace on an I/O queue puts its zeroes in the data area (the
    /// blocks' bytes, at most the descriptor's length), if `sqe` is one with this queue's key.
    fn null_read(&self, sqe: &Sqe) -> Option<(usize, usize)> {
        if self.qid == 0 || sqe.opcode != READ_OPCODE || sqe.nsid != NULL_NSID {
            return None;
        }
        let SglDescriptor::KeyedDataBlock {
            address,
            length,
            key,
            invalidate: false,
        } = sqe.sgl1().ok()?
        else {
            return None;
        };
        let offset = usize::try_from(address.checked_sub(self.mr.addr())?).ok()?;
        let offset = offset.checked_sub(DATA_AT)?;
        let blocks = (sqe.cdw12 & 0xFFFF) as usize + 1;
        let bytes = (length.get() as usize).min(blocks * NULL_BLOCK);
        (key == self.mr.rkey() && offset + bytes <= DATA_SIZE).then_some((offset, bytes))
    }

    /// Posts the receives held back, as far as response slots are free.
    fn repay_receives(&mut self) {
        while self.receives_owed > 0 && !self.broken && self.post_receive() {
            self.receives_owed -= 1;
        }
    }

    /// Posts a receive into a free response slot; false when none is free or the QP refused.
    fn post_receive(&mut self) -> bool {
        let Some(slot) = self.receive_posted.iter().position(|posted| !posted) else {
            return false;
        };
        let sge = self.mr.sge(RESPONSES_AT + slot * 16, 16);
        if self
            .qp
            .post_recv(&[RecvWr {
                wr_id: RECV_WR + slot as u64,
                sges: &[sge],
            }])
            .is_err()
        {
            self.broken = true;
            return false;
        }
        self.receive_posted[slot] = true;
        true
    }

    /// Sends `bytes` as one SEND (a receive posted first when `answer`); false when it was not
    /// posted (the host's queues full, or the QP refused it). A runt needs no receive: the target
    /// answers nothing shorter than an SQE.
    fn send_raw(&mut self, bytes: &[u8], answer: bool, imm: Option<u32>) -> bool {
        if self.sends_in_flight >= HOST_SENDS {
            return false;
        }
        if answer && !self.post_receive() {
            return false;
        }
        let at = self.next_capsule * CAPSULE_SLOT;
        self.next_capsule = (self.next_capsule + 1) % HOST_DEPTH;
        self.mr.write_at(at, bytes).expect("inside the region");
        let op = match imm {
            Some(imm) => SendOp::SendWithImm { imm },
            None => SendOp::Send,
        };
        let posted = self.qp.post_send(&[SendWr {
            wr_id: SEND_WR,
            op,
            sges: &[self.mr.sge(at, bytes.len() as u32)],
            flags: SendFlags::SIGNALED,
        }]);
        if posted.is_err() {
            self.broken = true;
            return false;
        }
        self.sends_in_flight += 1;
        true
    }

    /// Reaps the CQ and the CM channel; the answers that came, each checked against what was
    /// sent (the CID rule).
    fn poll(&mut self) -> Vec<Cqe> {
        let mut answers = Vec::new();
        let mut wcs = [WorkCompletion::default(); 16];
        loop {
            let n = self.cq.poll(&mut wcs).expect("host CQ");
            for wc in &wcs[..n] {
                if wc.status != WcStatus::Success {
                    self.broken = true;
                }
                if wc.wr_id == SEND_WR {
                    self.sends_in_flight -= 1;
                    continue;
                }
                let slot = (wc.wr_id - RECV_WR) as usize;
                self.receive_posted[slot] = false;
                if wc.status != WcStatus::Success {
                    continue;
                }
                assert_eq!(
                    wc.byte_len, 16,
                    "the target sent something else than a response"
                );
                let mut bytes = [0u8; 16];
                self.mr
                    .read_at(RESPONSES_AT + slot * 16, &mut bytes)
                    .expect("inside the region");
                let cqe = Cqe::decode(&bytes).expect("16 bytes decode");
                // A CID the host sent twice is answered twice; a pending AER last.
                let sent = self
                    .outstanding
                    .iter()
                    .position(|s| s.cid == cqe.cid && !s.may_pend)
                    .or_else(|| self.outstanding.iter().position(|s| s.cid == cqe.cid));
                let Some(sent) = sent else {
                    panic!(
                        "qid {}: an answer to CID {:#x}, which is not outstanding ({:?}): {cqe:?}",
                        self.qid, cqe.cid, self.outstanding
                    );
                };
                let sent = self.outstanding.swap_remove(sent);
                if let (Some((offset, bytes)), false, true) =
                    (sent.null_read, sent.shared, cqe.status.is_success())
                {
                    let data = self
                        .mr
                        .read_vec(DATA_AT + offset..DATA_AT + offset + bytes)
                        .expect("inside the region");
                    if let Some(at) = data.iter().position(|&b| b != 0) {
                        panic!(
                            "qid {}: a read of the null namespace (CID {:#x}) answered success \
                             with a non-zero byte at {at} of {bytes}",
                            self.qid, cqe.cid
                        );
                    }
                }
                answers.push(cqe);
            }
            if n < wcs.len() {
                break;
            }
        }
        while let Some(event) = self.channel.poll_event().expect("CM channel") {
            if matches!(event.kind, CmEventKind::Disconnected) {
                self.broken = true;
            }
        }
        answers
    }

    /// The answer rule applies: the connection stands, every command had a receive posted,
    /// and a command that must be answered is not yet.
    fn owes_answers(&self) -> bool {
        !self.broken && self.receives_owed == 0 && self.outstanding.iter().any(|s| !s.may_pend)
    }

    /// Tears the connection down from the host side.
    fn close(mut self) {
        let _ = self.id.disconnect();
    }
}

/// Seed inputs (see the module), and the files `scripts/fuzz.sh` gives the fuzzer.
#[path = "fuzzing_seeds.rs"]
pub mod seeds;

#[cfg(test)]
mod tests {
    use super::seeds::seeds;
    use super::*;

    #[test]
    fn every_seed_keeps_the_rules() {
        let before = HELD_ANSWERS.load(Ordering::Relaxed);
        // Hosts disconnected for sending more commands than their depth, on every side.
        let overruns = || -> u64 {
            let rig = rig().lock().unwrap_or_else(|p| p.into_inner());
            rig.sides
                .iter()
                .flat_map(|side| {
                    side.transport
                        .each_group(|g| g.snapshot().counters.overruns)
                        .expect("the reactor answers")
                })
                .map(|(_, n)| n)
                .sum()
        };
        for (name, input) in seeds() {
            eprintln!("seed {name}");
            let overruns_before = overruns();
            hostile_host(&input);
            if name.starts_with("held_sends") {
                // Each answer gave its command's depth slot back when it went, though the
                // target had not heard its SEND complete.
                assert_eq!(
                    overruns(),
                    overruns_before,
                    "{name}: the host was an overrun"
                );
            }
        }
        // The held_sends seeds: answers came while the target had not heard their SENDs went.
        let held = HELD_ANSWERS.load(Ordering::Relaxed) - before;
        assert!(held >= 12, "{held} answers while held");
    }

    /// The files under fuzz/seeds are what `seeds()` builds (rewritten with NVMF_WRITE_SEEDS=1).
    #[test]
    fn seed_files_are_current() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../fuzz/seeds/fuzz_target_hostile_host");
        nvmf_transport::fuzz_input::check_seed_files(&dir, &seeds());
    }

    #[test]
    fn an_answer_the_host_did_not_ask_for_breaks_the_rule() {
        // The rule can fail: a capsule whose answer the harness was not told to expect (sent
        // raw, bypassing the record of what was sent). The rig is held throughout, as an input
        // holds it.
        let rig = rig().lock().unwrap_or_else(|p| p.into_inner());
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let mut run = Run {
                addr: rig.sides[0].addr,
                slots: std::array::from_fn(|_| None),
                cntlid: CNTLID_DYNAMIC,
                connects: 0,
                held: None,
            };
            run.connect(0, 0, 8, None, true);
            let queue = run.slots[0].as_mut().expect("connected");
            let keep_alive = Sqe {
                opcode: 0x18,
                cid: 0x4242,
                flags: nvmf_protocol::sqe::FLAGS_PSDT_SGL,
                ..Sqe::default()
            };
            queue.send_raw(&keep_alive.to_bytes(), true, None);
            // Answers come in order: the stray one before this command's.
            queue.exec(
                &Sqe {
                    cid: 0x4343,
                    ..keep_alive
                },
                &[],
            );
        }));
        let message = result.expect_err("an unexpected answer must panic");
        let text = message
            .downcast_ref::<String>()
            .cloned()
            .unwrap_or_default();
        assert!(text.contains("not outstanding"), "{text}");
        // The queue, dropped on unwinding, disconnected: the rig is as the test found it.
        rig.wait_idle(&rig.sides[0]);
    }

    #[test]
    fn seeded_garbage_keeps_the_rules() {
        // The same inputs on every run.
        let mut random = nvmf_transport::fuzz_input::Xorshift::new(0x9E37_79B9_7F4A_7C15u64);
        let mut next = move || random.next_u64();
        for _ in 0..60 {
            let mut data = vec![next() as u8];
            // Start most inputs from a working controller so that commands get executed.
            data.extend([OP_CONNECT | FLAG_0, 0, 14, OP_CONNECT | 1 << 3, 0, 14]);
            let len = (next() % 600) as usize;
            data.extend((0..len).map(|_| next() as u8));
            hostile_host(&data);
        }
    }
}
