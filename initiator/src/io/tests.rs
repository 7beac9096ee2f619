//! Asynchronous I/O against the loopback fake: data paths, typed statuses, stale CIDs,
//! connection loss mid-I/O and timeouts.

use std::time::Duration;

use nvmf_protocol::IoOpcode;
use nvmf_protocol::status::{GenericStatus, MediaStatus, StatusCode};

use super::*;
use crate::controller::tests::attach;
use crate::controller::{Controller, ReconnectPolicy};
use crate::loopback::{LoopbackConfig, LoopbackFabric, LoopbackTarget};

fn setup() -> (
    LoopbackTarget,
    Controller<LoopbackFabric>,
    crate::clock::VirtualClock,
) {
    let (t, c, clock) = attach(LoopbackConfig::default(), |o| {
        o.reconnect = ReconnectPolicy::never();
        o.io_timeout = Duration::from_secs(3);
    });
    (t, c.unwrap(), clock)
}

/// Poll until `n` completions arrived (bounded so a bug fails instead of hanging).
fn collect(
    q: &mut IoQueue<crate::loopback::LoopbackQueue>,
    n: usize,
) -> Vec<(IoCompletion, Vec<u8>)> {
    let mut out = Vec::new();
    for _ in 0..1000 {
        q.poll(|c, d| out.push((c, d.to_vec())));
        if out.len() >= n {
            break;
        }
    }
    out
}

#[test]
fn write_then_read_with_tokens_in_capsule_and_keyed() {
    let (target, mut c, _) = setup();
    let ns = c.namespace(1).unwrap().target();
    let q = c.io_queue_mut(0).unwrap();
    // 8 blocks = 4096 bytes: fits the in-capsule limit. 16 blocks: keyed SGL.
    q.submit_write(&ns, 0, 8, 1, |s| s.fill(0xaa)).unwrap();
    q.submit_write(&ns, 8, 16, 2, |s| s.fill(0xbb)).unwrap();
    let done = collect(q, 2);
    assert_eq!(
        done.iter()
            .map(|(c, _)| (c.token, c.kind, c.result.clone()))
            .collect::<Vec<_>>(),
        vec![(1, IoKind::Write, Ok(())), (2, IoKind::Write, Ok(()))]
    );
    assert_eq!(q.stats().in_capsule_writes, 1);
    assert_eq!(
        (
            target.stats().in_capsule_writes,
            target.stats().keyed_writes
        ),
        (1, 1)
    );
    q.submit_read(&ns, 4, 8, 3).unwrap();
    let done = collect(q, 1);
    let data = &done[0].1;
    assert_eq!(data.len(), 4096);
    assert!(data[..2048].iter().all(|&b| b == 0xaa) && data[2048..].iter().all(|&b| b == 0xbb));
}

#[test]
fn unfilled_writes_carry_what_their_slot_holds() {
    let (target, mut c, _) = setup();
    let ns = c.namespace(1).unwrap().target();
    let q = c.io_queue_mut(0).unwrap();
    // Nothing in flight: each command takes the first free slot, which the fill left 0x5e.
    q.submit_write(&ns, 0, 16, 1, |s| s.fill(0x5e)).unwrap();
    collect(q, 1);
    q.submit_write_unfilled(&ns, 16, 8, 2).unwrap();
    collect(q, 1);
    q.submit_write_unfilled(&ns, 24, 16, 3).unwrap();
    let done = collect(q, 1);
    assert_eq!(done[0].0.result, Ok(()));
    assert_eq!(
        (
            target.stats().in_capsule_writes,
            target.stats().keyed_writes
        ),
        (1, 2),
        "one in the capsule, the others by keyed SGL"
    );
    q.submit_read(&ns, 16, 24, 4).unwrap();
    let done = collect(q, 1);
    assert!(done[0].1.iter().all(|&b| b == 0x5e));
}

