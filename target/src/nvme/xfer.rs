//! Where a command's data is, from its SGL: nothing, in the capsule (data block with offset),
//! or in host memory behind keyed descriptors (one in SGL1, or a Last Segment list of up to
//! MSDBD keyed descriptors inside the capsule). The transport calls [`plan`] before it gets
//! buffers and moves data; every malformed SGL maps to its NVMe status here, so the glue never
//! decides one.

use nvmf_protocol::sgl::SGL_DESC_SIZE;
use nvmf_protocol::status::GenericStatus;
use nvmf_protocol::{SglDescriptor, Sqe, Status};

use super::status::SGL_LENGTH_INVALID;
use super::target::Limits;
use super::{Direction, data_direction};

/// Most keyed descriptors one command may carry (MSDBD of Identify Controller).
pub const MAX_KEYED: usize = 16;

/// One keyed descriptor: host memory the transport reaches with RDMA READ/WRITE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Keyed {
    /// Remote address.
    pub address: u64,
    /// Bytes.
    pub length: u32,
    /// Remote key.
    pub key: u32,
    /// The host asked for SEND_WITH_INVALIDATE of `key`.
    pub invalidate: bool,
}

/// No descriptor (what a keyed list is filled with).
pub const NO_KEYED: Keyed = Keyed {
    address: 0,
    length: 0,
    key: 0,
    invalidate: false,
};

/// Where the data is. Small (a plan is copied around per command): the keyed descriptors
/// themselves go to the caller's list (see [`plan`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// No data.
    None,
    /// `length` bytes at `offset` of the in-capsule data.
    InCapsule {
        /// Offset into the in-capsule data (after the 64-byte SQE).
        offset: u32,
        /// Bytes.
        length: u32,
    },
    /// Host memory, in order: the first `count` descriptors of the list [`plan`] filled.
    Keyed {
        /// How many.
        count: u8,
    },
}

/// The data plan of a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    /// Which way the data moves.
    pub direction: Direction,
    /// Total bytes.
    pub length: u32,
    /// Where.
    pub placement: Placement,
}

const fn generic(g: GenericStatus) -> Status {
    Status::generic(g).with_dnr()
}

/// A keyed descriptor's buffer; any other descriptor is the wrong type here, and a buffer
/// that wraps past 2^64 is in no host memory (its later pieces' addresses would overflow).
fn keyed(d: SglDescriptor) -> Result<Keyed, Status> {
    match d {
        SglDescriptor::KeyedDataBlock {
            address,
            length,
            key,
            invalidate,
        } => {
            let length = length.get();
            // Its last byte, address + length - 1, may be 2^64 - 1 but not beyond.
            if address
                .checked_add(u64::from(length).saturating_sub(1))
                .is_none()
            {
                return Err(generic(GenericStatus::InvalidField));
            }
            Ok(Keyed {
                address,
                length,
                key,
                invalidate,
            })
        }
        _ => Err(generic(GenericStatus::SglDescriptorTypeInvalid)),
    }
}

