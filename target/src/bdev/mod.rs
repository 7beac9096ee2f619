//! Block devices behind one trait: null, malloc and file (io_uring).
//!
//! - [`Bdev`]: the device, shared by every reactor (`Send + Sync`, control path): its geometry
//!   and [`Bdev::open_channel`].
//! - [`BdevChannel`]: one reactor's handle on a device, owned by that reactor alone. I/O is
//!   submitted and completed on it: [`BdevChannel::submit`] answers at once
//!   ([`Submitted::Done`]) or later ([`Submitted::Queued`]), and [`BdevChannel::poll`] reaps the
//!   later ones on the same reactor. No lock, no thread and no allocation per I/O.
//! - [`IoBuf`]: the command's data, in memory the transport owns (see `iobuf.rs` for the
//!   lending contract that asynchronous devices rely on).
//!
//! Files: `null.rs`, `malloc.rs`, `gate.rs` (holds I/O until told: for tests), `file.rs` (the only module of the crate allowed `unsafe`: it
//! hands buffer addresses to the kernel), `iobuf.rs`.

mod file;
pub mod gate;
mod iobuf;
mod malloc;
mod null;

use std::sync::Arc;

pub use file::FileBdev;
pub use iobuf::{IoBuf, MAX_SEGMENTS};
pub use malloc::MallocBdev;
pub use null::NullBdev;

use crate::config::{BdevConfig, BdevKind};

/// Geometry and capabilities of a device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BdevInfo {
    /// Name from the configuration.
    pub name: String,
    /// Bytes per block (512 or 4096).
    pub block_size: u32,
    /// Number of blocks.
    pub num_blocks: u64,
    /// Writes may sit in a volatile cache until a flush (file without O_DIRECT, and the
    /// device cache behind O_DIRECT): Identify reports VWC present.
    pub volatile_cache: bool,
}

impl BdevInfo {
    /// True when `blocks` blocks from `lba` lie inside the device (and `blocks` > 0).
    pub fn in_range(&self, lba: u64, blocks: u64) -> bool {
        blocks > 0
            && lba
                .checked_add(blocks)
                .is_some_and(|end| end <= self.num_blocks)
    }
}

/// One block range (deallocate lists).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockRange {
    /// First block.
    pub lba: u64,
    /// Number of blocks.
    pub blocks: u32,
}

/// What to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BdevOp<'r> {
    /// Read `blocks` blocks at `lba` into the buffer.
    Read {
        /// First block.
        lba: u64,
        /// Block count.
        blocks: u32,
    },
    /// Write the buffer to `blocks` blocks at `lba`.
    Write {
        /// First block.
        lba: u64,
        /// Block count.
        blocks: u32,
    },
    /// Write with Force Unit Access: durable when it completes.
    WriteFua {
        /// First block.
        lba: u64,
        /// Block count.
        blocks: u32,
    },
    /// Compare the buffer with `blocks` blocks at `lba`.
    Compare {
        /// First block.
        lba: u64,
        /// Block count.
        blocks: u32,
    },
    /// Zero `blocks` blocks at `lba`.
    WriteZeroes {
        /// First block.
        lba: u64,
        /// Block count.
        blocks: u32,
        /// Durable when it completes (FUA asked, or the write cache disabled).
        fua: bool,
    },
    /// Deallocate the ranges (later reads return zeroes).
    Deallocate {
        /// The ranges, checked whole before any changes.
        ranges: &'r [BlockRange],
        /// Durable when it completes (the write cache disabled, or Write Zeroes' FUA).
        fua: bool,
    },
    /// Make every completed write durable.
    Flush,
}

/// How an I/O ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoStatus {
    /// Done.
    Success,
    /// Compare found a difference.
    CompareMismatch,
    /// The blocks lie (partly) outside the device.
    OutOfRange,
    /// The buffer is shorter than the blocks.
    ShortBuffer,
    /// The device failed with this errno.
    Failed(i32),
}

/// Answer of [`BdevChannel::submit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Submitted {
    /// Finished during the call.
    Done(IoStatus),
    /// In flight; [`BdevChannel::poll`] reports it with its tag.
    Queued,
}

