//! The file device: a regular file (or block device node) driven through io_uring, one ring
//! per channel (so per reactor and device), submitted and reaped by the reactor that owns the
//! channel. No thread, no lock, and no syscall per I/O: SQEs are queued during `submit` and the
//! ring is entered once per `poll`.
//!
//! - Read / Write: READV / WRITEV straight on the transport's buffers; a FUA write carries
//!   RWF_DSYNC, so it is durable when it completes. With O_DIRECT, segments
//!   whose address or length is not a multiple of the block size go through an aligned bounce
//!   buffer (the poll group's buffers are aligned; in-capsule write data, used in place in
//!   its receive slot 64 bytes after the SQE, is not). Bounce and compare buffers belong to
//!   the channel's I/O slots and are reused, grown only past their largest transfer: no
//!   allocation per I/O once warm.
//! - Flush: FSYNC with DATASYNC, which reaches stable storage (data and the metadata needed to
//!   read it back), also under O_DIRECT where the device may cache.
//! - Write Zeroes / Deallocate: FALLOCATE with ZERO_RANGE / PUNCH_HOLE (KEEP_SIZE); when the
//!   file system refuses (EOPNOTSUPP / EINVAL) the channel remembers and falls back: a punch to
//!   ZERO_RANGE, then to writing zeroes from a zeroed buffer, so deallocated blocks always read
//!   back as zeroes. The zero writes go a few at a time ([`ZERO_WRITES_IN_FLIGHT`] per
//!   command, the next on each completion), so deallocating a whole namespace does not flood
//!   the ring, and each must write its whole chunk. A durable one (FUA, or the write cache
//!   off) ends with FSYNC DATASYNC once every part of it is done.
//! - Compare: reads into an aligned scratch buffer and compares with a copy of the host's
//!   data taken at submit.
//!
//! This is the one module of the crate allowed `unsafe`: pushing an SQE hands raw addresses to
//! the kernel. What makes it sound is the lending contract of [`IoBuf`] (the memory stays alive
//! and untouched until the tag is reaped), the channel's own buffers living in its slots until
//! their SQEs complete, and `Drop` waiting for every in-flight SQE (if the kernel refuses that
//! wait for good, the slots and zero buffer are leaked, not freed; the lent buffers are the
//! lender's, which then outlive nothing the kernel may still write only if it leaks too).
#![allow(unsafe_code)]

use std::fs::{File, OpenOptions};
use std::io::{Seek, SeekFrom};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::Arc;

use io_uring::{IoUring, opcode, squeue, types};

use super::{
    Bdev, BdevChannel, BdevError, BdevInfo, BdevOp, BlockRange, IoBuf, IoStatus, MAX_SEGMENTS,
    Submitted, check_io,
};

/// SQ entries per ring (the CQ is twice that, and the kernel keeps overflow completions).
const RING_ENTRIES: u32 = 256;
/// Size of the zero buffer the write-zeroes fallback writes from.
const ZERO_CHUNK: usize = 256 * 1024;
/// Zero-writing WRITEs one command keeps in flight at most.
const ZERO_WRITES_IN_FLIGHT: u32 = 8;
/// Memory alignment O_DIRECT needs at most (a page covers every logical block size).
const DIRECT_ALIGN: usize = 4096;

/// A file-backed device.
pub struct FileBdev {
    info: BdevInfo,
    file: Arc<File>,
    direct: bool,
}

impl FileBdev {
    /// Open (creating if missing) `path`; with `size`, extend the file to it when shorter and
    /// use that many bytes, else use the file's length.
    pub fn open(
        name: &str,
        path: &Path,
        block_size: u32,
        size: Option<u64>,
        direct: bool,
    ) -> Result<FileBdev, BdevError> {
        let io = |step: &str| {
            let name = name.to_owned();
            let what = format!("{step} {}", path.display());
            move |error| BdevError::Io { name, what, error }
        };
        let mut options = OpenOptions::new();
        options.read(true).write(true).create(true).truncate(false);
        if direct {
            options.custom_flags(libc::O_DIRECT);
        }
        let mut file = options.open(path).map_err(io("open"))?;
        let len = file.seek(SeekFrom::End(0)).map_err(io("size"))?;
        let bytes = match size {
            Some(s) if s > len => {
                file.set_len(s).map_err(io("extend"))?;
                s
            }
            Some(s) => s,
            None => len,
        };
        let num_blocks = bytes / u64::from(block_size);
        if num_blocks == 0 || !(block_size == 512 || block_size == 4096) {
            return Err(BdevError::Config {
                name: name.to_owned(),
                message: format!("{bytes} bytes hold no block of {block_size}"),
            });
        }
        Ok(FileBdev {
            info: BdevInfo {
                name: name.to_owned(),
                block_size,
                num_blocks,
                volatile_cache: true,
            },
            file: Arc::new(file),
            direct,
        })
    }

    /// Opened with O_DIRECT.
    pub fn is_direct(&self) -> bool {
        self.direct
    }
}

impl Bdev for FileBdev {
    fn info(&self) -> &BdevInfo {
        &self.info
    }
    fn open_channel(&self) -> Result<Box<dyn BdevChannel>, BdevError> {
        Ok(Box::new(self.channel()?))
    }
}

