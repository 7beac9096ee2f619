//! Controller properties a Fabrics host reads and writes with Property Get/Set: CAP, VS, CC,
//! CSTS (and NSSR), with typed fields.

use crate::bytes::wire_enum;

wire_enum! {
    /// Property offsets.
    pub enum PropertyOffset: u32 {
        /// Controller Capabilities (8 bytes).
        Cap = 0x00,
        /// Version.
        Vs = 0x08,
        /// Controller Configuration.
        Cc = 0x14,
        /// Controller Status.
        Csts = 0x1C,
        /// NVM Subsystem Reset.
        Nssr = 0x20,
        /// Controller Ready Timeouts.
        Crto = 0x68,
    }
}

impl PropertyOffset {
    /// Width in bytes of a known property.
    pub const fn width(self) -> Option<usize> {
        match self {
            Self::Cap => Some(8),
            Self::Unknown(_) => None,
            _ => Some(4),
        }
    }
}

/// Value to write to NSSR to reset the subsystem ("NVMe").
pub const NSSR_RESET_VALUE: u32 = 0x4E56_4D65;

const fn f64(v: u64, shift: u32, width: u32) -> u64 {
    (v >> shift) & ((1u64 << width) - 1)
}
const fn p64(field: u64, shift: u32, width: u32) -> u64 {
    (field & ((1u64 << width) - 1)) << shift
}

/// Controller Capabilities (CAP, offset 0x00, 8 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Cap {
    /// Maximum Queue Entries Supported, 0's based (bits 15:0).
    pub mqes: u16,
    /// Contiguous Queues Required (bit 16).
    pub cqr: bool,
    /// Arbitration Mechanism Supported (bits 18:17: bit 0 WRR with urgent, bit 1 vendor).
    pub ams: u8,
    /// Timeout, 500 ms units (bits 31:24).
    pub to: u8,
    /// Doorbell Stride (bits 35:32).
    pub dstrd: u8,
    /// NVM Subsystem Reset Supported (bit 36).
    pub nssrs: bool,
    /// Command Sets Supported (bits 44:37: bit 0 NVM, bit 6 I/O command sets, bit 7 admin only).
    pub css: u8,
    /// Boot Partition Support (bit 45).
    pub bps: bool,
    /// Controller Power Scope (bits 47:46).
    pub cps: u8,
    /// Memory Page Size Minimum, 2^(12+n) (bits 51:48).
    pub mpsmin: u8,
    /// Memory Page Size Maximum, 2^(12+n) (bits 55:52).
    pub mpsmax: u8,
    /// Persistent Memory Region Supported (bit 56).
    pub pmrs: bool,
    /// Controller Memory Buffer Supported (bit 57).
    pub cmbs: bool,
    /// NVM Subsystem Shutdown Supported (bit 58).
    pub nsss: bool,
    /// Controller Ready Modes Supported (bits 60:59).
    pub crms: u8,
}

impl Cap {
    /// CSS bit: NVM command set.
    pub const CSS_NVM: u8 = 1 << 0;
    /// CSS bit: one or more I/O command sets.
    pub const CSS_IO_COMMAND_SETS: u8 = 1 << 6;
    /// CSS bit: no I/O command set (admin only, e.g. discovery).
    pub const CSS_ADMIN_ONLY: u8 = 1 << 7;

    /// Pack into the 64-bit register value.
    pub const fn to_u64(&self) -> u64 {
        p64(self.mqes as u64, 0, 16)
            | p64(self.cqr as u64, 16, 1)
            | p64(self.ams as u64, 17, 2)
            | p64(self.to as u64, 24, 8)
            | p64(self.dstrd as u64, 32, 4)
            | p64(self.nssrs as u64, 36, 1)
            | p64(self.css as u64, 37, 8)
            | p64(self.bps as u64, 45, 1)
            | p64(self.cps as u64, 46, 2)
            | p64(self.mpsmin as u64, 48, 4)
            | p64(self.mpsmax as u64, 52, 4)
            | p64(self.pmrs as u64, 56, 1)
            | p64(self.cmbs as u64, 57, 1)
            | p64(self.nsss as u64, 58, 1)
            | p64(self.crms as u64, 59, 2)
    }
    /// Unpack (reserved bits ignored).
    pub const fn from_u64(v: u64) -> Self {
        Self {
            mqes: f64(v, 0, 16) as u16,
            cqr: f64(v, 16, 1) == 1,
            ams: f64(v, 17, 2) as u8,
            to: f64(v, 24, 8) as u8,
            dstrd: f64(v, 32, 4) as u8,
            nssrs: f64(v, 36, 1) == 1,
            css: f64(v, 37, 8) as u8,
            bps: f64(v, 45, 1) == 1,
            cps: f64(v, 46, 2) as u8,
            mpsmin: f64(v, 48, 4) as u8,
            mpsmax: f64(v, 52, 4) as u8,
            pmrs: f64(v, 56, 1) == 1,
            cmbs: f64(v, 57, 1) == 1,
            nsss: f64(v, 58, 1) == 1,
            crms: f64(v, 59, 2) as u8,
        }
    }
    /// Largest queue depth (MQES + 1).
    pub const fn max_queue_entries(&self) -> u32 {
        self.mqes as u32 + 1
    }
    /// Ready timeout in milliseconds (TO * 500).
    pub const fn timeout_ms(&self) -> u32 {
        self.to as u32 * 500
    }
}

