//! SGL descriptors (16 bytes; byte 15 = type << 4 | subtype).
//!
//! - data block (type 0): subtype 0 address, subtype 1 offset into in-capsule data;
//!   0..8 address/offset, 8..12 length;
//! - bit bucket (type 1): 8..12 length;
//! - segment (type 2) and last segment (type 3), address or offset subtype: point at a list of
//!   descriptors (the last segment form is what multi-SGL capsules use);
//! - keyed data block (type 4): 0..8 address, 8..11 length (24 bits), 11..15 key; subtype 0
//!   address, 0xF invalidate key (answer with SEND_WITH_INVALIDATE).
//!
//! The "null" descriptor (no data) is a keyed data block with address, length and key 0.

use crate::bytes::{rd32, rd64, take, wr8, wr32, wr64};
use crate::error::{ProtocolError, Result};

/// Size of one SGL descriptor.
pub const SGL_DESC_SIZE: usize = 16;

/// SGL descriptor type codes (upper nibble of byte 15).
pub mod sgl_type {
    /// Data block.
    pub const DATA_BLOCK: u8 = 0x0;
    /// Bit bucket.
    pub const BIT_BUCKET: u8 = 0x1;
    /// Segment.
    pub const SEGMENT: u8 = 0x2;
    /// Last segment.
    pub const LAST_SEGMENT: u8 = 0x3;
    /// Keyed data block.
    pub const KEYED_DATA_BLOCK: u8 = 0x4;
}

/// SGL descriptor subtype codes (lower nibble of byte 15).
pub mod sgl_subtype {
    /// Address.
    pub const ADDRESS: u8 = 0x0;
    /// Offset (into in-capsule data).
    pub const OFFSET: u8 = 0x1;
    /// Keyed data block: invalidate the key after use.
    pub const INVALIDATE_KEY: u8 = 0xF;
}

/// A 24-bit length (keyed data block descriptors carry only 3 length bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct U24(u32);

impl U24 {
    /// Largest value.
    pub const MAX: u32 = 0x00FF_FFFF;
    /// Zero.
    pub const ZERO: Self = Self(0);
    /// `v` if it fits in 24 bits.
    pub const fn new(v: u32) -> Option<Self> {
        if v <= Self::MAX { Some(Self(v)) } else { None }
    }
    /// The value.
    pub const fn get(self) -> u32 {
        self.0
    }
}

/// One SGL descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SglDescriptor {
    /// Data block, address subtype.
    DataBlock {
        /// Host address.
        address: u64,
        /// Length in bytes.
        length: u32,
    },
    /// Data block, offset subtype: the data is in the capsule at `offset`.
    DataBlockOffset {
        /// Offset into the in-capsule data (the Linux host always uses 0).
        offset: u64,
        /// Length in bytes.
        length: u32,
    },
    /// Bit bucket (discard `length` bytes).
    BitBucket {
        /// Length in bytes.
        length: u32,
    },
    /// Segment, address subtype.
    Segment {
        /// Address of the next segment.
        address: u64,
        /// Length of the segment in bytes.
        length: u32,
    },
    /// Segment, offset subtype.
    SegmentOffset {
        /// Offset of the next segment in the capsule.
        offset: u64,
        /// Length of the segment in bytes.
        length: u32,
    },
    /// Last segment, address subtype.
    LastSegment {
        /// Address of the last segment.
        address: u64,
        /// Length of the segment in bytes.
        length: u32,
    },
    /// Last segment, offset subtype: a descriptor list inside the capsule (multi-SGL).
    LastSegmentOffset {
        /// Offset of the descriptor list in the in-capsule data.
        offset: u64,
        /// Length of the list in bytes (16 per descriptor).
        length: u32,
    },
    /// Keyed data block: remote memory the target reaches with RDMA READ/WRITE.
    KeyedDataBlock {
        /// Remote virtual address.
        address: u64,
        /// Length in bytes (24 bits).
        length: U24,
        /// Remote key.
        key: u32,
        /// Subtype 0xF: the host asks the target to invalidate `key` (SEND_WITH_INVALIDATE).
        invalidate: bool,
    },
}

impl SglDescriptor {
    /// The null descriptor: no data.
    pub const NULL: Self = Self::KeyedDataBlock {
        address: 0,
        length: U24::ZERO,
        key: 0,
        invalidate: false,
    };

    /// A keyed data block; `None` if `length` exceeds 24 bits.
    pub const fn keyed(address: u64, length: u32, key: u32, invalidate: bool) -> Option<Self> {
        match U24::new(length) {
            Some(length) => Some(Self::KeyedDataBlock {
                address,
                length,
                key,
                invalidate,
            }),
            None => None,
        }
    }

    /// True when the descriptor describes no data (null keyed descriptor, or any zero length).
    pub const fn is_null(&self) -> bool {
        match *self {
            Self::KeyedDataBlock { length, key, .. } => length.get() == 0 && key == 0,
            _ => self.data_length() == 0,
        }
    }

