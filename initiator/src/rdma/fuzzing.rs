//! The host's RDMA queues under a hostile target (feature `fuzzing`; the
//! `fuzz_host_queue_hostile_target` target in `fuzz/`): [`RdmaFabric`] queues on a soft fabric
//! against raw target connections (a CM listener, a QP, a CQ and a registered region of the
//! harness's own) that accept or refuse, take capsules, move data with RDMA READ and WRITE and
//! answer as the input says. Unlike `controller::fuzzing`, whose fabric is a fake at the
//! `HostQueue` interface, this goes through everything a network peer reaches in the host: the
//! CM's private data, the host poll group's SRQ, request objects and capsule slots, responses
//! matched by CID, keyed SGLs into the queue's region and per-I/O memory windows with their
//! remote invalidation, silent command SENDs, drains.
//!
//! One rig lives for the process: four sides, each a raw listener on a soft device and a host
//! fabric with small host poll groups (40 request objects, queues of depth 16 at most): in-process
//! with every command SEND signaled, in-process with lone commands silent (`silent_answers` 2),
//! soft TCP over loopback, and soft TCP with the queues spread over two reactors' groups as
//! nvmf-perf places them (qid 1 and 3 on one, qid 2 on the other, admin queues on the control
//! thread's: three groups, and CQs, on one device); the input's first byte picks (mod 4). Each
//! side keeps one queue connected per group for the process (the anchors) so that its host poll
//! groups, and the counters the last rule reads, live across inputs. Rules (a panic is what
//! libFuzzer reports):
//! - no panic;
//! - a connect is answered (a queue or a typed error); the host's CM private data names the queue
//!   and the depth it asked (cut to the group's maximum), and the queue's depth is what the
//!   target's accept allows;
//! - every capsule the target receives is a command the host accepted and has not sent before,
//!   byte for byte (the SQE and any in-capsule data): a capsule slot rewritten while its SEND
//!   could still go shows here;
//! - the host reports a CQE only for a command it accepted and has not reported yet (a CID is
//!   refused while its command is in flight or its CQE not yet reported), and never one whose
//!   response invalidated a key other than the command's own window;
//! - a queue whose target did nothing that may break a connection (a malformed or oversized
//!   response, an RDMA access outside the command's key, an invalidation of a key the command did
//!   not offer, a disconnect, a CQE under another CID or of its own making: the host drops the
//!   queue when no command in flight has that CID, or when its command was answered already,
//!   and when one has, that command's window ends early and the target's RDMA on it fails)
//!   stays connected, and the target's side of it sees no error;
//! - while the target also sent nothing that could answer the wrong command (a CQE with another
//!   CID, a CQE of its own making), the queue is trusted: each CQE the host reports is the one the
//!   target sent for that command, a Read answered after its RDMA WRITE shows exactly those bytes
//!   in the host's view of its range (after `poll`, or `poll_lazy` and `fetch`), and the Write
//!   data the target reads (RDMA READ or in-capsule) is what the host submitted, or with
//!   `submit_lazy` what its registered region held (the bytes earlier Writes copied there and
//!   the target's RDMA WRITEs put there; unchecked where the harness cannot know them);
//! - once the host reported a command whose data went through a per-I/O window, the window's
//!   key lets the target in no more (the target's invalidation in the response, or the host's
//!   own before it reports, as the Linux host does): a probe's write through it fails;
//! - at a settle (the target posts every receive and answers every capsule it holds, well
//!   formed) every command of a connected queue is reported, except those whose answer the target
//!   sent under another CID; and a queue is lost by then whose target sent a response under a
//!   CID that no command awaiting its answer had (none accepted under it since);
//! - once the input's queues are dropped, each of the side's host poll groups holds only its
//!   anchor: one qpair, no request object, no receive slot held or queued; none of the counters
//!   that are bugs if they grow (stale completions, kind mismatches, receive-slot errors) moved,
//!   nor a drain forced by its timeout.
//!
//! A wait that a working host ends at once gives up after [`PATIENCE`]: a hang is reported as a
//! panic naming what was awaited.
//!
//! Input: a first byte (which side, mod 4), then records of a control byte (bits 0-2 the
//! operation, 3-4 the queue slot, 5-7 flags) and the operation's bytes:
//! - 0 connect (the first 8 of an input), 2 bytes (qid, depth): depth 1 + byte mod 16; flag 0 the
//!   admin queue, else qid 1-3. The target: flag 1 refuses (an NVMe-oF reject with a status from
//!   the qid byte, or a bare one when its bit 7 is set); flag 2 accepts with the next bytes as
//!   private data (a length byte, up to 56); else accepts with CRQSIZE the host's depth, or the
//!   depth byte's bits 4-6 when its bit 7 is set.
//! - 1 submit, 4 bytes (kind, offset, length, seed): kind mod 4 a keyed Read, a keyed Write, a
//!   Write with in-capsule data, a Flush without data; the data in the command's own 4 KiB chunk
//!   of the region (offset byte * 16, length 1 up to the chunk's end), a Write's bytes from the
//!   seed; kind bit 2: `submit_lazy` (a Write's data is whatever the registered region holds).
//!   Flag 0: the CID of a command in flight (the host must refuse it); flag 1: the key is a
//!   per-I/O window (`bind_window`, its invalidation asked); flag 2: `flush` after.
//! - 2 answer, 3 bytes (which, status, seed): the target answers a capsule it holds (which mod
//!   their count) as a target does (RDMA WRITE of seed bytes for a Read, RDMA READ for a Write,
//!   then the CQE; status byte < 192 success, else the byte as status code). Flag 0: the CQE
//!   carries another CID; flag 1: the data goes outside the command's key; flag 2: the CQE is a
//!   SEND with invalidate of the command's key (of its window, else of the region's), or with
//!   the seed's bit 7 of another command's window when one is in flight.
//! - 3 raw response: a length byte (mod 33) and the bytes, sent as they are; flag 0: 16 bytes
//!   with the CID of a command in flight (the length byte picks which), answering it early or
//!   twice. Flag 1 instead: a probe, the target's RDMA WRITE of one byte through the window of
//!   the command the host reported last (when no window was bound since).
//! - 4 host poll, a byte: 1 + byte mod 8 polls; flag 0: `poll_lazy` and `fetch`; flag 1: as a
//!   poller driving many queues does, through each completion group (`poll_ready`), then every
//!   queue: one its group did not name must have nothing to report (no CQE, no loss).
//! - 5 disconnect: flag 0 the target disconnects; flag 1 the target moves its QP to the error
//!   state without a word to the CM; else the host drops its queue.
//! - 6 receives: flag 0 the target stops re-posting receives (host SENDs wait on RNR, retried
//!   for ever); else it posts them all again. Flag 1 instead: the host's SEND completions are
//!   held on every host poll group CQ of the side (flag 2: released), so that responses overtake
//!   them as when a NIC's ACK comes late (a second response for a command then finds it
//!   answered already); a connect, a queue the host drops and a settle release them (each may
//!   wait for a drain, which needs them).
//! - 7 settle (the rule above).
//!
//! After each record but a submit, both sides poll: submits in a row go out together.

