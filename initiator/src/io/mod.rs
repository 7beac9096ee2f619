//! Asynchronous I/O on one I/O queue: submit read / write / compare / flush / write zeroes /
//! deallocate with a caller token, poll for completions. Owned and polled by one reactor.
//!
//! Each in-flight command owns a piece of the queue's data region: a fixed slot per CID when
//! the region holds a largest transfer for every command, else a run sized by its transfer
//! (`data_slots.rs`); submission allocates no memory. Writes up to the in-capsule limit travel
//! in the capsule (target advertised SGLS offset support and IOCCSZ room), larger ones by
//! keyed SGL.
//! A lost connection fails every in-flight command with [`Error::ConnectionLost`]
//! at the next poll; nothing waits forever. A completion whose CID (with its generation)
//! matches nothing in flight is counted as stale and dropped.
//!
//! Read data: [`IoQueue::poll`] hands each read's data as bytes; [`IoQueue::poll_lazy`] hands
//! a [`ReadData`] that copies them out of the queue's registered region only when asked
//! (`read_data.rs` says why that is never stale or another command's).
//!
//! Time stamps (latency, timeouts): by default each submission reads the clock. A poller that
//! refills its queue once per pass calls [`IoQueue::begin_batch`] first: the submissions up to
//! the next poll (or [`IoQueue::end_batch`], which also puts them on the wire at once instead
//! of at the next poll) then share one clock read (taken at the first of them), so a command's
//! latency counts from the start of its batch, at most that batch's submit time early. A poll
//! that reaps completions reads the clock once for all of them and its timeout check, so a
//! completion counts until the poll that reaped it started delivering; a poll that finds
//! nothing reads it for the timeout check only every 64th time. Latency figures are thus exact
//! to within one pass of the poller (submit batch + delivery); a command can only look older
//! than it is by its batch's length, and a timeout fires at most 64 idle polls late. A poller
//! stepping many queues reads the clock once per pass for them all and hands that time in
//! ([`IoQueue::begin_batch_at`], [`IoQueue::poll_lazy_at`]): the same bound, one pass.

use std::time::{Duration, Instant};

use nvmf_protocol::nvm::{
    DSM_MAX_RANGES, DSM_RANGE_SIZE, DatasetManagementCmd, DsmRange, FlushCmd, ReadCmd, RwControl,
    WriteCmd, WriteZeroesCmd,
};
use nvmf_protocol::{Cqe, IoOpcode, SglDescriptor, Sqe};

use crate::admin::keyed;
use crate::cid::{CidLookup, CidTable};
use crate::clock::SharedClock;
use crate::error::{Error, Result};
use crate::queue::HostQueue;
use data_slots::DataSlots;

mod data_slots;
mod read_data;
mod ready;
pub use read_data::ReadData;
pub use ready::ReadyQueues;

/// Kinds of I/O command.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IoKind {
    /// Read.
    Read,
    /// Write.
    Write,
    /// Compare.
    Compare,
    /// Flush.
    Flush,
    /// Write Zeroes.
    WriteZeroes,
    /// Dataset Management with Deallocate.
    Deallocate,
}

impl IoKind {
    /// Command name for errors.
    pub fn name(self) -> &'static str {
        match self {
            Self::Read => "Read",
            Self::Write => "Write",
            Self::Compare => "Compare",
            Self::Flush => "Flush",
            Self::WriteZeroes => "Write Zeroes",
            Self::Deallocate => "Dataset Management",
        }
    }
}

/// The namespace facts an I/O needs (copied from [`crate::controller::Namespace`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NsTarget {
    /// Namespace id.
    pub nsid: u32,
    /// Block size in bytes.
    pub block_size: u32,
    /// Size in blocks.
    pub blocks: u64,
}

