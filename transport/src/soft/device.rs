//! The soft device: the process-global registry, the device context (attributes, limits, the
//! QP number space, the key table, the async event queue and its fd) and protection domains.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use super::channel::{EventQueue, SoftCompChannel};
use super::cq::CqInner;
use super::mem::{KeyTable, SOFT_MAX_SGE, SoftMw, Source};
use super::qp::QpShared;
use super::recv_ring::MAX_DEPTH as MAX_RING_DEPTH;
use super::retire::MAX_SEND_QUEUE;
use super::tcp::TcpFabric;
use super::{Soft, SoftCq, SoftMr, SoftQp, SoftSrq};
use crate::error::{Result, TransportError};
use crate::provider::{ContextOps, OwnedMemory, PdOps, QpInit};
use crate::types::*;

/// QP numbers are 24 bits; 0 and 1 are reserved (SMI / GSI).
pub(crate) const QPN_MASK: u32 = 0x00ff_ffff;
const FIRST_QPN: u32 = 2;

static REGISTRY: Mutex<Vec<Arc<DeviceInner>>> = Mutex::new(Vec::new());

fn registry() -> std::sync::MutexGuard<'static, Vec<Arc<DeviceInner>>> {
    REGISTRY.lock().unwrap_or_else(|e| e.into_inner())
}

/// The registered devices (snapshot).
pub(crate) fn devices() -> Vec<Arc<DeviceInner>> {
    registry().clone()
}

/// An in-process device by its lid (how an in-process QP endpoint names its device).
pub(crate) fn inproc_device_by_lid(lid: u16) -> Option<Arc<DeviceInner>> {
    registry()
        .iter()
        .find(|d| d.cfg.fabric == SoftFabric::InProcess && d.lid() == lid)
        .cloned()
}

fn same_config(a: &SoftConfig, b: &SoftConfig) -> bool {
    a.name == b.name
        && a.fabric == b.fabric
        && a.ip == b.ip
        && a.fabric_port == b.fabric_port
        && a.last_wqe_reached == b.last_wqe_reached
        && a.max_qp == b.max_qp
        && a.max_qp_wr == b.max_qp_wr
        && a.max_srq_wr == b.max_srq_wr
        && a.max_cqe == b.max_cqe
        && a.max_sge == b.max_sge
        && a.max_sge_rd == b.max_sge_rd
        && a.max_qp_rd_atom == b.max_qp_rd_atom
        && a.max_inline_data == b.max_inline_data
}

