//! The RDMA transport glue: [`RdmaFabric`] connects queues through the RDMA CM (NVMe-oF private
//! data), each on a host-side poll group of the transport crate; [`RdmaQueue`] is one
//! connected queue.
//!
//! Providers (by [`TransportAddress::transport`]): `rdma` = real verbs; `soft-tcp` = the soft
//! device over TCP (the initiator opens its own soft device, so the target may be another
//! process); `soft` = the soft device in process (the target's listener lives in this same
//! process, as in tests).
//!
//! - `group.rs`: the host poll group one reactor's queues share (one CQ, request objects,
//!   receive slots), which group a queue joins, how groups are sized;
//! - `side.rs`: one queue's state inside its group (commands by CID, CQEs reaped for it);
//! - `by_cid.rs`: the table of a queue's commands in flight by CID;
//! - `queue.rs`: [`RdmaQueue`], the `HostQueue` over a qpair of a group;
//! - `windows.rs`: per-I/O keys (`bind_window`), a pool of memory windows per queue, where the
//!   device has them;
//! - `fuzzing.rs`: queues against a hostile raw target, with the rules they must keep (feature
//!   `fuzzing`, and the unit tests); the raw target's connection in `fuzzing_target.rs`, seed
//!   inputs in `fuzzing_seeds.rs`.

mod by_cid;
#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzzing;
mod group;
mod queue;
mod side;
mod windows;

use std::net::{IpAddr, Ipv4Addr, SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use nvmf_protocol::cm::{RdmaAccept, RdmaConnectRequest, RdmaReject};
use nvmf_transport::{
    Access, CmChannel, CmEventKind, ConnParam, Context, DeviceSpec, ProviderKind, SoftConfig,
    SoftFabric,
};

pub use group::{HostGroupConfig, HostGroupInfo, QueueHome};
pub use queue::RdmaQueue;

use crate::queue::{ConnectError, Fabric, QueueConnectParams, TransportAddress};

/// How long resolving and connecting may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The transport names this module serves.
pub const TRANSPORTS: [&str; 3] = ["rdma", "soft", "soft-tcp"];

/// Connects queues over RDMA (see the module documentation). Clones share the device and the
/// host poll groups.
#[derive(Clone)]
pub struct RdmaFabric {
    kind: ProviderKind,
    /// The soft TCP device this fabric opened (kept open while any clone lives).
    device: Option<Context>,
    groups: Arc<group::Registry>,
    group_config: HostGroupConfig,
    /// Reactors the I/O queues are spread over (0: one group for every queue).
    reactors: usize,
}

impl std::fmt::Debug for RdmaFabric {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RdmaFabric")
            .field("kind", &self.kind)
            .finish()
    }
}

