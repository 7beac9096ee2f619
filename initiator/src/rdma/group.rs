//! The host poll group one reactor's queues share (per RDMA device): one CQ polled once per
//! pass over the group's queues, completions routed to their queue through the poll group
//! (qp_num -> qpair -> the token the queue joined with), request objects and receive slots
//! shared by every queue of every controller placed on that reactor.
//!
//! Placement ([`QueueHome`]): the fabric decides which group a queue joins when it connects
//! (see [`super::RdmaFabric::spread`]): by default every queue of the fabric shares one group
//! per device (a single-threaded user: the nvmf CLI, `BlockDevice`, tests); spread over N
//! reactors, admin queues join the control thread's group and I/O queue `qid` joins reactor
//! `(qid - 1) % N`'s, the split `perf::runner` uses when it moves queues to reactors.
//!
//! Sizing ([`HostGroupConfig`]): fixed when the group is made (a poll group never grows):
//! `requests` request objects (each with a 64-byte capsule slot in the group's capsule region,
//! by request index: no buffer taken from the poll group's pool per command; in-capsule data
//! goes out of the queue's registered region as a second SGE), receive slots (below), at most
//! `max_queues` qpairs. A queue joins only if its depth fits the request objects not yet
//! reserved by the others (so no queue ever meets a request shortage below its depth); a group
//! that is full refuses the connect with a message naming the knob.
//!
//! Readiness ([`crate::queue::CompletionGroup`]): the router lists each queue that gets
//! something to report (a completion handed to its side, the loss of its connection) once,
//! until [`HostGroup::poll_ready`] names it; a poller driving many queues then polls only
//! those (plus the ones it has commands for) instead of every queue every pass.
//!
//! Receives: one shared receive queue (SRQ) of `requests` response slots where the device
//! raises LAST_WQE_REACHED (a qpair's teardown then ends on that event), plus a poll's batch:
//! the slots a poll freed are re-posted after the submissions that follow it, off their path
//! (`RecvRepost::NextPass`); per-qpair receive queues of `max_queue_depth` slots where it does
//! not (rxe): an SRQ QP's drain would wait out the poll group's grace instead, one queue after
//! another.
//!
//! Async events: the group routes its QPs' events through the device's [`AsyncHub`] (a target
//! in the same process shares the device's one event queue) into its own channel, read on
//! the group's thread while a qpair drains and every [`EVENT_PASS`] polls otherwise.
//!
//! The group sits behind a mutex so a queue stays `Send` (a controller connects its queues on
//! the control thread and moves them to reactors). With queues placed as above only one
//! thread takes a group's lock, so it is never contended: one atomic each way, no syscall.
//! The group lives while any of its queues does (each holds an `Arc`; the registry a `Weak`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, channel};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use nvmf_transport::pollgroup::{
    ChainWr, Handler, PollGroup, PollGroupConfig, PollGroupStats, QpairEvent, RecvMode, RecvRepost,
    ReqId, WrKind,
};
use nvmf_transport::{
    Access, AsyncEventKind, AsyncHub, AsyncRoute, AsyncSink, Context, Mr, SendOp, Sge,
    TransportError, WcStatus,
};

use nvmf_protocol::Sqe;

use super::side::{HostCommand, Side};
use crate::queue::{CompletionGroup, ConnectError};

/// Bytes of a command capsule (the SQE; in-capsule data is a second SGE).
const CAPSULE: usize = 64;

/// With no qpair draining, the group reads its async events once per this many CQ polls (a
/// QP error shows in its completions anyway; this keeps the channel from growing).
const EVENT_PASS: u64 = 4096;

/// Which reactor (host poll group) a queue belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QueueHome {
    /// The thread that drives the controllers (admin queues when spread over reactors).
    Control,
    /// Reactor `n`.
    Reactor(usize),
}

