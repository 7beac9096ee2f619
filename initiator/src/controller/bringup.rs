//! Controller bring-up over the queue traits, in the Linux host's order: admin queue connect
//! (CNTLID 0xFFFF, Connect data by keyed SGL or in-capsule), CAP and VS, CC.EN=1 with IOSQES 6
//! and IOCQES 4, CSTS.RDY within CAP.TO, Identify Controller, Set Features Number of Queues,
//! I/O queue connects, namespaces. Also the clean shutdown (CC.SHN, wait for SHST).

use std::time::Duration;

use nvmf_protocol::FixedStr;
use nvmf_protocol::admin::{IdentifyCmd, SetFeaturesCmd};
use nvmf_protocol::fabrics::{
    CNTLID_DYNAMIC, ConnectCmd, ConnectData, ConnectResponse, PropertyGetCmd, PropertySetCmd,
    PropertySize,
};
use nvmf_protocol::features::{FeatureId, NumberOfQueues};
use nvmf_protocol::identify::{
    Cns, IDENTIFY_DATA_SIZE, IdentifyController, IdentifyNamespace, NsIdDescriptor, NsList,
    SGLS_OFFSET,
};
use nvmf_protocol::properties::{
    Cap, Cc, Csts, PropertyOffset, ShutdownNotification, ShutdownStatus, Vs,
};

use crate::admin::{AdminQueue, DataPlacement, Transfer};
use crate::clock::SharedClock;
use crate::controller::namespace::Namespace;
use crate::controller::options::ControllerOptions;
use crate::error::{Error, Result};
use crate::io::{IoLimits, IoQueue};
use crate::queue::{Fabric, QueueConnectParams, TransportAddress};

/// Bytes of one admin command slot (Identify data; log pages are read in pieces this size).
pub const ADMIN_SLOT: usize = 4096;
/// How often CSTS is read while waiting for RDY or SHST.
const CSTS_POLL: Duration = Duration::from_millis(1);

/// What the admin bring-up learned.
#[derive(Debug)]
pub(crate) struct AdminSession<Q: crate::queue::HostQueue> {
    pub admin: AdminQueue<Q>,
    pub cntlid: u16,
    pub cap: Cap,
    pub vs: Vs,
    pub identify: Box<IdentifyController>,
}

fn connect_data(o: &ControllerOptions, cntlid: u16) -> Result<[u8; 1024]> {
    let subnqn = FixedStr::new(&o.subnqn, "SUBNQN")?;
    let hostnqn = FixedStr::new(&o.hostnqn, "HOSTNQN")?;
    Ok(ConnectData {
        hostid: o.hostid,
        cntlid,
        subnqn,
        hostnqn,
    }
    .to_bytes())
}

/// Fabrics Connect on a freshly connected queue; returns the CNTLID the controller answered.
fn fabrics_connect<Q: crate::queue::HostQueue>(
    q: &mut AdminQueue<Q>,
    o: &ControllerOptions,
    qid: u16,
    cntlid: u16,
    placement: DataPlacement,
) -> Result<u16> {
    let depth = q.queue().depth();
    let sqe = ConnectCmd {
        cid: 0,
        recfmt: 0,
        qid,
        sqsize: depth.saturating_sub(1).max(1),
        cattr: 0,
        kato: if qid == 0 {
            o.kato.as_millis().min(u128::from(u32::MAX)) as u32
        } else {
            0
        },
        sgl: nvmf_protocol::SglDescriptor::NULL,
    }
    .to_sqe();
    let data = connect_data(o, cntlid)?;
    let (cqe, _) = q.execute("Connect", sqe, Transfer::FromHost(&data, placement))?;
    Ok(ConnectResponse::from_dw0(cqe.dw0).cntlid)
}

pub(super) fn property_get<Q: crate::queue::HostQueue>(
    q: &mut AdminQueue<Q>,
    offset: PropertyOffset,
) -> Result<u64> {
    let size = if offset == PropertyOffset::Cap {
        PropertySize::Eight
    } else {
        PropertySize::Four
    };
    let sqe = PropertyGetCmd {
        cid: 0,
        size,
        offset,
    }
    .to_sqe();
    let (cqe, _) = q.execute("Property Get", sqe, Transfer::None)?;
    Ok(cqe.result64())
}

fn property_set<Q: crate::queue::HostQueue>(
    q: &mut AdminQueue<Q>,
    offset: PropertyOffset,
    value: u32,
) -> Result<()> {
    let sqe = PropertySetCmd {
        cid: 0,
        size: PropertySize::Four,
        offset,
        value: u64::from(value),
    }
    .to_sqe();
    q.execute("Property Set", sqe, Transfer::None).map(|_| ())
}

