//! RDMA CM private data exchanged while an NVMe-oF RDMA queue is set up: the host's connect
//! request (32 bytes), the target's accept (32 bytes) and reject (4 bytes).
//!
//! Request: 0..2 RECFMT, 2..4 QID, 4..6 HRQSIZE, 6..8 HSQSIZE (0's based), 8..10 CNTLID.
//! Accept: 0..2 RECFMT, 2..4 CRQSIZE. Reject: 0..2 RECFMT, 2..4 STS.
//!
//! The CM may hand over more bytes than were sent (it pads private data), so decoders read the
//! prefix they need and ignore the rest.

use crate::bytes::{rd16, take, wire_enum, wr16};
use crate::error::Result;

/// Size of the connect request and accept private data.
pub const CM_PRIVATE_DATA_SIZE: usize = 32;
/// Size of the reject private data.
pub const CM_REJECT_SIZE: usize = 4;

/// Connect request private data (host to target).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RdmaConnectRequest {
    /// Record format (0).
    pub recfmt: u16,
    /// Queue id (0 = admin).
    pub qid: u16,
    /// Host receive queue size (the number of responses the host can take).
    pub hrqsize: u16,
    /// Host send queue size, 0's based.
    pub hsqsize: u16,
    /// Controller id (0xFFFF on the admin queue of a dynamic controller).
    pub cntlid: u16,
}

impl RdmaConnectRequest {
    /// Encode into exactly 32 bytes.
    pub fn to_bytes(&self) -> [u8; CM_PRIVATE_DATA_SIZE] {
        let mut b = [0u8; CM_PRIVATE_DATA_SIZE];
        wr16(&mut b, 0, self.recfmt);
        wr16(&mut b, 2, self.qid);
        wr16(&mut b, 4, self.hrqsize);
        wr16(&mut b, 6, self.hsqsize);
        wr16(&mut b, 8, self.cntlid);
        b
    }
    /// Decode from at least 32 bytes.
    pub fn decode(buf: &[u8]) -> Result<Self> {
        let b = take::<CM_PRIVATE_DATA_SIZE>(buf, "RDMA CM connect request")?;
        Ok(Self {
            recfmt: rd16(b, 0),
            qid: rd16(b, 2),
            hrqsize: rd16(b, 4),
            hsqsize: rd16(b, 6),
            cntlid: rd16(b, 8),
        })
    }
    /// Check the request as a target must before accepting: RECFMT 0, non-zero sizes.
    /// Returns the reject status to send otherwise.
    pub fn check(&self) -> core::result::Result<(), RejectStatus> {
        if self.recfmt != 0 {
            Err(RejectStatus::InvalidRecfmt)
        } else if self.hsqsize == 0 {
            Err(RejectStatus::InvalidHsqsize)
        } else if self.hrqsize == 0 {
            Err(RejectStatus::InvalidHrqsize)
        } else {
            Ok(())
        }
    }
    /// Queue depth to grant: min(`own_max`, HRQSIZE, HSQSIZE + 1). HSQSIZE is 0's based; the
    /// off-by-one here is a classic interop bug.
    pub fn negotiated_depth(&self, own_max: u16) -> u16 {
        let sq = u32::from(self.hsqsize) + 1;
        let d = u32::from(own_max).min(u32::from(self.hrqsize)).min(sq);
        d as u16
    }
}

/// Accept private data (target to host).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RdmaAccept {
    /// Record format (0).
    pub recfmt: u16,
    /// Controller receive queue size (the queue depth granted).
    pub crqsize: u16,
}

impl RdmaAccept {
    /// Encode into exactly 32 bytes.
    pub fn to_bytes(&self) -> [u8; CM_PRIVATE_DATA_SIZE] {
        let mut b = [0u8; CM_PRIVATE_DATA_SIZE];
        wr16(&mut b, 0, self.recfmt);
        wr16(&mut b, 2, self.crqsize);
        b
    }
    /// Decode. Only the first 4 bytes carry fields, so 4 bytes are enough.
    pub fn decode(buf: &[u8]) -> Result<Self> {
        let b = take::<4>(buf, "RDMA CM accept")?;
        Ok(Self {
            recfmt: rd16(b, 0),
            crqsize: rd16(b, 2),
        })
    }
}

