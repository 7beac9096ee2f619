//! Request objects and the calls the layer above makes on them.
//!
//! A request is born when a capsule arrives and a request object is free, lives while the layer
//! above moves its data (RDMA READ) and answers it (RDMA WRITE + SEND), and dies at `finish`.
//! Receive slots and request objects are separate pools: a host may send its next command as
//! soon as it sees a response, before that response's SEND completion is reaped here.

use crate::error::{Result, TransportError};
use crate::types::{SendFlags, SendOp, Sge, WcStatus};

use super::qpair::{MAX_WR_SGES, QpairPhase, QueuedWr};
use super::wrid::{self, WrKind};
use super::{MAX_CHAIN, PollGroup, lifecycle::QpairEvent};

/// Names a request object (an index into the group's slab).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ReqId(pub(crate) u32);

impl ReqId {
    pub fn index(self) -> u32 {
        self.0
    }
}

const NO_SLOT: u32 = u32::MAX;

/// A request object: transport bookkeeping plus the layer above's own state `R`.
pub struct Request<R> {
    qp_num: u32,
    /// The receive slot holding the capsule, until released.
    slot: u32,
    bufs: [u32; MAX_WR_SGES],
    nbufs: u8,
    /// WRs of the chain in flight not yet completed.
    chain_left: u32,
    chain_status: WcStatus,
    answered: bool,
    pub user: R,
}

impl<R> Request<R> {
    pub fn qp_num(&self) -> u32 {
        self.qp_num
    }
    pub fn chain_in_flight(&self) -> bool {
        self.chain_left > 0
    }
}

/// One work request of a chain posted for a request.
#[derive(Clone, Copy, Debug)]
pub struct ChainWr<'a> {
    pub kind: WrKind,
    pub op: SendOp,
    pub sges: &'a [Sge],
    /// Copy the payload into the WR (small SENDs).
    pub inline: bool,
}

/// What the layer above (target or tests) does with what the poll group reaps.
pub trait Handler<R> {
    /// A capsule arrived on qpair `qp_num` and got request `req`; `pg.capsule(req)` holds it.
    fn capsule(&mut self, pg: &mut PollGroup<R>, req: ReqId);
    /// The chain posted for `req` finished: `Success`, or the first error of its WRs.
    fn chain_done(&mut self, pg: &mut PollGroup<R>, req: ReqId, last: WrKind, status: WcStatus);
    /// A qpair moved on. Before `Gone`, requests still alive on it are reported to `aborted`
    /// and freed.
    fn qpair_event(&mut self, pg: &mut PollGroup<R>, qp_num: u32, token: u64, event: QpairEvent);
    /// `req` is freed by the poll group (its qpair is gone); forget it.
    fn aborted(&mut self, _pg: &mut PollGroup<R>, _req: ReqId) {}
}

impl<R> PollGroup<R> {
    pub fn request(&self, req: ReqId) -> Option<&Request<R>> {
        self.reqs.get(req.0 as usize)
    }

    pub fn request_mut(&mut self, req: ReqId) -> Option<&mut Request<R>> {
        self.reqs.get_mut(req.0 as usize)
    }

    fn req_ref(&self, req: ReqId) -> Result<&Request<R>> {
        self.reqs
            .get(req.0 as usize)
            .ok_or_else(|| TransportError::InvalidArgument(format!("no request {req:?}")))
    }

    /// The capsule bytes (SQE + in-capsule data) of `req`, empty once released.
    pub fn capsule(&self, req: ReqId) -> &[u8] {
        match self.reqs.get(req.0 as usize) {
            Some(r) if r.slot != NO_SLOT => self.recv.bytes(r.slot),
            _ => &[],
        }
    }

    /// Done with the capsule bytes: the slot goes back to the SRQ at the end of this poll.
    pub fn release_capsule(&mut self, req: ReqId) {
        if let Some(r) = self.reqs.get_mut(req.0 as usize) {
            if r.slot != NO_SLOT {
                self.recv.queue_repost(r.slot);
                r.slot = NO_SLOT;
            }
        }
    }