/// How each host poll group is sized (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostGroupConfig {
    /// Qpairs one group holds at most.
    pub max_queues: u32,
    /// Deepest queue (and receive slots per qpair where the group has no SRQ); deeper asks
    /// are cut to this.
    pub max_queue_depth: u32,
    /// Request objects (commands in flight over all queues of the group); the sum of the
    /// member queues' depths must fit. With an SRQ, also its response slots (at least 64, plus
    /// one poll's batch). With `silent_answers` the poll group gets a quarter more: a
    /// command's SEND posted without a completion of its own keeps its object past the
    /// response until a later completion on its qpair retires it (`SILENT_HEADROOM`).
    pub requests: u32,
    /// Lone commands (a queue's only one in a flush, as at depth 1) a queue may send in a row
    /// without a SEND completion of their own (the poll group's `silent_answers`; 0, the
    /// default, signals every one).
    pub silent_answers: u32,
}

/// With `silent_answers`, the poll group's request objects beyond `HostGroupConfig::requests`:
/// one in this many. What the queues' depths do not claim, command SENDs that went without a
/// completion of their own may hold (the poll group's `silent.rs`).
const SILENT_HEADROOM: u32 = 4;

impl Default for HostGroupConfig {
    fn default() -> Self {
        // CQ: 64 * 128 receives + 1024 requests' chains + markers = 25,664 entries, inside
        // rxe's 32,767 (with silent_answers, 1280 requests: 30,016).
        Self {
            max_queues: 64,
            max_queue_depth: 128,
            requests: 1024,
            silent_answers: 0,
        }
    }
}

/// What a group holds now (for tests and statistics).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostGroupInfo {
    /// Whose group.
    pub home: QueueHome,
    /// Device name.
    pub device: String,
    /// Queues joined and not yet left.
    pub queues: usize,
    /// Request objects reserved by them (sum of depths).
    pub reserved: u32,
    /// Qpairs in the poll group (draining ones included).
    pub qpairs: usize,
    /// Request objects in use (commands in flight, silent SENDs not yet retired).
    pub requests_in_use: usize,
    /// Receive slots holding a response not yet handled, and slots queued for re-posting.
    pub recv_held: u32,
    pub recv_queued: u32,
    /// CQ polls so far.
    pub polls: u64,
    /// The poll group's counters (how its qpairs' drains ended, among others).
    pub stats: PollGroupStats,
    /// Memory windows the host invalidated itself (LOCAL_INV) because the target's response
    /// left their key valid: per-I/O keys against a target that does not invalidate them.
    pub local_invalidations: u64,
    /// The group's completion queue: its number on the device (as `rdma res show cq` names
    /// it; the soft provider's faults take it).
    pub cq: u32,
}

/// Hands each poll-group callback to the [`Side`] of the queue it concerns, and lists the
/// queues that got something to report (see the module documentation).
pub(super) struct Router {
    sides: Vec<Option<Side>>,
    /// Tokens of the sides listed for [`HostGroup::poll_ready`] (each side at most once while
    /// its `listed` is set; a token whose side left may linger until the next `poll_ready`).
    listed: Vec<u64>,
    /// Windows the host invalidated itself (the target answered with a plain SEND).
    local_invalidations: u64,
    /// The same count over every group of the fabric, those gone included
    /// ([`Registry::local_invalidations`]).
    fabric_local_invalidations: Arc<AtomicU64>,
}

impl Router {
    pub(super) fn side(&mut self, token: u64) -> Option<&mut Side> {
        self.sides.get_mut(token as usize).and_then(Option::as_mut)
    }

    /// Lists the side of `token` for `poll_ready` if it has something to report and is not
    /// listed already.
    pub(super) fn note(&mut self, token: u64) {
        if let Some(Some(side)) = self.sides.get_mut(token as usize) {
            if !side.listed && (!side.done.is_empty() || side.lost.is_some()) {
                side.listed = true;
                self.listed.push(token);
            }
        }
    }

