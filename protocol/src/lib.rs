//! nvmf-protocol: the NVMe and NVMe-oF wire formats both the target and the initiator speak.
//!
//! Owns every structure that crosses the wire (SQE/CQE capsules, SGL descriptors, Fabrics
//! commands, Identify data, log pages, features, controller properties, RDMA CM private data)
//! and NQN validation. Pure data: bytes in, typed values or typed errors out; no I/O.
//!
//! Rules every decoder follows: the input is untrusted, so decoding never panics and never
//! reads past the buffer; it returns a [`ProtocolError`] instead. Encoders write exact bytes,
//! zeroing reserved fields. The fast-path types ([`Sqe`], [`Cqe`], [`SglDescriptor`],
//! [`Status`]) are `Copy` and neither decoding nor encoding them allocates.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod admin;
mod bytes;
pub mod cm;
pub mod cqe;
pub mod error;
pub mod fabrics;
pub mod features;
pub mod identify;
pub mod log;
pub mod nqn;
pub mod nvm;
pub mod properties;
pub mod sgl;
pub mod sqe;
pub mod status;

pub use bytes::FixedStr;
pub use cqe::{CQE_SIZE, Cqe};
pub use error::{ProtocolError, Result};
pub use nqn::{DISCOVERY_NQN, Nqn, NqnError, validate_nqn};
pub use sgl::{SglDescriptor, U24};
pub use sqe::{AdminOpcode, FabricsType, IoOpcode, SQE_SIZE, Sqe};
pub use status::{Status, StatusCode, StatusContext};
