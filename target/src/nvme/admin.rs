//! Admin commands on a bound admin queue: Identify, Get Log Page, Set/Get Features, Keep
//! Alive, Asynchronous Event Request, Abort. Unsupported opcodes answer Invalid Command Opcode;
//! the discovery controller accepts only what discovery needs.

use std::time::Instant;

use nvmf_protocol::admin::{FeatureSelect, GetLogPageCmd, IdentifyCmd};
use nvmf_protocol::features::{
    Arbitration, AsyncEventConfig, Feature, FeatureId, KeepAliveTimer, NumberOfQueues,
    PowerManagement, VolatileWriteCache,
};
use nvmf_protocol::identify::{
    Cns, IDENTIFY_DATA_SIZE, IdentifyController, IdentifyNamespace, NsIdDescriptor, NsList,
    SGLS_KEYED, SGLS_OFFSET, SGLS_SUPPORTED,
};
use nvmf_protocol::log::{ERROR_LOG_ENTRY_SIZE, LogId, SMART_LOG_SIZE};
use nvmf_protocol::properties::Vs;
use nvmf_protocol::{AdminOpcode, Cqe, FixedStr, Sqe};

use crate::bdev::IoBuf;

use super::Exec;
use super::controller::{ACL, AERL, Controller, ERROR_LOG_ENTRIES};
use super::io::ReactorIo;
use super::queue::Queue;
use super::status::*;

/// Identify Controller ONCS: Compare, Dataset Management, Write Zeroes, and the Save field of
/// Set Features and Select field of Get Features (bit 4: SEL is served, SV answered).
const ONCS: u16 = (1 << 0) | (1 << 2) | (1 << 3) | (1 << 4);
/// CTRATT: the 128-bit Host Identifier (HIDS, bit 0), the only one a fabrics host has.
const CTRATT_HOST_ID_128: u32 = 1 << 0;
/// Asynchronous Event Configuration an I/O controller takes: the SMART / Health critical
/// warnings (4:0, mandatory; 7:5 reserved here, as nvmet's mask) and the Namespace Attribute
/// notices it raises (OAES). A discovery controller raises none.
const AEC_SUPPORTED: u32 = 0x1F | OAES_NS_ATTRIBUTE;
/// VWC: present (bit 0), Flush with NSID FFFFFFFFh not supported (bits 2:1 = 10b).
const VWC: u8 = 0x05;
/// OAES: Namespace Attribute Notices.
const OAES_NS_ATTRIBUTE: u32 = 1 << 8;
/// LPA: extended data for Get Log Page (LPO, NUMDU). Bit 0 (SMART per namespace) clear: the
/// SMART / Health log is the controller's only.
const LPA_EXTENDED: u8 = 1 << 2;
/// Firmware Slot Information log page.
const FIRMWARE_SLOT_LOG_SIZE: usize = 512;
/// DLFEAT: Write Zeroes may deallocate (bit 3); deallocated blocks read as zeroes (001b).
const DLFEAT: u8 = 0x09;

/// Get Features Host Identifier's data: the 128-bit identifier.
const HOST_IDENTIFIER_LEN: u64 = 16;

/// Identify's FR and the firmware slot log's only slot: this build's version.
fn firmware_revision() -> FixedStr<8> {
    FixedStr::new(env!("CARGO_PKG_VERSION"), "FR").unwrap_or(FixedStr::EMPTY)
}

fn fixed<const N: usize>(s: &str) -> FixedStr<N> {
    FixedStr::new(s, "identify").unwrap_or(FixedStr::EMPTY)
}

impl Queue {
    pub(super) fn admin(
        &mut self,
        _io: &mut ReactorIo,
        c: &Controller,
        sqe: &Sqe,
        data: &mut IoBuf<'_, '_>,
        tag: u64,
        now: impl FnOnce() -> Instant,
    ) -> Exec {
        let op = AdminOpcode::from_raw(sqe.opcode);
        // Before CC.EN = 1 and CSTS.RDY = 1, and after a shutdown notification until a reset,
        // only Fabrics commands are allowed.
        if !c.is_ready() {
            return Exec::Done(self.error(sqe, SEQUENCE_ERROR));
        }
        let discovery = c.is_discovery();
        // Of the commands served only Identify, Get Log Page and Get Features of the Host
        // Identifier move data (checked there): a buffer with any other would go back to the
        // host unwritten. Set and Get Features check theirs once the feature is known (an
        // unsupported one is Invalid Field with any buffer, as the spec says; nvmet checks the
        // length first).
        let moves_nothing = matches!(
            op,
            AdminOpcode::KeepAlive | AdminOpcode::AsyncEventRequest | AdminOpcode::Abort
        );
        if moves_nothing {
            if let Err(cqe) = self.data_length(sqe, data, 0) {
                return Exec::Done(cqe);
            }
        }
        let cqe = match op {
            AdminOpcode::Identify => self.identify(c, sqe, data),
            AdminOpcode::GetLogPage => self.get_log_page(c, sqe, data),
            AdminOpcode::SetFeatures => self.set_features(c, sqe, data, now()),
            AdminOpcode::GetFeatures => self.get_features(c, sqe, data),
            AdminOpcode::KeepAlive => {
                c.keep_alive(now());
                self.success(sqe, 0)
            }
            AdminOpcode::AsyncEventRequest => return self.async_event_request(c, sqe, tag),
            AdminOpcode::Abort if !discovery => return self.abort(c, sqe, tag),
            _ => self.error(sqe, INVALID_OPCODE),
        };
        Exec::Done(cqe)
    }