use std::net::{Ipv4Addr, SocketAddr};
use std::ops::Range;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use nvmf_protocol::cm::{RdmaAccept, RejectStatus};
use nvmf_protocol::{Cqe, SglDescriptor, Sqe, Status, StatusContext};
use nvmf_transport::fuzz_input::take;
use nvmf_transport::{
    CmChannel, CmEventKind, CmId, Context, DeviceSpec, ProviderKind, SoftConfig, SoftFabric,
};

use super::{HostGroupConfig, HostGroupInfo, RdmaFabric, RdmaQueue};
use crate::queue::{Fabric, HostQueue, QueueConnectParams, QueueError, TransportAddress};

/// How long a wait that a working host ends at once may take before it counts as a hang.
pub const PATIENCE: Duration = Duration::from_secs(10);
/// Sides (see the module doc).
const SIDES: usize = 4;
/// Queue slots an input drives.
const SLOTS: usize = 4;
/// Deepest queue an input asks for (the host groups' `max_queue_depth`).
const MAX_DEPTH: usize = 16;
/// Each command in flight owns one chunk of its queue's region.
const CHUNK: usize = 4096;
const REGION: usize = MAX_DEPTH * CHUNK;
/// In-capsule data an I/O queue offers (the admin queue none).
const IN_CAPSULE: usize = CHUNK;
/// Connects an input makes at most (each costs a CM round trip).
const MAX_CONNECTS: usize = 8;
/// The most private data an RDMA CM accept carries.
const MAX_PRIVATE_DATA: usize = 56;
/// Host poll groups: request objects and deepest queue.
const GROUP_REQUESTS: u32 = 40;

const OP_CONNECT: u8 = 0;
const OP_SUBMIT: u8 = 1;
const OP_ANSWER: u8 = 2;
const OP_RAW: u8 = 3;
const OP_POLL: u8 = 4;
const OP_DISCONNECT: u8 = 5;
const OP_RECEIVES: u8 = 6;
const OP_SETTLE: u8 = 7;

const FLAG_0: u8 = 1 << 5;
const FLAG_1: u8 = 1 << 6;
const FLAG_2: u8 = 1 << 7;

const READ: u8 = 0x02;
const WRITE: u8 = 0x01;
const FLUSH: u8 = 0x00;

/// How far the inputs run so far got (the tests check that the seeds reach every rule).
#[derive(Debug, Default, Clone, Copy)]
struct Reached {
    connects: u64,
    capsules: u64,
    reports: u64,
    /// Reads whose data the host's view showed, and Writes whose data the target read.
    reads_checked: u64,
    writes_checked: u64,
    windows: u64,
    settled: u64,
    /// Commands submitted lazily.
    lazy: u64,
    /// Writes through a reported command's window.
    probes: u64,
    /// Queues lost while a response under a CID not in flight was owed its loss.
    stray_losses: u64,
    /// Holds of the host's SEND completions, and queues lost to a second response for a
    /// command answered already (its SEND completion not yet in).
    held_sends: u64,
    answered_already: u64,
}

static REACHED: Mutex<Reached> = Mutex::new(Reached {
    connects: 0,
    capsules: 0,
    reports: 0,
    reads_checked: 0,
    writes_checked: 0,
    windows: 0,
    settled: 0,
    lazy: 0,
    probes: 0,
    stray_losses: 0,
    held_sends: 0,
    answered_already: 0,
});

fn reached(count: impl FnOnce(&mut Reached)) {
    count(&mut REACHED.lock().unwrap_or_else(|p| p.into_inner()));
}