impl FileBdev {
    fn channel(&self) -> Result<FileChannel, BdevError> {
        let ring = IoUring::new(RING_ENTRIES).map_err(|error| BdevError::Io {
            name: self.info.name.clone(),
            what: "io_uring setup".into(),
            error,
        })?;
        Ok(FileChannel {
            info: self.info.clone(),
            file: self.file.clone(),
            direct: self.direct,
            ring,
            slots: Vec::new(),
            free: Vec::new(),
            live: 0,
            unsubmitted: 0,
            zeroes: AlignedBuf::new(ZERO_CHUNK),
            fallocate_zero: true,
            fallocate_punch: true,
            closing: false,
            zeroing_syncs: 0,
        })
    }
}

/// A zeroed heap buffer whose usable part starts on a [`DIRECT_ALIGN`] boundary (safe: an
/// over-allocated `Vec` and an aligned window into it).
struct AlignedBuf {
    raw: Vec<u8>,
    start: usize,
    len: usize,
}

impl AlignedBuf {
    fn new(len: usize) -> AlignedBuf {
        let raw = vec![0u8; len + DIRECT_ALIGN];
        let start = raw.as_ptr().align_offset(DIRECT_ALIGN);
        AlignedBuf { raw, start, len }
    }
    /// `len` bytes of `buf`, reusing its memory when it is large enough (contents unspecified:
    /// every user overwrites them before reading).
    fn reuse(buf: &mut Option<AlignedBuf>, len: usize) -> &mut AlignedBuf {
        match buf {
            Some(b) if b.raw.len() - b.start >= len => b.len = len,
            _ => *buf = Some(AlignedBuf::new(len)),
        }
        buf.as_mut().expect("just set")
    }
    fn as_slice(&self) -> &[u8] {
        &self.raw[self.start..self.start + self.len]
    }
    fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.raw[self.start..self.start + self.len]
    }
}

/// Segment addresses handed to the kernel (and, for a bounced read, copied to at completion).
#[derive(Clone, Copy)]
struct IoVecs {
    vecs: [libc::iovec; MAX_SEGMENTS],
    count: usize,
}

// SAFETY: the pointers are addresses of memory lent for one I/O (see `IoBuf`) or owned by the
// slot; they are dereferenced only by the kernel and by `finish_bounced_read` on the thread
// that owns the channel, whichever thread that is. Moving the channel moves no memory.
unsafe impl Send for IoVecs {}

impl IoVecs {
    const EMPTY: IoVecs = IoVecs {
        vecs: [libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        }; MAX_SEGMENTS],
        count: 0,
    };

    /// Becomes the first `len` bytes of `data`, in place (only the entries used are written:
    /// the list is 32 entries, most I/O uses one); false if they span more than MAX_SEGMENTS
    /// segments.
    fn set_from(&mut self, data: &mut IoBuf<'_, '_>, mut len: usize) -> bool {
        self.count = 0;
        for seg in data.segments_mut() {
            if len == 0 {
                break;
            }
            let n = seg.len().min(len);
            let Some(slot) = self.vecs.get_mut(self.count) else {
                return false;
            };
            *slot = libc::iovec {
                iov_base: seg.as_mut_ptr().cast(),
                iov_len: n,
            };
            self.count += 1;
            len -= n;
        }
        true
    }

    /// Becomes a copy of `other`'s entries in use.
    fn copy_used(&mut self, other: &IoVecs) {
        self.vecs[..other.count].copy_from_slice(&other.vecs[..other.count]);
        self.count = other.count;
    }

    fn aligned(&self, align: usize) -> bool {
        self.vecs[..self.count]
            .iter()
            .all(|v| (v.iov_base as usize) % align == 0 && v.iov_len % align == 0)
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum SlotKind {
    /// Read/write/flush/fallocate: done when every SQE is back.
    Plain,
    /// Read through a bounce buffer: copy out at the end.
    BouncedRead,
    /// Compare: compare at the end.
    Compare,
}

struct Slot {
    tag: u64,
    kind: SlotKind,
    /// SQEs in flight for this I/O.
    remaining: u32,
    /// First failure, or Success.
    status: IoStatus,
    /// The host's segments (reads through a bounce buffer copy here at the end).
    host: IoVecs,
    /// The iovec list a READV/WRITEV points at (host segments, or the bounce buffer).
    submit: IoVecs,
    /// Bounce or compare scratch buffer.
    scratch: Option<AlignedBuf>,
    /// Compare: the host's data.
    expected: Vec<u8>,
    /// Ranges a FALLOCATE sub-operation covers (index in the SQE's user data).
    ranges: Vec<BlockRange>,
    /// Byte count a READV/WRITEV must transfer.
    expect_bytes: usize,
    /// Parts of ranges still to be written with zeroes (the fallback), taken from the end.
    zero_todo: Vec<BlockRange>,
    /// Zero-writing WRITEs in flight.
    zero_writes: u32,
    /// Durable zeroing: FSYNC DATASYNC once everything else is back.
    sync_after: bool,
}

impl Slot {
    fn new() -> Slot {
        Slot {
            tag: 0,
            kind: SlotKind::Plain,
            remaining: 0,
            status: IoStatus::Success,
            host: IoVecs::EMPTY,
            submit: IoVecs::EMPTY,
            scratch: None,
            expected: Vec::new(),
            ranges: Vec::new(),
            expect_bytes: 0,
            zero_todo: Vec::new(),
            zero_writes: 0,
            sync_after: false,
        }
    }
}

/// What an SQE was, packed into its user data with the slot index.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Sub {
    /// READV/WRITEV/FSYNC: success or failure.
    Data,
    /// FALLOCATE ZERO_RANGE of `ranges[i]`.
    ZeroRange(u16),
    /// FALLOCATE PUNCH_HOLE of `ranges[i]`.
    Punch(u16),
    /// A WRITE of this many blocks of zeroes (at most ZERO_CHUNK bytes: 512 blocks of 512).
    ZeroWrite(u16),
    /// The FSYNC DATASYNC that ends a durable zeroing.
    ZeroingSync,
}

