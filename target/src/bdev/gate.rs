//! [`GateBdev`]: a block device whose I/O stays in flight until its gate opens. For tests
//! that need "the qpair died (or was reset, or aborted) while its block I/O was in flight"
//! deterministically, in this crate's and in the end-to-end tests. Not configurable from TOML.
//! No data is stored: reads return the buffer untouched. Its I/O can also be made to fail
//! (`failing`: EIO at completion), for the error paths of block I/O that completes later.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use super::{Bdev, BdevChannel, BdevError, BdevInfo, BdevOp, IoBuf, IoStatus, Submitted};

/// I/O completes (with success) only on a poll after the shared flag is set.
pub struct GateBdev {
    info: BdevInfo,
    open: Arc<AtomicBool>,
    /// I/O completed so far (reaped by a poll).
    pub reaped: Arc<AtomicUsize>,
    /// Writes, zeroings and deallocations submitted to be durable at completion (forced unit
    /// access, or the write cache disabled).
    pub fua_writes: Arc<AtomicUsize>,
    /// While set, I/O completes with EIO.
    pub failing: Arc<AtomicBool>,
}

impl GateBdev {
    /// `blocks` of 512 bytes; I/O waits while `open` is false.
    pub fn new(name: &str, blocks: u64, open: Arc<AtomicBool>) -> GateBdev {
        GateBdev {
            info: BdevInfo {
                name: name.into(),
                block_size: 512,
                num_blocks: blocks,
                volatile_cache: false,
            },
            open,
            reaped: Arc::new(AtomicUsize::new(0)),
            fua_writes: Arc::new(AtomicUsize::new(0)),
            failing: Arc::new(AtomicBool::new(false)),
        }
    }
}

impl Bdev for GateBdev {
    fn info(&self) -> &BdevInfo {
        &self.info
    }
    fn open_channel(&self) -> Result<Box<dyn BdevChannel>, BdevError> {
        Ok(Box::new(GateChannel {
            open: self.open.clone(),
            reaped: self.reaped.clone(),
            fua_writes: self.fua_writes.clone(),
            failing: self.failing.clone(),
            tags: Vec::new(),
        }))
    }
}

struct GateChannel {
    open: Arc<AtomicBool>,
    reaped: Arc<AtomicUsize>,
    fua_writes: Arc<AtomicUsize>,
    failing: Arc<AtomicBool>,
    tags: Vec<u64>,
}

impl BdevChannel for GateChannel {
    fn submit(&mut self, op: BdevOp<'_>, _data: &mut IoBuf<'_, '_>, tag: u64) -> Submitted {
        if let BdevOp::WriteFua { .. }
        | BdevOp::WriteZeroes { fua: true, .. }
        | BdevOp::Deallocate { fua: true, .. } = op
        {
            self.fua_writes.fetch_add(1, Ordering::AcqRel);
        }
        self.tags.push(tag);
        Submitted::Queued
    }
    fn poll(&mut self, done: &mut dyn FnMut(u64, IoStatus)) -> usize {
        if !self.open.load(Ordering::Acquire) {
            return 0;
        }
        let n = self.tags.len();
        let status = if self.failing.load(Ordering::Acquire) {
            IoStatus::Failed(libc::EIO)
        } else {
            IoStatus::Success
        };
        for tag in self.tags.drain(..) {
            done(tag, status);
        }
        self.reaped.fetch_add(n, Ordering::AcqRel);
        n
    }
    fn in_flight(&self) -> usize {
        self.tags.len()
    }
}
