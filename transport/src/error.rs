//! Typed errors of the transport layer, and [`one_line`], how the binaries print any error.

use std::net::SocketAddr;

use crate::types::{GidEntry, QpState};

pub type Result<T, E = TransportError> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// A verbs / rdmacm call failed with an errno.
    #[error("{op} failed: {source}")]
    Os {
        op: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("no RDMA device named {0:?}")]
    NoDevice(String),
    #[error("{0} is not supported by this provider or device")]
    Unsupported(&'static str),
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// Objects of two providers (or two devices) mixed in one call.
    #[error("objects from different providers or devices cannot be combined: {0}")]
    Mismatch(&'static str),
    /// A device limit (max_qp, max_qp_wr, max_cqe, ...) would be exceeded.
    #[error("{what} limit exceeded: asked {asked}, device max {max}")]
    Limit {
        what: &'static str,
        asked: u64,
        max: u64,
    },
    /// The completion queue overran (more completions than its depth were due): completions
    /// were lost and the CQ is unusable, as on hardware (CQ_ERR was raised).
    #[error("completion queue {cq_id} overran: completions were lost")]
    CqOverrun { cq_id: u32 },
    /// A work queue has no room for the posted work request.
    #[error("{0} queue full")]
    QueueFull(&'static str),
    #[error("{op} not allowed in QP state {state:?}")]
    BadQpState { op: &'static str, state: QpState },
    /// A copy in or out of a memory region reaches outside it.
    #[error("range {offset}+{len} is outside a memory region of {size} bytes")]
    OutOfBounds {
        offset: usize,
        len: usize,
        size: usize,
    },
    /// An SGE names an lkey that does not exist, or memory outside its region.
    #[error("local protection error: lkey {lkey:#x} does not cover {addr:#x}+{len}")]
    LocalProtection { lkey: u32, addr: u64, len: u32 },
    /// No GID on the device matches the address: the classic wrong-GID-index mistake.
    #[error("{}", no_gid_message(*.ip, .candidates))]
    NoGidForAddress {
        ip: std::net::IpAddr,
        candidates: Vec<GidEntry>,
    },
    #[error("no RDMA device serves address {0}")]
    AddressNotServed(SocketAddr),
    #[error("{0} timed out")]
    Timeout(&'static str),
    #[error("connection manager: {0}")]
    Cm(String),
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
}

impl TransportError {
    /// The error for a failed libc-style call: errno taken from the OS.
    pub fn last_os(op: &'static str) -> Self {
        TransportError::Os {
            op,
            source: std::io::Error::last_os_error(),
        }
    }
    /// The error for a call that returns the errno itself (ibv_post_send, ibv_modify_qp, ...).
    pub fn from_errno(op: &'static str, errno: i32) -> Self {
        TransportError::Os {
            op,
            source: std::io::Error::from_raw_os_error(errno),
        }
    }
}

fn no_gid_message(ip: std::net::IpAddr, candidates: &[GidEntry]) -> String {
    let mut s = format!("no RoCE v2 GID matches {ip}; the GID table has:");
    if candidates.is_empty() {
        s.push_str(" nothing");
    }
    for e in candidates {
        s.push_str(&format!(
            "\n  index {}: {} ({:?}",
            e.index, e.gid, e.gid_type
        ));
        if let Some(v4) = e.gid.to_ipv4() {
            s.push_str(&format!(", {v4}"));
        }
        s.push(')');
    }
    s
}

/// A post that failed part way: WRs before `failed_index` were posted.
#[derive(Debug, thiserror::Error)]
#[error("post failed at work request {failed_index}: {error}")]
pub struct PostError {
    pub failed_index: usize,
    #[source]
    pub error: TransportError,
}

/// An error and its causes as one line, a cause left out when the text before it already
/// holds it: this workspace's errors name their source in their own message as well as
/// returning it from `source()` (a log line of the error alone says everything), so a plain
/// walk of the chain said the OS error twice. The binaries' last word on a failure.
pub fn one_line(e: &(dyn std::error::Error + 'static)) -> String {
    let mut line = String::new();
    let mut cause = Some(e);
    while let Some(c) = cause {
        let text = c.to_string();
        if !line.contains(&text) {
            if !line.is_empty() {
                line.push_str(": ");
            }
            line.push_str(&text);
        }
        cause = c.source();
    }
    line
}

#[cfg(test)]
mod one_line_tests {
    use super::*;

    #[test]
    fn a_cause_its_parent_names_is_said_once() {
        let os = std::io::Error::from_raw_os_error(19);
        let os_text = os.to_string();
        let e = TransportError::Os {
            op: "rdma_create_event_channel",
            source: os,
        };
        let line = one_line(&e);
        assert_eq!(line.matches(&os_text).count(), 1, "{line}");
        assert!(
            line.starts_with("rdma_create_event_channel failed: "),
            "{line}"
        );
    }

    /// A parent that does not name its cause (anyhow's context) is followed by it.
    #[test]
    fn causes_not_named_are_joined() {
        #[derive(Debug, thiserror::Error)]
        #[error("write /x/y")]
        struct Context(#[source] std::io::Error);
        let e = Context(std::io::Error::other("No such file or directory"));
        assert_eq!(one_line(&e), "write /x/y: No such file or directory");
    }
}
