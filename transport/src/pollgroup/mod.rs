//! The poll group: per reactor and device, one CQ, one SRQ, the receive slots and data buffers,
//! request objects, and the qpairs in an intrusive RB-tree keyed by qp_num.
//!
//! - `poll.rs`: where every completion goes (RECV -> qpair by qp_num or orphan; SEND / READ /
//!   WRITE -> their request; errors -> drain), and the end-of-poll posting of lists.
//! - `lifecycle.rs`: qpairs in and out: connecting -> active -> draining -> gone; async and CM
//!   events for them.
//! - `request.rs`: request objects (a slab sized at start) and what the layer above calls.
//! - `qpair.rs`, `recv.rs`, `buffers.rs`, `wrid.rs`: the pieces.
//!
//! A poll group is `!Sync` and is driven by its reactor only: events from the CM thread and
//! the device's async fd reach it as calls the reactor makes on its own thread.

mod buffers;
mod lifecycle;
mod placement;
mod poll;
mod qpair;
mod recv;
mod request;
mod stats;
pub mod wrid;

use std::time::Duration;

use intrusive_collections::RBTree;
use slab::Slab;

use std::os::fd::RawFd;

use crate::device::{CompChannel, Context, Cq, Pd, Srq};
use crate::error::{Result, TransportError};
use crate::types::{SrqInit, WorkCompletion};

pub use lifecycle::{AddQpairError, QpairEvent};
pub use placement::{Placement, PlacementPolicy};
pub use qpair::{DrainReason, MAX_WR_SGES, QpairPhase};
pub use request::{ChainWr, Handler, ReqId, Request};
pub use stats::PollGroupStats;
pub use wrid::WrKind;

use buffers::DataBuffers;
use qpair::QpairAdapter;
use recv::RecvSlots;

/// Most completions reaped per poll (the batch is a stack array of this size).
pub const MAX_BATCH: usize = 64;
/// Most work requests one request has in flight at once: RDMA READ, or RDMA WRITE + SEND.
pub const MAX_CHAIN: u32 = 2;
/// Capsule header size: the 64-byte SQE.
pub const CAPSULE_HEADER: u32 = 64;

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
        }
    }
}

impl PollGroupConfig {
    /// Send queue depth per qpair: each outstanding command has at most one chain of
    /// MAX_CHAIN WRs in flight, plus one drain marker.
    pub fn max_send_wr(&self) -> u32 {
        self.max_queue_depth * MAX_CHAIN + 1
    }

    /// CQ entries needed so the CQ can never overrun. Every work request that can complete
    /// here is counted once:
    ///
    /// ```text
    ///   srq_depth                  every posted receive completes once (success or error)
    /// + max_requests * MAX_CHAIN   each request's chain: one completion per WR at worst
    ///                              (a signaled success covers its run; in error every WR
    ///                              flushes on its own)
    /// + max_qpairs                 one drain marker per qpair
    /// ```
    pub fn cq_depth(&self) -> u32 {
        self.srq_depth + self.max_requests * MAX_CHAIN + self.max_qpairs
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
        Ok(())
    }
}

/// See the module documentation.
pub struct PollGroup<R = ()> {
    cfg: PollGroupConfig,
    ctx: Context,
    pd: Pd,
    channel: CompChannel,
    cq: Cq,
    srq: Srq,
    raises_last_wqe: bool,
    max_inline: u32,
    recv: RecvSlots,
    bufs: DataBuffers,
    reqs: Slab<Request<R>>,
    tree: RBTree<QpairAdapter>,
    /// Qpairs in the tree.
    qpairs: usize,
    /// Qpairs with capsules waiting for a request object, oldest first.
    waiting: std::collections::VecDeque<u32>,
    /// Qpairs with WRs queued this poll.
    dirty: Vec<u32>,
    /// Qpairs draining.
    draining: Vec<u32>,
    /// Completions to handle first in the next poll: made up for WRs that never reached a QP
    /// (a failed post, completed in error like a flush), or reaped by `arm`'s re-check.
    carried: std::collections::VecDeque<WorkCompletion>,
    stats: PollGroupStats,
}

impl<R> PollGroup<R> {
    /// A poll group on `ctx`, with its own PD.
    pub fn new(ctx: &Context, cfg: PollGroupConfig) -> Result<PollGroup<R>> {
        let pd = ctx.alloc_pd()?;
        PollGroup::with_pd(ctx, &pd, cfg)
    }