pub(crate) fn open(cfg: &SoftConfig) -> Result<SoftContext> {
    let mut reg = registry();
    if let Some(d) = reg.iter().find(|d| d.cfg.name == cfg.name) {
        if same_config(&d.cfg, cfg) {
            return Ok(SoftContext { inner: d.clone() });
        }
        return Err(TransportError::InvalidArgument(format!(
            "soft device {:?} is already open with a different configuration ({:?} {}:{})",
            cfg.name,
            d.cfg.fabric,
            d.cfg.ip,
            d.lid()
        )));
    }
    if cfg.name.is_empty() {
        return Err(TransportError::InvalidArgument(
            "soft device name is empty".into(),
        ));
    }
    if cfg.max_sge as usize > SOFT_MAX_SGE || cfg.max_sge == 0 {
        return Err(TransportError::InvalidArgument(format!(
            "soft device max_sge must be 1..={SOFT_MAX_SGE}, not {}",
            cfg.max_sge
        )));
    }
    if cfg.max_sge_rd == 0 || cfg.max_sge_rd > cfg.max_sge {
        return Err(TransportError::InvalidArgument(format!(
            "soft device max_sge_rd must be 1..=max_sge ({}), not {}",
            cfg.max_sge, cfg.max_sge_rd
        )));
    }
    if cfg.max_qp > QPN_MASK - FIRST_QPN {
        return Err(TransportError::InvalidArgument(format!(
            "max_qp {} exceeds the 24-bit QP space",
            cfg.max_qp
        )));
    }
    // Send-queue retirement compares sequences mod 2^32 (retire.rs).
    if cfg.max_qp_wr > MAX_SEND_QUEUE {
        return Err(TransportError::InvalidArgument(format!(
            "soft device max_qp_wr must be at most {MAX_SEND_QUEUE}, not {}",
            cfg.max_qp_wr
        )));
    }
    // A CQ's receive lane is a ring whose slots carry a position mark of limited width.
    if cfg.max_cqe > MAX_RING_DEPTH {
        return Err(TransportError::InvalidArgument(format!(
            "soft device max_cqe must be at most {MAX_RING_DEPTH}, not {}",
            cfg.max_cqe
        )));
    }
    let index = reg.len() as u16;
    let dev = Arc::new(DeviceInner {
        cfg: cfg.clone(),
        index,
        keys: KeyTable::new(),
        events: EventQueue::new()?,
        qps: Mutex::new(QpTable {
            next: FIRST_QPN,
            live: HashMap::new(),
        }),
        n_qp: AtomicU32::new(0),
        next_id: AtomicU32::new(1),
        cqs: Mutex::new(HashMap::new()),
        tcp: OnceLock::new(),
    });
    if cfg.fabric == SoftFabric::Tcp {
        let fabric = TcpFabric::start(&dev)?;
        let _ = dev.tcp.set(fabric);
    }
    tracing::info!(name = %cfg.name, fabric = ?cfg.fabric, ip = %cfg.ip, lid = dev.lid(), "soft device opened");
    reg.push(dev.clone());
    Ok(SoftContext { inner: dev })
}

pub(crate) fn list() -> Result<Vec<DeviceInfo>> {
    let reg = registry();
    if reg.is_empty() {
        let d = SoftConfig::default();
        return Ok(vec![DeviceInfo {
            name: d.name,
            provider: ProviderKind::Soft,
            guid: guid(d.ip, 0),
            transport: "soft".into(),
        }]);
    }
    Ok(reg
        .iter()
        .map(|d| DeviceInfo {
            name: d.cfg.name.clone(),
            provider: ProviderKind::Soft,
            guid: guid(d.cfg.ip, d.index),
            transport: "soft".into(),
        })
        .collect())
}

fn guid(ip: Ipv4Addr, index: u16) -> u64 {
    0x5f50_0000_0000_0000 | (u64::from(index) << 32) | u64::from(u32::from(ip))
}

struct QpTable {
    next: u32,
    live: HashMap<u32, Weak<QpShared>>,
}

pub(crate) struct DeviceInner {
    pub(crate) cfg: SoftConfig,
    index: u16,
    pub(crate) keys: KeyTable,
    pub(crate) events: EventQueue<AsyncEvent>,
    qps: Mutex<QpTable>,
    n_qp: AtomicU32,
    next_id: AtomicU32,
    cqs: Mutex<HashMap<u32, Weak<CqInner>>>,
    pub(crate) tcp: OnceLock<Arc<TcpFabric>>,
}

impl DeviceInner {
    /// In-process: a small per-process device number; TCP: the fabric port.
    pub(crate) fn lid(&self) -> u16 {
        match self.tcp.get() {
            Some(t) => t.port(),
            None => self.index + 1,
        }
    }

    pub(crate) fn ip(&self) -> Ipv4Addr {
        self.cfg.ip
    }

    pub(crate) fn name(&self) -> &str {
        &self.cfg.name
    }

    pub(crate) fn raise(&self, kind: AsyncEventKind) {
        tracing::debug!(device = %self.cfg.name, ?kind, "async event");
        self.events.push(AsyncEvent { kind });
    }

