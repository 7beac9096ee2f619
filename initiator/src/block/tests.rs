//! The blocking API against the loopback fake: unaligned edges, MDTS splits, reconnect.

use std::time::Duration;

use super::*;
use crate::clock::VirtualClock;
use crate::controller::tests::attach;
use crate::controller::{ControllerState, ReconnectPolicy};
use crate::loopback::{LoopbackConfig, LoopbackFabric, LoopbackTarget, NamespaceConfig};

fn device(
    config: LoopbackConfig,
    policy: ReconnectPolicy,
) -> (LoopbackTarget, BlockDevice<LoopbackFabric>) {
    let (target, dev, _) = device_with_clock(config, policy);
    (target, dev)
}

fn device_with_clock(
    config: LoopbackConfig,
    policy: ReconnectPolicy,
) -> (LoopbackTarget, BlockDevice<LoopbackFabric>, VirtualClock) {
    let (target, c, clock) = attach(config, |o| o.reconnect = policy);
    (target, BlockDevice::new(c.unwrap(), 1).unwrap(), clock)
}

#[test]
fn unaligned_reads_and_writes_match_a_byte_model() {
    let (target, mut dev) = device(LoopbackConfig::default(), ReconnectPolicy::never());
    let size = dev.size() as usize;
    let mut model = vec![0u8; size];
    let mut rng = fastrand::Rng::with_seed(9);
    for round in 0..200 {
        let len = rng.usize(1..3000);
        let offset = rng.usize(0..size - len);
        if round % 2 == 0 {
            let data: Vec<u8> = (0..len).map(|_| rng.u8(..)).collect();
            dev.write_at(offset as u64, &data).unwrap();
            model[offset..offset + len].copy_from_slice(&data);
        } else {
            let mut buf = vec![0u8; len];
            dev.read_at(offset as u64, &mut buf).unwrap();
            assert_eq!(buf, model[offset..offset + len], "read {offset}+{len}");
        }
    }
    // Nothing outside the written bytes changed on the target either.
    assert_eq!(target.read_namespace(1, 0..size), model);
}

#[test]
fn large_requests_are_split_by_mdts() {
    let config = LoopbackConfig {
        mdts: 1, // 8 KiB
        namespaces: vec![NamespaceConfig {
            blocks: 4096,
            block_shift: 9,
        }],
        ..LoopbackConfig::default()
    };
    let (target, mut dev) = device(config, ReconnectPolicy::never());
    let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    dev.write_at(1000, &data).unwrap();
    let mut back = vec![0u8; data.len()];
    dev.read_at(1000, &mut back).unwrap();
    assert_eq!(back, data);
    assert_eq!(target.stats().largest_transfer, 8192);
    dev.flush().unwrap();
}

#[test]
fn out_of_range_is_refused_locally() {
    let (_, mut dev) = device(LoopbackConfig::default(), ReconnectPolicy::never());
    let size = dev.size();
    assert!(matches!(
        dev.write_at(size - 1, &[0, 0]),
        Err(Error::InvalidArgument(_))
    ));
}

#[test]
fn write_survives_a_dropped_connection_by_reconnecting() {
    let policy = ReconnectPolicy {
        reconnect_delay: Duration::from_secs(1),
        ctrl_loss_timeout: Some(Duration::from_secs(30)),
        fast_io_fail: None,
    };
    let (target, mut dev) = device(LoopbackConfig::default(), policy);
    let data = vec![0x5au8; 64 * 1024];
    target.drop_after(3);
    dev.write_at(512 * 7 + 3, &data).unwrap();
    assert_eq!(dev.controller().reconnects(), 1);
    let mut back = vec![0u8; data.len()];
    dev.read_at(512 * 7 + 3, &mut back).unwrap();
    assert_eq!(back, data);
}

