//! Typed views of the admin commands a fabrics target serves: Identify, Get Log Page,
//! Set/Get Features, Keep Alive, Asynchronous Event Request (and its completion DW0), Abort.

use crate::bytes::{bit32, bits32, flag32, put32, wire_enum};
use crate::error::Result;
use crate::features::FeatureId;
use crate::identify::Cns;
use crate::log::LogId;
use crate::sgl::SglDescriptor;
use crate::sqe::{AdminOpcode, Sqe};

/// Identify (opcode 0x06): CDW10 bits 7:0 CNS, 31:16 CNTID; CDW11 bits 15:0 CNS specific
/// identifier, 31:24 CSI; CDW14 bits 6:0 UUID index.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IdentifyCmd {
    /// Command identifier.
    pub cid: u16,
    /// Namespace (CNS 0x00/0x03: the namespace; CNS 0x02: list NSIDs greater than this).
    pub nsid: u32,
    /// Controller or Namespace Structure.
    pub cns: Cns,
    /// Controller identifier.
    pub cntid: u16,
    /// CNS specific identifier.
    pub cns_specific_id: u16,
    /// Command Set Identifier.
    pub csi: u8,
    /// UUID index (7 bits).
    pub uuid_index: u8,
    /// Where the 4096 bytes go.
    pub sgl: SglDescriptor,
}

impl IdentifyCmd {
    /// Typed view of `s`.
    pub fn from_sqe(s: &Sqe) -> Result<Self> {
        s.expect_opcode(AdminOpcode::Identify.raw())?;
        Ok(Self {
            cid: s.cid,
            nsid: s.nsid,
            cns: Cns::from_raw(s.cdw10 as u8),
            cntid: (s.cdw10 >> 16) as u16,
            cns_specific_id: s.cdw11 as u16,
            csi: (s.cdw11 >> 24) as u8,
            uuid_index: bits32(s.cdw14, 0, 7) as u8,
            sgl: s.sgl1()?,
        })
    }
    /// Build the SQE.
    pub fn to_sqe(&self) -> Sqe {
        let mut s = Sqe::new(AdminOpcode::Identify.raw(), self.cid, self.nsid);
        s.cdw10 = u32::from(self.cns.raw()) | (u32::from(self.cntid) << 16);
        s.cdw11 = u32::from(self.cns_specific_id) | (u32::from(self.csi) << 24);
        s.cdw14 = put32(u32::from(self.uuid_index), 0, 7);
        s.set_sgl1(self.sgl);
        s
    }
}

/// Get Log Page (opcode 0x02): CDW10 bits 7:0 LID, 14:8 LSP, 15 RAE, 31:16 NUMDL; CDW11 bits
/// 15:0 NUMDU, 31:16 LSI; CDW12 LPOL; CDW13 LPOU; CDW14 bits 6:0 UUID index, 23 OT, 31:24 CSI.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GetLogPageCmd {
    /// Command identifier.
    pub cid: u16,
    /// Namespace.
    pub nsid: u32,
    /// Log page identifier.
    pub lid: LogId,
    /// Log specific parameter (7 bits).
    pub lsp: u8,
    /// Retain Asynchronous Event.
    pub rae: bool,
    /// Number of dwords, 0's based (NUMDU:NUMDL).
    pub numd: u32,
    /// Log specific identifier.
    pub lsi: u16,
    /// Log page offset in bytes (LPOU:LPOL; an index when `ot`).
    pub lpo: u64,
    /// UUID index (7 bits).
    pub uuid_index: u8,
    /// Offset Type: `lpo` is an entry index rather than a byte offset.
    pub ot: bool,
    /// Command Set Identifier.
    pub csi: u8,
    /// Where the log data goes.
    pub sgl: SglDescriptor,
}