    /// The command of `req` is answered and its SEND done, but the target left its window's
    /// key valid: posts the window's LOCAL_INV on the request, which keeps `command` until it
    /// completes (None), so that the command is reported only once no key of it lets the
    /// target in (the consumer may reuse its range at once), as the Linux host does. The
    /// command back: nothing to invalidate, or the post failed (the queue is lost).
    #[cold]
    fn invalidate_window(
        &mut self,
        pg: &mut PollGroup<HostCommand>,
        req: ReqId,
        command: HostCommand,
    ) -> Option<HostCommand> {
        let token = command.queue;
        let Some(side) = self.side(token) else {
            return Some(command);
        };
        let rkey = command.window.and_then(|window| {
            side.windows
                .as_ref()
                .and_then(Option::as_ref)
                .and_then(|windows| windows.in_use_key(window))
        });
        let (Some(rkey), Some(r)) = (rkey, pg.request_mut(req)) else {
            return Some(command);
        };
        r.user = command;
        tracing::debug!(
            qid = side.qid,
            rkey,
            "the target left a window valid: the host invalidates it"
        );
        let inv = ChainWr {
            op: SendOp::LocalInv { rkey },
            sges: &[],
            inline: false,
        };
        match pg.post_chain(req, &[inv], false) {
            Ok(()) => {
                self.local_invalidations += 1;
                self.fabric_local_invalidations
                    .fetch_add(1, Ordering::Relaxed);
                None
            }
            Err(e) => {
                side.lose(format!("local invalidate of a window: {e}"));
                let back = pg.request_mut(req).map(|r| std::mem::take(&mut r.user));
                Some(back.unwrap_or(HostCommand {
                    queue: token,
                    ..HostCommand::default()
                }))
            }
        }
    }

    /// Makes every side lost for `why` (and lists it).
    fn lose_all(&mut self, why: &str) {
        for token in 0..self.sides.len() as u64 {
            if let Some(side) = self.side(token) {
                side.lose(why.to_string());
                self.note(token);
            }
        }
    }
}

impl Handler<HostCommand> for Router {
    fn capsule(&mut self, _: &mut PollGroup<HostCommand>, req: ReqId) {
        tracing::warn!(?req, "a host group made a request from a capsule");
    }
    fn chain_done(
        &mut self,
        pg: &mut PollGroup<HostCommand>,
        req: ReqId,
        kind: WrKind,
        status: WcStatus,
    ) {
        // The only chain a host request posts after its SEND's: the LOCAL_INV of a window the
        // target left valid (`request_complete`). The command is reported now.
        let command = pg
            .request_mut(req)
            .filter(|r| kind == WrKind::KeyOp && r.user.window.is_some())
            .map(|r| std::mem::take(&mut r.user));
        let Some(mut command) = command else {
            tracing::warn!(
                ?req,
                ?status,
                "unexpected chain completion on a host request"
            );
            return;
        };
        pg.finish(req);
        let token = command.queue;
        if let Some(side) = self.side(token) {
            if status == WcStatus::Success {
                if let (Some(w), Some(Some(windows))) = (command.window.take(), &mut side.windows) {
                    windows.free(w);
                }
                side.complete(command, status);
            } else {
                side.lose(format!(
                    "local invalidate of a window the target left valid: {status:?}"
                ));
            }
            self.note(token);
        }
    }
    fn qpair_event(&mut self, _: &mut PollGroup<HostCommand>, _: u32, token: u64, ev: QpairEvent) {
        let Some(side) = self.side(token) else {
            return;
        };
        match ev {
            QpairEvent::Active => side.active = true,
            QpairEvent::Draining(reason) => side.lose(format!("qpair draining: {reason:?}")),
            QpairEvent::Gone { forced } => {
                side.gone = true;
                side.lose(format!("qpair gone (forced: {forced})"));
            }
        }
        self.note(token);
    }
    fn aborted(&mut self, pg: &mut PollGroup<HostCommand>, req: ReqId) {
        // The qpair is gone; the target can no longer touch the region for this command.
        pg.finish(req);
    }
    fn buffers_ready(&mut self, _: &mut PollGroup<HostCommand>, _: ReqId) {}

    fn response(
        &mut self,
        pg: &mut PollGroup<HostCommand>,
        qp_num: u32,
        token: u64,
        capsule: &[u8],
    ) {
        match self.side(token) {
            Some(side) => {
                side.response(pg, capsule);
                // A malformed response loses the queue: its owner must hear of it.
                if side.lost.is_some() {
                    self.note(token);
                }
            }
            None => tracing::warn!(qp_num, "response for a qpair of no queue"),
        }
    }