/// The data plan of `sqe`, whose capsule carries `in_capsule` bytes after the SQE (an admin
/// queue capsule carries none); keyed descriptors are written to the front of `list`. Errors
/// are the status to answer with.
pub fn plan(
    sqe: &Sqe,
    in_capsule: &[u8],
    limits: &Limits,
    list: &mut [Keyed; MAX_KEYED],
) -> Result<Plan, Status> {
    let direction = data_direction(sqe);
    let sgl = sqe
        .sgl1()
        .map_err(|_| generic(GenericStatus::SglDescriptorTypeInvalid))?;
    if direction == Direction::None || sgl.is_null() {
        return Ok(Plan {
            direction,
            length: 0,
            placement: Placement::None,
        });
    }
    if direction == Direction::Bidirectional {
        return Err(generic(GenericStatus::InvalidField));
    }
    let placement = match sgl {
        SglDescriptor::DataBlockOffset { offset, length } => {
            // In-capsule data only carries host-to-controller data.
            if direction != Direction::HostToController {
                return Err(generic(GenericStatus::SglDescriptorTypeInvalid));
            }
            let end = offset.checked_add(u64::from(length));
            if end.is_none_or(|e| e > in_capsule.len() as u64) {
                return Err(if offset > in_capsule.len() as u64 {
                    generic(GenericStatus::SglOffsetInvalid)
                } else {
                    SGL_LENGTH_INVALID
                });
            }
            Placement::InCapsule {
                offset: offset as u32,
                length,
            }
        }
        SglDescriptor::KeyedDataBlock { .. } => {
            list[0] = keyed(sgl)?;
            Placement::Keyed { count: 1 }
        }
        SglDescriptor::LastSegmentOffset { offset, length } => {
            let n = length as usize / SGL_DESC_SIZE;
            if length as usize % SGL_DESC_SIZE != 0
                || n == 0
                || n > usize::from(limits.msdbd).min(MAX_KEYED)
            {
                return Err(generic(GenericStatus::InvalidSglDescriptorCount));
            }
            let start =
                usize::try_from(offset).map_err(|_| generic(GenericStatus::SglOffsetInvalid))?;
            // Checked: the offset is the host's, up to 2^64 - 1.
            let bytes = start
                .checked_add(length as usize)
                .and_then(|end| in_capsule.get(start..end))
                .ok_or(generic(GenericStatus::SglOffsetInvalid))?;
            for (slot, d) in list.iter_mut().zip(SglDescriptor::list(bytes)) {
                let d = d.map_err(|_| generic(GenericStatus::SglDescriptorTypeInvalid))?;
                *slot = keyed(d)?;
            }
            Placement::Keyed { count: n as u8 }
        }
        _ => return Err(generic(GenericStatus::SglDescriptorTypeInvalid)),
    };
    let length: u64 = match &placement {
        Placement::InCapsule { length, .. } => u64::from(*length),
        Placement::Keyed { count } => list[..usize::from(*count)]
            .iter()
            .map(|k| u64::from(k.length))
            .sum(),
        Placement::None => 0,
    };
    // Admin data structures are at most a few pages; I/O is bounded by MDTS.
    let max = u64::from(limits.max_io_size).max(64 * 1024);
    if length > max {
        return Err(SGL_LENGTH_INVALID);
    }
    Ok(Plan {
        direction,
        length: length as u32,
        placement,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_with(sgl: SglDescriptor) -> Sqe {
        let mut s = Sqe::new(0x01, 1, 1);
        s.set_sgl1(sgl);
        s
    }

    /// The plan and the descriptor list it filled.
    fn plan_of(
        sqe: &Sqe,
        in_capsule: &[u8],
        limits: &Limits,
    ) -> Result<(Plan, [Keyed; MAX_KEYED]), Status> {
        let mut list = [NO_KEYED; MAX_KEYED];
        plan(sqe, in_capsule, limits, &mut list).map(|p| (p, list))
    }

    #[test]
    fn plans_and_errors() {
        let l = Limits::default();
        let (p, list) = plan_of(
            &write_with(SglDescriptor::keyed(0x1000, 4096, 9, true).unwrap()),
            &[],
            &l,
        )
        .unwrap();
        assert_eq!(p.length, 4096);
        assert_eq!(p.placement, Placement::Keyed { count: 1 });
        assert!(list[0].key == 9 && list[0].invalidate);
        // A keyed buffer wrapping past 2^64 (its second io unit's address would overflow).
        let wraps = SglDescriptor::keyed(u64::MAX - 4095, 128 * 1024, 9, false).unwrap();
        assert_eq!(
            plan_of(&write_with(wraps), &[], &l).unwrap_err(),
            generic(GenericStatus::InvalidField)
        );
        let ends_at_top = SglDescriptor::keyed(u64::MAX - 4095, 4096, 9, false).unwrap();
        assert!(plan_of(&write_with(ends_at_top), &[], &l).is_ok());
        let capsule = [0u8; 4096];
        let off = SglDescriptor::DataBlockOffset {
            offset: 0,
            length: 4096,
        };
        assert_eq!(
            plan_of(&write_with(off), &capsule, &l).unwrap().0.placement,
            Placement::InCapsule {
                offset: 0,
                length: 4096
            }
        );
        let long = SglDescriptor::DataBlockOffset {
            offset: 512,
            length: 4096,
        };
        assert_eq!(
            plan_of(&write_with(long), &capsule, &l).unwrap_err(),
            SGL_LENGTH_INVALID
        );
        let far = SglDescriptor::DataBlockOffset {
            offset: 8192,
            length: 1,
        };
        assert_eq!(
            plan_of(&write_with(far), &capsule, &l).unwrap_err(),
            generic(GenericStatus::SglOffsetInvalid)
        );
        // In-capsule data for a read makes no sense.
        let mut read = write_with(off);
        read.opcode = 0x02;
        assert_eq!(
            plan_of(&read, &capsule, &l).unwrap_err(),
            generic(GenericStatus::SglDescriptorTypeInvalid)
        );
        // Multi-descriptor: three keyed descriptors in the capsule.
        let mut list = [0u8; 48];
        for i in 0..3 {
            let d = SglDescriptor::keyed(0x1_0000 * (i + 1), 8192, i as u32, false).unwrap();
            list[16 * i as usize..16 * (i as usize + 1)].copy_from_slice(&d.to_bytes());
        }
        let seg = SglDescriptor::LastSegmentOffset {
            offset: 0,
            length: 48,
        };
        let (p, keyed) = plan_of(&write_with(seg), &list, &l).unwrap();
        assert_eq!(p.length, 3 * 8192);
        assert_eq!(p.placement, Placement::Keyed { count: 3 });
        assert_eq!(keyed[2].address, 0x3_0000);
        let too_many = SglDescriptor::LastSegmentOffset {
            offset: 0,
            length: 17 * 16,
        };
        assert_eq!(
            plan_of(&write_with(too_many), &[0u8; 17 * 16], &l).unwrap_err(),
            generic(GenericStatus::InvalidSglDescriptorCount)
        );
        // A descriptor list said to lie at the top of the address space: no overflow.
        let wrapping = SglDescriptor::LastSegmentOffset {
            offset: u64::MAX - 8,
            length: 16,
        };
        assert_eq!(
            plan_of(&write_with(wrapping), &list, &l).unwrap_err(),
            generic(GenericStatus::SglOffsetInvalid)
        );
        let mut bad = list;
        bad[15] = 0x00; // a data block, not keyed
        assert_eq!(
            plan_of(&write_with(seg), &bad, &l).unwrap_err(),
            generic(GenericStatus::SglDescriptorTypeInvalid)
        );
        let huge = SglDescriptor::keyed(0, 1 << 20, 1, false).unwrap();
        assert_eq!(
            plan_of(&write_with(huge), &[], &l).unwrap_err(),
            SGL_LENGTH_INVALID
        );
        let bucket = SglDescriptor::BitBucket { length: 10 };
        assert_eq!(
            plan_of(&write_with(bucket), &[], &l).unwrap_err(),
            generic(GenericStatus::SglDescriptorTypeInvalid)
        );
        // No data direction: nothing to move whatever SGL1 says.
        let flush = Sqe::new(0x00, 1, 1);
        assert_eq!(
            plan_of(&flush, &[], &l).unwrap().0.placement,
            Placement::None
        );
    }
}
