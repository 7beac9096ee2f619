//! Completion status: Status Code Type, Status Code, More and Do Not Retry.
//!
//! The status field sits in CQE bytes 14..16: bit 0 phase (owned by [`crate::cqe::Cqe`]),
//! bits 8:1 SC, bits 11:9 SCT, bits 13:12 CRD, bit 14 More, bit 15 DNR.
//!
//! Command-specific codes 0x80..=0xBF mean different things for Fabrics commands (Connect
//! etc.) and for NVM I/O commands, so decoding takes a [`StatusContext`].

use crate::bytes::wire_enum;

/// Status Code Type values (SCT, 3 bits).
pub mod sct {
    /// Generic Command Status.
    pub const GENERIC: u8 = 0;
    /// Command Specific Status.
    pub const COMMAND_SPECIFIC: u8 = 1;
    /// Media and Data Integrity Errors.
    pub const MEDIA: u8 = 2;
    /// Path Related Status.
    pub const PATH: u8 = 3;
    /// Vendor Specific.
    pub const VENDOR: u8 = 7;
}

wire_enum! {
    /// Generic command status (SCT 0), including the NVM command set values 0x80..=0x84.
    pub enum GenericStatus: u8 {
        /// Successful Completion.
        Success = 0x00,
        /// Invalid Command Opcode.
        InvalidOpcode = 0x01,
        /// Invalid Field in Command.
        InvalidField = 0x02,
        /// Command ID Conflict.
        CommandIdConflict = 0x03,
        /// Data Transfer Error.
        DataTransferError = 0x04,
        /// Commands Aborted due to Power Loss Notification.
        AbortedPowerLoss = 0x05,
        /// Internal Error.
        InternalError = 0x06,
        /// Command Abort Requested.
        AbortRequested = 0x07,
        /// Command Aborted due to SQ Deletion.
        AbortedSqDeletion = 0x08,
        /// Command Aborted due to Failed Fused Command.
        AbortedFailedFused = 0x09,
        /// Command Aborted due to Missing Fused Command.
        AbortedMissingFused = 0x0A,
        /// Invalid Namespace or Format.
        InvalidNamespaceOrFormat = 0x0B,
        /// Command Sequence Error.
        CommandSequenceError = 0x0C,
        /// Invalid SGL Segment Descriptor.
        InvalidSglSegmentDescriptor = 0x0D,
        /// Invalid Number of SGL Descriptors.
        InvalidSglDescriptorCount = 0x0E,
        /// Data SGL Length Invalid.
        DataSglLengthInvalid = 0x0F,
        /// Metadata SGL Length Invalid.
        MetadataSglLengthInvalid = 0x10,
        /// SGL Descriptor Type Invalid.
        SglDescriptorTypeInvalid = 0x11,
        /// Invalid Use of Controller Memory Buffer.
        InvalidCmbUse = 0x12,
        /// PRP Offset Invalid.
        PrpOffsetInvalid = 0x13,
        /// Atomic Write Unit Exceeded.
        AtomicWriteUnitExceeded = 0x14,
        /// Operation Denied.
        OperationDenied = 0x15,
        /// SGL Offset Invalid.
        SglOffsetInvalid = 0x16,
        /// Host Identifier Inconsistent Format.
        HostIdInconsistentFormat = 0x18,
        /// Keep Alive Timer Expired.
        KeepAliveTimerExpired = 0x19,
        /// Keep Alive Timeout Invalid.
        KeepAliveTimeoutInvalid = 0x1A,
        /// Command Aborted due to Preempt and Abort.
        AbortedPreemptAndAbort = 0x1B,
        /// Sanitize Failed.
        SanitizeFailed = 0x1C,
        /// Sanitize In Progress.
        SanitizeInProgress = 0x1D,
        /// SGL Data Block Granularity Invalid.
        SglDataBlockGranularityInvalid = 0x1E,
        /// Command Not Supported for Queue in CMB.
        CommandNotSupportedForQueueInCmb = 0x1F,
        /// Namespace is Write Protected.
        NamespaceWriteProtected = 0x20,
        /// Command Interrupted.
        CommandInterrupted = 0x21,
        /// Transient Transport Error.
        TransientTransportError = 0x22,
        /// Command Prohibited by Command and Feature Lockdown.
        ProhibitedByLockdown = 0x23,
        /// Admin Command Media Not Ready.
        AdminCommandMediaNotReady = 0x24,
        /// LBA Out of Range (NVM command set).
        LbaOutOfRange = 0x80,
        /// Capacity Exceeded (NVM command set).
        CapacityExceeded = 0x81,
        /// Namespace Not Ready (NVM command set).
        NamespaceNotReady = 0x82,
        /// Reservation Conflict (NVM command set).
        ReservationConflict = 0x83,
        /// Format In Progress (NVM command set).
        FormatInProgress = 0x84,
    }
}