impl RdmaFabric {
    /// A fabric for transport `name` ("rdma", "soft", "soft-tcp"); `local` is the soft TCP
    /// device's own address (the address the target is reached from; 127.0.0.1 by default).
    pub fn new(name: &str, local: Option<Ipv4Addr>) -> Result<RdmaFabric, ConnectError> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        match name {
            "rdma" => Ok(RdmaFabric::with(ProviderKind::Verbs, None)),
            "soft" => Ok(RdmaFabric::with(ProviderKind::Soft, None)),
            "soft-tcp" => {
                let n = NEXT.fetch_add(1, Ordering::Relaxed);
                let ctx = Context::open(&DeviceSpec::Soft(SoftConfig {
                    name: format!("host{}-{n}", std::process::id()),
                    fabric: SoftFabric::Tcp,
                    ip: local.unwrap_or(Ipv4Addr::LOCALHOST),
                    ..SoftConfig::default()
                }))
                .map_err(|e| ConnectError::Resources(format!("soft TCP device: {e}")))?;
                Ok(RdmaFabric::with(ProviderKind::Soft, Some(ctx)))
            }
            other => Err(ConnectError::Unreachable(format!(
                "transport '{other}' is not one of {TRANSPORTS:?}"
            ))),
        }
    }

    fn with(kind: ProviderKind, device: Option<Context>) -> RdmaFabric {
        RdmaFabric {
            kind,
            device,
            groups: Arc::default(),
            group_config: HostGroupConfig::default(),
            reactors: 0,
        }
    }

    /// Spread queues over `reactors` host poll groups: admin queues join the control thread's
    /// group ([`QueueHome::Control`]), I/O queue `qid` joins reactor `(qid - 1) % reactors`'s,
    /// the split [`crate::perf::runner`] uses when it moves I/O queues to its reactors. With 0
    /// (the default) every queue joins one group, for a single-threaded user.
    pub fn spread(mut self, reactors: usize) -> RdmaFabric {
        self.reactors = reactors;
        self
    }

    /// Size of the host poll groups made from now on (see [`HostGroupConfig`]).
    pub fn group_config(mut self, config: HostGroupConfig) -> RdmaFabric {
        self.group_config = config;
        self
    }

    /// The device this fabric opened for its queues (soft TCP: its own soft device, with the
    /// address it reaches targets from); None where each queue takes the device its target's
    /// address resolves to ("rdma", "soft").
    pub fn own_device(&self) -> Option<&Context> {
        self.device.as_ref()
    }

    /// The live host poll groups of this fabric and its clones.
    pub fn host_groups(&self) -> Vec<HostGroupInfo> {
        self.groups.info()
    }

    /// Memory windows (per-I/O keys) the host invalidated itself because the target's
    /// response left them valid, over every host poll group this fabric and its clones made,
    /// those gone with their queues included (each live group's share:
    /// [`HostGroupInfo::local_invalidations`]).
    pub fn local_invalidations(&self) -> u64 {
        self.groups.local_invalidations()
    }

    fn home(&self, qid: u16) -> QueueHome {
        match (self.reactors, qid) {
            (0, _) => QueueHome::Reactor(0),
            (_, 0) => QueueHome::Control,
            (n, q) => QueueHome::Reactor(usize::from(q - 1) % n),
        }
    }
}

fn socket_address(address: &TransportAddress) -> Result<SocketAddr, ConnectError> {
    let port: u16 = address.service.parse().map_err(|_| {
        ConnectError::Unreachable(format!("service '{}' is not a port", address.service))
    })?;
    if let Ok(ip) = address.address.parse::<IpAddr>() {
        return Ok(SocketAddr::new(ip, port));
    }
    (address.address.as_str(), port)
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.find(|a| a.is_ipv4()))
        .ok_or_else(|| ConnectError::Unreachable(format!("cannot resolve '{}'", address.address)))
}

impl Fabric for RdmaFabric {
    type Queue = RdmaQueue;

