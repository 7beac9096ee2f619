//! Request objects and the calls the layer above makes on them.
//!
//! A request is born when a capsule arrives and a request object is free, lives while the layer
//! above moves its data (RDMA READ) and answers it (RDMA WRITE + SEND), and dies at `finish`.
//! Its life is `RequestState`; each chain it posts is stored in it (`chain.rs`) and waits, in
//! FIFO order on its qpair, for send-queue and RDMA READ room; a request waiting for data
//! buffers waits in the group's FIFO and hears `Handler::buffers_ready` when its turn comes.
//!
//! When its qpair goes, a request is marked aborted and the handler hears `aborted`, but its
//! buffers and capsule slot stay its own until the layer above calls `finish` (an I/O may still
//! be writing into them). Receive slots and request objects are separate pools: a host may send
//! its next command as soon as it sees a response, before that response's SEND completion is
//! reaped here.

use arrayvec::ArrayVec;

use crate::error::{Result, TransportError};
use crate::types::{SendOp, Sge, WcStatus};

use super::PollGroup;
use super::chain::{ChainWr, MAX_CHAIN_SGES};
use super::lifecycle::QpairEvent;
use super::qpair::{QpRef, QpairPhase, live_mut};
use super::wrid::{self, WrKind};

/// Names a request object: slab index and generation, so a stale id never reaches a reused
/// object.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ReqId {
    pub(crate) index: u32,
    pub(crate) generation: u32,
}

impl ReqId {
    pub fn index(self) -> u32 {
        self.index
    }
}

const NO_SLOT: u32 = u32::MAX;
/// Most data buffers one request holds.
pub const MAX_REQUEST_BUFFERS: usize = MAX_CHAIN_SGES;

/// Where a request is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestState {
    /// With the layer above (parsing, block I/O, deciding what to post next).
    Idle,
    /// In the group's FIFO for data buffers.
    WaitingBuffers,
    /// Its chain waits in its qpair's FIFO for send-queue / READ room.
    WaitingToPost,
    /// Its chain is on the send queue.
    Posted,
}

/// A request object: transport bookkeeping plus the layer above's own state `R`.
pub struct Request<R> {
    qp_num: u32,
    pub(crate) qpair: QpRef,
    /// The receive slot holding the capsule, until released.
    slot: u32,
    bufs: [u32; MAX_REQUEST_BUFFERS],
    nbufs: u8,
    /// Buffers asked for while waiting.
    want_bufs: u8,
    pub(crate) state: RequestState,
    /// Its qpair went: no more callbacks but `finish` frees it.
    aborted: bool,
    /// `finish` was called while the chain was on the send queue: freed when it completes.
    finishing: bool,
    /// The command's depth slot went back (its answer was posted, or it was finished).
    depth_released: bool,
    /// The chain in storage answers the command.
    answers: bool,
    /// The chain in storage reads and writes only memory this request holds
    /// (`PollGroup::post_chain_owned`): it may wait for a later completion to retire it.
    pub(crate) owned: bool,
    /// Its chain is in its qpair's silent FIFO (posted without a completion of its own, not
    /// yet retired): counted in the group's `Held`.
    pub(crate) silent: bool,
    /// When its chain went to the send queue, in its qpair's post order (wrapping).
    pub(crate) post_seq: u32,
    /// Host side: born by `submit`; over when its SEND and its response are both in.
    pub(crate) host: Option<HostProgress>,
    pub user: R,
}

