//! The NVMe command path under a fuzzer (feature `fuzzing`; the `fuzz_target_commands` target in
//! `fuzz/`): a sequence of capsules, as a host on the network may send them, executed through the
//! interface the RDMA glue calls (module doc of [`crate::nvme`]): the data plan first
//! ([`xfer::plan`]), then [`Queue::execute`], the reactor's polls, keep-alive expiry.
//!
//! Each input gets a fresh target (nsid 1: malloc, 512-byte blocks, 1 MiB; nsid 2: null, 4 KiB
//! blocks), an admin queue connected and enabled (keep-alive 15 s), an I/O queue (qid 1) and a
//! queue not connected yet. Rules, checked as it runs (a panic is what libFuzzer reports):
//! - no panic, whatever the capsule;
//! - every answer echoes its command's CID, and every command is answered exactly once: at once,
//!   or under its tag by a poll (an Asynchronous Event Request may stay pending until the end;
//!   an Abort is answered once the victim's queue declined it, the glue's part done here);
//!   a poll never reports a tag that is not pending;
//! - nothing stays in flight: every I/O has completed by the end of the input;
//! - the data is right: a shadow copy of nsid 1 follows every successful Write, Write Zeroes and
//!   deallocation (Dataset Management; the malloc device reads deallocated blocks as zeroes),
//!   the blocks each changed are read back through its queue at once, and every successful Read
//!   of nsid 1 returns the shadow's bytes; every successful Read of nsid 2 (the null device)
//!   returns zeroes;
//! - the data plan keeps in-capsule data inside the capsule.
//!
//! Input: records of a control byte, a 64-byte SQE, a little-endian u16 payload length (mod
//! 4097) and that many payload bytes (the capsule's in-capsule data on the I/O and unconnected
//! queues; the host memory behind keyed descriptors, repeated to the planned length); an empty
//! payload stands for 4 KiB of a pattern seeded by the CID. Control
//! bits steer a record past checks a random one would rarely pass:
//! - 0-1: the queue (0: admin, 1 and 2: I/O, 3: the unconnected one);
//! - 2: the namespace (1 or 2 by bit 3);
//! - 4: LBA and block count within the first 64 blocks (at most 4 blocks), so writes and reads
//!   meet;
//! - 5: SGL1 describes the data: in the capsule for host-to-controller data on an I/O queue,
//!   else a keyed descriptor; without a payload, as much as the command's blocks take;
//! - 6: 5 s pass on the clock before the command, and the target reaps expired controllers.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nvmf_protocol::fabrics::{
    CNTLID_DYNAMIC, ConnectCmd, ConnectData, PropertySetCmd, PropertySize,
};
use nvmf_protocol::nvm::DsmRange;
use nvmf_protocol::properties::{Cc, PropertyOffset};
use nvmf_protocol::{Cqe, FixedStr, SglDescriptor, Sqe};

use super::xfer::{self, MAX_KEYED, NO_KEYED, Placement};
use super::{Direction, Exec, Limits, Queue, ReactorIo, Subsystem, Target, data_direction};
use crate::bdev::{IoBuf, MallocBdev, NullBdev};

const SUBNQN: &str = "nqn.2016-06.io.nvmf-rs:fuzz";
const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:2b4c8d1e-0f3a-4e5b-9c6d-7e8f9a0b1c2d";
const MALLOC_BLOCK: usize = 512;
const MALLOC_BLOCKS: u64 = 2048;
/// Where the LBA steering puts commands: the first blocks of nsid 1.
const STEERED_BLOCKS: u64 = 64;
const NULL_BLOCK: u32 = 4096;
const NULL_BLOCKS: u64 = (1 << 30) / NULL_BLOCK as u64;
const RECORD_HEAD: usize = 1 + 64 + 2;
const MAX_PAYLOAD: usize = 4096;