#[test]
fn requests_fail_fast_while_reconnecting_when_the_policy_says_so() {
    let policy = ReconnectPolicy {
        reconnect_delay: Duration::from_secs(1),
        ctrl_loss_timeout: None,
        fast_io_fail: Some(Duration::from_secs(5)),
    };
    let (target, mut dev, clock) = device_with_clock(LoopbackConfig::default(), policy);
    target.drop_connections();
    target.refuse_connects(true);
    let mut buf = [0u8; 512];
    assert_eq!(dev.read_at(0, &mut buf), Err(Error::Reconnecting));
    assert!(
        clock.elapsed() >= Duration::from_secs(5),
        "waited fast_io_fail first"
    );
    // Past fast_io_fail, requests fail at once while reconnect attempts go on in the
    // background as the owner polls.
    assert_eq!(dev.read_at(0, &mut buf), Err(Error::Reconnecting));
    target.refuse_connects(false);
    clock.advance(Duration::from_secs(1));
    assert_eq!(dev.controller_mut().poll(), &ControllerState::Live);
    dev.read_at(0, &mut buf).unwrap();
}

#[test]
fn compare_reports_match_and_mismatch() {
    let (_, mut dev) = device(LoopbackConfig::default(), ReconnectPolicy::never());
    let data: Vec<u8> = (0..2048u32).map(|i| i as u8).collect();
    dev.write_at(512 * 3, &data).unwrap();
    assert_eq!(dev.compare_blocks(3, &data), Ok(true));
    let mut other = data.clone();
    other[1500] ^= 0xff;
    assert_eq!(dev.compare_blocks(3, &other), Ok(false));
    assert!(dev.compare_blocks(3, &data[..100]).is_err());
}

#[test]
fn using_the_device_sends_keep_alives() {
    let (target, c, clock) = attach(LoopbackConfig::default(), |o| {
        o.kato = Duration::from_secs(4)
    });
    let mut dev = BlockDevice::new(c.unwrap(), 1).unwrap();
    let mut buf = [0u8; 512];
    dev.read_at(0, &mut buf).unwrap();
    assert_eq!(target.stats().keep_alives, 0);
    clock.advance(Duration::from_secs(2));
    dev.read_at(0, &mut buf).unwrap();
    assert_eq!(target.stats().keep_alives, 1);
}

/// An operation that waits long (here a read the target never answers) still sends the
/// Keep Alives the association needs: the controller is polled from inside the wait.
#[test]
fn a_long_operation_keeps_the_association_alive() {
    let (target, c, clock) = attach(LoopbackConfig::default(), |o| {
        o.kato = Duration::from_secs(4);
        o.io_timeout = Duration::from_secs(3600);
        o.reconnect = ReconnectPolicy::never();
    });
    let mut dev = BlockDevice::new(c.unwrap(), 1).unwrap();
    target.swallow_next(1);
    let seen = std::thread::scope(|s| {
        // Virtual time runs on while the read waits; the connection drops once two Keep
        // Alives went out (or after 5 s), which ends the read.
        let ticker = s.spawn(|| {
            let until = std::time::Instant::now() + Duration::from_secs(5);
            while target.stats().keep_alives < 2 && std::time::Instant::now() < until {
                clock.advance(Duration::from_millis(100));
                std::thread::sleep(Duration::from_millis(1));
            }
            let seen = target.stats().keep_alives;
            target.drop_connections();
            seen
        });
        let mut buf = [0u8; 512];
        assert!(dev.read_at(0, &mut buf).is_err());
        ticker.join().unwrap()
    });
    assert!(seen >= 2, "{seen} Keep Alives while the read waited");
}

#[test]
fn flushed_data_reads_back_after_the_target_restarts() {
    let policy = ReconnectPolicy {
        reconnect_delay: Duration::from_secs(2),
        ctrl_loss_timeout: Some(Duration::from_secs(60)),
        fast_io_fail: None,
    };
    let (target, mut dev, clock) = device_with_clock(LoopbackConfig::default(), policy);
    let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7) as u8).collect();
    dev.write_at(12_345, &data).unwrap();
    dev.flush().unwrap();
    // The target "dies" and stays down for a while; the read waits it out per the policy.
    target.drop_connections();
    target.refuse_connects(true);
    dev.controller_mut().poll();
    clock.advance(Duration::from_secs(5));
    dev.controller_mut().poll();
    target.refuse_connects(false);
    let mut back = vec![0u8; data.len()];
    dev.read_at(12_345, &mut back).unwrap();
    assert_eq!(back, data);
    assert_eq!(dev.controller().reconnects(), 1);
}