impl GetLogPageCmd {
    /// Bytes requested: (NUMD + 1) * 4.
    pub const fn transfer_len(&self) -> u64 {
        (self.numd as u64 + 1) * 4
    }
    /// NUMD (0's based) for a transfer of `bytes` (rounded up to whole dwords; at least one).
    pub const fn numd_for(bytes: u64) -> u32 {
        let d = bytes.div_ceil(4);
        if d == 0 { 0 } else { (d - 1) as u32 }
    }
    /// Typed view of `s`.
    pub fn from_sqe(s: &Sqe) -> Result<Self> {
        s.expect_opcode(AdminOpcode::GetLogPage.raw())?;
        Ok(Self {
            cid: s.cid,
            nsid: s.nsid,
            lid: LogId::from_raw(s.cdw10 as u8),
            lsp: bits32(s.cdw10, 8, 7) as u8,
            rae: bit32(s.cdw10, 15),
            numd: (s.cdw10 >> 16) | ((s.cdw11 & 0xFFFF) << 16),
            lsi: (s.cdw11 >> 16) as u16,
            lpo: u64::from(s.cdw12) | (u64::from(s.cdw13) << 32),
            uuid_index: bits32(s.cdw14, 0, 7) as u8,
            ot: bit32(s.cdw14, 23),
            csi: (s.cdw14 >> 24) as u8,
            sgl: s.sgl1()?,
        })
    }
    /// Build the SQE.
    pub fn to_sqe(&self) -> Sqe {
        let mut s = Sqe::new(AdminOpcode::GetLogPage.raw(), self.cid, self.nsid);
        s.cdw10 = u32::from(self.lid.raw())
            | put32(u32::from(self.lsp), 8, 7)
            | flag32(self.rae, 15)
            | ((self.numd & 0xFFFF) << 16);
        s.cdw11 = (self.numd >> 16) | (u32::from(self.lsi) << 16);
        s.cdw12 = self.lpo as u32;
        s.cdw13 = (self.lpo >> 32) as u32;
        s.cdw14 = put32(u32::from(self.uuid_index), 0, 7)
            | flag32(self.ot, 23)
            | (u32::from(self.csi) << 24);
        s.set_sgl1(self.sgl);
        s
    }
}

/// Set Features (opcode 0x09): CDW10 bits 7:0 FID, 31 SV; CDW11..13 and CDW15 feature
/// specific; CDW14 bits 6:0 UUID index.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SetFeaturesCmd {
    /// Command identifier.
    pub cid: u16,
    /// Namespace.
    pub nsid: u32,
    /// Feature identifier.
    pub fid: FeatureId,
    /// Save across power cycles.
    pub save: bool,
    /// Feature specific value (CDW11), see [`crate::features`].
    pub cdw11: u32,
    /// Feature specific (CDW12).
    pub cdw12: u32,
    /// Feature specific (CDW13).
    pub cdw13: u32,
    /// UUID index (7 bits).
    pub uuid_index: u8,
    /// Feature specific (CDW15).
    pub cdw15: u32,
    /// Data for features that carry a data structure.
    pub sgl: SglDescriptor,
}

impl SetFeaturesCmd {
    /// Typed view of `s`.
    pub fn from_sqe(s: &Sqe) -> Result<Self> {
        s.expect_opcode(AdminOpcode::SetFeatures.raw())?;
        Ok(Self {
            cid: s.cid,
            nsid: s.nsid,
            fid: FeatureId::from_raw(s.cdw10 as u8),
            save: bit32(s.cdw10, 31),
            cdw11: s.cdw11,
            cdw12: s.cdw12,
            cdw13: s.cdw13,
            uuid_index: bits32(s.cdw14, 0, 7) as u8,
            cdw15: s.cdw15,
            sgl: s.sgl1()?,
        })
    }
    /// Build the SQE.
    pub fn to_sqe(&self) -> Sqe {
        let mut s = Sqe::new(AdminOpcode::SetFeatures.raw(), self.cid, self.nsid);
        s.cdw10 = u32::from(self.fid.raw()) | flag32(self.save, 31);
        s.cdw11 = self.cdw11;
        s.cdw12 = self.cdw12;
        s.cdw13 = self.cdw13;
        s.cdw14 = put32(u32::from(self.uuid_index), 0, 7);
        s.cdw15 = self.cdw15;
        s.set_sgl1(self.sgl);
        s
    }
}

wire_enum! {
    /// Get Features select (CDW10 bits 10:8).
    pub enum FeatureSelect: u8 {
        /// Current value.
        Current = 0,
        /// Default value.
        Default = 1,
        /// Saved value.
        Saved = 2,
        /// Supported capabilities.
        SupportedCapabilities = 3,
    }
}

