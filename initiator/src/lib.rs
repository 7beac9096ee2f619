//! nvmf-initiator: the NVMe-oF host side, mirror image of the target.
//!
//! Layers inside the crate, bottom up:
//! - [`queue`]: the narrow interface a transport implements ([`queue::HostQueue`],
//!   [`queue::Fabric`]); [`loopback`] implements it in memory with a fake target.
//! - [`cid`]: command identifiers with generations; [`clock`]: real and virtual time.
//! - [`admin`]: synchronous admin commands over one queue.
//! - [`controller`]: bring-up, namespaces, keep-alive, shutdown, reconnect.
//! - [`io`]: asynchronous I/O submission and completion on one I/O queue.
//! - [`block`]: a blocking byte-addressed block device over the polled API.
//! - [`perf`]: nvmf-perf's workload engine, verify format and report.
//! - [`cli`]: the nvmf CLI's nvme-cli-like formatting.
#![forbid(unsafe_code)]

pub mod admin;
pub mod block;
pub mod cid;
pub mod cli;
pub mod clock;
pub mod controller;
pub mod error;
pub mod io;
pub mod loopback;
pub mod perf;
pub mod queue;

pub use error::{Error, Result};
