//! Feature identifiers and typed values for the features a block target implements:
//! Arbitration, Power Management, Volatile Write Cache, Number of Queues, Asynchronous Event
//! Configuration and Keep Alive Timer. Each value maps to and from the Set Features CDW11 (and
//! the Get Features completion DW0, which uses the same layout).

use crate::bytes::{bit32, bits32, flag32, put32, wire_enum};
use crate::error::{ProtocolError, Result};

wire_enum! {
    /// Feature identifiers (FID).
    pub enum FeatureId: u8 {
        /// Arbitration.
        Arbitration = 0x01,
        /// Power Management.
        PowerManagement = 0x02,
        /// LBA Range Type.
        LbaRangeType = 0x03,
        /// Temperature Threshold.
        TemperatureThreshold = 0x04,
        /// Error Recovery.
        ErrorRecovery = 0x05,
        /// Volatile Write Cache.
        VolatileWriteCache = 0x06,
        /// Number of Queues.
        NumberOfQueues = 0x07,
        /// Interrupt Coalescing.
        InterruptCoalescing = 0x08,
        /// Interrupt Vector Configuration.
        InterruptVectorConfig = 0x09,
        /// Write Atomicity Normal.
        WriteAtomicity = 0x0A,
        /// Asynchronous Event Configuration.
        AsyncEventConfig = 0x0B,
        /// Autonomous Power State Transition.
        AutonomousPowerStateTransition = 0x0C,
        /// Host Memory Buffer.
        HostMemoryBuffer = 0x0D,
        /// Timestamp.
        Timestamp = 0x0E,
        /// Keep Alive Timer.
        KeepAliveTimer = 0x0F,
        /// Host Controlled Thermal Management.
        HostControlledThermalManagement = 0x10,
        /// Non-Operational Power State Config.
        NonOperationalPowerStateConfig = 0x11,
        /// Host Identifier.
        HostIdentifier = 0x81,
        /// Reservation Notification Mask.
        ReservationNotificationMask = 0x82,
        /// Reservation Persistence.
        ReservationPersistence = 0x83,
    }
}

/// Arbitration (FID 0x01): bits 2:0 AB (burst, 2^n; 7 = no limit), 15:8 LPW, 23:16 MPW,
/// 31:24 HPW (weights are 0's based).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Arbitration {
    /// Arbitration burst (3 bits).
    pub burst: u8,
    /// Low priority weight.
    pub low_weight: u8,
    /// Medium priority weight.
    pub medium_weight: u8,
    /// High priority weight.
    pub high_weight: u8,
}

impl Arbitration {
    /// Pack into CDW11.
    pub const fn to_dword(&self) -> u32 {
        put32(self.burst as u32, 0, 3)
            | ((self.low_weight as u32) << 8)
            | ((self.medium_weight as u32) << 16)
            | ((self.high_weight as u32) << 24)
    }
    /// Unpack from CDW11 (reserved bits ignored).
    pub const fn from_dword(v: u32) -> Self {
        Self {
            burst: bits32(v, 0, 3) as u8,
            low_weight: (v >> 8) as u8,
            medium_weight: (v >> 16) as u8,
            high_weight: (v >> 24) as u8,
        }
    }
}

/// Power Management (FID 0x02): bits 4:0 PS (power state), 7:5 WH (workload hint).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct PowerManagement {
    /// Power state (5 bits).
    pub power_state: u8,
    /// Workload hint (3 bits).
    pub workload_hint: u8,
}

impl PowerManagement {
    /// Pack into CDW11.
    pub const fn to_dword(&self) -> u32 {
        put32(self.power_state as u32, 0, 5) | put32(self.workload_hint as u32, 5, 3)
    }
    /// Unpack from CDW11.
    pub const fn from_dword(v: u32) -> Self {
        Self {
            power_state: bits32(v, 0, 5) as u8,
            workload_hint: bits32(v, 5, 3) as u8,
        }
    }
}

/// Volatile Write Cache (FID 0x06): bit 0 WCE.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct VolatileWriteCache {
    /// Write cache enabled.
    pub enabled: bool,
}

impl VolatileWriteCache {
    /// Pack into CDW11.
    pub const fn to_dword(&self) -> u32 {
        self.enabled as u32
    }
    /// Unpack from CDW11.
    pub const fn from_dword(v: u32) -> Self {
        Self {
            enabled: bit32(v, 0),
        }
    }
}

/// Number of Queues (FID 0x07): bits 15:0 NSQR, 31:16 NCQR, both 0's based. The completion
/// DW0 carries NSQA/NCQA in the same positions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct NumberOfQueues {
    /// I/O submission queues, 0's based.
    pub nsq: u16,
    /// I/O completion queues, 0's based.
    pub ncq: u16,
}