/// Get Features (opcode 0x0A): CDW10 bits 7:0 FID, 10:8 SEL; CDW11 feature specific;
/// CDW14 bits 6:0 UUID index.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GetFeaturesCmd {
    /// Command identifier.
    pub cid: u16,
    /// Namespace.
    pub nsid: u32,
    /// Feature identifier.
    pub fid: FeatureId,
    /// Which value to return (3 bits).
    pub sel: FeatureSelect,
    /// Feature specific (CDW11).
    pub cdw11: u32,
    /// UUID index (7 bits).
    pub uuid_index: u8,
    /// Data for features that return a data structure.
    pub sgl: SglDescriptor,
}

impl GetFeaturesCmd {
    /// Typed view of `s`.
    pub fn from_sqe(s: &Sqe) -> Result<Self> {
        s.expect_opcode(AdminOpcode::GetFeatures.raw())?;
        Ok(Self {
            cid: s.cid,
            nsid: s.nsid,
            fid: FeatureId::from_raw(s.cdw10 as u8),
            sel: FeatureSelect::from_raw(bits32(s.cdw10, 8, 3) as u8),
            cdw11: s.cdw11,
            uuid_index: bits32(s.cdw14, 0, 7) as u8,
            sgl: s.sgl1()?,
        })
    }
    /// Build the SQE.
    pub fn to_sqe(&self) -> Sqe {
        let mut s = Sqe::new(AdminOpcode::GetFeatures.raw(), self.cid, self.nsid);
        s.cdw10 = u32::from(self.fid.raw()) | put32(u32::from(self.sel.raw()), 8, 3);
        s.cdw11 = self.cdw11;
        s.cdw14 = put32(u32::from(self.uuid_index), 0, 7);
        s.set_sgl1(self.sgl);
        s
    }
}

/// Keep Alive (opcode 0x18): no parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KeepAliveCmd {
    /// Command identifier.
    pub cid: u16,
}

impl KeepAliveCmd {
    /// Typed view of `s`.
    pub fn from_sqe(s: &Sqe) -> Result<Self> {
        s.expect_opcode(AdminOpcode::KeepAlive.raw())?;
        Ok(Self { cid: s.cid })
    }
    /// Build the SQE.
    pub fn to_sqe(&self) -> Sqe {
        Sqe::new(AdminOpcode::KeepAlive.raw(), self.cid, 0)
    }
}

/// Asynchronous Event Request (opcode 0x0C): no parameters; completes when an event occurs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AsyncEventRequestCmd {
    /// Command identifier.
    pub cid: u16,
}

impl AsyncEventRequestCmd {
    /// Typed view of `s`.
    pub fn from_sqe(s: &Sqe) -> Result<Self> {
        s.expect_opcode(AdminOpcode::AsyncEventRequest.raw())?;
        Ok(Self { cid: s.cid })
    }
    /// Build the SQE.
    pub fn to_sqe(&self) -> Sqe {
        Sqe::new(AdminOpcode::AsyncEventRequest.raw(), self.cid, 0)
    }
}

wire_enum! {
    /// Asynchronous event type (completion DW0 bits 2:0).
    pub enum AsyncEventType: u8 {
        /// Error status.
        Error = 0,
        /// SMART / Health status.
        SmartHealth = 1,
        /// Notice (namespace attribute changed, discovery log changed, ...).
        Notice = 2,
        /// Immediate.
        Immediate = 3,
        /// One-shot.
        OneShot = 4,
        /// I/O command set specific status.
        IoCommandSetSpecific = 6,
        /// Vendor specific.
        VendorSpecific = 7,
    }
}

/// Notice event information values (with [`AsyncEventType::Notice`]).
pub mod notice {
    /// Namespace Attribute Changed (read log 0x04).
    pub const NAMESPACE_ATTRIBUTE_CHANGED: u8 = 0x00;
    /// Firmware Activation Starting.
    pub const FIRMWARE_ACTIVATION_STARTING: u8 = 0x01;
    /// Telemetry Log Changed.
    pub const TELEMETRY_LOG_CHANGED: u8 = 0x02;
    /// Asymmetric Namespace Access Change.
    pub const ANA_CHANGE: u8 = 0x03;
    /// Discovery Log Page Change (read log 0x70).
    pub const DISCOVERY_LOG_CHANGE: u8 = 0xF0;
}