impl<R> Request<R> {
    pub fn qp_num(&self) -> u32 {
        self.qp_num
    }
    /// Its qpair's slot in the group (below `max_qpairs`, unique among live qpairs; reused
    /// after the qpair is gone): what the layer above indexes its per-qpair state by, with no
    /// search per command.
    pub fn qpair_index(&self) -> u32 {
        self.qpair.index
    }
    pub fn state(&self) -> RequestState {
        self.state
    }
    pub fn aborted(&self) -> bool {
        self.aborted
    }
    pub fn chain_in_flight(&self) -> bool {
        matches!(
            self.state,
            RequestState::Posted | RequestState::WaitingToPost
        )
    }
    pub fn buffer_count(&self) -> usize {
        self.nbufs as usize
    }
    pub(crate) fn want_bufs_left(&self) -> usize {
        (self.want_bufs as usize).saturating_sub(self.nbufs as usize)
    }
    /// Its chain went to the send queue. True when that gives its command's depth slot back
    /// (the chain answers the command): the caller lowers its qpair's `outstanding`.
    #[inline]
    pub(crate) fn mark_posted(&mut self) -> bool {
        self.state = RequestState::Posted;
        let release = self.answers && !self.depth_released;
        self.depth_released |= release;
        release
    }
}

/// A host request's two halves.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct HostProgress {
    pub send_done: bool,
    pub response: bool,
    pub reported: bool,
}

/// What `alloc_buffers` did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BufferGrant {
    /// The buffers are the request's now.
    Ready,
    /// Too few free: the request waits its turn (FIFO) and the handler hears `buffers_ready`.
    Waiting,
}

/// What the layer above (target, initiator, tests) does with what the poll group reaps.
pub trait Handler<R> {
    /// A capsule arrived and got request `req`; `pg.capsule(req)` holds it.
    fn capsule(&mut self, pg: &mut PollGroup<R>, req: ReqId);
    /// The chain posted for `req` finished: `Success`, or the first error of its WRs. `last` is
    /// the kind of its last WR (READ: the data is in; SEND: the answer went).
    fn chain_done(&mut self, pg: &mut PollGroup<R>, req: ReqId, last: WrKind, status: WcStatus);
    /// A qpair moved on. Before `Gone`, requests still alive on it are reported to `aborted`.
    fn qpair_event(&mut self, pg: &mut PollGroup<R>, qp_num: u32, token: u64, event: QpairEvent);
    /// `req`'s qpair is gone. No other callback comes for it; its buffers and capsule stay
    /// valid until the layer above calls `pg.finish(req)` (once its own I/O is over).
    fn aborted(&mut self, pg: &mut PollGroup<R>, req: ReqId);
    /// The buffers `req` waited for are its own now.
    fn buffers_ready(&mut self, pg: &mut PollGroup<R>, req: ReqId);
    /// Host side: a capsule (a response: the 16-byte CQE first) arrived on `qp_num`, the
    /// qpair added with `token`. The initiator matches its CID and calls
    /// `pg.response_received(req)`; the bytes are valid during this call only.
    fn response(&mut self, _pg: &mut PollGroup<R>, qp_num: u32, _token: u64, capsule: &[u8]) {
        tracing::warn!(
            qp_num,
            len = capsule.len(),
            "response capsule with no handler"
        );
    }
    /// Host side: `req`'s command SEND completed and its response arrived (in either order),
    /// or its SEND failed (`status`). The request is the initiator's to `finish`.
    fn request_complete(&mut self, pg: &mut PollGroup<R>, req: ReqId, _status: WcStatus) {
        pg.finish(req);
    }
    /// Called by the reactor on every poll of the group, before the group's own polling:
    /// work of the layer above that completes outside the CQ (block-device completions,
    /// events) is handled here; chains it posts go out at the end of the same poll. Returns
    /// the work done (0 = idle).
    fn poll_side(&mut self, _pg: &mut PollGroup<R>) -> usize {
        0
    }
    /// The layer above has work in flight outside the CQ: the reactor must not sleep.
    fn busy(&self) -> bool {
        false
    }
    /// Called on a timer by the reactor (also while it sleeps otherwise): the layer above's
    /// slow work (events for the host, torn-down associations).
    fn tick(&mut self, _pg: &mut PollGroup<R>) {}
    /// A qpair the layer above wants disconnected (asked after `poll_side` until None).
    fn take_disconnect(&mut self) -> Option<u32> {
        None
    }
    /// The group's CQ failed: every qpair is being torn down and the group takes no more
    /// work. Its requests are reported to `aborted` as their qpairs go.
    fn group_failed(&mut self, _pg: &mut PollGroup<R>, error: &str) {
        tracing::error!(error, "poll group failed");
    }
}