    pub(crate) fn next_id(&self) -> u32 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Allocate a 24-bit QP number: increment with wrap, skip live ones and 0/1, so a number
    /// is not reused right after its QP is destroyed.
    pub(crate) fn reserve_qpn(&self) -> Result<u32> {
        let max = self.cfg.max_qp;
        let live = self.n_qp.fetch_add(1, Ordering::AcqRel);
        if live >= max {
            self.n_qp.fetch_sub(1, Ordering::AcqRel);
            return Err(TransportError::Limit {
                what: "max_qp",
                asked: u64::from(live) + 1,
                max: u64::from(max),
            });
        }
        let mut t = self.qps.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            let n = t.next;
            t.next = (n + 1) & QPN_MASK;
            if t.next < FIRST_QPN {
                t.next = FIRST_QPN;
            }
            if let std::collections::hash_map::Entry::Vacant(v) = t.live.entry(n) {
                v.insert(Weak::new());
                return Ok(n);
            }
        }
    }

    pub(crate) fn publish_qp(&self, n: u32, qp: Weak<QpShared>) {
        self.qps
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .live
            .insert(n, qp);
    }

    pub(crate) fn release_qpn(&self, n: u32) {
        if self
            .qps
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .live
            .remove(&n)
            .is_some()
        {
            self.n_qp.fetch_sub(1, Ordering::AcqRel);
        }
    }

    pub(crate) fn qp(&self, n: u32) -> Option<Arc<QpShared>> {
        self.qps
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .live
            .get(&n)
            .and_then(Weak::upgrade)
    }

    pub(crate) fn register_cq(&self, cq: &Arc<CqInner>) {
        let mut m = self.cqs.lock().unwrap_or_else(|e| e.into_inner());
        m.retain(|_, w| w.strong_count() > 0);
        m.insert(cq.id, Arc::downgrade(cq));
    }

    /// The TCP fabric's ACK timer (tcp.rs): the held ACKs of every CQ nobody polled since the
    /// last tick go out.
    pub(crate) fn ack_timer_tick(&self) {
        let cqs: Vec<Arc<CqInner>> = self
            .cqs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .filter_map(Weak::upgrade)
            .collect();
        for cq in cqs {
            cq.ack_timer_tick();
        }
    }

    pub(crate) fn cq(&self, id: u32) -> Option<Arc<CqInner>> {
        self.cqs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&id)
            .and_then(Weak::upgrade)
    }

    fn attr(&self) -> DeviceAttr {
        let c = &self.cfg;
        let cap = DeviceCapFlags::RC_RNR_NAK_GEN
            | DeviceCapFlags::MEM_MGT_EXTENSIONS
            | DeviceCapFlags::MEM_WINDOW;
        DeviceAttr {
            fw_ver: format!("soft-{}", env!("CARGO_PKG_VERSION")),
            node_guid: guid(c.ip, self.index),
            sys_image_guid: guid(c.ip, self.index),
            vendor_id: 0,
            vendor_part_id: 0,
            hw_ver: 0,
            phys_port_cnt: 1,
            max_mr_size: 1 << 40,
            max_qp: c.max_qp,
            max_qp_wr: c.max_qp_wr,
            max_sge: c.max_sge,
            max_sge_rd: c.max_sge_rd,
            max_cq: 1 << 20,
            max_cqe: c.max_cqe,
            max_mr: 1 << 21,
            max_pd: 1 << 20,
            max_qp_rd_atom: c.max_qp_rd_atom,
            max_qp_init_rd_atom: c.max_qp_rd_atom,
            max_srq: 1 << 16,
            max_srq_wr: c.max_srq_wr,
            max_srq_sge: c.max_sge,
            cap_flags: cap,
            raises_last_wqe_reached: c.last_wqe_reached,
        }
    }
}

/// An opened soft device.
#[derive(Clone)]
pub struct SoftContext {
    pub(crate) inner: Arc<DeviceInner>,
}

impl SoftContext {
    /// The device's fault injector.
    pub fn faults(&self) -> super::FaultInjector {
        super::FaultInjector {
            dev: self.inner.clone(),
        }
    }
    pub fn fabric(&self) -> SoftFabric {
        self.inner.cfg.fabric
    }
    pub fn ip(&self) -> Ipv4Addr {
        self.inner.cfg.ip
    }
    /// The port attribute `lid`: the TCP fabric port, or the in-process device number.
    pub fn lid(&self) -> u16 {
        self.inner.lid()
    }
}

