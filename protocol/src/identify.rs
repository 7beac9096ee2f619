//! Identify data structures (4096 bytes each): Identify Controller (CNS 0x01), Identify
//! Namespace (CNS 0x00) with its LBA formats, the active namespace ID list (CNS 0x02; the same
//! shape serves the Changed Namespace List log) and Namespace Identification Descriptors
//! (CNS 0x03).
//!
//! Decoding keeps the fields a block target and host use; reserved and vendor-specific areas
//! are ignored and encoded as zero.

use crate::bytes::{
    FixedStr, rd8, rd16, rd32, rd64, rd128, rdarr, take, take_mut, wire_enum, wr8, wr16, wr32,
    wr64, wr128, wrarr,
};
use crate::error::{ProtocolError, Result};
use crate::nqn::NQN_MAX_LEN;

/// Size of every Identify data structure.
pub const IDENTIFY_DATA_SIZE: usize = 4096;

wire_enum! {
    /// Controller or Namespace Structure (Identify CDW10 bits 7:0).
    pub enum Cns: u8 {
        /// Identify Namespace.
        Namespace = 0x00,
        /// Identify Controller.
        Controller = 0x01,
        /// Active Namespace ID list.
        ActiveNamespaceList = 0x02,
        /// Namespace Identification Descriptor list.
        NamespaceDescriptors = 0x03,
        /// NVM Set list.
        NvmSetList = 0x04,
        /// I/O command set specific Identify Namespace.
        IoCommandSetNamespace = 0x05,
        /// I/O command set specific Identify Controller.
        IoCommandSetController = 0x06,
        /// I/O command set specific active namespace list.
        IoCommandSetActiveNamespaceList = 0x07,
        /// I/O command set independent Identify Namespace.
        IndependentNamespace = 0x08,
        /// I/O command set data structure.
        IoCommandSets = 0x1C,
    }
}

/// SGLS bit 0 (with bit 1 clear): SGLs supported, no alignment requirement.
pub const SGLS_SUPPORTED: u32 = 1 << 0;
/// SGLS bit 2: keyed SGL data block descriptor supported (needed by the Linux RDMA host).
pub const SGLS_KEYED: u32 = 1 << 2;
/// SGLS bit 20: offset addressing in SGL data block descriptors (in-capsule data).
pub const SGLS_OFFSET: u32 = 1 << 20;

/// One power state descriptor (32 bytes, at 2048 + 32 * n).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct PowerStateDescriptor {
    /// Maximum power (0..2), centiwatts or 0.0001 W per `mxps`.
    pub mp: u16,
    /// Max power scale (byte 3 bit 0).
    pub mxps: bool,
    /// Non-operational state (byte 3 bit 1).
    pub nops: bool,
    /// Entry latency, µs (4..8).
    pub enlat: u32,
    /// Exit latency, µs (8..12).
    pub exlat: u32,
    /// Relative read throughput (byte 12 bits 4:0).
    pub rrt: u8,
    /// Relative read latency (byte 13 bits 4:0).
    pub rrl: u8,
    /// Relative write throughput (byte 14 bits 4:0).
    pub rwt: u8,
    /// Relative write latency (byte 15 bits 4:0).
    pub rwl: u8,
    /// Idle power (16..18).
    pub idlp: u16,
    /// Idle power scale (byte 18 bits 7:6).
    pub ips: u8,
    /// Active power (20..22).
    pub actp: u16,
    /// Active power workload (byte 22 bits 2:0).
    pub apw: u8,
    /// Active power scale (byte 22 bits 7:6).
    pub aps: u8,
}

impl PowerStateDescriptor {
    fn encode(&self, b: &mut [u8; 32]) {
        wr16(b, 0, self.mp);
        wr8(b, 3, u8::from(self.mxps) | (u8::from(self.nops) << 1));
        wr32(b, 4, self.enlat);
        wr32(b, 8, self.exlat);
        wr8(b, 12, self.rrt & 0x1F);
        wr8(b, 13, self.rrl & 0x1F);
        wr8(b, 14, self.rwt & 0x1F);
        wr8(b, 15, self.rwl & 0x1F);
        wr16(b, 16, self.idlp);
        wr8(b, 18, (self.ips & 3) << 6);
        wr16(b, 20, self.actp);
        wr8(b, 22, (self.apw & 7) | ((self.aps & 3) << 6));
    }
    fn decode(b: &[u8; 32]) -> Self {
        Self {
            mp: rd16(b, 0),
            mxps: b[3] & 1 == 1,
            nops: b[3] & 2 == 2,
            enlat: rd32(b, 4),
            exlat: rd32(b, 8),
            rrt: b[12] & 0x1F,
            rrl: b[13] & 0x1F,
            rwt: b[14] & 0x1F,
            rwl: b[15] & 0x1F,
            idlp: rd16(b, 16),
            ips: b[18] >> 6,
            actp: rd16(b, 20),
            apw: b[22] & 7,
            aps: b[22] >> 6,
        }
    }
}

