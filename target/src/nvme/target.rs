//! [`Target`]: everything the NVMe side of the daemon serves, shared by all reactors: limits
//! from the transport configuration, the block devices, the subsystems, the live controllers
//! (controller-id allocation), the discovery log, and the keep-alive sweep.
//!
//! All of it is control path (connect, admin commands, configuration, timers); the I/O path
//! touches only what a queue and its reactor cached (see `queue.rs` and `io.rs`).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use nvmf_protocol::FixedStr;
use nvmf_protocol::log::{
    AddressFamily, DiscoveryLog, DiscoveryLogEntry, RdmaProviderType, RdmaTsas, SubsystemType,
    TransportType, Tsas,
};

use crate::bdev::{self, Bdev, BdevError};
use crate::config::{Config, parse_hex16, parse_uuid};

use super::controller::Controller;
use super::subsystem::{Namespace, NamespaceError, Subsystem};

/// Controller ids handed out: 1..=0xFFEF (0xFFF0 and up are reserved, 0xFFFF means "any").
const CNTLID_MAX: u16 = 0xFFEF;
/// Keep Alive Timeout of a discovery controller connected with KATO 0.
pub const DISCOVERY_KATO_MS: u32 = 120_000;

/// What the transport and the configuration allow; fixed at start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Most entries of an I/O queue (CAP.MQES + 1).
    pub max_queue_depth: u32,
    /// Most entries of the admin queue.
    pub max_aq_depth: u32,
    /// In-capsule data bytes on I/O queues (IOCCSZ = 4 + this / 16).
    pub in_capsule_data_size: u32,
    /// Largest transfer of one command (MDTS).
    pub max_io_size: u32,
    /// Most I/O queues a controller may have.
    pub max_io_queues: u16,
    /// Keep Alive granularity reported in KAS (100 ms units): the keep-alive sweep's period,
    /// and KATO is rounded up to a multiple of it ([`Limits::round_kato`]).
    pub kas: u16,
    /// Most descriptors of a multi-descriptor SGL (MSDBD).
    pub msdbd: u8,
}

impl Limits {
    /// The keep-alive granularity KAS states.
    pub fn keep_alive_granularity(&self) -> Duration {
        Duration::from_millis(u64::from(self.kas) * 100)
    }

    /// A host's KATO in ms rounded up to a multiple of KAS, as the controller applies it (and
    /// Get Features reports it); 0 (disabled) stays 0.
    pub fn round_kato(&self, kato_ms: u32) -> u32 {
        let unit = u32::from(self.kas) * 100;
        if unit == 0 {
            return kato_ms;
        }
        kato_ms.div_ceil(unit).saturating_mul(unit)
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_queue_depth: 128,
            max_aq_depth: 128,
            in_capsule_data_size: 4096,
            max_io_size: 131_072,
            max_io_queues: 64,
            // 500 ms: the sweep nvmf-tgt runs (it said 10 s while expiry followed the sweep).
            kas: 5,
            msdbd: 16,
        }
    }
}

impl Limits {
    /// MDTS in 4 KiB pages (a power of two exponent).
    pub fn mdts(&self) -> u8 {
        let pages = (self.max_io_size / 4096).max(1);
        (31 - pages.leading_zeros()) as u8
    }
}

/// Why the target could not be built from a configuration.
#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    /// A block device failed to open.
    #[error(transparent)]
    Bdev(#[from] BdevError),
    /// A namespace could not be added.
    #[error("subsystem {nqn}: {source}")]
    Namespace {
        /// Subsystem.
        nqn: String,
        /// Why.
        #[source]
        source: NamespaceError,
    },
    /// No such subsystem or bdev.
    #[error("{0}")]
    NotFound(String),
}

/// See the module documentation.
pub struct Target {
    limits: Limits,
    listeners: Vec<SocketAddr>,
    bdevs: Mutex<Vec<Arc<dyn Bdev>>>,
    bdev_names: Mutex<Vec<String>>,
    subsystems: Vec<Arc<Subsystem>>,
    controllers: Mutex<BTreeMap<u16, Arc<Controller>>>,
    next_cntlid: Mutex<u16>,
    /// Discovery log generation counter.
    genctr: AtomicU64,
}