/// Why a device could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum BdevError {
    /// Configuration inconsistent (should have been caught by validation).
    #[error("bdev {name}: {message}")]
    Config {
        /// Device name.
        name: String,
        /// What.
        message: String,
    },
    /// An OS call failed. The OS error is part of the message and not a `source` as well:
    /// a report printing the chain (anyhow's `{:#}`) said it twice.
    #[error("bdev {name}: {what}: {error}")]
    Io {
        /// Device name.
        name: String,
        /// Which step, naming the file where there is one.
        what: String,
        /// The error.
        error: std::io::Error,
    },
}

/// A block device, shared by all reactors.
pub trait Bdev: Send + Sync {
    /// Geometry.
    fn info(&self) -> &BdevInfo;
    /// A channel for the calling reactor.
    fn open_channel(&self) -> Result<Box<dyn BdevChannel>, BdevError>;
}

/// One reactor's handle on a device. Only its reactor calls it.
pub trait BdevChannel: Send {
    /// Start `op` on `data`; `tag` comes back from [`BdevChannel::poll`] when the answer is
    /// [`Submitted::Queued`]. For `Queued`, `data`'s memory is lent until then (see
    /// [`IoBuf`]).
    fn submit(&mut self, op: BdevOp<'_>, data: &mut IoBuf<'_, '_>, tag: u64) -> Submitted;
    /// Reap finished I/O: `done(tag, status)` for each; returns how many.
    fn poll(&mut self, done: &mut dyn FnMut(u64, IoStatus)) -> usize;
    /// I/O submitted and not yet reaped.
    fn in_flight(&self) -> usize;
}

/// Bytes `blocks` blocks of `info` take, if `data` holds them; else the status to answer.
pub(crate) fn check_io(
    info: &BdevInfo,
    lba: u64,
    blocks: u32,
    data_len: usize,
) -> Result<usize, IoStatus> {
    if !info.in_range(lba, u64::from(blocks)) {
        return Err(IoStatus::OutOfRange);
    }
    let bytes = blocks as usize * info.block_size as usize;
    if data_len < bytes {
        return Err(IoStatus::ShortBuffer);
    }
    Ok(bytes)
}

/// Open the device a `[[bdev]]` entry describes (files are created or extended as asked).
pub fn open(config: &BdevConfig) -> Result<Arc<dyn Bdev>, BdevError> {
    let name = config.name.get_ref().clone();
    let block_size = *config.block_size.get_ref();
    let size = config.size.as_ref().map(|s| *s.get_ref());
    Ok(match *config.kind.get_ref() {
        BdevKind::Null => Arc::new(NullBdev::new(&name, block_size, size.unwrap_or(0))?),
        BdevKind::Malloc => Arc::new(MallocBdev::new(&name, block_size, size.unwrap_or(0))?),
        BdevKind::File => {
            let path = config.path.as_ref().ok_or_else(|| BdevError::Config {
                name: name.clone(),
                message: "no path".into(),
            })?;
            Arc::new(FileBdev::open(
                &name,
                path.get_ref(),
                block_size,
                size,
                config.direct(),
            )?)
        }
    })
}

/// Geometry of a null or malloc device from its size.
pub(crate) fn geometry(name: &str, block_size: u32, size: u64) -> Result<BdevInfo, BdevError> {
    if !(block_size == 512 || block_size == 4096) || size == 0 || size % u64::from(block_size) != 0
    {
        return Err(BdevError::Config {
            name: name.to_owned(),
            message: format!("size {size} / block size {block_size} invalid"),
        });
    }
    Ok(BdevInfo {
        name: name.to_owned(),
        block_size,
        num_blocks: size / u64::from(block_size),
        volatile_cache: false,
    })
}

#[cfg(test)]
pub(crate) mod testing {
    //! Helpers the device tests share.
    use super::*;

    /// Submit and, if queued, poll until done.
    pub fn run(ch: &mut dyn BdevChannel, op: BdevOp<'_>, data: &mut [u8]) -> IoStatus {
        run_segments(ch, op, &mut [data])
    }

    /// `run` with the data in `segs`, in transfer order (a poll group's data buffers).
    pub fn run_segments(
        ch: &mut dyn BdevChannel,
        op: BdevOp<'_>,
        segs: &mut [&mut [u8]],
    ) -> IoStatus {
        let mut buf = IoBuf::new(segs);
        match ch.submit(op, &mut buf, 7) {
            Submitted::Done(s) => s,
            Submitted::Queued => {
                let mut out = None;
                while out.is_none() {
                    ch.poll(&mut |tag, s| {
                        assert_eq!(tag, 7);
                        out = Some(s);
                    });
                }
                assert_eq!(ch.in_flight(), 0);
                out.unwrap_or(IoStatus::Failed(0))
            }
        }
    }