    fn identify(&mut self, c: &Controller, sqe: &Sqe, data: &mut IoBuf<'_, '_>) -> Cqe {
        let Ok(cmd) = IdentifyCmd::from_sqe(sqe) else {
            return self.error(sqe, INVALID_FIELD);
        };
        if let Err(cqe) = self.data_length(sqe, data, IDENTIFY_DATA_SIZE as u64) {
            return cqe;
        }
        let mut page = [0u8; IDENTIFY_DATA_SIZE];
        let result = match (cmd.cns, c.is_discovery()) {
            (Cns::Controller, _) => self
                .identify_controller(c)
                .encode_into(&mut page)
                .map(|_| ()),
            (_, true) => return self.error(sqe, INVALID_FIELD),
            (Cns::Namespace, false) => {
                let sub = c.subsystem.as_ref();
                let max = sub.map_or(0, |s| s.max_namespaces);
                // FFFFFFFFh asks for the capabilities common to all namespaces, which only a
                // controller with Namespace Management returns (OACS bit 3; not ours, like
                // nvmet and SPDK): Invalid Namespace or Format, as for any NSID beyond NN.
                if cmd.nsid == 0 || cmd.nsid > max {
                    return self.error(sqe, INVALID_NAMESPACE);
                }
                match self.namespace(c, cmd.nsid) {
                    Some(ns) => {
                        let mut id = IdentifyNamespace::simple(
                            ns.num_blocks,
                            ns.block_size.trailing_zeros() as u8,
                        );
                        id.dlfeat = DLFEAT;
                        id.nmic = 1;
                        id.nguid = self
                            .ns
                            .get(cmd.nsid)
                            .and_then(|n| n.nguid)
                            .unwrap_or([0; 16]);
                        id.encode_into(&mut page).map(|_| ())
                    }
                    // An allocated-but-inactive NSID reads as zeroes.
                    None => Ok(()),
                }
            }
            (Cns::ActiveNamespaceList, false) => {
                if cmd.nsid >= 0xFFFF_FFFE {
                    return self.error(sqe, INVALID_NAMESPACE);
                }
                self.namespace(c, 0);
                let ids: Vec<u32> = self
                    .ns
                    .active()
                    .map(|n| n.nsid)
                    .filter(|id| *id > cmd.nsid)
                    .take(nvmf_protocol::identify::NS_LIST_MAX)
                    .collect();
                NsList::new(&ids)
                    .and_then(|l| l.encode_into(&mut page))
                    .map(|_| ())
            }
            (Cns::NamespaceDescriptors, false) => {
                if self.namespace(c, cmd.nsid).is_none() {
                    return self.error(sqe, INVALID_NAMESPACE);
                }
                let mut list = Vec::with_capacity(3);
                if let Some(ns) = self.ns.get(cmd.nsid) {
                    if let Some(g) = ns.nguid {
                        list.push(NsIdDescriptor::Nguid(g));
                    }
                    if let Some(u) = ns.uuid {
                        list.push(NsIdDescriptor::Uuid(u));
                    }
                }
                list.push(NsIdDescriptor::Csi(0));
                NsIdDescriptor::encode_list(&list, &mut page).map(|_| ())
            }
            // The NVM command set's Identify Controller (Linux asks from VS 1.3 on): no
            // limits of its own to state, so zeroes, as nvmet returns.
            (Cns::IoCommandSetController, false) if cmd.csi == 0 => Ok(()),
            _ => return self.error(sqe, INVALID_FIELD),
        };
        match result {
            Ok(()) => {
                data.fill_from(&page);
                self.success(sqe, 0)
            }
            Err(_) => self.error(sqe, INTERNAL_ERROR),
        }
    }

