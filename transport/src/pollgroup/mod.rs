//! The poll group: per reactor and device, one CQ, one SRQ, the receive slots and data buffers,
//! request objects, and the qpairs (a slab, indexed by an intrusive RB-tree keyed by qp_num).
//!
//! - `poll.rs`: where every completion goes (RECV -> qpair by qp_num, the one tree lookup per
//!   capsule; SEND / READ / WRITE -> their request and its qpair by slab index + generation;
//!   errors -> drain), and the end-of-poll posting of lists.
//! - `lifecycle.rs`: qpairs in and out: connecting -> active -> draining -> gone; async and CM
//!   events for them; the group failing as a whole when its CQ does.
//! - `request.rs`: request objects (a slab sized at start) and what the layer above calls.
//! - `chain.rs`: a request's chain of WRs, stored in the request, and its exact accounting.
//! - `silent.rs`: chains posted without a completion of their own, what they hold meanwhile,
//!   and their retirement by a later completion on their qpair.
//! - `host.rs`: the host (initiator) personality: per-qpair receive queues, requests born by
//!   `submit`, completion when both the SEND completion and the response are in.
//! - `qpair.rs`, `recv.rs`, `buffers.rs`, `fifo.rs`, `wrid.rs`: the pieces.
//!
//! Send-queue accounting is exact (see `wrid`): every WR is retired once, in every order of
//! success, error and flush, so a drain ends by its own condition. Backpressure is per qpair:
//! send-queue slots and RDMA READs in flight; a chain that does not fit waits in its qpair's
//! FIFO and is posted when completions make room. A poll group is `!Sync` and is driven by its
//! reactor only: events from the CM thread and the device's async fd reach it as calls the
//! reactor makes on its own thread.

mod buffers;
mod chain;
mod fifo;
mod host;
mod lifecycle;
mod placement;
mod poll;
mod qpair;
mod qpn_cache;
mod recv;
mod request;
mod silent;
mod stats;
pub mod wrid;

use std::cell::Cell;
use std::collections::VecDeque;
use std::os::fd::RawFd;
use std::time::Duration;

use intrusive_collections::RBTree;
use slab::Slab;

use crate::device::{CompChannel, Context, Cq, Pd, Srq};
use crate::error::{Result, TransportError};
use crate::types::{SrqInit, WorkCompletion};

pub use chain::{ChainWr, MAX_CHAIN_SGES, MAX_CHAIN_WRS, MAX_WR_SGES, SgeLimits, kind_of};
pub use host::{QpairHandle, RecvMode, RecvRepost, Role};
pub use lifecycle::{AddQpairError, QpairEvent};
pub use placement::{Placement, PlacementPolicy};
pub use qpair::{DrainReason, QpairPhase};
pub use recv::SlotState;
pub use request::{BufferGrant, Handler, MAX_REQUEST_BUFFERS, ReqId, Request, RequestState};
pub use stats::PollGroupStats;
pub use wrid::WrKind;

use buffers::DataBuffers;
use fifo::{Fifo, Link};
use qpair::{QpRef, QpairAdapter, QpairState, live_mut};
use qpn_cache::QpnCache;
use recv::RecvSlots;

/// Most completions reaped per poll (the batch is a stack array of this size).
pub const MAX_BATCH: usize = 64;
/// Capsule header size: the 64-byte SQE.
pub const CAPSULE_HEADER: u32 = 64;
/// Most lone answers in a row without a completion ([`PollGroupConfig::silent_answers`]):
/// each holds its request object until a later completion on its qpair.
pub const MAX_SILENT_ANSWERS: u32 = 64;

