//! Seed inputs of `fuzz_target_hostile_host`, one per scenario that random bytes reach only
//! slowly (a controller with an I/O queue, then the commands that change state: writes, a
//! fabrics Disconnect, an Abort, keep-alive expiry, a host that stops posting receives, the
//! target's SEND completions held behind the answers), so that a
//! short run starts from them. `fuzz/seeds/fuzz_target_hostile_host/` holds them as files, which
//! `scripts/fuzz.sh` gives the fuzzer; the test `seed_files_are_current` keeps those files equal
//! to what this module builds (`NVMF_WRITE_SEEDS=1` rewrites them). Each must keep the rules.

use nvmf_protocol::Sqe;
use nvmf_protocol::sqe::FLAGS_PSDT_SGL;

use super::{
    FLAG_0, FLAG_1, FLAG_2, OP_CAPSULE, OP_CONNECT, OP_DISCONNECT, OP_EXPIRE, OP_SETTLE, OP_SHORT,
    OP_WAIT,
};

const READ: u8 = 0x02;
const WRITE: u8 = 0x01;
const FABRICS: u8 = 0x7F;
const FCTYPE_DISCONNECT: u8 = 0x08;
const FCTYPE_PROPERTY_GET: u8 = 0x04;

/// A well-formed connect of `slot` (the admin queue, or I/O queue `qid`), depth 16.
fn connect(slot: u8, admin: bool, qid: u8) -> Vec<u8> {
    let flags = if admin { FLAG_0 } else { 0 };
    vec![OP_CONNECT | slot << 3 | flags, qid.wrapping_sub(1), 14]
}

/// A capsule record on `slot` with `flags` (steering) and `payload` in the capsule.
fn capsule(slot: u8, flags: u8, sqe: &Sqe, payload: &[u8]) -> Vec<u8> {
    let mut record = vec![OP_CAPSULE | slot << 3 | flags];
    record.extend_from_slice(&sqe.to_bytes());
    record.extend_from_slice(&(payload.len() as u16).to_le_bytes());
    record.extend_from_slice(payload);
    record
}

/// An NVM read or write of `blocks` at `lba` whose keyed steering (flag 0) describes `bytes` at
/// the start of the host's data area.
pub(super) fn io(opcode: u8, cid: u16, nsid: u32, lba: u64, blocks: u16, bytes: u32) -> Sqe {
    let mut sqe = Sqe {
        opcode,
        cid,
        nsid,
        cdw10: lba as u32,
        cdw11: (lba >> 32) as u32,
        cdw12: u32::from(blocks - 1),
        flags: FLAGS_PSDT_SGL,
        ..Sqe::default()
    };
    sqe.dptr[8..11].copy_from_slice(&bytes.to_le_bytes()[..3]);
    sqe
}

/// An admin command with `bytes` of data behind the keyed steering.
fn admin(opcode: u8, cid: u16, nsid: u32, cdw10: u32, cdw11: u32, bytes: u32) -> Sqe {
    let mut sqe = Sqe {
        opcode,
        cid,
        nsid,
        cdw10,
        cdw11,
        flags: FLAGS_PSDT_SGL,
        ..Sqe::default()
    };
    sqe.dptr[8..11].copy_from_slice(&bytes.to_le_bytes()[..3]);
    sqe
}

fn fabrics(cid: u16, fctype: u8) -> Sqe {
    Sqe {
        opcode: FABRICS,
        cid,
        nsid: u32::from(fctype),
        flags: FLAGS_PSDT_SGL,
        ..Sqe::default()
    }
}

/// `first` (which transport) and the records, as one input.
fn input(first: u8, records: &[Vec<u8>]) -> Vec<u8> {
    let mut data = vec![first];
    for r in records {
        data.extend_from_slice(r);
    }
    data
}

/// A controller: the admin queue in slot 0, I/O queue 1 in slot 1.
fn controller() -> Vec<Vec<u8>> {
    vec![connect(0, true, 0), connect(1, false, 1)]
}

fn with_controller(first: u8, records: &[Vec<u8>]) -> Vec<u8> {
    let mut all = controller();
    all.extend_from_slice(records);
    input(first, &all)
}

