//! Admin and NVM commands over the fabric: Compare, Write Zeroes, Dataset Management, Get /
//! Set Features, Get Log Page (SMART, error information), Identify namespace / active
//! namespace list / namespace identification descriptors, Keep Alive, Abort, unsupported
//! opcodes and a transfer over MDTS. Each one's data moves by keyed SGL or in the capsule.

use nvmf_protocol::fabrics::CNTLID_DYNAMIC;
use nvmf_protocol::identify::{IdentifyNamespace, NsIdDescriptor, NsList};
use nvmf_protocol::log::{ErrorLogEntry, SmartLog};
use nvmf_protocol::nvm::DsmRange;
use nvmf_protocol::status::{GenericStatus, MediaStatus};
use nvmf_protocol::{Cqe, SglDescriptor, Sqe, StatusCode};
use std::sync::atomic::Ordering;

use nvmf_transport::SoftFabric;

use crate::host::{HostQueue, wait_until};
use crate::{BLOCK, BLOCKS, Rig, connect, enable, pattern, rw};

fn admin_cmd(opcode: u8, nsid: u32, cdw10: u32, cdw11: u32) -> Sqe {
    let mut s = Sqe::new(opcode, 0, nsid);
    s.cdw10 = cdw10;
    s.cdw11 = cdw11;
    s
}

pub(crate) fn generic(c: &Cqe) -> Option<GenericStatus> {
    match c.status.code {
        StatusCode::Generic(g) => Some(g),
        _ => None,
    }
}

/// Get Log Page of `bytes` into the data area at 0; the page.
fn get_log(admin: &mut HostQueue, lid: u8, bytes: u32) -> Vec<u8> {
    let numd = bytes / 4 - 1;
    let mut s = admin_cmd(0x02, 0xFFFF_FFFF, u32::from(lid) | (numd << 16), 0);
    s.set_sgl1(admin.keyed(0, bytes));
    admin.write_data(0, &vec![0xEE; bytes as usize]);
    let c = admin.exec(s, &[]).unwrap();
    assert!(c.status.is_success(), "log {lid:#x}: {c:?}");
    admin.read_data(0, bytes as usize)
}

/// Identify with `cns` for `nsid` into the data area at 0; the page.
fn identify(admin: &mut HostQueue, nsid: u32, cns: u32) -> Vec<u8> {
    let mut s = admin_cmd(0x06, nsid, cns, 0);
    s.set_sgl1(admin.keyed(0, 4096));
    admin.write_data(0, &[0xEE; 4096]);
    let c = admin.exec(s, &[]).unwrap();
    assert!(c.status.is_success(), "identify cns {cns}: {c:?}");
    admin.read_data(0, 4096)
}

fn smart(admin: &mut HostQueue) -> SmartLog {
    SmartLog::decode(&get_log(admin, 0x02, 512)).unwrap()
}

/// Reads `blocks` at `lba` of namespace 1 by keyed SGL into the data area at `at`.
fn read(io: &mut HostQueue, lba: u64, blocks: u32, at: usize) -> Vec<u8> {
    let len = blocks * BLOCK;
    io.write_data(at, &vec![0x5A; len as usize]);
    let c = io
        .exec(rw(0x02, lba, blocks, io.keyed(at, len)), &[])
        .unwrap();
    assert!(c.status.is_success(), "{c:?}");
    io.read_data(at, len as usize)
}