impl Target {
    /// An empty target.
    pub fn new(limits: Limits, listeners: Vec<SocketAddr>) -> Target {
        Target {
            limits,
            listeners,
            bdevs: Mutex::new(Vec::new()),
            bdev_names: Mutex::new(Vec::new()),
            subsystems: Vec::new(),
            controllers: Mutex::new(BTreeMap::new()),
            next_cntlid: Mutex::new(1),
            genctr: AtomicU64::new(1),
        }
    }

    /// Build from a validated configuration: open every bdev, create the subsystems and
    /// their namespaces.
    pub fn from_config(config: &Config) -> Result<Target, TargetError> {
        let t = &config.transport;
        let limits = Limits {
            max_queue_depth: *t.max_queue_depth.get_ref(),
            max_aq_depth: *t.max_aq_depth.get_ref(),
            in_capsule_data_size: *t.in_capsule_data_size.get_ref(),
            max_io_size: *t.max_io_size.get_ref(),
            ..Limits::default()
        };
        let listeners: Vec<SocketAddr> = t.listen.get_ref().iter().map(|a| *a.get_ref()).collect();
        let mut target = Target::new(limits, listeners.clone());
        for b in &config.bdevs {
            target.add_bdev(b.name.get_ref(), bdev::open(b)?);
        }
        for s in &config.subsystems {
            let nqn = s.nqn.get_ref();
            let listen = s
                .listen
                .as_ref()
                .map(|l| l.iter().map(|a| *a.get_ref()).collect())
                .unwrap_or_else(|| listeners.clone());
            let serial = s.serial.as_ref().map_or_else(
                || format!("NVMFRS{:014X}", target.subsystems.len() + 1),
                |v| v.get_ref().clone(),
            );
            let model = s
                .model
                .as_ref()
                .map_or("nvmf-rs", |v| v.get_ref().as_str())
                .to_owned();
            let sub = Arc::new(Subsystem::new(
                nqn,
                &serial,
                &model,
                s.allow_any_host,
                s.hosts.iter().map(|h| h.get_ref().clone()).collect(),
                *s.max_namespaces.get_ref(),
                listen,
            ));
            target.subsystems.push(sub.clone());
            for ns in &s.namespaces {
                let uuid = ns.uuid.as_ref().and_then(|u| parse_uuid(u.get_ref()));
                let nguid = ns.nguid.as_ref().and_then(|g| parse_hex16(g.get_ref()));
                target.attach(&sub, *ns.nsid.get_ref(), ns.bdev.get_ref(), uuid, nguid)?;
            }
        }
        Ok(target)
    }

    /// Register a block device; returns its index.
    pub fn add_bdev(&self, name: &str, bdev: Arc<dyn Bdev>) -> usize {
        let mut b = lock(&self.bdevs);
        b.push(bdev);
        lock(&self.bdev_names).push(name.to_owned());
        b.len() - 1
    }

    /// Block device `index`.
    pub fn bdev(&self, index: usize) -> Option<Arc<dyn Bdev>> {
        lock(&self.bdevs).get(index).cloned()
    }

    /// Every block device.
    pub fn bdevs(&self) -> Vec<Arc<dyn Bdev>> {
        lock(&self.bdevs).clone()
    }

    /// Add a subsystem (before serving, or at run time).
    pub fn add_subsystem(&mut self, sub: Arc<Subsystem>) {
        self.subsystems.push(sub);
        self.genctr.fetch_add(1, Ordering::AcqRel);
    }