/// How a poll group is sized. Everything is allocated at creation; nothing grows per I/O.
#[derive(Clone, Debug)]
pub struct PollGroupConfig {
    /// Receive slots on the SRQ (SPDK's default: 4096).
    pub srq_depth: u32,
    /// Qpairs this group may hold at once.
    pub max_qpairs: u32,
    /// Most commands a host may have outstanding per qpair (SPDK / Linux: 128).
    pub max_queue_depth: u32,
    /// In-capsule data bytes after the 64-byte SQE (4096 by default: larger values trip a
    /// write-corruption bug in Linux hosts 5.4-5.12).
    pub in_capsule_data_size: u32,
    /// Size of one data buffer.
    pub io_unit_size: u32,
    /// Data buffers owned by this group.
    pub data_buffers: u32,
    /// Request objects (a capsule without one waits on its qpair).
    pub max_requests: u32,
    /// Completions reaped per poll (<= MAX_BATCH).
    pub batch: usize,
    /// A drain that has not finished after this long is forced.
    pub drain_timeout: Duration,
    /// Devices that never raise LAST_WQE_REACHED: after the send queue has flushed, wait this
    /// long for straggling receive completions before destroying the QP (any later ones are
    /// orphans and are re-posted, so nothing is lost either way).
    pub drain_grace: Duration,
    /// When freed receive slots are posted again ([`RecvRepost`]: `NextPass` only for a host
    /// group on an SRQ with `srq_depth >= max_requests + batch`).
    pub recv_repost: RecvRepost,
    /// Lone answers (a list of one response, or of one host command) a qpair may post in a
    /// row without a completion of their own, each retired by a later completion on its qpair
    /// (`silent.rs`); the next one asks for a completion. 0 (the default): every list's last
    /// chain is signaled. At 128 qpairs x depth 1, 3 takes each side from 2.00 completions per
    /// I/O to 1.25, but on the machines measured IOPS did not follow (docs/performance.md,
    /// session 25): holding the requests and their buffers costs about what the completions
    /// did.
    pub silent_answers: u32,
    /// Polls in a row that reap nothing before the qpairs' silent chains are flushed (a
    /// signaled zero-length RDMA WRITE each retires them; `silent.rs`). Long enough that a
    /// loaded reactor's gaps between bursts do not reach it; a reactor about to sleep flushes
    /// at once (`arm`).
    pub silent_flush_idle_polls: u32,
}

impl Default for PollGroupConfig {
    fn default() -> Self {
        PollGroupConfig {
            srq_depth: 4096,
            max_qpairs: 1024,
            max_queue_depth: 128,
            in_capsule_data_size: 4096,
            io_unit_size: 8192,
            data_buffers: 1024,
            max_requests: 4096,
            batch: 32,
            drain_timeout: Duration::from_secs(5),
            drain_grace: Duration::from_millis(20),
            recv_repost: RecvRepost::EndOfPass,
            silent_answers: 0,
            silent_flush_idle_polls: 4096,
        }
    }
}

impl PollGroupConfig {
    /// Send queue asked for per qpair: every command of a full queue with a chain of the
    /// longest kind, plus the drain marker. The device may grant less (capped by its
    /// max_qp_wr): backpressure covers the rest, so a full send queue delays, never fails.
    pub fn max_send_wr(&self) -> u32 {
        self.max_queue_depth
            .saturating_mul(MAX_CHAIN_WRS as u32)
            .saturating_add(1)
    }

    /// CQ entries needed so the CQ can never overrun. Every work request that can produce a
    /// completion is counted once:
    ///
    /// ```text
    ///   srq_depth                         every posted receive completes once
    /// + min(max_requests * MAX_CHAIN_WRS, send-side WRs on the send queues at once: a
    ///       max_qpairs * (max_send_wr - 1))  request has one chain posted at a time, and a
    ///                                     qpair never more than its send queue (the marker
    ///                                     has its own slot); in error each WR flushes on its
    ///                                     own, so each may complete once
    /// + max_qpairs                        one drain marker per qpair
    /// + max_qpairs (silent_answers > 0)   one silent flush per qpair: a WR of no request's,
    ///                                     outside the requests' bound
    /// ```
    pub fn cq_depth(&self) -> u32 {
        let by_requests = self.max_requests.saturating_mul(MAX_CHAIN_WRS as u32);
        let by_queues = self
            .max_qpairs
            .saturating_mul(self.max_send_wr().saturating_sub(1));
        self.fixed_cq_entries()
            .saturating_add(by_requests.min(by_queues))
    }

    /// The CQ entries that do not scale with the requests: the receives, the drain markers
    /// and the silent flushes.
    fn fixed_cq_entries(&self) -> u32 {
        let silent_flushes = if self.silent_answers > 0 {
            self.max_qpairs
        } else {
            0
        };
        self.srq_depth
            .saturating_add(self.max_qpairs)
            .saturating_add(silent_flushes)
    }

