//! Typed errors for everything that parses or encodes wire bytes.
//!
//! Every variant is `Copy` and carries only static names and numbers, so building one on the
//! fast path never allocates.

use crate::nqn::NqnError;

/// Why a wire structure could not be decoded or encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    /// The input ended before the structure did.
    #[error("{what}: truncated, need {need} bytes, got {got}")]
    Truncated {
        /// Structure being decoded.
        what: &'static str,
        /// Bytes required.
        need: usize,
        /// Bytes available.
        got: usize,
    },
    /// The output buffer cannot hold the encoded structure.
    #[error("{what}: output buffer too small, need {need} bytes, got {got}")]
    BufferTooSmall {
        /// Structure being encoded.
        what: &'static str,
        /// Bytes required.
        need: usize,
        /// Bytes available.
        got: usize,
    },
    /// A field holds a value the protocol does not allow here.
    #[error("{field}: invalid value {value:#x}")]
    InvalidValue {
        /// Field name as the specification spells it.
        field: &'static str,
        /// Offending value.
        value: u64,
    },
    /// The command is not the one the typed view expects.
    #[error("wrong opcode: expected {expected:#04x}, got {got:#04x}")]
    WrongOpcode {
        /// Opcode of the requested view.
        expected: u8,
        /// Opcode found in the SQE.
        got: u8,
    },
    /// The Fabrics command type is not the one the typed view expects.
    #[error("wrong fabrics command type: expected {expected:#04x}, got {got:#04x}")]
    WrongFabricsType {
        /// FCTYPE of the requested view.
        expected: u8,
        /// FCTYPE found in the SQE.
        got: u8,
    },
    /// A string field is longer than its maximum.
    #[error("{field}: {len} bytes exceed the maximum of {max}")]
    StringTooLong {
        /// Field name.
        field: &'static str,
        /// Length found.
        len: usize,
        /// Maximum allowed.
        max: usize,
    },
    /// A string field is not valid UTF-8.
    #[error("{field}: not valid UTF-8")]
    NotUtf8 {
        /// Field name.
        field: &'static str,
    },
    /// A string contains a NUL byte (strings on the wire are NUL terminated).
    #[error("{field}: contains a NUL byte")]
    EmbeddedNul {
        /// Field name.
        field: &'static str,
    },
    /// An NVMe Qualified Name failed validation.
    #[error("invalid NQN: {0}")]
    BadNqn(#[from] NqnError),
}

/// Result alias for this crate.
pub type Result<T> = core::result::Result<T, ProtocolError>;
