//! Bring-up, keep-alive, shutdown, discovery and reconnect against the loopback fake target.

use std::sync::Arc;
use std::time::Duration;

use nvmf_protocol::DISCOVERY_NQN;
use nvmf_protocol::properties::{Cc, ShutdownNotification};
use nvmf_protocol::status::{FabricsStatus, StatusCode};

use super::*;
use crate::admin::DataPlacement;
use crate::clock::VirtualClock;
use crate::loopback::{LoopbackConfig, LoopbackFabric, LoopbackTarget, NamespaceConfig};

const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-000000000001";

pub(crate) fn options(subnqn: &str) -> ControllerOptions {
    ControllerOptions::new(subnqn, HOSTNQN, [7; 16])
}

pub(crate) fn attach(
    config: LoopbackConfig,
    tweak: impl FnOnce(&mut ControllerOptions),
) -> (
    LoopbackTarget,
    Result<Controller<LoopbackFabric>>,
    VirtualClock,
) {
    let mut o = options(&config.subnqn);
    tweak(&mut o);
    let target = LoopbackTarget::new(config);
    let clock = VirtualClock::new();
    let c = Controller::connect(
        LoopbackFabric::new(target.clone()),
        TransportAddress::loopback(),
        o,
        Arc::new(clock.clone()),
    );
    (target, c, clock)
}

#[test]
fn bring_up_enables_identifies_and_connects_io_queues() {
    let config = LoopbackConfig {
        namespaces: vec![
            NamespaceConfig {
                blocks: 1000,
                block_shift: 9,
            },
            NamespaceConfig {
                blocks: 64,
                block_shift: 12,
            },
        ],
        max_io_queues: 2,
        max_queue_depth: 16,
        ..LoopbackConfig::default()
    };
    let (target, c, _) = attach(config, |o| {
        o.io_queues = 4;
        o.io_queue_depth = 64;
    });
    let c = c.unwrap();
    assert_eq!(c.state(), &ControllerState::Live);
    assert_eq!(c.cntlid(), 1);
    assert_eq!(c.cap().mqes, 15);
    assert_eq!(c.identify().mn.as_str(), "nvmf-rs loopback controller");
    // Granted 2 of 4 queues, depth capped by MQES + 1.
    assert_eq!(c.io_queue_count(), 2);
    let cc = Cc::from_u32(target.stats().last_cc.unwrap());
    assert!(cc.en);
    assert_eq!((cc.iosqes, cc.iocqes), (6, 4));
    // Admin and both I/O queue Connect data went by keyed SGL (the Linux host's way).
    assert_eq!(target.stats().connect_data_keyed, 3);
    assert_eq!(target.stats().connect_data_in_capsule, 0);
    let ns: Vec<_> = c
        .namespaces()
        .iter()
        .map(|n| (n.nsid, n.blocks, n.block_size))
        .collect();
    assert_eq!(ns, vec![(1, 1000, 512), (2, 64, 4096)]);
    let n2 = c.namespace(2).unwrap();
    assert_eq!(n2.nguid, crate::loopback::target_ids::nguid(2));
    assert_eq!(n2.uuid, Some(crate::loopback::target_ids::uuid(2)));
    // 128 KiB MDTS, in-capsule 4096 from IOCCSZ with SGLS offset support.
    assert_eq!(c.limits().max_transfer, 128 * 1024);
    assert_eq!(c.limits().in_capsule, 4096);
}

#[test]
fn the_io_queue_data_size_is_kept_between_one_largest_transfer_and_one_per_command() {
    // Depth 128, 128 KiB transfers: 16 MiB when every command gets its own largest slot.
    for (asked, region) in [
        (None, 128 * 128 * 1024),
        (Some(usize::MAX), 128 * 128 * 1024),
        (Some(1 << 20), 1 << 20),
        (Some(1), 128 * 1024),
    ] {
        let (_, c, _) = attach(LoopbackConfig::default(), |o| o.io_queue_data_size = asked);
        let mut c = c.unwrap();
        let q = c.io_queue_mut(0).unwrap();
        assert_eq!(
            crate::queue::HostQueue::region(q.queue()).len,
            region,
            "asked {asked:?}"
        );
        assert_eq!((q.depth(), q.limits().max_transfer), (128, 128 * 1024));
    }
}

