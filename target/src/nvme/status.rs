//! The NVMe statuses the target answers with, by name, and the mapping from block-device
//! results. One place, so a status code is never spelled twice.

use nvmf_protocol::Status;
use nvmf_protocol::status::{CommandSpecificStatus, FabricsStatus, GenericStatus, MediaStatus};

use crate::bdev::IoStatus;

/// Invalid Command Opcode (DNR).
pub const INVALID_OPCODE: Status = Status::generic(GenericStatus::InvalidOpcode).with_dnr();
/// Invalid Field in Command (DNR).
pub const INVALID_FIELD: Status = Status::generic(GenericStatus::InvalidField).with_dnr();
/// Command Sequence Error (DNR).
pub const SEQUENCE_ERROR: Status = Status::generic(GenericStatus::CommandSequenceError).with_dnr();
/// Invalid Namespace or Format (DNR).
pub const INVALID_NAMESPACE: Status =
    Status::generic(GenericStatus::InvalidNamespaceOrFormat).with_dnr();
/// LBA Out of Range (DNR).
pub const LBA_OUT_OF_RANGE: Status = Status::generic(GenericStatus::LbaOutOfRange).with_dnr();
/// Data SGL Length Invalid (DNR).
pub const SGL_LENGTH_INVALID: Status =
    Status::generic(GenericStatus::DataSglLengthInvalid).with_dnr();
/// Internal Error.
pub const INTERNAL_ERROR: Status = Status::generic(GenericStatus::InternalError);
/// Invalid Log Page (DNR).
pub const INVALID_LOG_PAGE: Status =
    Status::command_specific(CommandSpecificStatus::InvalidLogPage).with_dnr();
/// Feature Identifier Not Saveable (DNR).
pub const FEATURE_NOT_SAVEABLE: Status =
    Status::command_specific(CommandSpecificStatus::FeatureNotSaveable).with_dnr();
/// Asynchronous Event Request Limit Exceeded (DNR).
pub const AER_LIMIT_EXCEEDED: Status =
    Status::command_specific(CommandSpecificStatus::AsyncEventRequestLimitExceeded).with_dnr();
/// Abort Command Limit Exceeded (more Aborts outstanding than ACL + 1; DNR, as nvmet sets it
/// on its command-specific statuses).
pub const ABORT_LIMIT_EXCEEDED: Status =
    Status::command_specific(CommandSpecificStatus::AbortCommandLimitExceeded).with_dnr();
/// Compare Failure.
pub const COMPARE_FAILURE: Status = Status::new(nvmf_protocol::StatusCode::Media(
    MediaStatus::CompareFailure,
))
.with_dnr();
/// Capacity Exceeded: the device is full (ENOSPC from a file namespace), as nvmet answers it;
/// DNR, so the host does not retry into a full file system.
pub const CAPACITY_EXCEEDED: Status = Status::generic(GenericStatus::CapacityExceeded).with_dnr();
/// Command Abort Requested (the victim of an Abort command).
pub const ABORTED_BY_REQUEST: Status = Status::generic(GenericStatus::AbortRequested);
/// Command Aborted due to SQ Deletion (outstanding AERs when the controller goes away).
pub const ABORTED_SQ_DELETION: Status = Status::generic(GenericStatus::AbortedSqDeletion);

/// Connect: Incompatible Format.
pub const CONNECT_INCOMPATIBLE_FORMAT: Status =
    Status::fabrics(FabricsStatus::IncompatibleFormat).with_dnr();
/// Connect: Invalid Parameters (DW0 carries IPO/IATTR).
pub const CONNECT_INVALID_PARAMETERS: Status =
    Status::fabrics(FabricsStatus::InvalidParameters).with_dnr();
/// Connect: Invalid Host.
pub const CONNECT_INVALID_HOST: Status = Status::fabrics(FabricsStatus::InvalidHost).with_dnr();
/// Connect: Controller Busy (no controller id left).
pub const CONNECT_CONTROLLER_BUSY: Status = Status::fabrics(FabricsStatus::ControllerBusy);
/// A Fabrics command on the wrong queue type.
pub const INVALID_QUEUE_TYPE: Status = Status::fabrics(FabricsStatus::InvalidQueueType).with_dnr();

/// What kind of command a block-device result belongs to (the media error differs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoKind {
    /// Read or Compare.
    Read,
    /// Write, Write Zeroes, Deallocate.
    Write,
    /// Flush.
    Flush,
}

/// The NVMe status of a block-device result.
pub fn from_io(status: IoStatus, kind: IoKind) -> Status {
    match status {
        IoStatus::Success => Status::SUCCESS,
        IoStatus::CompareMismatch => COMPARE_FAILURE,
        IoStatus::OutOfRange => LBA_OUT_OF_RANGE,
        IoStatus::ShortBuffer => SGL_LENGTH_INVALID,
        IoStatus::Failed(libc::ENOSPC) => CAPACITY_EXCEEDED,
        IoStatus::Failed(_) => match kind {
            IoKind::Read => Status::new(nvmf_protocol::StatusCode::Media(
                MediaStatus::UnrecoveredReadError,
            )),
            IoKind::Write => Status::new(nvmf_protocol::StatusCode::Media(MediaStatus::WriteFault)),
            IoKind::Flush => INTERNAL_ERROR,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A full device is Capacity Exceeded with DNR (as nvmet), whatever the command; other
    /// device errors are the command's media error, which the host may retry.
    #[test]
    fn device_errors_by_kind() {
        for kind in [IoKind::Read, IoKind::Write, IoKind::Flush] {
            assert_eq!(
                from_io(IoStatus::Failed(libc::ENOSPC), kind),
                CAPACITY_EXCEEDED
            );
        }
        assert!(from_io(IoStatus::Failed(libc::ENOSPC), IoKind::Write).dnr);
        let eio = |kind| from_io(IoStatus::Failed(libc::EIO), kind);
        assert_eq!(
            eio(IoKind::Write).code,
            nvmf_protocol::StatusCode::Media(MediaStatus::WriteFault)
        );
        assert_eq!(
            eio(IoKind::Read).code,
            nvmf_protocol::StatusCode::Media(MediaStatus::UnrecoveredReadError)
        );
        assert!(!eio(IoKind::Write).dnr);
    }
}
