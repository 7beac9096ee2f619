//! Starting reactors: core validation, pinning, thread identity, drop without stop.

mod common;

use common::cfg;
use nvmf_poller::{PollerError, Runtime, RuntimeConfig};

#[test]
fn starts_one_reactor_per_core_unpinned() {
    let rt = Runtime::start(cfg(&[0, 1])).expect("start");
    assert_eq!(rt.reactors().len(), 2);
    for (i, h) in rt.reactors().iter().enumerate() {
        assert_eq!(h.id(), i);
        assert_eq!(h.core(), i);
        let name = h
            .call(|_| std::thread::current().name().map(str::to_owned))
            .expect("call");
        assert_eq!(name.as_deref(), Some(format!("nvmf-reactor-{i}").as_str()));
    }
    let stats = rt.stop().expect("stop");
    assert_eq!(stats.len(), 2);
    assert!(stats.iter().all(|s| s.exited));
}

/// The kernel's view of the reactor thread's affinity must be exactly its core.
#[test]
fn pinned_reactors_run_on_their_core_only() {
    let rt = Runtime::start(RuntimeConfig::new([1, 0])).expect("start pinned");
    for h in rt.reactors() {
        let allowed = h
            .call(|_| {
                let status = std::fs::read_to_string("/proc/thread-self/status").expect("status");
                status
                    .lines()
                    .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
                    .map(|v| v.trim().to_owned())
            })
            .expect("call");
        assert_eq!(allowed, Some(h.core().to_string()), "reactor {}", h.id());
    }
    rt.stop().expect("stop");
}

#[test]
fn nonexistent_core_is_refused_with_the_available_ones() {
    let err = Runtime::start(cfg(&[0, 4096]))
        .err()
        .expect("core 4096 must be refused");
    let PollerError::NoSuchCore { core, available } = &err else {
        panic!("wrong error: {err}");
    };
    assert_eq!(*core, 4096);
    assert!(available.contains(&0), "{available:?}");
    let msg = err.to_string();
    assert!(msg.contains("core 4096"), "{msg}");
    let list: Vec<String> = available.iter().map(ToString::to_string).collect();
    assert!(
        msg.contains(&format!("available cores: {}", list.join(", "))),
        "{msg}"
    );
    // Pinned or not, validation is the same.
    assert!(matches!(
        Runtime::start(RuntimeConfig::new([4096])),
        Err(PollerError::NoSuchCore { core: 4096, .. })
    ));
}

#[test]
fn empty_and_duplicate_core_lists_are_refused() {
    assert!(matches!(
        Runtime::start(cfg(&[])),
        Err(PollerError::NoCores)
    ));
    assert!(matches!(
        Runtime::start(cfg(&[1, 1])),
        Err(PollerError::DuplicateCore { core: 1 })
    ));
}

#[test]
fn dropping_the_runtime_stops_and_joins() {
    let rt = Runtime::start(cfg(&[0])).expect("start");
    let h = rt.reactors()[0].clone();
    drop(rt);
    assert!(h.stats().exited);
    assert!(matches!(
        h.send(|_| {}),
        Err(PollerError::ReactorStopped { reactor: 0 })
    ));
}
