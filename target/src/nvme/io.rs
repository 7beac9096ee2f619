//! NVM commands (Read, Write, Compare, Flush, Write Zeroes, Dataset Management) and
//! [`ReactorIo`], what one reactor needs to run them: a channel per block device opened on
//! that reactor, the in-flight table that maps a block-device completion back to its command,
//! and the reactor's counters.
//!
//! The fast path: namespace lookup in the queue's own table snapshot, checks (namespace, MDTS,
//! LBA range, SGL length), one `submit` on this reactor's channel, and for asynchronous devices
//! one slab entry. No lock, no allocation once the slab has grown to the reactor's depth.

use std::sync::Arc;

use nvmf_protocol::nvm::{DSM_RANGE_SIZE, DsmRange};
use nvmf_protocol::{Cqe, IoOpcode, Sqe};
use slab::Slab;

use crate::bdev::{BdevChannel, BdevOp, BlockRange, IoBuf, IoStatus, Submitted};

use super::Exec;
use super::controller::Controller;
use super::counters::IoCounters;
use super::queue::Queue;
use super::status::{self, *};
use super::target::Target;

/// What the I/O path needs of a namespace (copied out of the table, no reference counting).
#[derive(Debug, Clone, Copy)]
pub(super) struct NsIo {
    pub bdev_index: usize,
    pub block_size: u32,
    pub num_blocks: u64,
}

/// A command waiting for its block device.
struct InFlight {
    tag: u64,
    cid: u16,
    sqid: u16,
    sqhd: u16,
    kind: IoKind,
    queue_slot: usize,
    /// A flush the target issued itself (controller shutdown): no CQE, the controller counts it.
    shutdown_of: Option<Arc<Controller>>,
}

/// One reactor's I/O context. See the module documentation.
pub struct ReactorIo {
    target: Arc<Target>,
    channels: Vec<Option<Box<dyn BdevChannel>>>,
    in_flight: Slab<InFlight>,
    queues: Slab<Arc<IoCounters>>,
    counters: Arc<IoCounters>,
}

impl ReactorIo {
    /// A context for the calling reactor.
    pub fn new(target: Arc<Target>) -> ReactorIo {
        ReactorIo {
            target,
            channels: Vec::new(),
            in_flight: Slab::new(),
            queues: Slab::new(),
            counters: Arc::new(IoCounters::default()),
        }
    }

    /// This reactor's counters (all its queues).
    pub fn counters(&self) -> &Arc<IoCounters> {
        &self.counters
    }

    /// Commands waiting for a block device.
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// Keep `c` for a new queue; forgets queues that are gone (only this table holds their
    /// counters and nothing of theirs is in flight).
    pub(super) fn register_queue(&mut self, c: Arc<IoCounters>) -> usize {
        self.queues
            .retain(|_, q| Arc::strong_count(q) > 1 || q.snapshot().in_flight > 0);
        self.queues.insert(c)
    }

    /// Whether bdev `index` has a channel on this reactor, opened on first use. The open one
    /// is checked inline (every I/O asks); opening is the call.
    #[inline]
    fn has_channel(&mut self, index: usize) -> bool {
        matches!(self.channels.get(index), Some(Some(_))) || self.channel(index).is_some()
    }

    #[cold]
    fn channel(&mut self, index: usize) -> Option<&mut Box<dyn BdevChannel>> {
        if self.channels.len() <= index {
            self.channels.resize_with(index + 1, || None);
        }
        if self.channels[index].is_none() {
            // First I/O to this device on this reactor: control-path work, once.
            let bdev = self.target.bdev(index)?;
            match bdev.open_channel() {
                Ok(ch) => self.channels[index] = Some(ch),
                Err(e) => {
                    tracing::error!("opening a channel: {e}");
                    return None;
                }
            }
        }
        self.channels[index].as_mut()
    }

    /// Submit `op` for a queue; the CQE now, or Pending.
    fn submit(
        &mut self,
        ns: NsIo,
        op: BdevOp<'_>,
        data: &mut IoBuf<'_, '_>,
        pending: InFlight,
        queue: &Arc<IoCounters>,
    ) -> Exec {
        let slot = self.in_flight.vacant_entry();
        let key = slot.key();
        let Some(ch) = self
            .channels
            .get_mut(ns.bdev_index)
            .and_then(|c| c.as_mut())
        else {
            return Exec::Done(Cqe::error(
                pending.cid,
                pending.sqid,
                pending.sqhd,
                INTERNAL_ERROR,
            ));
        };
        match ch.submit(op, data, key as u64) {
            Submitted::Done(s) => {
                let st = status::from_io(s, pending.kind);
                if !st.is_success() {
                    queue.error();
                    self.counters.error();
                }
                Exec::Done(Cqe::error(pending.cid, pending.sqid, pending.sqhd, st))
            }
            Submitted::Queued => {
                queue.begin();
                self.counters.begin();
                slot.insert(pending);
                Exec::Pending
            }
        }
    }

