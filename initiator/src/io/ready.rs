//! Which of many I/O queues a poller must look at in a pass: [`ReadyQueues`].
//!
//! A reactor driving many queues (nvmf-perf's jobs, a block layer with a queue per device)
//! would otherwise poll every queue every pass, so with 1024 mostly idle queues its work per
//! pass follows the queue count, not the completions. Queues that share a completion group
//! (the RDMA host poll group: [`crate::queue::CompletionGroup`]) are instead visited only when
//! the group names them after its one CQ poll of the pass, when their owner asked to come back
//! (commands left to submit, failures to deliver), or on a sweep pass; queues without a group
//! are visited every pass, as before.
//!
//! The sweep: every [`ReadyQueues::SWEEP_EVERY`]th pass (by default) visits every item, so
//! what only a queue's own poll notices goes on being noticed: timeouts
//! ([`IoQueue`](super::IoQueue) checks them from its polls, an idle queue every 64th poll)
//! and the CM channel (the RDMA queue looks at it every 64th idle poll). Such a check thus
//! comes `SWEEP_EVERY` times later in passes than with a poll of every queue every pass:
//! 64 Ki passes, tens of milliseconds at the pass rates of a polling reactor, against I/O
//! timeouts of seconds. The sweep is rare so that it stays a small part of an idle pass: 128
//! items every 1024 passes is one visit per 8 passes, where every 64 passes it was two per
//! pass, each about as costly as the rest of an idle pass (one CQ poll). Completions and
//! connection losses are never delayed: the group names their queue in the next pass.
//!
//! Fast path: one `poll_ready` per group and one call per visited item per pass; nothing
//! allocates once the items are added.

use crate::queue::{CompletionGroup, HostQueue};

/// A member group and which item each of its queue keys belongs to.
struct Group {
    group: Box<dyn CompletionGroup>,
    /// Item by queue key (`usize::MAX`: no item of ours).
    item_of: Vec<usize>,
}

/// Visits the items (each with an I/O queue) a pass must look at (see the module
/// documentation). Items are the caller's indexes `0..n` into its own list, each added with
/// [`ReadyQueues::add`] (a sweep visits every index below the largest added).
pub struct ReadyQueues {
    groups: Vec<Group>,
    /// Items whose queue has no completion group: visited every pass.
    solo: Vec<usize>,
    /// Per item: in `next` or `current` already (so it is visited once per pass).
    queued: Vec<bool>,
    /// Items to visit in the coming pass.
    next: Vec<usize>,
    /// Items of the pass being run.
    current: Vec<usize>,
    /// Keys named by a group's `poll_ready`.
    keys: Vec<u64>,
    passes: u64,
    sweep_every: u64,
    /// Passes left until the next sweep (a count down: no division per pass).
    until_sweep: u64,
}

impl std::fmt::Debug for ReadyQueues {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadyQueues")
            .field("groups", &self.groups.len())
            .field("items", &self.queued.len())
            .field("passes", &self.passes)
            .finish()
    }
}

impl Default for ReadyQueues {
    fn default() -> Self {
        Self::new()
    }
}

impl ReadyQueues {
    /// By default every this many passes every item is visited (see the module
    /// documentation).
    pub const SWEEP_EVERY: u64 = 1024;

    /// No items yet.
    pub fn new() -> Self {
        Self {
            groups: Vec::new(),
            solo: Vec::new(),
            queued: Vec::new(),
            next: Vec::new(),
            current: Vec::new(),
            keys: Vec::new(),
            passes: 0,
            sweep_every: Self::SWEEP_EVERY,
            until_sweep: Self::SWEEP_EVERY,
        }
    }

    /// Sweeps every `passes` passes instead (`u64::MAX`: never, for a caller that checks its
    /// queues' timeouts itself; tests).
    pub fn sweep_every(mut self, passes: u64) -> Self {
        self.sweep_every = passes.max(1);
        self.until_sweep = self.sweep_every;
        self
    }

    /// Items `0..queues.len()`, item `i` driving `queues[i]`: every item is visited in the
    /// first pass.
    pub fn with_queues<'a, Q: HostQueue + 'a>(queues: impl IntoIterator<Item = &'a Q>) -> Self {
        let mut ready = Self::new();
        for (item, queue) in queues.into_iter().enumerate() {
            ready.add(item, queue);
        }
        ready
    }

    /// Item `item` drives `queue` (control path; an item added again, e.g. with a fresh queue
    /// after a reconnect, is moved to it). It is visited in the next pass.
    pub fn add<Q: HostQueue + ?Sized>(&mut self, item: usize, queue: &Q) {
        self.remove(item);
        if self.queued.len() <= item {
            self.queued.resize(item + 1, false);
        }
        match queue.completion_group() {
            Some((group, key)) => {
                let id = group.id();
                let index = match self.groups.iter().position(|g| g.group.id() == id) {
                    Some(i) => i,
                    None => {
                        self.groups.push(Group {
                            group,
                            item_of: Vec::new(),
                        });
                        self.groups.len() - 1
                    }
                };
                let item_of = &mut self.groups[index].item_of;
                let key = key as usize;
                if item_of.len() <= key {
                    item_of.resize(key + 1, usize::MAX);
                }
                item_of[key] = item;
            }
            None => self.solo.push(item),
        }
        // Capacity for every item at once: the passes never allocate.
        let items = self.queued.len();
        self.next.reserve(items.saturating_sub(self.next.len()));
        self.current
            .reserve(items.saturating_sub(self.current.len()));
        let keys = self.groups.iter().map(|g| g.item_of.len()).max();
        self.keys
            .reserve(keys.unwrap_or(0).saturating_sub(self.keys.len()));
        self.queue(item);
    }