    /// Byte 15: type << 4 | subtype.
    pub const fn identifier(&self) -> u8 {
        use sgl_subtype::*;
        use sgl_type::*;
        let (t, s) = match self {
            Self::DataBlock { .. } => (DATA_BLOCK, ADDRESS),
            Self::DataBlockOffset { .. } => (DATA_BLOCK, OFFSET),
            Self::BitBucket { .. } => (BIT_BUCKET, ADDRESS),
            Self::Segment { .. } => (SEGMENT, ADDRESS),
            Self::SegmentOffset { .. } => (SEGMENT, OFFSET),
            Self::LastSegment { .. } => (LAST_SEGMENT, ADDRESS),
            Self::LastSegmentOffset { .. } => (LAST_SEGMENT, OFFSET),
            Self::KeyedDataBlock { invalidate, .. } => (
                KEYED_DATA_BLOCK,
                if *invalidate { INVALIDATE_KEY } else { ADDRESS },
            ),
        };
        (t << 4) | s
    }

    /// Length field (bytes of data, or bytes of descriptor list for segments).
    pub const fn data_length(&self) -> u32 {
        match *self {
            Self::DataBlock { length, .. }
            | Self::DataBlockOffset { length, .. }
            | Self::BitBucket { length }
            | Self::Segment { length, .. }
            | Self::SegmentOffset { length, .. }
            | Self::LastSegment { length, .. }
            | Self::LastSegmentOffset { length, .. } => length,
            Self::KeyedDataBlock { length, .. } => length.get(),
        }
    }

    /// Encode into exactly 16 bytes (reserved bytes zero).
    pub fn encode(&self, out: &mut [u8; SGL_DESC_SIZE]) {
        *out = [0; SGL_DESC_SIZE];
        match *self {
            Self::DataBlock { address: a, length }
            | Self::DataBlockOffset { offset: a, length }
            | Self::Segment { address: a, length }
            | Self::SegmentOffset { offset: a, length }
            | Self::LastSegment { address: a, length }
            | Self::LastSegmentOffset { offset: a, length } => {
                wr64(out, 0, a);
                wr32(out, 8, length);
            }
            Self::BitBucket { length } => wr32(out, 8, length),
            Self::KeyedDataBlock {
                address,
                length,
                key,
                ..
            } => {
                wr64(out, 0, address);
                let l = length.get().to_le_bytes();
                out[8..11].copy_from_slice(&l[..3]);
                wr32(out, 11, key);
            }
        }
        wr8(out, 15, self.identifier());
    }

    /// Encode into a new array.
    pub fn to_bytes(&self) -> [u8; SGL_DESC_SIZE] {
        let mut b = [0u8; SGL_DESC_SIZE];
        self.encode(&mut b);
        b
    }

    /// Decode one descriptor; reserved bytes are ignored. Unknown type/subtype pairs are an
    /// [`ProtocolError::InvalidValue`] on field "SGL identifier" (answer "SGL Descriptor Type
    /// Invalid").
    pub fn decode(buf: &[u8]) -> Result<Self> {
        let b = take::<SGL_DESC_SIZE>(buf, "SGL descriptor")?;
        let id = b[15];
        let a = rd64(b, 0);
        let len = rd32(b, 8);
        Ok(match (id >> 4, id & 0xF) {
            (sgl_type::DATA_BLOCK, sgl_subtype::ADDRESS) => Self::DataBlock {
                address: a,
                length: len,
            },
            (sgl_type::DATA_BLOCK, sgl_subtype::OFFSET) => Self::DataBlockOffset {
                offset: a,
                length: len,
            },
            (sgl_type::BIT_BUCKET, sgl_subtype::ADDRESS) => Self::BitBucket { length: len },
            (sgl_type::SEGMENT, sgl_subtype::ADDRESS) => Self::Segment {
                address: a,
                length: len,
            },
            (sgl_type::SEGMENT, sgl_subtype::OFFSET) => Self::SegmentOffset {
                offset: a,
                length: len,
            },
            (sgl_type::LAST_SEGMENT, sgl_subtype::ADDRESS) => Self::LastSegment {
                address: a,
                length: len,
            },
            (sgl_type::LAST_SEGMENT, sgl_subtype::OFFSET) => Self::LastSegmentOffset {
                offset: a,
                length: len,
            },
            (
                sgl_type::KEYED_DATA_BLOCK,
                s @ (sgl_subtype::ADDRESS | sgl_subtype::INVALIDATE_KEY),
            ) => Self::KeyedDataBlock {
                address: a,
                length: U24(len & U24::MAX),
                key: rd32(b, 11),
                invalidate: s == sgl_subtype::INVALIDATE_KEY,
            },
            _ => {
                return Err(ProtocolError::InvalidValue {
                    field: "SGL identifier",
                    value: u64::from(id),
                });
            }
        })
    }