/// Identify Controller data structure (CNS 0x01).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IdentifyController {
    /// PCI vendor id (0..2).
    pub vid: u16,
    /// PCI subsystem vendor id (2..4).
    pub ssvid: u16,
    /// Serial number, ASCII space padded (4..24).
    pub sn: FixedStr<20>,
    /// Model number, ASCII space padded (24..64).
    pub mn: FixedStr<40>,
    /// Firmware revision, ASCII space padded (64..72).
    pub fr: FixedStr<8>,
    /// Recommended arbitration burst (72).
    pub rab: u8,
    /// IEEE OUI (73..76).
    pub ieee: [u8; 3],
    /// Multi-path I/O and namespace sharing capabilities (76).
    pub cmic: u8,
    /// Maximum data transfer size, 2^n minimum pages; 0 = no limit (77).
    pub mdts: u8,
    /// Controller id (78..80).
    pub cntlid: u16,
    /// Version, same layout as VS (80..84).
    pub ver: u32,
    /// RTD3 resume latency (84..88).
    pub rtd3r: u32,
    /// RTD3 entry latency (88..92).
    pub rtd3e: u32,
    /// Optional asynchronous events supported (92..96).
    pub oaes: u32,
    /// Controller attributes (96..100).
    pub ctratt: u32,
    /// Read recovery levels supported (100..102).
    pub rrls: u16,
    /// Controller type: 1 I/O, 2 discovery, 3 administrative (111).
    pub cntrltype: u8,
    /// FRU GUID (112..128).
    pub fguid: [u8; 16],
    /// Command retry delay times 1..3, 100 ms units (128..134).
    pub crdt: [u16; 3],
    /// Optional admin command support (256..258).
    pub oacs: u16,
    /// Abort command limit, 0's based (258).
    pub acl: u8,
    /// Asynchronous event request limit, 0's based (259).
    pub aerl: u8,
    /// Firmware updates (260).
    pub frmw: u8,
    /// Log page attributes (261).
    pub lpa: u8,
    /// Error log page entries, 0's based (262).
    pub elpe: u8,
    /// Number of power states supported, 0's based (263).
    pub npss: u8,
    /// Admin vendor specific command configuration (264).
    pub avscc: u8,
    /// Autonomous power state transition attributes (265).
    pub apsta: u8,
    /// Warning composite temperature threshold, K (266..268).
    pub wctemp: u16,
    /// Critical composite temperature threshold, K (268..270).
    pub cctemp: u16,
    /// Maximum time for firmware activation (270..272).
    pub mtfa: u16,
    /// Host memory buffer preferred size (272..276).
    pub hmpre: u32,
    /// Host memory buffer minimum size (276..280).
    pub hmmin: u32,
    /// Total NVM capacity, bytes (280..296).
    pub tnvmcap: u128,
    /// Unallocated NVM capacity, bytes (296..312).
    pub unvmcap: u128,
    /// Replay protected memory block support (312..316).
    pub rpmbs: u32,
    /// Extended device self-test time (316..318).
    pub edstt: u16,
    /// Device self-test options (318).
    pub dsto: u8,
    /// Firmware update granularity (319).
    pub fwug: u8,
    /// Keep alive support: granularity in 100 ms units, 0 = unsupported (320..322).
    pub kas: u16,
    /// Host controlled thermal management attributes (322..324).
    pub hctma: u16,
    /// Minimum thermal management temperature (324..326).
    pub mntmt: u16,
    /// Maximum thermal management temperature (326..328).
    pub mxtmt: u16,
    /// Sanitize capabilities (328..332).
    pub sanicap: u32,
    /// ANA transition time (342).
    pub anatt: u8,
    /// ANA capabilities (343).
    pub anacap: u8,
    /// ANA group identifier maximum (344..348).
    pub anagrpmax: u32,
    /// Number of ANA group identifiers (348..352).
    pub nanagrpid: u32,
    /// Persistent event log size (352..356).
    pub pels: u32,
    /// Submission queue entry size: bits 3:0 required, 7:4 maximum, 2^n (512).
    pub sqes: u8,
    /// Completion queue entry size: bits 3:0 required, 7:4 maximum, 2^n (513).
    pub cqes: u8,
    /// Maximum outstanding commands (514..516).
    pub maxcmd: u16,
    /// Number of namespaces (highest NSID) (516..520).
    pub nn: u32,
    /// Optional NVM command support (520..522): bit 2 DSM, bit 3 Write Zeroes, ...
    pub oncs: u16,
    /// Fused operation support (522..524).
    pub fuses: u16,
    /// Format NVM attributes (524).
    pub fna: u8,
    /// Volatile write cache: bit 0 present, bits 2:1 flush broadcast (525).
    pub vwc: u8,
    /// Atomic write unit normal (526..528).
    pub awun: u16,
    /// Atomic write unit power fail (528..530).
    pub awupf: u16,
    /// I/O command set vendor specific command configuration (530).
    pub icsvscc: u8,
    /// Namespace write protection capabilities (531).
    pub nwpc: u8,
    /// Atomic compare & write unit (532..534).
    pub acwu: u16,
    /// SGL support (536..540), see [`SGLS_SUPPORTED`], [`SGLS_KEYED`], [`SGLS_OFFSET`].
    pub sgls: u32,
    /// Maximum number of allowed namespaces (540..544).
    pub mnan: u32,
    /// NVM subsystem NQN (768..1024).
    pub subnqn: FixedStr<NQN_MAX_LEN>,
    /// I/O queue command capsule supported size, 16 B units (1792..1796).
    pub ioccsz: u32,
    /// I/O queue response capsule supported size, 16 B units (1796..1800).
    pub iorcsz: u32,
    /// In-capsule data offset, 16 B units (1800..1802).
    pub icdoff: u16,
    /// Fabrics controller attributes (1802).
    pub fcatt: u8,
    /// Maximum SGL data block descriptors (1803).
    pub msdbd: u8,
    /// Optional fabric commands support (1804..1806).
    pub ofcs: u16,
    /// Power state descriptors 0..31 (2048..3072).
    pub psd: [PowerStateDescriptor; 32],
}

impl Default for IdentifyController {
    fn default() -> Self {
        Self {
            vid: 0,
            ssvid: 0,
            sn: FixedStr::EMPTY,
            mn: FixedStr::EMPTY,
            fr: FixedStr::EMPTY,
            rab: 0,
            ieee: [0; 3],
            cmic: 0,
            mdts: 0,
            cntlid: 0,
            ver: 0,
            rtd3r: 0,
            rtd3e: 0,
            oaes: 0,
            ctratt: 0,
            rrls: 0,
            cntrltype: 0,
            fguid: [0; 16],
            crdt: [0; 3],
            oacs: 0,
            acl: 0,
            aerl: 0,
            frmw: 0,
            lpa: 0,
            elpe: 0,
            npss: 0,
            avscc: 0,
            apsta: 0,
            wctemp: 0,
            cctemp: 0,
            mtfa: 0,
            hmpre: 0,
            hmmin: 0,
            tnvmcap: 0,
            unvmcap: 0,
            rpmbs: 0,
            edstt: 0,
            dsto: 0,
            fwug: 0,
            kas: 0,
            hctma: 0,
            mntmt: 0,
            mxtmt: 0,
            sanicap: 0,
            anatt: 0,
            anacap: 0,
            anagrpmax: 0,
            nanagrpid: 0,
            pels: 0,
            sqes: 0,
            cqes: 0,
            maxcmd: 0,
            nn: 0,
            oncs: 0,
            fuses: 0,
            fna: 0,
            vwc: 0,
            awun: 0,
            awupf: 0,
            icsvscc: 0,
            nwpc: 0,
            acwu: 0,
            sgls: 0,
            mnan: 0,
            subnqn: FixedStr::EMPTY,
            ioccsz: 0,
            iorcsz: 0,
            icdoff: 0,
            fcatt: 0,
            msdbd: 0,
            ofcs: 0,
            psd: [PowerStateDescriptor::default(); 32],
        }
    }
}