/// Read CSTS until `done` holds or `timeout` passes.
fn wait_csts<Q: crate::queue::HostQueue>(
    q: &mut AdminQueue<Q>,
    clock: &SharedClock,
    timeout: Duration,
    what: &'static str,
    done: impl Fn(&Csts) -> bool,
) -> Result<Csts> {
    let deadline = clock.now() + timeout;
    loop {
        let csts = Csts::from_u32(property_get(q, PropertyOffset::Csts)? as u32);
        if csts.cfs {
            return Err(Error::Target(format!(
                "controller fatal status while waiting for {what}"
            )));
        }
        if done(&csts) {
            return Ok(csts);
        }
        if clock.now() >= deadline {
            return Err(Error::Timeout {
                what,
                after: timeout,
            });
        }
        clock.idle(CSTS_POLL);
    }
}

/// Identify with CNS `cns` for `nsid`.
pub(crate) fn identify<Q: crate::queue::HostQueue>(
    q: &mut AdminQueue<Q>,
    cns: Cns,
    nsid: u32,
) -> Result<Vec<u8>> {
    let sqe = IdentifyCmd {
        cid: 0,
        nsid,
        cns,
        cntid: 0,
        cns_specific_id: 0,
        csi: 0,
        uuid_index: 0,
        sgl: nvmf_protocol::SglDescriptor::NULL,
    }
    .to_sqe();
    Ok(
        q.execute("Identify", sqe, Transfer::ToHost(IDENTIFY_DATA_SIZE))?
            .1,
    )
}

/// Connect the admin queue and enable the controller.
pub(crate) fn bring_up_admin<F: Fabric>(
    fabric: &F,
    address: &TransportAddress,
    o: &ControllerOptions,
    clock: &SharedClock,
) -> Result<AdminSession<F::Queue>> {
    let depth = o.admin_queue_depth.max(2);
    let params = QueueConnectParams {
        address: address.clone(),
        qid: 0,
        hrqsize: depth,
        hsqsize: depth - 1,
        cntlid: CNTLID_DYNAMIC,
        data_region_len: usize::from(depth) * ADMIN_SLOT,
        in_capsule_data: if o.connect_data == DataPlacement::InCapsule {
            1024
        } else {
            0
        },
    };
    let queue = fabric
        .connect(&params)
        .map_err(|source| Error::Connect { qid: 0, source })?;
    let mut admin = AdminQueue::new(queue, ADMIN_SLOT, clock.clone(), o.admin_timeout);
    let cntlid = fabrics_connect(&mut admin, o, 0, CNTLID_DYNAMIC, o.connect_data)?;
    let cap = Cap::from_u64(property_get(&mut admin, PropertyOffset::Cap)?);
    let vs = Vs::from_u32(property_get(&mut admin, PropertyOffset::Vs)? as u32);
    let cc = Cc::enabled_nvm();
    property_set(&mut admin, PropertyOffset::Cc, cc.to_u32())?;
    let timeout = Duration::from_millis(u64::from(cap.timeout_ms()).max(500));
    wait_csts(&mut admin, clock, timeout, "CSTS.RDY", |c| c.rdy)?;
    let identify = Box::new(IdentifyController::decode(&identify(
        &mut admin,
        Cns::Controller,
        0,
    )?)?);
    Ok(AdminSession {
        admin,
        cntlid,
        cap,
        vs,
        identify,
    })
}

/// Set Features Number of Queues; returns the count granted (at most `wanted`).
pub(crate) fn negotiate_queues<Q: crate::queue::HostQueue>(
    q: &mut AdminQueue<Q>,
    wanted: u16,
) -> Result<u16> {
    let wanted = wanted.max(1);
    let req = NumberOfQueues::from_counts(u32::from(wanted), u32::from(wanted))
        .ok_or_else(|| Error::InvalidArgument(format!("{wanted} I/O queues")))?;
    let sqe = SetFeaturesCmd {
        cid: 0,
        nsid: 0,
        fid: FeatureId::NumberOfQueues,
        save: false,
        cdw11: req.to_dword(),
        cdw12: 0,
        cdw13: 0,
        uuid_index: 0,
        cdw15: 0,
        sgl: nvmf_protocol::SglDescriptor::NULL,
    }
    .to_sqe();
    let (cqe, _) = q.execute("Set Features (Number of Queues)", sqe, Transfer::None)?;
    let granted = NumberOfQueues::from_dword(cqe.dw0);
    let n = (u32::from(granted.nsq.min(granted.ncq)) + 1).min(u32::from(wanted));
    Ok(n as u16)
}

/// I/O limits from Identify Controller and the options.
pub(crate) fn io_limits(id: &IdentifyController, o: &ControllerOptions) -> IoLimits {
    // MDTS is in units of the minimum memory page size; fabrics controllers report MPSMIN 0
    // (4 KiB).
    let mdts = if id.mdts == 0 {
        usize::MAX
    } else {
        4096usize.saturating_mul(1 << id.mdts.min(20))
    };
    let max_transfer = o.max_io_size.min(mdts).max(512);
    let in_capsule = if o.in_capsule_data && id.sgls & SGLS_OFFSET != 0 && id.icdoff == 0 {
        id.in_capsule_data_size() as usize
    } else {
        0
    };
    IoLimits {
        max_transfer,
        in_capsule,
        timeout: o.io_timeout,
        per_io_keys: o.per_io_keys,
    }
}