wire_enum! {
    /// Command specific status (SCT 1) for admin commands (0x00..=0x7F) and NVM I/O commands
    /// (0x80..=0xBF). Fabrics commands use [`FabricsStatus`] for 0x80 and up.
    pub enum CommandSpecificStatus: u8 {
        /// Completion Queue Invalid.
        CompletionQueueInvalid = 0x00,
        /// Invalid Queue Identifier.
        InvalidQueueIdentifier = 0x01,
        /// Invalid Queue Size.
        InvalidQueueSize = 0x02,
        /// Abort Command Limit Exceeded.
        AbortCommandLimitExceeded = 0x03,
        /// Asynchronous Event Request Limit Exceeded.
        AsyncEventRequestLimitExceeded = 0x05,
        /// Invalid Firmware Slot.
        InvalidFirmwareSlot = 0x06,
        /// Invalid Firmware Image.
        InvalidFirmwareImage = 0x07,
        /// Invalid Interrupt Vector.
        InvalidInterruptVector = 0x08,
        /// Invalid Log Page.
        InvalidLogPage = 0x09,
        /// Invalid Format.
        InvalidFormat = 0x0A,
        /// Firmware Activation Requires Conventional Reset.
        FirmwareActivationRequiresConventionalReset = 0x0B,
        /// Invalid Queue Deletion.
        InvalidQueueDeletion = 0x0C,
        /// Feature Identifier Not Saveable.
        FeatureNotSaveable = 0x0D,
        /// Feature Not Changeable.
        FeatureNotChangeable = 0x0E,
        /// Feature Not Namespace Specific.
        FeatureNotNamespaceSpecific = 0x0F,
        /// Firmware Activation Requires NVM Subsystem Reset.
        FirmwareActivationRequiresSubsystemReset = 0x10,
        /// Firmware Activation Requires Controller Level Reset.
        FirmwareActivationRequiresReset = 0x11,
        /// Firmware Activation Requires Maximum Time Violation.
        FirmwareActivationRequiresMaxTimeViolation = 0x12,
        /// Firmware Activation Prohibited.
        FirmwareActivationProhibited = 0x13,
        /// Overlapping Range.
        OverlappingRange = 0x14,
        /// Namespace Insufficient Capacity.
        NamespaceInsufficientCapacity = 0x15,
        /// Namespace Identifier Unavailable.
        NamespaceIdentifierUnavailable = 0x16,
        /// Namespace Already Attached.
        NamespaceAlreadyAttached = 0x18,
        /// Namespace Is Private.
        NamespaceIsPrivate = 0x19,
        /// Namespace Not Attached.
        NamespaceNotAttached = 0x1A,
        /// Thin Provisioning Not Supported.
        ThinProvisioningNotSupported = 0x1B,
        /// Controller List Invalid.
        ControllerListInvalid = 0x1C,
        /// Device Self-test In Progress.
        DeviceSelfTestInProgress = 0x1D,
        /// Boot Partition Write Prohibited.
        BootPartitionWriteProhibited = 0x1E,
        /// Invalid Controller Identifier.
        InvalidControllerIdentifier = 0x1F,
        /// Invalid Secondary Controller State.
        InvalidSecondaryControllerState = 0x20,
        /// Invalid Number of Controller Resources.
        InvalidControllerResources = 0x21,
        /// Invalid Resource Identifier.
        InvalidResourceIdentifier = 0x22,
        /// Sanitize Prohibited While Persistent Memory Region is Enabled.
        SanitizeProhibitedWithPmr = 0x23,
        /// ANA Group Identifier Invalid.
        AnaGroupIdentifierInvalid = 0x24,
        /// ANA Attach Failed.
        AnaAttachFailed = 0x25,
        /// Insufficient Capacity.
        InsufficientCapacity = 0x26,
        /// Namespace Attachment Limit Exceeded.
        NamespaceAttachmentLimitExceeded = 0x27,
        /// Prohibition of Command Execution Not Supported.
        ProhibitionNotSupported = 0x28,
        /// I/O Command Set Not Supported.
        IoCommandSetNotSupported = 0x29,
        /// I/O Command Set Not Enabled.
        IoCommandSetNotEnabled = 0x2A,
        /// I/O Command Set Combination Rejected.
        IoCommandSetCombinationRejected = 0x2B,
        /// Invalid I/O Command Set.
        InvalidIoCommandSet = 0x2C,
        /// Identifier Unavailable.
        IdentifierUnavailable = 0x2D,
        /// Conflicting Attributes (NVM: Dataset Management, Read, Write).
        ConflictingAttributes = 0x80,
        /// Invalid Protection Information.
        InvalidProtectionInformation = 0x81,
        /// Attempted Write to Read Only Range.
        WriteToReadOnlyRange = 0x82,
        /// Command Size Limit Exceeded.
        CommandSizeLimitExceeded = 0x83,
        /// Zoned Boundary Error.
        ZoneBoundaryError = 0xB8,
        /// Zone Is Full.
        ZoneIsFull = 0xB9,
        /// Zone Is Read Only.
        ZoneIsReadOnly = 0xBA,
        /// Zone Is Offline.
        ZoneIsOffline = 0xBB,
        /// Zone Invalid Write.
        ZoneInvalidWrite = 0xBC,
        /// Too Many Active Zones.
        TooManyActiveZones = 0xBD,
        /// Too Many Open Zones.
        TooManyOpenZones = 0xBE,
        /// Invalid Zone State Transition.
        InvalidZoneStateTransition = 0xBF,
    }
}