    /// Caps `max_requests` so that `cq_depth()` fits a device's `max_cqe` (rxe: 32767), the
    /// way a CQ that cannot grow must be sized: fewer requests in flight at once (capsules
    /// beyond them wait on their qpair for a request object) instead of a CQ that can
    /// overrun. Returns the `max_requests` asked for when it had to cap; an error when not
    /// even the receives, the drain markers and one request's chain fit.
    pub fn fit_cq(&mut self, max_cqe: u32) -> Result<Option<u32>> {
        if self.cq_depth() <= max_cqe {
            return Ok(None);
        }
        let fixed = self.fixed_cq_entries();
        let room = max_cqe.saturating_sub(fixed);
        let fitting = room / MAX_CHAIN_WRS as u32;
        if fitting == 0 {
            return Err(TransportError::Limit {
                what: "poll group CQ (srq_depth + max_qpairs + one request's chain)",
                asked: fixed as u64 + MAX_CHAIN_WRS as u64,
                max: max_cqe as u64,
            });
        }
        let asked = self.max_requests;
        self.max_requests = fitting;
        Ok(Some(asked))
    }

    /// `NextPass` keeps up to a batch of slots off the SRQ while their requests are free
    /// again: only a host on an SRQ with that slack may (see [`RecvRepost::NextPass`]).
    fn check_repost(&self, role: Role, recv: RecvMode) -> Result<()> {
        if self.recv_repost == RecvRepost::EndOfPass {
            return Ok(());
        }
        let why = if role != Role::Host || recv != RecvMode::Srq {
            "recv_repost NextPass is for host groups on an SRQ".to_string()
        } else if u64::from(self.srq_depth) < u64::from(self.max_requests) + self.batch as u64 {
            format!(
                "recv_repost NextPass needs srq_depth ({}) >= max_requests ({}) + batch ({})",
                self.srq_depth, self.max_requests, self.batch
            )
        } else {
            return Ok(());
        };
        Err(TransportError::InvalidArgument(format!(
            "poll group config: {why}"
        )))
    }

    fn validate(&self) -> Result<()> {
        let bad = |what: &str| {
            Err(TransportError::InvalidArgument(format!(
                "poll group config: {what}"
            )))
        };
        if self.srq_depth == 0
            || self.max_requests == 0
            || self.max_qpairs == 0
            || self.max_queue_depth == 0
        {
            return bad("srq_depth, max_requests, max_qpairs and max_queue_depth must be above 0");
        }
        if self.batch == 0 || self.batch > MAX_BATCH {
            return bad(&format!("batch must be 1..={MAX_BATCH}"));
        }
        if self.in_capsule_data_size % 16 != 0 {
            return bad("in_capsule_data_size must be a multiple of 16");
        }
        if self.io_unit_size == 0 {
            return bad("io_unit_size must be above 0");
        }
        if self.silent_answers > MAX_SILENT_ANSWERS {
            return bad(&format!("silent_answers must be 0..={MAX_SILENT_ANSWERS}"));
        }
        Ok(())
    }
}

/// Work waiting in a poll group (see [`PollGroup::waiting`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Waiting {
    /// Requests waiting for data buffers (the group's FIFO).
    pub buffers: u32,
    /// Requests whose chain waits for send-queue or RDMA READ room (their qpairs' FIFOs).
    pub to_post: u32,
    /// Capsules waiting for a request object (held receive slots).
    pub capsules: u32,
}

