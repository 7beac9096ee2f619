//! Log pages: Error Information (0x01), SMART / Health Information (0x02), Changed Namespace
//! List (0x04, an [`NsList`]) and the Discovery log (0x70: 1024-byte header plus 1024-byte
//! entries, with the RDMA transport-specific address subtype).

use crate::bytes::{
    FixedStr, rd8, rd16, rd32, rd64, rd128, rdarr, take, take_mut, wire_enum, wr8, wr16, wr32,
    wr64, wr128, wrarr,
};
use crate::error::{ProtocolError, Result};
use crate::identify::NsList;
use crate::nqn::NQN_MAX_LEN;
use crate::status::{Status, StatusContext};

wire_enum! {
    /// Log page identifiers.
    pub enum LogId: u8 {
        /// Supported Log Pages.
        SupportedLogPages = 0x00,
        /// Error Information.
        ErrorInformation = 0x01,
        /// SMART / Health Information.
        SmartHealth = 0x02,
        /// Firmware Slot Information.
        FirmwareSlot = 0x03,
        /// Changed Namespace List.
        ChangedNamespaceList = 0x04,
        /// Commands Supported and Effects.
        CommandsSupportedAndEffects = 0x05,
        /// Device Self-test.
        DeviceSelfTest = 0x06,
        /// Telemetry Host-Initiated.
        TelemetryHost = 0x07,
        /// Telemetry Controller-Initiated.
        TelemetryController = 0x08,
        /// Asymmetric Namespace Access.
        Ana = 0x0C,
        /// Persistent Event Log.
        PersistentEvent = 0x0D,
        /// Discovery.
        Discovery = 0x70,
        /// Reservation Notification.
        ReservationNotification = 0x80,
        /// Sanitize Status.
        SanitizeStatus = 0x81,
    }
}

/// The Changed Namespace List log (0x04) has the namespace-list shape.
pub type ChangedNamespaceList = NsList;

/// Size of one Error Information log entry.
pub const ERROR_LOG_ENTRY_SIZE: usize = 64;

/// One Error Information log entry (64 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ErrorLogEntry {
    /// Error count, unique and incrementing; 0 = invalid entry (0..8).
    pub error_count: u64,
    /// Submission queue id (8..10).
    pub sqid: u16,
    /// Command id (10..12).
    pub cid: u16,
    /// Status field as in a CQE, bit 0 phase (12..14).
    pub status_field: u16,
    /// Parameter error location: bits 7:0 byte, 10:8 bit (14..16).
    pub parameter_error_location: u16,
    /// LBA (16..24).
    pub lba: u64,
    /// Namespace (24..28).
    pub nsid: u32,
    /// Vendor specific information available (28).
    pub vendor_specific: u8,
    /// Transport type (29).
    pub trtype: u8,
    /// Command set identifier (30).
    pub csi: u8,
    /// Opcode (31).
    pub opcode: u8,
    /// Command specific information (32..40).
    pub command_specific: u64,
    /// Transport type specific information (40..42).
    pub transport_specific: u16,
    /// Log page version (63).
    pub log_page_version: u8,
}