    /// The behaviour every device with storage shares.
    pub fn exercise_storage(bdev: &dyn Bdev) {
        let bs = bdev.info().block_size as usize;
        let last = bdev.info().num_blocks - 1;
        let mut ch = bdev.open_channel().unwrap();
        let ch = ch.as_mut();
        let pattern: Vec<u8> = (0..2 * bs).map(|i| (i * 7 + 3) as u8).collect();
        let mut data = pattern.clone();
        assert_eq!(
            run(ch, BdevOp::Write { lba: 2, blocks: 2 }, &mut data),
            IoStatus::Success
        );
        let mut back = vec![0u8; 2 * bs];
        assert_eq!(
            run(ch, BdevOp::Read { lba: 2, blocks: 2 }, &mut back),
            IoStatus::Success
        );
        assert_eq!(back, pattern);
        assert_eq!(
            run(ch, BdevOp::Compare { lba: 2, blocks: 2 }, &mut back),
            IoStatus::Success
        );
        back[bs + 5] ^= 1;
        assert_eq!(
            run(ch, BdevOp::Compare { lba: 2, blocks: 2 }, &mut back),
            IoStatus::CompareMismatch
        );
        assert_eq!(
            run(
                ch,
                BdevOp::WriteZeroes {
                    lba: 3,
                    blocks: 1,
                    fua: false
                },
                &mut []
            ),
            IoStatus::Success
        );
        assert_eq!(
            run(ch, BdevOp::Read { lba: 2, blocks: 2 }, &mut back),
            IoStatus::Success
        );
        assert_eq!(back[..bs], pattern[..bs]);
        assert!(back[bs..].iter().all(|b| *b == 0));
        let ranges = [BlockRange { lba: 2, blocks: 1 }];
        assert_eq!(
            run(
                ch,
                BdevOp::Deallocate {
                    ranges: &ranges,
                    fua: false
                },
                &mut []
            ),
            IoStatus::Success
        );
        assert_eq!(
            run(ch, BdevOp::Read { lba: 2, blocks: 1 }, &mut back),
            IoStatus::Success
        );
        assert!(back[..bs].iter().all(|b| *b == 0));
        assert_eq!(run(ch, BdevOp::Flush, &mut []), IoStatus::Success);
        let mut fua = pattern.clone();
        assert_eq!(
            run(ch, BdevOp::WriteFua { lba: 4, blocks: 2 }, &mut fua),
            IoStatus::Success
        );
        assert_eq!(
            run(ch, BdevOp::Read { lba: 4, blocks: 2 }, &mut fua),
            IoStatus::Success
        );
        assert_eq!(fua, pattern);
        // The last block is usable; one past it is not.
        let mut one = vec![9u8; bs];
        assert_eq!(
            run(
                ch,
                BdevOp::Write {
                    lba: last,
                    blocks: 1
                },
                &mut one
            ),
            IoStatus::Success
        );
        assert_eq!(
            run(
                ch,
                BdevOp::Read {
                    lba: last,
                    blocks: 2
                },
                &mut back
            ),
            IoStatus::OutOfRange
        );
        assert_eq!(
            run(
                ch,
                BdevOp::Write {
                    lba: last + 1,
                    blocks: 1
                },
                &mut one
            ),
            IoStatus::OutOfRange
        );
        assert_eq!(
            run(
                ch,
                BdevOp::Read {
                    lba: u64::MAX,
                    blocks: 1
                },
                &mut one
            ),
            IoStatus::OutOfRange
        );
        assert_eq!(
            run(ch, BdevOp::Read { lba: 0, blocks: 2 }, &mut one),
            IoStatus::ShortBuffer
        );
        let bad = [BlockRange {
            lba: last,
            blocks: 2,
        }];
        assert_eq!(
            run(
                ch,
                BdevOp::Deallocate {
                    ranges: &bad,
                    fua: false
                },
                &mut []
            ),
            IoStatus::OutOfRange
        );
    }
}