impl IdentifyController {
    /// Encode into the first 4096 bytes of `out` (everything not modelled is zero); returns
    /// 4096. Writes straight into a registered buffer, no allocation.
    pub fn encode_into(&self, out: &mut [u8]) -> Result<usize> {
        let b = take_mut::<IDENTIFY_DATA_SIZE>(out, "Identify Controller")?;
        b.fill(0);
        wr16(b, 0, self.vid);
        wr16(b, 2, self.ssvid);
        self.sn.write_field(&mut b[4..24], b' ');
        self.mn.write_field(&mut b[24..64], b' ');
        self.fr.write_field(&mut b[64..72], b' ');
        wr8(b, 72, self.rab);
        wrarr(b, 73, &self.ieee);
        wr8(b, 76, self.cmic);
        wr8(b, 77, self.mdts);
        wr16(b, 78, self.cntlid);
        wr32(b, 80, self.ver);
        wr32(b, 84, self.rtd3r);
        wr32(b, 88, self.rtd3e);
        wr32(b, 92, self.oaes);
        wr32(b, 96, self.ctratt);
        wr16(b, 100, self.rrls);
        wr8(b, 111, self.cntrltype);
        wrarr(b, 112, &self.fguid);
        for (i, c) in self.crdt.iter().enumerate() {
            wr16(b, 128 + 2 * i, *c);
        }
        wr16(b, 256, self.oacs);
        wr8(b, 258, self.acl);
        wr8(b, 259, self.aerl);
        wr8(b, 260, self.frmw);
        wr8(b, 261, self.lpa);
        wr8(b, 262, self.elpe);
        wr8(b, 263, self.npss);
        wr8(b, 264, self.avscc);
        wr8(b, 265, self.apsta);
        wr16(b, 266, self.wctemp);
        wr16(b, 268, self.cctemp);
        wr16(b, 270, self.mtfa);
        wr32(b, 272, self.hmpre);
        wr32(b, 276, self.hmmin);
        wr128(b, 280, self.tnvmcap);
        wr128(b, 296, self.unvmcap);
        wr32(b, 312, self.rpmbs);
        wr16(b, 316, self.edstt);
        wr8(b, 318, self.dsto);
        wr8(b, 319, self.fwug);
        wr16(b, 320, self.kas);
        wr16(b, 322, self.hctma);
        wr16(b, 324, self.mntmt);
        wr16(b, 326, self.mxtmt);
        wr32(b, 328, self.sanicap);
        wr8(b, 342, self.anatt);
        wr8(b, 343, self.anacap);
        wr32(b, 344, self.anagrpmax);
        wr32(b, 348, self.nanagrpid);
        wr32(b, 352, self.pels);
        wr8(b, 512, self.sqes);
        wr8(b, 513, self.cqes);
        wr16(b, 514, self.maxcmd);
        wr32(b, 516, self.nn);
        wr16(b, 520, self.oncs);
        wr16(b, 522, self.fuses);
        wr8(b, 524, self.fna);
        wr8(b, 525, self.vwc);
        wr16(b, 526, self.awun);
        wr16(b, 528, self.awupf);
        wr8(b, 530, self.icsvscc);
        wr8(b, 531, self.nwpc);
        wr16(b, 532, self.acwu);
        wr32(b, 536, self.sgls);
        wr32(b, 540, self.mnan);
        self.subnqn.write_field(&mut b[768..1024], 0);
        wr32(b, 1792, self.ioccsz);
        wr32(b, 1796, self.iorcsz);
        wr16(b, 1800, self.icdoff);
        wr8(b, 1802, self.fcatt);
        wr8(b, 1803, self.msdbd);
        wr16(b, 1804, self.ofcs);
        for (i, p) in self.psd.iter().enumerate() {
            let mut d = [0u8; 32];
            p.encode(&mut d);
            let off = 2048 + 32 * i;
            b[off..off + 32].copy_from_slice(&d);
        }
        Ok(IDENTIFY_DATA_SIZE)
    }