impl ErrorLogEntry {
    /// The status, typed.
    pub const fn status(&self, ctx: StatusContext) -> Status {
        Status::from_field(self.status_field, ctx)
    }
    /// Encode into exactly 64 bytes.
    pub fn to_bytes(&self) -> [u8; ERROR_LOG_ENTRY_SIZE] {
        let mut b = [0u8; ERROR_LOG_ENTRY_SIZE];
        wr64(&mut b, 0, self.error_count);
        wr16(&mut b, 8, self.sqid);
        wr16(&mut b, 10, self.cid);
        wr16(&mut b, 12, self.status_field);
        wr16(&mut b, 14, self.parameter_error_location);
        wr64(&mut b, 16, self.lba);
        wr32(&mut b, 24, self.nsid);
        wr8(&mut b, 28, self.vendor_specific);
        wr8(&mut b, 29, self.trtype);
        wr8(&mut b, 30, self.csi);
        wr8(&mut b, 31, self.opcode);
        wr64(&mut b, 32, self.command_specific);
        wr16(&mut b, 40, self.transport_specific);
        wr8(&mut b, 63, self.log_page_version);
        b
    }
    /// Encode into the first 64 bytes of `out`.
    pub fn encode_into(&self, out: &mut [u8]) -> Result<usize> {
        *take_mut::<ERROR_LOG_ENTRY_SIZE>(out, "error log entry")? = self.to_bytes();
        Ok(ERROR_LOG_ENTRY_SIZE)
    }
    /// Decode one entry.
    pub fn decode(buf: &[u8]) -> Result<Self> {
        let b = take::<ERROR_LOG_ENTRY_SIZE>(buf, "error log entry")?;
        Ok(Self {
            error_count: rd64(b, 0),
            sqid: rd16(b, 8),
            cid: rd16(b, 10),
            status_field: rd16(b, 12),
            parameter_error_location: rd16(b, 14),
            lba: rd64(b, 16),
            nsid: rd32(b, 24),
            vendor_specific: rd8(b, 28),
            trtype: rd8(b, 29),
            csi: rd8(b, 30),
            opcode: rd8(b, 31),
            command_specific: rd64(b, 32),
            transport_specific: rd16(b, 40),
            log_page_version: rd8(b, 63),
        })
    }
}

/// Size of the SMART / Health log.
pub const SMART_LOG_SIZE: usize = 512;

/// SMART / Health Information log (512 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SmartLog {
    /// Critical warning bits (0).
    pub critical_warning: u8,
    /// Composite temperature, kelvin (1..3).
    pub composite_temperature: u16,
    /// Available spare, percent (3).
    pub available_spare: u8,
    /// Available spare threshold, percent (4).
    pub available_spare_threshold: u8,
    /// Percentage used (5).
    pub percentage_used: u8,
    /// Endurance group critical warning summary (6).
    pub endurance_group_critical_warning: u8,
    /// Data units read, thousands of 512-byte units (32..48).
    pub data_units_read: u128,
    /// Data units written (48..64).
    pub data_units_written: u128,
    /// Host read commands (64..80).
    pub host_read_commands: u128,
    /// Host write commands (80..96).
    pub host_write_commands: u128,
    /// Controller busy time, minutes (96..112).
    pub controller_busy_time: u128,
    /// Power cycles (112..128).
    pub power_cycles: u128,
    /// Power on hours (128..144).
    pub power_on_hours: u128,
    /// Unsafe shutdowns (144..160).
    pub unsafe_shutdowns: u128,
    /// Media and data integrity errors (160..176).
    pub media_errors: u128,
    /// Number of error information log entries (176..192).
    pub error_log_entries: u128,
    /// Warning composite temperature time, minutes (192..196).
    pub warning_temperature_time: u32,
    /// Critical composite temperature time, minutes (196..200).
    pub critical_temperature_time: u32,
    /// Temperature sensors 1..8, kelvin (200..216).
    pub temperature_sensors: [u16; 8],
    /// Thermal management temperature 1 transition count (216..220).
    pub tmt1_transitions: u32,
    /// Thermal management temperature 2 transition count (220..224).
    pub tmt2_transitions: u32,
    /// Total time for thermal management temperature 1 (224..228).
    pub tmt1_time: u32,
    /// Total time for thermal management temperature 2 (228..232).
    pub tmt2_time: u32,
}