    /// A poll group on `ctx` using `pd` (shared with whoever else registers memory for it).
    pub fn with_pd(ctx: &Context, pd: &Pd, cfg: PollGroupConfig) -> Result<PollGroup<R>> {
        cfg.validate()?;
        let attr = ctx.query_device()?;
        let cq_depth = cfg.cq_depth();
        if cq_depth > attr.max_cqe {
            return Err(TransportError::Limit {
                what: "poll group CQ",
                asked: cq_depth as u64,
                max: attr.max_cqe as u64,
            });
        }
        let channel = ctx.create_comp_channel()?;
        let cq = ctx.create_cq(cq_depth, Some(&channel))?;
        let srq = pd.create_srq(&SrqInit {
            max_wr: cfg.srq_depth,
            max_sge: 1,
            limit: 0,
        })?;
        let recv = RecvSlots::new(pd, cfg.srq_depth, CAPSULE_HEADER + cfg.in_capsule_data_size)?;
        let bufs = DataBuffers::new(pd, cfg.data_buffers, cfg.io_unit_size)?;
        let mut pg = PollGroup {
            ctx: ctx.clone(),
            pd: pd.clone(),
            channel,
            cq,
            srq,
            raises_last_wqe: attr.raises_last_wqe_reached,
            max_inline: 0,
            recv,
            bufs,
            reqs: Slab::with_capacity(cfg.max_requests as usize),
            tree: RBTree::new(QpairAdapter::new()),
            qpairs: 0,
            waiting: std::collections::VecDeque::with_capacity(cfg.max_qpairs as usize),
            dirty: Vec::with_capacity(cfg.max_qpairs as usize),
            draining: Vec::with_capacity(cfg.max_qpairs as usize),
            carried: std::collections::VecDeque::with_capacity(
                (cfg.max_requests * MAX_CHAIN + cfg.max_qpairs) as usize,
            ),
            stats: PollGroupStats::default(),
            cfg,
        };
        // Fill the SRQ before any qpair can exist.
        let calls = pg.recv.flush(&pg.srq).map_err(|e| e.error)?;
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
    pub fn srq(&self) -> &Srq {
        &self.srq
    }

    /// Before sleeping: arm the CQ and say which fds wake this group (the completion channel,
    /// plus the provider's progress fd where completions are made by polling). Returns None
    /// when work arrived meanwhile (the caller must poll instead of sleeping): a completion
    /// that lands between the last poll and the arming would otherwise be slept through.
    pub fn arm(&mut self) -> Result<Option<[Option<RawFd>; 2]>> {
        self.cq.req_notify(false)?;
        if self.recv.queued() > 0
            || !self.dirty.is_empty()
            || !self.carried.is_empty()
            || !self.draining.is_empty()
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

    /// After waking: consume the completion channel's events (each arming yields at most one).
    pub fn ack_wakeups(&mut self) -> Result<u32> {
        let mut n = 0;
        while self.channel.get_event()?.is_some() {
            n += 1;
        }
        Ok(n)
    }
    pub fn stats(&self) -> PollGroupStats {
        self.stats
    }
    /// Whether this device raises LAST_WQE_REACHED (else drains use the fallback).
    pub fn raises_last_wqe(&self) -> bool {
        self.raises_last_wqe
    }

    /// Qpairs in the tree (connecting, active or draining).
    pub fn qpair_count(&self) -> usize {
        self.qpairs
    }

    /// The qp_nums in this group, in tree order (control path: for shutdown and listings).
    pub fn qpair_nums(&self) -> impl Iterator<Item = u32> + '_ {
        self.tree.iter().map(|q| q.qp_num)
    }

    /// Receive slots currently posted on the SRQ.
    pub fn recvs_posted(&self) -> u32 {
        self.recv.posted()
    }

    /// Receive slots in each state: (posted on the SRQ, queued for re-posting, held by
    /// capsules). They always add up to `srq_depth`.
    pub fn recv_accounting(&self) -> (u32, u32, u32) {
        let posted = self.recv.posted();
        let queued = self.recv.queued();
        (posted, queued, self.recv.count() - posted - queued)
    }

    /// Request objects in use.
    pub fn requests_in_use(&self) -> usize {
        self.reqs.len()
    }

    /// Data buffers free.
    pub fn buffers_free(&self) -> u32 {
        self.bufs.available()
    }
}