/// Runs one input; panics when a rule of the module doc breaks.
pub fn hostile_target(data: &[u8]) {
    let rig = rig()
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let Some((&first, mut rest)) = data.split_first() else {
        return;
    };
    let side = &rig.sides[usize::from(first) % SIDES];
    let mut run = Run {
        side,
        slots: std::array::from_fn(|_| None),
        connects: 0,
        next_cid: 1,
        next_token: 1,
        sends_held: false,
    };
    while let Some((&control, tail)) = rest.split_first() {
        rest = tail;
        let slot = usize::from(control >> 3) % SLOTS;
        match control & 0b111 {
            OP_CONNECT => {
                let (head, tail) = take(rest, 2);
                rest = tail;
                let private = if control & FLAG_2 != 0 {
                    let (len, tail) = take(rest, 1);
                    let len = usize::from(len[0]) % (MAX_PRIVATE_DATA + 1);
                    let (bytes, tail) = tail.split_at(len.min(tail.len()));
                    rest = tail;
                    Some(bytes.to_vec())
                } else {
                    None
                };
                if run.connects < MAX_CONNECTS {
                    run.connects += 1;
                    // A new queue may wait for what a dropped one holds until its drain ends,
                    // which needs its SEND completions.
                    run.hold_sends(false);
                    run.connect(slot, control, head[0], head[1], private);
                }
            }
            OP_SUBMIT => {
                let (head, tail) = take(rest, 4);
                rest = tail;
                run.submit(slot, control, [head[0], head[1], head[2], head[3]]);
            }
            OP_ANSWER => {
                let (head, tail) = take(rest, 3);
                rest = tail;
                if let Some(s) = run.slots[slot].as_mut() {
                    s.answer(control, head[0], head[1], head[2]);
                }
            }
            OP_RAW => {
                let (len, tail) = take(rest, 1);
                let (bytes, tail) = tail.split_at((usize::from(len[0]) % 33).min(tail.len()));
                rest = tail;
                if let Some(s) = run.slots[slot].as_mut() {
                    if control & FLAG_1 != 0 {
                        s.probe();
                    } else {
                        s.raw_response(bytes, (control & FLAG_0 != 0).then_some(len[0]));
                    }
                }
            }
            OP_POLL => {
                let (n, tail) = take(rest, 1);
                rest = tail;
                for _ in 0..=n[0] % 8 {
                    if control & FLAG_1 != 0 {
                        run.poll_ready(control & FLAG_0 != 0);
                    } else if let Some(s) = run.slots[slot].as_mut() {
                        s.target_poll();
                        s.host_poll(control & FLAG_0 != 0, false);
                    }
                }
            }
            OP_DISCONNECT => {
                if let Some(s) = run.slots[slot].as_mut() {
                    if control & FLAG_0 != 0 {
                        s.fatal = true;
                        let _ = s.target.id.disconnect();
                    } else if control & FLAG_1 != 0 {
                        s.fatal = true;
                        s.target.vanish();
                    } else if let Some(s) = run.slots[slot].take() {
                        // Dropping a queue waits for its drain, which needs its SEND
                        // completions.
                        run.hold_sends(false);
                        s.close();
                    }
                }
            }
            OP_RECEIVES if control & FLAG_1 != 0 => run.hold_sends(control & FLAG_2 == 0),
            OP_RECEIVES => {
                if let Some(s) = run.slots[slot].as_mut() {
                    s.target.hold = control & FLAG_0 != 0;
                    if !s.target.hold {
                        s.target.post_receives();
                    }
                }
            }
            OP_SETTLE => run.settle(),
            _ => unreachable!("three bits"),
        }
        // Submits in a row go out together, as a batch does (at the next poll, or a flush).
        if control & 0b111 != OP_SUBMIT {
            run.poll_all();
        }
    }
    run.settle();
    for slot in run.slots.iter_mut() {
        if let Some(s) = slot.take() {
            s.close();
        }
    }
    side.wait_idle();
    // The soft TCP CM's threads of the input's connections end on their own after the
    // connections went; joined here, so that nothing of theirs is held when the leak checker
    // looks after the input. (Other tests of a unit-test process may hold CM threads too: the
    // wait is bounded and not a rule.)
    nvmf_transport::soft::join_finished_cm_threads(rig.cm_threads, Duration::from_secs(1));
}

/// One raw listener and the host fabric that connects to it (see the module doc).
struct Side {
    addr: SocketAddr,
    fabric: RdmaFabric,
    /// The CM channel of the listener and of every connection it accepted.
    channel: CmChannel,
    /// One queue per host poll group the side's queues join (qid 1 alone; spread, also qid 2
    /// and the admin queue), each with its target connection: they keep the groups, and the
    /// counters the last rule reads, alive across inputs.
    anchors: Mutex<Vec<(RdmaQueue, TargetConn)>>,
    _listener: CmId,
    /// The soft device of the listener, and of the host's queues (the CM resolves the
    /// listener's address to it).
    ctx: Context,
    name: &'static str,
    /// The host's transport name for this side.
    transport: &'static str,
}

struct Rig {
    sides: [Side; SIDES],
    /// The soft TCP CM's threads the rig's own connections keep (listeners, anchors).
    cm_threads: usize,
}

fn rig() -> &'static Mutex<Rig> {
    static RIG: OnceLock<Mutex<Rig>> = OnceLock::new();
    RIG.get_or_init(|| Mutex::new(Rig::start()))
}

impl Rig {
    fn start() -> Rig {
        let kinds = [
            ("in-process", SoftFabric::InProcess, 0, 0),
            ("in-process, silent", SoftFabric::InProcess, 2, 0),
            ("soft TCP", SoftFabric::Tcp, 0, 0),
            ("soft TCP, two reactors", SoftFabric::Tcp, 0, 2),
        ];
        let sides = std::array::from_fn(|index| {
            let (name, fabric, silent_answers, reactors) = kinds[index];
            // Addresses no other soft device of the process uses (unit tests share it); over
            // TCP a port the kernel picks, so that a unit-test run and a fuzzer do not collide.
            let ip = Ipv4Addr::new(127, 0, 78, 1 + index as u8);
            let port = if fabric == SoftFabric::Tcp { 0 } else { 4420 };
            let ctx = Context::open(&DeviceSpec::Soft(SoftConfig {
                name: format!("hostile-target{}-{index}", std::process::id()),
                fabric,
                ip,
                ..SoftConfig::default()
            }))
            .expect("soft device");
            let channel = CmChannel::new(ProviderKind::Soft).expect("CM channel");
            let listener = channel
                .listen(SocketAddr::from((ip, port)), 16, 0)
                .expect("listen");
            let addr = listener.local_addr().expect("a listener has its address");
            let transport = match fabric {
                SoftFabric::InProcess => "soft",
                SoftFabric::Tcp => "soft-tcp",
            };
            let fabric = RdmaFabric::new(transport, None)
                .expect("host fabric")
                .group_config(HostGroupConfig {
                    max_queues: 8,
                    max_queue_depth: MAX_DEPTH as u32,
                    requests: GROUP_REQUESTS,
                    silent_answers,
                })
                .spread(reactors);
            let side = Side {
                addr,
                fabric,
                channel,
                anchors: Mutex::new(Vec::new()),
                _listener: listener,
                ctx,
                name,
                transport,
            };
            // Spread, qid 1 joins reactor 0's group, qid 2 reactor 1's, the admin queue the
            // control thread's; else all one group.
            let anchor_qids: &[u16] = if reactors == 0 { &[1] } else { &[1, 2, 0] };
            for &qid in anchor_qids {
                let anchor = side.connect_queue(qid, 1, 0, TargetAnswer::Accept(None));
                let (Ok(queue), Some(target)) = anchor else {
                    panic!("{name}: the anchor queue of qid {qid} did not connect");
                };
                side.anchors
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push((queue, target));
            }
            side
        });
        // Each connection's threads are up once it is established.
        let cm_threads = nvmf_transport::soft::join_finished_cm_threads(0, Duration::ZERO);
        Rig { sides, cm_threads }
    }
}

