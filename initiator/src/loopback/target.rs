//! The fake NVMe-oF target behind the loopback fabric: decodes each capsule with
//! nvmf-protocol and answers like a small fabrics controller (Connect, Property Get/Set,
//! Identify, Set/Get Features, Get Log Page incl. discovery, Keep Alive, Read, Write, Compare,
//! Flush, Write Zeroes, Dataset Management) over `Vec<u8>` namespaces. Data moves through the
//! host queue's region exactly as the SGL says (keyed: address and key checked against the
//! region; offset: the in-capsule bytes), so the initiator's SGL encoding is tested too.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::{Arc, Mutex, MutexGuard};

use nvmf_protocol::fabrics::{CNTLID_DYNAMIC, CONNECT_DATA_SIZE, ConnectData, ConnectResponse};
use nvmf_protocol::features::{FeatureId, NumberOfQueues};
use nvmf_protocol::identify::{
    Cns, IDENTIFY_DATA_SIZE, IdentifyController, IdentifyNamespace, NsIdDescriptor, NsList,
    SGLS_KEYED, SGLS_OFFSET, SGLS_SUPPORTED,
};
use nvmf_protocol::log::{
    AddressFamily, DiscoveryLog, DiscoveryLogEntry, LogId, RdmaTsas, SMART_LOG_SIZE, SmartLog,
    SubsystemType, TransportType, Tsas,
};
use nvmf_protocol::nvm::{DSM_RANGE_SIZE, DsmRange};
use nvmf_protocol::properties::{
    Cap, Cc, Csts, PropertyOffset, ShutdownNotification, ShutdownStatus, Vs,
};
use nvmf_protocol::sqe::FABRICS_OPCODE;
use nvmf_protocol::status::{CommandSpecificStatus, FabricsStatus, GenericStatus, MediaStatus};
use nvmf_protocol::{
    AdminOpcode, Cqe, DISCOVERY_NQN, FabricsType, FixedStr, IoOpcode, SglDescriptor, Sqe, Status,
    StatusCode,
};

use crate::queue::{ConnectError, DataRegion, QueueConnectParams};

/// One namespace of the fake target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NamespaceConfig {
    /// Size in blocks.
    pub blocks: u64,
    /// log2 of the block size (9 = 512 B, 12 = 4 KiB).
    pub block_shift: u8,
}

/// What the fake controller advertises and how it behaves.
#[derive(Debug, Clone)]
pub struct LoopbackConfig {
    /// NVM subsystem NQN.
    pub subnqn: String,
    /// MDTS (2^n * 4 KiB; 0 = no limit).
    pub mdts: u8,
    /// Largest I/O queue depth (CAP.MQES + 1).
    pub max_queue_depth: u16,
    /// Largest admin queue depth.
    pub max_admin_depth: u16,
    /// I/O queues the controller grants at most.
    pub max_io_queues: u16,
    /// SGLS field of Identify Controller.
    pub sgls: u32,
    /// IOCCSZ (16-byte units; 4 = no in-capsule data).
    pub ioccsz: u32,
    /// CAP.TO (500 ms units).
    pub cap_to: u8,
    /// KAS (100 ms units).
    pub kas: u16,
    /// CSTS reads after CC.EN=1 (or CC.SHN) before RDY (or SHST complete); `u32::MAX` = never.
    pub ready_after_reads: u32,
    /// Namespaces, NSID 1.. in order.
    pub namespaces: Vec<NamespaceConfig>,
    /// Subsystems the discovery log lists (NQN, address, service).
    pub discovery_entries: Vec<(String, String, String)>,
    /// The "device" supports memory windows (per-command keys).
    pub memory_windows: bool,
    /// Reads of the discovery log (any offset, counted from 1) before which it changes
    /// (GENCTR + 1, one more entry): a log that moves while the host reads it.
    pub discovery_changes_at: Vec<u32>,
}

impl Default for LoopbackConfig {
    fn default() -> Self {
        Self {
            subnqn: "nqn.2024-01.io.nvmf-rs:loopback".into(),
            mdts: 5, // 128 KiB
            max_queue_depth: 128,
            max_admin_depth: 32,
            max_io_queues: 8,
            sgls: SGLS_SUPPORTED | SGLS_KEYED | SGLS_OFFSET,
            ioccsz: 4 + 4096 / 16,
            cap_to: 30,
            kas: 100,
            ready_after_reads: 2,
            namespaces: vec![NamespaceConfig {
                blocks: 2048,
                block_shift: 9,
            }],
            discovery_entries: vec![(
                "nqn.2024-01.io.nvmf-rs:loopback".into(),
                "127.0.0.1".into(),
                "4420".into(),
            )],
            memory_windows: false,
            discovery_changes_at: Vec::new(),
        }
    }
}