#[test]
fn connect_data_can_travel_in_the_capsule() {
    let (target, c, _) = attach(LoopbackConfig::default(), |o| {
        o.connect_data = DataPlacement::InCapsule
    });
    c.unwrap();
    let s = target.stats();
    assert_eq!(s.connect_data_in_capsule, 2, "admin and the I/O queue");
    assert_eq!(s.connect_data_keyed, 0);
}

#[test]
fn no_in_capsule_without_the_sgls_offset_bit() {
    let config = LoopbackConfig {
        sgls: nvmf_protocol::identify::SGLS_SUPPORTED | nvmf_protocol::identify::SGLS_KEYED,
        ..LoopbackConfig::default()
    };
    let (_, c, _) = attach(config, |_| {});
    assert_eq!(c.unwrap().limits().in_capsule, 0);
}

#[test]
fn controller_never_ready_times_out_within_cap_to() {
    let config = LoopbackConfig {
        ready_after_reads: u32::MAX,
        cap_to: 4,
        ..LoopbackConfig::default()
    };
    let (_, c, clock) = attach(config, |_| {});
    match c {
        Err(Error::Timeout {
            what: "CSTS.RDY",
            after,
        }) => assert_eq!(after, Duration::from_secs(2)),
        other => panic!("expected CSTS.RDY timeout, got {other:?}"),
    }
    assert!(clock.elapsed() >= Duration::from_secs(2));
}

#[test]
fn wrong_subsystem_is_a_typed_fabrics_status() {
    let (_, c, _) = attach(LoopbackConfig::default(), |o| {
        o.subnqn = "nqn.2024-01.io.example:nope".into()
    });
    let e = c.unwrap_err();
    assert_eq!(
        e.status().map(|s| s.code),
        Some(StatusCode::Fabrics(FabricsStatus::InvalidParameters)),
        "{e}"
    );
}

#[test]
fn keep_alive_every_half_kato() {
    let (target, c, clock) = attach(LoopbackConfig::default(), |o| {
        o.kato = Duration::from_secs(10)
    });
    let mut c = c.unwrap();
    c.poll();
    assert_eq!(target.stats().keep_alives, 0);
    clock.advance(Duration::from_millis(4999));
    c.poll();
    assert_eq!(target.stats().keep_alives, 0, "not before KATO/2");
    clock.advance(Duration::from_millis(1));
    c.poll();
    assert_eq!(target.stats().keep_alives, 1);
    clock.advance(Duration::from_secs(5));
    c.poll();
    assert_eq!(target.stats().keep_alives, 2);
    c.poll(); // picks up the answer
    assert_eq!(target.stats().keep_alives, 2);
    assert_eq!(c.admin().unwrap().stats().keep_alives_answered, 2);
}

#[test]
fn unanswered_keep_alive_loses_the_connection() {
    let (target, c, clock) = attach(LoopbackConfig::default(), |o| {
        o.kato = Duration::from_secs(2);
        o.reconnect = ReconnectPolicy::never();
    });
    let mut c = c.unwrap();
    target.swallow_next(1);
    clock.advance(Duration::from_secs(1));
    c.poll();
    // One interval (KATO / 2) unanswered: a slow controller still has until KATO.
    clock.advance(Duration::from_secs(1));
    assert_eq!(c.poll(), &ControllerState::Live);
    clock.advance(Duration::from_millis(999));
    assert_eq!(c.poll(), &ControllerState::Live);
    clock.advance(Duration::from_secs(1));
    assert!(
        matches!(c.poll(), ControllerState::Failed(_)),
        "{:?}",
        c.state()
    );
    // Only the one Keep Alive was sent meanwhile.
    assert_eq!(target.stats().keep_alives, 1);
}