fn user_data(slot: u32, sub: Sub) -> u64 {
    let (k, i) = match sub {
        Sub::Data => (0u64, 0u64),
        Sub::ZeroRange(i) => (1, u64::from(i)),
        Sub::Punch(i) => (2, u64::from(i)),
        Sub::ZeroWrite(blocks) => (3, u64::from(blocks)),
        Sub::ZeroingSync => (4, 0),
    };
    u64::from(slot) | (i << 32) | (k << 48)
}

fn decode_user_data(v: u64) -> (u32, Sub) {
    let slot = v as u32;
    let i = (v >> 32) as u16;
    let sub = match v >> 48 {
        1 => Sub::ZeroRange(i),
        2 => Sub::Punch(i),
        3 => Sub::ZeroWrite(i),
        4 => Sub::ZeroingSync,
        _ => Sub::Data,
    };
    (slot, sub)
}

struct FileChannel {
    info: BdevInfo,
    file: Arc<File>,
    direct: bool,
    ring: IoUring,
    /// Boxed: an SQE points at its slot's iovec list until the ring is entered, so a slot
    /// must not move when the list grows (a `Vec<Slot>` reallocating handed the kernel freed
    /// memory: EFAULT, or stale iovecs).
    #[allow(clippy::vec_box)] // the box is the point: a stable address
    slots: Vec<Box<Slot>>,
    free: Vec<u32>,
    live: usize,
    /// SQEs pushed since the ring was last entered.
    unsubmitted: u32,
    zeroes: AlignedBuf,
    /// The file system did not refuse FALLOC_FL_ZERO_RANGE yet.
    fallocate_zero: bool,
    /// The file system did not refuse FALLOC_FL_PUNCH_HOLE yet.
    fallocate_punch: bool,
    /// Dropping: no new zero writes are started.
    closing: bool,
    /// FSYNCs that made a zeroing durable, completed (for the tests).
    zeroing_syncs: u64,
}

impl FileChannel {
    fn fd(&self) -> types::Fd {
        types::Fd(self.file.as_raw_fd())
    }

    fn byte_offset(&self, lba: u64) -> u64 {
        lba * u64::from(self.info.block_size)
    }

    fn take_slot(&mut self, tag: u64, kind: SlotKind) -> u32 {
        let index = match self.free.pop() {
            Some(i) => i,
            None => {
                // Grows only past the previous high-water mark.
                self.slots.push(Box::new(Slot::new()));
                (self.slots.len() - 1) as u32
            }
        };
        let s = &mut self.slots[index as usize];
        s.tag = tag;
        s.kind = kind;
        s.remaining = 0;
        s.status = IoStatus::Success;
        // `scratch` is kept: reused by the slot's next bounced or compared transfer.
        s.expected.clear();
        s.ranges.clear();
        s.expect_bytes = 0;
        s.zero_todo.clear();
        s.zero_writes = 0;
        s.sync_after = false;
        self.live += 1;
        index
    }

    fn release_slot(&mut self, index: u32) {
        self.free.push(index);
        self.live -= 1;
    }