impl SmartLog {
    /// Encode into the first 512 bytes of `out`; returns 512.
    pub fn encode_into(&self, out: &mut [u8]) -> Result<usize> {
        let b = take_mut::<SMART_LOG_SIZE>(out, "SMART log")?;
        b.fill(0);
        wr8(b, 0, self.critical_warning);
        wr16(b, 1, self.composite_temperature);
        wr8(b, 3, self.available_spare);
        wr8(b, 4, self.available_spare_threshold);
        wr8(b, 5, self.percentage_used);
        wr8(b, 6, self.endurance_group_critical_warning);
        wr128(b, 32, self.data_units_read);
        wr128(b, 48, self.data_units_written);
        wr128(b, 64, self.host_read_commands);
        wr128(b, 80, self.host_write_commands);
        wr128(b, 96, self.controller_busy_time);
        wr128(b, 112, self.power_cycles);
        wr128(b, 128, self.power_on_hours);
        wr128(b, 144, self.unsafe_shutdowns);
        wr128(b, 160, self.media_errors);
        wr128(b, 176, self.error_log_entries);
        wr32(b, 192, self.warning_temperature_time);
        wr32(b, 196, self.critical_temperature_time);
        for (i, t) in self.temperature_sensors.iter().enumerate() {
            wr16(b, 200 + 2 * i, *t);
        }
        wr32(b, 216, self.tmt1_transitions);
        wr32(b, 220, self.tmt2_transitions);
        wr32(b, 224, self.tmt1_time);
        wr32(b, 228, self.tmt2_time);
        Ok(SMART_LOG_SIZE)
    }
    /// Decode a 512-byte image.
    pub fn decode(buf: &[u8]) -> Result<Self> {
        let b = take::<SMART_LOG_SIZE>(buf, "SMART log")?;
        let mut temperature_sensors = [0u16; 8];
        for (i, t) in temperature_sensors.iter_mut().enumerate() {
            *t = rd16(b, 200 + 2 * i);
        }
        Ok(Self {
            critical_warning: rd8(b, 0),
            composite_temperature: rd16(b, 1),
            available_spare: rd8(b, 3),
            available_spare_threshold: rd8(b, 4),
            percentage_used: rd8(b, 5),
            endurance_group_critical_warning: rd8(b, 6),
            data_units_read: rd128(b, 32),
            data_units_written: rd128(b, 48),
            host_read_commands: rd128(b, 64),
            host_write_commands: rd128(b, 80),
            controller_busy_time: rd128(b, 96),
            power_cycles: rd128(b, 112),
            power_on_hours: rd128(b, 128),
            unsafe_shutdowns: rd128(b, 144),
            media_errors: rd128(b, 160),
            error_log_entries: rd128(b, 176),
            warning_temperature_time: rd32(b, 192),
            critical_temperature_time: rd32(b, 196),
            temperature_sensors,
            tmt1_transitions: rd32(b, 216),
            tmt2_transitions: rd32(b, 220),
            tmt1_time: rd32(b, 224),
            tmt2_time: rd32(b, 228),
        })
    }
}

wire_enum! {
    /// Transport type (TRTYPE).
    pub enum TransportType: u8 {
        /// RDMA.
        Rdma = 1,
        /// Fibre Channel.
        Fc = 2,
        /// TCP.
        Tcp = 3,
        /// Intra-host (loop).
        Loop = 254,
    }
}

wire_enum! {
    /// Address family (ADRFAM).
    pub enum AddressFamily: u8 {
        /// PCIe.
        Pci = 0,
        /// IPv4.
        Ipv4 = 1,
        /// IPv6.
        Ipv6 = 2,
        /// InfiniBand.
        Ib = 3,
        /// Fibre Channel.
        Fc = 4,
        /// Intra-host.
        Loop = 254,
    }
}

wire_enum! {
    /// Subsystem type (SUBTYPE).
    pub enum SubsystemType: u8 {
        /// Referral to another discovery service.
        DiscoveryReferral = 1,
        /// NVM subsystem.
        Nvm = 2,
        /// The current discovery subsystem.
        CurrentDiscovery = 3,
    }
}

wire_enum! {
    /// RDMA QP service type (TSAS byte 0).
    pub enum RdmaQpType: u8 {
        /// Reliable connected.
        ReliableConnected = 1,
        /// Reliable datagram.
        ReliableDatagram = 2,
    }
}