    /// Decode a 4096-byte image.
    pub fn decode(buf: &[u8]) -> Result<Self> {
        let b = take::<IDENTIFY_DATA_SIZE>(buf, "Identify Controller")?;
        let mut psd = [PowerStateDescriptor::default(); 32];
        for (i, p) in psd.iter_mut().enumerate() {
            *p = PowerStateDescriptor::decode(&rdarr(b, 2048 + 32 * i));
        }
        Ok(Self {
            vid: rd16(b, 0),
            ssvid: rd16(b, 2),
            sn: FixedStr::from_ascii_field_lossy(&b[4..24], "SN")?,
            mn: FixedStr::from_ascii_field_lossy(&b[24..64], "MN")?,
            fr: FixedStr::from_ascii_field_lossy(&b[64..72], "FR")?,
            rab: rd8(b, 72),
            ieee: rdarr(b, 73),
            cmic: rd8(b, 76),
            mdts: rd8(b, 77),
            cntlid: rd16(b, 78),
            ver: rd32(b, 80),
            rtd3r: rd32(b, 84),
            rtd3e: rd32(b, 88),
            oaes: rd32(b, 92),
            ctratt: rd32(b, 96),
            rrls: rd16(b, 100),
            cntrltype: rd8(b, 111),
            fguid: rdarr(b, 112),
            crdt: [rd16(b, 128), rd16(b, 130), rd16(b, 132)],
            oacs: rd16(b, 256),
            acl: rd8(b, 258),
            aerl: rd8(b, 259),
            frmw: rd8(b, 260),
            lpa: rd8(b, 261),
            elpe: rd8(b, 262),
            npss: rd8(b, 263),
            avscc: rd8(b, 264),
            apsta: rd8(b, 265),
            wctemp: rd16(b, 266),
            cctemp: rd16(b, 268),
            mtfa: rd16(b, 270),
            hmpre: rd32(b, 272),
            hmmin: rd32(b, 276),
            tnvmcap: rd128(b, 280),
            unvmcap: rd128(b, 296),
            rpmbs: rd32(b, 312),
            edstt: rd16(b, 316),
            dsto: rd8(b, 318),
            fwug: rd8(b, 319),
            kas: rd16(b, 320),
            hctma: rd16(b, 322),
            mntmt: rd16(b, 324),
            mxtmt: rd16(b, 326),
            sanicap: rd32(b, 328),
            anatt: rd8(b, 342),
            anacap: rd8(b, 343),
            anagrpmax: rd32(b, 344),
            nanagrpid: rd32(b, 348),
            pels: rd32(b, 352),
            sqes: rd8(b, 512),
            cqes: rd8(b, 513),
            maxcmd: rd16(b, 514),
            nn: rd32(b, 516),
            oncs: rd16(b, 520),
            fuses: rd16(b, 522),
            fna: rd8(b, 524),
            vwc: rd8(b, 525),
            awun: rd16(b, 526),
            awupf: rd16(b, 528),
            icsvscc: rd8(b, 530),
            nwpc: rd8(b, 531),
            acwu: rd16(b, 532),
            sgls: rd32(b, 536),
            mnan: rd32(b, 540),
            subnqn: FixedStr::from_field(&b[768..1024], "SUBNQN")?,
            ioccsz: rd32(b, 1792),
            iorcsz: rd32(b, 1796),
            icdoff: rd16(b, 1800),
            fcatt: rd8(b, 1802),
            msdbd: rd8(b, 1803),
            ofcs: rd16(b, 1804),
            psd,
        })
    }

    /// In-capsule data bytes the I/O queue capsule size allows ((IOCCSZ - 4) * 16).
    pub const fn in_capsule_data_size(&self) -> u32 {
        self.ioccsz.saturating_sub(4).saturating_mul(16)
    }
}

/// One LBA format (4 bytes at 128 + 4 * n): bits 15:0 MS, 23:16 LBADS, 25:24 RP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct LbaFormat {
    /// Metadata bytes per block.
    pub ms: u16,
    /// LBA data size as a power of two (9 = 512 B, 12 = 4 KiB); 0 = format not available.
    pub lbads: u8,
    /// Relative performance (2 bits).
    pub rp: u8,
}

impl LbaFormat {
    /// A format with no metadata.
    pub const fn with_block_shift(lbads: u8) -> Self {
        Self {
            ms: 0,
            lbads,
            rp: 0,
        }
    }
    /// Packed dword.
    pub const fn to_u32(&self) -> u32 {
        self.ms as u32 | ((self.lbads as u32) << 16) | (((self.rp & 3) as u32) << 24)
    }
    /// From the packed dword.
    pub const fn from_u32(v: u32) -> Self {
        Self {
            ms: v as u16,
            lbads: (v >> 16) as u8,
            rp: ((v >> 24) & 3) as u8,
        }
    }
    /// Block size in bytes, if LBADS is in a sane range (9..=31).
    pub const fn block_size(&self) -> Option<u32> {
        if self.lbads >= 9 && self.lbads < 32 {
            Some(1 << self.lbads)
        } else {
            None
        }
    }
}

/// Number of LBA format slots in NVMe 2.x.
pub const LBA_FORMATS: usize = 64;

/// Identify Namespace data structure (CNS 0x00, NVM command set).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IdentifyNamespace {
    /// Namespace size in blocks (0..8).
    pub nsze: u64,
    /// Namespace capacity in blocks (8..16).
    pub ncap: u64,
    /// Namespace utilization in blocks (16..24).
    pub nuse: u64,
    /// Namespace features (24): bit 0 thin provisioning, bit 2 DAE, ...
    pub nsfeat: u8,
    /// Number of LBA formats, 0's based (25).
    pub nlbaf: u8,
    /// Formatted LBA size (26): bits 3:0 index low, bit 4 extended metadata, bits 6:5 index high.
    pub flbas: u8,
    /// Metadata capabilities (27).
    pub mc: u8,
    /// End-to-end data protection capabilities (28).
    pub dpc: u8,
    /// End-to-end data protection type settings (29).
    pub dps: u8,
    /// Namespace multi-path I/O and sharing capabilities (30).
    pub nmic: u8,
    /// Reservation capabilities (31).
    pub rescap: u8,
    /// Format progress indicator (32).
    pub fpi: u8,
    /// Deallocate logical block features (33): bits 2:0 read value after deallocate.
    pub dlfeat: u8,
    /// Namespace atomic write unit normal (34..36).
    pub nawun: u16,
    /// Namespace atomic write unit power fail (36..38).
    pub nawupf: u16,
    /// Namespace atomic compare & write unit (38..40).
    pub nacwu: u16,
    /// Namespace atomic boundary size normal (40..42).
    pub nabsn: u16,
    /// Namespace atomic boundary offset (42..44).
    pub nabo: u16,
    /// Namespace atomic boundary size power fail (44..46).
    pub nabspf: u16,
    /// Namespace optimal I/O boundary (46..48).
    pub noiob: u16,
    /// NVM capacity, bytes (48..64).
    pub nvmcap: u128,
    /// Namespace preferred write granularity (64..66).
    pub npwg: u16,
    /// Namespace preferred write alignment (66..68).
    pub npwa: u16,
    /// Namespace preferred deallocate granularity (68..70).
    pub npdg: u16,
    /// Namespace preferred deallocate alignment (70..72).
    pub npda: u16,
    /// Namespace optimal write size (72..74).
    pub nows: u16,
    /// Maximum single source range length (74..76).
    pub mssrl: u16,
    /// Maximum copy length (76..80).
    pub mcl: u32,
    /// Maximum source range count (80).
    pub msrc: u8,
    /// Number of unique capability LBA formats (81).
    pub nulbaf: u8,
    /// ANA group identifier (92..96).
    pub anagrpid: u32,
    /// Namespace attributes (99): bit 0 write protected.
    pub nsattr: u8,
    /// NVM set identifier (100..102).
    pub nvmsetid: u16,
    /// Endurance group identifier (102..104).
    pub endgid: u16,
    /// Namespace globally unique identifier (104..120).
    pub nguid: [u8; 16],
    /// IEEE extended unique identifier (120..128).
    pub eui64: [u8; 8],
    /// LBA formats 0..63 (128..384).
    pub lbaf: [LbaFormat; LBA_FORMATS],
}