    fn identify_controller(&self, c: &Controller) -> IdentifyController {
        let limits = self.target.limits();
        let sub = c.subsystem.as_ref();
        let mut id = IdentifyController {
            sn: fixed(sub.map_or("discovery", |s| s.serial.as_str())),
            mn: fixed(sub.map_or("nvmf-rs discovery", |s| s.model.as_str())),
            fr: firmware_revision(),
            // One firmware slot (bits 3:1), read only (bit 0): the firmware slot log's.
            frmw: (1 << 1) | 1,
            rab: 6,
            // Dynamic controllers: the subsystem may have several.
            cmic: 1 << 1,
            mdts: limits.mdts(),
            cntlid: c.cntlid,
            ver: Vs::V1_3.to_u32(),
            oaes: if sub.is_some() { OAES_NS_ATTRIBUTE } else { 0 },
            cntrltype: if sub.is_some() { 1 } else { 2 },
            acl: ACL,
            aerl: AERL,
            lpa: LPA_EXTENDED,
            elpe: (ERROR_LOG_ENTRIES - 1) as u8,
            kas: limits.kas,
            sqes: 0x66,
            cqes: 0x44,
            maxcmd: limits.max_queue_depth.min(u32::from(u16::MAX)) as u16,
            nn: sub.map_or(0, |s| s.max_namespaces),
            sgls: SGLS_SUPPORTED | SGLS_KEYED | SGLS_OFFSET,
            subnqn: FixedStr::new(c.subnqn(), "SUBNQN").unwrap_or(FixedStr::EMPTY),
            ioccsz: (64 + limits.in_capsule_data_size) / 16,
            iorcsz: 1,
            icdoff: 0,
            fcatt: 0,
            msdbd: limits.msdbd,
            ctratt: CTRATT_HOST_ID_128,
            ..IdentifyController::default()
        };
        if sub.is_some() {
            id.oncs = ONCS;
            id.vwc = VWC;
        }
        id
    }

    fn get_log_page(&mut self, c: &Controller, sqe: &Sqe, data: &mut IoBuf<'_, '_>) -> Cqe {
        let Ok(cmd) = GetLogPageCmd::from_sqe(sqe) else {
            return self.error(sqe, INVALID_FIELD);
        };
        let len = cmd.transfer_len();
        // Before the page is built: reading the changed namespace list clears it.
        if let Err(cqe) = self.data_length(sqe, data, len) {
            return cqe;
        }
        // LPO must be dword aligned.
        if cmd.lpo % 4 != 0 {
            return self.error(sqe, INVALID_FIELD);
        }
        let page: Vec<u8> = match (cmd.lid, c.is_discovery()) {
            (LogId::Discovery, true) => {
                let log = self.target.discovery_log(&c.hostnqn);
                let mut b = vec![0u8; log.encoded_len()];
                if log.encode_into(&mut b).is_err() {
                    return self.error(sqe, INTERNAL_ERROR);
                }
                b
            }
            (LogId::ErrorInformation, _) => {
                let s = c.state();
                let mut b = vec![0u8; ERROR_LOG_ENTRIES * ERROR_LOG_ENTRY_SIZE];
                for (e, chunk) in s
                    .errors
                    .iter()
                    .zip(b.chunks_exact_mut(ERROR_LOG_ENTRY_SIZE))
                {
                    chunk.copy_from_slice(&e.to_bytes());
                }
                b
            }
            // Per-namespace SMART is not supported (LPA bit 0 clear): a namespace's NSID is
            // Invalid Field in Command, as the base specification prescribes; 0 and
            // FFFFFFFFh ask for the controller's log.
            (LogId::SmartHealth, false) if sqe.nsid != 0 && sqe.nsid != u32::MAX => {
                return self.error(sqe, INVALID_FIELD);
            }
            (LogId::SmartHealth, false) => {
                let mut b = vec![0u8; SMART_LOG_SIZE];
                if c.smart().encode_into(&mut b).is_err() {
                    return self.error(sqe, INTERNAL_ERROR);
                }
                b
            }
            // Mandatory (NVMe 1.3 5.14.1.3): one read-only slot, active, holding this build.
            (LogId::FirmwareSlot, false) => {
                let mut b = vec![0u8; FIRMWARE_SLOT_LOG_SIZE];
                b[0] = 1;
                // FRS1: ASCII, space padded, as Identify's FR.
                let fr = firmware_revision();
                let n = fr.len().min(8);
                b[8..8 + n].copy_from_slice(&fr.as_bytes()[..n]);
                b[8 + n..16].fill(b' ');
                b
            }
            (LogId::ChangedNamespaceList, false) => {
                let mut s = c.state();
                let list = if s.changed_overflow {
                    Ok(NsList::overflow())
                } else {
                    NsList::new(&s.changed_ns)
                };
                let mut b = vec![0u8; IDENTIFY_DATA_SIZE];
                if list.and_then(|l| l.encode_into(&mut b)).is_err() {
                    return self.error(sqe, INTERNAL_ERROR);
                }
                // Reading clears the list and re-arms the notice unless Retain Async Event; a
                // read refused for its offset (below) reads nothing.
                if !cmd.rae && cmd.lpo <= b.len() as u64 {
                    s.changed_ns.clear();
                    s.changed_overflow = false;
                    s.ns_notice_masked = false;
                }
                b
            }
            _ => return self.error(sqe, INVALID_LOG_PAGE),
        };
        let Some(from) = usize::try_from(cmd.lpo).ok().filter(|o| *o <= page.len()) else {
            return self.error(sqe, INVALID_FIELD);
        };
        data.fill_from(&page[from..]);
        self.success(sqe, 0)
    }