wire_enum! {
    /// Command specific status (SCT 1, 0x80 and up) of Fabrics commands.
    pub enum FabricsStatus: u8 {
        /// Connect: Incompatible Format (RECFMT not supported).
        IncompatibleFormat = 0x80,
        /// Connect: Controller Busy.
        ControllerBusy = 0x81,
        /// Connect: Invalid Parameters (CQE DW0 carries IPO/IATTR).
        InvalidParameters = 0x82,
        /// Connect: Restart Discovery.
        RestartDiscovery = 0x83,
        /// Connect: Invalid Host.
        InvalidHost = 0x84,
        /// Invalid Queue Type (command sent on the wrong queue type).
        InvalidQueueType = 0x85,
        /// Get Log Page (discovery): Discover Restart.
        DiscoverRestart = 0x90,
        /// Authentication Required.
        AuthenticationRequired = 0x91,
    }
}

wire_enum! {
    /// Media and data integrity errors (SCT 2).
    pub enum MediaStatus: u8 {
        /// Write Fault.
        WriteFault = 0x80,
        /// Unrecovered Read Error.
        UnrecoveredReadError = 0x81,
        /// End-to-end Guard Check Error.
        GuardCheckError = 0x82,
        /// End-to-end Application Tag Check Error.
        ApplicationTagCheckError = 0x83,
        /// End-to-end Reference Tag Check Error.
        ReferenceTagCheckError = 0x84,
        /// Compare Failure.
        CompareFailure = 0x85,
        /// Access Denied.
        AccessDenied = 0x86,
        /// Deallocated or Unwritten Logical Block.
        DeallocatedOrUnwrittenBlock = 0x87,
        /// End-to-End Storage Tag Check Error.
        StorageTagCheckError = 0x88,
    }
}

