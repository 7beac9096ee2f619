//! nvmf-transport: the RDMA floor every layer above stands on.
//!
//! Owns one provider-neutral verbs API (devices, ports, GIDs, PD, MR, CQ + completion channel,
//! SRQ, RC QP, async events) and an rdma_cm-style connection manager, implemented by two
//! providers:
//! - `verbs` (feature `rdma`): real ibverbs + librdmacm through rdma-sys; the only place with FFI;
//! - `soft` (feature `soft`): a software RDMA device with the same semantics over an in-process
//!   fabric and over TCP, with fault injection.
//!
//! `provider` states the contract; `device` and `cm` are the public enum façade over providers;
//! `pollgroup` is the per-reactor, per-device CQ + SRQ + qpair RB-tree that the target and the
//! host drive; `async_hub` hands a device's async events to the owner of each QP in the process.

pub mod async_hub;
pub mod cm;
pub mod device;
pub mod error;
pub mod fdwait;
#[doc(hidden)]
pub mod fuzz_input;
pub mod gid;
pub mod mapped;
pub mod pollgroup;
pub mod provider;
mod shared_mem;
pub mod types;

#[cfg(feature = "soft")]
pub mod soft;
#[cfg(feature = "rdma")]
pub mod verbs;

pub use async_hub::{AsyncHub, AsyncListener, AsyncRoute, AsyncSink};
pub use cm::{CmChannel, CmEvent, CmId};
pub use device::{CompChannel, Context, Cq, DeviceSpec, Mr, Mw, Pd, Qp, QpInitAttr, Srq, devices};
pub use error::{PostError, Result, TransportError, one_line};
pub use mapped::MappedMemory;
pub use provider::OwnedMemory;
pub use types::*;