/// Counters the tests assert on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoopbackStats {
    /// Commands executed.
    pub commands: u64,
    /// Queue connections accepted (CM level).
    pub queue_connects: u64,
    /// Keep Alive commands.
    pub keep_alives: u64,
    /// Writes whose data came in the capsule.
    pub in_capsule_writes: u64,
    /// Writes whose data was fetched by keyed SGL.
    pub keyed_writes: u64,
    /// Connect data received in the capsule.
    pub connect_data_in_capsule: u64,
    /// Connect data received by keyed SGL.
    pub connect_data_keyed: u64,
    /// Last CC written.
    pub last_cc: Option<u32>,
    /// Queues the host disconnected.
    pub queue_disconnects: u64,
    /// `queue_disconnects` when the host set CC.SHN.
    pub disconnects_before_shutdown: Option<u64>,
    /// Largest data transfer of one command.
    pub largest_transfer: usize,
    /// Opcodes of the I/O commands executed, in order (capped at 4096 entries).
    pub io_opcodes: Vec<u8>,
    /// Data transfers through a per-command window key.
    pub window_transfers: u64,
}

/// A capsule as the fake target receives it.
#[derive(Debug, Clone)]
pub(super) struct Capsule {
    pub qid: u16,
    pub cntlid: Option<u16>,
    pub sqe: Sqe,
    pub in_capsule: Option<Range<usize>>,
    pub region_info: DataRegion,
    pub sqhd: u16,
    /// A window bound for this command only: (key, range of the region).
    pub window: Option<(u32, Range<usize>)>,
}

/// What executing a capsule produced.
#[derive(Debug, Default)]
pub(super) struct Outcome {
    pub responses: Vec<Cqe>,
    pub connected_cntlid: Option<u16>,
}

#[derive(Debug)]
struct FakeController {
    discovery: bool,
    cc: Cc,
    csts: Csts,
    countdown: u32,
    granted_io_queues: u16,
    features: HashMap<u8, u32>,
    /// Data buffers Set Features carried, by FID (Get Features returns them).
    feature_data: HashMap<u8, Vec<u8>>,
}

#[derive(Debug, Default)]
struct Faults {
    refuse_connects: bool,
    drop_after: Option<u64>,
    duplicate_next: bool,
    swallow: u32,
    fail_next_io: Option<Status>,
    reorder: bool,
}

#[derive(Debug)]
struct State {
    config: LoopbackConfig,
    namespaces: Vec<Vec<u8>>,
    controllers: HashMap<u16, FakeController>,
    next_cntlid: u16,
    next_key: u32,
    epoch: u64,
    faults: Faults,
    stats: LoopbackStats,
    /// Reads of the discovery log so far.
    discovery_reads: u32,
}

/// The shared fake target (cheap clone).
#[derive(Debug, Clone)]
pub struct LoopbackTarget {
    state: Arc<Mutex<State>>,
}

type Answer = Result<(u64, Option<u16>), Status>;

fn generic(c: GenericStatus) -> Status {
    Status::generic(c)
}