impl Side {
    /// Connects a host queue of `qid` and `depth` while the target answers as `answer` says:
    /// the host's result, and the target's connection when it accepted.
    fn connect_queue(
        &self,
        qid: u16,
        depth: u16,
        token: u64,
        answer: TargetAnswer,
    ) -> (
        Result<RdmaQueue, crate::queue::ConnectError>,
        Option<TargetConn>,
    ) {
        let params = QueueConnectParams {
            address: TransportAddress {
                transport: self.transport.into(),
                address: self.addr.ip().to_string(),
                service: self.addr.port().to_string(),
            },
            qid,
            hrqsize: depth,
            hsqsize: depth - 1,
            cntlid: if qid == 0 { 0xFFFF } else { 1 },
            data_region_len: REGION,
            in_capsule_data: if qid == 0 { 0 } else { IN_CAPSULE },
        };
        std::thread::scope(|scope| {
            let host = scope.spawn(|| self.fabric.connect(&params));
            let mut target = None;
            let deadline = Instant::now() + PATIENCE;
            // The host may fail before it asks (its group full): then nothing comes.
            while target.is_none() && !host.is_finished() {
                assert!(
                    Instant::now() < deadline,
                    "{}: no connect request from the host",
                    self.name
                );
                match self.channel.poll_event().expect("CM channel") {
                    Some(event) => {
                        if let CmEventKind::ConnectRequest { private_data, .. } = &event.kind {
                            let id = event.id.expect("a connect request brings its id");
                            target = Some(TargetConn::answer(
                                id,
                                private_data,
                                &params,
                                token,
                                &answer,
                            ));
                        }
                    }
                    None => std::thread::yield_now(),
                }
            }
            let queue = host
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            let target = target.flatten();
            if let (Ok(q), Some(t)) = (&queue, &target) {
                // The queue's depth is what the accept allows.
                let expected = match &answer {
                    TargetAnswer::AcceptDepth(crq) => (*crq).clamp(1, t.depth),
                    TargetAnswer::Accept(Some(private)) => RdmaAccept::decode(private)
                        .map(|a| a.crqsize)
                        .unwrap_or(t.depth)
                        .clamp(1, t.depth),
                    _ => t.depth,
                };
                assert_eq!(q.depth(), expected, "{}: queue depth", self.name);
            }
            if let (Ok(_), None) = (&queue, &target) {
                panic!("{}: a queue connected that the target refused", self.name);
            }
            (queue, target)
        })
    }

    /// Waits until each of the side's host poll groups holds only its anchor (the last rule).
    /// Holds (or releases) the host's SEND completions on every host poll group CQ of the
    /// side: responses then complete ahead of them.
    fn hold_sends(&self, on: bool) {
        for group in self.fabric.host_groups() {
            // In-process the host's queues share the listener's device; over soft TCP they are
            // on the fabric's own.
            let ctx = [Some(&self.ctx), self.fabric.own_device()]
                .into_iter()
                .flatten()
                .find(|ctx| ctx.name() == group.device)
                .expect("a host group on the side's device or its fabric's");
            ctx.as_soft()
                .expect("a soft device")
                .faults()
                .hold_send_completions(group.cq, on)
                .expect("the host group's CQ");
        }
    }

    fn wait_idle(&self) {
        let deadline = Instant::now() + PATIENCE;
        let mut anchors = self.anchors.lock().unwrap_or_else(|p| p.into_inner());
        let mut out = [Cqe::default(); 4];
        loop {
            for (queue, target) in anchors.iter_mut() {
                target.target_poll_quiet();
                let polled = queue.poll(&mut out);
                assert!(
                    matches!(polled, Ok(0)),
                    "{}: the anchor queue of qid {} {polled:?}",
                    self.name,
                    queue.qid()
                );
            }
            let groups = self.fabric.host_groups();
            let idle = groups.len() == anchors.len() && groups.iter().all(idle);
            if idle {
                for group in &groups {
                    let s = &group.stats;
                    assert_eq!(
                        (
                            s.stale_completions,
                            s.kind_mismatches,
                            s.recv_slot_errors,
                            s.drained_timeout
                        ),
                        (0, 0, 0, 0),
                        "{}: {:?}'s stale completions, kind mismatches, receive-slot errors, \
                         drains forced by the timeout",
                        self.name,
                        group.home
                    );
                }
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{}: the host poll groups did not go back to their anchors alone: {groups:?}",
                self.name
            );
            std::thread::yield_now();
        }
    }
}

fn idle(g: &HostGroupInfo) -> bool {
    g.queues == 1
        && g.qpairs == 1
        && g.requests_in_use == 0
        && g.recv_held == 0
        && g.recv_queued == 0
}

/// One input's queues.
struct Run<'a> {
    side: &'a Side,
    slots: [Option<Slot>; SLOTS],
    connects: usize,
    next_cid: u16,
    next_token: u64,
    /// The host's SEND completions are held (operation 6, flag 1).
    sends_held: bool,
}

