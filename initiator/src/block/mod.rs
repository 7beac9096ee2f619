//! A blocking block device for simple clients: read_at / write_at / flush at any byte offset
//! and length over one namespace and one I/O queue of a [`Controller`], and the block-range
//! commands (compare, write zeroes, deallocate).
//!
//! Requests are split by the largest transfer (MDTS and the host maximum) and pipelined up to
//! the queue depth (and what the queue's data region holds); unaligned edges are handled by
//! read-modify-write of the edge blocks. When the connection is lost the operation waits for
//! the controller to come back (or fails) as the reconnect policy says, then is retried whole:
//! reads and writes of the same bytes are idempotent, and so are Write Zeroes and Deallocate.

use crate::controller::Controller;
use crate::error::{Error, Result};
use crate::io::NsTarget;
use crate::queue::Fabric;
use nvmf_protocol::nvm::DSM_MAX_RANGES;

/// Blocking byte-addressed access to one namespace.
pub struct BlockDevice<F: Fabric> {
    controller: Controller<F>,
    nsid: u32,
    queue_index: usize,
}

impl<F: Fabric> std::fmt::Debug for BlockDevice<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlockDevice")
            .field("controller", &self.controller)
            .field("nsid", &self.nsid)
            .finish()
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Direction {
    Read,
    Write,
    Compare,
    WriteZeroes,
}

/// Optional NVM Command Support bits (Identify Controller ONCS).
/// Queue polls of an operation between two polls of the controller (its keep-alive).
const POLLS_PER_CONTROLLER_POLL: u32 = 256;
const ONCS_DSM: u16 = 1 << 2;
const ONCS_WRITE_ZEROES: u16 = 1 << 3;

impl<F: Fabric> BlockDevice<F> {
    /// Use namespace `nsid` of `controller` through its first I/O queue.
    pub fn new(controller: Controller<F>, nsid: u32) -> Result<Self> {
        if controller.namespace(nsid).is_none() {
            return Err(Error::InvalidArgument(format!(
                "namespace {nsid} not active"
            )));
        }
        if controller.io_queue_count() == 0 {
            return Err(Error::InvalidArgument("controller has no I/O queue".into()));
        }
        Ok(Self {
            controller,
            nsid,
            queue_index: 0,
        })
    }

    /// The controller.
    pub fn controller(&self) -> &Controller<F> {
        &self.controller
    }
    /// The controller, mutable (keep-alive polling, shutdown).
    pub fn controller_mut(&mut self) -> &mut Controller<F> {
        &mut self.controller
    }
    /// Give the controller back.
    pub fn into_controller(self) -> Controller<F> {
        self.controller
    }

    fn ns(&self) -> Result<NsTarget> {
        self.controller
            .namespace(self.nsid)
            .map(|n| n.target())
            .ok_or_else(|| Error::InvalidArgument(format!("namespace {} gone", self.nsid)))
    }

    /// Size in bytes.
    pub fn size(&self) -> u64 {
        self.ns()
            .map(|n| n.blocks.saturating_mul(u64::from(n.block_size)))
            .unwrap_or(0)
    }
    /// Block size in bytes.
    pub fn block_size(&self) -> u32 {
        self.ns().map(|n| n.block_size).unwrap_or(0)
    }

    fn check_range(&self, offset: u64, len: usize) -> Result<()> {
        let end = offset.checked_add(len as u64);
        if end.is_none_or(|e| e > self.size()) {
            return Err(Error::InvalidArgument(format!(
                "bytes {offset}+{len} beyond the namespace ({} bytes)",
                self.size()
            )));
        }
        Ok(())
    }

    /// Run `op` again after a connection loss, as the reconnect policy allows.
    fn retrying<T>(&mut self, mut op: impl FnMut(&mut Self) -> Result<T>) -> Result<T> {
        // Each call doubles as the owner's poll: keep-alive goes out while the device is used,
        // and a loss noticed there is waited out (or failed) per the policy before submitting.
        if self.controller.poll() != &crate::controller::ControllerState::Live {
            self.controller.wait_live()?;
        }
        loop {
            match op(self) {
                Err(e) if e.is_connection_loss() => {
                    self.controller.connection_lost(&e.to_string());
                    self.controller.wait_live()?;
                }
                other => return other,
            }
        }
    }