    fn request_complete(&mut self, pg: &mut PollGroup<HostCommand>, req: ReqId, status: WcStatus) {
        let mut command = pg
            .request_mut(req)
            .map(|r| std::mem::take(&mut r.user))
            .unwrap_or_default();
        if status == WcStatus::Success && command.window.is_some() {
            match self.invalidate_window(pg, req, command) {
                // Reported when the LOCAL_INV completes (`chain_done`).
                None => return,
                Some(back) => command = back,
            }
        }
        pg.finish(req);
        let token = command.queue;
        if let Some(side) = self.side(token) {
            side.complete(command, status);
            self.note(token);
        }
    }

    fn group_failed(&mut self, _: &mut PollGroup<HostCommand>, error: &str) {
        self.lose_all(&format!("poll group failed: {error}"));
    }
}

/// The group's capsule region: request `index`'s SQE at `CAPSULE * index`, local access only.
pub(super) struct Capsules(Mr);

impl Capsules {
    /// Writes `sqe` into the slot of request `index`; the SGE of the slot. None: no slot of
    /// that index (the poll group made more requests than it was sized for).
    pub(super) fn write(&self, index: u32, sqe: &Sqe) -> Option<Sge> {
        let at = index as usize * CAPSULE;
        let mut capsule = [0u8; CAPSULE];
        sqe.encode(&mut capsule);
        self.0.write_at(at, &capsule).ok()?;
        Some(self.0.sge(at, CAPSULE as u32))
    }
}

/// One reactor's host poll group on one device (see the module documentation).
pub(super) struct HostGroup {
    pub(super) pg: PollGroup<HostCommand>,
    pub(super) router: Router,
    /// Each request's SQE (after `pg`: dropped once its QPs are).
    pub(super) capsules: Capsules,
    /// CQ polls so far: a queue polls the CQ only when nobody did since its own last poll.
    pub(super) polls: u64,
    /// Request objects reserved by member queues, by token.
    reserved: Vec<u32>,
    /// The async events of the group's QPs (see the module documentation).
    events: GroupEvents,
    cfg: HostGroupConfig,
    home: QueueHome,
}

/// A group's share of its device's async events.
struct GroupEvents {
    hub: AsyncHub,
    /// Every route of the group hands its events here.
    sink: AsyncSink,
    received: Receiver<AsyncEventKind>,
    /// Each member queue's route, by token (a slot per token, made with `reserved`'s).
    routes: Vec<Option<AsyncRoute>>,
}

impl GroupEvents {
    fn new(ctx: &Context) -> Self {
        let (tx, received) = channel();
        Self {
            hub: AsyncHub::of(ctx),
            sink: Arc::new(move |kind| {
                // The group is gone: nothing waits for its events any more.
                let _ = tx.send(kind);
            }),
            received,
            routes: Vec::new(),
        }
    }
}

