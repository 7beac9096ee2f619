//! Seed inputs of `fuzz_host_queue_hostile_target`, one per scenario that random bytes reach only
//! slowly (commands of every kind answered well, windows invalidated by the target, a target
//! that holds its receives back, answers under another CID, a second answer while the host's
//! SEND completions are held, a target that disconnects), so that
//! a short run starts from them. `fuzz/seeds/fuzz_host_queue_hostile_target/` holds them as
//! files, which `scripts/fuzz.sh` gives the fuzzer; the test `seed_files_are_current` keeps
//! those files equal to what this module builds (`NVMF_WRITE_SEEDS=1` rewrites them). Each must
//! keep the rules.

use super::{
    FLAG_0, FLAG_1, FLAG_2, OP_ANSWER, OP_CONNECT, OP_DISCONNECT, OP_POLL, OP_RAW, OP_RECEIVES,
    OP_SETTLE, OP_SUBMIT,
};

/// Submit kinds (operation 1's first byte).
const KEYED_READ: u8 = 0;
const KEYED_WRITE: u8 = 1;
const IN_CAPSULE: u8 = 2;
const FLUSH: u8 = 3;
/// Kind bit 2: `submit_lazy`.
const LAZY: u8 = 4;

/// An I/O queue of depth 16 on `slot`, accepted as asked.
fn connect(slot: u8) -> Vec<u8> {
    vec![OP_CONNECT | slot << 3, 0, 15]
}

fn submit(slot: u8, flags: u8, kind: u8, seed: u8) -> Vec<u8> {
    vec![OP_SUBMIT | slot << 3 | flags, kind, 3, 40, seed]
}

fn answer(slot: u8, flags: u8, which: u8) -> Vec<u8> {
    vec![OP_ANSWER | slot << 3 | flags, which, 0, 0x33]
}

