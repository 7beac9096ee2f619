//! In-capsule write data used in place: a write whose data came in the capsule executes from
//! its receive slot, which stays held (off the SRQ) while the block device may still read it,
//! also when its qpair goes meanwhile, and goes back once the block I/O is done.

use nvmf_protocol::SglDescriptor;
use nvmf_protocol::fabrics::CNTLID_DYNAMIC;
use nvmf_transport::SoftFabric;
use std::sync::atomic::Ordering;

use crate::host::{HostQueue, wait_until};
use crate::{BUFFERS, REACTORS, Rig, SRQ_DEPTH, SUBNQN, connect_sized, enable, pattern, rw};

const IN_CAPSULE: SglDescriptor = SglDescriptor::DataBlockOffset {
    offset: 0,
    length: 4096,
};

/// More in-capsule writes than the SRQ has slots, on `io`, to namespace 1 (malloc), each with
/// its own pattern: a slot re-posted too early would be overwritten by one of them. The last
/// one is read back.
fn flood(io: &mut HostQueue) {
    let count = SRQ_DEPTH as usize * 2 + 16;
    let mut last = Vec::new();
    for i in 0..count {
        last = pattern(i as u8, 4096);
        let c = io.exec(rw(0x01, 64, 8, IN_CAPSULE), &last).unwrap();
        assert!(c.status.is_success(), "flood write {i}: {c:?}");
    }
    io.write_data(8192, &[0; 4096]);
    let c = io.exec(rw(0x02, 64, 8, io.keyed(8192, 4096)), &[]).unwrap();
    assert!(c.status.is_success(), "{c:?}");
    assert!(
        io.read_data(8192, 4096) == last,
        "the flood's last write read back"
    );
}

/// The in-capsule data (after the 64-byte SQE) of the live requests holding a capsule of
/// 64 + `len` bytes, over the groups.
fn held_capsules(rig: &Rig, len: usize) -> Vec<Vec<u8>> {
    let tr = rig.tr.as_ref().unwrap();
    let mut out = Vec::new();
    for (_, found) in tr
        .each_group(move |g| {
            let pg = g.poll_group();
            let mut found = Vec::new();
            for qp_num in pg.qpair_nums() {
                for req in pg.requests_of(qp_num) {
                    let capsule = pg.capsule(req);
                    if capsule.len() == 64 + len {
                        found.push(capsule[64..].to_vec());
                    }
                }
            }
            found
        })
        .unwrap()
    {
        out.extend(found);
    }
    out
}

/// Capsules the groups received so far.
fn capsules_received(rig: &Rig) -> u64 {
    rig.reaped().1
}

/// Admin queue, then I/O queues 1..=3 of one controller. Placement is round robin over the
/// two reactors: I/O queue 3 shares its poll group (and SRQ) with I/O queue 1.
fn session(rig: &Rig, depth: u16) -> (HostQueue, [HostQueue; 3]) {
    let mut admin = HostQueue::connect(rig.addr, 0, depth);
    let cntlid = connect_sized(&mut admin, 0, CNTLID_DYNAMIC, SUBNQN, depth);
    enable(&mut admin);
    let ios = [1u16, 2, 3].map(|qid| {
        let mut io = HostQueue::connect(rig.addr, qid, depth);
        connect_sized(&mut io, qid, cntlid, SUBNQN, depth);
        io
    });
    (admin, ios)
}

/// In-capsule writes held in the block device (16 at once, 512 bytes each) keep their
/// receive slots (and take no data buffer) while a flood of capsules cycles through every
/// other slot of their SRQ; the bytes the device reads at completion are still the host's;
/// the slots go back after, every write answered.
pub(crate) fn held_in_place(fabric: SoftFabric) {
    const HELD: u32 = 16;
    let rig = Rig::new(fabric);
    let (mut admin, [mut io1, mut io2, mut io3]) = session(&rig, 32);
    let all = SRQ_DEPTH * REACTORS as u32;
    wait_until("every slot posted", || rig.recv_slots() == (all, 0, 0));

    rig.gate.store(false, Ordering::Release);
    let mut sent: Vec<Vec<u8>> = (0..HELD).map(|i| pattern(0xC0 + i as u8, 512)).collect();
    for (i, data) in sent.iter().enumerate() {
        let mut write = rw(
            0x01,
            i as u64,
            1,
            SglDescriptor::DataBlockOffset {
                offset: 0,
                length: 512,
            },
        );
        write.nsid = 2;
        io1.send_tracked_with(write, data);
    }
    wait_until("the in-capsule writes held in the block device", || {
        io1.poll_once();
        rig.usage_full().3 == HELD as usize
    });
    assert_eq!(rig.recv_slots(), (all - HELD, 0, HELD), "their slots held");
    // The session's Connect data (READ into a buffer) comes back when its answer's SEND is
    // retired: by its own completion or by the silent flush of an idle group, which over
    // soft TCP the host acknowledges when it polls (the held writes' answers cannot come
    // before the gate opens). Then every buffer is free: the held writes took none.
    wait_until("no data buffer taken", || {
        for queue in [&mut admin, &mut io1, &mut io2, &mut io3] {
            queue.poll_once();
        }
        rig.usage().1 == BUFFERS * REACTORS as u32
    });

    flood(&mut io3);
    wait_until("the flood's slots back", || rig.recv_slots().1 == 0);
    assert_eq!(
        rig.recv_slots(),
        (all - HELD, 0, HELD),
        "still held after the flood"
    );
    let mut held = held_capsules(&rig, 512);
    held.sort();
    sent.sort();
    assert!(held == sent, "the held slots still carry the writes' data");

    rig.gate.store(true, Ordering::Release);
    for c in io1.collect(HELD as usize) {
        assert!(c.status.is_success(), "{c:?}");
    }
    wait_until("the slots back on the SRQ", || {
        rig.recv_slots() == (all, 0, 0)
    });
    drop((io1, io2, io3, admin));
    wait_until("everything back", || {
        rig.usage() == (0, BUFFERS * REACTORS as u32, 0) && rig.recv_slots() == (all, 0, 0)
    });
}