    fn attach(
        &self,
        sub: &Arc<Subsystem>,
        nsid: u32,
        bdev_name: &str,
        uuid: Option<[u8; 16]>,
        nguid: Option<[u8; 16]>,
    ) -> Result<(), TargetError> {
        let index = lock(&self.bdev_names)
            .iter()
            .position(|n| n == bdev_name)
            .ok_or_else(|| TargetError::NotFound(format!("no bdev {bdev_name:?}")))?;
        let bdev = self
            .bdev(index)
            .ok_or_else(|| TargetError::NotFound(format!("no bdev {bdev_name:?}")))?;
        let info = bdev.info().clone();
        // Hosts need a unique identifier per namespace (Linux warns and multipath breaks
        // without one): derive a stable NGUID from the subsystem NQN and NSID when none is set.
        let nguid = match (uuid, nguid) {
            (None, None) => Some(derived_nguid(&sub.nqn, nsid)),
            (_, n) => n,
        };
        sub.add_namespace(Namespace {
            nsid,
            bdev_index: index,
            bdev,
            info,
            uuid,
            nguid,
        })
        .map_err(|source| TargetError::Namespace {
            nqn: sub.nqn.clone(),
            source,
        })
    }

    /// Add a namespace at run time; every controller of the subsystem gets a namespace
    /// attribute notice.
    pub fn add_namespace(&self, nqn: &str, nsid: u32, bdev_name: &str) -> Result<(), TargetError> {
        let sub = self
            .subsystem(nqn)
            .ok_or_else(|| TargetError::NotFound(format!("no subsystem {nqn}")))?;
        self.attach(&sub, nsid, bdev_name, None, None)?;
        tracing::info!(subsystem = nqn, nsid, bdev = bdev_name, "namespace added");
        self.notify_namespace(&sub, nsid);
        Ok(())
    }

    /// Remove a namespace at run time (notice as for [`Target::add_namespace`]).
    pub fn remove_namespace(&self, nqn: &str, nsid: u32) -> Result<(), TargetError> {
        let sub = self
            .subsystem(nqn)
            .ok_or_else(|| TargetError::NotFound(format!("no subsystem {nqn}")))?;
        sub.remove_namespace(nsid)
            .map_err(|source| TargetError::Namespace {
                nqn: nqn.to_owned(),
                source,
            })?;
        tracing::info!(subsystem = nqn, nsid, "namespace removed");
        self.notify_namespace(&sub, nsid);
        Ok(())
    }

    fn notify_namespace(&self, sub: &Arc<Subsystem>, nsid: u32) {
        for c in lock(&self.controllers).values() {
            if c.subsystem.as_ref().is_some_and(|s| Arc::ptr_eq(s, sub)) {
                c.namespace_changed(nsid);
            }
        }
    }

    /// Limits.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Listen addresses.
    pub fn listeners(&self) -> &[SocketAddr] {
        &self.listeners
    }

    /// Subsystems.
    pub fn subsystems(&self) -> &[Arc<Subsystem>] {
        &self.subsystems
    }

    /// The subsystem `nqn`.
    pub fn subsystem(&self, nqn: &str) -> Option<Arc<Subsystem>> {
        self.subsystems.iter().find(|s| s.nqn == nqn).cloned()
    }

    /// Create a controller with a fresh id; None when every id is taken.
    pub fn create_controller(
        &self,
        subsystem: Option<Arc<Subsystem>>,
        hostnqn: &str,
        hostid: [u8; 16],
        kato_ms: u32,
        now: Instant,
    ) -> Option<Arc<Controller>> {
        // A discovery controller connected with KATO 0 (a non-persistent `nvme discover`)
        // still goes after two minutes without a Keep Alive, as in nvmet and SPDK (NVMe-oF
        // 1.1 allows a transport's fixed activity timeout): a host that died holding one
        // would leak it, an idle RC connection telling nobody.
        let kato_ms = if subsystem.is_none() && kato_ms == 0 {
            DISCOVERY_KATO_MS
        } else {
            self.limits.round_kato(kato_ms)
        };
        let mut ctrls = lock(&self.controllers);
        let mut next = lock(&self.next_cntlid);
        for _ in 0..CNTLID_MAX {
            let id = *next;
            *next = if id >= CNTLID_MAX { 1 } else { id + 1 };
            if let std::collections::btree_map::Entry::Vacant(slot) = ctrls.entry(id) {
                let c = Arc::new(Controller::new(
                    id, subsystem, hostnqn, hostid, kato_ms, now,
                ));
                slot.insert(c.clone());
                return Some(c);
            }
        }
        None
    }

