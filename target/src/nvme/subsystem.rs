//! An NVM subsystem: identity, host allow-list, listeners, and its namespaces.
//!
//! Namespaces change on the control path only (configuration, run-time add/remove) under a
//! mutex; each change publishes a fresh immutable [`NsTable`] and bumps an atomic generation.
//! The I/O path keeps its own `Arc<NsTable>` per queue and only compares the generation (one
//! relaxed load) before using it: no lock per I/O.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::bdev::{Bdev, BdevInfo};

/// One namespace as the I/O path sees it.
#[derive(Clone)]
pub struct Namespace {
    /// Namespace id.
    pub nsid: u32,
    /// Index of its block device in the target's bdev table.
    pub bdev_index: usize,
    /// The device.
    pub bdev: Arc<dyn Bdev>,
    /// Geometry (copied, so the I/O path reads it without a call).
    pub info: BdevInfo,
    /// UUID, when configured.
    pub uuid: Option<[u8; 16]>,
    /// NGUID, when configured.
    pub nguid: Option<[u8; 16]>,
}

/// The namespaces of a subsystem at one generation, by NSID.
#[derive(Clone, Default)]
pub struct NsTable {
    /// Slot `nsid - 1`.
    slots: Vec<Option<Namespace>>,
}

impl NsTable {
    /// Table for NSIDs 1..=max.
    fn with_max(max: u32) -> NsTable {
        NsTable {
            slots: vec![None; max as usize],
        }
    }
    /// The active namespace `nsid`.
    pub fn get(&self, nsid: u32) -> Option<&Namespace> {
        let i = usize::try_from(nsid.checked_sub(1)?).ok()?;
        self.slots.get(i)?.as_ref()
    }
    /// Active namespaces in NSID order.
    pub fn active(&self) -> impl Iterator<Item = &Namespace> {
        self.slots.iter().flatten()
    }
}

/// Why a run-time namespace change was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NamespaceError {
    /// NSID 0 or above max_namespaces.
    #[error("nsid {0} is outside 1..=max_namespaces")]
    OutOfRange(u32),
    /// Already in use.
    #[error("nsid {0} is already in use")]
    InUse(u32),
    /// Not present.
    #[error("nsid {0} is not a namespace")]
    NotFound(u32),
}

/// An NVM subsystem.
pub struct Subsystem {
    /// NQN.
    pub nqn: String,
    /// Serial number (Identify Controller SN).
    pub serial: String,
    /// Model number (Identify Controller MN).
    pub model: String,
    /// Any host may connect.
    pub allow_any_host: bool,
    /// Allowed host NQNs when not `allow_any_host`.
    pub hosts: Vec<String>,
    /// Largest NSID (Identify Controller NN).
    pub max_namespaces: u32,
    /// Listen addresses it is exposed on.
    pub listen: Vec<SocketAddr>,
    generation: AtomicU64,
    table: Mutex<Arc<NsTable>>,
}

impl Subsystem {
    /// A subsystem without namespaces.
    pub fn new(
        nqn: &str,
        serial: &str,
        model: &str,
        allow_any_host: bool,
        hosts: Vec<String>,
        max_namespaces: u32,
        listen: Vec<SocketAddr>,
    ) -> Subsystem {
        Subsystem {
            nqn: nqn.to_owned(),
            serial: serial.to_owned(),
            model: model.to_owned(),
            allow_any_host,
            hosts,
            max_namespaces,
            listen,
            generation: AtomicU64::new(0),
            table: Mutex::new(Arc::new(NsTable::with_max(max_namespaces))),
        }
    }

    /// May `hostnqn` connect?
    pub fn allows(&self, hostnqn: &str) -> bool {
        self.allow_any_host || self.hosts.iter().any(|h| h == hostnqn)
    }

    /// Generation of the namespace table (changes on every add/remove).
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// The current namespace table and its generation.
    pub fn namespaces(&self) -> (Arc<NsTable>, u64) {
        let t = self.lock();
        (t.clone(), self.generation.load(Ordering::Acquire))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Arc<NsTable>> {
        // A panic elsewhere while holding the lock leaves a table that is still consistent
        // (it is replaced whole), so poisoning is ignored.
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Add a namespace (control path).
    pub fn add_namespace(&self, ns: Namespace) -> Result<(), NamespaceError> {
        let mut t = self.lock();
        let nsid = ns.nsid;
        if nsid == 0 || nsid > self.max_namespaces {
            return Err(NamespaceError::OutOfRange(nsid));
        }
        if t.get(nsid).is_some() {
            return Err(NamespaceError::InUse(nsid));
        }
        let mut next = NsTable::clone(&t);
        next.slots[nsid as usize - 1] = Some(ns);
        *t = Arc::new(next);
        self.generation.fetch_add(1, Ordering::AcqRel);
        Ok(())
    }

    /// Remove a namespace (control path); queues stop using it at their next I/O.
    pub fn remove_namespace(&self, nsid: u32) -> Result<Namespace, NamespaceError> {
        let mut t = self.lock();
        let Some(old) = t.get(nsid).cloned() else {
            return Err(NamespaceError::NotFound(nsid));
        };
        let mut next = NsTable::clone(&t);
        next.slots[nsid as usize - 1] = None;
        *t = Arc::new(next);
        self.generation.fetch_add(1, Ordering::AcqRel);
        Ok(old)
    }
}