/// Version (VS, offset 0x08): bits 31:16 MJR, 15:8 MNR, 7:0 TER.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct Vs {
    /// Major version.
    pub major: u16,
    /// Minor version.
    pub minor: u8,
    /// Tertiary version.
    pub tertiary: u8,
}

impl Vs {
    /// NVMe 1.3.
    pub const V1_3: Self = Self::new(1, 3, 0);
    /// NVMe 1.4.
    pub const V1_4: Self = Self::new(1, 4, 0);
    /// NVMe 2.0.
    pub const V2_0: Self = Self::new(2, 0, 0);
    /// A version.
    pub const fn new(major: u16, minor: u8, tertiary: u8) -> Self {
        Self {
            major,
            minor,
            tertiary,
        }
    }
    /// Register value.
    pub const fn to_u32(&self) -> u32 {
        ((self.major as u32) << 16) | ((self.minor as u32) << 8) | self.tertiary as u32
    }
    /// From the register value.
    pub const fn from_u32(v: u32) -> Self {
        Self {
            major: (v >> 16) as u16,
            minor: (v >> 8) as u8,
            tertiary: v as u8,
        }
    }
}

wire_enum! {
    /// Shutdown Notification (CC.SHN, 2 bits).
    pub enum ShutdownNotification: u8 {
        /// No notification.
        None = 0,
        /// Normal shutdown.
        Normal = 1,
        /// Abrupt shutdown.
        Abrupt = 2,
    }
}

wire_enum! {
    /// Shutdown Status (CSTS.SHST, 2 bits).
    pub enum ShutdownStatus: u8 {
        /// Normal operation.
        Normal = 0,
        /// Shutdown processing occurring.
        Occurring = 1,
        /// Shutdown processing complete.
        Complete = 2,
    }
}

/// Controller Configuration (CC, offset 0x14).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Cc {
    /// Enable (bit 0).
    pub en: bool,
    /// I/O Command Set Selected (bits 6:4).
    pub css: u8,
    /// Memory Page Size, 2^(12+n) (bits 10:7).
    pub mps: u8,
    /// Arbitration Mechanism Selected (bits 13:11).
    pub ams: u8,
    /// Shutdown Notification (bits 15:14).
    pub shn: ShutdownNotification,
    /// I/O Submission Queue Entry Size, 2^n (bits 19:16; 6 = 64 B).
    pub iosqes: u8,
    /// I/O Completion Queue Entry Size, 2^n (bits 23:20; 4 = 16 B).
    pub iocqes: u8,
    /// Controller Ready Independent of Media Enable (bit 24).
    pub crime: bool,
}

impl Default for Cc {
    fn default() -> Self {
        Self::from_u32(0)
    }
}

impl Cc {
    /// What a host writes to enable a controller for the NVM command set: EN with 64-byte
    /// submission and 16-byte completion queue entries (IOSQES 6, IOCQES 4), as Linux does.
    pub const fn enabled_nvm() -> Self {
        Self {
            en: true,
            iosqes: 6,
            iocqes: 4,
            ..Self::from_u32(0)
        }
    }

    /// Register value.
    pub const fn to_u32(&self) -> u32 {
        use crate::bytes::{flag32, put32};
        flag32(self.en, 0)
            | put32(self.css as u32, 4, 3)
            | put32(self.mps as u32, 7, 4)
            | put32(self.ams as u32, 11, 3)
            | put32(self.shn.raw() as u32, 14, 2)
            | put32(self.iosqes as u32, 16, 4)
            | put32(self.iocqes as u32, 20, 4)
            | flag32(self.crime, 24)
    }
    /// From the register value (reserved bits ignored).
    pub const fn from_u32(v: u32) -> Self {
        use crate::bytes::{bit32, bits32};
        Self {
            en: bit32(v, 0),
            css: bits32(v, 4, 3) as u8,
            mps: bits32(v, 7, 4) as u8,
            ams: bits32(v, 11, 3) as u8,
            shn: ShutdownNotification::from_raw(bits32(v, 14, 2) as u8),
            iosqes: bits32(v, 16, 4) as u8,
            iocqes: bits32(v, 20, 4) as u8,
            crime: bit32(v, 24),
        }
    }
}

/// Controller Status (CSTS, offset 0x1C).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Csts {
    /// Ready (bit 0).
    pub rdy: bool,
    /// Controller Fatal Status (bit 1).
    pub cfs: bool,
    /// Shutdown Status (bits 3:2).
    pub shst: ShutdownStatus,
    /// NVM Subsystem Reset Occurred (bit 4).
    pub nssro: bool,
    /// Processing Paused (bit 5).
    pub pp: bool,
    /// Shutdown Type (bit 6).
    pub st: bool,
}

