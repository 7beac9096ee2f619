//! Connection placement: which reactor's poll group a new connection goes to. The acceptor
//! (control thread) chooses; the chosen reactor creates the QP on its own CQ and SRQ.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PlacementPolicy {
    /// Each new connection goes to the next group in turn.
    #[default]
    RoundRobin,
    /// Each new connection goes to the group with the fewest qpairs (ties: the lowest index).
    LeastLoaded,
}

/// Shared between the acceptor and the reactors: the acceptor picks, each reactor reports its
/// qpair count as connections come and go.
#[derive(Clone, Debug)]
pub struct Placement {
    policy: PlacementPolicy,
    next: Arc<AtomicUsize>,
    load: Arc<[AtomicU32]>,
}

impl Placement {
    pub fn new(policy: PlacementPolicy, groups: usize) -> Placement {
        assert!(groups > 0, "placement needs at least one poll group");
        Placement {
            policy,
            next: Arc::new(AtomicUsize::new(0)),
            load: (0..groups).map(|_| AtomicU32::new(0)).collect(),
        }
    }

    pub fn groups(&self) -> usize {
        self.load.len()
    }

    /// The group for the next connection; counts it there at once, so two quick choices in a
    /// row do not land on the same least-loaded group.
    pub fn choose(&self) -> usize {
        let g = match self.policy {
            PlacementPolicy::RoundRobin => {
                self.next.fetch_add(1, Ordering::Relaxed) % self.load.len()
            }
            PlacementPolicy::LeastLoaded => (0..self.load.len())
                .min_by_key(|&i| (self.load[i].load(Ordering::Relaxed), i))
                .unwrap_or(0),
        };
        self.load[g].fetch_add(1, Ordering::Relaxed);
        g
    }

    /// A connection placed on `group` is gone (or never came up).
    pub fn release(&self, group: usize) {
        if let Some(l) = self.load.get(group) {
            let _ = l.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| v.checked_sub(1));
        }
    }

    pub fn load(&self, group: usize) -> u32 {
        self.load
            .get(group)
            .map_or(0, |l| l.load(Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_robin_cycles() {
        let p = Placement::new(PlacementPolicy::RoundRobin, 3);
        let picks: Vec<usize> = (0..7).map(|_| p.choose()).collect();
        assert_eq!(picks, vec![0, 1, 2, 0, 1, 2, 0]);
        assert_eq!((p.load(0), p.load(1), p.load(2)), (3, 2, 2));
    }

    #[test]
    fn least_loaded_fills_the_emptiest() {
        let p = Placement::new(PlacementPolicy::LeastLoaded, 3);
        assert_eq!((p.choose(), p.choose(), p.choose()), (0, 1, 2));
        p.release(1);
        p.release(1); // never below zero
        assert_eq!(p.load(1), 0);
        assert_eq!(p.choose(), 1);
        assert_eq!(p.choose(), 0);
    }
}
