//! The narrow interface between the initiator and a transport: what the host needs from one
//! connected NVMe-oF queue ([`HostQueue`]) and from whatever connects queues ([`Fabric`]).
//!
//! Everything above this file (bring-up, I/O, block API, tools) is written against these two
//! traits only; the RDMA glue (host poll group) and the in-memory loopback
//! ([`crate::loopback`]) implement them.
//!
//! Data model: each queue owns one registered data region sized at connect time. The initiator
//! carves it into per-command slots itself (no allocation per I/O). A command's data travels
//! either inside the capsule (the queue sends `region[range]` right after the SQE) or by keyed
//! SGL: the initiator writes a keyed data block descriptor naming `region.address + offset`
//! and `region.key`, and the target reads or writes that memory directly.

use std::ops::Range;

use nvmf_protocol::Cqe;
use nvmf_protocol::Sqe;

/// Where a controller is reached. Transport neutral: the glue interprets it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TransportAddress {
    /// Transport name: "rdma", "soft", "soft-tcp", "loopback", ...
    pub transport: String,
    /// Address (IP or host name; for loopback any label).
    pub address: String,
    /// Service id (port), "4420" by default.
    pub service: String,
}

impl TransportAddress {
    /// Address for the in-memory loopback fabric.
    pub fn loopback() -> Self {
        Self {
            transport: "loopback".into(),
            address: "local".into(),
            service: "4420".into(),
        }
    }
}

impl std::fmt::Display for TransportAddress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}:{}", self.transport, self.address, self.service)
    }
}

/// What connecting one queue needs (the RDMA CM private data plus host-side sizing).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueConnectParams {
    /// Target address.
    pub address: TransportAddress,
    /// Queue id: 0 = admin.
    pub qid: u16,
    /// Host receive queue size (HRQSIZE): responses the host can take at once.
    pub hrqsize: u16,
    /// Host send queue size, 0's based (HSQSIZE).
    pub hsqsize: u16,
    /// Controller id: 0xFFFF on the admin queue, the admin's CNTLID on I/O queues.
    pub cntlid: u16,
    /// Bytes of registered data region the queue must provide.
    pub data_region_len: usize,
    /// Largest in-capsule data the host will send (0 on the admin queue: the Linux host and this
    /// one send 64-byte admin capsules).
    pub in_capsule_data: usize,
}

/// The registered data region of a queue as the target sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataRegion {
    /// Remote virtual address of byte 0.
    pub address: u64,
    /// Remote key.
    pub key: u32,
    /// Length in bytes.
    pub len: usize,
}

/// Why a queue is no longer usable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QueueError {
    /// The connection is gone (peer disconnect, transport error, flush). Every command still
    /// in flight on this queue is lost; the initiator fails them.
    #[error("connection lost: {0}")]
    Disconnected(String),
    /// The queue cannot take another command now (send queue full).
    #[error("queue full")]
    Full,
    /// A submission was malformed (range outside the region, in-capsule data too large).
    #[error("invalid submission: {0}")]
    Invalid(String),
}

impl QueueError {
    /// A submission's in-capsule data `range` must lie in the queue's region (`region_len`
    /// bytes) and fit the in-capsule limit: the one check every [`HostQueue`] makes.
    pub(crate) fn check_in_capsule(
        range: &Range<usize>,
        region_len: usize,
        limit: usize,
    ) -> Result<(), QueueError> {
        if range.start > range.end || range.end > region_len {
            return Err(QueueError::Invalid(format!("in-capsule range {range:?}")));
        }
        if range.len() > limit {
            return Err(QueueError::Invalid(format!(
                "in-capsule data {} bytes > {limit}",
                range.len()
            )));
        }
        Ok(())
    }
}

/// Why connecting a queue failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConnectError {
    /// The target refused the connection (RDMA CM reject with an NVMe-oF status, or similar).
    #[error("rejected by the target: {0}")]
    Rejected(String),
    /// Nobody answered at that address.
    #[error("unreachable: {0}")]
    Unreachable(String),
    /// Local resources (memory registration, QP creation) failed.
    #[error("local resources: {0}")]
    Resources(String),
}

