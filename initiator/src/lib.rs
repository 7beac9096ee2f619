//! nvmf-initiator: the NVMe-oF host side, mirror image of the target.
//!
//! Layers inside the crate, bottom up:
//! - [`queue`]: the narrow interface a transport implements ([`queue::HostQueue`],
//!   [`queue::Fabric`]); [`loopback`] implements it in memory with a fake target.
//! - [`rdma`]: the traits over RDMA (host poll groups; verbs, soft in-process, soft TCP).
//! - [`cid`]: command identifiers with generations; [`clock`]: real and virtual time.
//! - [`admin`]: synchronous admin commands over one queue.
//! - [`controller`]: bring-up, namespaces, keep-alive, shutdown, reconnect.
//! - [`io`]: asynchronous I/O submission and completion on one I/O queue.
//! - [`block`]: a blocking byte-addressed block device over the polled API.
//! - [`perf`]: nvmf-perf's workload engine, verify format and report.
//! - [`cli`]: the nvmf CLI's nvme-cli-like formatting.
//!
//! ## For the transport glue
//!
//! A transport plugs in by implementing [`queue::Fabric`] (connect one queue: RDMA CM
//! connect with the NVMe-oF private data from [`queue::QueueConnectParams`], a QP on the host
//! poll group, a registered data region of `data_region_len` bytes) and [`queue::HostQueue`]
//! (send a capsule, report a CQE once both the SEND and the response completed, report
//! loss). Fabrics Connect, CID allocation, SGL encoding, timeouts and failing in-flight
//! commands on loss are done here, above the traits. [`loopback`] is the reference
//! implementation.
//!
//! ## Owners and threads
//!
//! A [`controller::Controller`] lives on one control thread, which calls its `poll` for
//! keep-alive and reconnect. Its I/O queues can be taken out and moved to reactors
//! ([`perf::runner`] does); a queue taken out and later lost stays dead, and the controller
//! holds fresh ones after it reconnects. [`block::BlockDevice`] polls its controller on every
//! call.
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
pub mod rdma;

pub use error::{Error, Result};