impl LoopbackTarget {
    /// A target with `config`; namespaces start zeroed.
    pub fn new(config: LoopbackConfig) -> Self {
        let namespaces = config
            .namespaces
            .iter()
            .map(|n| vec![0u8; (n.blocks << n.block_shift) as usize])
            .collect();
        Self {
            state: Arc::new(Mutex::new(State {
                config,
                namespaces,
                controllers: HashMap::new(),
                next_cntlid: 1,
                next_key: 1,
                epoch: 1,
                faults: Faults::default(),
                stats: LoopbackStats::default(),
                discovery_reads: 0,
            })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Drop every connection now (like a target crash); controllers are forgotten, namespace
    /// data stays.
    pub fn drop_connections(&self) {
        self.lock().drop_all();
    }
    /// Drop every connection after `n` more commands (the n-th command's response is lost).
    pub fn drop_after(&self, n: u64) {
        self.lock().faults.drop_after = Some(n);
    }
    /// Queues connected from now on hold at most `depth` commands (CAP.MQES + 1 and MAXCMD),
    /// as a target restarted with a smaller queue size would; connected queues keep theirs.
    pub fn set_max_queue_depth(&self, depth: u16) {
        self.lock().config.max_queue_depth = depth.max(2);
    }
    /// Controllers made from now on grant at most `n` I/O queues.
    pub fn set_max_io_queues(&self, n: u16) {
        self.lock().config.max_io_queues = n;
    }
    /// Refuse (or accept again) new queue connections.
    pub fn refuse_connects(&self, refuse: bool) {
        self.lock().faults.refuse_connects = refuse;
    }
    /// Answer the next command twice (a late duplicate completion).
    pub fn duplicate_next_response(&self) {
        self.lock().faults.duplicate_next = true;
    }
    /// Never answer the next `n` commands.
    pub fn swallow_next(&self, n: u32) {
        self.lock().faults.swallow = n;
    }
    /// Deliver responses newest first from now on (targets complete out of order).
    pub fn reorder_responses(&self, reorder: bool) {
        self.lock().faults.reorder = reorder;
    }
    pub(super) fn reordering(&self) -> bool {
        self.lock().faults.reorder
    }
    /// Fail the next I/O command with `status`.
    pub fn fail_next_io(&self, status: Status) {
        self.lock().faults.fail_next_io = Some(status);
    }
    /// Counters so far.
    pub fn stats(&self) -> LoopbackStats {
        self.lock().stats.clone()
    }
    /// A copy of namespace `nsid`'s bytes `range`.
    pub fn read_namespace(&self, nsid: u32, range: Range<usize>) -> Vec<u8> {
        let s = self.lock();
        s.namespaces
            .get(nsid as usize - 1)
            .and_then(|d| d.get(range))
            .map(<[u8]>::to_vec)
            .unwrap_or_default()
    }
    /// Overwrite namespace bytes (test setup).
    pub fn write_namespace(&self, nsid: u32, offset: usize, data: &[u8]) {
        let mut s = self.lock();
        if let Some(d) = s.namespaces.get_mut(nsid as usize - 1) {
            d[offset..offset + data.len()].copy_from_slice(data);
        }
    }
    /// Live controllers (associations).
    pub fn controller_count(&self) -> usize {
        self.lock().controllers.len()
    }

    /// A fresh key for a window, or `None` without window support.
    pub(super) fn window_key(&self) -> Option<u32> {
        let mut s = self.lock();
        if !s.config.memory_windows {
            return None;
        }
        s.next_key += 1;
        Some(s.next_key | 0x8000_0000)
    }

    pub(super) fn epoch(&self) -> u64 {
        self.lock().epoch
    }

    /// CM-level accept: (epoch, region key, granted depth).
    pub(super) fn accept(&self, p: &QueueConnectParams) -> Result<(u64, u32, u16), ConnectError> {
        let mut s = self.lock();
        if s.faults.refuse_connects {
            return Err(ConnectError::Unreachable(
                "loopback target refuses connections".into(),
            ));
        }
        let own_max = if p.qid == 0 {
            s.config.max_admin_depth
        } else {
            s.config.max_queue_depth
        };
        let depth = own_max.min(p.hrqsize).min(p.hsqsize.saturating_add(1));
        if depth == 0 {
            return Err(ConnectError::Rejected("zero queue depth".into()));
        }
        s.stats.queue_connects += 1;
        let key = s.next_key;
        s.next_key += 1;
        Ok((s.epoch, key, depth))
    }

    pub(super) fn queue_disconnected(&self, qid: u16, cntlid: Option<u16>) {
        let mut s = self.lock();
        s.stats.queue_disconnects += 1;
        // The admin queue going away ends the association.
        if qid == 0 {
            if let Some(c) = cntlid {
                s.controllers.remove(&c);
            }
        }
    }

    pub(super) fn execute(&self, c: &Capsule, region: &mut [u8]) -> Outcome {
        let mut s = self.lock();
        s.stats.commands += 1;
        let mut out = Outcome::default();
        let swallowed = if s.faults.swallow > 0 {
            s.faults.swallow -= 1;
            true
        } else {
            false
        };
        if c.window.is_some() {
            s.stats.window_transfers += 1;
        }
        let answer = s.dispatch(c, region, &mut out);
        let cqe = match answer {
            Ok((result, _)) => Cqe::success(c.sqe.cid, c.qid, c.sqhd, result),
            Err(status) => Cqe::error(c.sqe.cid, c.qid, c.sqhd, status),
        };
        if !swallowed {
            out.responses.push(cqe);
            if std::mem::take(&mut s.faults.duplicate_next) {
                out.responses.push(cqe);
            }
        }
        if let Some(n) = s.faults.drop_after {
            if n <= 1 {
                s.faults.drop_after = None;
                s.drop_all();
            } else {
                s.faults.drop_after = Some(n - 1);
            }
        }
        out
    }
}

/// Host memory a command's SGL names: a window of the queue's region.
fn data_window(
    c: &Capsule,
    region_len: usize,
    need: usize,
    host_to_target: bool,
) -> Result<Range<usize>, Status> {
    let sgl = c
        .sqe
        .sgl1()
        .map_err(|_| generic(GenericStatus::SglDescriptorTypeInvalid))?;
    match sgl {
        SglDescriptor::KeyedDataBlock {
            address,
            length,
            key,
            ..
        } => {
            let length = length.get() as usize;
            // The memory the key opens: the whole region, or one command's window.
            let (base, limit) = match &c.window {
                Some((wkey, w)) if *wkey == key => (w.start, w.end),
                _ if key == c.region_info.key => (0, region_len),
                _ => return Err(generic(GenericStatus::DataTransferError)),
            };
            let base_address = c.region_info.address + base as u64;
            if address < base_address {
                return Err(generic(GenericStatus::DataTransferError));
            }
            let start = base + (address - base_address) as usize;
            if start.saturating_add(length) > limit {
                return Err(generic(GenericStatus::DataTransferError));
            }
            if length < need {
                return Err(generic(GenericStatus::DataSglLengthInvalid));
            }
            Ok(start..start + need)
        }
        SglDescriptor::DataBlockOffset { offset, length } if host_to_target => {
            let Some(ic) = &c.in_capsule else {
                return Err(generic(GenericStatus::SglOffsetInvalid));
            };
            let (offset, length) = (offset as usize, length as usize);
            if offset + length > ic.len() {
                return Err(generic(GenericStatus::SglOffsetInvalid));
            }
            if length < need {
                return Err(generic(GenericStatus::DataSglLengthInvalid));
            }
            Ok(ic.start + offset..ic.start + offset + need)
        }
        _ => Err(generic(GenericStatus::SglDescriptorTypeInvalid)),
    }
}

/// The length SGL1 describes (0 for none).
fn sgl_length(c: &Capsule) -> usize {
    match c.sqe.sgl1() {
        Ok(SglDescriptor::KeyedDataBlock { length, .. }) => length.get() as usize,
        Ok(SglDescriptor::DataBlockOffset { length, .. }) => length as usize,
        _ => 0,
    }
}

impl State {
    fn drop_all(&mut self) {
        self.epoch += 1;
        self.controllers.clear();
    }

    fn mdts_bytes(&self) -> usize {
        if self.config.mdts == 0 {
            usize::MAX
        } else {
            4096usize << self.config.mdts
        }
    }

    fn dispatch(&mut self, c: &Capsule, region: &mut [u8], out: &mut Outcome) -> Answer {
        let sqe = &c.sqe;
        if sqe.opcode == FABRICS_OPCODE {
            return self.fabrics(c, region, out);
        }
        let Some(cntlid) = c.cntlid else {
            return Err(generic(GenericStatus::CommandSequenceError));
        };
        if !self.controllers.contains_key(&cntlid) {
            return Err(generic(GenericStatus::CommandSequenceError));
        }
        if c.qid == 0 {
            self.admin(cntlid, c, region)
        } else {
            self.io(c, region)
        }
    }

    fn fabrics(&mut self, c: &Capsule, region: &mut [u8], out: &mut Outcome) -> Answer {
        let sqe = &c.sqe;
        match sqe.fctype() {
            FabricsType::Connect => {
                let cmd = sqe
                    .as_connect()
                    .map_err(|_| generic(GenericStatus::InvalidField))?;
                let w = data_window(c, region.len(), CONNECT_DATA_SIZE, true)?;
                if c.in_capsule.is_some() {
                    self.stats.connect_data_in_capsule += 1;
                } else {
                    self.stats.connect_data_keyed += 1;
                }
                let data = ConnectData::decode(&region[w])
                    .map_err(|_| Status::fabrics(FabricsStatus::InvalidParameters))?;
                if data.hostnqn().is_err() {
                    return Err(Status::fabrics(FabricsStatus::InvalidHost));
                }
                let subnqn = data.subnqn.as_str();
                let discovery = subnqn == DISCOVERY_NQN;
                if !discovery && subnqn != self.config.subnqn {
                    return Err(Status::fabrics(FabricsStatus::InvalidParameters));
                }
                if cmd.qid != c.qid || cmd.sqsize == 0 {
                    return Err(Status::fabrics(FabricsStatus::InvalidParameters));
                }
                let cntlid = if cmd.qid == 0 {
                    if data.cntlid != CNTLID_DYNAMIC {
                        return Err(Status::fabrics(FabricsStatus::InvalidParameters));
                    }
                    let id = self.next_cntlid;
                    self.next_cntlid = self.next_cntlid.wrapping_add(1).max(1);
                    self.controllers.insert(
                        id,
                        FakeController {
                            discovery,
                            cc: Cc::default(),
                            csts: Csts::default(),
                            countdown: 0,
                            granted_io_queues: 0,
                            features: HashMap::new(),
                            feature_data: HashMap::new(),
                        },
                    );
                    id
                } else {
                    let Some(ctrl) = self.controllers.get(&data.cntlid) else {
                        return Err(Status::fabrics(FabricsStatus::InvalidParameters));
                    };
                    if !ctrl.csts.rdy || ctrl.discovery || cmd.qid > ctrl.granted_io_queues {
                        return Err(Status::fabrics(FabricsStatus::InvalidParameters));
                    }
                    data.cntlid
                };
                out.connected_cntlid = Some(cntlid);
                Ok((
                    u64::from(ConnectResponse { cntlid, authreq: 0 }.to_dw0()),
                    Some(cntlid),
                ))
            }
            FabricsType::PropertyGet => {
                let cmd = sqe
                    .as_property_get()
                    .map_err(|_| generic(GenericStatus::InvalidField))?;
                let ctrl = self.controller(c)?;
                let mqes = if ctrl.discovery {
                    31
                } else {
                    self.config.max_queue_depth - 1
                };
                let ready_after = self.config.ready_after_reads;
                let cap_to = self.config.cap_to;
                let ctrl = self.controller_mut(c)?;
                let value = match cmd.offset {
                    PropertyOffset::Cap => Cap {
                        mqes,
                        to: cap_to,
                        css: Cap::CSS_NVM,
                        ..Cap::default()
                    }
                    .to_u64(),
                    PropertyOffset::Vs => u64::from(Vs::V1_3.to_u32()),
                    PropertyOffset::Cc => u64::from(ctrl.cc.to_u32()),
                    PropertyOffset::Csts => {
                        if ctrl.countdown > 0 && ready_after != u32::MAX {
                            ctrl.countdown -= 1;
                            if ctrl.countdown == 0 {
                                if ctrl.cc.shn != ShutdownNotification::None {
                                    ctrl.csts.shst = ShutdownStatus::Complete;
                                } else if ctrl.cc.en {
                                    ctrl.csts.rdy = true;
                                }
                            }
                        }
                        u64::from(ctrl.csts.to_u32())
                    }
                    _ => return Err(generic(GenericStatus::InvalidField)),
                };
                Ok((value, None))
            }
            FabricsType::PropertySet => {
                let cmd = sqe
                    .as_property_set()
                    .map_err(|_| generic(GenericStatus::InvalidField))?;
                if cmd.offset != PropertyOffset::Cc || cmd.check_size().is_err() {
                    return Err(generic(GenericStatus::InvalidField));
                }
                let ready_after = self.config.ready_after_reads.max(1);
                self.stats.last_cc = Some(cmd.value as u32);
                let new = Cc::from_u32(cmd.value as u32);
                if new.shn != ShutdownNotification::None {
                    self.stats.disconnects_before_shutdown = Some(self.stats.queue_disconnects);
                }
                let ctrl = self.controller_mut(c)?;
                if new.en && !ctrl.cc.en {
                    ctrl.countdown = ready_after;
                }
                if !new.en {
                    ctrl.csts.rdy = false;
                }
                if new.shn != ShutdownNotification::None
                    && ctrl.cc.shn == ShutdownNotification::None
                {
                    ctrl.csts.shst = ShutdownStatus::Occurring;
                    ctrl.countdown = ready_after;
                }
                ctrl.cc = new;
                Ok((0, None))
            }
            FabricsType::Disconnect => Ok((0, None)),
            _ => Err(generic(GenericStatus::InvalidOpcode)),
        }
    }

    fn controller(&self, c: &Capsule) -> Result<&FakeController, Status> {
        c.cntlid
            .and_then(|id| self.controllers.get(&id))
            .ok_or(generic(GenericStatus::CommandSequenceError))
    }
    fn controller_mut(&mut self, c: &Capsule) -> Result<&mut FakeController, Status> {
        c.cntlid
            .and_then(|id| self.controllers.get_mut(&id))
            .ok_or(generic(GenericStatus::CommandSequenceError))
    }

    fn admin(&mut self, cntlid: u16, c: &Capsule, region: &mut [u8]) -> Answer {
        let sqe = &c.sqe;
        let discovery = self.controllers[&cntlid].discovery;
        match AdminOpcode::from_raw(sqe.opcode) {
            AdminOpcode::KeepAlive => {
                self.stats.keep_alives += 1;
                Ok((0, None))
            }
            AdminOpcode::Identify => {
                let cmd = sqe
                    .as_identify()
                    .map_err(|_| generic(GenericStatus::InvalidField))?;
                let w = data_window(c, region.len(), IDENTIFY_DATA_SIZE, false)?;
                let page = &mut region[w];
                let nn = if discovery {
                    0
                } else {
                    self.namespaces.len() as u32
                };
                let ns_index = |nsid: u32| -> Result<usize, Status> {
                    if nsid == 0 || nsid > nn {
                        Err(generic(GenericStatus::InvalidNamespaceOrFormat))
                    } else {
                        Ok(nsid as usize - 1)
                    }
                };
                match cmd.cns {
                    Cns::Controller => {
                        let id = self.identify_controller(cntlid, discovery);
                        id.encode_into(page)
                            .map_err(|_| generic(GenericStatus::InternalError))?;
                    }
                    Cns::Namespace => {
                        let i = ns_index(cmd.nsid)?;
                        let n = self.config.namespaces[i];
                        let mut id = IdentifyNamespace::simple(n.blocks, n.block_shift);
                        id.nguid = ns_nguid(cmd.nsid);
                        id.eui64 = ns_eui64(cmd.nsid);
                        id.encode_into(page)
                            .map_err(|_| generic(GenericStatus::InternalError))?;
                    }
                    Cns::ActiveNamespaceList => {
                        let ids: Vec<u32> = (1..=nn).filter(|&n| n > cmd.nsid).collect();
                        let list =
                            NsList::new(&ids).map_err(|_| generic(GenericStatus::InternalError))?;
                        list.encode_into(page)
                            .map_err(|_| generic(GenericStatus::InternalError))?;
                    }
                    Cns::NamespaceDescriptors => {
                        ns_index(cmd.nsid)?;
                        let list = [
                            NsIdDescriptor::Eui64(ns_eui64(cmd.nsid)),
                            NsIdDescriptor::Nguid(ns_nguid(cmd.nsid)),
                            NsIdDescriptor::Uuid(ns_uuid(cmd.nsid)),
                            NsIdDescriptor::Csi(0),
                        ];
                        NsIdDescriptor::encode_list(&list, page)
                            .map_err(|_| generic(GenericStatus::InternalError))?;
                    }
                    _ => return Err(generic(GenericStatus::InvalidField)),
                }
                Ok((0, None))
            }
            AdminOpcode::SetFeatures => {
                let cmd = sqe
                    .as_set_features()
                    .map_err(|_| generic(GenericStatus::InvalidField))?;
                let max_q = self.config.max_io_queues;
                let ctrl = self
                    .controllers
                    .get_mut(&cntlid)
                    .ok_or(generic(GenericStatus::InternalError))?;
                match cmd.fid {
                    FeatureId::NumberOfQueues => {
                        let req = NumberOfQueues::from_dword(cmd.cdw11);
                        if req.validate_request().is_err() {
                            return Err(generic(GenericStatus::InvalidField));
                        }
                        let n = (req.nsq.min(req.ncq) + 1).min(max_q);
                        ctrl.granted_io_queues = n;
                        let granted = NumberOfQueues::from_counts(u32::from(n), u32::from(n))
                            .unwrap_or_default();
                        ctrl.features.insert(cmd.fid.raw(), granted.to_dword());
                        Ok((u64::from(granted.to_dword()), None))
                    }
                    FeatureId::Unknown(_) => Err(generic(GenericStatus::InvalidField)),
                    fid => {
                        ctrl.features.insert(fid.raw(), cmd.cdw11);
                        let len = sgl_length(c);
                        if len > 0 {
                            let w = data_window(c, region.len(), len, true)?;
                            ctrl.feature_data.insert(fid.raw(), region[w].to_vec());
                        }
                        Ok((0, None))
                    }
                }
            }
            AdminOpcode::GetFeatures => {
                let cmd = sqe
                    .as_get_features()
                    .map_err(|_| generic(GenericStatus::InvalidField))?;
                if let FeatureId::Unknown(_) = cmd.fid {
                    return Err(generic(GenericStatus::InvalidField));
                }
                let ctrl = &self.controllers[&cntlid];
                let v = ctrl.features.get(&cmd.fid.raw()).copied().unwrap_or(0);
                let len = sgl_length(c);
                if len > 0 {
                    let w = data_window(c, region.len(), len, false)?;
                    let dest = &mut region[w];
                    dest.fill(0);
                    if let Some(d) = ctrl.feature_data.get(&cmd.fid.raw()) {
                        let n = d.len().min(dest.len());
                        dest[..n].copy_from_slice(&d[..n]);
                    }
                }
                Ok((u64::from(v), None))
            }
            AdminOpcode::GetLogPage => {
                let cmd = sqe
                    .as_get_log_page()
                    .map_err(|_| generic(GenericStatus::InvalidField))?;
                let len = cmd.transfer_len() as usize;
                if len > self.mdts_bytes() {
                    return Err(generic(GenericStatus::InvalidField));
                }
                let image: Vec<u8> = match cmd.lid {
                    LogId::Discovery if discovery => self.discovery_log(),
                    LogId::SmartHealth if !discovery => {
                        let mut b = vec![0u8; SMART_LOG_SIZE];
                        let smart = SmartLog {
                            available_spare: 100,
                            composite_temperature: 310,
                            ..SmartLog::default()
                        };
                        smart
                            .encode_into(&mut b)
                            .map_err(|_| generic(GenericStatus::InternalError))?;
                        b
                    }
                    LogId::ErrorInformation => vec![0u8; 64],
                    _ => {
                        return Err(Status::command_specific(
                            CommandSpecificStatus::InvalidLogPage,
                        ));
                    }
                };
                let w = data_window(c, region.len(), len, false)?;
                let dest = &mut region[w];
                dest.fill(0);
                let start = (cmd.lpo as usize).min(image.len());
                let n = (image.len() - start).min(len);
                dest[..n].copy_from_slice(&image[start..start + n]);
                Ok((0, None))
            }
            _ => Err(generic(GenericStatus::InvalidOpcode)),
        }
    }

    fn identify_controller(&self, cntlid: u16, discovery: bool) -> IdentifyController {
        let mut id = IdentifyController {
            vid: 0x1b36,
            ssvid: 0x1b36,
            sn: FixedStr::new("LOOPBACK0001", "SN").unwrap_or(FixedStr::EMPTY),
            mn: FixedStr::new("nvmf-rs loopback controller", "MN").unwrap_or(FixedStr::EMPTY),
            fr: FixedStr::new("0.1.0", "FR").unwrap_or(FixedStr::EMPTY),
            mdts: self.config.mdts,
            cntlid,
            ver: Vs::V1_3.to_u32(),
            kas: self.config.kas,
            sqes: 0x66,
            cqes: 0x44,
            maxcmd: self.config.max_queue_depth,
            nn: if discovery {
                0
            } else {
                self.namespaces.len() as u32
            },
            oncs: 0x000D, // Compare, DSM, Write Zeroes
            vwc: 1,
            sgls: self.config.sgls,
            ioccsz: self.config.ioccsz,
            iorcsz: 1,
            ..IdentifyController::default()
        };
        let nqn = if discovery {
            DISCOVERY_NQN
        } else {
            self.config.subnqn.as_str()
        };
        id.subnqn = FixedStr::new(nqn, "SUBNQN").unwrap_or(FixedStr::EMPTY);
        id
    }

    fn discovery_log(&mut self) -> Vec<u8> {
        self.discovery_reads += 1;
        let changes = self
            .config
            .discovery_changes_at
            .iter()
            .filter(|at| **at <= self.discovery_reads)
            .count() as u32;
        let added = (0..changes).map(|i| {
            (
                format!("nqn.2024-01.io.example:added-{i}"),
                "10.0.9.9".to_owned(),
                "4420".to_owned(),
            )
        });
        let listed: Vec<(String, String, String)> = self
            .config
            .discovery_entries
            .iter()
            .cloned()
            .chain(added)
            .collect();
        let entries = listed
            .iter()
            .enumerate()
            .map(|(i, (nqn, addr, svc))| DiscoveryLogEntry {
                trtype: TransportType::Rdma,
                adrfam: AddressFamily::Ipv4,
                subtype: SubsystemType::Nvm,
                treq: 0,
                portid: i as u16 + 1,
                cntlid: CNTLID_DYNAMIC,
                asqsz: 32,
                eflags: 0,
                trsvcid: FixedStr::new(svc, "TRSVCID").unwrap_or(FixedStr::EMPTY),
                subnqn: FixedStr::new(nqn, "SUBNQN").unwrap_or(FixedStr::EMPTY),
                traddr: FixedStr::new(addr, "TRADDR").unwrap_or(FixedStr::EMPTY),
                tsas: Tsas::Rdma(RdmaTsas::default()),
            })
            .collect();
        let log = DiscoveryLog {
            genctr: 7 + u64::from(changes),
            recfmt: 0,
            entries,
        };
        let mut b = vec![0u8; log.encoded_len()];
        let _ = log.encode_into(&mut b);
        b
    }

    fn io(&mut self, c: &Capsule, region: &mut [u8]) -> Answer {
        let sqe = &c.sqe;
        if self.stats.io_opcodes.len() < 4096 {
            self.stats.io_opcodes.push(sqe.opcode);
        }
        if let Some(st) = self.faults.fail_next_io.take() {
            return Err(st);
        }
        let nsid = sqe.nsid;
        let Some(ns_cfg) = (nsid as usize)
            .checked_sub(1)
            .and_then(|i| self.config.namespaces.get(i))
            .copied()
        else {
            return Err(generic(GenericStatus::InvalidNamespaceOrFormat));
        };
        let bs = 1usize << ns_cfg.block_shift;
        let mdts = self.mdts_bytes();
        let range_of = |slba: u64, blocks: u32| -> Result<Range<usize>, Status> {
            let end = slba
                .checked_add(u64::from(blocks))
                .ok_or(generic(GenericStatus::LbaOutOfRange))?;
            if end > ns_cfg.blocks {
                return Err(generic(GenericStatus::LbaOutOfRange));
            }
            Ok(slba as usize * bs..end as usize * bs)
        };
        let ns = &mut self.namespaces[nsid as usize - 1];
        match IoOpcode::from_raw(sqe.opcode) {
            IoOpcode::Read | IoOpcode::Write | IoOpcode::Compare => {
                let cmd = sqe.as_read_like();
                let r = range_of(cmd.0, cmd.1)?;
                if r.len() > mdts {
                    return Err(generic(GenericStatus::InvalidField));
                }
                let to_host = sqe.opcode == IoOpcode::Read.raw();
                let w = data_window(c, region.len(), r.len(), !to_host)?;
                self.stats.largest_transfer = self.stats.largest_transfer.max(r.len());
                match IoOpcode::from_raw(sqe.opcode) {
                    IoOpcode::Read => region[w].copy_from_slice(&ns[r]),
                    IoOpcode::Write => {
                        if c.in_capsule.is_some() {
                            self.stats.in_capsule_writes += 1;
                        } else {
                            self.stats.keyed_writes += 1;
                        }
                        ns[r].copy_from_slice(&region[w]);
                    }
                    _ => {
                        if ns[r] != region[w] {
                            return Err(Status::new(StatusCode::Media(
                                MediaStatus::CompareFailure,
                            )));
                        }
                    }
                }
                Ok((0, None))
            }
            IoOpcode::Flush => Ok((0, None)),
            IoOpcode::WriteZeroes => {
                let cmd = sqe
                    .as_write_zeroes()
                    .map_err(|_| generic(GenericStatus::InvalidField))?;
                let r = range_of(cmd.slba, cmd.blocks())?;
                ns[r].fill(0);
                Ok((0, None))
            }
            IoOpcode::DatasetManagement => {
                let cmd = sqe
                    .as_dataset_management()
                    .map_err(|_| generic(GenericStatus::InvalidField))?;
                let w = data_window(c, region.len(), cmd.data_len(), true)?;
                let ranges: Vec<DsmRange> = DsmRange::decode_list(&region[w], cmd.ranges())
                    .map_err(|_| generic(GenericStatus::InvalidField))?
                    .collect();
                debug_assert_eq!(DSM_RANGE_SIZE, 16);
                if cmd.ad {
                    for d in ranges {
                        let r = range_of(d.slba, d.length)?;
                        ns[r].fill(0);
                    }
                }
                Ok((0, None))
            }
            _ => Err(generic(GenericStatus::InvalidOpcode)),
        }
    }
}

/// SLBA and block count of a Read/Write/Compare (same layout: CDW10..11 SLBA, CDW12 NLB).
trait ReadLike {
    fn as_read_like(&self) -> (u64, u32);
}
impl ReadLike for Sqe {
    fn as_read_like(&self) -> (u64, u32) {
        (
            u64::from(self.cdw10) | (u64::from(self.cdw11) << 32),
            (self.cdw12 & 0xFFFF) + 1,
        )
    }
}

/// NGUID the fake gives namespace `nsid`.
pub fn ns_nguid(nsid: u32) -> [u8; 16] {
    let mut g = [0x11u8; 16];
    g[12..].copy_from_slice(&nsid.to_be_bytes());
    g
}
/// EUI-64 the fake gives namespace `nsid`.
pub fn ns_eui64(nsid: u32) -> [u8; 8] {
    let mut e = [0x22u8; 8];
    e[4..].copy_from_slice(&nsid.to_be_bytes());
    e
}
/// UUID the fake gives namespace `nsid`.
pub fn ns_uuid(nsid: u32) -> [u8; 16] {
    let mut u = [0x33u8; 16];
    u[12..].copy_from_slice(&nsid.to_be_bytes());
    u
}