/// See the module documentation.
pub struct PollGroup<R = ()> {
    cfg: PollGroupConfig,
    // Qpairs come first: fields drop in order, and `Drop` destroys every QP before the CQ,
    // SRQ and memory regions below, so no MR is deregistered while a QP that uses it lives.
    tree: RBTree<QpairAdapter>,
    /// In front of the tree: answers most lookups without a walk (qpn_cache.rs).
    qpn_cache: QpnCache,
    qpairs: Slab<QpairState>,
    qpair_generation: Box<[u32]>,
    reqs: Slab<request::Request<R>>,
    req_generation: Box<[u32]>,
    /// Each request's chain storage, by request index: allocated once at start and never
    /// re-initialised (a request object stays small; `Chain::set` writes what it uses).
    chains: Box<[chain::Chain]>,
    /// One link per request: it is in at most one FIFO at a time (buffer wait, or its
    /// qpair's to-post list), as its state says.
    req_links: Box<[Link]>,
    /// Requests waiting for data buffers, oldest first.
    buf_wait: Fifo,
    /// Qpairs with capsules waiting for a request object, oldest first (stale refs skipped).
    waiting: VecDeque<QpRef>,
    /// Qpairs (slab indices) with chains to post at the end of this poll.
    dirty: Vec<u32>,
    /// Qpairs draining.
    draining: Vec<QpRef>,
    /// Something that can end a drain happened since `progress_drains` last looked (a
    /// completion, an event, a new drain): look at every draining qpair again.
    drains_changed: bool,
    /// With nothing happening, no drain can end before this (its grace or timeout): idle
    /// passes skip the walk over the draining qpairs until then.
    drain_due: Option<std::time::Instant>,
    /// Completions to handle first in the next poll (reaped by `arm`'s re-check).
    carried: VecDeque<WorkCompletion>,
    /// The batch `poll` reaps into (MAX_BATCH entries): kept, not a stack array initialised
    /// on every pass (64 completions, 3 KiB).
    wcs: Vec<WorkCompletion>,
    /// Host requests whose SEND and response are both in: reported at the end of the poll.
    completed: Vec<ReqId>,
    /// What silent chains hold now (`silent.rs`).
    held: silent::Held,
    /// The live qpairs' depths summed: a host group's requests that commands may take.
    depth_sum: u32,
    /// Polls in a row that reaped nothing.
    idle_streak: u32,
    recv: RecvSlots,
    bufs: DataBuffers,
    srq: Option<Srq>,
    role: Role,
    recv_mode: RecvMode,
    cq: Cq,
    channel: CompChannel,
    pd: Pd,
    ctx: Context,
    raises_last_wqe: bool,
    max_inline: u32,
    /// min(max_qp_rd_atom, max_qp_init_rd_atom): the most a qpair's read depth can be.
    device_read_depth: u32,
    device_max_qp_wr: u32,
    /// The SGEs a work request may carry on this device (its QPs are created with them).
    sge_limits: SgeLimits,
    /// The CQ failed: the group takes no more work.
    failed: Option<String>,
    /// Test fault: the next send post on (qpair index) hands over only this many WRs.
    post_fault: Option<(u32, usize)>,
    tree_lookups: Cell<u64>,
    /// Lookups the cache did not answer.
    tree_walks: Cell<u64>,
    stats: PollGroupStats,
    /// Host side, during `Handler::response` only: the rkey the response's SEND_WITH_INV
    /// invalidated here.
    response_invalidated: Option<u32>,
}

impl<R> Drop for PollGroup<R> {
    fn drop(&mut self) {
        // QPs (and their CM ids) before anything they use. (The tree's nodes hold only
        // indices; they go with the tree.)
        self.tree.clear();
        self.qpn_cache.clear();
        for q in self.qpairs.drain() {
            drop(q);
        }
    }
}

impl<R> PollGroup<R> {
    /// A poll group on `ctx`, with its own PD.
    pub fn new(ctx: &Context, cfg: PollGroupConfig) -> Result<PollGroup<R>> {
        let pd = ctx.alloc_pd()?;
        PollGroup::with_pd(ctx, &pd, cfg)
    }

    /// A poll group on `ctx` using `pd` (shared with whoever else registers memory for it).
    pub fn with_pd(ctx: &Context, pd: &Pd, cfg: PollGroupConfig) -> Result<PollGroup<R>> {
        PollGroup::build(ctx, pd, cfg, Role::Target, RecvMode::Srq)
    }

    /// A host-side (initiator) poll group: requests are born by `submit`, received capsules
    /// are responses (`Handler::response`), receives on an SRQ or each qpair's own queue.
    pub fn new_host(ctx: &Context, cfg: PollGroupConfig, recv: RecvMode) -> Result<PollGroup<R>> {
        let pd = ctx.alloc_pd()?;
        PollGroup::build(ctx, &pd, cfg, Role::Host, recv)
    }

