//! The soft provider: a software RDMA device with ibverbs semantics, so every layer above runs
//! and is tested on machines without RDMA hardware.
//!
//! # What it enforces (like hardware)
//! - 24-bit QP numbers (0 and 1 reserved), unique among live QPs, allocated by increment with
//!   wrap so a destroyed QP's number is not reused at once.
//! - Memory keys: each MR has a distinct lkey and rkey (`slot << 8 | generation`); every SGE is
//!   checked for key, PD, bounds and access. Bad lkey: LOC_PROT_ERR. Bad rkey / bounds / access
//!   at the responder: requester REM_ACCESS_ERR, both QPs to ERR, QP_ACCESS_ERR at the
//!   responder. Type-2 memory windows: `SendOp::BindMw` binds one over part of a region
//!   registered with MW_BIND (in send-queue order); `SendOp::LocalInv` and a peer's
//!   SEND_WITH_INV invalidate it (the receive reports the rkey). As on hardware, invalidating a
//!   plain region's rkey fails: LOC_QP_OP_ERR locally; remotely the receive completes with
//!   REM_INV_REQ_ERR and the requester gets REM_OP_ERR.
//! - Queue depths: send queue slots are freed only when a completion is polled (a signaled WR
//!   retires the unsignaled ones before it, as in a verbs driver), so an all-unsignaled stream
//!   overruns exactly as on hardware; RQ/SRQ depths; creation limits from `SoftConfig`
//!   (`TransportError::Limit`). A CQ holds `depth` send-queue and `depth` receive completions
//!   (cq.rs: each kind in its own lane); a full lane is an overrun: the completion is lost,
//!   CQ_ERR is raised and every later poll of that CQ fails (`TransportError::CqOverrun`).
//! - RC semantics: in-order execution per QP, completions in order per work queue (none
//!   between a QP's send and receive queues, as in verbs); RNR NAK when no receive is posted,
//!   retried per `rnr_retry` (7 = forever) spaced by the responder's `min_rnr_timer`; later WRs
//!   wait behind a stalled one. Unsignaled WRs complete only on error. Any transition to ERR
//!   flushes every outstanding WR and own-RQ receive with WR_FLUSH_ERR, and WRs posted in ERR
//!   are flushed. SRQ receives stay with the SRQ; an SRQ-attached QP in ERR raises
//!   LAST_WQE_REACHED once no delivery into it is in flight, unless the device is configured
//!   like rxe / iWARP (`last_wqe_reached: false`, reported in `DeviceAttr`).
//! - A peer that is gone (destroyed, in ERR, link down) never answers: RETRY_EXC_ERR; a peer not
//!   yet in RTR drops requests, which are retried `retry_cnt` times after the ACK timeout.
//!
//! # Fabrics
//! - In-process (`inproc.rs`): the requester's thread executes each WR against the peer QP:
//!   takes the peer's receive from a lock-free queue, checks keys in the peer device's
//!   lock-free key table, copies memory to memory and pushes the responder's completion onto
//!   the responder's lock-free CQ. No allocation, lock or syscall per WR on the success path.
//!   An in-process endpoint is (lid = device number, qp_num).
//! - TCP (`tcp.rs`): one TCP connection per QP pair to the peer device's fabric port (the port
//!   attribute `lid`), RC-like frames with ACK / NAK / READ_RESP; a requester completes only on
//!   the responder's acknowledgement; go-back-N after an RNR NAK.
//!
//! # Threading and progress
//! `SoftQp` is the owner's handle; `QpShared` is the part other threads touch (state word,
//! receive queue, completion attribution, and under a mutex the stalled / in-flight send queue
//! and the TCP connection). Progress is driven by polling CQs: a CQ poll runs the QPs that
//! registered for it (stalled sends and their retry timers) and, on TCP, its own epoll (mio,
//! zero timeout, edge-triggered) over the sockets of its QPs, so only ready QPs cost anything.
//! Posting on a stalled QP also makes progress. Background threads exist only on the control
//! path: the TCP device's acceptor (hands data connections to QPs) and the TCP CM (one listener
//! thread per listening id, one reader thread per CM connection; `cm_threads.rs` joins them once
//! they finish).
//! Completion channels, async events and CM channels are queues with a socketpair fd that is
//! readable while events are pending; a CQ writes its channel only when armed.
//!
//! # unsafe
//! Only in `mem.rs`: the memory engine copies between raw addresses after the key table proved
//! the range lies in a live registration with the right access, pinned by an in-flight count
//! that deregistration waits for (so an MR is never freed under a copy); plus MR memory
//! allocation / release. Every copy into or out of registered memory is a relaxed atomic
//! (`shared_mem`), so a peer's copy racing the owner's `read_at` / `write_at` is no data race.
//! Every block has a `// SAFETY:` comment.
//!
//! # Deliberate differences from verbs
//! - Deregistering a region with windows bound over it succeeds (verbs refuses with EBUSY);
//!   the windows over it stop answering.
//! - Inline sends must still come from registered memory (the lkey is checked for bounds only):
//!   reading an unregistered address could not be proved safe.
//! - Receive queue slots are freed when the receive is consumed, not when its completion is
//!   polled.
//! - No ACK timeouts on a connected TCP fabric: TCP is reliable; a dropped connection fails the
//!   outstanding WRs with RETRY_EXC_ERR at once.
//! - RDMA READ depth: on TCP a requester keeps at most `max_rd_atomic` READs on the wire; the
//!   next waits in the send queue with everything behind it (it does not fail), as on hardware.
//!   In-process a READ completes within its post, so at most one is ever outstanding (and
//!   `max_rd_atomic` 0 does not stall READs as it would on hardware). A responder answers each
//!   READ as it arrives, so it never holds more than one (`max_dest_rd_atomic` is recorded).
//!
//! # Fault injection
//! `SoftContext::faults()` ([`FaultInjector`]): fail a QP (ERR + QP_FATAL), drop a QP's
//! connection, delay completions on a CQ, reorder completions of different QPs on a CQ (each
//! QP's order kept), device fatal (DEVICE_FATAL + CM DEVICE_REMOVAL).