impl NumberOfQueues {
    /// From counts (1-based); `None` for 0 or more than 65536.
    pub fn from_counts(sq: u32, cq: u32) -> Option<Self> {
        let z = |n: u32| n.checked_sub(1).and_then(|v| u16::try_from(v).ok());
        Some(Self {
            nsq: z(sq)?,
            ncq: z(cq)?,
        })
    }
    /// Pack into CDW11 / DW0.
    pub const fn to_dword(&self) -> u32 {
        self.nsq as u32 | ((self.ncq as u32) << 16)
    }
    /// Unpack from CDW11 / DW0.
    pub const fn from_dword(v: u32) -> Self {
        Self {
            nsq: v as u16,
            ncq: (v >> 16) as u16,
        }
    }
    /// Validate a request: 0xFFFF is not allowed in either field (spec: Invalid Field).
    pub fn validate_request(&self) -> Result<()> {
        for (field, v) in [("NSQR", self.nsq), ("NCQR", self.ncq)] {
            if v == 0xFFFF {
                return Err(ProtocolError::InvalidValue {
                    field,
                    value: u64::from(v),
                });
            }
        }
        Ok(())
    }
}

/// Asynchronous Event Configuration (FID 0x0B).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct AsyncEventConfig {
    /// SMART / Health critical warnings to report (bits 7:0).
    pub smart_critical_warnings: u8,
    /// Namespace Attribute Notices (bit 8).
    pub namespace_attribute: bool,
    /// Firmware Activation Notices (bit 9).
    pub firmware_activation: bool,
    /// Telemetry Log Notices (bit 10).
    pub telemetry_log: bool,
    /// ANA Change Notices (bit 11).
    pub ana_change: bool,
    /// Predictable Latency Event Aggregate Log Change Notices (bit 12).
    pub predictable_latency: bool,
    /// LBA Status Information Notices (bit 13).
    pub lba_status: bool,
    /// Endurance Group Event Aggregate Log Change Notices (bit 14).
    pub endurance_group: bool,
    /// Normal NVM Subsystem Shutdown Notices (bit 15).
    pub normal_subsystem_shutdown: bool,
    /// Discovery Log Page Change Notification (bit 31).
    pub discovery_log_change: bool,
}

impl AsyncEventConfig {
    /// Pack into CDW11.
    pub const fn to_dword(&self) -> u32 {
        self.smart_critical_warnings as u32
            | flag32(self.namespace_attribute, 8)
            | flag32(self.firmware_activation, 9)
            | flag32(self.telemetry_log, 10)
            | flag32(self.ana_change, 11)
            | flag32(self.predictable_latency, 12)
            | flag32(self.lba_status, 13)
            | flag32(self.endurance_group, 14)
            | flag32(self.normal_subsystem_shutdown, 15)
            | flag32(self.discovery_log_change, 31)
    }
    /// Unpack from CDW11 (unnamed bits ignored).
    pub const fn from_dword(v: u32) -> Self {
        Self {
            smart_critical_warnings: v as u8,
            namespace_attribute: bit32(v, 8),
            firmware_activation: bit32(v, 9),
            telemetry_log: bit32(v, 10),
            ana_change: bit32(v, 11),
            predictable_latency: bit32(v, 12),
            lba_status: bit32(v, 13),
            endurance_group: bit32(v, 14),
            normal_subsystem_shutdown: bit32(v, 15),
            discovery_log_change: bit32(v, 31),
        }
    }
}

/// Keep Alive Timer (FID 0x0F): CDW11 = KATO in milliseconds (0 disables).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct KeepAliveTimer {
    /// Keep alive timeout in ms.
    pub kato_ms: u32,
}

impl KeepAliveTimer {
    /// Pack into CDW11.
    pub const fn to_dword(&self) -> u32 {
        self.kato_ms
    }
    /// Unpack from CDW11.
    pub const fn from_dword(v: u32) -> Self {
        Self { kato_ms: v }
    }
}

/// A typed feature value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Feature {
    /// FID 0x01.
    Arbitration(Arbitration),
    /// FID 0x02.
    PowerManagement(PowerManagement),
    /// FID 0x06.
    VolatileWriteCache(VolatileWriteCache),
    /// FID 0x07.
    NumberOfQueues(NumberOfQueues),
    /// FID 0x0B.
    AsyncEventConfig(AsyncEventConfig),
    /// FID 0x0F.
    KeepAliveTimer(KeepAliveTimer),
}