wire_enum! {
    /// Path related status (SCT 3).
    pub enum PathStatus: u8 {
        /// Internal Path Error.
        InternalPathError = 0x00,
        /// Asymmetric Access Persistent Loss.
        AsymmetricAccessPersistentLoss = 0x01,
        /// Asymmetric Access Inaccessible.
        AsymmetricAccessInaccessible = 0x02,
        /// Asymmetric Access Transition.
        AsymmetricAccessTransition = 0x03,
        /// Controller Pathing Error.
        ControllerPathingError = 0x60,
        /// Host Pathing Error.
        HostPathingError = 0x70,
        /// Command Aborted By Host.
        CommandAbortedByHost = 0x71,
    }
}

/// How to read command-specific codes 0x80..=0xBF.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum StatusContext {
    /// Admin and NVM I/O commands.
    #[default]
    Nvm,
    /// Fabrics commands (opcode 0x7F): SCT 1 values >= 0x80 are [`FabricsStatus`].
    Fabrics,
}

/// Status Code Type plus Status Code, typed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StatusCode {
    /// SCT 0.
    Generic(GenericStatus),
    /// SCT 1, admin or NVM I/O command.
    CommandSpecific(CommandSpecificStatus),
    /// SCT 1, Fabrics command, SC >= 0x80.
    Fabrics(FabricsStatus),
    /// SCT 2.
    Media(MediaStatus),
    /// SCT 3.
    Path(PathStatus),
    /// SCT 7: vendor specific SC.
    Vendor(u8),
    /// SCT 4..=6 (reserved); kept raw so nothing is lost.
    Reserved {
        /// Status code type (4, 5 or 6).
        sct: u8,
        /// Status code.
        sc: u8,
    },
}

impl StatusCode {
    /// Build from raw SCT (3 bits) and SC.
    pub const fn from_parts(sct_v: u8, sc: u8, ctx: StatusContext) -> Self {
        match sct_v & 7 {
            sct::GENERIC => Self::Generic(GenericStatus::from_raw(sc)),
            sct::COMMAND_SPECIFIC => match ctx {
                StatusContext::Fabrics if sc >= 0x80 => Self::Fabrics(FabricsStatus::from_raw(sc)),
                _ => Self::CommandSpecific(CommandSpecificStatus::from_raw(sc)),
            },
            sct::MEDIA => Self::Media(MediaStatus::from_raw(sc)),
            sct::PATH => Self::Path(PathStatus::from_raw(sc)),
            sct::VENDOR => Self::Vendor(sc),
            other => Self::Reserved { sct: other, sc },
        }
    }

    /// Status Code Type (3 bits).
    pub const fn sct(self) -> u8 {
        match self {
            Self::Generic(_) => sct::GENERIC,
            Self::CommandSpecific(_) | Self::Fabrics(_) => sct::COMMAND_SPECIFIC,
            Self::Media(_) => sct::MEDIA,
            Self::Path(_) => sct::PATH,
            Self::Vendor(_) => sct::VENDOR,
            Self::Reserved { sct, .. } => sct & 7,
        }
    }

    /// Status Code.
    pub const fn sc(self) -> u8 {
        match self {
            Self::Generic(c) => c.raw(),
            Self::CommandSpecific(c) => c.raw(),
            Self::Fabrics(c) => c.raw(),
            Self::Media(c) => c.raw(),
            Self::Path(c) => c.raw(),
            Self::Vendor(c) => c,
            Self::Reserved { sc, .. } => sc,
        }
    }

