//! The 16-byte completion queue entry (the NVMe-oF response capsule).
//!
//! Layout: 0..4 DW0 (command specific), 4..8 DW1, 8..10 SQHD, 10..12 SQID, 12..14 CID,
//! 14..16 status field (bit 0 phase tag, see [`crate::status`]).

use crate::bytes::{rd16, rd32, take, wr16, wr32};
use crate::error::Result;
use crate::status::{Status, StatusContext};

/// Size of a CQE in bytes.
pub const CQE_SIZE: usize = 16;

/// A completion queue entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Cqe {
    /// Dword 0: command specific result.
    pub dw0: u32,
    /// Dword 1: command specific result (upper half of 64-bit results).
    pub dw1: u32,
    /// Submission queue head pointer.
    pub sqhd: u16,
    /// Submission queue identifier.
    pub sqid: u16,
    /// Command identifier of the completed command.
    pub cid: u16,
    /// Completion status.
    pub status: Status,
    /// Phase tag (unused by fabrics, kept for completeness).
    pub phase: bool,
}

impl Cqe {
    /// A successful completion for `cid` with `result` in DW0/DW1.
    pub const fn success(cid: u16, sqid: u16, sqhd: u16, result: u64) -> Self {
        Self {
            dw0: result as u32,
            dw1: (result >> 32) as u32,
            sqhd,
            sqid,
            cid,
            status: Status::SUCCESS,
            phase: false,
        }
    }

    /// A failed completion for `cid`.
    pub const fn error(cid: u16, sqid: u16, sqhd: u16, status: Status) -> Self {
        Self {
            dw0: 0,
            dw1: 0,
            sqhd,
            sqid,
            cid,
            status,
            phase: false,
        }
    }

    /// DW0 and DW1 as one 64-bit result (Property Get of an 8-byte property).
    pub const fn result64(&self) -> u64 {
        self.dw0 as u64 | ((self.dw1 as u64) << 32)
    }

    /// Encode into exactly 16 bytes.
    pub fn encode(&self, out: &mut [u8; CQE_SIZE]) {
        wr32(out, 0, self.dw0);
        wr32(out, 4, self.dw1);
        wr16(out, 8, self.sqhd);
        wr16(out, 10, self.sqid);
        wr16(out, 12, self.cid);
        wr16(out, 14, self.status.to_field() | u16::from(self.phase));
    }

    /// Encode into a new array.
    pub fn to_bytes(&self) -> [u8; CQE_SIZE] {
        let mut b = [0u8; CQE_SIZE];
        self.encode(&mut b);
        b
    }

    /// Decode, reading command-specific status codes as admin/NVM codes.
    pub fn decode(buf: &[u8]) -> Result<Self> {
        Self::decode_in(buf, StatusContext::Nvm)
    }

    /// Decode, reading command-specific status codes in `ctx` (use
    /// [`StatusContext::Fabrics`] for the response to a Fabrics command).
    pub fn decode_in(buf: &[u8], ctx: StatusContext) -> Result<Self> {
        let b = take::<CQE_SIZE>(buf, "CQE")?;
        let sf = rd16(b, 14);
        Ok(Self {
            dw0: rd32(b, 0),
            dw1: rd32(b, 4),
            sqhd: rd16(b, 8),
            sqid: rd16(b, 10),
            cid: rd16(b, 12),
            status: Status::from_field(sf, ctx),
            phase: sf & 1 == 1,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::{FabricsStatus, GenericStatus, StatusCode};

    #[test]
    fn field_offsets() {
        let c = Cqe {
            dw0: 0x0403_0201,
            dw1: 0x0807_0605,
            sqhd: 0x0a09,
            sqid: 0x0c0b,
            cid: 0x0e0d,
            status: Status::generic(GenericStatus::InvalidField).with_dnr(),
            phase: true,
        };
        let b = c.to_bytes();
        assert_eq!(&b[..14], &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14]);
        // phase bit 0, SC=2 in bits 8:1, DNR bit 15.
        assert_eq!(u16::from_le_bytes([b[14], b[15]]), 0x8000 | (2 << 1) | 1);
        assert_eq!(Cqe::decode(&b).unwrap(), c);
    }

    #[test]
    fn decode_hand_made_image() {
        let mut b = [0u8; 16];
        b[0] = 0x34; // DW0: CNTLID 0x1234
        b[1] = 0x12;
        b[12] = 7; // CID
        let sf: u16 = (1 << 9) | (0x84 << 1);
        b[14..16].copy_from_slice(&sf.to_le_bytes());
        let c = Cqe::decode_in(&b, StatusContext::Fabrics).unwrap();
        assert_eq!(c.dw0, 0x1234);
        assert_eq!(c.cid, 7);
        assert_eq!(
            c.status.code,
            StatusCode::Fabrics(FabricsStatus::InvalidHost)
        );
        assert!(!c.phase);
    }

    #[test]
    fn truncated_and_result64() {
        assert!(Cqe::decode(&[0u8; 15]).is_err());
        let c = Cqe::success(1, 0, 5, 0x1122_3344_5566_7788);
        assert_eq!(c.dw0, 0x5566_7788);
        assert_eq!(c.dw1, 0x1122_3344);
        assert_eq!(c.result64(), 0x1122_3344_5566_7788);
    }
}