/// One finished I/O.
#[derive(Debug, Clone, PartialEq)]
pub struct IoCompletion {
    /// The caller's token.
    pub token: u64,
    /// What it was.
    pub kind: IoKind,
    /// Success, or why not.
    pub result: Result<()>,
    /// Submission to completion.
    pub latency: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Pending {
    token: u64,
    kind: IoKind,
    bytes: u32,
    /// Where its data lies in the region.
    offset: usize,
    submitted: Instant,
}

/// Counters of one I/O queue.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IoStats {
    /// Commands submitted.
    pub submitted: u64,
    /// Commands completed (any result).
    pub completed: u64,
    /// Writes sent with in-capsule data.
    pub in_capsule_writes: u64,
    /// Late or duplicate completions dropped.
    pub stale_completions: u64,
    /// Commands failed because the connection was lost.
    pub failed_by_loss: u64,
}

/// Per-queue limits fixed at connect time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IoLimits {
    /// Largest data transfer of one command (MDTS and the host's maximum).
    pub max_transfer: usize,
    /// Largest write sent in the capsule (0 = never).
    pub in_capsule: usize,
    /// Commands older than this fail the connection (0 = no timeout).
    pub timeout: Duration,
    /// Give each command's data its own key (memory window) when the queue supports it.
    pub per_io_keys: bool,
}

/// Idle polls between two clock reads for the timeout check: a reactor polls an idle queue
/// millions of times a second and a clock read costs more than the rest of such a poll; a
/// timeout then fires at most this many idle polls later.
const IDLE_POLLS_PER_CLOCK: u32 = 64;

/// CQEs one poll takes from the queue at most.
const CQES_PER_POLL: usize = 32;

/// How submissions are time-stamped (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stamp {
    /// Each submission reads the clock.
    EachCommand,
    /// A batch is open: its first submission reads the clock, the others reuse that time.
    Batch(Option<Instant>),
}

/// One I/O queue.
pub struct IoQueue<Q: HostQueue> {
    queue: Q,
    cids: CidTable<Pending>,
    /// Where each command's data lives in the region.
    slots: DataSlots,
    limits: IoLimits,
    clock: SharedClock,
    stamp: Stamp,
    stats: IoStats,
    lost: Option<String>,
    /// Failures not yet delivered (connection loss); drained by the next poll.
    undelivered: Vec<IoCompletion>,
    /// When to scan for timed-out commands next (a scan is O(depth), so not every poll).
    next_timeout_scan: Instant,
    /// Polls that found nothing since the clock was last read (idle polls read it only every
    /// [`IDLE_POLLS_PER_CLOCK`]th time for the timeout check).
    idle_polls: u32,
    /// Where a poll puts the queue's CQEs ([`CQES_PER_POLL`] at most).
    cqes: Vec<Cqe>,
}

impl<Q: HostQueue> std::fmt::Debug for IoQueue<Q> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IoQueue")
            .field("qid", &self.queue.qid())
            .field("depth", &self.cids.depth())
            .field("limits", &self.limits)
            .field("lost", &self.lost)
            .finish()
    }
}

impl<Q: HostQueue> IoQueue<Q> {
    /// Wrap a connected queue (Fabrics Connect done). A region smaller than depth x
    /// `limits.max_transfer` is shared by the commands in flight by their transfer sizes; a
    /// transfer larger than the region is refused as larger than `max_transfer`.
    pub fn new(queue: Q, mut limits: IoLimits, clock: SharedClock) -> Self {
        let depth = usize::from(queue.depth()).max(1);
        let slots = DataSlots::new(queue.region().len, depth, limits.max_transfer);
        // A command's byte count is kept in 32 bits (`Pending::bytes`).
        limits.max_transfer = limits
            .max_transfer
            .min(slots.largest())
            .min(u32::MAX as usize);
        Self {
            queue,
            cids: CidTable::new_half_turn(depth),
            slots,
            limits,
            stats: IoStats::default(),
            lost: None,
            undelivered: Vec::with_capacity(depth),
            next_timeout_scan: clock.now(),
            idle_polls: 0,
            cqes: vec![Cqe::default(); CQES_PER_POLL.min(depth)],
            clock,
            stamp: Stamp::EachCommand,
        }
    }