    /// Move blocks `lba..lba + blocks` between the device and the caller: for reads `sink`
    /// gets (lba, data) per finished chunk; for writes `source` fills (lba, slot) per chunk.
    fn blocks_io(
        &mut self,
        direction: Direction,
        lba: u64,
        blocks: u64,
        sink: &mut dyn FnMut(u64, &[u8]),
        source: &dyn Fn(u64, &mut [u8]),
    ) -> Result<()> {
        let ns = self.ns()?;
        let index = self.queue_index;
        // Write Zeroes moves no data, but a target may cap it (WZSL, which SPDK enforces): like
        // the Linux host without that field, it is split as a transfer would be.
        let chunk = (self.controller.io_queue_mut(index)?.limits().max_transfer as u64
            / u64::from(ns.block_size))
        .clamp(1, 0x1_0000);
        let end = lba + blocks;
        let mut next = lba;
        let mut outstanding = 0usize;
        let mut first_error: Option<Error> = None;
        let mut polls = 0u32;
        while (next < end && first_error.is_none()) || outstanding > 0 {
            polls += 1;
            if polls % POLLS_PER_CONTROLLER_POLL == 0 {
                // A long operation (a big range, a slow target) keeps the association alive:
                // the controller's poll sends the Keep Alive when it is due.
                self.controller.poll();
            }
            let queue = self.controller.io_queue_mut(index)?;
            while next < end && first_error.is_none() {
                let n = chunk.min(end - next) as u32;
                let at = next;
                let submitted = match direction {
                    Direction::Read => queue.submit_read(&ns, at, n, at),
                    Direction::Write => queue.submit_write(&ns, at, n, at, |slot| source(at, slot)),
                    Direction::Compare => {
                        queue.submit_compare(&ns, at, n, at, |slot| source(at, slot))
                    }
                    Direction::WriteZeroes => queue.submit_write_zeroes(&ns, at, n, at),
                };
                match submitted {
                    Ok(()) => {
                        outstanding += 1;
                        next += u64::from(n);
                    }
                    // Every CID, or a shared data region, is taken: wait for completions
                    // (the refused command took nothing; with none in flight it is an error).
                    Err(Error::QueueFull) if outstanding > 0 => break,
                    Err(e) => first_error = Some(e),
                }
            }
            let done = queue.poll(|c, data| {
                outstanding -= 1;
                match c.result {
                    Ok(()) if direction == Direction::Read => sink(c.token, data),
                    Ok(()) => {}
                    Err(e) => {
                        first_error.get_or_insert(e);
                    }
                }
            });
            if done == 0 && outstanding > 0 {
                std::hint::spin_loop();
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Read `buf.len()` bytes at byte `offset`.
    pub fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.check_range(offset, buf.len())?;
        if buf.is_empty() {
            return Ok(());
        }
        self.retrying(|dev| {
            let bs = u64::from(dev.block_size());
            let first = offset / bs;
            let end = (offset + buf.len() as u64).div_ceil(bs);
            let mut sink = |lba: u64, data: &[u8]| {
                // Copy the overlap of this chunk with the caller's byte range.
                let chunk_start = lba * bs;
                let chunk_end = chunk_start + data.len() as u64;
                let from = chunk_start.max(offset);
                let to = chunk_end.min(offset + buf.len() as u64);
                if from < to {
                    buf[(from - offset) as usize..(to - offset) as usize].copy_from_slice(
                        &data[(from - chunk_start) as usize..(to - chunk_start) as usize],
                    );
                }
            };
            dev.blocks_io(Direction::Read, first, end - first, &mut sink, &|_, _| {})
        })
    }

    /// Write `data` at byte `offset` (edge blocks read, patched and written back).
    pub fn write_at(&mut self, offset: u64, data: &[u8]) -> Result<()> {
        self.check_range(offset, data.len())?;
        if data.is_empty() {
            return Ok(());
        }
        self.retrying(|dev| {
            let bs = u64::from(dev.block_size());
            let end_byte = offset + data.len() as u64;
            let first = offset / bs;
            let end = end_byte.div_ceil(bs);
            // Old contents of the partial edge blocks (none when aligned).
            let mut head = Vec::new();
            let mut tail = Vec::new();
            if offset % bs != 0 {
                head = vec![0u8; bs as usize];
                dev.read_blocks_into(first, &mut head)?;
            }
            if end_byte % bs != 0 && (end - 1 != first || head.is_empty()) {
                tail = vec![0u8; bs as usize];
                dev.read_blocks_into(end - 1, &mut tail)?;
            }
            let source = |lba: u64, slot: &mut [u8]| {
                for (i, block) in slot.chunks_exact_mut(bs as usize).enumerate() {
                    let b = lba + i as u64;
                    let block_start = b * bs;
                    let old: &[u8] = if b == first && !head.is_empty() {
                        &head
                    } else if b == end - 1 && !tail.is_empty() {
                        &tail
                    } else {
                        &[]
                    };
                    if !old.is_empty() {
                        block.copy_from_slice(old);
                    }
                    let from = block_start.max(offset);
                    let to = (block_start + bs).min(end_byte);
                    block[(from - block_start) as usize..(to - block_start) as usize]
                        .copy_from_slice(&data[(from - offset) as usize..(to - offset) as usize]);
                }
            };
            dev.blocks_io(
                Direction::Write,
                first,
                end - first,
                &mut |_, _| {},
                &source,
            )
        })
    }

    fn read_blocks_into(&mut self, lba: u64, out: &mut [u8]) -> Result<()> {
        let mut sink = |_: u64, data: &[u8]| out.copy_from_slice(&data[..out.len()]);
        self.blocks_io(Direction::Read, lba, 1, &mut sink, &|_, _| {})
    }

    /// Compare whole blocks at `lba` with `data` (a multiple of the block size): `Ok(false)`
    /// when the controller reports Compare Failure.
    pub fn compare_blocks(&mut self, lba: u64, data: &[u8]) -> Result<bool> {
        let bs = u64::from(self.block_size());
        if bs == 0 || data.is_empty() || data.len() as u64 % bs != 0 {
            return Err(Error::InvalidArgument(format!(
                "compare needs whole {bs}-byte blocks"
            )));
        }
        self.check_range(lba.saturating_mul(bs), data.len())?;
        let blocks = data.len() as u64 / bs;
        let source = |at: u64, slot: &mut [u8]| {
            let from = ((at - lba) * bs) as usize;
            slot.copy_from_slice(&data[from..from + slot.len()]);
        };
        let result = self.retrying(|dev| {
            dev.blocks_io(Direction::Compare, lba, blocks, &mut |_, _| {}, &source)
        });
        match result {
            Ok(()) => Ok(true),
            Err(Error::Nvme { status, .. })
                if status.code
                    == nvmf_protocol::StatusCode::Media(
                        nvmf_protocol::status::MediaStatus::CompareFailure,
                    ) =>
            {
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    /// Refuses a command the controller does not claim (ONCS): a clear error here instead of
    /// an Invalid Opcode status from the target.
    fn supported(&self, bit: u16, command: &str) -> Result<()> {
        if self.controller.identify().oncs & bit == 0 {
            return Err(Error::InvalidArgument(format!(
                "the controller does not support {command} (Identify Controller ONCS {:#06x})",
                self.controller.identify().oncs
            )));
        }
        Ok(())
    }

    /// Refuses blocks `lba..lba + blocks` unless the namespace holds them all.
    fn check_blocks(&self, lba: u64, blocks: u64) -> Result<()> {
        let total = self.ns()?.blocks;
        if blocks == 0 {
            return Err(Error::InvalidArgument(format!(
                "blocks {lba}+0: a range needs at least one block"
            )));
        }
        if lba.checked_add(blocks).is_none_or(|end| end > total) {
            return Err(Error::InvalidArgument(format!(
                "blocks {lba}+{blocks} end past the namespace's {total} blocks"
            )));
        }
        Ok(())
    }

    /// Zero blocks `lba..lba + blocks` with Write Zeroes commands, no data sent; split by the
    /// largest transfer (see `blocks_io`) and pipelined.
    pub fn write_zeroes(&mut self, lba: u64, blocks: u64) -> Result<()> {
        self.supported(ONCS_WRITE_ZEROES, "Write Zeroes")?;
        self.check_blocks(lba, blocks)?;
        self.retrying(|dev| {
            dev.blocks_io(
                Direction::WriteZeroes,
                lba,
                blocks,
                &mut |_, _| {},
                &|_, _| {},
            )
        })
    }

    /// Deallocate (Dataset Management, AD) the block ranges `(lba, blocks)`: the namespace may
    /// then read them back as its DLFEAT says (zeroes on nvmf-tgt). A range longer than a DSM
    /// range holds is split; one command carries up to 256 ranges, one command at a time.
    pub fn deallocate(&mut self, ranges: &[(u64, u64)]) -> Result<()> {
        self.supported(ONCS_DSM, "Dataset Management")?;
        if ranges.is_empty() {
            return Err(Error::InvalidArgument("no range to deallocate".into()));
        }
        for &(lba, blocks) in ranges {
            self.check_blocks(lba, blocks)?;
        }
        let mut pieces: Vec<(u64, u32)> = Vec::new();
        for &(lba, blocks) in ranges {
            let mut at = lba;
            let end = lba + blocks;
            while at < end {
                let n = (end - at).min(u64::from(u32::MAX)) as u32;
                pieces.push((at, n));
                at += u64::from(n);
            }
        }
        self.retrying(|dev| {
            let ns = dev.ns()?;
            let index = dev.queue_index;
            let queue = dev.controller.io_queue_mut(index)?;
            for command in pieces.chunks(DSM_MAX_RANGES) {
                queue.submit_deallocate(&ns, command, 0)?;
                only_completion(queue)?;
            }
            Ok(())
        })
    }

    /// Flush the namespace's volatile write cache.
    pub fn flush(&mut self) -> Result<()> {
        self.retrying(|dev| {
            let nsid = dev.nsid;
            let index = dev.queue_index;
            let queue = dev.controller.io_queue_mut(index)?;
            queue.submit_flush(nsid, 0)?;
            only_completion(queue)
        })
    }
}

/// Waits for the one command in flight on `queue` and returns its result.
fn only_completion<Q: crate::queue::HostQueue>(queue: &mut crate::io::IoQueue<Q>) -> Result<()> {
    let mut result = None;
    while result.is_none() {
        if queue.poll(|c, _| result = Some(c.result)) == 0 {
            std::hint::spin_loop();
        }
    }
    result.unwrap_or(Ok(()))
}

#[cfg(test)]
mod tests;