    /// Queue one SQE; enters the ring when the SQ is full. Err(errno) when it cannot.
    fn push(&mut self, entry: squeue::Entry) -> Result<(), i32> {
        // SAFETY: every address in `entry` stays valid until its completion is reaped: host
        // segments by the IoBuf lending contract, slot-owned iovec lists and scratch buffers
        // because a slot is boxed (never moves) and is not reused or dropped before its last
        // SQE completes, the zero buffer because it lives as long as the channel, and Drop
        // waits for every SQE (or leaks the slots and the zero buffer when it cannot).
        let pushed = unsafe { self.ring.submission().push(&entry) };
        if pushed.is_err() {
            self.ring
                .submit()
                .map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))?;
            self.unsubmitted = 0;
            // SAFETY: as above.
            unsafe { self.ring.submission().push(&entry) }.map_err(|_| libc::EBUSY)?;
        }
        self.unsubmitted += 1;
        Ok(())
    }

    /// Push `entry` for slot `index`, counting it, or record the failure. True if pushed.
    fn push_for(&mut self, index: u32, entry: squeue::Entry) -> bool {
        match self.push(entry) {
            Ok(()) => {
                self.slots[index as usize].remaining += 1;
                true
            }
            Err(errno) => {
                self.fail(index, IoStatus::Failed(errno));
                false
            }
        }
    }

    fn fail(&mut self, index: u32, status: IoStatus) {
        let s = &mut self.slots[index as usize];
        if s.status == IoStatus::Success {
            s.status = status;
        }
    }

    /// After queuing: Done when nothing was queued for the slot (it failed at once).
    fn settle(&mut self, index: u32) -> Submitted {
        let s = &self.slots[index as usize];
        if s.remaining == 0 {
            let status = s.status;
            self.release_slot(index);
            Submitted::Done(status)
        } else {
            Submitted::Queued
        }
    }

    /// `rw_flags`: RWF_DSYNC for a FUA write.
    fn push_rw(&mut self, index: u32, write: bool, offset: u64, rw_flags: i32) {
        let s = &self.slots[index as usize];
        let iov = s.submit.vecs.as_ptr();
        let n = s.submit.count as u32;
        let entry = if write {
            opcode::Writev::new(self.fd(), iov, n)
                .offset(offset)
                .rw_flags(rw_flags)
                .build()
        } else {
            opcode::Readv::new(self.fd(), iov, n).offset(offset).build()
        };
        self.push_for(index, entry.user_data(user_data(index, Sub::Data)));
    }

    /// Point the slot's submit list at its scratch buffer.
    fn submit_scratch(&mut self, index: u32, len: usize) {
        let s = &mut self.slots[index as usize];
        let mut v = IoVecs::EMPTY;
        if let Some(b) = s.scratch.as_mut() {
            v.vecs[0] = libc::iovec {
                iov_base: b.as_mut_slice().as_mut_ptr().cast(),
                iov_len: len,
            };
            v.count = 1;
        }
        s.submit = v;
        s.expect_bytes = len;
    }

    fn read_write(
        &mut self,
        write: bool,
        fua: bool,
        lba: u64,
        blocks: u32,
        data: &mut IoBuf<'_, '_>,
        tag: u64,
    ) -> Submitted {
        let bytes = match check_io(&self.info, lba, blocks, data.len()) {
            Ok(b) => b,
            Err(s) => return Submitted::Done(s),
        };
        // The host list is written in the slot itself (no list copied per I/O).
        let index = self.take_slot(tag, SlotKind::Plain);
        let s = &mut self.slots[index as usize];
        if !s.host.set_from(data, bytes) {
            self.release_slot(index);
            return Submitted::Done(IoStatus::Failed(libc::EINVAL));
        }
        let bounce = self.direct && !s.host.aligned(self.info.block_size as usize);
        if bounce && !write {
            s.kind = SlotKind::BouncedRead;
        }
        s.expect_bytes = bytes;
        if bounce {
            let b = AlignedBuf::reuse(&mut s.scratch, bytes);
            if write {
                data.read_at(0, b.as_mut_slice());
            }
            self.submit_scratch(index, bytes);
        } else {
            let Slot { host, submit, .. } = &mut **s;
            submit.copy_used(host);
        }
        let flags = if fua { libc::RWF_DSYNC } else { 0 };
        self.push_rw(index, write, self.byte_offset(lba), flags);
        self.settle(index)
    }

    fn compare(&mut self, lba: u64, blocks: u32, data: &mut IoBuf<'_, '_>, tag: u64) -> Submitted {
        let bytes = match check_io(&self.info, lba, blocks, data.len()) {
            Ok(b) => b,
            Err(s) => return Submitted::Done(s),
        };
        let index = self.take_slot(tag, SlotKind::Compare);
        let s = &mut self.slots[index as usize];
        s.expected.resize(bytes, 0);
        data.read_at(0, &mut s.expected);
        AlignedBuf::reuse(&mut s.scratch, bytes);
        self.submit_scratch(index, bytes);
        self.push_rw(index, false, self.byte_offset(lba), 0);
        self.settle(index)
    }

    /// Zeroes over `range` for slot `index`, by WRITEs from the zero buffer: queued, and
    /// started up to the slot's limit.
    fn push_zero_writes(&mut self, index: u32, range: BlockRange) {
        self.slots[index as usize].zero_todo.push(range);
        self.pump_zero_writes(index);
    }

    /// Starts the slot's next zero WRITEs while it has fewer than ZERO_WRITES_IN_FLIGHT; none
    /// once it failed or the channel is closing (what is left is dropped).
    fn pump_zero_writes(&mut self, index: u32) {
        let chunk_blocks = (ZERO_CHUNK as u32 / self.info.block_size).max(1);
        let ptr = self.zeroes.as_slice().as_ptr();
        loop {
            let s = &mut self.slots[index as usize];
            if s.status != IoStatus::Success || self.closing {
                s.zero_todo.clear();
                return;
            }
            if s.zero_writes >= ZERO_WRITES_IN_FLIGHT {
                return;
            }
            let Some(range) = s.zero_todo.last_mut() else {
                return;
            };
            let blocks = range.blocks.min(chunk_blocks);
            let lba = range.lba;
            range.lba += u64::from(blocks);
            range.blocks -= blocks;
            if range.blocks == 0 {
                s.zero_todo.pop();
            }
            let entry = opcode::Write::new(self.fd(), ptr, blocks * self.info.block_size)
                .offset(self.byte_offset(lba))
                .build()
                // chunk_blocks <= ZERO_CHUNK / 512 fits the sub-operation's 16 bits.
                .user_data(user_data(index, Sub::ZeroWrite(blocks as u16)));
            if self.push_for(index, entry) {
                self.slots[index as usize].zero_writes += 1;
            }
        }
    }

    fn push_fallocate(&mut self, index: u32, i: u16, punch: bool) {
        let r = self.slots[index as usize].ranges[usize::from(i)];
        let len = u64::from(r.blocks) * u64::from(self.info.block_size);
        let (mode, sub) = if punch {
            (
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                Sub::Punch(i),
            )
        } else {
            (
                libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE,
                Sub::ZeroRange(i),
            )
        };
        let entry = opcode::Fallocate::new(self.fd(), len)
            .offset(self.byte_offset(r.lba))
            .mode(mode)
            .build()
            .user_data(user_data(index, sub));
        self.push_for(index, entry);
    }

    /// Zero (or punch) `ranges`, by fallocate while the file system allows it; `durable`:
    /// synced before it completes.
    fn zero_ranges(
        &mut self,
        ranges: &[BlockRange],
        punch: bool,
        durable: bool,
        tag: u64,
    ) -> Submitted {
        for r in ranges {
            if let Err(s) = check_io(&self.info, r.lba, r.blocks, usize::MAX) {
                return Submitted::Done(s);
            }
        }
        let index = self.take_slot(tag, SlotKind::Plain);
        self.slots[index as usize].ranges.extend_from_slice(ranges);
        self.slots[index as usize].sync_after = durable;
        for (i, r) in ranges.iter().enumerate() {
            match u16::try_from(i) {
                Ok(i) => self.zero_one(index, i, *r, punch),
                Err(_) => self.push_zero_writes(index, *r),
            }
        }
        self.settle(index)
    }

    /// Range `i` of the slot by the best way the file system has not refused: a punch, else
    /// ZERO_RANGE (the kernel zeroes; on a block device it may offload), else zero writes.
    fn zero_one(&mut self, index: u32, i: u16, range: BlockRange, punch: bool) {
        if punch && self.fallocate_punch {
            self.push_fallocate(index, i, true);
        } else if self.fallocate_zero {
            self.push_fallocate(index, i, false);
        } else {
            self.push_zero_writes(index, range);
        }
    }

    /// One SQE of slot `index` completed with `result`. Work it leads to (a fallback, the next
    /// zero writes, the closing sync) is pushed before the caller looks at `remaining`.
    fn complete_sub(&mut self, index: u32, sub: Sub, result: i32) {
        let Some(s) = self.slots.get_mut(index as usize) else {
            return;
        };
        s.remaining = s.remaining.saturating_sub(1);
        let refused = result == -libc::EOPNOTSUPP || result == -libc::EINVAL;
        match sub {
            Sub::ZeroRange(i) | Sub::Punch(i) if refused => {
                let punch = matches!(sub, Sub::Punch(_));
                if punch {
                    self.fallocate_punch = false;
                } else {
                    self.fallocate_zero = false;
                }
                tracing::debug!(bdev = %self.info.name, ?sub, "fallocate refused; falling back");
                if let Some(r) = self.slots[index as usize].ranges.get(usize::from(i)) {
                    let r = *r;
                    self.zero_one(index, i, r, punch);
                }
            }
            Sub::ZeroWrite(blocks) => {
                s.zero_writes = s.zero_writes.saturating_sub(1);
                let want = i64::from(blocks) * i64::from(self.info.block_size);
                if result < 0 {
                    self.fail(index, IoStatus::Failed(-result));
                } else if i64::from(result) != want {
                    // Short (a full file system part-way): the blocks are not all zero.
                    self.fail(index, IoStatus::Failed(libc::EIO));
                }
                self.pump_zero_writes(index);
            }
            _ if result < 0 => self.fail(index, IoStatus::Failed(-result)),
            Sub::ZeroingSync => self.zeroing_syncs += 1,
            Sub::Data => {
                let s = &self.slots[index as usize];
                let want = s.expect_bytes;
                // READV/WRITEV transfer exactly `expect_bytes`; FSYNC has expect_bytes 0.
                if want != 0 && result as usize != want {
                    self.fail(index, IoStatus::Failed(libc::EIO));
                }
            }
            _ => {}
        }
        let s = &mut self.slots[index as usize];
        if s.remaining == 0 && s.sync_after && s.status == IoStatus::Success && !self.closing {
            s.sync_after = false;
            let entry = opcode::Fsync::new(self.fd())
                .flags(types::FsyncFlags::DATASYNC)
                .build()
                .user_data(user_data(index, Sub::ZeroingSync));
            self.push_for(index, entry);
        }
    }

    /// The slot's last SQE is back: final status.
    fn finish(&mut self, index: u32) -> IoStatus {
        let s = &mut self.slots[index as usize];
        if s.status != IoStatus::Success {
            return s.status;
        }
        match s.kind {
            SlotKind::Plain => IoStatus::Success,
            SlotKind::Compare => match &s.scratch {
                Some(b) if b.as_slice() == s.expected.as_slice() => IoStatus::Success,
                _ => IoStatus::CompareMismatch,
            },
            SlotKind::BouncedRead => {
                let Some(b) = &s.scratch else {
                    return IoStatus::Failed(libc::EIO);
                };
                let mut from = b.as_slice();
                for v in &s.host.vecs[..s.host.count] {
                    let n = v.iov_len.min(from.len());
                    // SAFETY: `v` is a segment of the IoBuf lent for this I/O, alive and
                    // untouched by others until this completion is reported (IoBuf contract);
                    // `n` is within its length.
                    let dst = unsafe { std::slice::from_raw_parts_mut(v.iov_base.cast::<u8>(), n) };
                    dst.copy_from_slice(&from[..n]);
                    from = &from[n..];
                }
                IoStatus::Success
            }
        }
    }

    fn enter(&mut self) {
        // More I/Os in flight than the CQ holds park completions on the kernel's overflow
        // list; only entering the ring (with GETEVENTS, which `submit` adds when the overflow
        // flag is up) moves them back into the CQ. Without it they were never reaped.
        if self.unsubmitted > 0 || self.ring.submission().cq_overflow() {
            match self.ring.submit() {
                Ok(_) => self.unsubmitted = 0,
                Err(e) => tracing::warn!(bdev = %self.info.name, "io_uring submit: {e}"),
            }
        }
    }
}

