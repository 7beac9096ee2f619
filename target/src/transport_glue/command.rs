//! [`Command`]: the target's own state of one request (the poll group's `Request::user`), and
//! its life as an explicit enum, SPDK's request states made explicit:
//!
//! ```text
//! New -> NeedBuffer -> ReadingData -> Executing -> Responding -> Completed
//!  |        |  (keyed host-to-controller data is RDMA READ in ReadingData)   ^
//!  |        `-- no data to read: straight to Executing                       |
//!  +-- in-capsule write: straight to Executing, from its receive slot       |
//!  `-- malformed SGL (status from the plan): straight to Responding ---------'
//! ```
//!
//! Every transition goes through [`Command::enter`], which is the trace point
//! (`nvmf_target::request` target, TRACE level).

use nvmf_protocol::{Cqe, Sqe};

use crate::nvme::xfer::Plan;

/// Where a command is in its life. See the module documentation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CommandState {
    /// The capsule arrived; nothing decided yet.
    #[default]
    New,
    /// Waiting for data buffers (FIFO in the poll group).
    NeedBuffer,
    /// RDMA READs of the host's data in flight.
    ReadingData,
    /// With the NVMe layer: executing, or a block-device I/O or an event pending.
    Executing,
    /// The response chain (RDMA WRITEs + SEND) is posted.
    Responding,
    /// Finished: the request object went back.
    Completed,
}

/// The target's state of one request.
#[derive(Debug, Default)]
pub struct Command {
    state: CommandState,
    /// The submission queue entry (copied out of the capsule: most commands give their slot
    /// back once parsed; an in-capsule write keeps it until its block I/O is done).
    pub sqe: Sqe,
    /// The data plan (None before it is made, or when the SGL was refused).
    pub plan: Option<Plan>,
    /// The answer, once known.
    pub cqe: Option<Cqe>,
    /// The tag of its pending completion (block-device I/O or event), while Executing.
    pub pending_tag: Option<usize>,
    /// The pending completion is an event (Asynchronous Event Request), not block I/O.
    pub pending_event: bool,
    /// Its qpair went while it was executing: finish when the completion comes back.
    pub orphaned: bool,
    /// The key of its NVMe queue in the handler (set when the capsule arrives).
    pub queue: Option<usize>,
    /// Bytes of its data transfer (RDMA READ in, or WRITE out) posted so far: a transfer too
    /// large for one chain continues from here when the previous chain completes.
    pub moved: u32,
}

impl Command {
    /// Where it is.
    pub fn state(&self) -> CommandState {
        self.state
    }

    /// Moves to `next`: the one trace point of the request life. Inlined down to the level
    /// check and the store; the event itself is out of line (four or five transitions per
    /// command: the disabled event's call and callsite check cost about 80 instructions per
    /// I/O).
    #[inline]
    pub fn enter(&mut self, next: CommandState, qp_num: u32, request: u32) {
        if tracing::level_enabled!(tracing::Level::TRACE) {
            self.trace(next, qp_num, request);
        }
        self.state = next;
    }

    #[cold]
    #[inline(never)]
    fn trace(&self, next: CommandState, qp_num: u32, request: u32) {
        tracing::trace!(
            target: "nvmf_target::request",
            qp_num,
            request,
            cid = self.sqe.cid,
            opcode = self.sqe.opcode,
            from = ?self.state,
            to = ?next,
            "request state"
        );
    }

    /// Back to a blank state for a new capsule (request objects are reused).
    pub fn reset(&mut self) {
        *self = Command::default();
    }
}