impl Run<'_> {
    /// Holds or releases the host's SEND completions (see `Side::hold_sends`).
    fn hold_sends(&mut self, on: bool) {
        if self.sends_held != on {
            self.sends_held = on;
            self.side.hold_sends(on);
            if on {
                reached(|r| r.held_sends += 1);
            }
        }
    }

    fn connect(
        &mut self,
        slot: usize,
        control: u8,
        qid_byte: u8,
        depth_byte: u8,
        private: Option<Vec<u8>>,
    ) {
        if let Some(old) = self.slots[slot].take() {
            old.close();
        }
        let qid = if control & FLAG_0 != 0 {
            0
        } else {
            1 + u16::from(qid_byte % 3)
        };
        let depth = 1 + u16::from(depth_byte) % MAX_DEPTH as u16;
        let answer = if control & FLAG_1 != 0 {
            let status = RejectStatus::from_raw(u16::from((qid_byte >> 2) % 8 + 1));
            TargetAnswer::Reject((qid_byte & 0x80 == 0).then_some(status))
        } else if private.is_some() {
            TargetAnswer::Accept(private)
        } else if depth_byte & 0x80 != 0 {
            TargetAnswer::AcceptDepth(u16::from((depth_byte >> 4) & 7))
        } else {
            TargetAnswer::Accept(None)
        };
        let token = self.next_token;
        self.next_token += 1;
        let (queue, target) = self.side.connect_queue(qid, depth, token, answer);
        if let (Ok(queue), Some(target)) = (queue, target) {
            reached(|r| r.connects += 1);
            self.slots[slot] = Some(Slot {
                queue: Some(queue),
                target,
                sent: Vec::new(),
                chunks: [false; MAX_DEPTH],
                registered: vec![None; REGION],
                fatal: false,
                trusted: true,
                lost: false,
                must_lose: Vec::new(),
                probe_key: None,
                name: self.side.name,
            });
        }
    }

    fn submit(&mut self, slot: usize, control: u8, bytes: [u8; 4]) {
        let cid = self.next_cid;
        self.next_cid = self.next_cid.wrapping_add(1);
        if let Some(s) = self.slots[slot].as_mut() {
            s.submit(control, bytes, cid);
        }
    }

    /// Polls each group of the input's queues through `poll_ready`, then each queue: one
    /// its group did not name must have nothing to report.
    fn poll_ready(&mut self, lazy: bool) {
        // (group id, the keys its poll named)
        let mut named: Vec<(usize, Vec<u64>)> = Vec::new();
        for s in self.slots.iter().flatten() {
            let Some((mut group, _)) = s.queue.as_ref().and_then(|q| q.completion_group()) else {
                continue;
            };
            if named.iter().all(|(id, _)| *id != group.id()) {
                let mut ready = Vec::new();
                group.poll_ready(&mut ready);
                named.push((group.id(), ready));
            }
        }
        for s in self.slots.iter_mut().flatten() {
            s.target_poll();
            let unnamed = s
                .queue
                .as_ref()
                .and_then(|q| q.completion_group())
                .is_some_and(|(group, token)| {
                    named
                        .iter()
                        .any(|(id, ready)| *id == group.id() && !ready.contains(&token))
                });
            s.host_poll(lazy, unnamed);
        }
    }

    fn poll_all(&mut self) {
        for s in self.slots.iter_mut().flatten() {
            s.target_poll();
            s.host_poll(false, false);
        }
        // Events of connections that went already.
        while let Some(event) = self.side.channel.poll_event().expect("CM channel") {
            let Some(s) = self
                .slots
                .iter_mut()
                .flatten()
                .find(|s| s.target.token == event.token)
            else {
                continue;
            };
            if matches!(event.kind, CmEventKind::Disconnected) {
                s.target.broken = true;
                assert!(
                    s.fatal,
                    "{}: the target's connection was disconnected without cause",
                    s.name
                );
            }
        }
    }

    /// The target posts every receive and answers every capsule; every command of a connected
    /// queue must be reported (the settle rule).
    fn settle(&mut self) {
        let deadline = Instant::now() + PATIENCE;
        self.hold_sends(false);
        for s in self.slots.iter_mut().flatten() {
            s.target.hold = false;
            s.target.post_receives();
        }
        loop {
            for s in self.slots.iter_mut().flatten() {
                while !s.target.pending.is_empty()
                    && !s.target.broken
                    && s.target.free_answer().is_some()
                {
                    s.answer(0, 0, 0, 0x5a);
                }
            }
            self.poll_all();
            let owing: Vec<_> = self
                .slots
                .iter()
                .flatten()
                .filter(|s| s.owes() || s.owes_loss())
                .map(|s| {
                    let owed: Vec<u16> = if s.owes() {
                        s.sent.iter().filter(|c| c.owed()).map(|c| c.cid).collect()
                    } else {
                        Vec::new()
                    };
                    (s.target.qid, owed, s.must_lose.clone())
                })
                .collect();
            if owing.is_empty() {
                reached(|r| r.settled += 1);
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{}: commands never reported, or a queue kept after responses for CIDs not in \
                 flight (qid, CIDs owed, stray CIDs): {owing:?}",
                self.side.name
            );
            std::thread::yield_now();
        }
    }
}

/// A command the host accepted.
struct Sent {
    cid: u16,
    sqe: [u8; 64],
    /// In-capsule data.
    in_capsule: Vec<u8>,
    chunk: usize,
    /// Data named by a keyed SGL.
    keyed: Option<Keyed>,
    /// A Write's bytes as the target must read them (in the capsule or by RDMA READ).
    bytes: Vec<u8>,
    /// `bytes` are known (a lazy Write of region bytes the model does not know is not checked).
    data_known: bool,
    /// The target received the capsule.
    delivered: bool,
    /// The CQE the target sent for it, and what its RDMA WRITE put into the range.
    answer: Option<(Cqe, Option<Vec<u8>>)>,
    /// The target answered it under another CID: its own CQE is not owed.
    disowned: bool,
    /// Its response invalidated a key other than its own window: never reported.
    bogus: bool,
    reported: bool,
}

/// A command's keyed SGL.
struct Keyed {
    /// The region range it names.
    range: Range<usize>,
    address: u64,
    key: u32,
    /// The key is a per-I/O window whose invalidation the command asks.
    window: bool,
    /// Data goes to the host (a Read).
    to_host: bool,
}

impl Sent {
    fn owed(&self) -> bool {
        !self.reported && !self.disowned
    }
}

/// A host queue and its target connection.
struct Slot {
    queue: Option<RdmaQueue>,
    target: TargetConn,
    sent: Vec<Sent>,
    /// Region chunks owned by commands in flight.
    chunks: [bool; MAX_DEPTH],
    /// What the queue's registered region holds, where known: the bytes a copying Write put
    /// there and those the target's RDMA WRITEs of Read data did (lazy Writes send these).
    registered: Vec<Option<u8>>,
    /// The target did something that may break the connection.
    fatal: bool,
    /// The target sent nothing that could answer the wrong command.
    trusted: bool,
    /// The host reported the queue lost.
    lost: bool,
    /// CIDs of responses the target sent while no command awaiting a response had the CID
    /// (and none was accepted under it since): the host must lose the queue.
    must_lose: Vec<u16>,
    /// The window (address, key) of the command reported last, while no window was bound
    /// since (a probe's target: a reported command's key must let the target in no more).
    probe_key: Option<(u64, u32)>,
    name: &'static str,
}

impl Slot {
    fn queue(&mut self) -> &mut RdmaQueue {
        self.queue
            .as_mut()
            .expect("a slot's queue lives until it closes")
    }

    /// A host error: a lost queue must have a cause.
    fn host_error(&mut self, e: &QueueError, what: &str) {
        if let QueueError::Disconnected(why) = e {
            assert!(
                self.fatal,
                "{}: qid {} lost at {what} without cause: {why}",
                self.name, self.target.qid
            );
            self.lost = true;
            if !self.must_lose.is_empty() {
                reached(|r| r.stray_losses += 1);
            }
            if why.contains("answered already") {
                reached(|r| r.answered_already += 1);
            }
        }
    }