wire_enum! {
    /// RDMA provider type (TSAS byte 1).
    pub enum RdmaProviderType: u8 {
        /// No provider specified.
        NotSpecified = 1,
        /// InfiniBand.
        Ib = 2,
        /// RoCE (v1).
        Roce = 3,
        /// RoCE v2.
        RoceV2 = 4,
        /// iWARP.
        Iwarp = 5,
    }
}

wire_enum! {
    /// RDMA connection management service (TSAS byte 2).
    pub enum RdmaCms: u8 {
        /// RDMA_CM.
        RdmaCm = 1,
    }
}

/// RDMA transport specific address subtype (TSAS for TRTYPE 1): 0 QPTYPE, 1 PRTYPE, 2 CMS,
/// 8..10 PKEY.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RdmaTsas {
    /// QP service type.
    pub qptype: RdmaQpType,
    /// Provider type.
    pub prtype: RdmaProviderType,
    /// Connection management service.
    pub cms: RdmaCms,
    /// InfiniBand partition key.
    pub pkey: u16,
}

impl Default for RdmaTsas {
    fn default() -> Self {
        Self {
            qptype: RdmaQpType::ReliableConnected,
            prtype: RdmaProviderType::NotSpecified,
            cms: RdmaCms::RdmaCm,
            pkey: 0,
        }
    }
}

/// Transport specific address subtype.
// Kept inline (no Box) so entries stay `Copy` and decode without allocating; entries are
// control-path data, so the 256-byte variant costs nothing that matters.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Tsas {
    /// RDMA (used when TRTYPE is RDMA).
    Rdma(RdmaTsas),
    /// Any other transport: the 256 bytes raw.
    Raw([u8; 256]),
}

/// Size of the discovery log header and of each entry.
pub const DISCOVERY_RECORD_SIZE: usize = 1024;

/// Discovery log header: 0..8 GENCTR, 8..16 NUMREC, 16..18 RECFMT.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct DiscoveryLogHeader {
    /// Generation counter (changes whenever the log changes).
    pub genctr: u64,
    /// Number of records.
    pub numrec: u64,
    /// Record format (0).
    pub recfmt: u16,
}

impl DiscoveryLogHeader {
    /// Encode into the first 1024 bytes of `out`.
    pub fn encode_into(&self, out: &mut [u8]) -> Result<usize> {
        let b = take_mut::<DISCOVERY_RECORD_SIZE>(out, "discovery log header")?;
        b.fill(0);
        wr64(b, 0, self.genctr);
        wr64(b, 8, self.numrec);
        wr16(b, 16, self.recfmt);
        Ok(DISCOVERY_RECORD_SIZE)
    }
    /// Decode the header. Accepts a short buffer of at least 18 bytes, since hosts often read
    /// only the first dwords to learn NUMREC and GENCTR.
    pub fn decode(buf: &[u8]) -> Result<Self> {
        let b = take::<18>(buf, "discovery log header")?;
        Ok(Self {
            genctr: rd64(b, 0),
            numrec: rd64(b, 8),
            recfmt: rd16(b, 16),
        })
    }
}

/// One discovery log entry (1024 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DiscoveryLogEntry {
    /// Transport type (0).
    pub trtype: TransportType,
    /// Address family (1).
    pub adrfam: AddressFamily,
    /// Subsystem type (2).
    pub subtype: SubsystemType,
    /// Transport requirements (3): bits 1:0 secure channel, bit 2 SQ flow control disable OK.
    pub treq: u8,
    /// Port id (4..6).
    pub portid: u16,
    /// Controller id, 0xFFFF for the dynamic model (6..8).
    pub cntlid: u16,
    /// Admin max SQ size (>= 32) (8..10).
    pub asqsz: u16,
    /// Entry flags (10..12).
    pub eflags: u16,
    /// Transport service id, ASCII (port number) (32..64).
    pub trsvcid: FixedStr<32>,
    /// Subsystem NQN (256..512).
    pub subnqn: FixedStr<NQN_MAX_LEN>,
    /// Transport address, ASCII (512..768).
    pub traddr: FixedStr<256>,
    /// Transport specific address subtype (768..1024).
    pub tsas: Tsas,
}