    fn build(
        ctx: &Context,
        pd: &Pd,
        mut cfg: PollGroupConfig,
        role: Role,
        recv_mode: RecvMode,
    ) -> Result<PollGroup<R>> {
        cfg.validate()?;
        cfg.check_repost(role, recv_mode)?;
        let attr = ctx.query_device()?;
        if let Some(asked) = cfg.fit_cq(attr.max_cqe)? {
            tracing::info!(
                asked,
                granted = cfg.max_requests,
                max_cqe = attr.max_cqe,
                "request objects capped so the poll group's CQ fits the device"
            );
        }
        if attr.max_sge_rd == 0 {
            tracing::warn!(
                max_sge = attr.max_sge,
                "the device does not report max_sge_rd: RDMA READs carry one SGE each"
            );
        }
        let cq_depth = cfg.cq_depth();
        let channel = ctx.create_comp_channel()?;
        let cq = ctx.create_cq(cq_depth, Some(&channel))?;
        let per_qpair = matches!(recv_mode, RecvMode::PerQpair { .. });
        let srq = if per_qpair {
            None
        } else {
            Some(pd.create_srq(&SrqInit {
                max_wr: cfg.srq_depth,
                max_sge: 1,
                limit: 0,
            })?)
        };
        let recv = RecvSlots::new(
            pd,
            cfg.srq_depth,
            CAPSULE_HEADER + cfg.in_capsule_data_size,
            per_qpair,
            // A host group keeps every slot posted (its responses' slots are few and its
            // re-post timing, `RecvRepost::NextPass`, counts on the whole SRQ as slack).
            match role {
                Role::Target => 2 * cfg.batch as u32,
                Role::Host => cfg.srq_depth,
            },
        )?;
        let bufs = DataBuffers::new(pd, cfg.data_buffers, cfg.io_unit_size)?;
        let nreq = cfg.max_requests as usize;
        let nq = cfg.max_qpairs as usize;
        let mut pg = PollGroup {
            tree: RBTree::new(QpairAdapter::new()),
            qpn_cache: QpnCache::new(cfg.max_qpairs),
            qpairs: Slab::with_capacity(nq),
            qpair_generation: vec![0; nq].into_boxed_slice(),
            reqs: Slab::with_capacity(nreq),
            req_generation: vec![0; nreq].into_boxed_slice(),
            chains: (0..nreq).map(|_| chain::Chain::new()).collect(),
            req_links: vec![Link::default(); nreq].into_boxed_slice(),
            buf_wait: Fifo::default(),
            waiting: VecDeque::with_capacity(nq),
            dirty: Vec::with_capacity(nq),
            draining: Vec::with_capacity(nq),
            carried: VecDeque::with_capacity(1),
            wcs: vec![WorkCompletion::default(); MAX_BATCH],
            completed: Vec::with_capacity(nreq),
            held: silent::Held::default(),
            depth_sum: 0,
            idle_streak: 0,
            recv,
            bufs,
            srq,
            role,
            recv_mode,
            cq,
            channel,
            pd: pd.clone(),
            ctx: ctx.clone(),
            raises_last_wqe: attr.raises_last_wqe_reached,
            max_inline: 0,
            device_read_depth: attr.max_qp_rd_atom.min(attr.max_qp_init_rd_atom),
            device_max_qp_wr: attr.max_qp_wr,
            sge_limits: SgeLimits::of_device(attr.max_sge, attr.max_sge_rd),
            failed: None,
            post_fault: None,
            tree_lookups: Cell::new(0),
            tree_walks: Cell::new(0),
            drains_changed: false,
            drain_due: None,
            stats: PollGroupStats::default(),
            response_invalidated: None,
            cfg,
        };
        // Fill the SRQ before any qpair can exist.
        let calls = match &pg.srq {
            Some(srq) => pg.recv.flush(srq).map_err(|e| e.error)?,
            None => 0,
        };
        pg.stats.recvs_posted += pg.recv.posted() as u64;
        pg.stats.recv_post_calls += calls as u64;
        Ok(pg)
    }

    pub fn config(&self) -> &PollGroupConfig {
        &self.cfg
    }
    pub fn context(&self) -> &Context {
        &self.ctx
    }
    pub fn pd(&self) -> &Pd {
        &self.pd
    }
    pub fn cq(&self) -> &Cq {
        &self.cq
    }
    /// The group's SRQ (None with per-qpair receive queues).
    pub fn srq(&self) -> Option<&Srq> {
        self.srq.as_ref()
    }

    /// Target or host side.
    pub fn role(&self) -> Role {
        self.role
    }