    fn set_features(
        &mut self,
        c: &Controller,
        sqe: &Sqe,
        data: &mut IoBuf<'_, '_>,
        now: Instant,
    ) -> Cqe {
        let Ok(cmd) = sqe.as_set_features() else {
            return self.error(sqe, INVALID_FIELD);
        };
        let discovery = c.is_discovery();
        // Over fabrics the host identifier is Connect's to set (as nvmet answers).
        if cmd.fid == FeatureId::HostIdentifier && !discovery {
            return self.error(sqe, SEQUENCE_ERROR);
        }
        // An unknown feature is Invalid Field whether or not it was asked to be saved.
        let Ok(feature) = Feature::decode(cmd.fid, cmd.cdw11) else {
            return self.error(sqe, INVALID_FIELD);
        };
        // None of the features served takes data.
        if let Err(cqe) = self.data_length(sqe, data, 0) {
            return cqe;
        }
        if cmd.save {
            return self.error(sqe, FEATURE_NOT_SAVEABLE);
        }
        let max_queues = self.target.limits().max_io_queues;
        let mut s = c.state();
        let result = match feature {
            Feature::KeepAliveTimer(k) => {
                s.kato_ms = self.target.limits().round_kato(k.kato_ms);
                s.last_keep_alive = now;
                0
            }
            Feature::AsyncEventConfig(a) => {
                // Only events this controller can raise (as nvmet checks).
                let supported = if discovery { 0 } else { AEC_SUPPORTED };
                if a.to_dword() & !supported != 0 {
                    return self.error(sqe, INVALID_FIELD);
                }
                s.aec = a;
                0
            }
            _ if discovery => return self.error(sqe, INVALID_FIELD),
            Feature::NumberOfQueues(n) => {
                if n.validate_request().is_err() {
                    return self.error(sqe, INVALID_FIELD);
                }
                // Fixed once I/O queues exist (a reset's closing ones aside).
                if s.io_queues_under(c.epoch()) {
                    return self.error(sqe, SEQUENCE_ERROR);
                }
                // The allocation does not change until a reset (which forgets it): a second
                // request gets the first one's answer.
                let want = n.nsq.min(n.ncq).saturating_add(1);
                let granted = *s.io_queues_granted.get_or_insert(want.min(max_queues));
                NumberOfQueues {
                    nsq: granted - 1,
                    ncq: granted - 1,
                }
                .to_dword()
            }
            Feature::VolatileWriteCache(v) => {
                c.set_write_cache(v.enabled);
                0
            }
            Feature::Arbitration(a) => {
                s.arbitration = a;
                0
            }
            Feature::PowerManagement(p) => {
                // NPSS = 0: power state 0 is the only one.
                if p.power_state != 0 {
                    return self.error(sqe, INVALID_FIELD);
                }
                s.power = p;
                0
            }
        };
        drop(s);
        self.success(sqe, u64::from(result))
    }

