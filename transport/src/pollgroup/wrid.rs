//! `wr_id` encoding, never a pointer, so a stale or forged completion can at worst name a wrong
//! object (checked by generation and state), never wild memory.
//!
//! ```text
//!  63..60  kind        what was posted (derived by the group, never caller-supplied)
//!  59..55  position    the WR's place in its request's chain (0..32): send side only
//!  54..32  generation  of the request (send side) or qpair (drain marker); 0 for receives
//!  31..0   index       receive slot, request or qpair slab index
//! ```
//!
//! The position is what makes send accounting exact without a per-qpair sequence: RC completes
//! a send queue in order, and only a chain's last WR is signaled, so a completion (success or
//! error) for position p retires every WR of that chain up to p (the earlier ones succeeded
//! silently, or failed with their own completion already seen). Chains of other requests never
//! need retiring by proxy: each ends in a signaled WR of its own, and in error every WR flushes
//! with its own completion. The one case a completion cannot name (unsignaled WRs that
//! succeeded before the QP went to ERR, in a chain whose signaled tail was never posted) is
//! closed by the drain marker, posted after ERR: when it completes, every earlier WR is done.

/// What a work request was posted for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum WrKind {
    /// A receive slot posted to the SRQ; index = slot.
    Recv = 1,
    /// A SEND (response capsule) of a request; index = request.
    Send = 2,
    /// An RDMA READ (host -> target data) of a request; index = request.
    Read = 3,
    /// An RDMA WRITE (target -> host data) of a request; index = request.
    Write = 4,
    /// The zero-length SEND posted after ERR to learn when the send queue has flushed;
    /// index = qpair slab index.
    DrainMarker = 5,
    /// Memory-key work of a request (bind a memory window, invalidate a key): the host's
    /// per-I/O keys; index = request.
    KeyOp = 6,
    /// The zero-length RDMA WRITE that retires a quiet qpair's silent chains (`silent.rs`);
    /// index = qpair slab index.
    SilentFlush = 7,
}

impl WrKind {
    fn from_bits(v: u8) -> Option<WrKind> {
        Some(match v {
            1 => WrKind::Recv,
            2 => WrKind::Send,
            3 => WrKind::Read,
            4 => WrKind::Write,
            5 => WrKind::DrainMarker,
            6 => WrKind::KeyOp,
            7 => WrKind::SilentFlush,
            _ => return None,
        })
    }

    /// Whether a work completion with `opcode` can belong to a WR of this kind (checked on
    /// successful completions only: verbs leaves the opcode undefined in error).
    pub fn matches(self, opcode: crate::types::WcOpcode) -> bool {
        use crate::types::WcOpcode as O;
        matches!(
            (self, opcode),
            (WrKind::Recv, O::Recv | O::RecvRdmaWithImm)
                | (WrKind::Send | WrKind::DrainMarker, O::Send)
                | (WrKind::Read, O::RdmaRead)
                | (WrKind::Write | WrKind::SilentFlush, O::RdmaWrite)
                | (WrKind::KeyOp, O::BindMw | O::LocalInv)
        )
    }
}

/// Generations wrap at this many bits.
pub const GEN_BITS: u32 = 23;
/// Most WRs one chain may hold (the position field is 5 bits).
pub const MAX_POSITION: u32 = 32;

const GEN_MASK: u64 = (1 << GEN_BITS) - 1;

/// A decoded `wr_id`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WrId {
    pub kind: WrKind,
    pub position: u8,
    pub generation: u32,
    pub index: u32,
}

/// The next generation after `g` (never 0, so a zeroed wr_id names no live object).
#[inline]
pub fn next_generation(g: u32) -> u32 {
    let n = (g + 1) & GEN_MASK as u32;
    if n == 0 { 1 } else { n }
}

#[inline]
pub fn encode(kind: WrKind, position: u8, generation: u32, index: u32) -> u64 {
    debug_assert!((position as u32) < MAX_POSITION);
    (kind as u64) << 60
        | ((position as u64) & 0x1f) << 55
        | (generation as u64 & GEN_MASK) << 32
        | index as u64
}

/// A receive slot's wr_id.
#[inline]
pub fn recv(slot: u32) -> u64 {
    encode(WrKind::Recv, 0, 0, slot)
}

/// None for a wr_id this module did not make.
#[inline]
pub fn decode(wr_id: u64) -> Option<WrId> {
    Some(WrId {
        kind: WrKind::from_bits((wr_id >> 60) as u8)?,
        position: ((wr_id >> 55) & 0x1f) as u8,
        generation: ((wr_id >> 32) & GEN_MASK) as u32,
        index: wr_id as u32,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::WcOpcode;

    #[test]
    fn round_trips_every_field() {
        for kind in [
            WrKind::Recv,
            WrKind::Send,
            WrKind::Read,
            WrKind::Write,
            WrKind::DrainMarker,
            WrKind::KeyOp,
            WrKind::SilentFlush,
        ] {
            for index in [0, 1, 4095, u32::MAX] {
                for position in [0u8, 1, 16, 31] {
                    for generation in [1, 2, (1 << GEN_BITS) - 1] {
                        let id = encode(kind, position, generation, index);
                        assert_eq!(
                            decode(id),
                            Some(WrId {
                                kind,
                                position,
                                generation,
                                index
                            })
                        );
                    }
                }
            }
        }
        assert_eq!(decode(0), None);
        assert_eq!(decode(0xf << 60), None);
    }

    #[test]
    fn generations_skip_zero_when_they_wrap() {
        assert_eq!(next_generation(0), 1);
        assert_eq!(next_generation((1 << GEN_BITS) - 1), 1);
    }

    #[test]
    fn a_receive_never_decodes_as_a_send_side_kind() {
        let r = decode(recv(7)).unwrap();
        assert_eq!(r.kind, WrKind::Recv);
        assert!(!r.kind.matches(WcOpcode::Send));
        assert!(!WrKind::Send.matches(WcOpcode::Recv));
        assert!(!WrKind::Read.matches(WcOpcode::RdmaWrite));
        assert!(WrKind::Read.matches(WcOpcode::RdmaRead));
    }
}