const QUEUE_MASK: u8 = 0b11;
const NSID_STEERED: u8 = 1 << 2;
const NSID_TWO: u8 = 1 << 3;
const RANGE_STEERED: u8 = 1 << 4;
const SGL_STEERED: u8 = 1 << 5;
const TIME_PASSES: u8 = 1 << 6;

const OP_WRITE: u8 = 0x01;
const OP_READ: u8 = 0x02;
const OP_WRITE_ZEROES: u8 = 0x08;
const OP_DSM: u8 = 0x09;
const OP_AER: u8 = 0x0C;

/// Run one input; panics when a rule of the module doc breaks.
pub fn commands(data: &[u8]) {
    let mut run = Run::new();
    let mut rest = data;
    while rest.len() >= RECORD_HEAD {
        let control = rest[0];
        let mut sqe = Sqe::decode(&rest[1..65]).expect("64 bytes decode");
        let len = usize::from(u16::from_le_bytes([rest[65], rest[66]])) % (MAX_PAYLOAD + 1);
        let len = len.min(rest.len() - RECORD_HEAD);
        let payload = &rest[RECORD_HEAD..RECORD_HEAD + len];
        rest = &rest[RECORD_HEAD + len..];
        steer(control, &mut sqe, payload.len());
        if control & TIME_PASSES != 0 {
            run.now += Duration::from_secs(5);
            run.target.reap_expired(run.now);
        }
        let data = if payload.is_empty() {
            pattern(sqe.cid)
        } else {
            payload.to_vec()
        };
        run.command(usize::from(control & QUEUE_MASK), sqe, &data);
    }
    run.finish();
}

/// What an empty payload stands for: 4 KiB seeded by the CID, so that a record need not carry
/// the bytes it writes, and writes differ from what the blocks held.
fn pattern(cid: u16) -> Vec<u8> {
    (0..MAX_PAYLOAD as u32)
        .map(|i| (i.wrapping_mul(31) ^ u32::from(cid) ^ 0xA5) as u8)
        .collect()
}

/// Applies the control byte's steering to `sqe`.
fn steer(control: u8, sqe: &mut Sqe, payload_len: usize) {
    if control & NSID_STEERED != 0 {
        sqe.nsid = if control & NSID_TWO != 0 { 2 } else { 1 };
    }
    if control & RANGE_STEERED != 0 {
        // A few blocks near the start, so that writes and reads meet.
        let lba = (u64::from(sqe.cdw10) | u64::from(sqe.cdw11) << 32) % STEERED_BLOCKS;
        let blocks = (sqe.cdw12 & 0xFFFF) % 4;
        sqe.cdw10 = lba as u32;
        sqe.cdw11 = (lba >> 32) as u32;
        sqe.cdw12 = sqe.cdw12 & !0xFFFF | blocks;
    }
    if control & SGL_STEERED != 0 {
        // Host-to-controller data rides in the capsule on an I/O queue, as the Linux host
        // sends it; anything else is host memory behind a keyed descriptor.
        let in_capsule = matches!(control & QUEUE_MASK, 1 | 2)
            && data_direction(sqe) == Direction::HostToController;
        // Without a payload the data covers the command's blocks (the pattern in the capsule,
        // at most its 4 KiB; host memory for the rest).
        let blocks = (sqe.cdw12 & 0xFFFF) + 1;
        let block_size = if sqe.nsid == 2 {
            NULL_BLOCK
        } else {
            MALLOC_BLOCK as u32
        };
        let length = match payload_len {
            0 => blocks.saturating_mul(block_size).min(1 << 20),
            n => n as u32,
        };
        let sgl = if in_capsule {
            SglDescriptor::DataBlockOffset {
                offset: 0,
                length: length.min(MAX_PAYLOAD as u32),
            }
        } else {
            SglDescriptor::keyed(0x1000, length.max(1), 0x55, false).expect("at most 1 MiB")
        };
        sqe.set_sgl1(sgl);
    }
}