pub(crate) fn commands(fabric: SoftFabric) {
    let rig = Rig::new(fabric);
    let (mut admin, _, mut io) = rig.controller();

    // Identify Namespace 1, the active namespace list, the descriptors of namespace 1.
    let ns = IdentifyNamespace::decode(&identify(&mut admin, 1, 0)).unwrap();
    assert_eq!(ns.nsze, BLOCKS);
    assert_eq!(ns.block_size(), Some(BLOCK));
    let list = NsList::decode(&identify(&mut admin, 0, 2)).unwrap();
    assert_eq!(list.as_slice(), &[1, 2]);
    let list = NsList::decode(&identify(&mut admin, 1, 2)).unwrap();
    assert_eq!(list.as_slice(), &[2]);
    // Namespace 1 has no NGUID or UUID configured: the command set identifier only.
    let descriptors = NsIdDescriptor::decode_list(&identify(&mut admin, 1, 3)).unwrap();
    assert_eq!(descriptors, vec![NsIdDescriptor::Csi(0)]);

    // Features round-trip: Arbitration, Power Management, Volatile Write Cache, Async Event
    // Configuration, Keep Alive Timer.
    for (fid, value) in [
        (0x01u32, 0x0302_0107u32),
        (0x02, 0),
        (0x06, 0),
        (0x0B, 1 << 8),
        (0x0F, 20_000),
        (0x06, 1),
    ] {
        let c = admin.exec(admin_cmd(0x09, 0, fid, value), &[]).unwrap();
        assert!(c.status.is_success(), "set fid {fid:#x}: {c:?}");
        let c = admin.exec(admin_cmd(0x0A, 0, fid, 0), &[]).unwrap();
        assert!(c.status.is_success(), "get fid {fid:#x}: {c:?}");
        assert_eq!(c.dw0, value, "fid {fid:#x}");
    }

    // Keep Alive.
    let c = admin.exec(admin_cmd(0x18, 0, 0, 0), &[]).unwrap();
    assert!(c.status.is_success(), "{c:?}");
    // Abort of a command that is not outstanding: answered, DW0 bit 0 set (not aborted).
    let c = admin
        .exec(admin_cmd(0x08, 0, 1 | (0x77 << 16), 0), &[])
        .unwrap();
    assert!(c.status.is_success(), "{c:?}");
    assert_eq!(c.dw0 & 1, 1, "{c:?}");

    let before = smart(&mut admin);

    // Write 8 blocks (keyed), Compare: match, then a mismatch (in capsule).
    let data = pattern(0x42, 4096);
    io.write_data(0, &data);
    let c = io.exec(rw(0x01, 16, 8, io.keyed(0, 4096)), &[]).unwrap();
    assert!(c.status.is_success(), "{c:?}");
    let c = io.exec(rw(0x05, 16, 8, io.keyed(0, 4096)), &[]).unwrap();
    assert!(c.status.is_success(), "compare, same data: {c:?}");
    let mut other = data.clone();
    other[1000] ^= 0xFF;
    let in_capsule = SglDescriptor::DataBlockOffset {
        offset: 0,
        length: 4096,
    };
    let c = io.exec(rw(0x05, 16, 8, in_capsule), &other).unwrap();
    assert_eq!(
        c.status.code,
        StatusCode::Media(MediaStatus::CompareFailure),
        "{c:?}"
    );

    // Write Zeroes over block 17: reads back zeroes, its neighbours kept.
    let c = io.exec(rw(0x08, 17, 1, SglDescriptor::NULL), &[]).unwrap();
    assert!(c.status.is_success(), "{c:?}");
    let back = read(&mut io, 16, 8, 8192);
    assert!(back[..512] == data[..512], "block 16 kept");
    assert!(back[512..1024].iter().all(|b| *b == 0), "block 17 zeroed");
    assert!(back[1024..] == data[1024..], "blocks 18.. kept");

    // Dataset Management, deallocate blocks 20..22 (ranges in the capsule): read as zeroes.
    let mut ranges = [0u8; 16];
    DsmRange {
        context_attributes: 0,
        length: 2,
        slba: 20,
    }
    .encode_into(&mut ranges)
    .unwrap();
    let mut dsm = Sqe::new(0x09, 0, 1);
    dsm.cdw10 = 0;
    dsm.cdw11 = 1 << 2;
    dsm.set_sgl1(SglDescriptor::DataBlockOffset {
        offset: 0,
        length: 16,
    });
    let c = io.exec(dsm, &ranges).unwrap();
    assert!(c.status.is_success(), "{c:?}");
    let back = read(&mut io, 16, 8, 8192);
    assert!(
        back[2048..3072].iter().all(|b| *b == 0),
        "20..22 deallocated"
    );
    assert!(back[3072..] == data[3072..], "22.. kept");
    assert!(back[1024..2048] == data[1024..2048], "18..20 kept");

    // SMART counts the write (a data unit is 1000 blocks of 512 bytes, rounded up).
    let after = smart(&mut admin);
    assert!(
        after.host_write_commands > before.host_write_commands,
        "{before:?} {after:?}"
    );
    assert!(
        after.data_units_written > before.data_units_written,
        "{before:?} {after:?}"
    );
    assert!(after.host_read_commands > before.host_read_commands);

    // Unsupported opcodes: Invalid Command Opcode, admin and I/O.
    let c = admin.exec(admin_cmd(0x7C, 0, 0, 0), &[]).unwrap();
    assert_eq!(generic(&c), Some(GenericStatus::InvalidOpcode), "{c:?}");
    let c = io.exec(rw(0x7D, 0, 1, SglDescriptor::NULL), &[]).unwrap();
    assert_eq!(generic(&c), Some(GenericStatus::InvalidOpcode), "{c:?}");

    // Over MDTS (128 KiB): 257 blocks into a 128 KiB buffer: Invalid Field, no data moved.
    let mdts = 256 * BLOCK;
    io.write_data(0, &vec![0x77; mdts as usize]);
    let c = io.exec(rw(0x02, 0, 257, io.keyed(0, mdts)), &[]).unwrap();
    assert_eq!(generic(&c), Some(GenericStatus::InvalidField), "{c:?}");
    assert!(io.read_data(0, mdts as usize) == vec![0x77; mdts as usize]);
    // A keyed SGL itself over MDTS is refused by the transport before the NVMe layer sees
    // the command (as SPDK does): SGL Data Block Length Invalid.
    let len = 257 * BLOCK;
    let c = io.exec(rw(0x02, 0, 257, io.keyed(0, len)), &[]).unwrap();
    assert_eq!(
        generic(&c),
        Some(GenericStatus::DataSglLengthInvalid),
        "{c:?}"
    );

    // The error information log holds the compare failure (newest entries first).
    let page = get_log(&mut admin, 0x01, 64 * 8);
    let entries: Vec<ErrorLogEntry> = page
        .chunks(64)
        .map(|e| ErrorLogEntry::decode(e).unwrap())
        .collect();
    assert!(
        entries.iter().any(|e| e.sqid == 1 && e.opcode == 0x05),
        "{entries:?}"
    );
    // Five errors so far: compare, two bad opcodes, two over MDTS; the newest first.
    assert_eq!(entries[0].error_count, 5, "{entries:?}");
    assert_eq!(entries[0].opcode, 0x02, "{entries:?}");
    assert_eq!(smart(&mut admin).error_log_entries, 5);

    // Block I/O failing when it completes (namespace 2, EIO): Unrecovered Read Error and
    // Write Fault, logged as the errors above are, and counted as media errors.
    rig.gate_failing.store(true, Ordering::Release);
    for (opcode, status) in [
        (0x02, MediaStatus::UnrecoveredReadError),
        (0x01, MediaStatus::WriteFault),
    ] {
        let mut sqe = rw(opcode, 0, 1, io.keyed(0, BLOCK));
        sqe.nsid = 2;
        let c = io.exec(sqe, &[]).unwrap();
        assert_eq!(c.status.code, StatusCode::Media(status), "{c:?}");
    }
    rig.gate_failing.store(false, Ordering::Release);
    let page = get_log(&mut admin, 0x01, 64 * 2);
    let newest = ErrorLogEntry::decode(&page[..64]).unwrap();
    assert_eq!(
        (newest.error_count, newest.opcode, newest.nsid, newest.sqid),
        (7, 0x01, 2, 1),
        "{newest:?}"
    );
    let health = smart(&mut admin);
    assert_eq!((health.error_log_entries, health.media_errors), (7, 2));

    // The queues still work.
    assert!(read(&mut io, 16, 1, 0)[..] == data[..512]);
}