    /// Before sleeping: arm the CQ and say which fds wake this group (the completion channel,
    /// plus the provider's progress fd where completions are made by polling). Returns None
    /// when work arrived meanwhile (the caller must poll instead of sleeping): a completion
    /// that lands between the last poll and the arming would otherwise be slept through. A
    /// failed group has nothing to wake for.
    pub fn arm(&mut self) -> Result<Option<[Option<RawFd>; 2]>> {
        if self.failed.is_some() {
            return Ok(Some([None, None]));
        }
        self.cq.req_notify(false)?;
        // Before sleeping, what silent chains hold goes back (`silent.rs`); the flushes'
        // completions wake the reactor (the CQ is armed).
        if self.held.requests > 0 {
            self.flush_silent();
        }
        if self.recv.queued() > 0
            || !self.dirty.is_empty()
            || !self.carried.is_empty()
            || !self.completed.is_empty()
            || !self.draining.is_empty()
            || (!self.waiting.is_empty() && self.reqs.len() < self.cfg.max_requests as usize)
            || self.buffer_waiter_ready()
        {
            return Ok(None);
        }
        // Re-check after arming: anything already in the CQ will not signal the channel.
        let mut probe = [WorkCompletion::default(); 1];
        if self.cq.poll(&mut probe)? > 0 {
            self.carried.push_back(probe[0]);
            return Ok(None);
        }
        Ok(Some([Some(self.channel.fd()), self.cq.progress_fd()]))
    }

    fn buffer_waiter_ready(&self) -> bool {
        self.buf_wait.front().is_some_and(|i| {
            let r = &self.reqs[i as usize];
            let want = r.want_bufs_left();
            self.bufs.available() as usize >= want
        })
    }

    /// After waking: consume the completion channel's events (each arming yields at most one).
    pub fn ack_wakeups(&mut self) -> Result<u32> {
        let mut n = 0;
        while self.channel.get_event()?.is_some() {
            n += 1;
        }
        Ok(n)
    }

    pub fn stats(&self) -> PollGroupStats {
        PollGroupStats {
            tree_lookups: self.tree_lookups.get(),
            tree_walks: self.tree_walks.get(),
            ..self.stats
        }
    }

    /// Whether this device raises LAST_WQE_REACHED (else drains use the fallback).
    pub fn raises_last_wqe(&self) -> bool {
        self.raises_last_wqe
    }

    /// Why the group failed (its CQ did), if it has.
    pub fn failed(&self) -> Option<&str> {
        self.failed.as_deref()
    }

    /// Qpairs draining now.
    pub fn draining(&self) -> usize {
        self.draining.len()
    }

    /// The SGEs one work request may carry here: a chain's WRs must keep within them
    /// (`post_chain` refuses one that does not).
    pub fn sge_limits(&self) -> SgeLimits {
        self.sge_limits
    }

    /// Qpairs in the group (connecting, active or draining).
    pub fn qpair_count(&self) -> usize {
        self.qpairs.len()
    }

