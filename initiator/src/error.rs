//! The initiator's typed errors: NVMe statuses (typed by nvmf-protocol), connection loss,
//! timeouts, and misuse.

use std::time::Duration;

use nvmf_protocol::{ProtocolError, Status};

use crate::queue::{ConnectError, QueueError};

/// Everything the initiator library can fail with.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Error {
    /// The controller completed the command with an error status.
    #[error("{command}: {}", describe_status(.status))]
    Nvme {
        /// Command name.
        command: &'static str,
        /// Completion status, typed.
        status: Status,
    },
    /// The connection dropped; the command may or may not have executed.
    #[error("connection lost: {0}")]
    ConnectionLost(String),
    /// The controller is reconnecting and the policy says fail rather than wait.
    #[error("controller reconnecting; request failed by policy")]
    Reconnecting,
    /// The controller is gone for good (loss timeout passed or reconnect disabled).
    #[error("controller failed: {0}")]
    ControllerFailed(String),
    /// Something did not happen in time.
    #[error("{what}: timed out after {after:?}")]
    Timeout {
        /// What was awaited.
        what: &'static str,
        /// How long.
        after: Duration,
    },
    /// Connecting a queue failed.
    #[error("connect queue {qid}: {source}")]
    Connect {
        /// Queue id.
        qid: u16,
        /// Why.
        source: ConnectError,
    },
    /// The queue has no free command slot.
    #[error("queue full")]
    QueueFull,
    /// Bytes from the target did not parse.
    #[error("malformed data from the target: {0}")]
    Protocol(#[from] ProtocolError),
    /// The target answered with something the initiator cannot use.
    #[error("target: {0}")]
    Target(String),
    /// A caller's argument is out of range.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
}

impl From<QueueError> for Error {
    fn from(e: QueueError) -> Self {
        match e {
            QueueError::Disconnected(why) => Self::ConnectionLost(why),
            QueueError::Full => Self::QueueFull,
            QueueError::Invalid(why) => Self::InvalidArgument(why),
        }
    }
}

impl Error {
    /// The NVMe status, if the controller answered with one.
    pub fn status(&self) -> Option<Status> {
        match self {
            Self::Nvme { status, .. } => Some(*status),
            _ => None,
        }
    }
    /// True when the error means the connection is (or was) down.
    pub fn is_connection_loss(&self) -> bool {
        matches!(
            self,
            Self::ConnectionLost(_) | Self::Reconnecting | Self::ControllerFailed(_)
        )
    }
}

/// Human form of a status: "SCT 0x0 SC 0x80 (Generic(LbaOutOfRange)) DNR".
pub fn describe_status(s: &Status) -> String {
    format!(
        "NVMe status SCT {:#x} SC {:#04x} ({:?}){}",
        s.code.sct(),
        s.code.sc(),
        s.code,
        if s.dnr { " DNR" } else { "" }
    )
}

/// Result alias.
pub type Result<T> = std::result::Result<T, Error>;

#[cfg(test)]
mod tests {
    use super::*;
    use nvmf_protocol::status::GenericStatus;

    #[test]
    fn nvme_errors_name_the_status() {
        let e = Error::Nvme {
            command: "Read",
            status: Status::generic(GenericStatus::LbaOutOfRange).with_dnr(),
        };
        let text = e.to_string();
        assert!(
            text.starts_with("Read: NVMe status SCT 0x0 SC 0x80"),
            "{text}"
        );
        assert!(
            text.contains("LbaOutOfRange") && text.ends_with("DNR"),
            "{text}"
        );
        assert!(e.status().is_some());
        assert!(!e.is_connection_loss());
        assert!(Error::from(QueueError::Disconnected("x".into())).is_connection_loss());
    }
}