/// Executes `sqe` on `queue` and polls `io` until it is answered: one command at a time, as the
/// bring-up here and the unit tests' host drive it.
pub(crate) fn execute_and_wait(
    queue: &mut Queue,
    io: &mut ReactorIo,
    sqe: &Sqe,
    data: &mut [u8],
    tag: u64,
    now: Instant,
) -> Cqe {
    let mut segments = [data];
    let mut buf = IoBuf::new(&mut segments);
    match queue.execute(io, sqe, &mut buf, tag, || now) {
        Exec::Done(c) => c,
        Exec::Pending => loop {
            let mut got = None;
            io.poll(&mut |t, c| {
                assert_eq!(t, tag, "an answer under another command's tag");
                got = Some(c);
            });
            if let Some(c) = got {
                return c;
            }
        },
    }
}

/// A command not answered yet.
struct Outstanding {
    sqe: Sqe,
    /// Its data buffer (the device copies during submission, so a read's bytes are here even
    /// before its answer is polled).
    data: Vec<u8>,
    queue: usize,
    /// A read-back of blocks a command just changed: it must succeed.
    read_back: bool,
}

/// One input's target, queues and what the rules need to remember.
struct Run {
    target: Arc<Target>,
    io: ReactorIo,
    /// Admin, I/O (twice: control values 1 and 2), unconnected.
    queues: [Queue; 4],
    now: Instant,
    next_tag: u64,
    outstanding: HashMap<u64, Outstanding>,
    /// nsid 1's bytes as the commands answered so far left them.
    shadow: Vec<u8>,
    /// Ranges of nsid 1 (first block, blocks) a successful command changed, with the queue
    /// slot it came on: read back through that queue after the command, so a write that lands
    /// wrong is caught without the input having to read it.
    verify: Vec<(usize, u64, u64)>,
    /// `read_back` is issuing commands.
    reading_back: bool,
}

fn listener() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 4420))
}

impl Run {
    fn new() -> Run {
        let mut target = Target::new(Limits::default(), vec![listener()]);
        let malloc =
            MallocBdev::new("m0", MALLOC_BLOCK as u32, MALLOC_BLOCKS * 512).expect("malloc bdev");
        let null = NullBdev::new("n0", NULL_BLOCK, NULL_BLOCKS * u64::from(NULL_BLOCK))
            .expect("null bdev");
        target.add_bdev("m0", Arc::new(malloc));
        target.add_bdev("n0", Arc::new(null));
        let sub = Arc::new(Subsystem::new(
            SUBNQN,
            "FUZZ",
            "MODEL",
            true,
            vec![],
            16,
            vec![listener()],
        ));
        target.add_subsystem(sub);
        for (nsid, bdev) in [(1, "m0"), (2, "n0")] {
            target.add_namespace(SUBNQN, nsid, bdev).expect("namespace");
        }
        let target = Arc::new(target);
        let mut io = ReactorIo::new(target.clone());
        let queues = std::array::from_fn(|_| Queue::new(target.clone(), &mut io, listener(), 128));
        let mut run = Run {
            target,
            io,
            queues,
            now: Instant::now(),
            next_tag: 1,
            outstanding: HashMap::new(),
            shadow: vec![0; MALLOC_BLOCKS as usize * MALLOC_BLOCK],
            verify: Vec::new(),
            reading_back: false,
        };
        run.bring_up();
        run
    }

    /// Admin connect, CC.EN = 1, I/O queues 1 and 2 in queue slots 1 and 2.
    fn bring_up(&mut self) {
        let admin = self.connect(0, 0, CNTLID_DYNAMIC);
        let cntlid = admin.dw0 as u16;
        let cc = Cc::enabled_nvm();
        let set = PropertySetCmd {
            cid: 0,
            size: PropertySize::Four,
            offset: PropertyOffset::Cc,
            value: u64::from(cc.to_u32()),
        };
        let enabled = self.answer(0, set.to_sqe(), &mut []);
        assert!(enabled.status.is_success(), "enable: {enabled:?}");
        for (slot, qid) in [(1, 1), (2, 2)] {
            let c = self.connect(slot, qid, cntlid);
            assert!(c.status.is_success(), "I/O queue {qid}: {c:?}");
        }
    }

