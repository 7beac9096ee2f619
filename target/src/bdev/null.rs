//! The null device: stores nothing. Writes are discarded, reads return zeroes, compares
//! compare against zeroes; every I/O completes during `submit`.

use super::{
    Bdev, BdevChannel, BdevError, BdevInfo, BdevOp, IoBuf, IoStatus, Submitted, check_io, geometry,
};

/// A null device.
pub struct NullBdev {
    info: BdevInfo,
}

impl NullBdev {
    /// `size` bytes of `block_size` blocks.
    pub fn new(name: &str, block_size: u32, size: u64) -> Result<NullBdev, BdevError> {
        Ok(NullBdev {
            info: geometry(name, block_size, size)?,
        })
    }
}

impl Bdev for NullBdev {
    fn info(&self) -> &BdevInfo {
        &self.info
    }
    fn open_channel(&self) -> Result<Box<dyn BdevChannel>, BdevError> {
        Ok(Box::new(NullChannel {
            info: self.info.clone(),
        }))
    }
}

struct NullChannel {
    info: BdevInfo,
}

impl NullChannel {
    fn run(&self, op: BdevOp<'_>, data: &mut IoBuf<'_, '_>) -> Result<(), IoStatus> {
        match op {
            BdevOp::Read { lba, blocks } => {
                let n = check_io(&self.info, lba, blocks, data.len())?;
                data.zero(n);
            }
            BdevOp::Write { lba, blocks } | BdevOp::WriteFua { lba, blocks } => {
                check_io(&self.info, lba, blocks, data.len())?;
            }
            BdevOp::Compare { lba, blocks } => {
                let n = check_io(&self.info, lba, blocks, data.len())?;
                let mut left = n;
                for seg in data.segments() {
                    let k = seg.len().min(left);
                    if seg[..k].iter().any(|b| *b != 0) {
                        return Err(IoStatus::CompareMismatch);
                    }
                    left -= k;
                }
            }
            BdevOp::WriteZeroes { lba, blocks, .. } => {
                check_io(&self.info, lba, blocks, usize::MAX)?;
            }
            BdevOp::Deallocate { ranges, .. } => {
                for r in ranges {
                    check_io(&self.info, r.lba, r.blocks, usize::MAX)?;
                }
            }
            BdevOp::Flush => {}
        }
        Ok(())
    }
}

impl BdevChannel for NullChannel {
    fn submit(&mut self, op: BdevOp<'_>, data: &mut IoBuf<'_, '_>, _tag: u64) -> Submitted {
        Submitted::Done(self.run(op, data).err().unwrap_or(IoStatus::Success))
    }
    fn poll(&mut self, _done: &mut dyn FnMut(u64, IoStatus)) -> usize {
        0
    }
    fn in_flight(&self) -> usize {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::run;
    use super::*;

    #[test]
    fn null_reads_zeroes_and_checks_range() {
        let b = NullBdev::new("n", 512, 4096).unwrap();
        assert_eq!(b.info().num_blocks, 8);
        let mut ch = b.open_channel().unwrap();
        let mut data = vec![5u8; 1024];
        assert_eq!(
            run(ch.as_mut(), BdevOp::Write { lba: 0, blocks: 2 }, &mut data),
            IoStatus::Success
        );
        assert_eq!(
            run(ch.as_mut(), BdevOp::Read { lba: 6, blocks: 2 }, &mut data),
            IoStatus::Success
        );
        assert!(data.iter().all(|b| *b == 0));
        assert_eq!(
            run(
                ch.as_mut(),
                BdevOp::Compare { lba: 0, blocks: 2 },
                &mut data
            ),
            IoStatus::Success
        );
        data[3] = 1;
        assert_eq!(
            run(
                ch.as_mut(),
                BdevOp::Compare { lba: 0, blocks: 2 },
                &mut data
            ),
            IoStatus::CompareMismatch
        );
        assert_eq!(
            run(ch.as_mut(), BdevOp::Read { lba: 7, blocks: 2 }, &mut data),
            IoStatus::OutOfRange
        );
        assert_eq!(
            run(
                ch.as_mut(),
                BdevOp::WriteZeroes {
                    lba: 8,
                    blocks: 1,
                    fua: false,
                },
                &mut []
            ),
            IoStatus::OutOfRange
        );
        assert_eq!(run(ch.as_mut(), BdevOp::Flush, &mut []), IoStatus::Success);
        assert!(NullBdev::new("n", 1000, 4000).is_err());
    }
}