impl<R> PollGroup<R> {
    pub fn request(&self, req: ReqId) -> Option<&Request<R>> {
        self.reqs
            .get(req.index as usize)
            .filter(|_| self.req_generation[req.index as usize] == req.generation)
    }

    pub fn request_mut(&mut self, req: ReqId) -> Option<&mut Request<R>> {
        let live = self.req_generation.get(req.index as usize) == Some(&req.generation);
        self.reqs.get_mut(req.index as usize).filter(|_| live)
    }

    fn live(&mut self, req: ReqId) -> Result<&mut Request<R>> {
        self.request_mut(req)
            .ok_or_else(|| TransportError::InvalidArgument(format!("no request {req:?}")))
    }

    /// The capsule bytes (SQE + in-capsule data) of `req`, empty once released.
    pub fn capsule(&self, req: ReqId) -> &[u8] {
        match self.request(req) {
            Some(r) if r.slot != NO_SLOT => self.recv.bytes(r.slot),
            _ => &[],
        }
    }

    /// The capsule bytes of `req`, writable, for lending its in-capsule data to block I/O in
    /// place (no copy, no data buffer). Empty once released, or while a chain of `req` is in
    /// flight. The slot stays `req`'s (Held, off the SRQ) until `release_capsule` or `finish`:
    /// a caller whose block I/O completes asynchronously calls neither before it has.
    pub fn capsule_mut(&mut self, req: ReqId) -> &mut [u8] {
        match self.request(req) {
            Some(r) if r.slot != NO_SLOT && !r.chain_in_flight() => {
                let slot = r.slot;
                self.recv.bytes_mut(slot)
            }
            _ => &mut [],
        }
    }

    /// Done with the capsule bytes: the slot goes back to the SRQ at the end of this poll.
    pub fn release_capsule(&mut self, req: ReqId) {
        let Some(r) = self.request_mut(req) else {
            return;
        };
        let slot = std::mem::replace(&mut r.slot, NO_SLOT);
        if slot != NO_SLOT {
            self.recv.release(slot);
        }
    }

    /// Gives `req` enough data buffers for `len` bytes, or parks it in the group's FIFO
    /// (`Waiting`; the handler hears `buffers_ready`). Err for a length beyond
    /// MAX_REQUEST_BUFFERS units, an aborted request, or one already waiting.
    pub fn alloc_buffers(&mut self, req: ReqId, len: u32) -> Result<BufferGrant> {
        let unit = self.bufs.unit();
        let need = len.div_ceil(unit) as usize;
        if need > MAX_REQUEST_BUFFERS || need > self.cfg.data_buffers as usize {
            return Err(TransportError::InvalidArgument(format!(
                "{len} bytes need {need} buffers, max {}",
                MAX_REQUEST_BUFFERS.min(self.cfg.data_buffers as usize)
            )));
        }
        let queue_empty = self.buf_wait.is_empty();
        let available = self.bufs.available() as usize;
        let r = self.live(req)?;
        if r.aborted || r.state != RequestState::Idle {
            return Err(TransportError::InvalidArgument(format!(
                "{req:?} cannot take buffers now ({:?}, aborted {})",
                r.state, r.aborted
            )));
        }
        let have = r.nbufs as usize;
        if have >= need {
            return Ok(BufferGrant::Ready);
        }
        if queue_empty && available >= need - have {
            self.take_buffers(req.index, need);
            return Ok(BufferGrant::Ready);
        }
        r.want_bufs = need as u8;
        r.state = RequestState::WaitingBuffers;
        self.buf_wait.push_back(&mut self.req_links, req.index);
        self.stats.buffer_waits += 1;
        Ok(BufferGrant::Waiting)
    }