/// The seeds, by file name.
pub fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    let session = |first| {
        with_controller(
            first,
            &[
                capsule(1, FLAG_0, &io(WRITE, 5, 1, 8, 8, 4096), &[]),
                capsule(1, FLAG_0, &io(READ, 6, 1, 8, 8, 4096), &[]),
                capsule(1, FLAG_0, &io(READ, 7, 2, 0, 1, 4096), &[]),
                capsule(1, 0, &io(0x00, 8, 1, 0, 1, 0), &[]),
                vec![OP_SETTLE],
                vec![OP_DISCONNECT | 1 << 3],
                vec![OP_DISCONNECT],
            ],
        )
    };
    let starved_then_runt = |first| {
        with_controller(
            first,
            &[
                capsule(1, FLAG_0 | FLAG_2, &io(READ, 4, 1, 0, 1, 512), &[]),
                vec![OP_SHORT | 1 << 3, 2, 0, 0],
                vec![OP_DISCONNECT | 1 << 3],
                vec![OP_SETTLE],
            ],
        )
    };
    let abort = admin(0x08, 10, 0, 1 | 9 << 16, 0, 0);
    let flood: Vec<Vec<u8>> = (0..8)
        .map(|cid| capsule(2, FLAG_0, &io(READ, cid, 2, 0, 1, 4096), &[]))
        .collect();
    let mut flood_records = controller();
    // Slot 2: I/O queue 2 at depth 2, sent 8 commands at once.
    flood_records.push(vec![OP_CONNECT | 2 << 3, 1, 0]);
    flood_records.extend(flood);
    flood_records.push(vec![OP_SETTLE]);
    // The target's SEND completions held (a late ACK) while a host at depth 6 sends two full
    // waves of reads, the second once it has the first's answers: those gave the depth back
    // before the target heard their SENDs went, so the second is no overrun.
    let held_sends = |first| {
        let mut records = vec![
            connect(0, true, 0),
            vec![OP_CONNECT | 1 << 3, 0, 4],
            vec![OP_WAIT | FLAG_0, 0],
        ];
        for wave in 0..2u16 {
            for n in 0..6 {
                records.push(capsule(
                    1,
                    FLAG_0,
                    &io(READ, 30 + wave * 6 + n, 2, 0, 1, 4096),
                    &[],
                ));
            }
            records.push(vec![OP_WAIT | 1 << 3 | FLAG_1, 0]);
        }
        records.push(vec![OP_SETTLE]);
        input(first, &records)
    };
    vec![
        ("held_sends", held_sends(0)),
        ("held_sends_silent_answers", held_sends(1)),
        ("held_sends_tcp", held_sends(2)),
        ("session", session(0)),
        ("session_silent_answers", session(1)),
        ("session_tcp", session(2)),
        (
            "in_capsule_writes",
            with_controller(
                0,
                &[
                    capsule(1, FLAG_1, &io(WRITE, 1, 1, 0, 1, 0), &[0xA5; 512]),
                    // More than the target takes in a capsule.
                    capsule(1, FLAG_1, &io(WRITE, 2, 1, 0, 10, 0), &[0x5A; 5120]),
                    vec![OP_SETTLE],
                ],
            ),
        ),
        (
            "fabrics_disconnect",
            with_controller(
                1,
                &[
                    capsule(1, 0, &fabrics(1, FCTYPE_DISCONNECT), &[]),
                    vec![OP_SETTLE],
                    capsule(0, 0, &fabrics(2, FCTYPE_PROPERTY_GET), &[]),
                    capsule(0, 0, &fabrics(3, FCTYPE_DISCONNECT), &[]),
                    vec![OP_SETTLE],
                ],
            ),
        ),
        ("starved_then_runt", starved_then_runt(1)),
        ("starved_then_runt_tcp", starved_then_runt(2)),
        (
            "abort",
            with_controller(
                0,
                &[
                    capsule(1, FLAG_0, &io(READ, 9, 2, 0, 8, 32768), &[]),
                    capsule(0, 0, &abort, &[]),
                    vec![OP_SETTLE],
                ],
            ),
        ),
        (
            "admin_commands",
            input(
                0,
                &[
                    connect(0, true, 0),
                    // Identify controller and namespace 1, SMART log, Number of Queues, Keep
                    // Alive, an Asynchronous Event Request (may stay pending).
                    capsule(0, FLAG_0, &admin(0x06, 1, 0, 1, 0, 4096), &[]),
                    capsule(0, FLAG_0, &admin(0x06, 2, 1, 0, 0, 4096), &[]),
                    capsule(0, FLAG_0, &admin(0x02, 3, !0, 2 | 127 << 16, 0, 512), &[]),
                    capsule(0, 0, &admin(0x09, 4, 0, 7, 0x0003_0003, 0), &[]),
                    capsule(0, 0, &admin(0x18, 5, 0, 0, 0, 0), &[]),
                    capsule(0, 0, &admin(0x0C, 6, 0, 0, 0, 0), &[]),
                    vec![OP_SETTLE],
                ],
            ),
        ),
        (
            "garbage_private_data",
            input(
                0,
                &[
                    vec![OP_CONNECT | FLAG_1, 0, 14, 8, 1, 2, 3, 4, 5, 6, 7, 8],
                    vec![OP_CONNECT | FLAG_1 | 1 << 3, 0, 14, 0],
                    connect(2, true, 0),
                    vec![OP_SETTLE],
                ],
            ),
        ),
        (
            "keep_alive_expiry",
            with_controller(
                0,
                &[
                    capsule(1, FLAG_0, &io(READ, 3, 2, 0, 8, 32768), &[]),
                    vec![OP_EXPIRE],
                    capsule(1, FLAG_0, &io(WRITE, 4, 1, 0, 1, 512), &[]),
                    vec![OP_SETTLE],
                ],
            ),
        ),
        (
            "invalidate_a_region_key",
            with_controller(
                0,
                &[
                    capsule(1, FLAG_0 | FLAG_1, &io(READ, 11, 1, 0, 1, 512), &[]),
                    vec![OP_SETTLE],
                ],
            ),
        ),
        ("beyond_queue_depth", input(1, &flood_records)),
        (
            // Bytes in a data buffer and in the host's memory, then a read of the null
            // namespace over them: zeroes must replace them.
            "null_read_over_data",
            with_controller(
                0,
                &[
                    capsule(1, FLAG_1, &io(WRITE, 1, 1, 0, 8, 0), &[0xA5; 4096]),
                    vec![OP_SETTLE],
                    capsule(1, FLAG_0, &io(READ, 2, 1, 0, 8, 4096), &[]),
                    vec![OP_SETTLE],
                    capsule(1, FLAG_0, &io(READ, 3, 2, 0, 1, 4096), &[]),
                    vec![OP_SETTLE],
                ],
            ),
        ),
    ]
}