/// The completion DW0 of an Asynchronous Event Request: bits 2:0 type, 15:8 information,
/// 23:16 log page to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AsyncEvent {
    /// Event type (3 bits).
    pub event_type: AsyncEventType,
    /// Event information.
    pub info: u8,
    /// Log page identifier the host should read.
    pub log_page: u8,
}

impl AsyncEvent {
    /// Pack into completion DW0.
    pub const fn to_dw0(&self) -> u32 {
        put32(self.event_type.raw() as u32, 0, 3)
            | ((self.info as u32) << 8)
            | ((self.log_page as u32) << 16)
    }
    /// Unpack from completion DW0.
    pub const fn from_dw0(dw0: u32) -> Self {
        Self {
            event_type: AsyncEventType::from_raw((dw0 & 7) as u8),
            info: (dw0 >> 8) as u8,
            log_page: (dw0 >> 16) as u8,
        }
    }
}

/// Abort (opcode 0x08): CDW10 bits 15:0 SQID, 31:16 CID of the command to abort.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AbortCmd {
    /// Command identifier of the Abort itself.
    pub cid: u16,
    /// Submission queue of the command to abort.
    pub sqid: u16,
    /// Command identifier to abort.
    pub abort_cid: u16,
}

impl AbortCmd {
    /// Typed view of `s`.
    pub fn from_sqe(s: &Sqe) -> Result<Self> {
        s.expect_opcode(AdminOpcode::Abort.raw())?;
        Ok(Self {
            cid: s.cid,
            sqid: s.cdw10 as u16,
            abort_cid: (s.cdw10 >> 16) as u16,
        })
    }
    /// Build the SQE.
    pub fn to_sqe(&self) -> Sqe {
        let mut s = Sqe::new(AdminOpcode::Abort.raw(), self.cid, 0);
        s.cdw10 = u32::from(self.sqid) | (u32::from(self.abort_cid) << 16);
        s
    }
}