impl HostGroup {
    fn new(
        ctx: &Context,
        cfg: HostGroupConfig,
        home: QueueHome,
        fabric_local_invalidations: Arc<AtomicU64>,
    ) -> Result<Self, TransportError> {
        // One response per request object (the headroom's included: the SRQ is sized with
        // the group's `max_requests`, which `NextPass` checks): they cover every queue. On
        // an SRQ a poll's freed slots go back after the submissions that follow it (off the
        // next command's path), which keeps up to a batch of them off the SRQ: that many more.
        let batch = PollGroupConfig::default().batch;
        let headroom = if cfg.silent_answers > 0 {
            cfg.requests / SILENT_HEADROOM
        } else {
            0
        };
        let requests = cfg.requests.saturating_add(headroom);
        let (recv, srq_depth, recv_repost) = if ctx.query_device()?.raises_last_wqe_reached {
            let depth = requests.max(64).saturating_add(batch as u32);
            (RecvMode::Srq, depth, RecvRepost::NextPass)
        } else {
            let recvs = cfg.max_queue_depth;
            (
                RecvMode::PerQpair { recvs },
                cfg.max_queues * recvs,
                RecvRepost::EndOfPass,
            )
        };
        let pg_cfg = PollGroupConfig {
            srq_depth,
            max_qpairs: cfg.max_queues,
            max_queue_depth: cfg.max_queue_depth,
            // Host receive slots take 16-byte responses only.
            in_capsule_data_size: 0,
            // The host takes no data buffers from the group: a request's SQE is in the
            // group's capsule region (`Capsules`), its in-capsule data a second SGE over the
            // queue's region. One unit because the pool cannot be empty.
            io_unit_size: 64,
            data_buffers: 1,
            max_requests: requests,
            silent_answers: cfg.silent_answers,
            batch,
            recv_repost,
            ..PollGroupConfig::default()
        };
        let pg = PollGroup::new_host(ctx, pg_cfg, recv)?;
        // What the poll group really has: it caps request objects to fit a small device CQ.
        let capsules = pg.pd().alloc_mr(
            (pg.config().max_requests as usize).max(1) * CAPSULE,
            Access::LOCAL_WRITE,
        )?;
        Ok(Self {
            pg,
            capsules: Capsules(capsules),
            router: Router {
                sides: Vec::new(),
                // Each member listed at most once: no allocation on the fast path.
                listed: Vec::with_capacity(cfg.max_queues as usize),
                local_invalidations: 0,
                fabric_local_invalidations,
            },
            polls: 0,
            reserved: Vec::new(),
            events: GroupEvents::new(ctx),
            cfg,
            home,
        })
    }

    /// The depth a queue asking for `wanted` gets in this group.
    pub(super) fn depth_for(&self, wanted: u32) -> u32 {
        wanted.clamp(1, self.cfg.max_queue_depth)
    }

    /// Takes `side` in with `depth` request objects reserved; returns its token.
    pub(super) fn join(&mut self, side: Side, depth: u32) -> Result<u64, ConnectError> {
        let reserved: u32 = self.reserved.iter().sum();
        // What the poll group really has (it caps request objects to fit a small device CQ),
        // less the headroom for silent SENDs.
        let capacity = self.pg.config().max_requests.min(self.cfg.requests);
        if reserved + depth > capacity {
            return Err(ConnectError::Resources(format!(
                "host poll group of {:?} is full: {reserved} of {capacity} request objects \
                 reserved, a queue of depth {depth} does not fit (raise \
                 HostGroupConfig::requests; asked {})",
                self.home, self.cfg.requests
            )));
        }
        let token = match self.router.sides.iter().position(Option::is_none) {
            Some(free) => free,
            None => {
                self.router.sides.push(None);
                self.reserved.push(0);
                self.events.routes.push(None);
                self.router.sides.len() - 1
            }
        };
        self.router.sides[token] = Some(side);
        self.reserved[token] = depth;
        Ok(token as u64)
    }

    /// The async events naming `qp_num` (the QP of the queue of `token`) come to this group
    /// until the queue leaves.
    pub(super) fn route_events(&mut self, token: u64, qp_num: u32) {
        let GroupEvents {
            hub, sink, routes, ..
        } = &mut self.events;
        if let Some(route) = routes.get_mut(token as usize) {
            *route = Some(hub.route(qp_num, sink.clone()));
        }
    }

    /// The queue of `token` is gone: its side, reservation and event route go.
    pub(super) fn leave(&mut self, token: u64) {
        if let Some(s) = self.router.sides.get_mut(token as usize) {
            *s = None;
            self.reserved[token as usize] = 0;
        }
        if let Some(route) = self.events.routes.get_mut(token as usize) {
            *route = None;
        }
    }

    /// Reads the device's pending async events and hands this group's to its poll group.
    fn take_async_events(&mut self) {
        self.events.hub.pump();
        while let Ok(kind) = self.events.received.try_recv() {
            self.pg.handle_async_event(&mut self.router, kind);
        }
    }

