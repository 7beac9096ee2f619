//! Data buffers: io_unit_size pieces of one registered region, for data moved by RDMA READ
//! (host writes) and RDMA WRITE (host reads) when it does not travel in the capsule.
//!
//! Each poll group owns its buffers outright (a free stack, no atomics): the cache *is* the
//! pool. SPDK shares one pool across poll groups with per-group caches to save memory; we size
//! per group instead, so the fast path never touches memory another reactor writes.

use crate::device::{Mr, Pd};
use crate::error::Result;
use crate::types::{Access, Sge};

pub(crate) struct DataBuffers {
    mr: Mr,
    unit: u32,
    free: Vec<u32>,
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
        let s = buf as usize * self.unit as usize;
        // SAFETY: callers fill a buffer only before posting a work request on it (none in
        // flight), no rkey to it is granted, and `&mut self` excludes any other view.
        unsafe { self.mr.view_mut(s..s + self.unit as usize) }
    }

    /// Writable views of several distinct buffers at once, in `bufs` order, into `out`;
    /// returns how many were written.
    pub(crate) fn many_mut<'a>(&'a mut self, bufs: &[u32], out: &mut [&'a mut [u8]]) -> usize {
        let unit = self.unit as usize;
        let mut n = 0;
        for (slot, &b) in out.iter_mut().zip(bufs) {
            debug_assert!(!bufs[..n].contains(&b), "buffer {b} listed twice");
            let s = b as usize * unit;
            // SAFETY: the buffers a request holds are distinct pieces of the region (each taken
            // once from the free stack), so the views do not overlap; `&mut self` excludes any
            // other view for their lifetime; no work request on them is in flight (the caller
            // holds the request Idle) and no rkey to them is granted.
            *slot = unsafe { self.mr.view_mut(s..s + unit) };
            n += 1;
        }
        n
    }
}
