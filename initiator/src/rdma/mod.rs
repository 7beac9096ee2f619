//! The RDMA transport glue: [`RdmaFabric`] connects queues through the RDMA CM (NVMe-oF private
//! data), each on a host-side poll group of the transport crate; [`RdmaQueue`] is one
//! connected queue.
//!
//! Providers (by [`TransportAddress::transport`]): `rdma` = real verbs; `soft-tcp` = the soft
//! device over TCP (the initiator opens its own soft device, so the target may be another
//! process); `soft` = the soft device in process (the target's listener lives in this same
//! process, as in tests).
//!
//! Per-I/O keys (`bind_window`): `windows.rs`, a pool of memory windows per queue, where the
//! device has them.
//!
//! Today each queue has its own poll group (one CQ, one qpair): a queue is then the unit a
//! reactor owns, with no completions of other queues to keep. Sharing one group per reactor
//! across queues is the next step (the trait contract allows it).

mod queue;
mod windows;

use std::net::{IpAddr, Ipv4Addr, SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use nvmf_protocol::cm::{RdmaAccept, RdmaConnectRequest, RdmaReject};
use nvmf_transport::pollgroup::{PollGroup, PollGroupConfig, RecvMode};
use nvmf_transport::{
    Access, CmChannel, CmEventKind, ConnParam, Context, DeviceSpec, ProviderKind, SoftConfig,
    SoftFabric,
};

pub use queue::RdmaQueue;

use crate::queue::{ConnectError, Fabric, QueueConnectParams, TransportAddress};

/// How long resolving and connecting may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The transport names this module serves.
pub const TRANSPORTS: [&str; 3] = ["rdma", "soft", "soft-tcp"];

/// Connects queues over RDMA (see the module documentation). Clones share the device.
#[derive(Clone)]
pub struct RdmaFabric {
    kind: ProviderKind,
    /// The soft TCP device this fabric opened (kept open while any clone lives).
    _device: Option<Context>,
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
            "rdma" => Ok(RdmaFabric {
                kind: ProviderKind::Verbs,
                _device: None,
            }),
            "soft" => Ok(RdmaFabric {
                kind: ProviderKind::Soft,
                _device: None,
            }),
            "soft-tcp" => {
                let n = NEXT.fetch_add(1, Ordering::Relaxed);
                let ctx = Context::open(&DeviceSpec::Soft(SoftConfig {
                    name: format!("host{}-{n}", std::process::id()),
                    fabric: SoftFabric::Tcp,
                    ip: local.unwrap_or(Ipv4Addr::LOCALHOST),
                    ..SoftConfig::default()
                }))
                .map_err(|e| ConnectError::Resources(format!("soft TCP device: {e}")))?;
                Ok(RdmaFabric {
                    kind: ProviderKind::Soft,
                    _device: Some(ctx),
                })
            }
            other => Err(ConnectError::Unreachable(format!(
                "transport '{other}' is not one of {TRANSPORTS:?}"
            ))),
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
        // HSQSIZE is 0's based; the host never has more commands out than it can take answers.
        let depth = u32::from(params.hsqsize) + 1;
        let recvs = u32::from(params.hrqsize).max(depth);
        let capsule = 64 + params.in_capsule_data.next_multiple_of(16) as u32;
        let cfg = PollGroupConfig {
            srq_depth: recvs,
            max_qpairs: 1,
            max_queue_depth: depth,
            // Host receive slots take 16-byte responses only.
            in_capsule_data_size: 0,
            io_unit_size: capsule,
            data_buffers: depth,
            max_requests: depth,
            ..PollGroupConfig::default()
        };
        let mut pg = PollGroup::new_host(&ctx, cfg, RecvMode::PerQpair { recvs })
            .map_err(resources("host poll group"))?;
        let access = Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE;
        // MW_BIND lets per-I/O windows cover the region; a device without windows may refuse
        // the flag, so the region is registered without it then.
        let len = params.data_region_len.max(64);
        let mr = match pg.pd().alloc_mr(len, access | Access::MW_BIND) {
            Ok(mr) => mr,
            Err(_) => pg
                .pd()
                .alloc_mr(len, access)
                .map_err(resources("data region"))?,
        };
        let mut side = queue::Side {
            mr,
            host: vec![0; params.data_region_len],
            by_cid: std::collections::HashMap::with_capacity(depth as usize * 2),
            done: std::collections::VecDeque::with_capacity(depth as usize),
            lost: None,
            active: false,
            qid: params.qid,
            windows: None,
        };
        // The host issues no RDMA READs (initiator depth 0; the group wants a read depth of at
        // least 1); the target READs host memory.
        let qp_num = pg
            .add_cm_qpair(id, depth, 1, u64::from(params.qid))
            .map_err(|e| ConnectError::Resources(format!("host qpair: {e:?}")))?;
        let private_data = RdmaConnectRequest {
            recfmt: 0,
            qid: params.qid,
            hrqsize: params.hrqsize,
            hsqsize: params.hsqsize,
            cntlid: params.cntlid,
        }
        .to_bytes()
        .to_vec();
        pg.connect(
            qp_num,
            &ConnParam {
                private_data,
                responder_resources: 16,
                initiator_depth: 0,
                retry_count: 7,
                rnr_retry_count: 7,
            },
        )
        .map_err(|e| ConnectError::Unreachable(format!("connect {addr}: {e}")))?;
        let event = channel
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
        pg.handle_cm_event(&mut side, qp_num, &event.kind);
        if !side.active {
            return Err(ConnectError::Resources(format!(
                "qpair did not become active: {:?}",
                side.lost
            )));
        }
        let handle = pg
            .qpair_handle(qp_num)
            .ok_or_else(|| ConnectError::Resources("qpair vanished".into()))?;
        Ok(RdmaQueue {
            pg,
            side,
            channel,
            qp_num,
            handle,
            depth: (crqsize as u32).clamp(1, depth) as u16,
            in_capsule_limit: params.in_capsule_data,
            disconnected: false,
            idle_polls: 0,
        })
    }
}