    /// Forgets `item`'s queue.
    fn remove(&mut self, item: usize) {
        self.solo.retain(|&i| i != item);
        for g in &mut self.groups {
            for slot in g.item_of.iter_mut().filter(|i| **i == item) {
                *slot = usize::MAX;
            }
        }
    }

    fn queue(&mut self, item: usize) {
        if !self.queued[item] {
            self.queued[item] = true;
            self.next.push(item);
        }
    }

    /// One pass: polls each completion group once, then calls `visit(item)` once for each
    /// item whose queue the group named, each item `visit` asked back in the previous pass,
    /// each item without a group, and, on a sweep pass, every item. `visit` polls the item's
    /// queue (and submits) and returns true when the item wants the next pass whatever its
    /// queue reports: it has commands to submit, or its queue has failures to deliver
    /// ([`super::IoQueue::wants_poll`]).
    pub fn pass(&mut self, mut visit: impl FnMut(usize) -> bool) {
        self.passes += 1;
        std::mem::swap(&mut self.current, &mut self.next);
        for g in &mut self.groups {
            self.keys.clear();
            g.group.poll_ready(&mut self.keys);
            for &key in &self.keys {
                if let Some(&item) = g.item_of.get(key as usize) {
                    if item != usize::MAX && !self.queued[item] {
                        self.queued[item] = true;
                        self.current.push(item);
                    }
                }
            }
        }
        for &item in &self.solo {
            if !self.queued[item] {
                self.queued[item] = true;
                self.current.push(item);
            }
        }
        self.until_sweep -= 1;
        if self.until_sweep == 0 {
            self.until_sweep = self.sweep_every;
            for (item, queued) in self.queued.iter_mut().enumerate() {
                if !*queued {
                    *queued = true;
                    self.current.push(item);
                }
            }
        }
        for &item in &self.current {
            self.queued[item] = false;
            if visit(item) {
                self.queued[item] = true;
                self.next.push(item);
            }
        }
        self.current.clear();
    }

    /// Passes run so far.
    pub fn passes(&self) -> u64 {
        self.passes
    }
}

#[cfg(test)]
mod tests {
    use std::ops::Range;
    use std::sync::{Arc, Mutex};

    use nvmf_protocol::{Cqe, Sqe};

    use super::*;
    use crate::queue::{DataRegion, QueueError};

    /// Keys the test wants the group to name at its next `poll_ready`.
    #[derive(Clone, Default)]
    struct FakeGroup(Arc<Mutex<Vec<u64>>>);

    impl CompletionGroup for FakeGroup {
        fn id(&self) -> usize {
            Arc::as_ptr(&self.0) as usize
        }
        fn poll_ready(&mut self, ready: &mut Vec<u64>) {
            ready.append(&mut self.0.lock().unwrap());
        }
    }

    /// A queue of `group` with `key`, or of none.
    struct FakeQueue(Option<(FakeGroup, u64)>);

    impl HostQueue for FakeQueue {
        fn qid(&self) -> u16 {
            1
        }
        fn depth(&self) -> u16 {
            1
        }
        fn region(&self) -> DataRegion {
            DataRegion {
                address: 0,
                key: 0,
                len: 0,
            }
        }
        fn region_bytes(&self) -> &[u8] {
            &[]
        }
        fn region_bytes_mut(&mut self) -> &mut [u8] {
            &mut []
        }
        fn submit(&mut self, _: &Sqe, _: Option<Range<usize>>) -> Result<(), QueueError> {
            Ok(())
        }
        fn poll(&mut self, _: &mut [Cqe]) -> Result<usize, QueueError> {
            Ok(0)
        }
        fn is_connected(&self) -> bool {
            true
        }
        fn disconnect(&mut self) {}
        fn completion_group(&self) -> Option<(Box<dyn CompletionGroup>, u64)> {
            self.0
                .as_ref()
                .map(|(g, key)| (Box::new(g.clone()) as Box<dyn CompletionGroup>, *key))
        }
    }

    /// The items one pass visits (sorted); `again` are asked back.
    fn pass(ready: &mut ReadyQueues, again: &[usize]) -> Vec<usize> {
        let mut visited = Vec::new();
        ready.pass(|item| {
            visited.push(item);
            again.contains(&item)
        });
        visited.sort_unstable();
        visited
    }

    #[test]
    fn a_pass_visits_named_asked_back_solo_and_on_sweeps_every_item() {
        let group = FakeGroup::default();
        let queues = [
            FakeQueue(Some((group.clone(), 5))),
            FakeQueue(Some((group.clone(), 6))),
            FakeQueue(None),
            FakeQueue(Some((group.clone(), 9))),
        ];
        let mut ready = ReadyQueues::with_queues(queues.iter()).sweep_every(5);
        assert_eq!(pass(&mut ready, &[]), [0, 1, 2, 3], "everyone first");
        assert_eq!(pass(&mut ready, &[]), [2], "only the queue without a group");
        group.0.lock().unwrap().extend([9, 6, 9, 42]);
        assert_eq!(
            pass(&mut ready, &[3]),
            [1, 2, 3],
            "named once each; 42 is no one's"
        );
        assert_eq!(pass(&mut ready, &[]), [2, 3], "asked back");
        assert_eq!(pass(&mut ready, &[]), [0, 1, 2, 3], "the sweep");
        assert_eq!(pass(&mut ready, &[]), [2]);
        // A fresh queue for item 1 (after a reconnect): visited next, then by its new key.
        ready.add(1, &FakeQueue(Some((group.clone(), 7))));
        assert_eq!(pass(&mut ready, &[]), [1, 2]);
        group.0.lock().unwrap().extend([6, 7]);
        assert_eq!(pass(&mut ready, &[]), [1, 2], "the old key names no one");
        assert_eq!(ready.passes(), 8);
    }
}