impl DiscoveryLogEntry {
    /// Encode into the first 1024 bytes of `out`.
    pub fn encode_into(&self, out: &mut [u8]) -> Result<usize> {
        let b = take_mut::<DISCOVERY_RECORD_SIZE>(out, "discovery log entry")?;
        b.fill(0);
        wr8(b, 0, self.trtype.raw());
        wr8(b, 1, self.adrfam.raw());
        wr8(b, 2, self.subtype.raw());
        wr8(b, 3, self.treq);
        wr16(b, 4, self.portid);
        wr16(b, 6, self.cntlid);
        wr16(b, 8, self.asqsz);
        wr16(b, 10, self.eflags);
        self.trsvcid.write_field(&mut b[32..64], 0);
        self.subnqn.write_field(&mut b[256..512], 0);
        self.traddr.write_field(&mut b[512..768], 0);
        match &self.tsas {
            Tsas::Rdma(r) => {
                wr8(b, 768, r.qptype.raw());
                wr8(b, 769, r.prtype.raw());
                wr8(b, 770, r.cms.raw());
                wr16(b, 776, r.pkey);
            }
            Tsas::Raw(raw) => wrarr(b, 768, raw),
        }
        Ok(DISCOVERY_RECORD_SIZE)
    }

    /// Decode one entry; TSAS is typed when TRTYPE is RDMA, raw otherwise.
    pub fn decode(buf: &[u8]) -> Result<Self> {
        let b = take::<DISCOVERY_RECORD_SIZE>(buf, "discovery log entry")?;
        let trtype = TransportType::from_raw(b[0]);
        let tsas = if trtype == TransportType::Rdma {
            Tsas::Rdma(RdmaTsas {
                qptype: RdmaQpType::from_raw(b[768]),
                prtype: RdmaProviderType::from_raw(b[769]),
                cms: RdmaCms::from_raw(b[770]),
                pkey: rd16(b, 776),
            })
        } else {
            Tsas::Raw(rdarr(b, 768))
        };
        Ok(Self {
            trtype,
            adrfam: AddressFamily::from_raw(b[1]),
            subtype: SubsystemType::from_raw(b[2]),
            treq: b[3],
            portid: rd16(b, 4),
            cntlid: rd16(b, 6),
            asqsz: rd16(b, 8),
            eflags: rd16(b, 10),
            trsvcid: FixedStr::from_field(&b[32..64], "TRSVCID")?,
            subnqn: FixedStr::from_field(&b[256..512], "SUBNQN")?,
            traddr: FixedStr::from_field(&b[512..768], "TRADDR")?,
            tsas,
        })
    }
}

/// A whole discovery log: header plus entries (NUMREC is the number of entries).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct DiscoveryLog {
    /// Generation counter.
    pub genctr: u64,
    /// Record format (0).
    pub recfmt: u16,
    /// Entries.
    pub entries: Vec<DiscoveryLogEntry>,
}

impl DiscoveryLog {
    /// Bytes the encoded log occupies.
    pub fn encoded_len(&self) -> usize {
        DISCOVERY_RECORD_SIZE * (1 + self.entries.len())
    }

    /// Encode the whole log into `out` (no allocation); returns the bytes written. Serve a Get
    /// Log Page by copying `LPO..LPO+len` of this image.
    pub fn encode_into(&self, out: &mut [u8]) -> Result<usize> {
        let need = self.encoded_len();
        if out.len() < need {
            return Err(ProtocolError::BufferTooSmall {
                what: "discovery log",
                need,
                got: out.len(),
            });
        }
        DiscoveryLogHeader {
            genctr: self.genctr,
            numrec: self.entries.len() as u64,
            recfmt: self.recfmt,
        }
        .encode_into(out)?;
        for (e, chunk) in self
            .entries
            .iter()
            .zip(out[DISCOVERY_RECORD_SIZE..need].chunks_exact_mut(DISCOVERY_RECORD_SIZE))
        {
            e.encode_into(chunk)?;
        }
        Ok(need)
    }