    fn connect(&mut self, slot: usize, qid: u16, cntlid: u16) -> Cqe {
        let cmd = ConnectCmd {
            cid: 0,
            recfmt: 0,
            qid,
            sqsize: 31,
            cattr: 0,
            kato: 15_000,
            sgl: SglDescriptor::keyed(0x1000, 1024, 0x55, false).expect("1024 fits"),
        };
        let mut data = ConnectData {
            hostid: [7; 16],
            cntlid,
            subnqn: FixedStr::new(SUBNQN, "SUBNQN").expect("nqn"),
            hostnqn: FixedStr::new(HOSTNQN, "HOSTNQN").expect("nqn"),
        }
        .to_bytes();
        let c = self.answer(slot, cmd.to_sqe(), &mut data);
        assert!(c.status.is_success(), "connect qid {qid}: {c:?}");
        c
    }

    /// Bring-up only: execute and poll until answered.
    fn answer(&mut self, slot: usize, sqe: Sqe, data: &mut [u8]) -> Cqe {
        let tag = self.tag();
        execute_and_wait(
            &mut self.queues[slot],
            &mut self.io,
            &sqe,
            data,
            tag,
            self.now,
        )
    }

    fn tag(&mut self) -> u64 {
        self.next_tag += 1;
        self.next_tag
    }

    /// One capsule as the RDMA glue handles it: the data plan, the buffer (the capsule's bytes,
    /// or host memory read in), execution, then the polls.
    fn command(&mut self, slot: usize, sqe: Sqe, payload: &[u8]) {
        let in_capsule = if slot == 0 { &[][..] } else { payload };
        let mut keyed = [NO_KEYED; MAX_KEYED];
        let plan = xfer::plan(&sqe, in_capsule, self.target.limits(), &mut keyed);
        assert!(
            plan.is_ok() || !self.reading_back,
            "a read-back was refused: {plan:?}"
        );
        let Ok(plan) = plan else {
            return; // answered with the plan's status by the glue; nothing executed
        };
        let mut data = match plan.placement {
            Placement::None => Vec::new(),
            Placement::InCapsule { offset, length } => {
                let range = offset as usize..offset as usize + length as usize;
                let Some(bytes) = in_capsule.get(range.clone()) else {
                    panic!(
                        "the plan put data at {range:?} of a {}-byte capsule",
                        in_capsule.len()
                    );
                };
                if plan.direction == Direction::HostToController {
                    bytes.to_vec()
                } else {
                    vec![0u8; bytes.len()]
                }
            }
            Placement::Keyed { .. } if plan.direction == Direction::HostToController => {
                // What an RDMA READ of the host's memory brings: the payload, repeated.
                let mut d = vec![0u8; plan.length as usize];
                if !payload.is_empty() {
                    for (i, b) in d.iter_mut().enumerate() {
                        *b = payload[i % payload.len()];
                    }
                }
                d
            }
            Placement::Keyed { .. } => vec![0u8; plan.length as usize],
        };
        let tag = self.tag();
        let exec = {
            let mut segments = [&mut data[..]];
            let mut buf = IoBuf::new(&mut segments);
            let now = self.now;
            self.queues[slot].execute(&mut self.io, &sqe, &mut buf, tag, || now)
        };
        let outstanding = Outstanding {
            sqe,
            data,
            queue: slot,
            read_back: self.reading_back,
        };
        match exec {
            Exec::Done(cqe) => self.answered(outstanding, cqe),
            Exec::Pending => {
                self.outstanding.insert(tag, outstanding);
            }
        }
        self.poll();
        // The glue asks every queue after each command (and on a timer): a Disconnect, or a
        // controller torn down (its admin queue disconnected, keep-alive expired), ends the
        // qpair; a new connection would take its place. Blocks changed through a queue that
        // ended are not read back through it.
        let mut ended = [false; 4];
        for (i, q) in self.queues.iter_mut().enumerate() {
            if q.should_disconnect() {
                ended[i] = true;
                *q = Queue::new(self.target.clone(), &mut self.io, listener(), 128);
            }
        }
        for (slot, lba, blocks) in std::mem::take(&mut self.verify) {
            if !ended[slot] {
                self.read_back(slot, lba, blocks);
            }
        }
    }