    /// Queue id.
    pub fn qid(&self) -> u16 {
        self.queue.qid()
    }
    /// Commands that may be in flight at once.
    pub fn depth(&self) -> usize {
        self.cids.depth()
    }
    /// Commands in flight.
    pub fn in_flight(&self) -> usize {
        self.cids.in_flight()
    }
    /// Commands of `bytes` each that can be in flight at once: the depth, or fewer when a
    /// shared data region holds fewer of them.
    pub fn depth_for(&self, bytes: usize) -> usize {
        self.depth().min(self.slots.holds(bytes))
    }
    /// True when a command carrying `bytes` of data could be submitted now: a free CID and,
    /// in a shared data region, a free run of that size (else the submission fails with
    /// [`Error::QueueFull`] until completions free one).
    pub fn has_room_for(&self, bytes: usize) -> bool {
        self.cids.has_free() && self.slots.has_room(bytes)
    }
    /// The clock that stamps its commands.
    pub fn clock(&self) -> &SharedClock {
        &self.clock
    }
    /// Limits.
    pub fn limits(&self) -> IoLimits {
        self.limits
    }
    /// Counters.
    pub fn stats(&self) -> IoStats {
        self.stats
    }
    /// True until the connection is lost.
    pub fn is_connected(&self) -> bool {
        self.lost.is_none() && self.queue.is_connected()
    }
    /// Why the connection is gone.
    pub fn loss_reason(&self) -> Option<&str> {
        self.lost.as_deref()
    }
    /// The underlying queue.
    pub fn queue(&self) -> &Q {
        &self.queue
    }
    /// True when the next poll delivers something without the transport: the failures of a
    /// connection lost during a submission or `end_batch`. A poller that polls only the queues
    /// their completion group names ([`ReadyQueues`]) must poll this one again.
    pub fn wants_poll(&self) -> bool {
        !self.undelivered.is_empty()
    }

    /// Open a submit batch: the submissions from now up to the next [`IoQueue::poll`] share
    /// one clock read (see the module documentation). For a poller that refills the queue
    /// once per pass; the next poll closes the batch.
    pub fn begin_batch(&mut self) {
        self.stamp = Stamp::Batch(None);
    }

    /// Open a submit batch stamped `now` (a poller's one clock read for its whole pass, shared
    /// by every queue it steps): as [`IoQueue::begin_batch`], with no clock read of its own.
    pub fn begin_batch_at(&mut self, now: Instant) {
        self.stamp = Stamp::Batch(Some(now));
    }

    /// Close a submit batch: what it submitted goes on the wire now ([`HostQueue::flush`])
    /// instead of at the next poll, and submissions read the clock each again. A loss found
    /// here fails the commands in flight at the next poll.
    pub fn end_batch(&mut self) {
        // `Batch(None)`: nothing was submitted, nothing waits.
        let submitted = matches!(self.stamp, Stamp::Batch(Some(_)));
        self.stamp = Stamp::EachCommand;
        if submitted && self.lost.is_none() {
            if let Err(e) = self.queue.flush() {
                let why = match e {
                    crate::queue::QueueError::Disconnected(why) => why,
                    other => other.to_string(),
                };
                self.connection_lost(why);
            }
        }
    }

    /// The time stamp of a submission.
    fn submit_time(&mut self) -> Instant {
        match &mut self.stamp {
            Stamp::EachCommand => self.clock.now(),
            Stamp::Batch(Some(at)) => *at,
            Stamp::Batch(first) => *first.insert(self.clock.now()),
        }
    }

    /// Tear the connection down; every in-flight command fails at the next poll.
    pub fn disconnect(&mut self, why: &str) {
        self.connection_lost(why.to_string());
    }

    /// The connection is gone or given up: the transport queue is disconnected (once) and
    /// every command in flight fails.
    fn connection_lost(&mut self, why: String) {
        if self.lost.is_none() {
            tracing::warn!(qid = self.queue.qid(), reason = %why, "I/O queue lost its connection");
            self.lost = Some(why.clone());
            // Torn down now, not when the controller replaces the queue: a lost RDMA queue kept
            // its QP (which a target could still send into), and its request objects reserved
            // in a host group that the reconnect's new queues then might not fit in.
            self.queue.disconnect();
        }
        let now = self.clock.now();
        let mut failed = 0;
        let undelivered = &mut self.undelivered;
        self.slots.release_all();
        self.cids.drain(|_, p| {
            failed += 1;
            undelivered.push(IoCompletion {
                token: p.token,
                kind: p.kind,
                result: Err(Error::ConnectionLost(why.clone())),
                latency: now.saturating_duration_since(p.submitted),
            });
        });
        self.stats.failed_by_loss += failed;
    }