    /// Iterate over a descriptor list (the bytes a last-segment descriptor points at). A
    /// trailing partial descriptor yields one `Truncated` error, then the iterator ends.
    pub fn list(buf: &[u8]) -> SglList<'_> {
        SglList { buf }
    }
}

impl Default for SglDescriptor {
    fn default() -> Self {
        Self::NULL
    }
}

/// Iterator over a packed list of SGL descriptors; allocation free.
#[derive(Debug, Clone)]
pub struct SglList<'a> {
    buf: &'a [u8],
}

impl Iterator for SglList<'_> {
    type Item = Result<SglDescriptor>;
    fn next(&mut self) -> Option<Self::Item> {
        if self.buf.is_empty() {
            return None;
        }
        let r = SglDescriptor::decode(self.buf);
        self.buf = self.buf.get(SGL_DESC_SIZE..).unwrap_or(&[]);
        Some(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keyed_offsets_and_subtypes() {
        let d = SglDescriptor::keyed(0x0807_0605_0403_0201, 0x0b0a09, 0x0f0e_0d0c, true).unwrap();
        let b = d.to_bytes();
        assert_eq!(
            &b[..15],
            &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]
        );
        assert_eq!(b[15], 0x4F);
        assert_eq!(SglDescriptor::decode(&b).unwrap(), d);
        let d0 = SglDescriptor::keyed(1, 2, 3, false).unwrap();
        assert_eq!(d0.to_bytes()[15], 0x40);
        assert!(SglDescriptor::keyed(0, 0x0100_0000, 0, false).is_none());
    }

    #[test]
    fn null_descriptor() {
        let b = SglDescriptor::NULL.to_bytes();
        assert_eq!(b, [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x40]);
        assert!(SglDescriptor::decode(&b).unwrap().is_null());
        assert!(!SglDescriptor::keyed(0, 0, 5, false).unwrap().is_null());
    }

    #[test]
    fn offset_and_segment_forms() {
        let d = SglDescriptor::DataBlockOffset {
            offset: 0,
            length: 4096,
        };
        let b = d.to_bytes();
        assert_eq!(b[15], 0x01);
        assert_eq!(&b[8..12], &4096u32.to_le_bytes());
        assert_eq!(SglDescriptor::decode(&b).unwrap(), d);
        let l = SglDescriptor::LastSegmentOffset {
            offset: 0,
            length: 32,
        };
        assert_eq!(l.to_bytes()[15], 0x31);
        assert_eq!(
            SglDescriptor::Segment {
                address: 0,
                length: 0
            }
            .identifier(),
            0x20
        );
        assert_eq!(SglDescriptor::BitBucket { length: 0 }.identifier(), 0x10);
        assert_eq!(
            SglDescriptor::DataBlock {
                address: 0,
                length: 0
            }
            .identifier(),
            0x00
        );
    }

    #[test]
    fn hand_made_keyed_image() {
        let mut b = [0u8; 16];
        b[0..8].copy_from_slice(&0xdead_beef_0000_1000u64.to_le_bytes());
        b[8..11].copy_from_slice(&[0x00, 0x10, 0x00]); // 4096
        b[11..15].copy_from_slice(&0x1234_5678u32.to_le_bytes());
        b[15] = 0x4F;
        assert_eq!(
            SglDescriptor::decode(&b).unwrap(),
            SglDescriptor::keyed(0xdead_beef_0000_1000, 4096, 0x1234_5678, true).unwrap()
        );
    }

    #[test]
    fn rejects_unknown_identifiers_and_short_input() {
        let mut b = [0u8; 16];
        for id in [0x02u8, 0x41, 0x50, 0xF0, 0x11] {
            b[15] = id;
            assert!(matches!(
                SglDescriptor::decode(&b),
                Err(ProtocolError::InvalidValue {
                    field: "SGL identifier",
                    ..
                })
            ));
        }
        assert!(matches!(
            SglDescriptor::decode(&b[..15]),
            Err(ProtocolError::Truncated {
                need: 16,
                got: 15,
                ..
            })
        ));
    }

    #[test]
    fn descriptor_list_iteration() {
        let a = SglDescriptor::keyed(1, 2, 3, false).unwrap();
        let c = SglDescriptor::DataBlockOffset {
            offset: 32,
            length: 8,
        };
        let mut buf = [0u8; 40];
        buf[..16].copy_from_slice(&a.to_bytes());
        buf[16..32].copy_from_slice(&c.to_bytes());
        let v: Vec<_> = SglDescriptor::list(&buf).collect();
        assert_eq!(v.len(), 3);
        assert_eq!(v[0], Ok(a));
        assert_eq!(v[1], Ok(c));
        assert!(v[2].is_err());
    }
}