impl Sqe {
    /// Identify view.
    pub fn as_identify(&self) -> Result<IdentifyCmd> {
        IdentifyCmd::from_sqe(self)
    }
    /// Get Log Page view.
    pub fn as_get_log_page(&self) -> Result<GetLogPageCmd> {
        GetLogPageCmd::from_sqe(self)
    }
    /// Set Features view.
    pub fn as_set_features(&self) -> Result<SetFeaturesCmd> {
        SetFeaturesCmd::from_sqe(self)
    }
    /// Get Features view.
    pub fn as_get_features(&self) -> Result<GetFeaturesCmd> {
        GetFeaturesCmd::from_sqe(self)
    }
    /// Keep Alive view.
    pub fn as_keep_alive(&self) -> Result<KeepAliveCmd> {
        KeepAliveCmd::from_sqe(self)
    }
    /// Asynchronous Event Request view.
    pub fn as_async_event_request(&self) -> Result<AsyncEventRequestCmd> {
        AsyncEventRequestCmd::from_sqe(self)
    }
    /// Abort view.
    pub fn as_abort(&self) -> Result<AbortCmd> {
        AbortCmd::from_sqe(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sgl() -> SglDescriptor {
        SglDescriptor::keyed(0x2000, 4096, 0x77, false).unwrap()
    }

    #[test]
    fn identify_offsets() {
        let i = IdentifyCmd {
            cid: 1,
            nsid: 0,
            cns: Cns::Controller,
            cntid: 0xABCD,
            cns_specific_id: 0x1234,
            csi: 0x02,
            uuid_index: 0x7F,
            sgl: sgl(),
        };
        let b = i.to_sqe().to_bytes();
        assert_eq!(b[0], 0x06);
        assert_eq!(b[40], 0x01);
        assert_eq!(&b[42..44], &[0xCD, 0xAB]);
        assert_eq!(&b[44..46], &[0x34, 0x12]);
        assert_eq!(b[47], 0x02);
        assert_eq!(b[56], 0x7F);
        assert_eq!(Sqe::decode(&b).unwrap().as_identify().unwrap(), i);
    }

    #[test]
    fn get_log_page_numd_split_and_offset() {
        let g = GetLogPageCmd {
            cid: 2,
            nsid: 0xFFFF_FFFF,
            lid: LogId::Discovery,
            lsp: 0x7F,
            rae: true,
            numd: 0x0003_00FF,
            lsi: 0x5555,
            lpo: 0x0000_0001_0000_0400,
            uuid_index: 3,
            ot: true,
            csi: 0,
            sgl: sgl(),
        };
        let b = g.to_sqe().to_bytes();
        assert_eq!(b[0], 0x02);
        assert_eq!(b[40], 0x70);
        assert_eq!(b[41], 0x7F | 0x80); // LSP 14:8, RAE 15
        assert_eq!(&b[42..44], &[0xFF, 0x00]); // NUMDL
        assert_eq!(&b[44..46], &[0x03, 0x00]); // NUMDU
        assert_eq!(&b[46..48], &[0x55, 0x55]); // LSI
        assert_eq!(&b[48..52], &0x400u32.to_le_bytes()); // LPOL
        assert_eq!(&b[52..56], &1u32.to_le_bytes()); // LPOU
        assert_eq!(b[56], 3);
        assert_eq!(b[58], 0x80); // OT bit 23
        assert_eq!(Sqe::decode(&b).unwrap().as_get_log_page().unwrap(), g);
        assert_eq!(g.transfer_len(), (0x0003_00FF + 1) * 4);
        assert_eq!(GetLogPageCmd::numd_for(1024), 255);
        assert_eq!(GetLogPageCmd::numd_for(5), 1);
        assert_eq!(GetLogPageCmd::numd_for(0), 0);
    }

    #[test]
    fn set_get_features_offsets() {
        let s = SetFeaturesCmd {
            cid: 3,
            nsid: 0,
            fid: FeatureId::NumberOfQueues,
            save: true,
            cdw11: 0x0003_0003,
            cdw12: 1,
            cdw13: 2,
            uuid_index: 1,
            cdw15: 4,
            sgl: SglDescriptor::NULL,
        };
        let b = s.to_sqe().to_bytes();
        assert_eq!(b[0], 0x09);
        assert_eq!(b[40], 0x07);
        assert_eq!(b[43], 0x80);
        assert_eq!(&b[44..48], &0x0003_0003u32.to_le_bytes());
        assert_eq!(Sqe::decode(&b).unwrap().as_set_features().unwrap(), s);

        let g = GetFeaturesCmd {
            cid: 4,
            nsid: 1,
            fid: FeatureId::KeepAliveTimer,
            sel: FeatureSelect::SupportedCapabilities,
            cdw11: 0,
            uuid_index: 0,
            sgl: SglDescriptor::NULL,
        };
        let b = g.to_sqe().to_bytes();
        assert_eq!(b[0], 0x0A);
        assert_eq!(b[40], 0x0F);
        assert_eq!(b[41], 0x03);
        assert_eq!(Sqe::decode(&b).unwrap().as_get_features().unwrap(), g);
    }

    #[test]
    fn keep_alive_aer_abort() {
        let k = KeepAliveCmd { cid: 9 }.to_sqe();
        assert_eq!(k.opcode, 0x18);
        assert_eq!(k.as_keep_alive().unwrap().cid, 9);
        let a = AsyncEventRequestCmd { cid: 10 }.to_sqe();
        assert_eq!(a.opcode, 0x0C);
        assert!(a.as_async_event_request().is_ok());
        let ab = AbortCmd {
            cid: 11,
            sqid: 2,
            abort_cid: 0x1234,
        };
        let b = ab.to_sqe().to_bytes();
        assert_eq!(b[0], 0x08);
        assert_eq!(&b[40..44], &[2, 0, 0x34, 0x12]);
        assert_eq!(Sqe::decode(&b).unwrap().as_abort().unwrap(), ab);
        assert!(k.as_abort().is_err());
    }

    #[test]
    fn async_event_dw0() {
        let e = AsyncEvent {
            event_type: AsyncEventType::Notice,
            info: notice::DISCOVERY_LOG_CHANGE,
            log_page: 0x70,
        };
        assert_eq!(e.to_dw0(), 0x0070_F002);
        assert_eq!(AsyncEvent::from_dw0(0x0070_F002), e);
        let ns = AsyncEvent::from_dw0(0x0004_0002);
        assert_eq!(ns.info, notice::NAMESPACE_ATTRIBUTE_CHANGED);
        assert_eq!(ns.log_page, 0x04);
    }
}