    fn connect(&self, params: &QueueConnectParams) -> Result<RdmaQueue, ConnectError> {
        let addr = socket_address(&params.address)?;
        let resources = |what: &str| {
            let what = what.to_string();
            move |e: nvmf_transport::TransportError| ConnectError::Resources(format!("{what}: {e}"))
        };
        let channel = CmChannel::new(self.kind).map_err(resources("CM channel"))?;
        let id = channel
            .resolve(addr, None, CONNECT_TIMEOUT, u64::from(params.qid))
            .map_err(|e| ConnectError::Unreachable(format!("resolve {addr}: {e}")))?;
        let ctx = id.context().map_err(resources("device"))?;
        let home = self.home(params.qid);
        let group = self
            .groups
            .group(&ctx, home, self.group_config)
            .map_err(resources("host poll group"))?;
        let mut g = group::lock(&group);
        // HSQSIZE is 0's based; the host never has more commands out than it can take answers.
        let wanted = (u32::from(params.hsqsize) + 1).min(u32::from(params.hrqsize).max(1));
        let depth = g.depth_for(wanted);
        if depth < wanted {
            tracing::info!(
                qid = params.qid,
                wanted,
                depth,
                "queue depth cut to the host poll group's max_queue_depth"
            );
        }
        let access = Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE;
        // MW_BIND lets per-I/O windows cover the region; a device without windows may refuse
        // the flag, so the region is registered without it then.
        let len = params.data_region_len.max(64);
        let mr = match g.pg.pd().alloc_mr(len, access | Access::MW_BIND) {
            Ok(mr) => mr,
            Err(_) => {
                g.pg.pd()
                    .alloc_mr(len, access)
                    .map_err(resources("data region"))?
            }
        };
        let token = g.join(side::Side::new(params.qid, depth as usize), depth)?;
        // The host issues no RDMA READs (initiator depth 0; the group wants a read depth of at
        // least 1); the target READs host memory.
        let qp_num = match g.pg.add_cm_qpair(id, depth, 1, token) {
            Ok(q) => q,
            Err(e) => {
                g.leave(token);
                return Err(ConnectError::Resources(format!("host qpair: {e:?}")));
            }
        };
        let Some(handle) = g.pg.qpair_handle(qp_num) else {
            g.leave(token);
            return Err(ConnectError::Resources("qpair vanished".into()));
        };
        g.route_events(token, qp_num);
        drop(g);
        // From here on dropping the queue tears the qpair down and leaves the group.
        let mut queue = RdmaQueue {
            group,
            token,
            mr,
            host: vec![0; params.data_region_len],
            qid: params.qid,
            channel,
            qp_num,
            handle,
            depth: depth as u16,
            in_capsule_limit: params.in_capsule_data,
            disconnected: false,
            lost: None,
            seen_polls: 0,
            idle_polls: 0,
        };
        let private_data = RdmaConnectRequest {
            recfmt: 0,
            qid: params.qid,
            hrqsize: depth as u16,
            hsqsize: (depth - 1) as u16,
            cntlid: params.cntlid,
        }
        .to_bytes()
        .to_vec();
        let param = ConnParam {
            private_data,
            responder_resources: 16,
            initiator_depth: 0,
            retry_count: 7,
            rnr_retry_count: 7,
        };
        group::lock(&queue.group)
            .pg
            .connect(qp_num, &param)
            .map_err(|e| ConnectError::Unreachable(format!("connect {addr}: {e}")))?;
        // Waiting for the CM answer without the group's lock: the group's other queues go on.
        let event = queue
            .channel
            .wait_event(CONNECT_TIMEOUT)
            .map_err(|e| ConnectError::Unreachable(format!("{addr}: {e}")))?;
        let crqsize = match &event.kind {
            CmEventKind::Established { private_data } => RdmaAccept::decode(private_data)
                .map(|a| a.crqsize)
                .unwrap_or(depth as u16),
            CmEventKind::Rejected {
                reason,
                private_data,
            } => {
                // An NVMe-oF reject carries its status; a bare one means nobody listens there.
                return Err(match RdmaReject::decode(private_data) {
                    Ok(r) => {
                        ConnectError::Rejected(format!("{addr} qid {}: {:?}", params.qid, r.status))
                    }
                    Err(_) => ConnectError::Unreachable(format!(
                        "{addr}: no NVMe-oF listener (CM reject, reason {reason})"
                    )),
                });
            }
            other => return Err(ConnectError::Unreachable(format!("{addr}: {other:?}"))),
        };
        let mut g = group::lock(&queue.group);
        let group::HostGroup { pg, router, .. } = &mut *g;
        pg.handle_cm_event(router, qp_num, &event.kind);
        let side = router.side(token);
        if !side.as_ref().is_some_and(|s| s.active) {
            let why = side.and_then(|s| s.lost.clone());
            return Err(ConnectError::Resources(format!(
                "qpair did not become active: {why:?}"
            )));
        }
        drop(g);
        queue.depth = (u32::from(crqsize)).clamp(1, depth) as u16;
        Ok(queue)
    }
}