#[test]
fn a_shared_data_region_smaller_than_the_depth_needs_still_moves_large_requests() {
    // 8 KiB transfers (MDTS 1) at depth 128 with 20 KiB of region: at most two largest
    // transfers in flight, so a large request waits for the region, not for CIDs.
    let config = LoopbackConfig {
        mdts: 1,
        namespaces: vec![NamespaceConfig {
            blocks: 4096,
            block_shift: 9,
        }],
        ..LoopbackConfig::default()
    };
    let (target, c, _) = attach(config, |o| {
        o.reconnect = ReconnectPolicy::never();
        o.io_queue_data_size = Some(20 * 1024);
    });
    let mut dev = BlockDevice::new(c.unwrap(), 1).unwrap();
    let data: Vec<u8> = (0..1_000_000u32).map(|i| (i % 253) as u8).collect();
    dev.write_at(777, &data).unwrap();
    let mut back = vec![0u8; data.len()];
    dev.read_at(777, &mut back).unwrap();
    assert_eq!(back, data);
    assert_eq!(target.read_namespace(1, 777..777 + data.len()), data);
}

/// A namespace of `blocks` 512-byte blocks, every byte set from its offset; transfers of at
/// most 8 KiB (16 blocks).
fn patterned(blocks: u64) -> (LoopbackTarget, BlockDevice<LoopbackFabric>, Vec<u8>) {
    let config = LoopbackConfig {
        mdts: 1,
        namespaces: vec![NamespaceConfig {
            blocks,
            block_shift: 9,
        }],
        ..LoopbackConfig::default()
    };
    let (target, mut dev) = device(config, ReconnectPolicy::never());
    let model: Vec<u8> = (0..blocks as usize * 512)
        .map(|i| (i % 253) as u8 | 1)
        .collect();
    dev.write_at(0, &model).unwrap();
    (target, dev, model)
}

#[test]
fn write_zeroes_zeroes_exactly_its_blocks_in_commands_of_the_largest_transfer() {
    let (target, mut dev, mut model) = patterned(2_000);
    let before = target.stats().commands;
    dev.write_zeroes(3, 1_001).unwrap();
    model[3 * 512..1_004 * 512].fill(0);
    assert_eq!(target.read_namespace(1, 0..model.len()), model);
    // 16 blocks per command, as a transfer of MDTS: 63 Write Zeroes.
    assert_eq!(target.stats().commands - before, 63);
}

#[test]
fn deallocate_takes_many_ranges_in_commands_of_256() {
    let (target, mut dev, mut model) = patterned(2_000);
    // 300 ranges of one block each (every sixth block): two commands.
    let ranges: Vec<(u64, u64)> = (0..300).map(|i| (i * 6 + 1, 1)).collect();
    let before = target.stats().commands;
    dev.deallocate(&ranges).unwrap();
    for &(lba, _) in &ranges {
        model[lba as usize * 512..(lba as usize + 1) * 512].fill(0);
    }
    // Deallocated blocks read back as zeroes on this target; the others are untouched.
    assert_eq!(target.read_namespace(1, 0..model.len()), model);
    assert_eq!(
        target.stats().commands - before,
        2,
        "two Dataset Management"
    );
    dev.deallocate(&[(1_990, 10)]).unwrap();
    let mut back = vec![1u8; 10 * 512];
    dev.read_at(1_990 * 512, &mut back).unwrap();
    assert!(back.iter().all(|&b| b == 0));
}

#[test]
fn block_range_commands_refuse_bad_ranges_before_sending() {
    let (target, mut dev, model) = patterned(1_000);
    let before = target.stats().commands;
    for result in [
        dev.write_zeroes(999, 2),
        dev.write_zeroes(0, 0),
        dev.write_zeroes(u64::MAX, 1),
        dev.deallocate(&[]),
        dev.deallocate(&[(0, 1), (1_000, 1)]),
        dev.deallocate(&[(5, 0)]),
    ] {
        assert!(
            matches!(&result, Err(Error::InvalidArgument(m)) if m.contains("block") || m.contains("range")),
            "{result:?}"
        );
    }
    assert_eq!(target.stats().commands, before, "nothing sent");
    assert_eq!(target.read_namespace(1, 0..model.len()), model);
}