    /// Start a flush of bdev `index` for `controller`'s shutdown; true when it is in flight
    /// (its completion is counted by the controller, never reported as a CQE).
    pub(super) fn flush_for_shutdown(
        &mut self,
        index: usize,
        controller: &Arc<Controller>,
    ) -> bool {
        // A reactor that never wrote through this device still flushes it: other reactors'
        // writes reach the same file, and a flush on any descriptor covers them.
        if !self.has_channel(index) {
            return false;
        }
        let slot = self.in_flight.vacant_entry();
        let key = slot.key();
        let Some(ch) = self.channels.get_mut(index).and_then(|c| c.as_mut()) else {
            return false;
        };
        match ch.submit(BdevOp::Flush, &mut IoBuf::empty(), key as u64) {
            Submitted::Done(s) => {
                if s != IoStatus::Success {
                    tracing::error!(cntlid = controller.cntlid, ?s, "shutdown flush failed");
                }
                false
            }
            Submitted::Queued => {
                slot.insert(InFlight {
                    tag: 0,
                    cid: 0,
                    sqid: 0,
                    sqhd: 0,
                    kind: IoKind::Flush,
                    queue_slot: usize::MAX,
                    shutdown_of: Some(controller.clone()),
                });
                true
            }
        }
    }

    /// Reap block-device completions of every queue on this reactor: `out(tag, cqe)`.
    pub fn poll(&mut self, out: &mut dyn FnMut(u64, Cqe)) -> usize {
        if self.in_flight.is_empty() {
            return 0;
        }
        let ReactorIo {
            channels,
            in_flight,
            queues,
            counters,
            ..
        } = self;
        let mut n = 0;
        for ch in channels.iter_mut().flatten() {
            if ch.in_flight() == 0 {
                continue;
            }
            n += ch.poll(&mut |key, s| {
                let Some(f) = in_flight.try_remove(key as usize) else {
                    return;
                };
                if let Some(c) = f.shutdown_of {
                    if s != IoStatus::Success {
                        tracing::error!(cntlid = c.cntlid, ?s, "shutdown flush failed");
                    }
                    c.shutdown_flushed();
                    return;
                }
                let st = status::from_io(s, f.kind);
                counters.end();
                if let Some(q) = queues.get(f.queue_slot) {
                    q.end();
                    if !st.is_success() {
                        q.error();
                    }
                }
                if !st.is_success() {
                    counters.error();
                }
                out(f.tag, Cqe::error(f.cid, f.sqid, f.sqhd, st));
            });
        }
        n
    }
}