    /// Polls the CQ once; a failing poll fails every queue of the group.
    pub(super) fn poll(&mut self) {
        self.polls += 1;
        // A drain may be waiting for its LAST_WQE_REACHED.
        if self.pg.draining() > 0 || self.polls % EVENT_PASS == 0 {
            self.take_async_events();
        }
        if let Err(e) = self.pg.poll(&mut self.router) {
            self.router.lose_all(&format!("poll: {e}"));
        }
    }

    /// Polls the CQ once and appends to `ready` the tokens of the member queues listed since
    /// the last call (see [`CompletionGroup::poll_ready`]).
    pub(super) fn poll_ready(&mut self, ready: &mut Vec<u64>) {
        self.poll();
        let Router { sides, listed, .. } = &mut self.router;
        for token in listed.drain(..) {
            if let Some(Some(side)) = sides.get_mut(token as usize) {
                if side.listed {
                    side.listed = false;
                    ready.push(token);
                }
            }
        }
    }

    fn info(&self) -> HostGroupInfo {
        let (_, recv_queued, recv_held) = self.pg.recv_accounting();
        HostGroupInfo {
            home: self.home,
            device: self.pg.context().name().to_string(),
            queues: self.router.sides.iter().flatten().count(),
            reserved: self.reserved.iter().sum(),
            qpairs: self.pg.qpair_count(),
            requests_in_use: self.pg.requests_in_use(),
            recv_held,
            recv_queued,
            polls: self.polls,
            stats: self.pg.stats(),
            local_invalidations: self.router.local_invalidations,
            cq: self.pg.cq().id(),
        }
    }
}

/// A member queue's handle on its group, for a poller driving many queues.
pub(super) struct GroupHandle(pub(super) Arc<Mutex<HostGroup>>);

impl CompletionGroup for GroupHandle {
    fn id(&self) -> usize {
        Arc::as_ptr(&self.0) as usize
    }

    fn poll_ready(&mut self, ready: &mut Vec<u64>) {
        lock(&self.0).poll_ready(ready);
    }
}

/// Locks a group. A panic while it was held (a bug) does not make every later queue panic too.
pub(super) fn lock(group: &Mutex<HostGroup>) -> MutexGuard<'_, HostGroup> {
    group
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A group's key: its home and its device's name.
type GroupKey = (QueueHome, String);

/// The groups of one fabric (and its clones), by home and device.
#[derive(Default)]
pub(super) struct Registry {
    groups: Mutex<HashMap<GroupKey, Weak<Mutex<HostGroup>>>>,
    /// Windows the host invalidated itself, over every group made (a group goes with its
    /// last queue; its count stays here).
    local_invalidations: Arc<AtomicU64>,
}

impl Registry {
    /// The group of `home` on `ctx`'s device, made on first use.
    pub(super) fn group(
        &self,
        ctx: &Context,
        home: QueueHome,
        cfg: HostGroupConfig,
    ) -> Result<Arc<Mutex<HostGroup>>, TransportError> {
        let mut groups = self
            .groups
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let key = (home, ctx.name().to_string());
        if let Some(g) = groups.get(&key).and_then(Weak::upgrade) {
            // A failed group takes no qpair: a reconnect while the lost queues still hold it
            // gets a new one (the failed one goes with its last queue).
            if lock(&g).pg.failed().is_none() {
                return Ok(g);
            }
        }
        let g = Arc::new(Mutex::new(HostGroup::new(
            ctx,
            cfg,
            home,
            self.local_invalidations.clone(),
        )?));
        groups.retain(|_, w| w.strong_count() > 0);
        groups.insert(key, Arc::downgrade(&g));
        Ok(g)
    }

    /// Windows the host invalidated itself in every group made so far.
    pub(super) fn local_invalidations(&self) -> u64 {
        self.local_invalidations.load(Ordering::Relaxed)
    }

    /// Every live group.
    pub(super) fn info(&self) -> Vec<HostGroupInfo> {
        let groups = self
            .groups
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        groups
            .values()
            .filter_map(Weak::upgrade)
            .map(|g| lock(&g).info())
            .collect()
    }
}