/// The qpair of an in-capsule write held in the block device goes: the request is orphaned
/// but its slot stays held (a flood on the same SRQ does not get it) until the block device
/// is done, then it goes back to the SRQ.
pub(crate) fn qpair_gone_while_held(fabric: SoftFabric) {
    let rig = Rig::new(fabric);
    let (mut admin, [mut io1, mut io2, mut io3]) = session(&rig, 32);
    let all = SRQ_DEPTH * REACTORS as u32;
    wait_until("every slot posted", || rig.recv_slots() == (all, 0, 0));

    rig.gate.store(false, Ordering::Release);
    let mut write = rw(0x01, 0, 8, IN_CAPSULE);
    write.nsid = 2;
    io1.send_only_with(write, &pattern(0x5A, 4096));
    wait_until("the in-capsule write held in the block device", || {
        io1.poll_once();
        rig.usage_full().3 == 1
    });
    io1.disconnect();
    // The other queues' answers went silent: their flushes are acknowledged as the host polls.
    wait_until("the qpair gone, its write still held", || {
        for queue in [&mut admin, &mut io2, &mut io3] {
            queue.poll_once();
        }
        let (reqs, _, queues, pending, qpairs) = rig.usage_full();
        qpairs == 3 && reqs == 1 && pending == 1 && queues == 4
    });
    assert_eq!(rig.recv_slots(), (all - 1, 0, 1), "its slot held");

    flood(&mut io3);
    wait_until("the flood's slots back", || rig.recv_slots().1 == 0);
    assert_eq!(
        rig.recv_slots(),
        (all - 1, 0, 1),
        "not re-posted while the block device may read it"
    );

    rig.gate.store(true, Ordering::Release);
    wait_until("the write finished, its slot back on the SRQ", || {
        for queue in [&mut admin, &mut io2, &mut io3] {
            queue.poll_once();
        }
        let (reqs, _, queues, pending, _) = rig.usage_full();
        reqs == 0 && pending == 0 && queues == 3 && rig.recv_slots() == (all, 0, 0)
    });
    drop((io1, io2, io3, admin));
    wait_until("everything back", || {
        rig.usage() == (0, BUFFERS * REACTORS as u32, 0) && rig.recv_slots() == (all, 0, 0)
    });
}

/// The edge of the SRQ sizing rule (srq_depth = max_queue_depth): one qpair's full queue of
/// in-capsule writes held in the block device holds every slot of its group's SRQ. Another
/// qpair of that group is starved only until the block device completes (its command waits
/// in the host's RNR retries), never deadlocked: the held slots wait on nothing but their
/// own block I/O.
pub(crate) fn srq_all_held(fabric: SoftFabric) {
    const DEPTH: u32 = 16;
    let rig = Rig::with_group(fabric, |g| {
        g.srq_depth = DEPTH;
        g.max_queue_depth = DEPTH;
    });
    let (admin, [mut io1, io2, mut io3]) = session(&rig, DEPTH as u16);
    let all = DEPTH * REACTORS as u32;
    wait_until("every slot posted", || rig.recv_slots() == (all, 0, 0));

    rig.gate.store(false, Ordering::Release);
    for i in 0..DEPTH {
        let mut write = rw(
            0x01,
            u64::from(i),
            1,
            SglDescriptor::DataBlockOffset {
                offset: 0,
                length: 512,
            },
        );
        write.nsid = 2;
        io1.send_tracked_with(write, &pattern(i as u8, 512));
    }
    wait_until("a full queue of in-capsule writes held", || {
        io1.poll_once();
        rig.usage_full().3 == DEPTH as usize
    });
    assert_eq!(rig.recv_slots(), (all - DEPTH, 0, DEPTH), "one SRQ empty");

    // io3 shares io1's group: its write finds no receive until the gate opens.
    let capsules = capsules_received(&rig);
    let data = pattern(0x77, 512);
    io3.send_tracked_with(
        rw(
            0x01,
            100,
            1,
            SglDescriptor::DataBlockOffset {
                offset: 0,
                length: 512,
            },
        ),
        &data,
    );
    for _ in 0..50 {
        io3.poll_once();
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert_eq!(rig.recv_slots(), (all - DEPTH, 0, DEPTH), "still starved");
    assert_eq!(
        capsules_received(&rig),
        capsules,
        "no receive for io3's write yet"
    );

    rig.gate.store(true, Ordering::Release);
    for c in io1.collect(DEPTH as usize) {
        assert!(c.status.is_success(), "{c:?}");
    }
    let c = io3.collect(1)[0];
    assert!(
        c.status.is_success(),
        "the starved write went through: {c:?}"
    );
    io3.write_data(8192, &[0; 512]);
    let c = io3
        .exec(rw(0x02, 100, 1, io3.keyed(8192, 512)), &[])
        .unwrap();
    assert!(c.status.is_success(), "{c:?}");
    assert!(
        io3.read_data(8192, 512) == data,
        "the starved write read back"
    );
    drop((io1, io2, io3, admin));
    wait_until("everything back", || {
        rig.usage() == (0, BUFFERS * REACTORS as u32, 0) && rig.recv_slots() == (all, 0, 0)
    });
}