#[test]
fn shutdown_waits_as_long_as_rtd3e_or_cap_to_say_within_5_to_60_s() {
    use super::bringup::shutdown_wait;
    let to = |units: u8| Cap {
        to: units,
        ..Cap::default()
    };
    assert_eq!(shutdown_wait(0, &to(1)), Duration::from_secs(5));
    assert_eq!(shutdown_wait(20_000_000, &to(1)), Duration::from_secs(20));
    assert_eq!(shutdown_wait(0, &to(30)), Duration::from_secs(15));
    assert_eq!(shutdown_wait(u32::MAX, &to(30)), Duration::from_secs(60));
}

#[test]
fn shutdown_sets_shn_and_waits_for_shst() {
    let (target, c, _) = attach(LoopbackConfig::default(), |_| {});
    let mut c = c.unwrap();
    let io_queues = c.io_queue_count();
    c.shutdown().unwrap();
    assert_eq!(c.state(), &ControllerState::ShutDown);
    let cc = Cc::from_u32(target.stats().last_cc.unwrap());
    assert_eq!(cc.shn, ShutdownNotification::Normal);
    assert!(matches!(c.io_queue_mut(0), Err(Error::ControllerFailed(_))));
    // As Linux: the I/O queues go before CC.SHN, so nothing of theirs is left in flight when
    // the target flushes and reports the shutdown complete; the admin queue after.
    let stats = target.stats();
    assert!(io_queues > 0);
    assert_eq!(stats.disconnects_before_shutdown, Some(io_queues as u64));
    assert_eq!(stats.queue_disconnects, io_queues as u64 + 1);
}

#[test]
fn discovery_controller_lists_subsystems() {
    let config = LoopbackConfig {
        discovery_entries: vec![
            (
                "nqn.2024-01.io.example:a".into(),
                "10.0.0.1".into(),
                "4420".into(),
            ),
            (
                "nqn.2024-01.io.example:b".into(),
                "10.0.0.2".into(),
                "4421".into(),
            ),
        ],
        ..LoopbackConfig::default()
    };
    let (_, c, _) = attach(config, |o| o.subnqn = DISCOVERY_NQN.into());
    let mut c = c.unwrap();
    assert_eq!(c.io_queue_count(), 0);
    assert!(c.namespaces().is_empty());
    let log = c.discovery_log().unwrap();
    assert_eq!(log.entries.len(), 2);
    assert_eq!(log.entries[1].subnqn.as_str(), "nqn.2024-01.io.example:b");
    assert_eq!(log.entries[1].traddr.as_str(), "10.0.0.2");
    assert_eq!(log.entries[1].trsvcid.as_str(), "4421");
}

/// The discovery log as the host reads it from a discovery controller listing `entries`
/// subsystems, whose log moves before the reads numbered in `changes_at`.
fn discovery_log_of(
    entries: usize,
    changes_at: Vec<u32>,
) -> Result<nvmf_protocol::log::DiscoveryLog> {
    let (_, c, _) = attach(discovery_config(entries, changes_at), |o| {
        o.subnqn = DISCOVERY_NQN.into()
    });
    c.unwrap().discovery_log()
}

/// A discovery controller's config listing `entries` subsystems.
fn discovery_config(entries: usize, changes_at: Vec<u32>) -> LoopbackConfig {
    LoopbackConfig {
        discovery_entries: (0..entries)
            .map(|i| {
                (
                    format!("nqn.2024-01.io.example:{i}"),
                    "10.0.0.1".into(),
                    "4420".into(),
                )
            })
            .collect(),
        discovery_changes_at: changes_at,
        ..LoopbackConfig::default()
    }
}

#[test]
fn discovery_log_changing_while_read_is_read_again_until_stable() {
    // Before the whole log's first piece (read 2) and before the next header (read 3): the
    // whole log disagrees with its header, then the next try's header is newer again.
    let log = discovery_log_of(2, vec![2, 4]).unwrap();
    assert_eq!(log.genctr, 9);
    assert_eq!(log.entries.len(), 4);
    assert_eq!(
        log.entries[3].subnqn.as_str(),
        "nqn.2024-01.io.example:added-1"
    );
}

