//! Data buffers: io_unit_size pieces of one registered region, for data moved by RDMA READ
//! (host writes) and RDMA WRITE (host reads) when it does not travel in the capsule.
//!
//! Each poll group owns its buffers outright (a free stack, no atomics): the cache *is* the
//! pool. SPDK shares one pool across poll groups with per-group caches to save memory; we size
//! per group instead, so the fast path never touches memory another reactor writes.
//!
//! Each buffer also carries how many of its leading bytes are known to hold zeroes, so that a
//! device which answers reads with zeroes (the null bdev) fills a buffer once, not per read.
//! Every way to write a buffer forgets it first: a writable view (`bytes_mut`, `many_mut`) and
//! an RDMA READ posted into it (`forget_written`, called for every READ a chain carries). Only
//! `mark_zeroed`, after the layer above zeroed the bytes itself, sets it.

use crate::device::{Mr, Pd};
use crate::error::Result;
use crate::types::{Access, Sge};
use arrayvec::ArrayVec;

pub(crate) struct DataBuffers {
    mr: Mr,
    unit: u32,
    free: Vec<u32>,
    /// Per buffer: leading bytes known to hold zeroes (see the module documentation).
    zeroed: Vec<u32>,
}

impl DataBuffers {
    pub(crate) fn new(pd: &Pd, count: u32, unit: u32) -> Result<DataBuffers> {
        // Remote access: the host's RDMA READ responses and our RDMA WRITE sources live here;
        // LOCAL_WRITE is what READ responses need (the target never grants remote access).
        let mr = pd.alloc_mr(count as usize * unit as usize, Access::LOCAL_WRITE)?;
        Ok(DataBuffers {
            mr,
            unit,
            free: (0..count).rev().collect(),
            // Unknown at first: the region's memory is the provider's.
            zeroed: vec![0; count as usize],
        })
    }

    pub(crate) fn unit(&self) -> u32 {
        self.unit
    }

    pub(crate) fn available(&self) -> u32 {
        self.free.len() as u32
    }

    pub(crate) fn get(&mut self) -> Option<u32> {
        self.free.pop()
    }

    pub(crate) fn put(&mut self, buf: u32) {
        debug_assert!(!self.free.contains(&buf), "buffer {buf} freed twice");
        self.free.push(buf);
    }

    pub(crate) fn sge(&self, buf: u32, offset: u32, len: u32) -> Sge {
        self.mr
            .sge(buf as usize * self.unit as usize + offset as usize, len)
    }

    pub(crate) fn bytes(&self, buf: u32) -> &[u8] {
        let s = buf as usize * self.unit as usize;
        // SAFETY: callers read a buffer only while no work request writing it is in flight
        // (its RDMA READ completed, or none was posted), and no rkey to it is granted.
        unsafe { self.mr.view(s..s + self.unit as usize) }
    }

    pub(crate) fn bytes_mut(&mut self, buf: u32) -> &mut [u8] {
        self.zeroed[buf as usize] = 0;
        let s = buf as usize * self.unit as usize;
        // SAFETY: callers fill a buffer only before posting a work request on it (none in
        // flight), no rkey to it is granted, and `&mut self` excludes any other view.
        unsafe { self.mr.view_mut(s..s + self.unit as usize) }
    }

    /// Writable views of several distinct buffers at once, in `bufs` order, into `out`;
    /// returns how many were written.
    pub(crate) fn many_mut<'a, const N: usize>(
        &'a mut self,
        bufs: &[u32],
        out: &mut ArrayVec<&'a mut [u8], N>,
    ) -> usize {
        let unit = self.unit as usize;
        let mut n = 0;
        for &b in bufs {
            if out.is_full() {
                break;
            }
            debug_assert!(!bufs[..n].contains(&b), "buffer {b} listed twice");
            self.zeroed[b as usize] = 0;
            let s = b as usize * unit;
            // SAFETY: the buffers a request holds are distinct pieces of the region (each taken
            // once from the free stack), so the views do not overlap; `&mut self` excludes any
            // other view for their lifetime; no work request on them is in flight (the caller
            // holds the request Idle) and no rkey to them is granted.
            out.push(unsafe { self.mr.view_mut(s..s + unit) });
            n += 1;
        }
        n
    }

    /// True when the first `len` bytes of `bufs` (in order, `unit` bytes each) are known to
    /// hold zeroes.
    pub(crate) fn known_zero(&self, bufs: &[u32], len: u32) -> bool {
        let mut left = len;
        for &b in bufs {
            if left == 0 {
                break;
            }
            let take = left.min(self.unit);
            if self.zeroed[b as usize] < take {
                return false;
            }
            left -= take;
        }
        left == 0
    }

    /// The first `len` bytes of `bufs` hold zeroes: the caller just filled them (checked in
    /// debug builds).
    pub(crate) fn mark_zeroed(&mut self, bufs: &[u32], len: u32) {
        let mut left = len;
        for &b in bufs {
            if left == 0 {
                break;
            }
            let take = left.min(self.unit);
            debug_assert!(
                self.bytes(b)[..take as usize].iter().all(|x| *x == 0),
                "buffer {b} marked zeroed but is not"
            );
            let known = &mut self.zeroed[b as usize];
            *known = (*known).max(take);
            left -= take;
        }
    }

    /// An RDMA READ is about to write `sge`: the buffers it covers are no longer known to
    /// hold zeroes (an SGE in other memory is ignored).
    pub(crate) fn forget_written(&mut self, sge: &Sge) {
        if sge.lkey != self.mr.lkey() || sge.length == 0 {
            return;
        }
        let Some(offset) = sge.addr.checked_sub(self.mr.addr()) else {
            return;
        };
        let unit = u64::from(self.unit);
        let first = offset / unit;
        let last = (offset + u64::from(sge.length) - 1) / unit;
        for b in first..=last.min(self.zeroed.len() as u64 - 1) {
            self.zeroed[b as usize] = 0;
        }
    }
}