    /// Reads `blocks` of nsid 1 from `lba` through queue `slot`, in commands of at most the
    /// largest transfer; `answered` compares them with the shadow.
    fn read_back(&mut self, slot: usize, lba: u64, blocks: u64) {
        let most = u64::from(self.target.limits().max_io_size) / MALLOC_BLOCK as u64;
        let mut at = lba;
        while at < lba + blocks {
            let n = most.min(lba + blocks - at);
            let mut read = Sqe::new(OP_READ, 0xFFFF, 1);
            read.cdw10 = at as u32;
            read.cdw11 = (at >> 32) as u32;
            read.cdw12 = (n - 1) as u32;
            let length = (n as usize * MALLOC_BLOCK) as u32;
            read.set_sgl1(SglDescriptor::keyed(0x1000, length, 0x55, false).expect("fits"));
            self.reading_back = true;
            self.command(slot, read, &[]);
            self.reading_back = false;
            at += n;
        }
    }

    /// The reactor's polls: block-device completions and the admin queue's events, after the
    /// glue's part of Abort: each I/O queue takes the aborts aimed at it and declines them (here
    /// every command executes as it arrives, so none waits for buffers, the only abortable
    /// state).
    fn poll(&mut self) {
        for q in &self.queues {
            let mut asked = Vec::new();
            q.take_aborts(&mut |_, abort_cid| asked.push(abort_cid));
            for abort_cid in asked {
                q.answer_abort(abort_cid, false);
            }
        }
        let mut got = Vec::new();
        self.io.poll(&mut |tag, cqe| got.push((tag, cqe)));
        for q in &mut self.queues {
            q.poll_events(&mut self.io, &mut |tag, cqe| got.push((tag, cqe)));
        }
        for (tag, cqe) in got {
            let Some(o) = self.outstanding.remove(&tag) else {
                panic!("a poll answered tag {tag}, which is not pending: {cqe:?}");
            };
            self.answered(o, cqe);
        }
    }