    fn check_usable(&self) -> Result<()> {
        match &self.lost {
            Some(why) => Err(Error::ConnectionLost(why.clone())),
            None => Ok(()),
        }
    }

    fn blocks_ok(ns: &NsTarget, lba: u64, blocks: u32) -> Result<usize> {
        if blocks == 0 || blocks > 0x1_0000 {
            return Err(Error::InvalidArgument(format!(
                "{blocks} blocks (1..=65536 per command)"
            )));
        }
        if lba
            .checked_add(u64::from(blocks))
            .is_none_or(|end| end > ns.blocks)
        {
            return Err(Error::InvalidArgument(format!(
                "LBA {lba} + {blocks} beyond namespace {} ({} blocks)",
                ns.nsid, ns.blocks
            )));
        }
        Ok(blocks as usize * ns.block_size as usize)
    }

    fn start(&mut self, token: u64, kind: IoKind, bytes: usize) -> Result<(usize, u16)> {
        self.check_usable()?;
        if bytes > self.limits.max_transfer {
            return Err(Error::InvalidArgument(format!(
                "{bytes} bytes > largest transfer {}",
                self.limits.max_transfer
            )));
        }
        let submitted = self.submit_time();
        let slots = &mut self.slots;
        let mut offset = 0;
        let (_, cid) = self
            .cids
            .allocate_with(|index| {
                offset = slots.take(index, bytes)?;
                Some(Pending {
                    token,
                    kind,
                    bytes: bytes as u32,
                    offset,
                    submitted,
                })
            })
            .ok_or(Error::QueueFull)?;
        Ok((offset, cid))
    }

    /// `lazy`: the queue sends what its registered region holds for the command's outgoing
    /// data ([`HostQueue::submit_lazy`]), for data nobody filled.
    fn send(
        &mut self,
        cid: u16,
        sqe: &Sqe,
        in_capsule: Option<std::ops::Range<usize>>,
        lazy: bool,
    ) -> Result<()> {
        let submitted = if lazy {
            self.queue.submit_lazy(sqe, in_capsule)
        } else {
            self.queue.submit(sqe, in_capsule)
        };
        match submitted {
            Ok(()) => {
                self.stats.submitted += 1;
                Ok(())
            }
            Err(crate::queue::QueueError::Disconnected(why)) => {
                // This command never left: release its slot so only the caller hears of it;
                // the others in flight fail at the next poll.
                self.unsent(cid);
                self.connection_lost(why.clone());
                Err(Error::ConnectionLost(why))
            }
            Err(e) => {
                self.unsent(cid);
                Err(e.into())
            }
        }
    }

    /// Release the CID and data of a command that did not go out.
    fn unsent(&mut self, cid: u16) {
        if let CidLookup::Completed { payload, .. } = self.cids.complete(cid) {
            self.slots.release(payload.offset, payload.bytes as usize);
        }
    }

    /// The keyed SGL naming `range` for command `cid`; when none can be made, the command is
    /// released (CID and data) before the error goes back to the caller.
    #[inline]
    fn data_sgl(&mut self, cid: u16, range: &std::ops::Range<usize>) -> Result<SglDescriptor> {
        match self.keyed_sgl(range) {
            Ok(sgl) => Ok(sgl),
            Err(e) => Err(self.unsent_because(cid, e)),
        }
    }

    #[cold]
    fn unsent_because(&mut self, cid: u16, error: Error) -> Error {
        self.unsent(cid);
        error
    }