    /// Gives `req` enough data buffers for `len` bytes. Err when too few are free now (retry
    /// after other requests finish) or `len` needs more than MAX_WR_SGES buffers.
    pub fn alloc_buffers(&mut self, req: ReqId, len: u32) -> Result<()> {
        let unit = self.bufs.unit();
        let need = len.div_ceil(unit) as usize;
        if need > MAX_WR_SGES {
            return Err(TransportError::InvalidArgument(format!(
                "{len} bytes need {need} buffers, max {MAX_WR_SGES}"
            )));
        }
        let r = self
            .reqs
            .get_mut(req.0 as usize)
            .ok_or(TransportError::InvalidArgument("no such request".into()))?;
        if r.nbufs as usize >= need {
            return Ok(());
        }
        if self.bufs.available() < (need - r.nbufs as usize) as u32 {
            return Err(TransportError::QueueFull("data buffer pool"));
        }
        while (r.nbufs as usize) < need {
            r.bufs[r.nbufs as usize] = self.bufs.get().expect("checked available");
            r.nbufs += 1;
        }
        Ok(())
    }

    /// SGEs covering the first `len` bytes of `req`'s buffers; returns how many were written.
    pub fn buffer_sges(&self, req: ReqId, len: u32, out: &mut [Sge; MAX_WR_SGES]) -> usize {
        let Some(r) = self.reqs.get(req.0 as usize) else {
            return 0;
        };
        let unit = self.bufs.unit();
        let mut left = len;
        let mut n = 0;
        while left > 0 && n < r.nbufs as usize {
            let take = left.min(unit);
            out[n] = self.bufs.sge(r.bufs[n], 0, take);
            left -= take;
            n += 1;
        }
        n
    }

    /// Buffer `i` of `req` (io_unit_size bytes).
    pub fn buffer(&self, req: ReqId, i: usize) -> &[u8] {
        match self.reqs.get(req.0 as usize) {
            Some(r) if i < r.nbufs as usize => self.bufs.bytes(r.bufs[i]),
            _ => &[],
        }
    }

    pub fn buffer_mut(&mut self, req: ReqId, i: usize) -> &mut [u8] {
        match self.reqs.get(req.0 as usize) {
            Some(r) if i < r.nbufs as usize => {
                let b = r.bufs[i];
                self.bufs.bytes_mut(b)
            }
            _ => &mut [],
        }
    }