    /// Gives `req`'s data buffers back now, before it finishes: its data has moved and what it
    /// posts next reads none of them (a response without data), so a response the host is slow
    /// to take (RNR, retried for ever) holds no buffer that other commands wait for. Refused
    /// (false) while a chain of the request may still be on the send queue, or for an aborted
    /// request. Requests waiting for buffers are served at the end of the poll.
    pub fn release_buffers(&mut self, req: ReqId) -> bool {
        let Some(r) = self.request_mut(req) else {
            return false;
        };
        if r.aborted || r.chain_in_flight() || r.state == RequestState::WaitingBuffers {
            return false;
        }
        let n = std::mem::take(&mut r.nbufs) as usize;
        let bufs = r.bufs;
        for &b in &bufs[..n] {
            self.bufs.put(b);
        }
        true
    }

    fn take_buffers(&mut self, index: u32, need: usize) {
        let r = &mut self.reqs[index as usize];
        while (r.nbufs as usize) < need {
            r.bufs[r.nbufs as usize] = self.bufs.get().expect("checked available");
            r.nbufs += 1;
        }
    }

    /// Requests waiting for buffers, served in order while the head's need can be met.
    pub(crate) fn serve_buffer_waiters<H: Handler<R>>(&mut self, h: &mut H) {
        while let Some(index) = self.buf_wait.front() {
            let r = &self.reqs[index as usize];
            if (self.bufs.available() as usize) < r.want_bufs_left() {
                break;
            }
            self.buf_wait.pop_front(&mut self.req_links);
            let need = r.want_bufs as usize;
            self.take_buffers(index, need);
            self.reqs[index as usize].state = RequestState::Idle;
            let req = ReqId {
                index,
                generation: self.req_generation[index as usize],
            };
            h.buffers_ready(self, req);
        }
    }

    /// SGEs covering the first `len` bytes of `req`'s buffers; returns how many were written.
    pub fn buffer_sges(&self, req: ReqId, len: u32, out: &mut [Sge]) -> usize {
        let Some(r) = self.request(req) else {
            return 0;
        };
        let unit = self.bufs.unit();
        let mut left = len;
        let mut n = 0;
        while left > 0 && n < r.nbufs as usize && n < out.len() {
            let take = left.min(unit);
            out[n] = self.bufs.sge(r.bufs[n], 0, take);
            left -= take;
            n += 1;
        }
        n
    }

    /// As [`PollGroup::buffer_sges`], appended to `out` (nothing initialised first; stops
    /// when `out` is full).
    pub fn buffer_sges_into<const N: usize>(
        &self,
        req: ReqId,
        len: u32,
        out: &mut ArrayVec<Sge, N>,
    ) {
        let Some(r) = self.request(req) else {
            return;
        };
        let unit = self.bufs.unit();
        let mut left = len;
        for &b in &r.bufs[..r.nbufs as usize] {
            if left == 0 || out.is_full() {
                break;
            }
            let take = left.min(unit);
            out.push(self.bufs.sge(b, 0, take));
            left -= take;
        }
    }

    /// Buffer `i` of `req` (io_unit_size bytes).
    pub fn buffer(&self, req: ReqId, i: usize) -> &[u8] {
        match self.request(req) {
            Some(r) if i < r.nbufs as usize => self.bufs.bytes(r.bufs[i]),
            _ => &[],
        }
    }

    pub fn buffer_mut(&mut self, req: ReqId, i: usize) -> &mut [u8] {
        match self.request(req) {
            Some(r) if i < r.nbufs as usize => {
                let b = r.bufs[i];
                self.bufs.bytes_mut(b)
            }
            _ => &mut [],
        }
    }