    /// The context this code decodes back to itself in.
    pub const fn context(self) -> StatusContext {
        match self {
            Self::Fabrics(_) => StatusContext::Fabrics,
            _ => StatusContext::Nvm,
        }
    }
}

/// A completion status without the phase tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Status {
    /// SCT and SC.
    pub code: StatusCode,
    /// Command Retry Delay selector (2 bits, index into CRDT1..3; 0 = retry at once).
    pub crd: u8,
    /// More: further information in the Error Information log page.
    pub more: bool,
    /// Do Not Retry.
    pub dnr: bool,
}

impl Status {
    /// Successful Completion.
    pub const SUCCESS: Self = Self::new(StatusCode::Generic(GenericStatus::Success));

    /// A status with CRD, More and DNR clear.
    pub const fn new(code: StatusCode) -> Self {
        Self {
            code,
            crd: 0,
            more: false,
            dnr: false,
        }
    }
    /// A generic status.
    pub const fn generic(c: GenericStatus) -> Self {
        Self::new(StatusCode::Generic(c))
    }
    /// A command specific (admin/NVM) status.
    pub const fn command_specific(c: CommandSpecificStatus) -> Self {
        Self::new(StatusCode::CommandSpecific(c))
    }
    /// A Fabrics command status.
    pub const fn fabrics(c: FabricsStatus) -> Self {
        Self::new(StatusCode::Fabrics(c))
    }
    /// The same status with DNR set.
    pub const fn with_dnr(mut self) -> Self {
        self.dnr = true;
        self
    }

    /// True for Successful Completion.
    pub const fn is_success(&self) -> bool {
        matches!(self.code, StatusCode::Generic(GenericStatus::Success))
    }

    /// The 16-bit status field as it sits in CQE bytes 14..16, with the phase bit clear.
    pub const fn to_field(&self) -> u16 {
        ((self.code.sc() as u16) << 1)
            | (((self.code.sct() & 7) as u16) << 9)
            | (((self.crd & 3) as u16) << 12)
            | ((self.more as u16) << 14)
            | ((self.dnr as u16) << 15)
    }

    /// Decode a 16-bit status field; bit 0 (phase) is ignored.
    pub const fn from_field(raw: u16, ctx: StatusContext) -> Self {
        // Almost every completion succeeds: all bits but the phase tag clear, in any context.
        if raw & !1 == 0 {
            return Self::SUCCESS;
        }
        Self {
            code: StatusCode::from_parts(((raw >> 9) & 7) as u8, (raw >> 1) as u8, ctx),
            crd: ((raw >> 12) & 3) as u8,
            more: (raw >> 14) & 1 == 1,
            dnr: (raw >> 15) & 1 == 1,
        }
    }

    /// Re-read this status as the completion of a command in `ctx` (lossless: the raw bits are
    /// the same).
    pub const fn in_context(self, ctx: StatusContext) -> Self {
        Self::from_field(self.to_field(), ctx)
    }
}