/// Bytes of registered data region of one I/O queue: what the options ask, between one
/// largest transfer (and the 1024 bytes of Connect data) and one per command.
pub(crate) fn io_region_len(o: &ControllerOptions, depth: u16, max_transfer: usize) -> usize {
    let every_command = usize::from(depth).saturating_mul(max_transfer);
    o.io_queue_data_size
        .unwrap_or(every_command)
        .clamp(max_transfer.max(1024), every_command.max(1024))
}

/// I/O queue depth to ask for.
pub(crate) fn io_depth(cap: &Cap, id: &IdentifyController, o: &ControllerOptions) -> u16 {
    let mut d = u32::from(o.io_queue_depth).min(cap.max_queue_entries());
    if id.maxcmd != 0 {
        d = d.min(u32::from(id.maxcmd));
    }
    d.max(2) as u16
}

/// Connect I/O queue `qid` and run its Fabrics Connect.
#[allow(clippy::too_many_arguments)]
pub(crate) fn connect_io_queue<F: Fabric>(
    fabric: &F,
    address: &TransportAddress,
    o: &ControllerOptions,
    clock: &SharedClock,
    cntlid: u16,
    qid: u16,
    depth: u16,
    limits: IoLimits,
) -> Result<IoQueue<F::Queue>> {
    let params = QueueConnectParams {
        address: address.clone(),
        qid,
        hrqsize: depth,
        hsqsize: depth - 1,
        cntlid,
        data_region_len: io_region_len(o, depth, limits.max_transfer),
        // Placement below uses the capsule only when this already holds 1024 bytes.
        in_capsule_data: limits.in_capsule,
    };
    let queue = fabric
        .connect(&params)
        .map_err(|source| Error::Connect { qid, source })?;
    let mut sync = AdminQueue::new(
        queue,
        limits.max_transfer.max(1024),
        clock.clone(),
        o.admin_timeout,
    );
    // Linux sends I/O queue Connect data by keyed SGL too; in-capsule when the target allows.
    let placement = if limits.in_capsule >= 1024 {
        o.connect_data
    } else {
        DataPlacement::Keyed
    };
    let answered = fabrics_connect(&mut sync, o, qid, cntlid, placement)?;
    if answered != cntlid {
        return Err(Error::Target(format!(
            "I/O queue {qid} Connect answered CNTLID {answered}, expected {cntlid}"
        )));
    }
    Ok(IoQueue::new(sync.into_queue(), limits, clock.clone()))
}

/// Active namespaces with their identify data.
pub(crate) fn scan_namespaces<Q: crate::queue::HostQueue>(
    q: &mut AdminQueue<Q>,
) -> Result<Vec<Namespace>> {
    let list = NsList::decode(&identify(q, Cns::ActiveNamespaceList, 0)?)?;
    let mut out = Vec::new();
    for &nsid in list.as_slice() {
        let id = IdentifyNamespace::decode(&identify(q, Cns::Namespace, nsid)?)?;
        // Descriptors are optional before NVMe 1.3: a controller without them still works.
        let descriptors = match identify(q, Cns::NamespaceDescriptors, nsid) {
            Ok(page) => NsIdDescriptor::decode_list(&page).unwrap_or_default(),
            Err(Error::Nvme { .. }) => Vec::new(),
            Err(e) => return Err(e),
        };
        // One unusable namespace (unknown LBA format) must not make the others unreachable.
        match Namespace::from_identify(nsid, id, &descriptors) {
            Ok(ns) => out.push(ns),
            Err(e) => tracing::warn!(nsid, error = %e, "namespace skipped"),
        }
    }
    Ok(out)
}

/// How long a normal shutdown may take: Identify's RTD3E (the controller's own figure for
/// entering D3), at least 5 s and at most 60 s, as the Linux host waits; and never less than
/// CAP.TO, which this host waited before (it bounds enabling, and a target flushing a
/// write-back cache at shutdown may need as long).
pub(crate) fn shutdown_wait(rtd3e_us: u32, cap: &Cap) -> Duration {
    let rtd3e = Duration::from_micros(u64::from(rtd3e_us));
    let to = Duration::from_millis(u64::from(cap.timeout_ms()));
    rtd3e
        .max(to)
        .clamp(Duration::from_secs(5), Duration::from_secs(60))
}

/// CC.SHN = normal, then wait for CSTS.SHST = complete within [`shutdown_wait`].
pub(crate) fn shutdown<Q: crate::queue::HostQueue>(
    q: &mut AdminQueue<Q>,
    rtd3e_us: u32,
    cap: &Cap,
    clock: &SharedClock,
) -> Result<()> {
    let cc = Cc::from_u32(property_get(q, PropertyOffset::Cc)? as u32);
    let cc = Cc {
        shn: ShutdownNotification::Normal,
        ..cc
    };
    property_set(q, PropertyOffset::Cc, cc.to_u32())?;
    wait_csts(q, clock, shutdown_wait(rtd3e_us, cap), "CSTS.SHST", |c| {
        c.shst == ShutdownStatus::Complete
    })?;
    Ok(())
}