impl BdevChannel for FileChannel {
    fn submit(&mut self, op: BdevOp<'_>, data: &mut IoBuf<'_, '_>, tag: u64) -> Submitted {
        match op {
            BdevOp::Read { lba, blocks } => self.read_write(false, false, lba, blocks, data, tag),
            BdevOp::Write { lba, blocks } => self.read_write(true, false, lba, blocks, data, tag),
            // RWF_DSYNC: the write and the metadata to read it back are durable at completion.
            BdevOp::WriteFua { lba, blocks } => self.read_write(true, true, lba, blocks, data, tag),
            BdevOp::Compare { lba, blocks } => self.compare(lba, blocks, data, tag),
            BdevOp::WriteZeroes { lba, blocks, fua } => {
                self.zero_ranges(&[BlockRange { lba, blocks }], false, fua, tag)
            }
            BdevOp::Deallocate { ranges, fua } => self.zero_ranges(ranges, true, fua, tag),
            BdevOp::Flush => {
                let index = self.take_slot(tag, SlotKind::Plain);
                let entry = opcode::Fsync::new(self.fd())
                    .flags(types::FsyncFlags::DATASYNC)
                    .build()
                    .user_data(user_data(index, Sub::Data));
                self.push_for(index, entry);
                self.settle(index)
            }
        }
    }