    /// Decode a full log; every one of the NUMREC entries must be present.
    pub fn decode(buf: &[u8]) -> Result<Self> {
        let h = DiscoveryLogHeader::decode(buf)?;
        take::<DISCOVERY_RECORD_SIZE>(buf, "discovery log header")?;
        let available = (buf.len() - DISCOVERY_RECORD_SIZE) / DISCOVERY_RECORD_SIZE;
        // NUMREC is untrusted: compare before any size arithmetic or allocation.
        let n = usize::try_from(h.numrec).unwrap_or(usize::MAX);
        if n > available {
            return Err(ProtocolError::Truncated {
                what: "discovery log",
                need: n.saturating_add(1).saturating_mul(DISCOVERY_RECORD_SIZE),
                got: buf.len(),
            });
        }
        let mut entries = Vec::with_capacity(n);
        for chunk in buf[DISCOVERY_RECORD_SIZE..]
            .chunks_exact(DISCOVERY_RECORD_SIZE)
            .take(n)
        {
            entries.push(DiscoveryLogEntry::decode(chunk)?);
        }
        Ok(Self {
            genctr: h.genctr,
            recfmt: h.recfmt,
            entries,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nqn::DISCOVERY_NQN;

    #[test]
    fn log_ids() {
        assert_eq!(LogId::ErrorInformation.raw(), 0x01);
        assert_eq!(LogId::SmartHealth.raw(), 0x02);
        assert_eq!(LogId::ChangedNamespaceList.raw(), 0x04);
        assert_eq!(LogId::Discovery.raw(), 0x70);
    }

    #[test]
    fn error_log_entry_offsets() {
        let e = ErrorLogEntry {
            error_count: 1,
            sqid: 2,
            cid: 3,
            status_field: (0x02 << 1) | 0x8000,
            parameter_error_location: 0x0228,
            lba: 0x1122,
            nsid: 7,
            vendor_specific: 0,
            trtype: 1,
            csi: 0,
            opcode: 0x02,
            command_specific: 0xABCD,
            transport_specific: 0x55,
            log_page_version: 1,
        };
        let b = e.to_bytes();
        assert_eq!(b[0], 1);
        assert_eq!(&b[8..14], &[2, 0, 3, 0, 0x04, 0x80]);
        assert_eq!(&b[14..16], &[0x28, 0x02]);
        assert_eq!(&b[16..18], &[0x22, 0x11]);
        assert_eq!(b[24], 7);
        assert_eq!(b[29], 1);
        assert_eq!(b[31], 0x02);
        assert_eq!(&b[32..34], &[0xCD, 0xAB]);
        assert_eq!(b[40], 0x55);
        assert_eq!(b[63], 1);
        assert_eq!(ErrorLogEntry::decode(&b).unwrap(), e);
        assert!(e.status(StatusContext::Nvm).dnr);
    }

    #[test]
    fn smart_log_offsets() {
        let s = SmartLog {
            critical_warning: 0x04,
            composite_temperature: 310,
            available_spare: 100,
            available_spare_threshold: 10,
            percentage_used: 3,
            data_units_read: 0x0102,
            data_units_written: 0x0304,
            host_read_commands: 5,
            host_write_commands: 6,
            power_on_hours: 24,
            media_errors: 9,
            temperature_sensors: [300, 301, 0, 0, 0, 0, 0, 308],
            tmt2_time: 0xAABB,
            ..SmartLog::default()
        };
        let mut b = [0u8; 512];
        s.encode_into(&mut b).unwrap();
        assert_eq!(b[0], 0x04);
        assert_eq!(&b[1..3], &310u16.to_le_bytes());
        assert_eq!(&b[3..6], &[100, 10, 3]);
        assert_eq!(&b[32..34], &[0x02, 0x01]);
        assert_eq!(&b[48..50], &[0x04, 0x03]);
        assert_eq!(b[64], 5);
        assert_eq!(b[80], 6);
        assert_eq!(b[128], 24);
        assert_eq!(b[160], 9);
        assert_eq!(&b[200..202], &300u16.to_le_bytes());
        assert_eq!(&b[214..216], &308u16.to_le_bytes());
        assert_eq!(&b[228..232], &[0xBB, 0xAA, 0, 0]);
        assert_eq!(SmartLog::decode(&b).unwrap(), s);
    }

    fn rdma_entry() -> DiscoveryLogEntry {
        DiscoveryLogEntry {
            trtype: TransportType::Rdma,
            adrfam: AddressFamily::Ipv4,
            subtype: SubsystemType::Nvm,
            treq: 0,
            portid: 1,
            cntlid: 0xFFFF,
            asqsz: 32,
            eflags: 0,
            trsvcid: FixedStr::new("4420", "x").unwrap(),
            subnqn: FixedStr::new("nqn.2016-06.io.spdk:cnode1", "x").unwrap(),
            traddr: FixedStr::new("192.168.1.10", "x").unwrap(),
            tsas: Tsas::Rdma(RdmaTsas {
                qptype: RdmaQpType::ReliableConnected,
                prtype: RdmaProviderType::RoceV2,
                cms: RdmaCms::RdmaCm,
                pkey: 0,
            }),
        }
    }

    #[test]
    fn discovery_entry_offsets() {
        let e = rdma_entry();
        let mut b = [0u8; 1024];
        e.encode_into(&mut b).unwrap();
        assert_eq!(&b[0..4], &[1, 1, 2, 0]);
        assert_eq!(&b[4..6], &[1, 0]);
        assert_eq!(&b[6..8], &[0xFF, 0xFF]);
        assert_eq!(&b[8..10], &[32, 0]);
        assert_eq!(&b[32..36], b"4420");
        assert_eq!(b[36], 0);
        assert_eq!(&b[256..282], b"nqn.2016-06.io.spdk:cnode1");
        assert_eq!(&b[512..524], b"192.168.1.10");
        assert_eq!(&b[768..771], &[1, 4, 1]);
        assert_eq!(DiscoveryLogEntry::decode(&b).unwrap(), e);
    }

    #[test]
    fn discovery_log_whole() {
        let mut cur = rdma_entry();
        cur.subtype = SubsystemType::CurrentDiscovery;
        cur.subnqn = FixedStr::new(DISCOVERY_NQN, "x").unwrap();
        let mut tcp = rdma_entry();
        tcp.trtype = TransportType::Tcp;
        let mut raw = [0u8; 256];
        raw[0] = 1;
        tcp.tsas = Tsas::Raw(raw);
        let log = DiscoveryLog {
            genctr: 42,
            recfmt: 0,
            entries: vec![rdma_entry(), cur, tcp],
        };
        let mut b = vec![0u8; log.encoded_len()];
        assert_eq!(log.encode_into(&mut b), Ok(4096));
        assert_eq!(&b[0..8], &42u64.to_le_bytes());
        assert_eq!(&b[8..16], &3u64.to_le_bytes());
        assert_eq!(&b[16..18], &[0, 0]);
        assert_eq!(b[1024 + 2], 2);
        assert_eq!(b[2048 + 2], 3);
        assert_eq!(b[3072], 3);
        assert_eq!(DiscoveryLog::decode(&b).unwrap(), log);
        let h = DiscoveryLogHeader::decode(&b[..20]).unwrap();
        assert_eq!((h.genctr, h.numrec), (42, 3));
        assert!(DiscoveryLog::decode(&b[..4000]).is_err());
        assert!(log.encode_into(&mut b[..4095]).is_err());
    }

    #[test]
    fn discovery_log_huge_numrec_does_not_allocate() {
        let mut b = [0u8; 2048];
        b[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(matches!(
            DiscoveryLog::decode(&b),
            Err(ProtocolError::Truncated { .. })
        ));
    }
}