/// Abort of a write held in the block device (namespace 2's gate): it is executing, so the
/// Abort is declined (DW0 bit 0 set), answered while the write is in flight (not queued
/// behind it); the write then completes successfully.
pub(crate) fn abort_outstanding(fabric: SoftFabric) {
    let rig = Rig::new(fabric);
    let (mut admin, _, mut io) = rig.controller();
    rig.gate.store(false, Ordering::Release);
    io.write_data(0, &pattern(0x11, 4096));
    let mut write = rw(0x01, 0, 8, io.keyed(0, 4096));
    write.nsid = 2;
    io.send_only(write);
    let cid = io.last_cid();
    wait_until("the write's block I/O in flight", || {
        io.poll_once();
        rig.usage_full().3 == 1
    });
    let abort = admin
        .exec(admin_cmd(0x08, 0, 1 | (u32::from(cid) << 16), 0), &[])
        .unwrap();
    assert!(abort.status.is_success(), "{abort:?}");
    assert_eq!(
        rig.gate_reaped.load(Ordering::Acquire),
        0,
        "still in flight"
    );
    rig.gate.store(true, Ordering::Release);
    let c = io.wait_response();
    assert_eq!(c.cid, cid);
    assert_eq!(
        abort.dw0 & 1,
        1,
        "an executing command is not aborted: {abort:?}"
    );
    assert!(c.status.is_success(), "declined abort: {c:?}");
    drop(io);
    drop(admin);
    wait_until("everything back", || {
        rig.usage() == (0, crate::BUFFERS * crate::REACTORS as u32, 0)
    });
}