/// One connected NVMe-oF queue (an RDMA qpair after the CM handshake; Fabrics Connect is the
/// initiator's job and travels through [`HostQueue::submit`] like any command).
///
/// Contract the implementation keeps:
/// - `poll` reports a CQE only once the command is finished on the wire: its capsule SEND has
///   completed and its response arrived (so the region slot may be reused at once).
/// - After the connection is lost, `poll` and `submit` return
///   [`QueueError::Disconnected`]; the initiator then fails every command it had in flight on
///   this queue. The queue never reports a CQE for a command after reporting the loss.
/// - Only one thread (the owning reactor) uses a queue; it must be `Send` to move there.
/// - In-capsule data goes out in the same SEND as the SQE (a second SGE over the region needs
///   no copy); SGL1 then already says "data block, offset 0, length n".
/// - Over a CQ shared by several queues (the host poll group), polling one queue may reap
///   completions of others: keep them for their queue, never drop them (the RDMA glue keeps
///   them in each queue's side of the group).
pub trait HostQueue: Send {
    /// Queue id (0 = admin).
    fn qid(&self) -> u16;
    /// Depth the target granted (CRQSIZE from the CM accept): at most this many commands may be
    /// in flight.
    fn depth(&self) -> u16;
    /// The registered data region (address and key as the target sees them).
    fn region(&self) -> DataRegion;
    /// Host view of the data region.
    fn region_bytes(&self) -> &[u8];
    /// Host view of the data region, writable.
    fn region_bytes_mut(&mut self) -> &mut [u8];
    /// Send a command capsule: `sqe` (SGL1 already filled in) followed by `region[in_capsule]`
    /// as in-capsule data when given.
    fn submit(&mut self, sqe: &Sqe, in_capsule: Option<Range<usize>>) -> Result<(), QueueError>;
    /// Reap finished commands into `out`; returns how many were written. The host view of
    /// each one's data range holds what the target wrote there.
    fn poll(&mut self, out: &mut [Cqe]) -> Result<usize, QueueError>;
    /// As [`HostQueue::poll`], but the data the target wrote for a finished command may stay
    /// in the registered region until [`HostQueue::fetch`] brings it into the host view: a
    /// consumer that never reads the data pays no copy. The caller must fetch a range before
    /// anything it submits can reuse that range (the next command's data lands there); by
    /// default the same as `poll`.
    fn poll_lazy(&mut self, out: &mut [Cqe]) -> Result<usize, QueueError> {
        self.poll(out)
    }
    /// As [`HostQueue::submit`], but the command's outgoing data (keyed SGL or in-capsule) is
    /// whatever the registered region holds, not brought there from the host view: for a
    /// consumer to whom the bytes written do not matter (nvmf-perf without --verify), which
    /// then pays no copy. By default the same as `submit` (where the host view is the memory
    /// the target reads, the loopback, there is nothing to skip).
    fn submit_lazy(
        &mut self,
        sqe: &Sqe,
        in_capsule: Option<Range<usize>>,
    ) -> Result<(), QueueError> {
        self.submit(sqe, in_capsule)
    }
    /// Makes the host view of `range` hold what the target wrote there, for a command reaped
    /// by [`HostQueue::poll_lazy`] whose range nothing has reused since. A no-op where the
    /// host view is the memory the target writes (the loopback).
    fn fetch(&mut self, range: Range<usize>) -> Result<(), QueueError> {
        let _ = range;
        Ok(())
    }
    /// Per-command remote access (memory windows): expose only `range` of the region under a
    /// fresh key for one command, which the target invalidates with SEND_WITH_INVALIDATE (or
    /// the host locally) when the command completes, so no long-lived key exposes host memory.
    /// Returns (remote address, key), or `None` when the device has no windows (the region's
    /// own key is used then).
    fn bind_window(&mut self, range: Range<usize>) -> Result<Option<(u64, u32)>, QueueError> {
        let _ = range;
        Ok(None)
    }
    /// Puts the commands submitted so far on the wire now instead of at the next poll (the end
    /// of a submit batch): over a stream fabric a held acknowledgement then rides on them. By
    /// default nothing waits (the loopback executes at submit).
    fn flush(&mut self) -> Result<(), QueueError> {
        Ok(())
    }
    /// True while the connection is up.
    fn is_connected(&self) -> bool;
    /// Tear the connection down (idempotent). Commands in flight are lost.
    fn disconnect(&mut self);
    /// The completion group this queue shares with others (the RDMA host poll group) and the
    /// queue's key in it, for a poller driving many queues that wants to look only at those
    /// with something to report ([`CompletionGroup::poll_ready`], used through
    /// [`crate::io::ReadyQueues`]). None (the default): the queue has no such group; poll it
    /// every pass.
    fn completion_group(&self) -> Option<(Box<dyn CompletionGroup>, u64)> {
        None
    }
}

/// Queues whose completions one poll of a shared completion queue reaps together (the RDMA
/// host poll group). A poller driving many of them polls the group once per pass and then
/// polls only the queues it names, so its work per pass follows the completions, not the
/// number of queues. Only the thread that owns the group's queues uses it.
pub trait CompletionGroup: Send {
    /// Identifies the group: two handles of one group give the same value.
    fn id(&self) -> usize;
    /// Polls the shared completion queue once, then appends to `ready` the key
    /// ([`HostQueue::completion_group`]) of every member queue that got something to report
    /// since it was last named here: completions reaped (by this poll or by any member's own
    /// poll) and not yet taken, or the loss of its connection. A named queue's `poll` then
    /// reports it; a queue whose `poll` leaves completions behind (its `out` was too short) is
    /// named again. A queue may be named with nothing left (its owner polled it meanwhile):
    /// polling it then costs one empty poll.
    fn poll_ready(&mut self, ready: &mut Vec<u64>);
}

/// Connects queues. One per transport (and host poll group); cheap to clone into reactors.
pub trait Fabric: Send + Sync {
    /// The queue type this fabric produces.
    type Queue: HostQueue;
    /// Connect one queue (RDMA CM connect with NVMe-oF private data, QP on the host poll group,
    /// data region registered). Returns once the connection is established.
    fn connect(&self, params: &QueueConnectParams) -> Result<Self::Queue, ConnectError>;
}