mod channel;
mod cm;
mod cm_threads;
mod cq;
mod delivery_batch;
mod device;
mod fault;
mod inproc;
mod mem;
mod qp;
mod recv_ring;
mod retire;
mod srq;
mod tcp;
#[cfg(any(test, feature = "fuzzing"))]
// A fuzzing build uses only the part that connects a QP pair.
#[cfg_attr(not(test), allow(dead_code, unused_macros, unused_imports))]
mod testutil;

/// Entry points for the cargo-fuzz targets in `fuzz/` (feature `fuzzing`, off in every build the
/// workspace makes): the soft fabric's handling of bytes a peer sends. Each panics when one of
/// its rules breaks, which is what libFuzzer reports.
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing {
    pub use super::cm::fuzz::message as cm_message;
    pub use super::tcp::fuzz::hostile_stream as tcp_stream;
}

use crate::error::Result;
use crate::provider::Provider;
use crate::types::*;

pub use channel::SoftCompChannel;
pub use cm::{SoftCmChannel, SoftCmId};
pub use cm_threads::join_finished as join_finished_cm_threads;
pub use cq::SoftCq;
pub use device::{SoftContext, SoftPd};
pub use fault::FaultInjector;
pub use mem::{SoftMr, SoftMw};
pub use qp::SoftQp;
pub use srq::SoftSrq;

/// The soft provider.
pub struct Soft;

impl Soft {
    /// Open (or find) the soft device `cfg.name`.
    pub fn open(cfg: &SoftConfig) -> Result<SoftContext> {
        device::open(cfg)
    }
}

impl Provider for Soft {
    type Context = SoftContext;
    type Pd = SoftPd;
    type Mr = SoftMr;
    type Mw = SoftMw;
    type CompChannel = SoftCompChannel;
    type Cq = SoftCq;
    type Srq = SoftSrq;
    type Qp = SoftQp;
    type CmChannel = SoftCmChannel;
    type CmId = SoftCmId;

    const KIND: ProviderKind = ProviderKind::Soft;

    fn devices() -> Result<Vec<DeviceInfo>> {
        device::list()
    }

    fn create_cm_channel() -> Result<SoftCmChannel> {
        SoftCmChannel::new()
    }
}