impl Default for IdentifyNamespace {
    fn default() -> Self {
        Self {
            nsze: 0,
            ncap: 0,
            nuse: 0,
            nsfeat: 0,
            nlbaf: 0,
            flbas: 0,
            mc: 0,
            dpc: 0,
            dps: 0,
            nmic: 0,
            rescap: 0,
            fpi: 0,
            dlfeat: 0,
            nawun: 0,
            nawupf: 0,
            nacwu: 0,
            nabsn: 0,
            nabo: 0,
            nabspf: 0,
            noiob: 0,
            nvmcap: 0,
            npwg: 0,
            npwa: 0,
            npdg: 0,
            npda: 0,
            nows: 0,
            mssrl: 0,
            mcl: 0,
            msrc: 0,
            nulbaf: 0,
            anagrpid: 0,
            nsattr: 0,
            nvmsetid: 0,
            endgid: 0,
            nguid: [0; 16],
            eui64: [0; 8],
            lbaf: [LbaFormat::default(); LBA_FORMATS],
        }
    }
}

impl IdentifyNamespace {
    /// A simple namespace of `blocks` blocks of 2^`block_shift` bytes, one LBA format.
    pub fn simple(blocks: u64, block_shift: u8) -> Self {
        let mut ns = Self {
            nsze: blocks,
            ncap: blocks,
            nuse: blocks,
            ..Self::default()
        };
        ns.lbaf[0] = LbaFormat::with_block_shift(block_shift);
        ns
    }

    /// Index of the LBA format in use (FLBAS bits 3:0 plus bits 6:5 as bits 5:4).
    pub const fn lba_format_index(&self) -> usize {
        ((self.flbas & 0xF) | ((self.flbas >> 5) & 3) << 4) as usize
    }

    /// The LBA format in use.
    pub fn current_lba_format(&self) -> LbaFormat {
        self.lbaf
            .get(self.lba_format_index())
            .copied()
            .unwrap_or_default()
    }

    /// Block size in bytes of the format in use.
    pub fn block_size(&self) -> Option<u32> {
        self.current_lba_format().block_size()
    }

    /// Encode into the first 4096 bytes of `out`; returns 4096.
    pub fn encode_into(&self, out: &mut [u8]) -> Result<usize> {
        let b = take_mut::<IDENTIFY_DATA_SIZE>(out, "Identify Namespace")?;
        b.fill(0);
        wr64(b, 0, self.nsze);
        wr64(b, 8, self.ncap);
        wr64(b, 16, self.nuse);
        wr8(b, 24, self.nsfeat);
        wr8(b, 25, self.nlbaf);
        wr8(b, 26, self.flbas);
        wr8(b, 27, self.mc);
        wr8(b, 28, self.dpc);
        wr8(b, 29, self.dps);
        wr8(b, 30, self.nmic);
        wr8(b, 31, self.rescap);
        wr8(b, 32, self.fpi);
        wr8(b, 33, self.dlfeat);
        wr16(b, 34, self.nawun);
        wr16(b, 36, self.nawupf);
        wr16(b, 38, self.nacwu);
        wr16(b, 40, self.nabsn);
        wr16(b, 42, self.nabo);
        wr16(b, 44, self.nabspf);
        wr16(b, 46, self.noiob);
        wr128(b, 48, self.nvmcap);
        wr16(b, 64, self.npwg);
        wr16(b, 66, self.npwa);
        wr16(b, 68, self.npdg);
        wr16(b, 70, self.npda);
        wr16(b, 72, self.nows);
        wr16(b, 74, self.mssrl);
        wr32(b, 76, self.mcl);
        wr8(b, 80, self.msrc);
        wr8(b, 81, self.nulbaf);
        wr32(b, 92, self.anagrpid);
        wr8(b, 99, self.nsattr);
        wr16(b, 100, self.nvmsetid);
        wr16(b, 102, self.endgid);
        wrarr(b, 104, &self.nguid);
        wrarr(b, 120, &self.eui64);
        for (i, f) in self.lbaf.iter().enumerate() {
            wr32(b, 128 + 4 * i, f.to_u32());
        }
        Ok(IDENTIFY_DATA_SIZE)
    }