    fn submit(&mut self, control: u8, [kind, offset, length, seed]: [u8; 4], cid: u16) {
        if self.lost {
            return;
        }
        let Some(chunk) = self.chunks.iter().position(|used| !used) else {
            return;
        };
        let duplicate = control & FLAG_0 != 0;
        let cid = match self.sent.iter().rev().find(|c| !c.reported) {
            Some(c) if duplicate => c.cid,
            _ => cid,
        };
        let in_flight = self.sent.iter().any(|c| c.cid == cid && !c.reported);
        let offset = usize::from(offset) * 16 % CHUNK;
        let length = 1 + (usize::from(length) * 16 + usize::from(seed & 15)) % (CHUNK - offset);
        let at = chunk * CHUNK + offset;
        let range = at..at + length;
        let bytes: Vec<u8> = (0..length)
            .map(|i| (i as u8).wrapping_mul(31) ^ seed)
            .collect();
        let (opcode, keyed, in_capsule) = match kind % 4 {
            0 => (READ, Some(true), false),
            1 => (WRITE, Some(false), false),
            2 => (WRITE, None, true),
            _ => (FLUSH, None, false),
        };
        // `submit_lazy`: a Write's data is what the registered region holds (the harness's
        // model of it), not the host view's bytes.
        let lazy = kind & 4 != 0;
        let mut sqe = Sqe::new(opcode, cid, 1);
        let mut keyed_sgl = None;
        if let Some(to_host) = keyed {
            let region = self.queue().region();
            let (address, key, invalidate) = if control & FLAG_1 != 0 {
                // A bind may reuse the probed window under a key the target may use again.
                self.probe_key = None;
                match self.queue().bind_window(range.clone()) {
                    Ok(Some((address, key))) => {
                        reached(|r| r.windows += 1);
                        (address, key, true)
                    }
                    Ok(None) => (region.address + at as u64, region.key, false),
                    Err(e) => {
                        self.host_error(&e, "bind_window");
                        return;
                    }
                }
            } else {
                (region.address + at as u64, region.key, false)
            };
            let sgl = SglDescriptor::keyed(address, length as u32, key, invalidate)
                .expect("a chunk is under 16 MiB");
            sqe.set_sgl1(sgl);
            keyed_sgl = Some(Keyed {
                range: range.clone(),
                address,
                key,
                window: invalidate,
                to_host,
            });
        } else if in_capsule {
            sqe.set_sgl1(SglDescriptor::DataBlockOffset {
                offset: 0,
                length: length as u32,
            });
        }
        if opcode == WRITE {
            self.queue().region_bytes_mut()[range.clone()].copy_from_slice(&bytes);
        }
        let inline = in_capsule.then_some(range.clone());
        let submitted = if lazy {
            self.queue().submit_lazy(&sqe, inline)
        } else {
            self.queue().submit(&sqe, inline)
        };
        // What the target will read: the bytes copied into the region, or (lazy) what the
        // region held, when the model knows every byte of it.
        let (bytes, data_known) = match (opcode == WRITE, lazy) {
            (true, false) => {
                let copied = if submitted.is_ok() {
                    bytes.iter().copied().map(Some).collect()
                } else {
                    // A refused submission may have copied before it failed.
                    vec![None; bytes.len()]
                };
                self.registered[range.clone()].copy_from_slice(&copied);
                (bytes, true)
            }
            (true, true) => {
                let held: Option<Vec<u8>> =
                    self.registered[range.clone()].iter().copied().collect();
                let known = held.is_some();
                (held.unwrap_or_else(|| vec![0; length]), known)
            }
            (false, _) => (bytes, true),
        };
        match submitted {
            Ok(()) => {
                if lazy {
                    reached(|r| r.lazy += 1);
                }
                assert!(
                    !in_flight,
                    "{}: qid {} accepted CID {cid:#x} while it is in flight",
                    self.name, self.target.qid
                );
                self.chunks[chunk] = true;
                // The host may now take a stray response under this CID as this command's.
                self.must_lose.retain(|&stray| stray != cid);
                self.sent.push(Sent {
                    cid,
                    sqe: sqe.to_bytes(),
                    in_capsule: if in_capsule {
                        bytes.clone()
                    } else {
                        Vec::new()
                    },
                    chunk,
                    keyed: keyed_sgl,
                    bytes,
                    data_known,
                    delivered: false,
                    answer: None,
                    disowned: false,
                    bogus: false,
                    reported: false,
                });
            }
            Err(e) => self.host_error(&e, "submit"),
        }
        if control & FLAG_2 != 0 && !self.lost {
            if let Err(e) = self.queue().flush() {
                self.host_error(&e, "flush");
            }
        }
    }

    /// Forgets the commands both reported and delivered (nothing of them is checked any more).
    fn forget_finished(&mut self) {
        self.sent.retain(|c| !(c.reported && c.delivered));
    }

    /// Polls the host queue and checks each CQE it reports (the CQE and data rules);
    /// `unnamed`: the group's `poll_ready` did not name this queue, so it must report nothing.
    fn host_poll(&mut self, lazy: bool, unnamed: bool) {
        if self.lost {
            return;
        }
        let mut out = [Cqe::default(); 8];
        let polled = if lazy {
            self.queue().poll_lazy(&mut out)
        } else {
            self.queue().poll(&mut out)
        };
        assert!(
            !unnamed || matches!(polled, Ok(0)),
            "{}: qid {}: poll_ready did not name the queue, which then reported {polled:?}",
            self.name,
            self.target.qid
        );
        let n = match polled {
            Ok(n) => n,
            Err(e) => {
                self.host_error(&e, "poll");
                return;
            }
        };
        for cqe in &out[..n] {
            let Some(i) = self
                .sent
                .iter()
                .position(|c| c.cid == cqe.cid && !c.reported)
            else {
                panic!(
                    "{}: qid {} reported CID {:#x}, which is not in flight: {cqe:?}",
                    self.name, self.target.qid, cqe.cid
                );
            };
            assert!(
                !self.sent[i].bogus,
                "{}: qid {} reported CID {:#x}, whose response invalidated a key not its own",
                self.name, self.target.qid, cqe.cid
            );
            self.sent[i].reported = true;
            reached(|r| r.reports += 1);
            if let Some(k) = self.sent[i].keyed.as_ref().filter(|k| k.window) {
                self.probe_key = Some((k.address, k.key));
            }
            self.chunks[self.sent[i].chunk] = false;
            let range = self.sent[i].keyed.as_ref().map(|k| k.range.clone());
            if lazy {
                if let Some(range) = range.clone() {
                    self.queue()
                        .fetch(range)
                        .expect("a fetch of a reported command's range");
                }
            }
            if !self.trusted {
                continue;
            }
            let sent = &self.sent[i];
            let Some((answer, wrote)) = &sent.answer else {
                panic!(
                    "{}: qid {} reported CID {:#x}, which the target did not answer: {cqe:?}",
                    self.name, self.target.qid, cqe.cid
                );
            };
            // The host copies only the fields a CQE has; the phase tag is not its business.
            let expected = Cqe {
                phase: cqe.phase,
                ..*answer
            };
            assert_eq!(
                *cqe, expected,
                "{}: qid {} reported another CQE than the target sent",
                self.name, self.target.qid
            );
            if let (Some(wrote), Some(range)) = (wrote, range) {
                let view = &self.queue.as_ref().expect("open").region_bytes()[range];
                assert!(
                    view == &wrote[..],
                    "{}: qid {} CID {:#x}: the host's view of a Read differs from what the \
                     target wrote",
                    self.name,
                    self.target.qid,
                    cqe.cid
                );
                reached(|r| r.reads_checked += 1);
            }
        }
        self.forget_finished();
    }

