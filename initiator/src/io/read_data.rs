//! The data of one finished command as a lazy consumer ([`super::IoQueue::poll_lazy`]) sees
//! it: the bytes stay in the queue's registered region until first asked for, so a consumer
//! that never looks (nvmf-perf without --verify) pays no copy.
//!
//! Why the bytes asked for are always the command's own: a `ReadData` borrows the queue
//! mutably and lives only for the completion callback, so nothing can be submitted (and no
//! slot reused) between the command's CQE and the copy; the copy is of exactly the
//! command's slot range.

use std::ops::Range;

use crate::error::Result;
use crate::queue::HostQueue;

/// One finished command's data (empty for anything but a successful read).
pub struct ReadData<'a, Q: HostQueue> {
    queue: &'a mut Q,
    range: Range<usize>,
    /// The host view of `range` holds the command's data already.
    fetched: bool,
}

impl<Q: HostQueue> std::fmt::Debug for ReadData<'_, Q> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadData")
            .field("range", &self.range)
            .field("fetched", &self.fetched)
            .finish()
    }
}

impl<'a, Q: HostQueue> ReadData<'a, Q> {
    /// The data of `range` of `queue`'s region; `fetched`: the host view holds it already.
    pub(super) fn new(queue: &'a mut Q, range: Range<usize>, fetched: bool) -> Self {
        Self {
            queue,
            range,
            fetched,
        }
    }

    /// Bytes of data.
    pub fn len(&self) -> usize {
        self.range.len()
    }

    /// True when the command brought no data.
    pub fn is_empty(&self) -> bool {
        self.range.is_empty()
    }

    /// The data, copied out of the registered region on first use. Err: the copy failed (the
    /// data is not available; the command itself completed).
    pub fn bytes(&mut self) -> Result<&[u8]> {
        if !self.fetched && !self.range.is_empty() {
            self.queue.fetch(self.range.clone())?;
            self.fetched = true;
        }
        Ok(&self.queue.region_bytes()[self.range.clone()])
    }
}