wire_enum! {
    /// Reject status codes (STS).
    pub enum RejectStatus: u16 {
        /// Invalid private data length.
        InvalidPrivateDataLength = 1,
        /// Invalid RECFMT.
        InvalidRecfmt = 2,
        /// Invalid QID.
        InvalidQid = 3,
        /// Invalid HSQSIZE.
        InvalidHsqsize = 4,
        /// Invalid HRQSIZE.
        InvalidHrqsize = 5,
        /// No resources.
        NoResources = 6,
        /// Invalid IRD.
        InvalidIrd = 7,
        /// Invalid ORD.
        InvalidOrd = 8,
    }
}

/// Reject private data (target to host).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RdmaReject {
    /// Record format (0).
    pub recfmt: u16,
    /// Why.
    pub status: RejectStatus,
}

impl RdmaReject {
    /// A reject with RECFMT 0.
    pub const fn new(status: RejectStatus) -> Self {
        Self { recfmt: 0, status }
    }
    /// Encode into exactly 4 bytes.
    pub fn to_bytes(&self) -> [u8; CM_REJECT_SIZE] {
        let mut b = [0u8; CM_REJECT_SIZE];
        wr16(&mut b, 0, self.recfmt);
        wr16(&mut b, 2, self.status.raw());
        b
    }
    /// Decode from at least 4 bytes.
    pub fn decode(buf: &[u8]) -> Result<Self> {
        let b = take::<CM_REJECT_SIZE>(buf, "RDMA CM reject")?;
        Ok(Self {
            recfmt: rd16(b, 0),
            status: RejectStatus::from_raw(rd16(b, 2)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_offsets() {
        let r = RdmaConnectRequest {
            recfmt: 0,
            qid: 1,
            hrqsize: 128,
            hsqsize: 127,
            cntlid: 0x0102,
        };
        let b = r.to_bytes();
        assert_eq!(&b[..10], &[0, 0, 1, 0, 128, 0, 127, 0, 0x02, 0x01]);
        assert!(b[10..].iter().all(|&x| x == 0));
        assert_eq!(RdmaConnectRequest::decode(&b).unwrap(), r);
        // CM padding: 56 bytes arrive for a 32-byte request.
        let mut padded = [0xAAu8; 56];
        padded[..32].copy_from_slice(&b);
        assert_eq!(RdmaConnectRequest::decode(&padded).unwrap(), r);
        assert!(RdmaConnectRequest::decode(&b[..31]).is_err());
    }

    #[test]
    fn depth_negotiation_and_checks() {
        // Linux admin queue: HRQSIZE 32, HSQSIZE 31.
        let admin = RdmaConnectRequest {
            recfmt: 0,
            qid: 0,
            hrqsize: 32,
            hsqsize: 31,
            cntlid: 0xFFFF,
        };
        assert_eq!(admin.negotiated_depth(128), 32);
        let io = RdmaConnectRequest {
            qid: 1,
            hrqsize: 128,
            hsqsize: 127,
            ..admin
        };
        assert_eq!(io.negotiated_depth(64), 64);
        assert_eq!(io.negotiated_depth(u16::MAX), 128);
        assert!(io.check().is_ok());
        assert_eq!(
            RdmaConnectRequest { recfmt: 1, ..io }.check(),
            Err(RejectStatus::InvalidRecfmt)
        );
        assert_eq!(
            RdmaConnectRequest { hsqsize: 0, ..io }.check(),
            Err(RejectStatus::InvalidHsqsize)
        );
        assert_eq!(
            RdmaConnectRequest { hrqsize: 0, ..io }.check(),
            Err(RejectStatus::InvalidHrqsize)
        );
    }

    #[test]
    fn accept_and_reject() {
        let a = RdmaAccept {
            recfmt: 0,
            crqsize: 128,
        };
        let b = a.to_bytes();
        assert_eq!(&b[..4], &[0, 0, 128, 0]);
        assert!(b[4..].iter().all(|&x| x == 0));
        assert_eq!(RdmaAccept::decode(&b).unwrap(), a);
        let r = RdmaReject::new(RejectStatus::NoResources);
        assert_eq!(r.to_bytes(), [0, 0, 6, 0]);
        assert_eq!(RdmaReject::decode(&[0, 0, 6, 0]).unwrap(), r);
        assert_eq!(
            RdmaReject::decode(&[0, 0, 0x10, 0]).unwrap().status,
            RejectStatus::Unknown(0x10)
        );
        for (s, v) in [
            (RejectStatus::InvalidPrivateDataLength, 1),
            (RejectStatus::InvalidQid, 3),
            (RejectStatus::InvalidIrd, 7),
            (RejectStatus::InvalidOrd, 8),
        ] {
            assert_eq!(s.raw(), v);
        }
        assert!(RdmaReject::decode(&[0, 0, 1]).is_err());
    }
}