    /// Reaps the target's CQ and checks each capsule against what the host accepted.
    fn target_poll(&mut self) {
        let Slot {
            target,
            sent,
            fatal,
            trusted,
            name,
            ..
        } = self;
        for event in target.poll() {
            match event {
                TargetEvent::Capsule { capsule } => {
                    let cid = u16::from_le_bytes([capsule[2], capsule[3]]);
                    let Some(c) = sent.iter_mut().find(|c| c.cid == cid && !c.delivered) else {
                        panic!(
                            "{name}: qid {}: a capsule the host did not submit (CID {cid:#x}): \
                             {:?}",
                            target.qid,
                            Sqe::decode(&capsule[..64.min(capsule.len())])
                        );
                    };
                    assert!(
                        capsule.len() == 64 + c.in_capsule.len()
                            && capsule[..64] == c.sqe
                            && (!c.data_known || capsule[64..] == c.in_capsule[..]),
                        "{name}: qid {}: the capsule of CID {cid:#x} is not what the host \
                         submitted",
                        target.qid
                    );
                    c.delivered = true;
                    reached(|r| r.capsules += 1);
                    target.pending.push(cid);
                }
                TargetEvent::Read { cid, data } => {
                    let Some(c) = sent.iter().find(|c| c.cid == cid && c.delivered) else {
                        continue;
                    };
                    if *trusted && !c.reported && c.data_known {
                        assert!(
                            data == c.bytes,
                            "{name}: qid {}: the target's RDMA READ of CID {cid:#x} differs \
                             from what the host submitted",
                            target.qid
                        );
                        reached(|r| r.writes_checked += 1);
                    }
                }
                TargetEvent::ProbeLanded => panic!(
                    "{name}: qid {}: the target wrote through the window of a command the host \
                     had reported: its key was still valid",
                    target.qid
                ),
                TargetEvent::Error(status) => {
                    assert!(
                        *fatal,
                        "{name}: qid {}: the target's side failed without cause: {status:?}",
                        target.qid
                    );
                }
            }
        }
        self.forget_finished();
    }

    /// The target answers a capsule it holds (see the module doc, operation 2).
    fn answer(&mut self, control: u8, which: u8, status: u8, seed: u8) {
        if self.target.pending.is_empty() || self.target.broken {
            return;
        }
        let Some(slot) = self.target.free_answer() else {
            return;
        };
        let cid = self
            .target
            .pending
            .remove(usize::from(which) % self.target.pending.len());
        let Some(i) = self.sent.iter().position(|c| c.cid == cid && c.delivered) else {
            return;
        };
        let mut answer_cid = cid;
        if control & FLAG_0 != 0 {
            answer_cid = cid ^ (1 + u16::from(seed));
            self.stray_answer(answer_cid);
            self.sent[i].disowned = true;
        }
        let status = if status < 192 {
            Status::SUCCESS
        } else {
            Status::from_field(u16::from(status) << 1, StatusContext::Nvm)
        };
        self.target.sqhd = self.target.sqhd.wrapping_add(1) % self.target.depth;
        let cqe = Cqe {
            dw0: u32::from(seed),
            dw1: 0,
            sqhd: self.target.sqhd,
            sqid: self.target.qid,
            cid: answer_cid,
            status,
            phase: false,
        };
        let sent = &self.sent[i];
        let mut data = None;
        let mut invalidate = None;
        let mut bogus = false;
        if control & FLAG_2 != 0 {
            let own = sent.keyed.as_ref().filter(|k| k.window).map(|k| k.key);
            // Seed bit 7: the window of another command in flight, as a confused target might.
            let other = self
                .sent
                .iter()
                .filter(|c| seed & 0x80 != 0 && c.cid != cid && !c.reported)
                .find_map(|c| c.keyed.as_ref().filter(|k| k.window).map(|k| k.key));
            let key = other.or(own).unwrap_or_else(|| match &sent.keyed {
                Some(k) => k.key,
                None => self.queue.as_ref().expect("open").region().key,
            });
            // Only the window the command offered may be invalidated: another key (the
            // region's, another command's window) fails the host's QP or loses the queue (a
            // response under another CID, flag 0, is a cause already: `stray_answer`).
            bogus = Some(key) != own;
            self.fatal |= bogus;
            invalidate = Some(key);
        }
        let step = match &sent.keyed {
            Some(Keyed {
                range,
                address,
                key,
                to_host,
                ..
            }) => {
                let (address, key) = if control & FLAG_1 != 0 {
                    // Past the range with the region's key lands in another command's chunk.
                    self.fatal = true;
                    self.trusted = false;
                    // Past the key's end (a window) or with a key nobody has.
                    if seed & 1 == 0 {
                        (address + range.len() as u64, *key)
                    } else {
                        (*address, key ^ 0x5a00)
                    }
                } else {
                    (*address, *key)
                };
                if *to_host {
                    let bytes: Vec<u8> = (0..range.len())
                        .map(|i| (i as u8).wrapping_mul(13) ^ seed)
                        .collect();
                    if control & FLAG_1 == 0 {
                        // Lands in the range before the CQE (RC order); a write elsewhere
                        // makes the queue untrusted, and nothing is checked after it.
                        for (cell, byte) in self.registered[range.clone()].iter_mut().zip(&bytes) {
                            *cell = Some(*byte);
                        }
                    }
                    data = Some(bytes.clone());
                    AnswerStep::Write {
                        address,
                        key,
                        bytes,
                    }
                } else {
                    AnswerStep::Read {
                        address,
                        key,
                        len: range.len(),
                    }
                }
            }
            None => AnswerStep::None,
        };
        if control & FLAG_0 == 0 {
            self.sent[i].answer = Some((cqe, data));
            self.sent[i].bogus = bogus;
        }
        self.target
            .post_answer(slot, cid, step, &cqe.to_bytes(), invalidate);
    }