/// Every seed, by file name, each preceded by the side byte.
pub fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    let mut out = Vec::new();
    for (side, suffix) in [(0u8, "inproc"), (1, "silent"), (2, "tcp"), (3, "spread")] {
        let mut every_kind = vec![side];
        every_kind.extend(connect(0));
        for (n, kind) in [KEYED_READ, KEYED_WRITE, IN_CAPSULE, FLUSH]
            .into_iter()
            .enumerate()
        {
            every_kind.extend(submit(0, FLAG_2, kind, n as u8));
        }
        every_kind.extend([OP_POLL, 2]);
        for _ in 0..4 {
            every_kind.extend(answer(0, 0, 0));
        }
        every_kind.extend([OP_POLL | FLAG_0, 7]);
        out.push((name("every_kind", suffix), every_kind));

        // The host's SEND completions held: the target's answer completes first, and a second
        // response for the same command finds it answered already (the queue is lost).
        let mut twice = vec![side];
        twice.extend(connect(0));
        // A first command settled: over soft TCP the data connection is attached by then.
        twice.extend(submit(0, FLAG_2, FLUSH, 0));
        twice.extend([OP_SETTLE, OP_RECEIVES | FLAG_1]);
        twice.extend(submit(0, FLAG_2, FLUSH, 1));
        twice.extend([OP_POLL, 3]);
        twice.extend(answer(0, 0, 0));
        twice.extend([OP_POLL, 3, OP_RAW | FLAG_0, 16]);
        twice.extend([0u8; 16]);
        twice.extend([OP_POLL, 2, OP_SETTLE]);
        out.push((name("answered_twice", suffix), twice));

        let mut windows = vec![side];
        windows.extend(connect(1));
        windows.extend(submit(1, FLAG_1, KEYED_READ, 1));
        windows.extend(submit(1, FLAG_1 | FLAG_2, KEYED_WRITE, 2));
        windows.extend([OP_POLL | 1 << 3, 1]);
        windows.extend(answer(1, FLAG_2, 0));
        windows.extend(answer(1, 0, 0));
        windows.extend(submit(1, FLAG_1 | FLAG_2, KEYED_READ, 3));
        windows.extend([OP_SETTLE]);
        out.push((name("windows", suffix), windows));

        // The target stops re-posting receives, answers half of what came, and the host's next
        // commands wait on RNR (their capsule slots read when they go).
        let mut held = vec![side];
        held.extend(connect(0));
        held.extend([OP_RECEIVES | FLAG_0]);
        for n in 0..16 {
            held.extend(submit(0, FLAG_2, n % 4, n));
        }
        held.extend([OP_POLL, 7]);
        for _ in 0..8 {
            held.extend(answer(0, 0, 0));
        }
        held.extend([OP_POLL, 7]);
        for n in 0..8 {
            held.extend(submit(0, 0, n % 4, n));
        }
        held.extend([OP_POLL, 7, OP_POLL, 7]);
        held.extend([OP_SETTLE]);
        out.push((name("held_receives", suffix), held));

        // A poller driving three queues of one group through its ready list.
        let ready = ready_list(
            side,
            &[0, 1, 2].map(|slot| [OP_CONNECT | slot << 3, 0, 7]),
            2,
        );
        out.push((name("ready_list", suffix), ready));

        // Commands submitted in a row, on two queues of the group, go out in one poll.
        let mut batched = vec![side];
        batched.extend(connect(0));
        batched.extend(connect(1));
        for n in 0..12 {
            batched.extend(submit(n & 1, 0, n % 4, n));
        }
        batched.extend([OP_SETTLE]);
        out.push((name("batched", suffix), batched));

        let mut misdirected = vec![side];
        misdirected.extend(connect(0));
        misdirected.extend(submit(0, FLAG_2, KEYED_READ, 1));
        misdirected.extend(submit(0, FLAG_2, KEYED_WRITE, 2));
        misdirected.extend(submit(0, FLAG_0 | FLAG_2, KEYED_READ, 3));
        misdirected.extend([OP_POLL, 1]);
        misdirected.extend(answer(0, FLAG_0, 0));
        misdirected.extend([OP_SETTLE]);
        out.push((name("misdirected", suffix), misdirected));

        // CQEs of the target's own making for commands in flight: before their capsules came,
        // and again after their answers.
        let mut early = vec![side];
        early.extend(connect(0));
        for n in 0..3 {
            early.extend(submit(0, 0, n, n));
        }
        early.extend([OP_RAW | FLAG_0, 16]);
        early.extend([0x11; 16]);
        early.extend([OP_POLL, 3]);
        early.extend(answer(0, 0, 0));
        early.extend([OP_RAW | FLAG_0, 17]);
        early.extend([0x22; 16]);
        early.extend([OP_SETTLE]);
        out.push((name("early_answers", suffix), early));

        // A response longer than a CQE whose first 16 bytes name a command in flight: a
        // malformed response (the queue is lost), not that command's answer.
        let mut oversized = vec![side];
        oversized.extend(connect(0));
        oversized.extend(submit(0, FLAG_2, KEYED_READ, 1));
        oversized.extend([OP_POLL, 1, OP_RAW, 30]);
        let mut response = [0u8; 30];
        response[12..14].copy_from_slice(&1u16.to_le_bytes());
        oversized.extend(response);
        oversized.extend([OP_POLL, 3]);
        out.push((name("oversized_response", suffix), oversized));

        // A CID submitted again while its CQE waits in its queue's side (another queue's poll
        // reaped it): the queue must refuse it until the consumer polled the first.
        let mut reuse = vec![side];
        reuse.extend([OP_CONNECT | 1 << 3 | FLAG_0, 9, 13]);
        reuse.extend([OP_CONNECT, 0, 0]);
        reuse.extend(submit(0, FLAG_2, KEYED_READ, 1));
        reuse.extend([OP_RECEIVES | 1 << 3 | FLAG_0]);
        reuse.extend(answer(0, 0, 3));
        reuse.extend(submit(0, FLAG_0 | FLAG_1, KEYED_READ, 0));
        out.push((name("cid_reuse", suffix), reuse));

        // Connects the target refuses, accepts with garbage, or with a smaller CRQSIZE.
        let mut refused = vec![side];
        refused.extend([OP_CONNECT | FLAG_1, 0x04, 15]);
        refused.extend([OP_CONNECT | 1 << 3 | FLAG_1, 0x80, 15]);
        refused.extend([OP_CONNECT | 2 << 3 | FLAG_2, 0, 15, 5, 1, 2, 3, 4, 5]);
        refused.extend([OP_CONNECT | 3 << 3, 1, 0x9f]);
        for n in 0..4 {
            refused.extend(submit(3, FLAG_2, n, n));
        }
        refused.extend([OP_SETTLE]);
        out.push((name("connects", suffix), refused));

        // Lazy submissions send what the registered region holds: a Read's data the target
        // wrote there, then a Write's bytes copied there, each sent again by a lazy Write of the
        // same range (the command's chunk and range come back once the first is reported).
        let mut lazy = vec![side];
        lazy.extend(connect(0));
        lazy.extend(submit(0, FLAG_2, KEYED_READ, 1));
        lazy.extend([OP_POLL, 1]);
        lazy.extend(answer(0, 0, 0));
        lazy.extend([OP_POLL, 3]);
        lazy.extend(submit(0, FLAG_2, LAZY | KEYED_WRITE, 1));
        lazy.extend([OP_POLL, 1]);
        lazy.extend(answer(0, 0, 0));
        lazy.extend([OP_POLL, 3]);
        lazy.extend(submit(0, FLAG_2, KEYED_WRITE, 5));
        lazy.extend([OP_POLL, 1]);
        lazy.extend(answer(0, 0, 0));
        lazy.extend([OP_POLL | FLAG_0, 3]);
        lazy.extend(submit(0, FLAG_2, LAZY | IN_CAPSULE, 5));
        lazy.extend(submit(0, FLAG_1 | FLAG_2, LAZY | KEYED_READ, 2));
        lazy.extend(submit(0, FLAG_1 | FLAG_2, LAZY | KEYED_WRITE, 3));
        lazy.extend([OP_SETTLE]);
        out.push((name("lazy", suffix), lazy));

        // Queues of qid 1, 2 and 3 (spread: two reactors' groups) and an admin queue (the
        // control thread's), polled through their groups' ready lists.
        let groups = ready_list(
            side,
            &[
                [OP_CONNECT, 0, 7],
                [OP_CONNECT | 1 << 3, 1, 7],
                [OP_CONNECT | 2 << 3, 2, 7],
                [OP_CONNECT | 3 << 3 | FLAG_0, 0, 7],
            ],
            1,
        );
        out.push((name("groups", suffix), groups));

        // Windows the target did not invalidate (and one it did), each probed once its command
        // was reported: the key must be dead by then.
        // A response invalidating another command's window: the queue is lost, that response
        // never reported.
        let mut bogus = vec![side];
        bogus.extend(connect(0));
        bogus.extend(submit(0, FLAG_1, KEYED_READ, 1));
        bogus.extend(submit(0, FLAG_1 | FLAG_2, KEYED_WRITE, 2));
        bogus.extend([OP_POLL, 1]);
        bogus.extend([OP_ANSWER | FLAG_2, 0, 0, 0x80]);
        bogus.extend([OP_POLL, 3, OP_SETTLE]);
        // And one invalidating its own window under another CID (none in flight).
        bogus.extend(connect(1));
        bogus.extend(submit(1, FLAG_1 | FLAG_2, KEYED_READ, 3));
        bogus.extend([OP_POLL | 1 << 3, 1]);
        bogus.extend([OP_ANSWER | 1 << 3 | FLAG_0 | FLAG_2, 0, 0, 0x40]);
        bogus.extend([OP_POLL | 1 << 3, 3, OP_SETTLE]);
        out.push((name("bogus_invalidation", suffix), bogus));

        // (A probe that fails breaks its connection: one queue each.)
        let mut probed = vec![side];
        for (slot, kind, answer_flags) in [
            (0u8, KEYED_READ, 0u8),
            (1, KEYED_READ, FLAG_2),
            (2, KEYED_WRITE, 0),
        ] {
            // Depth 4: three queues fit the group's request objects.
            probed.extend([OP_CONNECT | slot << 3, 0, 3]);
            probed.extend(submit(slot, FLAG_1 | FLAG_2, kind, slot));
            probed.extend([OP_POLL | slot << 3, 1]);
            probed.extend(answer(slot, answer_flags, 0));
            probed.extend([OP_SETTLE, OP_RAW | slot << 3 | FLAG_1, 0]);
            probed.extend([OP_POLL | slot << 3, 3]);
        }
        out.push((name("probe", suffix), probed));

        let mut dropped = vec![side];
        dropped.extend(connect(0));
        dropped.extend(connect(1));
        dropped.extend(submit(0, FLAG_2, KEYED_READ, 1));
        dropped.extend(submit(1, FLAG_1 | FLAG_2, KEYED_WRITE, 2));
        dropped.extend([
            OP_POLL,
            1,
            OP_DISCONNECT | FLAG_0,
            OP_DISCONNECT | 1 << 3 | FLAG_1,
        ]);
        dropped.extend([OP_POLL, 7, OP_POLL | 1 << 3, 7]);
        out.push((name("target_gone", suffix), dropped));
    }
    // Found by the fuzzer: over soft TCP, a CQE of the target's own making completed a command
    // whose data goes through a window while the target's RDMA on that window was still to be
    // served by the host; the host ended the window first, so that RDMA failed (the target's
    // fault: the harness counts a stray CQE as a cause once windows are in play).
    out.push((
        "stray_cqe_window_tcp",
        include_bytes!("../../../fuzz/seeds/fuzz_host_queue_hostile_target/stray_cqe_window_tcp")
            .to_vec(),
    ));
    out
}

/// Queues connected by `connects` (depth 8: four fit a group's request objects), two commands
/// each, answered one queue at a time with a poller driving them through the ready lists;
/// then the target disconnects queue `gone` while the others finish.
fn ready_list(side: u8, connects: &[[u8; 3]], gone: u8) -> Vec<u8> {
    let mut seed = vec![side];
    for connect in connects {
        seed.extend(connect);
    }
    let queues = connects.len() as u8;
    for n in 0..2 * queues {
        seed.extend(submit(n % queues, FLAG_2, n % 4, n));
    }
    seed.extend([OP_POLL | FLAG_1, 2]);
    for n in 0..queues {
        seed.extend(answer(n, 0, 0));
        seed.extend([OP_POLL | FLAG_1, 1]);
    }
    seed.extend([
        OP_DISCONNECT | gone << 3 | FLAG_0,
        OP_POLL | FLAG_1 | FLAG_0,
        3,
    ]);
    seed.extend(answer(0, 0, 0));
    seed.extend([OP_POLL | FLAG_1 | FLAG_0, 3, OP_SETTLE]);
    seed
}

fn name(what: &str, side: &str) -> &'static str {
    Box::leak(format!("{what}_{side}").into_boxed_str())
}