impl std::fmt::Debug for SoftContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "SoftContext({} {:?} {} lid {})",
            self.inner.name(),
            self.inner.cfg.fabric,
            self.inner.ip(),
            self.inner.lid()
        )
    }
}

impl ContextOps<Soft> for SoftContext {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn query_device(&self) -> Result<DeviceAttr> {
        Ok(self.inner.attr())
    }
    fn query_port(&self, port: u8) -> Result<PortAttr> {
        check_port(port)?;
        Ok(PortAttr {
            port_num: 1,
            state: PortState::Active,
            max_mtu: Mtu::Mtu4096,
            active_mtu: Mtu::Mtu4096,
            gid_tbl_len: 1,
            lid: self.inner.lid(),
            sm_lid: 0,
            link_layer: LinkLayer::Ethernet,
            active_speed: 0,
            active_width: 0,
        })
    }
    fn gid_table(&self, port: u8) -> Result<Vec<GidEntry>> {
        check_port(port)?;
        Ok(vec![GidEntry {
            index: 0,
            gid: Gid::from_ipv4(self.inner.ip()),
            gid_type: GidType::RoceV2,
            netdev: None,
        }])
    }
    fn alloc_pd(&self) -> Result<SoftPd> {
        Ok(SoftPd {
            inner: Arc::new(PdInner {
                id: self.inner.next_id(),
                dev: self.inner.clone(),
            }),
        })
    }
    fn create_comp_channel(&self) -> Result<SoftCompChannel> {
        SoftCompChannel::new()
    }
    fn create_cq(&self, depth: u32, channel: Option<&SoftCompChannel>) -> Result<SoftCq> {
        let max = self.inner.cfg.max_cqe;
        if depth > max {
            return Err(TransportError::Limit {
                what: "max_cqe",
                asked: depth.into(),
                max: max.into(),
            });
        }
        SoftCq::new(&self.inner, depth.max(1), channel)
    }
    fn poll_async_event(&self) -> Result<Option<AsyncEvent>> {
        Ok(self.inner.events.pop())
    }
    fn async_fd(&self) -> RawFd {
        self.inner.events.fd()
    }
}

pub(crate) fn check_port(port: u8) -> Result<()> {
    if port != 1 {
        return Err(TransportError::InvalidArgument(format!(
            "soft devices have one port (1), not {port}"
        )));
    }
    Ok(())
}

pub(crate) struct PdInner {
    id: u32,
    dev: Arc<DeviceInner>,
}

/// A protection domain of a soft device.
#[derive(Clone)]
pub struct SoftPd {
    inner: Arc<PdInner>,
}

impl SoftPd {
    pub(crate) fn id(&self) -> u32 {
        self.inner.id
    }
    pub(crate) fn dev(&self) -> &Arc<DeviceInner> {
        &self.inner.dev
    }
}

impl PdOps<Soft> for SoftPd {
    fn alloc_mr(&self, len: usize, access: Access) -> Result<SoftMr> {
        SoftMr::new(self, Source::Alloc(len), access)
    }
    fn reg_mr_owned<B: OwnedMemory>(&self, mut buf: B, access: Access) -> Result<SoftMr> {
        let (ptr, len) = (buf.as_mut_ptr(), buf.len());
        SoftMr::new(self, Source::Owned(Box::new(buf), ptr, len), access)
    }
    unsafe fn reg_mr_raw(&self, ptr: *mut u8, len: usize, access: Access) -> Result<SoftMr> {
        SoftMr::new(self, Source::Raw(ptr, len), access)
    }
    fn alloc_mw(&self) -> Result<SoftMw> {
        SoftMw::new(self)
    }
    fn create_srq(&self, init: &SrqInit) -> Result<SoftSrq> {
        SoftSrq::new(self, init)
    }
    fn create_qp(&self, init: &QpInit<'_, Soft>) -> Result<SoftQp> {
        SoftQp::new(self, init)
    }
}