    /// The rules for one answer.
    fn answered(&mut self, o: Outstanding, cqe: Cqe) {
        let sqe = &o.sqe;
        assert_eq!(
            cqe.cid, sqe.cid,
            "an answer to CID {} carries {cqe:?}",
            sqe.cid
        );
        assert!(
            cqe.status.is_success() || !o.read_back,
            "reading back blocks just changed failed: {cqe:?}"
        );
        // Only I/O queues carry NVM commands; their opcodes mean admin commands elsewhere.
        if !cqe.status.is_success() || !matches!(o.queue, 1 | 2) {
            return;
        }
        let lba = u64::from(sqe.cdw10) | u64::from(sqe.cdw11) << 32;
        let blocks = u64::from(sqe.cdw12 & 0xFFFF) + 1;
        let range = |block_size: usize, namespace_blocks: u64| {
            let end = lba.checked_add(blocks);
            assert!(
                end.is_some_and(|end| end <= namespace_blocks),
                "opcode {:#x} of LBA {lba} + {blocks} succeeded past the end of nsid {}",
                sqe.opcode,
                sqe.nsid
            );
            lba as usize * block_size..(lba + blocks) as usize * block_size
        };
        match (sqe.opcode, sqe.nsid) {
            (OP_READ, 1) => {
                let r = range(MALLOC_BLOCK, MALLOC_BLOCKS);
                assert!(
                    o.data.get(..r.len()) == Some(&self.shadow[r.clone()]),
                    "a read of LBA {lba} returned bytes nsid 1 does not hold"
                );
            }
            (OP_READ, 2) => {
                let r = range(NULL_BLOCK as usize, NULL_BLOCKS);
                assert!(
                    o.data[..r.len().min(o.data.len())].iter().all(|&b| b == 0),
                    "a read of the null namespace returned non-zero bytes"
                );
            }
            (OP_WRITE, 1) => {
                let r = range(MALLOC_BLOCK, MALLOC_BLOCKS);
                let Some(written) = o.data.get(..r.len()) else {
                    panic!(
                        "a write of {} bytes succeeded with {}",
                        r.len(),
                        o.data.len()
                    );
                };
                self.shadow[r].copy_from_slice(written);
                self.verify.push((o.queue, lba, blocks));
            }
            (OP_WRITE_ZEROES, 1) => {
                let r = range(MALLOC_BLOCK, MALLOC_BLOCKS);
                self.shadow[r].fill(0);
                self.verify.push((o.queue, lba, blocks));
            }
            (OP_DSM, 1) => {
                let Ok(cmd) = sqe.as_dataset_management() else {
                    panic!("a Dataset Management the protocol crate refuses succeeded");
                };
                if !cmd.ad {
                    return;
                }
                let Ok(ranges) = DsmRange::decode_list(&o.data, cmd.ranges()) else {
                    panic!("a deallocation whose ranges do not decode succeeded");
                };
                for d in ranges.filter(|d| d.length > 0) {
                    let end = d.slba.checked_add(u64::from(d.length));
                    assert!(
                        end.is_some_and(|end| end <= MALLOC_BLOCKS),
                        "a deallocation of LBA {} + {} succeeded past the end",
                        d.slba,
                        d.length
                    );
                    let at = d.slba as usize * MALLOC_BLOCK;
                    self.shadow[at..at + d.length as usize * MALLOC_BLOCK].fill(0);
                    self.verify.push((o.queue, d.slba, u64::from(d.length)));
                }
            }
            _ => {}
        }
    }