    /// The live controller `cntlid`.
    pub fn controller(&self, cntlid: u16) -> Option<Arc<Controller>> {
        lock(&self.controllers).get(&cntlid).cloned()
    }

    /// Live controllers.
    pub fn controllers(&self) -> Vec<Arc<Controller>> {
        lock(&self.controllers).values().cloned().collect()
    }

    /// Tear down a controller: it leaves the table (its id is free again) and its queues see
    /// it defunct and disconnect.
    pub fn remove_controller(&self, cntlid: u16, why: &str) {
        if let Some(c) = lock(&self.controllers).remove(&cntlid) {
            c.set_defunct();
            tracing::info!(cntlid, subsystem = c.subnqn(), host = %c.hostnqn, "controller removed: {why}");
        }
    }

    /// Tear down every controller whose keep-alive timer expired at `now`; returns their ids.
    /// Called by a reactor timer (period: a fraction of the smallest KATO).
    pub fn reap_expired(&self, now: Instant) -> Vec<u16> {
        let expired: Vec<u16> = lock(&self.controllers)
            .values()
            .filter(|c| c.expired(now))
            .map(|c| c.cntlid)
            .collect();
        for id in &expired {
            tracing::warn!(
                cntlid = id,
                "keep-alive timeout: tearing the controller down"
            );
            self.remove_controller(*id, "keep-alive timeout");
        }
        expired
    }

    /// The discovery log for `hostnqn`: one entry per subsystem it may see, per listener the
    /// subsystem is exposed on.
    pub fn discovery_log(&self, hostnqn: &str) -> DiscoveryLog {
        let mut entries = Vec::new();
        for s in self.subsystems.iter().filter(|s| s.allows(hostnqn)) {
            for addr in &s.listen {
                let port = self
                    .listeners
                    .iter()
                    .position(|l| l == addr)
                    .map_or(0, |p| p as u16 + 1);
                entries.push(DiscoveryLogEntry {
                    trtype: TransportType::Rdma,
                    adrfam: if addr.is_ipv4() {
                        AddressFamily::Ipv4
                    } else {
                        AddressFamily::Ipv6
                    },
                    subtype: SubsystemType::Nvm,
                    treq: 0,
                    portid: port,
                    cntlid: 0xFFFF,
                    asqsz: self.limits.max_aq_depth.min(u32::from(u16::MAX)) as u16,
                    eflags: 0,
                    trsvcid: fixed(&addr.port().to_string()),
                    subnqn: fixed(&s.nqn),
                    traddr: fixed(&addr.ip().to_string()),
                    tsas: Tsas::Rdma(RdmaTsas {
                        // As nvmet: a listener may be on RoCE, InfiniBand, iWARP or a soft fabric.
                        prtype: RdmaProviderType::NotSpecified,
                        ..RdmaTsas::default()
                    }),
                });
            }
        }
        DiscoveryLog {
            genctr: self.genctr.load(Ordering::Acquire),
            recfmt: 0,
            entries,
        }
    }
}

/// 128 bits of FNV-1a over `nqn` and `nsid`: stable across restarts.
fn derived_nguid(nqn: &str, nsid: u32) -> [u8; 16] {
    let mut out = [0u8; 16];
    for (half, seed) in [
        (0usize, 0xcbf2_9ce4_8422_2325u64),
        (8, 0x6c62_272e_07bb_0142),
    ] {
        let mut h = seed;
        for b in nqn.bytes().chain(nsid.to_le_bytes()) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01B3);
        }
        out[half..half + 8].copy_from_slice(&h.to_be_bytes());
    }
    out
}

fn fixed<const N: usize>(s: &str) -> FixedStr<N> {
    FixedStr::new(s, "discovery entry").unwrap_or(FixedStr::EMPTY)
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section here leaves the data consistent at each step.
    m.lock().unwrap_or_else(|p| p.into_inner())
}