    /// The qp_nums in this group, in tree order (control path: for shutdown and listings).
    pub fn qpair_nums(&self) -> impl Iterator<Item = u32> + '_ {
        self.tree.iter().map(|q| q.qp_num)
    }

    /// Receive slots currently posted on the SRQ, by the group's own count.
    pub fn recvs_posted(&self) -> u32 {
        self.recv.posted()
    }

    /// The most receive slots the group keeps posted on its SRQ: a target group posts what
    /// its qpairs' peers may send (their queue depths) and a margin, not every slot (see
    /// `recv.rs`); a host group, every slot.
    pub fn recv_post_limit(&self) -> u32 {
        self.recv.post_limit()
    }

    /// Receive slots in each state by the group's own count: (posted on the SRQ, queued for
    /// re-posting, held by capsules). With the free per-qpair pool and the spare slots beyond
    /// the post limit they add up to `srq_depth`. Leak checks should compare `posted` with the SRQ's real occupancy (the
    /// soft SRQ's `posted()`).
    pub fn recv_accounting(&self) -> (u32, u32, u32) {
        let posted = self.recv.posted();
        let queued = self.recv.queued();
        let free = self.recv.free_count() + self.recv.spare_count();
        (posted, queued, self.recv.count() - posted - queued - free)
    }

    /// The state of receive slot `slot`.
    pub fn slot_state(&self, slot: u32) -> Option<SlotState> {
        self.recv.state(slot)
    }

    /// Request objects in use (aborted ones not yet finished included).
    pub fn requests_in_use(&self) -> usize {
        self.reqs.len()
    }

    /// Data buffers free.
    pub fn buffers_free(&self) -> u32 {
        self.bufs.available()
    }

    /// Work waiting in this group, by what it waits for (control path: walks the qpairs).
    pub fn waiting(&self) -> Waiting {
        let mut w = Waiting {
            buffers: self.buf_wait.len(),
            ..Waiting::default()
        };
        for (_, q) in self.qpairs.iter() {
            w.to_post += q.to_post.len();
            w.capsules += q.waiting_capsules.len();
        }
        w
    }

    /// Fault injection for tests: the next send post on `qp_num` hands only its first
    /// `after_wrs` WRs to the QP and refuses the rest, as a provider refusing a list would.
    pub fn fail_next_post(&mut self, qp_num: u32, after_wrs: usize) -> Result<()> {
        let qref = self
            .lookup(qp_num)
            .ok_or_else(|| TransportError::InvalidArgument(format!("no qpair {qp_num:#x}")))?;
        self.post_fault = Some((qref.index, after_wrs));
        Ok(())
    }

    /// qp_num -> qpair: the cache, else the RB-tree (both counted in stats).
    #[inline]
    pub(crate) fn lookup(&self, qp_num: u32) -> Option<QpRef> {
        self.tree_lookups.set(self.tree_lookups.get() + 1);
        let index = match self.qpn_cache.get(qp_num) {
            Some(index) => index,
            None => {
                self.tree_walks.set(self.tree_walks.get() + 1);
                let index = self.tree.find(&qp_num).get()?.index;
                self.qpn_cache.fill(qp_num, index);
                index
            }
        };
        Some(QpRef {
            index,
            generation: self.qpair_generation[index as usize],
        })
    }

    pub(crate) fn qpair_at(&self, qref: QpRef) -> Option<&QpairState> {
        self.qpairs
            .get(qref.index as usize)
            .filter(|q| q.generation == qref.generation)
    }

    pub(crate) fn qpair_at_mut(&mut self, qref: QpRef) -> Option<&mut QpairState> {
        self.qpairs
            .get_mut(qref.index as usize)
            .filter(|q| q.generation == qref.generation)
    }

    /// `qref` has chains to post at the end of this poll.
    pub(crate) fn mark_dirty(&mut self, qref: QpRef) {
        if let Some(q) = live_mut(&mut self.qpairs, qref) {
            mark_dirty_held(&mut self.dirty, q, qref.index);
        }
    }
}

/// [`PollGroup::mark_dirty`] for a caller already holding the qpair (at slab `index`): the
/// group's `dirty` list borrowed apart, so the slab is not searched again.
#[inline]
pub(crate) fn mark_dirty_held(dirty: &mut Vec<u32>, q: &mut QpairState, index: u32) {
    if !q.dirty && !q.to_post.is_empty() {
        q.dirty = true;
        dirty.push(index);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_group_is_capped_to_fit_an_rxe_cq() {
        let mut cfg = PollGroupConfig::default();
        assert!(
            cfg.cq_depth() > 32767,
            "the default needs more than rxe's max_cqe"
        );
        assert_eq!(cfg.fit_cq(32767).unwrap(), Some(4096));
        assert!(cfg.cq_depth() <= 32767);
        assert!(cfg.max_requests >= cfg.max_queue_depth);
        // Already fitting: untouched.
        let before = cfg.max_requests;
        assert_eq!(cfg.fit_cq(32767).unwrap(), None);
        assert_eq!(cfg.max_requests, before);
    }

    #[test]
    fn a_cq_too_small_for_receives_and_markers_is_an_error() {
        let mut cfg = PollGroupConfig::default();
        let fixed = cfg.srq_depth + cfg.max_qpairs;
        assert!(cfg.fit_cq(fixed).is_err());
        assert!(cfg.fit_cq(fixed + MAX_CHAIN_WRS as u32).is_ok());
        assert_eq!(cfg.max_requests, 1);
    }

    /// With silent answers each qpair may hold a silent flush, a WR of no request's: the CQ
    /// counts one per qpair on top of the requests' chains.
    #[test]
    fn silent_flushes_have_room_in_the_cq() {
        let quiet = PollGroupConfig::default();
        let silent = PollGroupConfig {
            silent_answers: 3,
            ..PollGroupConfig::default()
        };
        assert_eq!(silent.cq_depth(), quiet.cq_depth() + quiet.max_qpairs);
        let mut capped = silent.clone();
        capped.fit_cq(32767).unwrap();
        assert!(capped.cq_depth() <= 32767);
    }
}