#[test]
fn discovery_log_changing_between_pieces_is_read_again() {
    // Six records are two 4 KiB pieces: the change lands before the second (read 3), so the
    // whole log's header agrees with the first and only the header read after it tells.
    let log = discovery_log_of(6, vec![3]).unwrap();
    assert_eq!(log.genctr, 8);
    assert_eq!(log.entries.len(), 7);
}

#[test]
fn discovery_log_that_never_settles_is_an_error() {
    let e = discovery_log_of(1, (2..100).collect()).unwrap_err();
    assert!(e.to_string().contains("changed on each of 10 reads"), "{e}");
}

#[test]
fn discovery_log_with_more_than_1024_records_is_read_whole() {
    let log = discovery_log_of(1100, Vec::new()).unwrap();
    assert_eq!(log.entries.len(), 1100);
    assert_eq!(
        log.entries[1099].subnqn.as_str(),
        "nqn.2024-01.io.example:1099"
    );
}

/// Features that carry a data buffer (Timestamp's 8 bytes here): Set Features sends it and
/// Get Features brings it back.
#[test]
fn features_with_a_data_buffer_send_and_receive_it() {
    let (_, c, _) = attach(LoopbackConfig::default(), |_| {});
    let mut c = c.unwrap();
    let stamp = 0x0123_4567_89ab_u64.to_le_bytes();
    c.set_features_data(
        nvmf_protocol::features::FeatureId::Timestamp,
        0,
        0,
        false,
        &stamp,
    )
    .unwrap();
    let (_, back) = c
        .get_features_data(
            nvmf_protocol::features::FeatureId::Timestamp,
            0,
            0,
            stamp.len(),
        )
        .unwrap();
    assert_eq!(back, stamp);
}

#[test]
fn duplicate_admin_completion_is_detected_as_stale() {
    let (target, c, _) = attach(LoopbackConfig::default(), |_| {});
    let mut c = c.unwrap();
    target.duplicate_next_response();
    c.get_features(nvmf_protocol::features::FeatureId::NumberOfQueues, 0, 0)
        .unwrap();
    c.get_features(nvmf_protocol::features::FeatureId::NumberOfQueues, 0, 0)
        .unwrap();
    assert_eq!(c.admin().unwrap().stats().stale_completions, 1);
}

#[test]
fn reconnect_after_delay_restores_the_controller() {
    let (target, c, clock) = attach(LoopbackConfig::default(), |o| {
        o.reconnect = ReconnectPolicy {
            reconnect_delay: Duration::from_secs(2),
            ctrl_loss_timeout: Some(Duration::from_secs(10)),
            fast_io_fail: None,
        };
    });
    let mut c = c.unwrap();
    target.drop_connections();
    target.refuse_connects(true);
    assert!(matches!(c.poll(), ControllerState::Reconnecting { .. }));
    assert!(matches!(c.io_queue_mut(0), Err(Error::Reconnecting)));
    clock.advance(Duration::from_secs(2));
    assert!(
        matches!(c.poll(), ControllerState::Reconnecting { attempts: 1, .. }),
        "refused attempt counted"
    );
    target.refuse_connects(false);
    clock.advance(Duration::from_secs(1));
    assert!(
        matches!(c.poll(), ControllerState::Reconnecting { .. }),
        "not before the delay"
    );
    clock.advance(Duration::from_secs(1));
    assert_eq!(c.poll(), &ControllerState::Live);
    assert_eq!(c.reconnects(), 1);
    assert_eq!(target.controller_count(), 1);
    assert!(c.io_queue_mut(0).unwrap().is_connected());
}

#[test]
fn controller_fails_after_loss_timeout() {
    let (target, c, clock) = attach(LoopbackConfig::default(), |o| {
        o.reconnect = ReconnectPolicy {
            reconnect_delay: Duration::from_secs(1),
            ctrl_loss_timeout: Some(Duration::from_secs(5)),
            fast_io_fail: None,
        };
    });
    let mut c = c.unwrap();
    target.drop_connections();
    target.refuse_connects(true);
    c.poll();
    let e = c.wait_live().unwrap_err();
    assert!(matches!(e, Error::ControllerFailed(_)), "{e}");
    assert!(clock.elapsed() >= Duration::from_secs(5));
}
