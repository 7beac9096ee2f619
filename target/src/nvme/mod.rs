//! NVMe semantics of the target, transport-free: subsystems, controllers, Fabrics Connect and
//! properties, the admin and NVM command sets, discovery, keep-alive. Nothing here knows RDMA;
//! the transport glue moves bytes and calls the interface below.
//!
//! # Files
//! - `target.rs`: [`Target`], shared by every reactor: limits, bdevs, subsystems, controller
//!   ids, the discovery log, the keep-alive sweep (control path).
//! - `subsystem.rs`: [`Subsystem`] and its namespace table (published by generation).
//! - `controller.rs`: [`Controller`], the association state shared by a host's queues.
//! - `queue.rs`: [`Queue`], one qpair's command execution (Connect, Fabrics, dispatch).
//! - `admin.rs`: admin commands; `io.rs`: NVM commands and [`ReactorIo`], a reactor's bdev
//!   channels and in-flight I/O.
//! - `xfer.rs`: the data plan of a command from its SGL.
//! - `counters.rs`, `status.rs`: counters, status codes by name.
//! - `fuzzing.rs`: this interface driven by a fuzzer's capsule sequences, with the rules it
//!   checks (feature `fuzzing`, and the unit tests).
//!
//! # The execution interface (what the transport glue calls)
//!
//! Per reactor, once: `let mut io = ReactorIo::new(target.clone());`
//!
//! Per qpair, when the RDMA connection is established (on its reactor):
//! `let mut q = Queue::new(target.clone(), &mut io, listener_addr, negotiated_depth);`
//!
//! Per capsule:
//! 1. `xfer::plan(&sqe, in_capsule_bytes, target.limits(), &mut keyed_list)` says which way data moves, how
//!    much, and where: in the capsule (used in place) or behind keyed descriptors (SGL1, or a
//!    Last Segment list of up to MSDBD keyed descriptors). `Err(status)`: answer with it.
//!    The transport gets buffers and, for [`Direction::HostToController`], RDMA READs the
//!    host's data in first.
//! 2. `q.execute(&mut io, &sqe, &mut IoBuf::new(&mut segments), tag, Instant::now)`
//!    (the clock is read only by the commands that use it: Connect, Keep Alive, Set
//!    Features; never on the I/O path) returns
//!    - [`Exec::Done`]`(cqe)`: for [`Direction::ControllerToHost`] RDMA WRITE the buffer
//!      (the SGL's length; the command filled all of it) then SEND the CQE;
//!    - [`Exec::Pending`]: the buffers stay lent (see [`crate::bdev::IoBuf`]) until the
//!      completion comes back from a poll below, under the same `tag`.
//! 3. On every reactor poll: `io.poll(&mut |tag, cqe| ...)` (block-device completions of every
//!    queue on this reactor) and, per admin queue, `q.poll_events(&mut io, &mut |tag, cqe| ...)`
//!    (Asynchronous Event Requests answered by an event; a shutdown's flushes started once its
//!    I/O queues have closed).
//! 4. `q.should_disconnect()` after each command and on a timer: true after a Disconnect
//!    command, or when the controller was torn down (keep-alive expiry, admin queue gone);
//!    the transport then disconnects the qpair and drops `q` (which unregisters it), after its
//!    pending I/O completed or was reaped. Commands reaching an I/O queue of a reset or torn-down
//!    controller meanwhile are answered Aborted - SQ Deletion, not executed.
//!
//! A reactor timer calls `target.reap_expired(now)` (keep-alive).
//!
//! Threading: `Queue` and `ReactorIo` belong to one reactor; `Target`, `Subsystem` and
//! `Controller` are shared, behind mutexes the I/O path never takes.

mod admin;
mod controller;
mod counters;
mod io;
mod queue;
pub mod status;
mod subsystem;
mod target;
pub mod xfer;

#[cfg(test)]
mod tests;

/// The command path under a fuzzer: see the module's own doc.
#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub mod fuzzing;

pub use controller::{AERL, Controller, ERROR_LOG_ENTRIES, IoQueueId, ShutdownPhase, cap};
pub use counters::{IoCounters, IoSnapshot};
pub use io::ReactorIo;
pub use queue::{Queue, QueueState};
pub use subsystem::{Namespace, NamespaceError, NsTable, Subsystem};
pub use target::{Limits, Target, TargetError};

use nvmf_protocol::sqe::FABRICS_OPCODE;
use nvmf_protocol::{Cqe, Sqe};

/// Result of [`Queue::execute`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exec {
    /// Answer now with this CQE (after sending the data, for controller-to-host commands).
    Done(Cqe),
    /// The CQE comes later from [`ReactorIo::poll`] or [`Queue::poll_events`] under the tag
    /// given to `execute`.
    Pending,
}

/// Which way a command's data moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// No data.
    None,
    /// Host to controller (RDMA READ, or in-capsule).
    HostToController,
    /// Controller to host (RDMA WRITE).
    ControllerToHost,
    /// Both (no command the target supports).
    Bidirectional,
}

/// The data direction of `sqe`: opcode bits 1:0, or FCTYPE bits 1:0 for Fabrics commands.
pub fn data_direction(sqe: &Sqe) -> Direction {
    let bits = if sqe.opcode == FABRICS_OPCODE {
        sqe.fctype().raw() & 3
    } else {
        sqe.opcode & 3
    };
    match bits {
        0 => Direction::None,
        1 => Direction::HostToController,
        2 => Direction::ControllerToHost,
        _ => Direction::Bidirectional,
    }
}