    fn get_features(&mut self, c: &Controller, sqe: &Sqe, data: &mut IoBuf<'_, '_>) -> Cqe {
        let Ok(cmd) = sqe.as_get_features() else {
            return self.error(sqe, INVALID_FIELD);
        };
        let served = matches!(
            cmd.fid,
            FeatureId::Arbitration
                | FeatureId::PowerManagement
                | FeatureId::VolatileWriteCache
                | FeatureId::NumberOfQueues
                | FeatureId::AsyncEventConfig
                | FeatureId::KeepAliveTimer
                | FeatureId::HostIdentifier
        );
        // A discovery controller has the keep-alive timer and event configuration only.
        let served = served
            && (!c.is_discovery()
                || matches!(
                    cmd.fid,
                    FeatureId::KeepAliveTimer | FeatureId::AsyncEventConfig
                ));
        if !served {
            return self.error(sqe, INVALID_FIELD);
        }
        // Only the Host Identifier's value comes as data: its 16 bytes.
        let data_len = match (cmd.fid, cmd.sel) {
            (_, FeatureSelect::SupportedCapabilities) => 0,
            (FeatureId::HostIdentifier, _) => HOST_IDENTIFIER_LEN,
            _ => 0,
        };
        if let Err(cqe) = self.data_length(sqe, data, data_len) {
            return cqe;
        }
        let max_queues = self.target.limits().max_io_queues;
        if cmd.sel == FeatureSelect::SupportedCapabilities {
            // Nothing saveable, nothing namespace specific; all changeable but the Host
            // Identifier, which Connect alone sets.
            return match cmd.fid {
                FeatureId::HostIdentifier => self.success(sqe, 0),
                _ => self.success(sqe, 1 << 2),
            };
        }
        // Nothing is saveable: the saved value is the default (NVMe 1.3 5.9.1).
        let default = match cmd.sel {
            FeatureSelect::Current => false,
            FeatureSelect::Default | FeatureSelect::Saved => true,
            _ => return self.error(sqe, INVALID_FIELD),
        };
        let s = c.state();
        let value = match cmd.fid {
            FeatureId::KeepAliveTimer => KeepAliveTimer {
                kato_ms: if default { 0 } else { s.kato_ms },
            }
            .to_dword(),
            FeatureId::AsyncEventConfig => if default {
                AsyncEventConfig::default()
            } else {
                s.aec
            }
            .to_dword(),
            _ if c.is_discovery() => return self.error(sqe, INVALID_FIELD),
            FeatureId::NumberOfQueues => {
                let n = if default {
                    max_queues
                } else {
                    s.io_queues_granted.unwrap_or(max_queues)
                };
                NumberOfQueues {
                    nsq: n - 1,
                    ncq: n - 1,
                }
                .to_dword()
            }
            FeatureId::VolatileWriteCache => VolatileWriteCache {
                enabled: default || c.write_cache_enabled(),
            }
            .to_dword(),
            FeatureId::Arbitration => if default {
                Arbitration::default()
            } else {
                s.arbitration
            }
            .to_dword(),
            FeatureId::PowerManagement => if default {
                PowerManagement::default()
            } else {
                s.power
            }
            .to_dword(),
            FeatureId::HostIdentifier => {
                // The 128-bit identifier Connect carried (EXHID = 1; a fabrics host has no
                // 64-bit one), as nvmet serves it.
                if cmd.cdw11 & 1 == 0 {
                    return self.error(sqe, INVALID_FIELD);
                }
                data.fill_from(&c.hostid);
                0
            }
            _ => return self.error(sqe, INVALID_FIELD),
        };
        drop(s);
        self.success(sqe, u64::from(value))
    }

    /// Abort (CDW10: SQID 15:0, CID 31:16). A command of an I/O queue that has not started
    /// (waiting for data buffers or to read its data) can be aborted: the request goes to the
    /// reactor owning that queue and the answer comes back as an event (DW0 bit 0 = 0
    /// aborted). Anything else is declined at once (DW0 bit 0 = 1, which the spec allows):
    /// admin commands execute as they arrive, and an unknown queue holds nothing.
    fn abort(&mut self, c: &Controller, sqe: &Sqe, tag: u64) -> Exec {
        let sqid = (sqe.cdw10 & 0xFFFF) as u16;
        let cid = (sqe.cdw10 >> 16) as u16;
        // The limit Identify states (ACL): Aborts waiting for their victim's queue count.
        if self.abort_tags.len() > usize::from(ACL) {
            return Exec::Done(self.error(sqe, ABORT_LIMIT_EXCEEDED));
        }
        if sqid != 0 && c.request_abort(sqid, cid, sqe.cid) {
            self.abort_tags.push((sqe.cid, tag));
            return Exec::Pending;
        }
        Exec::Done(self.success(sqe, 1))
    }

    fn async_event_request(&mut self, c: &Controller, sqe: &Sqe, tag: u64) -> Exec {
        match c.queue_aer(sqe.cid) {
            Ok(Some(dw0)) => Exec::Done(self.success(sqe, u64::from(dw0))),
            Ok(None) => {
                self.aer_tags.push((sqe.cid, tag));
                Exec::Pending
            }
            Err(_) => Exec::Done(self.error(sqe, AER_LIMIT_EXCEEDED)),
        }
    }
}