impl Default for Csts {
    fn default() -> Self {
        Self::from_u32(0)
    }
}

impl Csts {
    /// Register value.
    pub const fn to_u32(&self) -> u32 {
        use crate::bytes::{flag32, put32};
        flag32(self.rdy, 0)
            | flag32(self.cfs, 1)
            | put32(self.shst.raw() as u32, 2, 2)
            | flag32(self.nssro, 4)
            | flag32(self.pp, 5)
            | flag32(self.st, 6)
    }
    /// From the register value.
    pub const fn from_u32(v: u32) -> Self {
        use crate::bytes::{bit32, bits32};
        Self {
            rdy: bit32(v, 0),
            cfs: bit32(v, 1),
            shst: ShutdownStatus::from_raw(bits32(v, 2, 2) as u8),
            nssro: bit32(v, 4),
            pp: bit32(v, 5),
            st: bit32(v, 6),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets() {
        assert_eq!(PropertyOffset::Cap.raw(), 0x00);
        assert_eq!(PropertyOffset::Vs.raw(), 0x08);
        assert_eq!(PropertyOffset::Cc.raw(), 0x14);
        assert_eq!(PropertyOffset::Csts.raw(), 0x1C);
        assert_eq!(PropertyOffset::Nssr.raw(), 0x20);
        assert_eq!(PropertyOffset::Cap.width(), Some(8));
        assert_eq!(PropertyOffset::Cc.width(), Some(4));
        assert_eq!(PropertyOffset::from_raw(0x0C).width(), None);
    }

    #[test]
    fn cap_bits() {
        let one = |f: fn(&mut Cap)| {
            let mut c = Cap::default();
            f(&mut c);
            c.to_u64()
        };
        assert_eq!(one(|c| c.mqes = 0xFFFF), 0xFFFF);
        assert_eq!(one(|c| c.cqr = true), 1 << 16);
        assert_eq!(one(|c| c.ams = 3), 3 << 17);
        assert_eq!(one(|c| c.to = 0xFF), 0xFF << 24);
        assert_eq!(one(|c| c.dstrd = 0xF), 0xF << 32);
        assert_eq!(one(|c| c.nssrs = true), 1 << 36);
        assert_eq!(one(|c| c.css = 0xFF), 0xFF << 37);
        assert_eq!(one(|c| c.bps = true), 1 << 45);
        assert_eq!(one(|c| c.cps = 3), 3 << 46);
        assert_eq!(one(|c| c.mpsmin = 0xF), 0xF << 48);
        assert_eq!(one(|c| c.mpsmax = 0xF), 0xF << 52);
        assert_eq!(one(|c| c.pmrs = true), 1 << 56);
        assert_eq!(one(|c| c.cmbs = true), 1 << 57);
        assert_eq!(one(|c| c.nsss = true), 1 << 58);
        assert_eq!(one(|c| c.crms = 3), 3 << 59);
        // A typical fabrics target: MQES 127, CQR, TO 15 s, CSS NVM, MPSMIN/MAX 4 KiB.
        let v = 0x0000_0020_1E01_007Fu64;
        let c = Cap::from_u64(v);
        assert_eq!(c.mqes, 127);
        assert!(c.cqr);
        assert_eq!(c.to, 0x1E);
        assert_eq!(c.timeout_ms(), 15000);
        assert_eq!(c.css, Cap::CSS_NVM);
        assert_eq!(c.max_queue_entries(), 128);
        assert_eq!(c.to_u64(), v);
    }

    #[test]
    fn vs_cc_csts_bits() {
        assert_eq!(Vs::V1_3.to_u32(), 0x0001_0300);
        assert_eq!(Vs::from_u32(0x0002_0100), Vs::new(2, 1, 0));
        // Linux host bring-up: EN=1, IOSQES=6, IOCQES=4.
        let cc = Cc {
            en: true,
            iosqes: 6,
            iocqes: 4,
            ..Cc::default()
        };
        assert_eq!(cc.to_u32(), 0x0046_0001);
        assert_eq!(Cc::from_u32(0x0046_0001), cc);
        assert_eq!(Cc::enabled_nvm(), cc);
        let shn = Cc {
            shn: ShutdownNotification::Normal,
            css: 7,
            mps: 0xF,
            ams: 7,
            crime: true,
            ..cc
        };
        assert_eq!(
            shn.to_u32(),
            0x0046_0001 | (1 << 14) | (7 << 4) | (0xF << 7) | (7 << 11) | (1 << 24)
        );
        let cs = Csts {
            rdy: true,
            cfs: false,
            shst: ShutdownStatus::Complete,
            nssro: true,
            pp: true,
            st: true,
        };
        assert_eq!(cs.to_u32(), 0b111_1001);
        assert_eq!(Csts::from_u32(0b111_1001), cs);
        assert!(Csts::from_u32(2).cfs);
    }
}