    /// End of input: everything but Asynchronous Event Requests has been answered.
    fn finish(&mut self) {
        for _ in 0..10_000 {
            if self.io.in_flight() == 0 {
                break;
            }
            self.poll();
        }
        assert_eq!(self.io.in_flight(), 0, "I/O still in flight at the end");
        self.poll();
        for o in self.outstanding.values() {
            assert!(
                o.sqe.opcode == OP_AER && o.queue == 0,
                "CID {} (opcode {:#x}) was never answered",
                o.sqe.cid,
                o.sqe.opcode
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One record as the input encodes it.
    fn record(control: u8, sqe: &Sqe, payload: &[u8]) -> Vec<u8> {
        let mut b = vec![control];
        b.extend_from_slice(&sqe.to_bytes());
        b.extend_from_slice(&(payload.len() as u16).to_le_bytes());
        b.extend_from_slice(payload);
        b
    }

    fn rw(opcode: u8, lba: u64, blocks: u32) -> Sqe {
        let mut s = Sqe::new(opcode, 0x42, 1);
        s.cdw10 = lba as u32;
        s.cdw11 = (lba >> 32) as u32;
        s.cdw12 = blocks - 1;
        s
    }

    const STEER: u8 = 1 | NSID_STEERED | RANGE_STEERED | SGL_STEERED;

    /// A Disconnect on the admin queue tears the controller down: its I/O queues end with it
    /// (the glue asks every queue after each command), so a later write on one is refused, and
    /// blocks are read back only through queues that still stand.
    #[test]
    fn an_admin_disconnect_ends_the_io_queues_too() {
        let disconnect = Sqe::new_fabrics(nvmf_protocol::FabricsType::Disconnect, 5);
        let mut data = record(0, &disconnect, &[]);
        data.extend(record(STEER, &rw(OP_WRITE, 0, 4), &[]));
        commands(&data);
        let mut run = Run::new();
        run.command(0, disconnect, &[]);
        let mut write = rw(OP_WRITE, 0, 4);
        steer(STEER, &mut write, 0);
        run.command(1, write, &pattern(write.cid));
        run.finish();
        assert!(
            run.shadow.iter().all(|&b| b == 0),
            "a write on an ended queue landed"
        );
    }

    #[test]
    fn nothing_and_garbage_keep_the_rules() {
        commands(&[]);
        commands(&[0xA5; 1000]);
        commands(&(0..=255).cycle().take(3000).collect::<Vec<u8>>());
    }

    /// An Abort aimed at an I/O queue is answered (declined) once that queue's glue looked at
    /// it: the run must not count it as never answered.
    #[test]
    fn an_abort_for_an_io_queue_is_answered() {
        let mut abort = Sqe::new(0x08, 9, 0);
        abort.cdw10 = 1 | 0x42 << 16;
        commands(&record(0, &abort, &[]));
    }

    /// A write then a read of the same blocks: the shadow follows the write and the read is
    /// compared with it, so a device returning other bytes breaks a rule.
    #[test]
    fn a_written_block_reads_back_and_the_shadow_checks_it() {
        let mut data = record(STEER, &rw(OP_WRITE, 10, 2), &[0x5A; 1024]);
        data.extend(record(STEER, &rw(OP_READ, 10, 2), &[0; 1024]));
        commands(&data);

        let mut run = Run::new();
        for (opcode, payload) in [(OP_WRITE, [0x5A; 1024]), (OP_READ, [0; 1024])] {
            let mut sqe = rw(opcode, 10, 2);
            steer(STEER, &mut sqe, payload.len());
            run.command(1, sqe, &payload);
            run.finish();
        }
        assert_eq!(
            run.shadow[10 * MALLOC_BLOCK..12 * MALLOC_BLOCK],
            [0x5A; 1024]
        );
        // The same read against a shadow that missed one bit of the write breaks the rule.
        run.shadow[10 * MALLOC_BLOCK] ^= 1;
        let mut read = rw(OP_READ, 10, 2);
        steer(STEER, &mut read, 1024);
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            run.command(1, read, &[0; 1024]);
            run.finish();
        }));
        assert!(
            caught.is_err(),
            "a read that differs from the shadow passed"
        );
    }

    /// Deallocated and zeroed blocks read back as zeroes, and the shadow knows it.
    #[test]
    fn zeroes_and_deallocation_follow_the_shadow() {
        let mut dsm = Sqe::new(OP_DSM, 7, 1);
        dsm.cdw11 = 1 << 2; // AD
        let range = DsmRange {
            context_attributes: 0,
            length: 2,
            slba: 5,
        }
        .to_bytes();
        let mut run = Run::new();
        // Not the LBA steering for Dataset Management: its CDW11 carries AD, not an LBA.
        let steps: [(Sqe, &[u8], u8); 6] = [
            (rw(OP_WRITE, 0, 4), &[0xFF; 2048], STEER),
            (rw(OP_WRITE, 4, 4), &[0xFF; 2048], STEER),
            (rw(OP_WRITE_ZEROES, 2, 2), &[], STEER),
            (dsm, &range, STEER & !RANGE_STEERED),
            (rw(OP_READ, 0, 4), &[], STEER),
            (rw(OP_READ, 4, 4), &[], STEER),
        ];
        for (mut sqe, payload, control) in steps {
            steer(control, &mut sqe, payload.len());
            run.command(1, sqe, payload);
            run.finish();
        }
        let block = |b: usize| run.shadow[b * MALLOC_BLOCK..(b + 1) * MALLOC_BLOCK].to_vec();
        for b in 0..8 {
            let want = if matches!(b, 2 | 3 | 5 | 6) { 0 } else { 0xFF };
            assert_eq!(block(b), [want; MALLOC_BLOCK], "block {b}");
        }
    }
}