    /// A response the input made (see the module doc, operation 3); `in_flight` picks a
    /// command whose CID it carries.
    fn raw_response(&mut self, bytes: &[u8], in_flight: Option<u8>) {
        if self.target.broken {
            return;
        }
        let Some(slot) = self.target.free_answer() else {
            return;
        };
        let mut response = [0u8; 16];
        let bytes = match in_flight {
            Some(which) => {
                let flying: Vec<u16> = self
                    .sent
                    .iter()
                    .filter(|c| !c.reported)
                    .map(|c| c.cid)
                    .collect();
                let Some(&cid) = flying.get(usize::from(which) % flying.len().max(1)) else {
                    return;
                };
                let n = bytes.len().min(16);
                response[..n].copy_from_slice(&bytes[..n]);
                response[12..14].copy_from_slice(&cid.to_le_bytes());
                &response[..]
            }
            None => bytes,
        };
        if bytes.len() == 16 {
            self.stray_answer(u16::from_le_bytes([bytes[12], bytes[13]]));
        } else {
            self.fatal = true;
        }
        self.target
            .post_answer(slot, 0, AnswerStep::None, bytes, None);
    }

    /// The target sent a CQE that may complete a command other than the one it answers (under
    /// another CID, or of its own making): the queue is untrusted from now on, and may be lost:
    /// the host drops a queue whose target answers a CID not in flight or answered already (which
    /// the harness does not track at the host's moment of reading), and a command completed
    /// early has its window ended by the host, so the target's own later RDMA through it fails.
    fn stray_answer(&mut self, cid: u16) {
        self.trusted = false;
        self.fatal = true;
        // Sent after every answer before it (RC order): unless a command still awaits its
        // answer under the CID, the host finds the CID not in flight or answered already.
        let awaited = self
            .sent
            .iter()
            .any(|c| c.cid == cid && !c.reported && c.answer.is_none());
        if !awaited {
            self.must_lose.push(cid);
        }
    }

    /// A stray response the host must lose the queue to is still to be read.
    fn owes_loss(&self) -> bool {
        !self.lost && !self.must_lose.is_empty()
    }

    /// The target writes through the window of the command reported last (operation 3, flag
    /// 1): the host has ended its key before reporting it, so the write must fail (and the
    /// connection with it).
    fn probe(&mut self) {
        if self.target.broken {
            return;
        }
        let Some(slot) = self.target.free_answer() else {
            return;
        };
        let Some((address, key)) = self.probe_key.take() else {
            return;
        };
        self.fatal = true;
        self.trusted = false;
        reached(|r| r.probes += 1);
        self.target.post_probe(slot, address, key);
    }

    /// The host's queue has commands it must still report (the settle rule).
    fn owes(&self) -> bool {
        !self.fatal && !self.lost && self.sent.iter().any(Sent::owed)
    }

    /// The host drops its queue, then the target its connection.
    fn close(mut self) {
        drop(self.queue.take());
        self.target.vanish();
    }
}

/// The raw target's side of a connection.
#[path = "fuzzing_target.rs"]
mod target_conn;
use target_conn::{AnswerStep, TargetAnswer, TargetConn, TargetEvent};

/// Seed inputs (see the module), and the files `scripts/fuzz.sh` gives the fuzzer.
#[path = "fuzzing_seeds.rs"]
pub mod seeds;

#[cfg(test)]
mod tests {
    use super::seeds::seeds;
    use super::*;

    #[test]
    fn every_seed_keeps_the_rules() {
        let before = *REACHED.lock().unwrap();
        for (name, input) in seeds() {
            eprintln!("seed {name}");
            hostile_target(&input);
        }
        // Other tests of the process add to the counts; these seeds alone reach each one.
        let after = *REACHED.lock().unwrap();
        eprintln!("{before:?} -> {after:?}");
        assert!(after.connects >= before.connects + 18, "{after:?}");
        assert!(after.capsules > before.capsules + 60, "{after:?}");
        assert!(after.reports > before.reports + 60, "{after:?}");
        assert!(after.reads_checked > before.reads_checked + 9, "{after:?}");
        assert!(
            after.writes_checked > before.writes_checked + 9,
            "{after:?}"
        );
        assert!(after.windows > before.windows + 9, "{after:?}");
        assert!(after.settled > before.settled + 15, "{after:?}");
        assert!(after.lazy > before.lazy + 9, "{after:?}");
        assert!(after.probes >= before.probes + 12, "{after:?}");
        assert!(after.stray_losses >= before.stray_losses + 4, "{after:?}");
        assert!(after.held_sends >= before.held_sends + 4, "{after:?}");
        // Not on the silent side, whose lone SENDs have no completion to hold.
        assert!(
            after.answered_already >= before.answered_already + 3,
            "{after:?}"
        );
    }

    /// The files under fuzz/seeds are what `seeds()` builds (rewritten with NVMF_WRITE_SEEDS=1).
    #[test]
    fn seed_files_are_current() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../fuzz/seeds/fuzz_host_queue_hostile_target");
        nvmf_transport::fuzz_input::check_seed_files(&dir, &seeds());
    }

    #[test]
    fn seeded_garbage_keeps_the_rules() {
        // The same inputs on every run.
        let mut random = nvmf_transport::fuzz_input::Xorshift::new(0x2545_F491_4F6C_DD1Du64);
        let mut next = move || random.next_u64();
        for _ in 0..60 {
            let mut data = vec![next() as u8];
            // Most inputs start from a connected I/O queue so that commands flow.
            data.extend([OP_CONNECT, 0, 15]);
            let len = (next() % 400) as usize;
            data.extend((0..len).map(|_| next() as u8));
            hostile_target(&data);
        }
    }
}