impl Default for Status {
    fn default() -> Self {
        Self::SUCCESS
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_bit_positions() {
        // SC bits 8:1, SCT bits 11:9, CRD 13:12, More 14, DNR 15.
        let s = Status {
            code: StatusCode::CommandSpecific(CommandSpecificStatus::InvalidLogPage),
            crd: 2,
            more: true,
            dnr: true,
        };
        assert_eq!(
            s.to_field(),
            (0x09 << 1) | (1 << 9) | (2 << 12) | (1 << 14) | (1 << 15)
        );
        assert_eq!(Status::from_field(s.to_field() | 1, StatusContext::Nvm), s);
        assert_eq!(Status::SUCCESS.to_field(), 0);
        assert!(Status::from_field(0x0001, StatusContext::Nvm).is_success());
    }

    #[test]
    fn generic_values() {
        assert_eq!(GenericStatus::InvalidField.raw(), 0x02);
        assert_eq!(GenericStatus::SglOffsetInvalid.raw(), 0x16);
        assert_eq!(GenericStatus::KeepAliveTimerExpired.raw(), 0x19);
        assert_eq!(GenericStatus::TransientTransportError.raw(), 0x22);
        assert_eq!(GenericStatus::LbaOutOfRange.raw(), 0x80);
        assert_eq!(GenericStatus::from_raw(0x17), GenericStatus::Unknown(0x17));
        let s = Status::generic(GenericStatus::LbaOutOfRange).with_dnr();
        assert_eq!(s.to_field(), 0x8000 | (0x80 << 1));
    }

    #[test]
    fn fabrics_connect_codes_need_context() {
        // Linux's NVME_SC_CONNECT_INVALID_PARAM is 0x182: SCT 1, SC 0x82.
        let s = Status::fabrics(FabricsStatus::InvalidParameters);
        let f = s.to_field();
        assert_eq!(f >> 1, 0x182);
        assert_eq!(Status::from_field(f, StatusContext::Fabrics), s);
        assert_eq!(
            Status::from_field(f, StatusContext::Nvm).code,
            StatusCode::CommandSpecific(CommandSpecificStatus::WriteToReadOnlyRange)
        );
        assert_eq!(
            Status::from_field(f, StatusContext::Nvm).in_context(StatusContext::Fabrics),
            s
        );
        for (c, v) in [
            (FabricsStatus::IncompatibleFormat, 0x80),
            (FabricsStatus::ControllerBusy, 0x81),
            (FabricsStatus::RestartDiscovery, 0x83),
            (FabricsStatus::InvalidHost, 0x84),
        ] {
            assert_eq!(c.raw(), v);
        }
        // Below 0x80 SCT 1 stays admin command specific even for Fabrics context.
        assert_eq!(
            Status::from_field(1 << 9 | 0x02 << 1, StatusContext::Fabrics).code,
            StatusCode::CommandSpecific(CommandSpecificStatus::InvalidQueueSize)
        );
    }

    #[test]
    fn media_path_vendor_reserved() {
        let m = Status::from_field((2 << 9) | (0x81 << 1), StatusContext::Nvm);
        assert_eq!(m.code, StatusCode::Media(MediaStatus::UnrecoveredReadError));
        let p = Status::from_field((3 << 9) | (0x03 << 1), StatusContext::Nvm);
        assert_eq!(
            p.code,
            StatusCode::Path(PathStatus::AsymmetricAccessTransition)
        );
        let v = Status::from_field((7 << 9) | (0xAB << 1), StatusContext::Nvm);
        assert_eq!(v.code, StatusCode::Vendor(0xAB));
        let r = Status::from_field((5 << 9) | (0x11 << 1), StatusContext::Nvm);
        assert_eq!(r.code, StatusCode::Reserved { sct: 5, sc: 0x11 });
        assert_eq!(r.to_field(), (5 << 9) | (0x11 << 1));
    }

    #[test]
    fn the_success_shortcut_decodes_as_the_full_decode() {
        for raw in [0u16, 1] {
            for ctx in [StatusContext::Nvm, StatusContext::Fabrics] {
                let full = Status {
                    code: StatusCode::from_parts(0, 0, ctx),
                    crd: 0,
                    more: false,
                    dnr: false,
                };
                assert_eq!(Status::from_field(raw, ctx), full);
            }
        }
        // Any other bit leaves the shortcut.
        for bit in 1..16 {
            assert_ne!(
                Status::from_field(1 << bit, StatusContext::Nvm),
                Status::SUCCESS
            );
        }
    }

    #[test]
    fn every_raw_field_round_trips() {
        for raw in (0u16..=u16::MAX).step_by(2) {
            for ctx in [StatusContext::Nvm, StatusContext::Fabrics] {
                assert_eq!(Status::from_field(raw, ctx).to_field(), raw);
            }
        }
    }
}