    #[inline]
    fn keyed_sgl(&mut self, range: &std::ops::Range<usize>) -> Result<SglDescriptor> {
        if self.limits.per_io_keys {
            if let Some((address, key)) = self.queue.bind_window(range.clone())? {
                // Subtype 0xF: the target invalidates the window's key with its response.
                return SglDescriptor::keyed(address, range.len() as u32, key, true).ok_or_else(
                    || Error::InvalidArgument(format!("{} bytes in one keyed SGL", range.len())),
                );
            }
        }
        let r = self.queue.region();
        keyed(r.address + range.start as u64, range.len(), r.key)
    }

    /// Submit a Read of `blocks` blocks at `lba`; the data is handed to the poll callback.
    pub fn submit_read(&mut self, ns: &NsTarget, lba: u64, blocks: u32, token: u64) -> Result<()> {
        let bytes = Self::blocks_ok(ns, lba, blocks)?;
        let (offset, cid) = self.start(token, IoKind::Read, bytes)?;
        let range = offset..offset + bytes;
        let sqe = ReadCmd {
            cid,
            nsid: ns.nsid,
            slba: lba,
            nlb: (blocks - 1) as u16,
            control: RwControl::default(),
            dsm: 0,
            sgl: self.data_sgl(cid, &range)?,
        }
        .to_sqe();
        self.send(cid, &sqe, None, false)
    }

    fn submit_data_out(
        &mut self,
        kind: IoKind,
        ns: &NsTarget,
        lba: u64,
        blocks: u32,
        token: u64,
        fill: Option<impl FnOnce(&mut [u8])>,
    ) -> Result<()> {
        let bytes = Self::blocks_ok(ns, lba, blocks)?;
        let (offset, cid) = self.start(token, kind, bytes)?;
        let range = offset..offset + bytes;
        let lazy = fill.is_none();
        if let Some(fill) = fill {
            fill(&mut self.queue.region_bytes_mut()[range.clone()]);
        }
        let in_capsule = kind == IoKind::Write && bytes <= self.limits.in_capsule;
        let sgl = if in_capsule {
            SglDescriptor::DataBlockOffset {
                offset: 0,
                length: bytes as u32,
            }
        } else {
            self.data_sgl(cid, &range)?
        };
        let mut sqe = WriteCmd {
            cid,
            nsid: ns.nsid,
            slba: lba,
            nlb: (blocks - 1) as u16,
            control: RwControl::default(),
            dtype: 0,
            dsm: 0,
            dspec: 0,
            sgl,
        }
        .to_sqe();
        if kind == IoKind::Compare {
            // Compare shares Write's layout (SLBA, NLB, SGL) with its own opcode.
            sqe.opcode = IoOpcode::Compare.raw();
        }
        if in_capsule {
            self.stats.in_capsule_writes += 1;
        }
        self.send(cid, &sqe, in_capsule.then_some(range), lazy)
    }

    /// Submit a Write; `fill` writes the data into the command's slot (exactly
    /// `blocks * block_size` bytes).
    pub fn submit_write(
        &mut self,
        ns: &NsTarget,
        lba: u64,
        blocks: u32,
        token: u64,
        fill: impl FnOnce(&mut [u8]),
    ) -> Result<()> {
        self.submit_data_out(IoKind::Write, ns, lba, blocks, token, Some(fill))
    }

    /// Submit a Write of whatever the command's slot holds, for a caller to whom the data
    /// does not matter (nvmf-perf without --verify): the slot is neither filled nor brought
    /// from the host view into the queue's registered region ([`HostQueue::submit_lazy`]),
    /// so the target gets whatever that memory last held.
    pub fn submit_write_unfilled(
        &mut self,
        ns: &NsTarget,
        lba: u64,
        blocks: u32,
        token: u64,
    ) -> Result<()> {
        let unfilled: Option<fn(&mut [u8])> = None;
        self.submit_data_out(IoKind::Write, ns, lba, blocks, token, unfilled)
    }

    /// Submit a Compare against the data `fill` writes; a mismatch completes with the media
    /// status Compare Failure.
    pub fn submit_compare(
        &mut self,
        ns: &NsTarget,
        lba: u64,
        blocks: u32,
        token: u64,
        fill: impl FnOnce(&mut [u8]),
    ) -> Result<()> {
        self.submit_data_out(IoKind::Compare, ns, lba, blocks, token, Some(fill))
    }