impl Feature {
    /// Interpret `cdw11` for `fid`; unsupported FIDs are an `InvalidValue` on "FID".
    pub fn decode(fid: FeatureId, cdw11: u32) -> Result<Self> {
        Ok(match fid {
            FeatureId::Arbitration => Self::Arbitration(Arbitration::from_dword(cdw11)),
            FeatureId::PowerManagement => Self::PowerManagement(PowerManagement::from_dword(cdw11)),
            FeatureId::VolatileWriteCache => {
                Self::VolatileWriteCache(VolatileWriteCache::from_dword(cdw11))
            }
            FeatureId::NumberOfQueues => Self::NumberOfQueues(NumberOfQueues::from_dword(cdw11)),
            FeatureId::AsyncEventConfig => {
                Self::AsyncEventConfig(AsyncEventConfig::from_dword(cdw11))
            }
            FeatureId::KeepAliveTimer => Self::KeepAliveTimer(KeepAliveTimer::from_dword(cdw11)),
            other => {
                return Err(ProtocolError::InvalidValue {
                    field: "FID",
                    value: u64::from(other.raw()),
                });
            }
        })
    }
    /// The feature identifier.
    pub const fn fid(&self) -> FeatureId {
        match self {
            Self::Arbitration(_) => FeatureId::Arbitration,
            Self::PowerManagement(_) => FeatureId::PowerManagement,
            Self::VolatileWriteCache(_) => FeatureId::VolatileWriteCache,
            Self::NumberOfQueues(_) => FeatureId::NumberOfQueues,
            Self::AsyncEventConfig(_) => FeatureId::AsyncEventConfig,
            Self::KeepAliveTimer(_) => FeatureId::KeepAliveTimer,
        }
    }
    /// CDW11 / completion DW0.
    pub const fn to_dword(&self) -> u32 {
        match self {
            Self::Arbitration(v) => v.to_dword(),
            Self::PowerManagement(v) => v.to_dword(),
            Self::VolatileWriteCache(v) => v.to_dword(),
            Self::NumberOfQueues(v) => v.to_dword(),
            Self::AsyncEventConfig(v) => v.to_dword(),
            Self::KeepAliveTimer(v) => v.to_dword(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn feature_ids() {
        assert_eq!(FeatureId::Arbitration.raw(), 0x01);
        assert_eq!(FeatureId::PowerManagement.raw(), 0x02);
        assert_eq!(FeatureId::VolatileWriteCache.raw(), 0x06);
        assert_eq!(FeatureId::NumberOfQueues.raw(), 0x07);
        assert_eq!(FeatureId::AsyncEventConfig.raw(), 0x0B);
        assert_eq!(FeatureId::KeepAliveTimer.raw(), 0x0F);
    }

    #[test]
    fn number_of_queues_layout() {
        let n = NumberOfQueues::from_counts(4, 8).unwrap();
        assert_eq!(n.to_dword(), 0x0007_0003);
        assert_eq!(NumberOfQueues::from_dword(0x0007_0003), n);
        assert!(NumberOfQueues::from_counts(0, 1).is_none());
        assert!(
            NumberOfQueues::from_dword(0xFFFF_0000)
                .validate_request()
                .is_err()
        );
    }

    #[test]
    fn bit_layouts() {
        let a = Arbitration {
            burst: 7,
            low_weight: 1,
            medium_weight: 2,
            high_weight: 3,
        };
        assert_eq!(a.to_dword(), 0x0302_0107);
        let p = PowerManagement {
            power_state: 0x1F,
            workload_hint: 0x5,
        };
        assert_eq!(p.to_dword(), 0xBF);
        assert_eq!(PowerManagement::from_dword(0xBF), p);
        assert_eq!(VolatileWriteCache { enabled: true }.to_dword(), 1);
        let e = AsyncEventConfig {
            namespace_attribute: true,
            discovery_log_change: true,
            smart_critical_warnings: 0x1F,
            ..Default::default()
        };
        assert_eq!(e.to_dword(), 0x8000_011F);
        assert_eq!(AsyncEventConfig::from_dword(0x8000_011F), e);
        assert_eq!(KeepAliveTimer::from_dword(15000).kato_ms, 15000);
    }

    #[test]
    fn feature_dispatch() {
        let f = Feature::decode(FeatureId::KeepAliveTimer, 5000).unwrap();
        assert_eq!(f, Feature::KeepAliveTimer(KeepAliveTimer { kato_ms: 5000 }));
        assert_eq!(f.fid(), FeatureId::KeepAliveTimer);
        assert_eq!(f.to_dword(), 5000);
        assert!(Feature::decode(FeatureId::Timestamp, 0).is_err());
    }
}