    fn poll(&mut self, done: &mut dyn FnMut(u64, IoStatus)) -> usize {
        self.enter();
        let mut reported = 0;
        loop {
            let Some(cqe) = self.ring.completion().next() else {
                break;
            };
            let (index, sub) = decode_user_data(cqe.user_data());
            self.complete_sub(index, sub, cqe.result());
            if self
                .slots
                .get(index as usize)
                .is_some_and(|s| s.remaining == 0)
            {
                let status = self.finish(index);
                let tag = self.slots[index as usize].tag;
                self.release_slot(index);
                done(tag, status);
                reported += 1;
            }
        }
        // Fallback writes queued while reaping.
        self.enter();
        reported
    }

    fn in_flight(&self) -> usize {
        self.live
    }
}

impl Drop for FileChannel {
    fn drop(&mut self) {
        // The kernel may still write into lent or slot memory: wait for every SQE (starting no
        // more zero writes). A transient refusal of the wait is retried; after any other, the
        // slots and the zero buffer are leaked rather than freed under the kernel's feet.
        self.closing = true;
        while self.live > 0 {
            match self.ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::EINTR | libc::EAGAIN | libc::EBUSY)
                    ) => {}
                Err(e) => {
                    tracing::error!(
                        bdev = %self.info.name,
                        in_flight = self.live,
                        "io_uring wait on drop: {e}; leaking the channel's buffers"
                    );
                    std::mem::forget(std::mem::take(&mut self.slots));
                    std::mem::forget(std::mem::replace(&mut self.zeroes, AlignedBuf::new(0)));
                    return;
                }
            }
            self.poll(&mut |_, _| {});
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{exercise_storage, run, run_segments};
    use super::*;

    fn dir() -> tempfile::TempDir {
        // Under the build directory: a real disk file system (O_DIRECT, fallocate), not tmpfs.
        let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("../build/test-files");
        std::fs::create_dir_all(&base).unwrap();
        tempfile::tempdir_in(base).unwrap()
    }

    #[test]
    fn file_storage_semantics_buffered_and_direct() {
        let d = dir();
        for (direct, bs) in [(false, 512), (true, 512), (true, 4096), (false, 4096)] {
            let path = d.path().join(format!("f-{direct}-{bs}"));
            let b = FileBdev::open("f", &path, bs, Some(64 * u64::from(bs)), direct).unwrap();
            assert_eq!(b.info().num_blocks, 64);
            assert!(b.is_direct() == direct);
            exercise_storage(&b);
        }
    }

    #[test]
    fn data_persists_after_flush_and_reopen() {
        let d = dir();
        let path = d.path().join("persist");
        let pattern: Vec<u8> = (0..8192).map(|i| (i * 13 % 256) as u8).collect();
        {
            let b = FileBdev::open("f", &path, 4096, Some(1 << 20), true).unwrap();
            let mut ch = b.open_channel().unwrap();
            let mut data = pattern.clone();
            assert_eq!(
                run(ch.as_mut(), BdevOp::Write { lba: 5, blocks: 2 }, &mut data),
                IoStatus::Success
            );
            assert_eq!(run(ch.as_mut(), BdevOp::Flush, &mut []), IoStatus::Success);
        }
        // Reopen without a size: the file's own length.
        let b = FileBdev::open("f", &path, 4096, None, false).unwrap();
        assert_eq!(b.info().num_blocks, 256);
        let mut ch = b.open_channel().unwrap();
        let mut back = vec![0u8; 8192];
        assert_eq!(
            run(ch.as_mut(), BdevOp::Read { lba: 5, blocks: 2 }, &mut back),
            IoStatus::Success
        );
        assert_eq!(back, pattern);
    }

    /// A transfer over as many buffers as a request holds (128 KiB in 4 KiB io units): one
    /// iovec each, buffered and direct, written and read back whole.
    #[test]
    fn a_transfer_over_every_buffer_a_request_holds() {
        const BUFFERS: usize = nvmf_transport::pollgroup::MAX_REQUEST_BUFFERS;
        let d = dir();
        for direct in [false, true] {
            let path = d.path().join(format!("segments-{direct}"));
            let b = FileBdev::open("f", &path, 4096, Some(1 << 20), direct).unwrap();
            let mut ch = b.open_channel().unwrap();
            let blocks = BUFFERS as u32;
            // Page-aligned buffers, as the poll group's are (O_DIRECT without a bounce).
            let mut area = vec![0u8; (BUFFERS + 1) * 4096];
            let skip = area.as_ptr().align_offset(4096);
            let data = &mut area[skip..skip + BUFFERS * 4096];
            for (i, x) in data.iter_mut().enumerate() {
                *x = (i % 251) as u8;
            }
            let expect = data.to_vec();
            let mut segs: Vec<&mut [u8]> = data.chunks_mut(4096).collect();
            let write = BdevOp::Write { lba: 3, blocks };
            assert_eq!(
                run_segments(ch.as_mut(), write, &mut segs),
                IoStatus::Success,
                "direct {direct}"
            );
            data.fill(0);
            let mut segs: Vec<&mut [u8]> = data.chunks_mut(4096).collect();
            let read = BdevOp::Read { lba: 3, blocks };
            assert_eq!(
                run_segments(ch.as_mut(), read, &mut segs),
                IoStatus::Success
            );
            assert!(*data == expect[..], "direct {direct}: read back");
        }
    }

    #[test]
    fn misaligned_buffers_bounce_under_o_direct() {
        let d = dir();
        let b = FileBdev::open("f", &d.path().join("bounce"), 512, Some(1 << 16), true).unwrap();
        let mut ch = b.open_channel().unwrap();
        // A 1-byte offset into a Vec: never 512-aligned.
        let mut raw = vec![0u8; 1025];
        for (i, x) in raw[1..].iter_mut().enumerate() {
            *x = (i % 199) as u8;
        }
        let expect = raw[1..].to_vec();
        assert_eq!(
            run(
                ch.as_mut(),
                BdevOp::Write { lba: 1, blocks: 2 },
                &mut raw[1..]
            ),
            IoStatus::Success
        );
        raw.fill(0);
        assert_eq!(
            run(
                ch.as_mut(),
                BdevOp::Read { lba: 1, blocks: 2 },
                &mut raw[1..]
            ),
            IoStatus::Success
        );
        assert_eq!(raw[1..], expect[..]);
        // The slot's bounce buffer is reused: grown for a larger write, then a smaller read
        // sees only its own bytes.
        let mut big = vec![0u8; 2049];
        for (i, x) in big[1..].iter_mut().enumerate() {
            *x = (i % 251) as u8 ^ 0x5A;
        }
        let expect = big[1..].to_vec();
        let write = BdevOp::Write { lba: 4, blocks: 4 };
        assert_eq!(run(ch.as_mut(), write, &mut big[1..]), IoStatus::Success);
        for block in 0..4 {
            raw.fill(0);
            let read = BdevOp::Read {
                lba: 4 + block as u64,
                blocks: 1,
            };
            assert_eq!(run(ch.as_mut(), read, &mut raw[1..513]), IoStatus::Success);
            assert_eq!(raw[1..513], expect[block * 512..(block + 1) * 512]);
        }
    }

    #[test]
    fn many_ios_in_flight_complete_by_polling() {
        let d = dir();
        let b = FileBdev::open("f", &d.path().join("qd"), 512, Some(1 << 20), false).unwrap();
        let mut ch = b.open_channel().unwrap();
        let mut bufs: Vec<Vec<u8>> = (0..300).map(|i| vec![i as u8; 512]).collect();
        for (i, buf) in bufs.iter_mut().enumerate() {
            let mut segs = [&mut buf[..]];
            let mut io = IoBuf::new(&mut segs);
            let op = BdevOp::Write {
                lba: i as u64,
                blocks: 1,
            };
            assert_eq!(ch.submit(op, &mut io, i as u64), Submitted::Queued);
        }
        assert_eq!(ch.in_flight(), 300);
        let mut seen = vec![false; 300];
        while ch.in_flight() > 0 {
            ch.poll(&mut |tag, s| {
                assert_eq!(s, IoStatus::Success);
                seen[tag as usize] = true;
            });
        }
        assert!(seen.iter().all(|s| *s));
        let mut back = vec![0u8; 512];
        assert_eq!(
            run(
                ch.as_mut(),
                BdevOp::Read {
                    lba: 299,
                    blocks: 1
                },
                &mut back
            ),
            IoStatus::Success
        );
        assert!(back.iter().all(|b| *b == (299 % 256) as u8));
    }

    /// An SQE points at its slot's iovec list until the ring is entered: the list must stay
    /// where it is while later submissions grow the slot table (they did move: EFAULT). And
    /// 1024 I/Os in flight are more than the CQ holds: the overflow must still be reaped (it
    /// hung). Every write lands.
    #[test]
    fn a_slot_does_not_move_while_the_table_grows() {
        let d = dir();
        let b = FileBdev::open("f", &d.path().join("grow"), 4096, Some(1 << 22), true).unwrap();
        let mut file = b.channel().unwrap();
        let mut bufs: Vec<AlignedBuf> = (0..1024).map(|_| AlignedBuf::new(4096)).collect();
        let mut first = None;
        for (i, buf) in bufs.iter_mut().enumerate() {
            buf.as_mut_slice().fill(i as u8);
            let mut segs = [buf.as_mut_slice()];
            let mut io = IoBuf::new(&mut segs);
            let op = BdevOp::Write {
                lba: i as u64,
                blocks: 1,
            };
            assert_eq!(file.submit(op, &mut io, i as u64), Submitted::Queued);
            let addr = file.slots[0].submit.vecs.as_ptr() as usize;
            assert_eq!(
                *first.get_or_insert(addr),
                addr,
                "slot 0 moved at write {i}"
            );
        }
        let mut failed = Vec::new();
        while file.in_flight() > 0 {
            file.poll(&mut |tag, s| {
                if s != IoStatus::Success {
                    failed.push((tag, s));
                }
            });
        }
        assert!(failed.is_empty(), "{failed:?}");
        let mut back = AlignedBuf::new(4096);
        for i in [0usize, 255, 256, 511, 777, 1023] {
            let op = BdevOp::Read {
                lba: i as u64,
                blocks: 1,
            };
            assert_eq!(run(&mut file, op, back.as_mut_slice()), IoStatus::Success);
            assert!(back.as_slice().iter().all(|b| *b == i as u8), "block {i}");
        }
    }

    #[test]
    fn zeroes_are_written_when_fallocate_is_refused() {
        let d = dir();
        let b = FileBdev::open("f", &d.path().join("nofalloc"), 512, Some(1 << 23), true).unwrap();
        let mut ch = b.channel().unwrap();
        ch.fallocate_zero = false;
        ch.fallocate_punch = false;
        let mut ones = vec![1u8; 1 << 20];
        for at in (0..8u64).map(|m| m * 2048) {
            let write = BdevOp::Write {
                lba: at,
                blocks: 2048,
            };
            assert_eq!(run(&mut ch, write, &mut ones), IoStatus::Success);
        }
        // 8 MiB: 32 zero chunks for one command, a few in flight at a time.
        let zero = BdevOp::WriteZeroes {
            lba: 0,
            blocks: 16384,
            fua: false,
        };
        let mut none: [&mut [u8]; 0] = [];
        assert_eq!(
            ch.submit(zero, &mut IoBuf::new(&mut none), 5),
            Submitted::Queued
        );
        let mut done = None;
        while done.is_none() {
            let in_flight = ch.slots.iter().map(|s| s.remaining).max().unwrap_or(0);
            assert!(
                in_flight <= ZERO_WRITES_IN_FLIGHT,
                "{in_flight} SQEs at once"
            );
            ch.poll(&mut |tag, status| done = Some((tag, status)));
        }
        assert_eq!(done, Some((5, IoStatus::Success)));
        let mut back = vec![9u8; 1 << 20];
        for at in (0..8u64).map(|m| m * 2048) {
            let read = BdevOp::Read {
                lba: at,
                blocks: 2048,
            };
            assert_eq!(run(&mut ch, read, &mut back), IoStatus::Success);
            assert!(back.iter().all(|b| *b == 0), "MiB at block {at}");
        }
        assert_eq!(ch.zeroing_syncs, 0, "no FUA, no sync");
        exercise_storage(&b);
    }

    /// A zero WRITE that wrote less than its chunk (a file system full part-way) fails the
    /// command: the blocks are not all zero.
    #[test]
    fn a_short_zero_write_fails_the_command() {
        let d = dir();
        let b = FileBdev::open("f", &d.path().join("short"), 512, Some(1 << 20), false).unwrap();
        let mut ch = b.channel().unwrap();
        let index = ch.take_slot(9, SlotKind::Plain);
        ch.slots[index as usize].remaining = 2;
        ch.slots[index as usize].zero_writes = 2;
        ch.complete_sub(index, Sub::ZeroWrite(8), 8 * 512);
        assert_eq!(ch.slots[index as usize].status, IoStatus::Success);
        ch.complete_sub(index, Sub::ZeroWrite(8), 8 * 512 - 512);
        let s = &ch.slots[index as usize];
        let after = (s.status, s.remaining);
        // Released before asserting: the channel's drop waits for its live slots' SQEs.
        ch.release_slot(index);
        assert_eq!(after, (IoStatus::Failed(libc::EIO), 0));
    }

    /// Write Zeroes and Deallocate asked durable (FUA, or the write cache off) end with a
    /// FSYNC DATASYNC after every part, by fallocate or by zero writes.
    #[test]
    fn a_durable_zeroing_is_synced() {
        let d = dir();
        let b = FileBdev::open("f", &d.path().join("fua"), 512, Some(1 << 21), false).unwrap();
        let mut ch = b.channel().unwrap();
        let zero = |fua| BdevOp::WriteZeroes {
            lba: 8,
            blocks: 600,
            fua,
        };
        assert_eq!(run(&mut ch, zero(false), &mut []), IoStatus::Success);
        assert_eq!(ch.zeroing_syncs, 0);
        assert_eq!(run(&mut ch, zero(true), &mut []), IoStatus::Success);
        assert_eq!(ch.zeroing_syncs, 1);
        let ranges = [
            BlockRange { lba: 1, blocks: 3 },
            BlockRange {
                lba: 900,
                blocks: 1,
            },
        ];
        let deallocate = BdevOp::Deallocate {
            ranges: &ranges,
            fua: true,
        };
        assert_eq!(run(&mut ch, deallocate, &mut []), IoStatus::Success);
        assert_eq!(ch.zeroing_syncs, 2);
        ch.fallocate_zero = false;
        ch.fallocate_punch = false;
        assert_eq!(run(&mut ch, zero(true), &mut []), IoStatus::Success);
        assert_eq!(ch.zeroing_syncs, 3, "after zero writes too");
    }

    #[test]
    fn user_data_round_trips() {
        for sub in [
            Sub::Data,
            Sub::ZeroRange(7),
            Sub::Punch(255),
            Sub::ZeroWrite(512),
            Sub::ZeroingSync,
        ] {
            assert_eq!(decode_user_data(user_data(12345, sub)), (12345, sub));
        }
    }
}