    /// Submit a Flush.
    pub fn submit_flush(&mut self, nsid: u32, token: u64) -> Result<()> {
        let (_, cid) = self.start(token, IoKind::Flush, 0)?;
        let mut sqe = FlushCmd { cid, nsid }.to_sqe();
        sqe.set_sgl1(SglDescriptor::NULL);
        self.send(cid, &sqe, None, false)
    }

    /// Submit a Write Zeroes.
    pub fn submit_write_zeroes(
        &mut self,
        ns: &NsTarget,
        lba: u64,
        blocks: u32,
        token: u64,
    ) -> Result<()> {
        Self::blocks_ok(ns, lba, blocks)?;
        let (_, cid) = self.start(token, IoKind::WriteZeroes, 0)?;
        let mut sqe = WriteZeroesCmd {
            cid,
            nsid: ns.nsid,
            slba: lba,
            nlb: (blocks - 1) as u16,
            deac: false,
            control: RwControl::default(),
        }
        .to_sqe();
        sqe.set_sgl1(SglDescriptor::NULL);
        self.send(cid, &sqe, None, false)
    }

    /// Submit a Dataset Management Deallocate of `ranges` (LBA, blocks).
    pub fn submit_deallocate(
        &mut self,
        ns: &NsTarget,
        ranges: &[(u64, u32)],
        token: u64,
    ) -> Result<()> {
        if ranges.is_empty() || ranges.len() > DSM_MAX_RANGES {
            return Err(Error::InvalidArgument(format!(
                "{} ranges (1..=256)",
                ranges.len()
            )));
        }
        for &(lba, blocks) in ranges {
            if lba
                .checked_add(u64::from(blocks))
                .is_none_or(|end| end > ns.blocks)
            {
                return Err(Error::InvalidArgument(format!(
                    "deallocate LBA {lba} + {blocks} out of range"
                )));
            }
        }
        let bytes = ranges.len() * DSM_RANGE_SIZE;
        let (offset, cid) = self.start(token, IoKind::Deallocate, bytes)?;
        let range = offset..offset + bytes;
        let slot = &mut self.queue.region_bytes_mut()[range.clone()];
        for (chunk, &(slba, length)) in slot.chunks_exact_mut(DSM_RANGE_SIZE).zip(ranges) {
            chunk.copy_from_slice(
                &DsmRange {
                    context_attributes: 0,
                    length,
                    slba,
                }
                .to_bytes(),
            );
        }
        let sqe = DatasetManagementCmd {
            cid,
            nsid: ns.nsid,
            nr: (ranges.len() - 1) as u8,
            idr: false,
            idw: false,
            ad: true,
            sgl: self.data_sgl(cid, &range)?,
        }
        .to_sqe();
        self.send(cid, &sqe, None, false)
    }

    /// Reap completions; `on_complete` gets each with, for reads, the data read. Returns how
    /// many were delivered. Connection loss is delivered as failed completions, not an error.
    pub fn poll(&mut self, mut on_complete: impl FnMut(IoCompletion, &[u8])) -> usize {
        self.reap(false, None, |c, mut data| match data.bytes() {
            Ok(bytes) => on_complete(c, bytes),
            // Not reached: polled eagerly, the data is in the host view already.
            Err(e) => on_complete(
                IoCompletion {
                    result: Err(e),
                    ..c
                },
                &[],
            ),
        })
    }

