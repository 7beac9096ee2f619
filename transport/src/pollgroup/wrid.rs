//! `wr_id` encoding: (kind, index) packed in a u64, never a pointer, so a stale or forged
//! completion can at worst name a wrong slot (checked), never wild memory.

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
    /// index = qp_num.
    DrainMarker = 5,
}

impl WrKind {
    fn from_u8(v: u8) -> Option<WrKind> {
        Some(match v {
            1 => WrKind::Recv,
            2 => WrKind::Send,
            3 => WrKind::Read,
            4 => WrKind::Write,
            5 => WrKind::DrainMarker,
            _ => return None,
        })
    }
}

/// Kind in bits 56..64, index in bits 0..32 (bits 32..56 free for a generation later).
#[inline]
pub fn encode(kind: WrKind, index: u32) -> u64 {
    (kind as u64) << 56 | index as u64
}

/// None for a wr_id this module did not make.
#[inline]
pub fn decode(wr_id: u64) -> Option<(WrKind, u32)> {
    Some((WrKind::from_u8((wr_id >> 56) as u8)?, wr_id as u32))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_every_kind() {
        for kind in [
            WrKind::Recv,
            WrKind::Send,
            WrKind::Read,
            WrKind::Write,
            WrKind::DrainMarker,
        ] {
            for index in [0, 1, 4095, u32::MAX] {
                assert_eq!(decode(encode(kind, index)), Some((kind, index)));
            }
        }
        assert_eq!(decode(0), None);
        assert_eq!(decode(0xff << 56), None);
    }
}
