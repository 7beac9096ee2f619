//! The request path joining the RDMA transport ([`crate::rdma`], one poll group per reactor
//! and device) to the NVMe layer ([`crate::nvme`]): a `pollgroup::Handler` per group that
//! turns capsules into commands, moves their data (in-capsule, RDMA READ, RDMA WRITE), runs
//! them and sends their responses.
//!
//! - `command.rs`: [`Command`], one request's state and its life ([`CommandState`]).
//! - `handler.rs`: [`NvmeHandler`], the per-group handler (queues, block I/O, responses).
//! - `sges.rs`: the SGEs of one keyed descriptor's share of a transfer.
//! - `fuzzing.rs`: the whole request path, transport included, driven by a hostile host, with
//!   the rules it checks (feature `fuzzing`, and the unit tests).

mod command;
#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzzing;
mod handler;
mod sges;

pub use command::{Command, CommandState};
pub use handler::{CONNECT_DEADLINE, NvmeHandler};