    /// As [`IoQueue::poll`], but a read's data is copied out of the registered region only
    /// when the callback asks for it ([`ReadData::bytes`]): for a consumer that mostly does
    /// not look at what it read.
    pub fn poll_lazy(&mut self, on_complete: impl FnMut(IoCompletion, ReadData<'_, Q>)) -> usize {
        self.reap(true, None, on_complete)
    }

    /// As [`IoQueue::poll_lazy`], with `now` (the poller's clock read for its pass) as the
    /// completions' time and the timeout check's: no clock read of its own.
    pub fn poll_lazy_at(
        &mut self,
        now: Instant,
        on_complete: impl FnMut(IoCompletion, ReadData<'_, Q>),
    ) -> usize {
        self.reap(true, Some(now), on_complete)
    }

    /// `lazy`: the queue leaves read data in its registered region until fetched. `pass_time`:
    /// the time to use instead of reading the clock.
    fn reap(
        &mut self,
        lazy: bool,
        pass_time: Option<Instant>,
        mut on_complete: impl FnMut(IoCompletion, ReadData<'_, Q>),
    ) -> usize {
        let mut delivered = 0;
        self.stamp = Stamp::EachCommand;
        if self.lost.is_none() {
            // The queue's own buffer (taken out for the poll, no allocation): no array of
            // CQEs to initialise per poll.
            let mut cqes = std::mem::take(&mut self.cqes);
            // The pass's time if the poller gave one; else one clock read for the whole poll,
            // and only when something needs it.
            let mut now = pass_time;
            let polled = if lazy {
                self.queue.poll_lazy(&mut cqes)
            } else {
                self.queue.poll(&mut cqes)
            };
            match polled {
                Ok(n) => {
                    if n > 0 {
                        let now = *now.get_or_insert_with(|| self.clock.now());
                        for cqe in &cqes[..n] {
                            delivered += self.complete_one(cqe, now, !lazy, &mut on_complete);
                        }
                    }
                }
                Err(e) => self.connection_lost(e.to_string()),
            }
            self.cqes = cqes;
            if now.is_none() {
                self.idle_polls = self.idle_polls.saturating_add(1);
            }
            if self.lost.is_none()
                && !self.limits.timeout.is_zero()
                && (now.is_some() || self.idle_polls >= IDLE_POLLS_PER_CLOCK)
            {
                self.idle_polls = 0;
                let now = now.unwrap_or_else(|| self.clock.now());
                if now >= self.next_timeout_scan {
                    // A quarter of the timeout between scans: a command fails at most 25% late.
                    self.next_timeout_scan = now + self.limits.timeout / 4;
                    self.check_timeouts(now);
                }
            }
        }
        if !self.undelivered.is_empty() {
            for c in self.undelivered.drain(..) {
                self.stats.completed += 1;
                on_complete(c, ReadData::new(&mut self.queue, 0..0, true));
                delivered += 1;
            }
        }
        delivered
    }

    fn complete_one(
        &mut self,
        cqe: &Cqe,
        now: Instant,
        fetched: bool,
        on_complete: &mut impl FnMut(IoCompletion, ReadData<'_, Q>),
    ) -> usize {
        let CidLookup::Completed { payload, .. } = self.cids.complete(cqe.cid) else {
            self.stats.stale_completions += 1;
            tracing::warn!(
                cid = cqe.cid,
                qid = self.queue.qid(),
                "stale completion ignored"
            );
            return 0;
        };
        self.stats.completed += 1;
        let result = if cqe.status.is_success() {
            Ok(())
        } else {
            Err(Error::Nvme {
                command: payload.kind.name(),
                status: cqe.status,
            })
        };
        let data_len = if payload.kind == IoKind::Read && result.is_ok() {
            payload.bytes as usize
        } else {
            0
        };
        // Free for the next submission already: nothing can submit before the callback
        // (which borrows the queue) is done with the data.
        self.slots.release(payload.offset, payload.bytes as usize);
        let range = payload.offset..payload.offset + data_len;
        on_complete(
            IoCompletion {
                token: payload.token,
                kind: payload.kind,
                result,
                latency: now.saturating_duration_since(payload.submitted),
            },
            ReadData::new(&mut self.queue, range, fetched),
        );
        1
    }

    fn check_timeouts(&mut self, now: Instant) {
        let limit = self.limits.timeout;
        let expired = (0..self.cids.depth()).any(|i| {
            self.cids
                .payload(i)
                .is_some_and(|p| now.saturating_duration_since(p.submitted) >= limit)
        });
        if expired {
            // A CID the controller may still answer cannot be reused: give the connection up
            // (`connection_lost` disconnects the queue).
            self.connection_lost(format!("I/O command timed out after {limit:?}"));
        }
    }
}

#[cfg(test)]
mod tests;