/// Abort of a write waiting for data buffers (eight 64 KiB writes held in the block device
/// own all of the group's buffers): the victim is answered Command Abort Requested and the
/// Abort reports it aborted (DW0 bit 0 clear); the held writes then complete, and every
/// buffer, slot and request goes back.
pub(crate) fn abort_waiting(fabric: SoftFabric) {
    let rig = Rig::new(fabric);
    let (mut admin, _, mut io) = rig.controller();
    rig.gate.store(false, Ordering::Release);
    const BIG: usize = 64 * 1024;
    let mut held = Vec::new();
    for i in 0..8 {
        let mut write = rw(0x01, (i * 128) as u64, 128, io.keyed(i * BIG, BIG as u32));
        write.nsid = 2;
        held.push(io.send_tracked(write));
    }
    wait_until("eight writes held in the block device", || {
        io.poll_once();
        rig.usage_full().3 == 8
    });
    let victim = io.send_tracked(rw(0x01, 0, 8, io.keyed(8 * BIG, 4096)));
    wait_until("the fifth write waiting for buffers", || {
        io.poll_once();
        rig.waiting().buffers == 1
    });
    let abort = admin
        .exec(admin_cmd(0x08, 0, 1 | (u32::from(victim) << 16), 0), &[])
        .unwrap();
    assert!(abort.status.is_success(), "{abort:?}");
    assert_eq!(abort.dw0 & 1, 0, "aborted: {abort:?}");
    let c = io.collect(1)[0];
    assert_eq!(c.cid, victim, "{c:?}");
    assert_eq!(generic(&c), Some(GenericStatus::AbortRequested), "{c:?}");
    assert_eq!(rig.waiting(), Default::default());
    rig.gate.store(true, Ordering::Release);
    let done = io.collect(8);
    for cid in held {
        let c = done.iter().find(|c| c.cid == cid).expect("answered");
        assert!(c.status.is_success(), "{c:?}");
    }
    drop(io);
    drop(admin);
    wait_until("everything back", || {
        rig.usage() == (0, crate::BUFFERS * crate::REACTORS as u32, 0)
    });
}

/// Abort of a write whose RDMA READ waits for read depth (soft TCP: the host answers READs only
/// when it polls, and this queue granted one READ at a time): the waiting write is aborted
/// (Command Abort Requested, DW0 bit 0 clear); the write ahead of it, whose READ is on the
/// wire, completes once the host polls.
pub(crate) fn abort_waiting_for_read_depth() {
    let rig = Rig::new(SoftFabric::Tcp);
    let mut admin = HostQueue::connect(rig.addr, 0, 32);
    let cntlid = connect(&mut admin, 0, CNTLID_DYNAMIC);
    enable(&mut admin);
    let mut io = HostQueue::connect_reads(rig.addr, 1, 32, 1);
    connect(&mut io, 1, cntlid);
    io.write_data(0, &pattern(0x21, 8192));
    let first = io.send_tracked(rw(0x01, 0, 8, io.keyed(0, 4096)));
    let victim = io.send_tracked(rw(0x01, 8, 8, io.keyed(4096, 4096)));
    // No polling on this queue: the first READ stays unanswered, the second waits for depth.
    wait_until("the second write's READ waiting for read depth", || {
        rig.waiting().to_post == 1
    });
    let abort = admin
        .exec(admin_cmd(0x08, 0, 1 | (u32::from(victim) << 16), 0), &[])
        .unwrap();
    assert!(abort.status.is_success(), "{abort:?}");
    assert_eq!(abort.dw0 & 1, 0, "aborted: {abort:?}");
    let answers = io.collect(2);
    let by_cid = |cid| *answers.iter().find(|c| c.cid == cid).unwrap();
    assert_eq!(
        generic(&by_cid(victim)),
        Some(GenericStatus::AbortRequested),
        "{answers:?}"
    );
    assert!(by_cid(first).status.is_success(), "{answers:?}");
    drop(io);
    drop(admin);
    wait_until("everything back", || {
        rig.usage() == (0, crate::BUFFERS * crate::REACTORS as u32, 0)
    });
}