    /// Decode a 4096-byte image.
    pub fn decode(buf: &[u8]) -> Result<Self> {
        let b = take::<IDENTIFY_DATA_SIZE>(buf, "Identify Namespace")?;
        let mut lbaf = [LbaFormat::default(); LBA_FORMATS];
        for (i, f) in lbaf.iter_mut().enumerate() {
            *f = LbaFormat::from_u32(rd32(b, 128 + 4 * i));
        }
        Ok(Self {
            nsze: rd64(b, 0),
            ncap: rd64(b, 8),
            nuse: rd64(b, 16),
            nsfeat: rd8(b, 24),
            nlbaf: rd8(b, 25),
            flbas: rd8(b, 26),
            mc: rd8(b, 27),
            dpc: rd8(b, 28),
            dps: rd8(b, 29),
            nmic: rd8(b, 30),
            rescap: rd8(b, 31),
            fpi: rd8(b, 32),
            dlfeat: rd8(b, 33),
            nawun: rd16(b, 34),
            nawupf: rd16(b, 36),
            nacwu: rd16(b, 38),
            nabsn: rd16(b, 40),
            nabo: rd16(b, 42),
            nabspf: rd16(b, 44),
            noiob: rd16(b, 46),
            nvmcap: rd128(b, 48),
            npwg: rd16(b, 64),
            npwa: rd16(b, 66),
            npdg: rd16(b, 68),
            npda: rd16(b, 70),
            nows: rd16(b, 72),
            mssrl: rd16(b, 74),
            mcl: rd32(b, 76),
            msrc: rd8(b, 80),
            nulbaf: rd8(b, 81),
            anagrpid: rd32(b, 92),
            nsattr: rd8(b, 99),
            nvmsetid: rd16(b, 100),
            endgid: rd16(b, 102),
            nguid: rdarr(b, 104),
            eui64: rdarr(b, 120),
            lbaf,
        })
    }
}

/// Most entries in a namespace ID list (4096 / 4).
pub const NS_LIST_MAX: usize = 1024;

/// A list of namespace IDs in a 4096-byte page: the Active Namespace ID list (CNS 0x02) and
/// the Changed Namespace List log (0x04). The list ends at the first zero entry.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct NsList {
    ids: [u32; NS_LIST_MAX],
    len: u16,
}

impl NsList {
    /// Marker the Changed Namespace List uses when more than 1024 namespaces changed.
    pub const OVERFLOW_MARKER: u32 = 0xFFFF_FFFF;

    /// The empty list.
    pub const fn empty() -> Self {
        Self {
            ids: [0; NS_LIST_MAX],
            len: 0,
        }
    }

    /// A list from `ids` (at most 1024, none zero; an active list should be ascending).
    pub fn new(ids: &[u32]) -> Result<Self> {
        if ids.len() > NS_LIST_MAX {
            return Err(ProtocolError::InvalidValue {
                field: "namespace list length",
                value: ids.len() as u64,
            });
        }
        if ids.contains(&0) {
            return Err(ProtocolError::InvalidValue {
                field: "NSID",
                value: 0,
            });
        }
        let mut l = Self::empty();
        l.ids[..ids.len()].copy_from_slice(ids);
        l.len = ids.len() as u16;
        Ok(l)
    }

    /// The "more than 1024 changed" list.
    pub fn overflow() -> Self {
        let mut l = Self::empty();
        l.ids[0] = Self::OVERFLOW_MARKER;
        l.len = 1;
        l
    }

    /// True for the overflow list.
    pub fn is_overflow(&self) -> bool {
        self.as_slice().first() == Some(&Self::OVERFLOW_MARKER)
    }

    /// The IDs.
    pub fn as_slice(&self) -> &[u32] {
        &self.ids[..usize::from(self.len)]
    }

    /// Encode the 4096-byte page; returns 4096.
    pub fn encode_into(&self, out: &mut [u8]) -> Result<usize> {
        let b = take_mut::<IDENTIFY_DATA_SIZE>(out, "namespace list")?;
        b.fill(0);
        for (i, id) in self.as_slice().iter().enumerate() {
            wr32(b, 4 * i, *id);
        }
        Ok(IDENTIFY_DATA_SIZE)
    }

    /// Decode a 4096-byte page.
    pub fn decode(buf: &[u8]) -> Result<Self> {
        let b = take::<IDENTIFY_DATA_SIZE>(buf, "namespace list")?;
        let mut l = Self::empty();
        for i in 0..NS_LIST_MAX {
            let id = rd32(b, 4 * i);
            if id == 0 {
                break;
            }
            l.ids[i] = id;
            l.len += 1;
        }
        Ok(l)
    }
}

impl core::fmt::Debug for NsList {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_list().entries(self.as_slice()).finish()
    }
}

impl Default for NsList {
    fn default() -> Self {
        Self::empty()
    }
}

/// Namespace identifier types (NIDT) and their lengths.
pub mod nidt {
    /// IEEE EUI-64 (8 bytes).
    pub const EUI64: u8 = 1;
    /// NGUID (16 bytes).
    pub const NGUID: u8 = 2;
    /// UUID (16 bytes).
    pub const UUID: u8 = 3;
    /// Command Set Identifier (1 byte).
    pub const CSI: u8 = 4;
}

/// One Namespace Identification Descriptor: 0 NIDT, 1 NIDL, 2..4 reserved, 4.. NID.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NsIdDescriptor {
    /// IEEE EUI-64.
    Eui64([u8; 8]),
    /// Namespace globally unique identifier.
    Nguid([u8; 16]),
    /// UUID.
    Uuid([u8; 16]),
    /// Command set identifier (0 = NVM).
    Csi(u8),
}

impl NsIdDescriptor {
    /// NIDT and NID bytes.
    fn parts(&self) -> (u8, &[u8]) {
        match self {
            Self::Eui64(v) => (nidt::EUI64, v),
            Self::Nguid(v) => (nidt::NGUID, v),
            Self::Uuid(v) => (nidt::UUID, v),
            Self::Csi(v) => (nidt::CSI, core::slice::from_ref(v)),
        }
    }
    /// Encoded size (4-byte header plus NID).
    pub fn encoded_len(&self) -> usize {
        4 + self.parts().1.len()
    }

    /// Encode a descriptor list into a zeroed 4096-byte page; returns 4096.
    pub fn encode_list(list: &[Self], out: &mut [u8]) -> Result<usize> {
        let b = take_mut::<IDENTIFY_DATA_SIZE>(out, "namespace identification descriptors")?;
        b.fill(0);
        let mut off = 0usize;
        for d in list {
            let (t, nid) = d.parts();
            let n = d.encoded_len();
            // Keep room for the terminating zero header.
            if off + n > IDENTIFY_DATA_SIZE - 4 {
                return Err(ProtocolError::BufferTooSmall {
                    what: "namespace identification descriptors",
                    need: off + n + 4,
                    got: IDENTIFY_DATA_SIZE,
                });
            }
            b[off] = t;
            b[off + 1] = nid.len() as u8;
            b[off + 4..off + n].copy_from_slice(nid);
            off += n;
        }
        Ok(IDENTIFY_DATA_SIZE)
    }