    /// Copies `len` bytes of `req`'s capsule, from `offset` (counted from the capsule's start),
    /// into its data buffers in order: in-capsule data moved where block I/O can keep it
    /// after the receive slot goes back. Returns the bytes copied (short when the capsule or
    /// the buffers end first).
    pub fn capsule_to_buffers(&mut self, req: ReqId, offset: usize, len: usize) -> usize {
        let Some(r) = self.request(req) else {
            return 0;
        };
        if r.slot == NO_SLOT || r.chain_in_flight() {
            return 0;
        }
        let (slot, bufs, n) = (r.slot, r.bufs, r.nbufs as usize);
        let src = self.recv.bytes(slot);
        let mut src = src.get(offset..).unwrap_or(&[]);
        src = &src[..len.min(src.len())];
        let mut copied = 0;
        for &b in &bufs[..n] {
            if src.is_empty() {
                break;
            }
            let dst = self.bufs.bytes_mut(b);
            let take = dst.len().min(src.len());
            dst[..take].copy_from_slice(&src[..take]);
            src = &src[take..];
            copied += take;
        }
        copied
    }

    /// Writable views of all of `req`'s buffers at once (in transfer order) appended to `out`
    /// (as many as it has room for), for the layer above to lend them to block I/O as one
    /// scatter list; returns how many. Only while no chain of `req` is in flight (nothing else
    /// touches them then).
    pub fn buffers_mut<'a, const N: usize>(
        &'a mut self,
        req: ReqId,
        out: &mut ArrayVec<&'a mut [u8], N>,
    ) -> usize {
        let Some(r) = self.request(req) else {
            return 0;
        };
        if r.chain_in_flight() {
            return 0;
        }
        let (bufs, n) = (r.bufs, r.nbufs as usize);
        self.bufs.many_mut(&bufs[..n], out)
    }

    /// As [`PollGroup::buffers_mut`], and whether the first `len` bytes of those buffers were
    /// known to hold zeroes (written only by [`PollGroup::mark_zeroed`] since they last were).
    /// The views may write anything: the buffers are no longer known zeroed afterwards until
    /// the caller marks them again.
    pub fn buffers_mut_zeroed<'a, const N: usize>(
        &'a mut self,
        req: ReqId,
        len: u32,
        out: &mut ArrayVec<&'a mut [u8], N>,
    ) -> (usize, bool) {
        let Some(r) = self.request(req) else {
            return (0, false);
        };
        if r.chain_in_flight() {
            return (0, false);
        }
        let (bufs, n) = (r.bufs, r.nbufs as usize);
        let zeroed = self.bufs.known_zero(&bufs[..n], len);
        (self.bufs.many_mut(&bufs[..n], out), zeroed)
    }

    /// The first `len` bytes of `req`'s buffers hold zeroes: the caller just zeroed them (or
    /// was told by [`PollGroup::buffers_mut_zeroed`] they were and wrote nothing). A later
    /// [`PollGroup::buffers_mut_zeroed`] on the same buffers reports them zeroed unless they
    /// were written in between. Checked in debug builds.
    pub fn mark_zeroed(&mut self, req: ReqId, len: u32) {
        let Some(r) = self.request(req) else {
            return;
        };
        if r.chain_in_flight() {
            return;
        }
        let (bufs, n) = (r.bufs, r.nbufs as usize);
        self.bufs.mark_zeroed(&bufs[..n], len);
    }

    /// Posts a chain of WRs for `req`: up to MAX_CHAIN_WRS, the last signaled. It is copied
    /// into the request and goes on the send queue at the end of the poll, as soon as its
    /// qpair has send-queue and RDMA READ room (FIFO per qpair; no retry by the caller).
    /// `answers` marks the chain as the command's response: its depth slot goes back when it
    /// is posted. On a draining qpair the chain completes with `WrFlushErr`. Err: bad chain,
    /// one already in flight, or an aborted request.
    pub fn post_chain(&mut self, req: ReqId, chain: &[ChainWr<'_>], answers: bool) -> Result<()> {
        self.post(req, chain, answers, false)
    }

    /// `post_chain` for a chain whose local memory is all the request's own until it is freed
    /// (its data buffers, its capsule slot, the layer above's slots indexed by the request, or
    /// inline data): one that ends a list with a SEND may then go without a completion of its
    /// own and wait for a later completion on its qpair (`PollGroupConfig::silent_answers`).
    /// A host request so posted is reported complete at its response (`request_complete`):
    /// `finish` gives its depth slot back at once and frees the object when the chain is
    /// retired.
    pub fn post_chain_owned(
        &mut self,
        req: ReqId,
        chain: &[ChainWr<'_>],
        answers: bool,
    ) -> Result<()> {
        self.post(req, chain, answers, true)
    }

    fn post(
        &mut self,
        req: ReqId,
        chain: &[ChainWr<'_>],
        answers: bool,
        owned: bool,
    ) -> Result<()> {
        let (max_inline, sge_limits) = (self.max_inline, self.sge_limits);
        // One lookup for the checks and the update (fields borrowed apart: the chain and the
        // buffers are written in between).
        let live = self.req_generation.get(req.index as usize) == Some(&req.generation);
        let Some(r) = self.reqs.get_mut(req.index as usize).filter(|_| live) else {
            return Err(TransportError::InvalidArgument(format!(
                "no request {req:?}"
            )));
        };
        if r.aborted {
            return Err(TransportError::InvalidArgument(format!(
                "{req:?} was aborted: its qpair is gone"
            )));
        }
        if r.state != RequestState::Idle {
            return Err(TransportError::InvalidArgument(format!(
                "{req:?} is {:?}: one chain at a time",
                r.state
            )));
        }
        if answers && r.depth_released {
            return Err(TransportError::InvalidArgument(format!(
                "{req:?} was already answered"
            )));
        }
        self.chains[req.index as usize].set(chain, max_inline, sge_limits)?;
        // An RDMA READ writes its local SGEs: those data buffers no longer hold known zeroes.
        for wr in chain {
            if matches!(wr.op, SendOp::RdmaRead { .. }) {
                for sge in wr.sges {
                    self.bufs.forget_written(sge);
                }
            }
        }
        r.answers = answers;
        r.owned = owned;
        r.state = RequestState::WaitingToPost;
        let qref = r.qpair;
        let q =
            live_mut(&mut self.qpairs, qref).expect("a request that is not aborted has its qpair");
        q.to_post.push_back(&mut self.req_links, req.index);
        super::mark_dirty_held(&mut self.dirty, q, qref.index);
        Ok(())
    }

    /// The live (not aborted) requests on `qp_num` (control path: walks the request slab).
    pub fn requests_of(&self, qp_num: u32) -> impl Iterator<Item = ReqId> + '_ {
        self.reqs
            .iter()
            .filter(move |(_, r)| r.qp_num == qp_num && !r.aborted)
            .map(|(i, _)| ReqId {
                index: i as u32,
                generation: self.req_generation[i],
            })
    }

    /// Takes `req` out of a wait before anything of it reached the device: the group's FIFO
    /// for data buffers, or its qpair's FIFO with a chain that does not answer the command
    /// (RDMA READs waiting for read depth or send-queue room). True when it was so waiting:
    /// it is Idle again, keeps its buffers and capsule, and its layer above may answer it
    /// (`post_chain`) or `finish` it. False, and nothing changes, in any other state.
    pub fn cancel_wait(&mut self, req: ReqId) -> bool {
        let Some(r) = self.request_mut(req) else {
            return false;
        };
        if r.aborted {
            return false;
        }
        match r.state {
            RequestState::WaitingBuffers => {
                r.state = RequestState::Idle;
                r.want_bufs = 0;
                self.buf_wait.unlink(&mut self.req_links, req.index);
                true
            }
            RequestState::WaitingToPost if !r.answers => {
                r.state = RequestState::Idle;
                let qref = r.qpair;
                if let Some(q) = live_mut(&mut self.qpairs, qref) {
                    q.to_post.unlink(&mut self.req_links, req.index);
                }
                true
            }
            _ => false,
        }
    }

    /// The request is over: its buffers, capsule slot and object go back. Called once per
    /// request, aborted ones included. A chain still on the send queue of a live qpair is
    /// let finish first (the device may still read or write the buffers).
    pub fn finish(&mut self, req: ReqId) {
        let Some(r) = self.request_mut(req) else {
            return;
        };
        match r.state {
            RequestState::Posted if !r.aborted => {
                r.finishing = true;
                // A host request reported at its response while its SEND waits to be retired
                // (silent): the command is over, so is its place in the queue's depth.
                if r.host.is_some_and(|p| p.response) && !r.depth_released {
                    r.depth_released = true;
                    let qref = r.qpair;
                    if let Some(q) = live_mut(&mut self.qpairs, qref) {
                        q.outstanding = q.outstanding.saturating_sub(1);
                    }
                }
                return;
            }
            RequestState::WaitingBuffers => {
                self.buf_wait.unlink(&mut self.req_links, req.index);
            }
            RequestState::WaitingToPost => {
                let qref = r.qpair;
                if let Some(q) = live_mut(&mut self.qpairs, qref) {
                    q.to_post.unlink(&mut self.req_links, req.index);
                }
            }
            _ => {}
        }
        self.free(req.index);
    }

    pub(crate) fn free(&mut self, index: u32) {
        // Read in place: the request (with the layer above's state) is a few hundred bytes,
        // and moving it out only to drop it was a memcpy per command.
        let r = &self.reqs[index as usize];
        debug_assert!(
            !r.silent,
            "a silent chain's request is freed only once retired"
        );
        for &b in &r.bufs[..r.nbufs as usize] {
            self.bufs.put(b);
        }
        let (slot, aborted, qpair, depth_released) = (r.slot, r.aborted, r.qpair, r.depth_released);
        self.reqs.remove(index as usize);
        if slot != NO_SLOT {
            self.recv.release(slot);
        }
        if !aborted {
            if let Some(q) = self.qpair_at_mut(qpair) {
                q.requests -= 1;
                if !depth_released {
                    q.outstanding = q.outstanding.saturating_sub(1);
                }
            }
        }
    }

    /// A new request for a capsule in `slot` on qpair `qref`, or None when the slab is full.
    pub(crate) fn new_request(&mut self, qref: QpRef, slot: u32) -> Option<ReqId>
    where
        R: Default,
    {
        if self.reqs.len() >= self.cfg.max_requests as usize {
            return None;
        }
        let qp_num = {
            let q = self.qpair_at_mut(qref)?;
            q.requests += 1;
            q.qp_num
        };
        let entry = self.reqs.vacant_entry();
        let index = entry.key() as u32;
        entry.insert(Request {
            qp_num,
            qpair: qref,
            slot,
            bufs: [0; MAX_REQUEST_BUFFERS],
            nbufs: 0,
            want_bufs: 0,
            state: RequestState::Idle,
            aborted: false,
            finishing: false,
            depth_released: false,
            answers: false,
            owned: false,
            silent: false,
            post_seq: 0,
            host: None,
            user: R::default(),
        });
        let g = &mut self.req_generation[index as usize];
        *g = wrid::next_generation(*g);
        Some(ReqId {
            index,
            generation: *g,
        })
    }

    /// `req`'s chain is on the QP: its depth slot goes back if it answers the command.
    #[cfg(test)]
    pub(crate) fn chain_posted(&mut self, index: u32) {
        let r = &mut self.reqs[index as usize];
        let release = r.mark_posted();
        let qref = r.qpair;
        self.chains[index as usize].all_posted();
        if let Some(q) = self.qpair_at_mut(qref) {
            let seq = q.next_post();
            if release {
                q.outstanding = q.outstanding.saturating_sub(1);
            }
            self.reqs[index as usize].post_seq = seq;
        }
    }

    /// `req`'s chain is over: hand it up (or free it, when `finish` came early).
    pub(crate) fn chain_over<H: Handler<R>>(&mut self, h: &mut H, index: u32) {
        let r = &mut self.reqs[index as usize];
        r.state = RequestState::Idle;
        if r.finishing {
            self.free(index);
            return;
        }
        let chain = &self.chains[index as usize];
        let (last, status) = (chain.last_kind(), chain.status());
        let req = ReqId {
            index,
            generation: self.req_generation[index as usize],
        };
        if let Some(p) = r.host.as_mut() {
            if last == WrKind::Send {
                p.send_done = true;
                if status != WcStatus::Success || p.response {
                    p.reported = true;
                    h.request_complete(self, req, status);
                }
                return;
            }
        }
        h.chain_done(self, req, last, status);
    }

    /// Every request alive on `qref` (which is going): marked aborted, taken out of the
    /// FIFOs, reported. They are freed by `finish`, or here when `finish` came already.
    pub(crate) fn abort_requests<H: Handler<R>>(&mut self, h: &mut H, qref: QpRef) {
        // With their generations: a handler's `aborted` may finish another of them, whose
        // slot may then hold a new request by the time the loop comes to it.
        let ids: Vec<(u32, u32)> = self
            .reqs
            .iter()
            .filter(|(_, r)| r.qpair == qref && !r.aborted)
            .map(|(i, _)| (i as u32, self.req_generation[i]))
            .collect();
        if let Some(q) = live_mut(&mut self.qpairs, qref) {
            // The qpair's FIFOs go with it: their links are free for the requests' next lives.
            q.to_post.clear(&mut self.req_links);
        }
        self.clear_silent(qref);
        for (index, generation) in ids {
            let live = self.req_generation.get(index as usize) == Some(&generation);
            let Some(r) = self
                .reqs
                .get_mut(index as usize)
                .filter(|r| live && !r.aborted)
            else {
                continue;
            };
            r.aborted = true;
            let finishing = r.finishing;
            if r.state == RequestState::WaitingBuffers {
                self.buf_wait.unlink(&mut self.req_links, index);
            }
            // The qpair's FIFO dies with it; its QP (and its DMA) is destroyed.
            self.reqs[index as usize].state = RequestState::Idle;
            self.stats.requests_aborted += 1;
            if finishing {
                self.free(index);
                continue;
            }
            let req = ReqId {
                index,
                generation: self.req_generation[index as usize],
            };
            h.aborted(self, req);
        }
    }

    /// The slot of qpair `qp_num` in the group (see `Request::qpair_index`; control path:
    /// one tree lookup).
    pub fn qpair_index(&self, qp_num: u32) -> Option<u32> {
        self.lookup(qp_num).map(|q| q.index)
    }

    /// The phase of `qp_num`, None when it is not in the group (one tree lookup).
    pub fn qpair_phase(&self, qp_num: u32) -> Option<QpairPhase> {
        let qref = self.lookup(qp_num)?;
        self.qpair_at(qref).map(|q| q.phase)
    }

    /// The layer above's token for `qp_num` (one tree lookup).
    pub fn qpair_token(&self, qp_num: u32) -> Option<u64> {
        let qref = self.lookup(qp_num)?;
        self.qpair_at(qref).map(|q| q.token)
    }

    /// The negotiated queue depth of `qp_num` (one tree lookup).
    pub fn qpair_depth(&self, qp_num: u32) -> Option<u32> {
        let qref = self.lookup(qp_num)?;
        self.qpair_at(qref).map(|q| q.depth)
    }

    /// Send-queue WRs and RDMA READs in flight on `qp_num` now, and their high-water marks:
    /// (sq_used, sq_high_water, reads_in_flight, reads_high_water).
    pub fn qpair_send_usage(&self, qp_num: u32) -> Option<(u32, u32, u32, u32)> {
        let qref = self.lookup(qp_num)?;
        self.qpair_at(qref).map(|q| {
            (
                q.sq_used,
                q.sq_high_water,
                q.reads_in_flight,
                q.reads_high_water,
            )
        })
    }
}