impl Queue {
    pub(super) fn nvm(
        &mut self,
        io: &mut ReactorIo,
        c: &Controller,
        sqe: &Sqe,
        data: &mut IoBuf<'_, '_>,
        tag: u64,
    ) -> Exec {
        let op = IoOpcode::from_raw(sqe.opcode);
        if !matches!(
            op,
            IoOpcode::Read
                | IoOpcode::Write
                | IoOpcode::Compare
                | IoOpcode::Flush
                | IoOpcode::WriteZeroes
                | IoOpcode::DatasetManagement
        ) {
            return Exec::Done(self.error(sqe, INVALID_OPCODE));
        }
        let Some(ns) = self.namespace(c, sqe.nsid) else {
            return Exec::Done(self.error(sqe, INVALID_NAMESPACE));
        };
        if !io.has_channel(ns.bdev_index) {
            return Exec::Done(self.error(sqe, INTERNAL_ERROR));
        }
        let (sqid, sqhd, queue_slot) = (self.sqid(), self.sqhd, self.counters_slot());
        let pending = |kind| InFlight {
            tag,
            cid: sqe.cid,
            sqid,
            sqhd,
            kind,
            queue_slot,
            shutdown_of: None,
        };
        // SLBA in CDW10/11 and NLB (0's based) in CDW12 bits 15:0, for every command with a range.
        let lba = u64::from(sqe.cdw10) | (u64::from(sqe.cdw11) << 32);
        let blocks = (sqe.cdw12 & 0xFFFF) + 1;
        // Other CDW12 bits (FUA, LR, PRINFO, DEAC) are flags, not part of NLB.
        let in_range = lba
            .checked_add(u64::from(blocks))
            .is_some_and(|end| end <= ns.num_blocks);
        let bytes = u64::from(blocks) * u64::from(ns.block_size);
        let counters = &self.counters;
        match op {
            IoOpcode::Read | IoOpcode::Write | IoOpcode::Compare => {
                if bytes > u64::from(self.target.limits().max_io_size) {
                    return Exec::Done(self.error(sqe, INVALID_FIELD));
                }
                if !in_range {
                    return Exec::Done(self.error(sqe, LBA_OUT_OF_RANGE));
                }
                if let Err(cqe) = self.data_length(sqe, data, bytes) {
                    return Exec::Done(cqe);
                }
                let (bop, kind) = match op {
                    IoOpcode::Read => {
                        counters.read(bytes);
                        io.counters.read(bytes);
                        (BdevOp::Read { lba, blocks }, IoKind::Read)
                    }
                    IoOpcode::Write => {
                        counters.write(bytes);
                        io.counters.write(bytes);
                        // FUA (CDW12 bit 30), or the write cache disabled: durable at
                        // completion.
                        let op = if sqe.cdw12 & (1 << 30) != 0 || !c.write_cache_enabled() {
                            BdevOp::WriteFua { lba, blocks }
                        } else {
                            BdevOp::Write { lba, blocks }
                        };
                        (op, IoKind::Write)
                    }
                    _ => {
                        counters.read(bytes);
                        io.counters.read(bytes);
                        (BdevOp::Compare { lba, blocks }, IoKind::Read)
                    }
                };
                io.submit(ns, bop, data, pending(kind), counters)
            }
            IoOpcode::WriteZeroes => {
                counters.other();
                io.counters.other();
                if !in_range {
                    return Exec::Done(self.error(sqe, LBA_OUT_OF_RANGE));
                }
                if let Err(cqe) = self.data_length(sqe, data, 0) {
                    return Exec::Done(cqe);
                }
                // FUA (CDW12 bit 30), or the write cache disabled: durable at completion, as
                // a write.
                let fua = sqe.cdw12 & (1 << 30) != 0 || !c.write_cache_enabled();
                // DEAC (CDW12 bit 25): deallocate instead; both read back as zeroes.
                let bop = if sqe.cdw12 & (1 << 25) != 0 {
                    self.ranges.clear();
                    self.ranges.push(BlockRange { lba, blocks });
                    BdevOp::Deallocate {
                        ranges: &self.ranges,
                        fua,
                    }
                } else {
                    BdevOp::WriteZeroes { lba, blocks, fua }
                };
                io.submit(
                    ns,
                    bop,
                    &mut IoBuf::empty(),
                    pending(IoKind::Write),
                    counters,
                )
            }
            IoOpcode::Flush => {
                counters.other();
                io.counters.other();
                if let Err(cqe) = self.data_length(sqe, data, 0) {
                    return Exec::Done(cqe);
                }
                io.submit(
                    ns,
                    BdevOp::Flush,
                    &mut IoBuf::empty(),
                    pending(IoKind::Flush),
                    counters,
                )
            }
            _ => {
                counters.other();
                io.counters.other();
                let Ok(cmd) = sqe.as_dataset_management() else {
                    return Exec::Done(self.error(sqe, INVALID_FIELD));
                };
                if (data.len()) < cmd.data_len() {
                    return Exec::Done(self.error(sqe, SGL_LENGTH_INVALID));
                }
                if !cmd.ad {
                    // Only hints: nothing to do.
                    return Exec::Done(self.success(sqe, 0));
                }
                let mut raw = [0u8; nvmf_protocol::nvm::DSM_MAX_RANGES * DSM_RANGE_SIZE];
                let n = data.read_at(0, &mut raw[..cmd.data_len()]);
                let Ok(list) = DsmRange::decode_list(&raw[..n], cmd.ranges()) else {
                    return Exec::Done(self.error(sqe, INVALID_FIELD));
                };
                self.ranges.clear();
                for r in list.filter(|r| r.length > 0) {
                    let ok = r
                        .slba
                        .checked_add(u64::from(r.length))
                        .is_some_and(|end| end <= ns.num_blocks);
                    if !ok {
                        return Exec::Done(self.error(sqe, LBA_OUT_OF_RANGE));
                    }
                    self.ranges.push(BlockRange {
                        lba: r.slba,
                        blocks: r.length,
                    });
                }
                if self.ranges.is_empty() {
                    return Exec::Done(self.success(sqe, 0));
                }
                // Durable with the write cache disabled (reads of the ranges return zeroes).
                let fua = !c.write_cache_enabled();
                io.submit(
                    ns,
                    BdevOp::Deallocate {
                        ranges: &self.ranges,
                        fua,
                    },
                    &mut IoBuf::empty(),
                    pending(IoKind::Write),
                    counters,
                )
            }
        }
    }
}