#[test]
fn lazy_poll_hands_read_data_on_demand_and_nothing_for_other_commands() {
    let (target, mut c, _) = setup();
    let ns = c.namespace(1).unwrap().target();
    let q = c.io_queue_mut(0).unwrap();
    q.submit_write(&ns, 0, 8, 1, |s| s.fill(0x3c)).unwrap();
    q.submit_read(&ns, 0, 8, 2).unwrap();
    target.fail_next_io(Status::generic(GenericStatus::LbaOutOfRange).with_dnr());
    let mut seen = Vec::new();
    for _ in 0..100 {
        q.poll_lazy(|c, mut data| {
            let bytes = data.bytes().unwrap().to_vec();
            seen.push((c.token, c.result.is_ok(), data.len(), bytes));
        });
        if seen.len() == 2 {
            break;
        }
    }
    assert_eq!(
        seen,
        vec![(1, true, 0, vec![]), (2, true, 4096, vec![0x3c; 4096])]
    );
    q.submit_read(&ns, 0, 8, 3).unwrap();
    let mut failed = Vec::new();
    for _ in 0..100 {
        q.poll_lazy(|c, data| failed.push((c.token, c.result.is_err(), data.is_empty())));
        if !failed.is_empty() {
            break;
        }
    }
    assert_eq!(
        failed,
        vec![(3, true, true)],
        "a failed read brings no data"
    );
}

#[test]
fn compare_write_zeroes_deallocate_and_flush() {
    let (target, mut c, _) = setup();
    let ns = c.namespace(1).unwrap().target();
    let q = c.io_queue_mut(0).unwrap();
    q.submit_write(&ns, 10, 4, 1, |s| s.fill(7)).unwrap();
    collect(q, 1);
    q.submit_compare(&ns, 10, 4, 2, |s| s.fill(7)).unwrap();
    q.submit_compare(&ns, 10, 4, 3, |s| s.fill(8)).unwrap();
    let done = collect(q, 2);
    assert_eq!(done[0].0.result, Ok(()));
    let status = done[1].0.result.clone().unwrap_err().status().unwrap();
    assert_eq!(status.code, StatusCode::Media(MediaStatus::CompareFailure));
    q.submit_write_zeroes(&ns, 10, 1, 4).unwrap();
    q.submit_deallocate(&ns, &[(12, 1), (13, 1)], 5).unwrap();
    q.submit_flush(1, 6).unwrap();
    let done = collect(q, 3);
    assert!(done.iter().all(|(c, _)| c.result.is_ok()), "{done:?}");
    assert_eq!(
        target.read_namespace(1, 10 * 512..14 * 512),
        [vec![0; 512], vec![7; 512], vec![0; 1024]].concat()
    );
    let ops = target.stats().io_opcodes;
    assert_eq!(
        &ops[ops.len() - 3..],
        &[
            IoOpcode::WriteZeroes.raw(),
            IoOpcode::DatasetManagement.raw(),
            IoOpcode::Flush.raw()
        ]
    );
}

#[test]
fn nvme_errors_come_back_typed_and_bad_arguments_never_reach_the_wire() {
    let (target, mut c, _) = setup();
    let ns = c.namespace(1).unwrap().target();
    let q = c.io_queue_mut(0).unwrap();
    target.fail_next_io(Status::generic(GenericStatus::LbaOutOfRange).with_dnr());
    q.submit_read(&ns, 0, 1, 9).unwrap();
    let done = collect(q, 1);
    match &done[0].0.result {
        Err(Error::Nvme {
            command: "Read",
            status,
        }) => {
            assert_eq!(
                status.code,
                StatusCode::Generic(GenericStatus::LbaOutOfRange)
            );
            assert!(status.dnr);
        }
        other => panic!("{other:?}"),
    }
    let before = target.stats().commands;
    assert!(matches!(
        q.submit_read(&ns, ns.blocks, 1, 1),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        q.submit_read(&ns, 0, 0, 1),
        Err(Error::InvalidArgument(_))
    ));
    assert_eq!(target.stats().commands, before);
}
use nvmf_protocol::Status;