    /// Decode a descriptor list from a 4096-byte page. Unknown NIDT values are skipped using
    /// their NIDL; a known NIDT with the wrong NIDL, or a descriptor running past the page, is
    /// an error.
    pub fn decode_list(buf: &[u8]) -> Result<Vec<Self>> {
        let b = take::<IDENTIFY_DATA_SIZE>(buf, "namespace identification descriptors")?;
        let mut out = Vec::new();
        let mut off = 0usize;
        while off + 4 <= IDENTIFY_DATA_SIZE {
            let t = b[off];
            let l = usize::from(b[off + 1]);
            if t == 0 {
                break;
            }
            let nid = b
                .get(off + 4..off + 4 + l)
                .ok_or(ProtocolError::Truncated {
                    what: "namespace identification descriptor",
                    need: off + 4 + l,
                    got: IDENTIFY_DATA_SIZE,
                })?;
            let want = match t {
                nidt::EUI64 => 8,
                nidt::NGUID | nidt::UUID => 16,
                nidt::CSI => 1,
                _ => l,
            };
            if l != want {
                return Err(ProtocolError::InvalidValue {
                    field: "NIDL",
                    value: l as u64,
                });
            }
            match t {
                nidt::EUI64 => out.push(Self::Eui64(nid.try_into().unwrap_or_default())),
                nidt::NGUID => out.push(Self::Nguid(nid.try_into().unwrap_or_default())),
                nidt::UUID => out.push(Self::Uuid(nid.try_into().unwrap_or_default())),
                nidt::CSI => out.push(Self::Csi(nid.first().copied().unwrap_or(0))),
                _ => {}
            }
            off += 4 + l;
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cns_values() {
        assert_eq!(Cns::Namespace.raw(), 0x00);
        assert_eq!(Cns::Controller.raw(), 0x01);
        assert_eq!(Cns::ActiveNamespaceList.raw(), 0x02);
        assert_eq!(Cns::NamespaceDescriptors.raw(), 0x03);
    }

    /// A byte outside ASCII in SN, MN or FR reads as '?': the controller stays usable.
    #[test]
    fn odd_bytes_in_the_ascii_fields_decode() {
        let mut page = [0u8; 4096];
        fabrics_ctrl().encode_into(&mut page).unwrap();
        page[4 + 2] = 0xFF;
        page[24] = 0x80;
        page[64] = 0x01;
        let c = IdentifyController::decode(&page).unwrap();
        assert_eq!(c.sn.as_str(), "SN?001");
        assert_eq!(c.mn.as_str(), "?vmf-rs");
        assert_eq!(c.fr.as_str(), "?.1");
    }

    fn fabrics_ctrl() -> IdentifyController {
        IdentifyController {
            vid: 0x1b36,
            sn: FixedStr::new("SN0001", "x").unwrap(),
            mn: FixedStr::new("nvmf-rs", "x").unwrap(),
            fr: FixedStr::new("0.1", "x").unwrap(),
            mdts: 5,
            cntlid: 0x0102,
            ver: 0x0002_0000,
            kas: 100,
            sqes: 0x66,
            cqes: 0x44,
            maxcmd: 128,
            nn: 32,
            sgls: SGLS_SUPPORTED | SGLS_KEYED | SGLS_OFFSET,
            subnqn: FixedStr::new("nqn.2016-06.io.spdk:cnode1", "x").unwrap(),
            ioccsz: 4 + 4096 / 16,
            iorcsz: 1,
            icdoff: 0,
            fcatt: 0,
            msdbd: 1,
            ..IdentifyController::default()
        }
    }

    #[test]
    fn controller_fabrics_offsets() {
        let c = fabrics_ctrl();
        let mut b = vec![0xEEu8; 4096];
        assert_eq!(c.encode_into(&mut b), Ok(4096));
        assert_eq!(&b[0..2], &[0x36, 0x1b]);
        assert_eq!(&b[4..24], b"SN0001              ");
        assert_eq!(&b[24..31], b"nvmf-rs");
        assert_eq!(b[31], b' ');
        assert_eq!(&b[64..72], b"0.1     ");
        assert_eq!(b[77], 5);
        assert_eq!(&b[78..80], &[0x02, 0x01]);
        assert_eq!(&b[80..84], &[0, 0, 2, 0]);
        assert_eq!(&b[320..322], &[100, 0]);
        assert_eq!(b[512], 0x66);
        assert_eq!(b[513], 0x44);
        assert_eq!(&b[514..516], &[128, 0]);
        assert_eq!(&b[516..520], &[32, 0, 0, 0]);
        assert_eq!(&b[536..540], &[0x05, 0x00, 0x10, 0x00]);
        assert_eq!(&b[768..794], b"nqn.2016-06.io.spdk:cnode1");
        assert_eq!(b[794], 0);
        assert_eq!(&b[1792..1796], &260u32.to_le_bytes());
        assert_eq!(&b[1796..1800], &[1, 0, 0, 0]);
        assert_eq!(&b[1800..1802], &[0, 0]);
        assert_eq!(b[1803], 1);
        assert!(b[3072..].iter().all(|&x| x == 0));
        let d = IdentifyController::decode(&b).unwrap();
        assert_eq!(d, c);
        assert_eq!(d.in_capsule_data_size(), 4096);
    }

    #[test]
    fn controller_more_offsets_and_psd() {
        let mut c = fabrics_ctrl();
        c.oacs = 0x0102;
        c.npss = 0;
        c.oncs = 0x000C;
        c.vwc = 1;
        c.tnvmcap = 0x0102_0304_0506_0708_090a_0b0c_0d0e_0f10;
        c.crdt = [1, 2, 3];
        c.cntrltype = 1;
        c.psd[0] = PowerStateDescriptor {
            mp: 2500,
            nops: true,
            enlat: 7,
            exlat: 9,
            rrt: 1,
            rrl: 2,
            rwt: 3,
            rwl: 4,
            ips: 2,
            apw: 5,
            aps: 1,
            ..Default::default()
        };
        let mut b = [0u8; 4096];
        c.encode_into(&mut b).unwrap();
        assert_eq!(&b[256..258], &[0x02, 0x01]);
        assert_eq!(&b[520..522], &[0x0C, 0]);
        assert_eq!(b[525], 1);
        assert_eq!(b[111], 1);
        assert_eq!(&b[128..134], &[1, 0, 2, 0, 3, 0]);
        assert_eq!(b[280], 0x10);
        assert_eq!(b[295], 0x01);
        assert_eq!(&b[2048..2050], &2500u16.to_le_bytes());
        assert_eq!(b[2051], 2);
        assert_eq!(&b[2052..2056], &[7, 0, 0, 0]);
        assert_eq!(&b[2060..2064], &[1, 2, 3, 4]);
        assert_eq!(b[2066], 0x80);
        assert_eq!(b[2070], 0x45);
        assert_eq!(IdentifyController::decode(&b).unwrap(), c);
        assert!(IdentifyController::decode(&b[..4095]).is_err());
        assert!(c.encode_into(&mut [0u8; 100]).is_err());
    }

    #[test]
    fn namespace_offsets_and_lba_format() {
        let mut ns = IdentifyNamespace::simple(0x1_0000_0000, 12);
        ns.nlbaf = 1;
        ns.lbaf[1] = LbaFormat {
            ms: 8,
            lbads: 9,
            rp: 2,
        };
        ns.flbas = 0x01;
        ns.nsfeat = 0x04;
        ns.dlfeat = 0x01;
        ns.nguid = [7; 16];
        ns.eui64 = [8; 8];
        ns.anagrpid = 1;
        let mut b = [0u8; 4096];
        ns.encode_into(&mut b).unwrap();
        assert_eq!(&b[0..8], &[0, 0, 0, 0, 1, 0, 0, 0]);
        assert_eq!(&b[8..16], &[0, 0, 0, 0, 1, 0, 0, 0]);
        assert_eq!(b[24], 0x04);
        assert_eq!(b[25], 1);
        assert_eq!(b[26], 1);
        assert_eq!(b[33], 1);
        assert_eq!(&b[92..96], &[1, 0, 0, 0]);
        assert_eq!(&b[104..120], &[7; 16]);
        assert_eq!(&b[120..128], &[8; 8]);
        assert_eq!(&b[128..132], &[0, 0, 12, 0]);
        assert_eq!(&b[132..136], &[8, 0, 9, 2]);
        let d = IdentifyNamespace::decode(&b).unwrap();
        assert_eq!(d, ns);
        assert_eq!(d.block_size(), Some(512));
        assert_eq!(d.lba_format_index(), 1);
        let hi = IdentifyNamespace {
            flbas: 0x60 | 0x3,
            ..ns
        };
        assert_eq!(hi.lba_format_index(), 0x33);
        assert_eq!(IdentifyNamespace::simple(1, 12).block_size(), Some(4096));
        assert_eq!(LbaFormat::with_block_shift(0).block_size(), None);
    }

    #[test]
    fn ns_list_page() {
        let l = NsList::new(&[1, 2, 5]).unwrap();
        let mut b = [0xFFu8; 4096];
        l.encode_into(&mut b).unwrap();
        assert_eq!(&b[..16], &[1, 0, 0, 0, 2, 0, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0]);
        assert!(b[12..].iter().all(|&x| x == 0));
        assert_eq!(NsList::decode(&b).unwrap(), l);
        assert!(NsList::new(&[0]).is_err());
        assert!(NsList::new(&[1; 1025]).is_err());
        let full: Vec<u32> = (1..=1024).collect();
        let f = NsList::new(&full).unwrap();
        f.encode_into(&mut b).unwrap();
        assert_eq!(NsList::decode(&b).unwrap().as_slice().len(), 1024);
        let o = NsList::overflow();
        o.encode_into(&mut b).unwrap();
        assert!(NsList::decode(&b).unwrap().is_overflow());
    }

    #[test]
    fn ns_id_descriptors() {
        let list = [
            NsIdDescriptor::Eui64([1; 8]),
            NsIdDescriptor::Nguid([2; 16]),
            NsIdDescriptor::Uuid([3; 16]),
            NsIdDescriptor::Csi(0),
        ];
        let mut b = [0u8; 4096];
        NsIdDescriptor::encode_list(&list, &mut b).unwrap();
        assert_eq!(&b[0..4], &[1, 8, 0, 0]);
        assert_eq!(&b[4..12], &[1; 8]);
        assert_eq!(&b[12..16], &[2, 16, 0, 0]);
        assert_eq!(&b[32..36], &[3, 16, 0, 0]);
        assert_eq!(&b[52..56], &[4, 1, 0, 0]);
        assert_eq!(b[56], 0);
        assert_eq!(NsIdDescriptor::decode_list(&b).unwrap(), list.to_vec());
        // Unknown NIDT skipped by its length.
        let mut u = [0u8; 4096];
        u[0] = 0x7;
        u[1] = 2;
        u[6..10].copy_from_slice(&[4, 1, 0, 0]);
        u[10] = 2;
        assert_eq!(
            NsIdDescriptor::decode_list(&u).unwrap(),
            vec![NsIdDescriptor::Csi(2)]
        );
        // Wrong length for a known type.
        let mut w = [0u8; 4096];
        w[0] = 3;
        w[1] = 8;
        assert!(NsIdDescriptor::decode_list(&w).is_err());
        // Descriptor running off the page.
        let mut r = [0u8; 4096];
        let mut off = 0;
        while off + 2 <= 4096 {
            r[off] = 9;
            r[off + 1] = 250;
            off += 254;
        }
        assert!(matches!(
            NsIdDescriptor::decode_list(&r),
            Err(ProtocolError::Truncated { .. })
        ));
    }
}