    /// Queues a chain of WRs for `req` (posted as a list at the end of the poll; the last one
    /// is signaled, the others are not). `answers` marks the chain as the command's response:
    /// the host may send another command from now on, so the qpair's flow-control count drops.
    pub fn post_chain(&mut self, req: ReqId, chain: &[ChainWr<'_>], answers: bool) -> Result<()> {
        let r = self.req_ref(req)?;
        if r.chain_left > 0 {
            return Err(TransportError::InvalidArgument(format!(
                "{req:?} already has a chain in flight"
            )));
        }
        if chain.is_empty() || chain.len() > MAX_CHAIN as usize {
            return Err(TransportError::InvalidArgument(format!(
                "a chain has 1..={MAX_CHAIN} work requests"
            )));
        }
        if answers && r.answered {
            return Err(TransportError::InvalidArgument(format!(
                "{req:?} was already answered"
            )));
        }
        let qp_num = r.qp_num;
        let max_inline = self.max_inline;
        let mut queued = [None; MAX_CHAIN as usize];
        for (i, wr) in chain.iter().enumerate() {
            let mut flags = if i + 1 == chain.len() {
                SendFlags::SIGNALED
            } else {
                SendFlags::empty()
            };
            let payload: u32 = wr.sges.iter().map(|s| s.length).sum();
            if wr.inline && payload <= max_inline {
                flags |= SendFlags::INLINE;
            }
            queued[i] = Some(
                QueuedWr::new(wrid::encode(wr.kind, req.0), wr.op, wr.sges, flags).ok_or_else(
                    || TransportError::InvalidArgument(format!("more than {MAX_WR_SGES} SGEs")),
                )?,
            );
        }
        let ok = self.with_qpair(qp_num, |st| {
            for q in queued.iter().flatten() {
                st.queued.push(*q);
            }
            st.chain_posted(chain.len() as u32);
            if answers {
                st.outstanding = st.outstanding.saturating_sub(1);
            }
            let first = !st.dirty;
            st.dirty = true;
            first
        });
        match ok {
            Some(first) => {
                if first {
                    self.dirty.push(qp_num);
                }
            }
            None => {
                return Err(TransportError::InvalidArgument(format!(
                    "{req:?}'s qpair {qp_num:#x} is gone"
                )));
            }
        }
        let r = self.reqs.get_mut(req.0 as usize).expect("checked above");
        r.chain_left = chain.len() as u32;
        r.chain_status = WcStatus::Success;
        r.answered |= answers;
        Ok(())
    }

    /// The request is over: its buffers, capsule slot and object go back. A request that was
    /// never answered still counts against its qpair's depth until here.
    pub fn finish(&mut self, req: ReqId) {
        let Some(r) = self.reqs.try_remove(req.0 as usize) else {
            return;
        };
        for &b in &r.bufs[..r.nbufs as usize] {
            self.bufs.put(b);
        }
        if r.slot != NO_SLOT {
            self.recv.queue_repost(r.slot);
        }
        let answered = r.answered;
        self.with_qpair(r.qp_num, |st| {
            st.requests -= 1;
            if !answered {
                st.outstanding = st.outstanding.saturating_sub(1);
            }
        });
    }

    /// A new request for a capsule in `slot` on `qp_num`, or None when the slab is full.
    pub(crate) fn new_request(&mut self, qp_num: u32, slot: u32) -> Option<ReqId>
    where
        R: Default,
    {
        if self.reqs.len() >= self.cfg.max_requests as usize {
            return None;
        }
        let idx = self.reqs.insert(Request {
            qp_num,
            slot,
            bufs: [0; MAX_WR_SGES],
            nbufs: 0,
            chain_left: 0,
            chain_status: WcStatus::Success,
            answered: false,
            user: R::default(),
        });
        self.with_qpair(qp_num, |st| st.requests += 1);
        Some(ReqId(idx as u32))
    }

    /// A WR of `req`'s chain completed. Returns the chain's final status once it is over.
    pub(crate) fn chain_progress(
        &mut self,
        req: ReqId,
        qp_num: u32,
        status: WcStatus,
    ) -> Option<WcStatus> {
        let r = self.reqs.get_mut(req.0 as usize)?;
        if r.qp_num != qp_num || r.chain_left == 0 {
            return None;
        }
        if status == WcStatus::Success {
            // A signaled success covers every WR of the run before it.
            r.chain_left = 0;
        } else {
            if r.chain_status == WcStatus::Success {
                r.chain_status = status;
            }
            r.chain_left -= 1;
        }
        (r.chain_left == 0).then_some(r.chain_status)
    }

    /// Frees every request still alive on `qp_num`, telling the handler first.
    pub(crate) fn abort_requests<H: Handler<R>>(&mut self, h: &mut H, qp_num: u32) {
        let ids: Vec<usize> = self
            .reqs
            .iter()
            .filter(|(_, r)| r.qp_num == qp_num)
            .map(|(i, _)| i)
            .collect();
        for i in ids {
            h.aborted(self, ReqId(i as u32));
            self.finish(ReqId(i as u32));
        }
    }

    /// Whether `qp_num` is in the tree and active (or still connecting).
    pub fn qpair_phase(&self, qp_num: u32) -> Option<QpairPhase> {
        self.tree.find(&qp_num).get().map(|q| q.st.borrow().phase)
    }

    /// The layer above's token for `qp_num`.
    pub fn qpair_token(&self, qp_num: u32) -> Option<u64> {
        self.tree.find(&qp_num).get().map(|q| q.st.borrow().token)
    }

    /// Runs `f` on `qp_num`'s state; None when it is not in the tree.
    pub(crate) fn with_qpair<T>(
        &self,
        qp_num: u32,
        f: impl FnOnce(&mut super::qpair::QpairState) -> T,
    ) -> Option<T> {
        self.tree
            .find(&qp_num)
            .get()
            .map(|q| f(&mut q.st.borrow_mut()))
    }
}