#[test]
fn late_duplicate_completion_for_a_reused_cid_is_dropped() {
    let (target, mut c, _) = setup();
    let ns = c.namespace(1).unwrap().target();
    let q = c.io_queue_mut(0).unwrap();
    target.duplicate_next_response();
    q.submit_write(&ns, 0, 1, 1, |s| s.fill(1)).unwrap();
    // The duplicate is queued behind the first answer; poll only the first.
    let mut first = Vec::new();
    q.poll(|c, _| first.push(c.token));
    // Both CQEs came in one poll: the second found its CID free and was dropped.
    assert_eq!(first, vec![1]);
    assert_eq!(q.stats().stale_completions, 1);
    q.submit_read(&ns, 0, 1, 2).unwrap();
    let done = collect(q, 1);
    assert_eq!(done.len(), 1);
    assert_eq!(done[0].0.token, 2);
    assert_eq!(done[0].1, vec![1; 512]);
}

#[test]
fn connection_drop_mid_io_fails_every_request_once() {
    let (target, mut c, _) = setup();
    let ns = c.namespace(1).unwrap().target();
    let q = c.io_queue_mut(0).unwrap();
    target.drop_after(3);
    let mut submitted = Vec::new();
    let mut refused = 0;
    for token in 0..8u64 {
        match q.submit_read(&ns, token, 1, token) {
            Ok(()) => submitted.push(token),
            Err(Error::ConnectionLost(_)) => refused += 1,
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!((submitted.len(), refused), (3, 5));
    let done = collect(q, 3);
    let mut tokens: Vec<_> = done.iter().map(|(c, _)| c.token).collect();
    tokens.sort();
    assert_eq!(
        tokens, submitted,
        "each in-flight request completes exactly once"
    );
    assert!(
        done.iter()
            .all(|(c, _)| matches!(c.result, Err(Error::ConnectionLost(_))))
    );
    assert_eq!(q.in_flight(), 0);
    assert!(!q.is_connected());
    assert_eq!(q.poll(|_, _| panic!("nothing more")), 0);
    assert!(matches!(
        c.poll(),
        crate::controller::ControllerState::Failed(_)
    ));
}

#[test]
fn unanswered_command_times_out_and_fails_the_connection() {
    let (target, mut c, clock) = setup();
    let ns = c.namespace(1).unwrap().target();
    let q = c.io_queue_mut(0).unwrap();
    target.swallow_next(1);
    q.submit_read(&ns, 0, 1, 5).unwrap();
    assert_eq!(q.poll(|_, _| {}), 0);
    clock.advance(Duration::from_secs(3));
    let done = collect(q, 1);
    assert_eq!(done.len(), 1);
    match &done[0].0.result {
        Err(Error::ConnectionLost(why)) => assert!(why.contains("timed out"), "{why}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn queue_full_is_reported_not_blocked() {
    let (target, mut c, _) = setup();
    let ns = c.namespace(1).unwrap().target();
    let q = c.io_queue_mut(0).unwrap();
    target.swallow_next(u32::MAX);
    for t in 0..q.depth() as u64 {
        q.submit_read(&ns, 0, 1, t).unwrap();
    }
    assert_eq!(q.submit_read(&ns, 0, 1, 999), Err(Error::QueueFull));
}

#[test]
fn out_of_order_completions_find_their_requests() {
    let (target, mut c, _) = setup();
    let ns = c.namespace(1).unwrap().target();
    let q = c.io_queue_mut(0).unwrap();
    for lba in 0..4u64 {
        q.submit_write(&ns, lba, 1, lba, |s| s.fill(lba as u8 + 1))
            .unwrap();
    }
    collect(q, 4);
    target.reorder_responses(true);
    for lba in 0..4u64 {
        q.submit_read(&ns, lba, 1, 100 + lba).unwrap();
    }
    let done = collect(q, 4);
    let tokens: Vec<u64> = done.iter().map(|(c, _)| c.token).collect();
    assert_eq!(tokens, vec![103, 102, 101, 100]);
    for (c, data) in &done {
        assert_eq!(
            data,
            &vec![(c.token - 100) as u8 + 1; 512],
            "token {}",
            c.token
        );
    }
}

#[test]
fn per_io_keys_open_one_window_per_command_and_a_replayed_key_is_refused() {
    let config = LoopbackConfig {
        memory_windows: true,
        ..LoopbackConfig::default()
    };
    let (target, c, _) = attach(config, |o| {
        o.per_io_keys = true;
        o.in_capsule_data = false;
    });
    let mut c = c.unwrap();
    let ns = c.namespace(1).unwrap().target();
    let q = c.io_queue_mut(0).unwrap();
    q.submit_write(&ns, 0, 2, 1, |s| s.fill(0x42)).unwrap();
    q.submit_read(&ns, 0, 2, 2).unwrap();
    let done = collect(q, 2);
    assert!(done.iter().all(|(c, _)| c.result.is_ok()), "{done:?}");
    assert_eq!(done[1].1, vec![0x42; 1024]);
    assert_eq!(target.stats().window_transfers, 2);
}

#[test]
fn a_window_key_works_once_and_only_over_its_range() {
    use crate::queue::{HostQueue, QueueConnectParams, TransportAddress};
    use nvmf_protocol::nvm::ReadCmd;
    let config = LoopbackConfig {
        memory_windows: true,
        ..LoopbackConfig::default()
    };
    let (target, c, _) = attach(config, |_| {});
    let c = c.unwrap();
    // A raw I/O queue connected by hand, to replay an SQE.
    let raw = crate::loopback::LoopbackFabric::new(target.clone());
    let mut q = crate::queue::Fabric::connect(
        &raw,
        &QueueConnectParams {
            address: TransportAddress::loopback(),
            qid: 1,
            hrqsize: 8,
            hsqsize: 7,
            cntlid: c.cntlid(),
            data_region_len: 8192,
            in_capsule_data: 1024,
        },
    )
    .unwrap();
    let mut connect_data = [0u8; 1024];
    connect_data.copy_from_slice(
        &nvmf_protocol::fabrics::ConnectData {
            hostid: [7; 16],
            cntlid: c.cntlid(),
            subnqn: nvmf_protocol::FixedStr::new("nqn.2024-01.io.nvmf-rs:loopback", "s").unwrap(),
            hostnqn: nvmf_protocol::FixedStr::new(
                "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-000000000001",
                "h",
            )
            .unwrap(),
        }
        .to_bytes(),
    );
    q.region_bytes_mut()[..1024].copy_from_slice(&connect_data);
    let connect = nvmf_protocol::fabrics::ConnectCmd {
        cid: 1,
        recfmt: 0,
        qid: 1,
        sqsize: 7,
        cattr: 0,
        kato: 0,
        sgl: SglDescriptor::DataBlockOffset {
            offset: 0,
            length: 1024,
        },
    }
    .to_sqe();
    q.submit(&connect, Some(0..1024)).unwrap();
    let mut cqes = [nvmf_protocol::Cqe::success(0, 0, 0, 0); 4];
    assert_eq!(q.poll(&mut cqes).unwrap(), 1);
    assert!(cqes[0].status.is_success(), "{:?}", cqes[0].status);

    let (address, key) = q.bind_window(512..1024).unwrap().unwrap();
    let read = |cid, address, len| {
        ReadCmd {
            cid,
            nsid: 1,
            slba: 0,
            nlb: 0,
            control: RwControl::default(),
            dsm: 0,
            sgl: SglDescriptor::keyed(address, len, key, true).unwrap(),
        }
        .to_sqe()
    };
    // Past the window's end: refused even though the region is bigger.
    q.submit(&read(2, address + 8, 512), None).unwrap();
    let (address, key2) = q.bind_window(512..1024).unwrap().unwrap();
    let _ = key;
    let ok = ReadCmd {
        cid: 3,
        nsid: 1,
        slba: 0,
        nlb: 0,
        control: RwControl::default(),
        dsm: 0,
        sgl: SglDescriptor::keyed(address, 512, key2, true).unwrap(),
    }
    .to_sqe();
    q.submit(&ok, None).unwrap();
    // The same key again: invalidated by the first use.
    q.submit(&Sqe { cid: 4, ..ok }, None).unwrap();
    assert_eq!(q.poll(&mut cqes).unwrap(), 3);
    let generic_of = |c: &nvmf_protocol::Cqe| c.status.code;
    assert_eq!(
        generic_of(&cqes[0]),
        StatusCode::Generic(GenericStatus::DataTransferError)
    );
    assert!(cqes[1].status.is_success());
    assert_eq!(
        generic_of(&cqes[2]),
        StatusCode::Generic(GenericStatus::DataTransferError)
    );
}

#[test]
fn a_batch_shares_one_time_stamp_until_the_next_poll() {
    let (_target, mut c, clock) = setup();
    let ns = c.namespace(1).unwrap().target();
    let q = c.io_queue_mut(0).unwrap();
    let ms = Duration::from_millis(1);
    let latencies = |q: &mut IoQueue<crate::loopback::LoopbackQueue>| {
        let mut done: Vec<(u64, Duration)> = collect(q, 2)
            .iter()
            .map(|(c, _)| (c.token, c.latency))
            .collect();
        done.sort();
        done
    };
    q.begin_batch();
    q.submit_read(&ns, 0, 1, 1).unwrap();
    clock.advance(ms);
    q.submit_read(&ns, 1, 1, 2).unwrap();
    clock.advance(ms);
    // Both stamped at the batch's first submission.
    assert_eq!(latencies(q), vec![(1, 2 * ms), (2, 2 * ms)]);
    // The poll closed the batch: each submission reads the clock again.
    q.submit_read(&ns, 0, 1, 3).unwrap();
    clock.advance(ms);
    q.submit_read(&ns, 1, 1, 4).unwrap();
    clock.advance(ms);
    assert_eq!(latencies(q), vec![(3, 2 * ms), (4, ms)]);
}

/// A controller whose I/O queue registers `region` bytes for transfers of up to 8 KiB (MDTS
/// 1) at depth 128, over a namespace of 2048 512-byte blocks.
fn setup_shared_region(region: usize) -> (LoopbackTarget, Controller<LoopbackFabric>) {
    let config = LoopbackConfig {
        mdts: 1,
        ..LoopbackConfig::default()
    };
    let (t, c, _) = attach(config, |o| {
        o.reconnect = ReconnectPolicy::never();
        o.io_queue_data_size = Some(region);
    });
    (t, c.unwrap())
}

#[test]
fn a_shared_data_region_takes_each_command_by_its_size_and_frees_it_at_completion() {
    let (_, mut c) = setup_shared_region(16 * 1024);
    let ns = c.namespace(1).unwrap().target();
    let q = c.io_queue_mut(0).unwrap();
    assert_eq!(q.queue().region().len, 16 * 1024);
    // The depth is the queue's, not the region's count of 8 KiB slots.
    assert_eq!(q.depth(), 128);
    for token in 0..4 {
        q.submit_read(&ns, token * 8, 8, token).unwrap();
    }
    // 4 x 4 KiB in flight fill the region; a command without data still goes.
    assert!(!q.has_room_for(512));
    assert_eq!(q.submit_read(&ns, 0, 1, 98), Err(Error::QueueFull));
    assert_eq!(q.in_flight(), 4, "the refused command holds no CID");
    assert!(q.has_room_for(0));
    q.submit_flush(ns.nsid, 99).unwrap();
    let done = collect(q, 5);
    assert_eq!(done.len(), 5);
    assert!(done.iter().all(|(c, _)| c.result.is_ok()));
    assert!(q.has_room_for(8192));
    q.submit_read(&ns, 0, 16, 100).unwrap();
    assert_eq!(collect(q, 1)[0].1.len(), 8192);
}

/// The byte a namespace holds at `byte` after the sweep below wrote it.
fn pattern(byte: u64) -> u8 {
    (byte / 512 * 7 + byte % 512) as u8
}

#[test]
fn commands_of_mixed_sizes_completing_out_of_order_never_share_region_bytes() {
    let (target, mut c) = setup_shared_region(20 * 1024);
    let ns = c.namespace(1).unwrap().target();
    let q = c.io_queue_mut(0).unwrap();
    target.reorder_responses(true);
    let sizes = [1u32, 3, 8, 16, 2, 5];
    let mut refused = 0;
    let mut checked = 0;
    // Sweep the namespace twice: writes of the pattern, then reads that check it. Each
    // sweep submits until the region is full, then polls once: responses come newest first,
    // so the free runs are holes between commands still in flight.
    for write in [true, false] {
        let mut lba = 0u64;
        let mut round = 0;
        while lba < ns.blocks || q.in_flight() > 0 {
            while lba < ns.blocks {
                let blocks = sizes[round % sizes.len()].min((ns.blocks - lba) as u32);
                let submitted = if write {
                    q.submit_write(&ns, lba, blocks, lba, |slot| {
                        for (i, b) in slot.iter_mut().enumerate() {
                            *b = pattern(lba * 512 + i as u64);
                        }
                    })
                } else {
                    q.submit_read(&ns, lba, blocks, lba)
                };
                match submitted {
                    Ok(()) => {
                        lba += u64::from(blocks);
                        round += 1;
                    }
                    Err(Error::QueueFull) => {
                        refused += 1;
                        break;
                    }
                    Err(e) => panic!("LBA {lba}: {e}"),
                }
            }
            q.poll(|done, data| {
                assert_eq!(done.result, Ok(()), "LBA {}", done.token);
                for (i, &b) in data.iter().enumerate() {
                    assert_eq!(
                        b,
                        pattern(done.token * 512 + i as u64),
                        "LBA {}",
                        done.token
                    );
                }
                checked += data.len();
            });
        }
    }
    assert!(
        refused > 100,
        "the region, not the depth, held commands back: {refused}"
    );
    assert_eq!(checked as u64, ns.blocks * 512);
    let stored = target.read_namespace(1, 0..ns.blocks as usize * 512);
    assert!(
        stored
            .iter()
            .enumerate()
            .all(|(i, &b)| b == pattern(i as u64))
    );
}

#[test]
fn a_keyed_sgl_that_cannot_be_made_releases_its_command() {
    // No MDTS, a 16 MiB host maximum: a 16 MiB read passes every local check but does not
    // fit a keyed SGL's 24-bit length.
    let config = LoopbackConfig {
        mdts: 0,
        namespaces: vec![crate::loopback::NamespaceConfig {
            blocks: 32768,
            block_shift: 9,
        }],
        ..LoopbackConfig::default()
    };
    let (_, c, _) = attach(config, |o| {
        o.reconnect = ReconnectPolicy::never();
        o.max_io_size = 16 << 20;
        o.io_queue_data_size = Some(16 << 20);
    });
    let mut c = c.unwrap();
    let ns = c.namespace(1).unwrap().target();
    let q = c.io_queue_mut(0).unwrap();
    match q.submit_read(&ns, 0, 32768, 1) {
        Err(Error::InvalidArgument(why)) => assert!(why.contains("24-bit"), "{why}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(q.in_flight(), 0, "no CID left behind");
    assert!(q.has_room_for(16 << 20), "no data left behind");
    q.submit_read(&ns, 0, 32767, 2).unwrap();
    let done = collect(q, 1);
    assert_eq!(done[0].0.result, Ok(()));
    assert_eq!(done[0].1.len(), 32767 * 512);
}
