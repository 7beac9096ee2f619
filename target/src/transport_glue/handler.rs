//! [`NvmeHandler`]: the poll-group handler of one group, joining the RDMA request path to the
//! NVMe layer. It owns the group's [`ReactorIo`] (block-device channels and in-flight I/O of
//! this reactor), the NVMe [`Queue`] of each qpair (a slab, reached per command by the
//! qpair's slot in the poll group and then by the key the command keeps), the table of pending
//! completions (tag -> request), and the registered memory the 16-byte responses are sent
//! from. It drives each request through [`CommandState`] (see `command.rs`).
//!
//! In-capsule write data is used in place, as SPDK does: the command executes straight from
//! its receive slot (no data buffer, no copy) and the slot stays the request's, off the SRQ,
//! until its block I/O is done: it goes back when the response is built (the device finished
//! with the data) or when the request is finished (an orphan whose qpair went, once its block
//! I/O completes). An asynchronous device (io_uring) reads the slot after `submit` returns,
//! so nothing may re-post it earlier. Other commands give their slot back once parsed.
//!
//! Slots so held are bounded: each belongs to a command the host has outstanding (at most
//! its queue depth per qpair, and at most `max_requests` request objects per group), exactly
//! as a capsule waiting for a request object holds its slot; no slot waits on anything but
//! its own block I/O, so a slow device delays receives but cannot deadlock them. Size
//! `srq_depth` for the queues expected to be full at once (at least `max_queue_depth`, which
//! the configuration checks).

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrayvec::ArrayVec;
use nvmf_protocol::sqe::{AdminOpcode, SQE_SIZE};
use nvmf_protocol::{Cqe, Sqe};
use nvmf_transport::pollgroup::{
    BufferGrant, ChainWr, Handler, MAX_CHAIN_SGES, MAX_CHAIN_WRS, MAX_REQUEST_BUFFERS, PollGroup,
    QpairEvent, ReqId, WrKind,
};
use nvmf_transport::{Access, Mr, SendOp, Sge, WcStatus};
use slab::Slab;

use crate::bdev::IoBuf;
use crate::nvme::status::{ABORTED_BY_REQUEST, INTERNAL_ERROR};
use crate::nvme::xfer::{self, Keyed, Placement, Plan};
use crate::nvme::{Direction, Exec, Queue, QueueState, ReactorIo, Target};

use super::command::{Command, CommandState};
use super::sges;

/// Bytes of one response (a CQE) in the response region.
const RESPONSE_SIZE: usize = 16;
/// After answering a Disconnect command, how long the host has to tear the connection down
/// itself before the target does: dropping it at once can overtake the response on fabrics
/// whose connection manager is not ordered with the data path (the soft TCP fabric).
const DISCONNECT_GRACE: Duration = Duration::from_secs(1);
/// How long a connected qpair may go without a successful Fabrics Connect before the target
/// disconnects it: a host that connects and never sends one (or whose Connect was refused,
/// e.g. not on the allow-list) held its qpair and poll-group slot for good. Generous: Linux
/// opens every I/O qpair of a controller before it connects them, and on a reconnect may wait
/// up to its I/O timeout (30 s) before connecting queues it adds.
pub const CONNECT_DEADLINE: Duration = Duration::from_secs(60);

/// `by_qpair` entry of a qpair slot with no queue.
const NO_QUEUE: usize = usize::MAX;

/// The NVMe side of one qpair.
struct QueueSlot {
    queue: Queue,
    qp_num: u32,
    /// The qpair's slot in the poll group (`Request::qpair_index`).
    qpair_index: u32,
    /// Block-device I/O of this queue in flight (the queue is dropped after the last).
    in_flight: u32,
    /// The qpair is gone: drop the queue when `in_flight` reaches 0.
    gone: bool,
    /// Asked for a disconnect already.
    disconnecting: bool,
    /// The host sent Disconnect: the target disconnects at this time if the host has not.
    disconnect_at: Option<Instant>,
    /// Disconnected at this time if still without a controller ([`CONNECT_DEADLINE`]).
    connect_by: Instant,
}

/// One group's handler. See the module documentation.
pub struct NvmeHandler {
    target: Arc<Target>,
    io: ReactorIo,
    /// NVMe queues; a command keeps its queue's key (`Command::queue`).
    queues: Slab<QueueSlot>,
    /// Qpair slot in the poll group -> queue key (NO_QUEUE): the per-capsule way in, sized to
    /// the group's max_qpairs.
    by_qpair: Vec<usize>,
    /// qp_num -> queue key of live qpairs, for qpair events (control path).
    by_qp_num: HashMap<u32, usize>,
    /// Pending completions: tag -> request.
    pending: Slab<ReqId>,
    /// Keyed SGL descriptors of each request, by request index (the plan keeps only their
    /// count: a plan is copied per step, the list of up to 16 is not). Sized to max_requests.
    keyed: Vec<[Keyed; xfer::MAX_KEYED]>,
    /// One response slot per request object, by request index (registered on first use, on
    /// the group's protection domain).
    responses: Option<Mr>,
    disconnects: Vec<u32>,
    /// Completions reaped in one poll (capacity kept).
    completions: Vec<(u64, Cqe)>,
    /// A host's key may be invalidated with the response (config and device allow it).
    remote_invalidate: bool,
    /// Abort requests taken on a tick: (victim's queue key, victim cid, Abort cid).
    aborts: Vec<(usize, u16, u16)>,
    /// [`CONNECT_DEADLINE`] unless a test shortens it.
    connect_deadline: Duration,
}

impl NvmeHandler {
    /// A handler for a group on the reactor `io` belongs to.
    pub fn new(target: Arc<Target>, io: ReactorIo) -> NvmeHandler {
        NvmeHandler {
            target,
            io,
            queues: Slab::new(),
            by_qpair: Vec::new(),
            by_qp_num: HashMap::new(),
            pending: Slab::new(),
            keyed: Vec::new(),
            responses: None,
            disconnects: Vec::new(),
            completions: Vec::new(),
            aborts: Vec::new(),
            remote_invalidate: true,
            connect_deadline: CONNECT_DEADLINE,
        }
    }

    /// How long a qpair may stay without a successful Fabrics Connect (default
    /// [`CONNECT_DEADLINE`]).
    pub fn with_connect_deadline(mut self, deadline: Duration) -> NvmeHandler {
        self.connect_deadline = deadline;
        self
    }

    /// Whether a response may carry SEND_WITH_INVALIDATE of the key the host asked to have
    /// invalidated (default true): false where the device cannot (no memory management
    /// extensions) or the configuration says no (`[transport] remote_invalidate`). The host
    /// then invalidates its key itself.
    pub fn with_remote_invalidate(mut self, on: bool) -> NvmeHandler {
        self.remote_invalidate = on;
        self
    }

    /// This group's block-device context (its counters feed the statistics).
    pub fn io(&self) -> &ReactorIo {
        &self.io
    }

    /// NVMe queues alive on this group (gone qpairs with I/O still in flight included).
    pub fn queue_count(&self) -> usize {
        self.queues.len()
    }

    /// Completions pending (block-device I/O and Asynchronous Event Requests).
    pub fn pending_count(&self) -> usize {
        self.pending.len()
    }

    /// The key of the queue of qpair `qp_num` (slot `index` in the group), created on first
    /// use (qpair Active, or its first capsule).
    fn ensure_queue(&mut self, pg: &mut PollGroup<Command>, qp_num: u32, index: u32) -> usize {
        if self.by_qpair.is_empty() {
            // Sized once: no growth on the I/O path.
            let n = pg.config().max_requests as usize;
            self.by_qpair = vec![NO_QUEUE; pg.config().max_qpairs as usize];
            self.keyed = vec![[xfer::NO_KEYED; xfer::MAX_KEYED]; n];
            self.pending.reserve(n);
            self.completions.reserve(n);
        }
        if let Some(&key) = self
            .by_qpair
            .get(index as usize)
            .filter(|k| **k != NO_QUEUE)
        {
            return key;
        }
        let depth = pg
            .qpair_depth(qp_num)
            .unwrap_or(pg.config().max_queue_depth);
        let listener = pg
            .with_cm_id(qp_num, |id| Ok(id.local_addr()))
            .ok()
            .flatten()
            .unwrap_or(SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)));
        let queue = Queue::new(self.target.clone(), &mut self.io, listener, depth);
        tracing::debug!(qp_num, %listener, depth, "NVMe queue created");
        let key = self.queues.insert(QueueSlot {
            queue,
            qp_num,
            qpair_index: index,
            in_flight: 0,
            gone: false,
            disconnecting: false,
            disconnect_at: None,
            connect_by: Instant::now() + self.connect_deadline,
        });
        if let Some(k) = self.by_qpair.get_mut(index as usize) {
            *k = key;
        }
        self.by_qp_num.insert(qp_num, key);
        key
    }

    /// The queue key `req` was given with its capsule.
    fn queue_of(pg: &PollGroup<Command>, req: ReqId) -> Option<usize> {
        pg.request(req).and_then(|r| r.user.queue)
    }

    fn enter(pg: &mut PollGroup<Command>, req: ReqId, next: CommandState) {
        if let Some(r) = pg.request_mut(req) {
            let qp_num = r.qp_num();
            r.user.enter(next, qp_num, req.index());
        }
    }

    fn finish(pg: &mut PollGroup<Command>, req: ReqId) {
        Self::enter(pg, req, CommandState::Completed);
        pg.finish(req);
    }

    /// After the capsule is parsed: buffers, then data in, then execution.
    fn start(&mut self, pg: &mut PollGroup<Command>, req: ReqId, qp_num: u32) {
        let bytes = pg.capsule(req);
        let Ok(sqe) = Sqe::decode(bytes) else {
            // Too short to carry a CID: nothing to answer. The host broke the protocol.
            tracing::warn!(qp_num, len = bytes.len(), "capsule shorter than an SQE");
            Self::finish(pg, req);
            self.disconnects.push(qp_num);
            return;
        };
        let Some(list) = self.keyed.get_mut(req.index() as usize) else {
            // Cannot happen: the list is sized to max_requests with the first queue.
            Self::finish(pg, req);
            self.disconnects.push(qp_num);
            return;
        };
        let plan = xfer::plan(&sqe, &bytes[SQE_SIZE..], self.target.limits(), list);
        // One lookup for both (the plan stays None when the SGL was refused).
        if let Some(r) = pg.request_mut(req) {
            r.user.sqe = sqe;
            r.user.plan = plan.ok();
        }
        let plan = match plan {
            Ok(p) => p,
            Err(status) => {
                pg.release_capsule(req);
                self.fail(pg, req, status);
                return;
            }
        };
        if plan.length == 0 {
            pg.release_capsule(req);
            self.execute(pg, req);
            return;
        }
        if in_capsule_write(&plan).is_some() {
            // Executed from the receive slot: no buffer; the slot is released with the answer.
            self.execute(pg, req);
            return;
        }
        Self::enter(pg, req, CommandState::NeedBuffer);
        match pg.alloc_buffers(req, plan.length) {
            Ok(BufferGrant::Ready) => self.have_buffers(pg, req),
            Ok(BufferGrant::Waiting) => {}
            Err(e) => {
                tracing::warn!(qp_num, error = %e, "no buffers for a command");
                pg.release_capsule(req);
                self.fail(pg, req, INTERNAL_ERROR);
            }
        }
    }

    /// Answers `req` with `status`, nothing executed.
    fn fail(&mut self, pg: &mut PollGroup<Command>, req: ReqId, status: nvmf_protocol::Status) {
        let sqe = pg.request(req).map(|r| r.user.sqe).unwrap_or_default();
        match Self::queue_of(pg, req).and_then(|k| self.queues.get_mut(k)) {
            Some(slot) => {
                let cqe = slot.queue.reject(&sqe, status);
                self.respond(pg, req, cqe);
            }
            None => Self::finish(pg, req),
        }
    }

    /// The request holds its data buffers: move host data in, or execute.
    fn have_buffers(&mut self, pg: &mut PollGroup<Command>, req: ReqId) {
        let Some(r) = pg.request(req) else {
            return;
        };
        let qp_num = r.qp_num();
        let Some(plan) = r.user.plan else {
            return;
        };
        match (plan.direction, plan.placement) {
            (Direction::HostToController, Placement::Keyed { count }) => {
                pg.release_capsule(req);
                Self::enter(pg, req, CommandState::ReadingData);
                if let Some(r) = pg.request_mut(req) {
                    r.user.moved = 0;
                }
                if let Err(e) = self.post_next(pg, req, plan.length, count, None) {
                    tracing::warn!(qp_num, error = %e, "posting RDMA READs failed");
                    self.fail(pg, req, INTERNAL_ERROR);
                }
            }
            _ => {
                pg.release_capsule(req);
                self.execute(pg, req);
            }
        }
    }

    /// Posts the next chain of a transfer: RDMA READs (no `send`) or WRITEs (with the
    /// response `send`) of the request's first `count` keyed descriptors, from where the last chain stopped
    /// (`Command::moved`), as much as one chain holds; the response SEND goes last in the chain
    /// that ends the transfer. A transfer that needs more SGEs or work requests than a chain
    /// holds takes several chains, each posted when the one before it completed. A chain's
    /// local memory is all the request's own (its data buffers, its response slot by request
    /// index, the SEND inline): posted owned, so a lone response may go without a completion.
    fn post_next(
        &self,
        pg: &mut PollGroup<Command>,
        req: ReqId,
        length: u32,
        count: u8,
        send: Option<(SendOp, Sge)>,
    ) -> Result<(), String> {
        let keyed = self
            .keyed
            .get(req.index() as usize)
            .map_or(&[][..], |l| &l[..usize::from(count)]);
        let from = pg.request(req).map_or(0, |r| r.user.moved);
        // ArrayVecs: only what the chain uses is written (a 4 KiB transfer is one unit, one
        // piece, one WR and the SEND; the full-size arrays were kilobytes to initialise).
        let mut units = ArrayVec::<Sge, MAX_REQUEST_BUFFERS>::new();
        pg.buffer_sges_into(req, length, &mut units);
        let send_sge = [send.map_or(Sge::default(), |(_, sge)| sge)];
        // The response SEND ends the chain that ends the transfer.
        let response = send.map(|(op, _)| ChainWr {
            op,
            sges: &send_sge,
            inline: true,
        });
        // Data goes to the host (a read's RDMA WRITE) when the chain answers, else comes from
        // it (RDMA READ).
        let data_op = |remote_addr: u64, rkey: u32| match send {
            Some(_) => SendOp::RdmaWrite { remote_addr, rkey },
            None => SendOp::RdmaRead { remote_addr, rkey },
        };
        // The common transfer: one keyed descriptor, whole, in one work request. Its SGEs are
        // the buffers' own: no cutting. Buffers that do not cover it take the general path,
        // which refuses them.
        let limits = pg.sge_limits();
        let wr_sges = if send.is_some() {
            limits.send
        } else {
            limits.read
        };
        if let ([k], 0, true) = (keyed, from, units.len() <= wr_sges && length > 0) {
            let covered: u32 = units.iter().map(|u| u.length).sum();
            if k.length == length && covered == length {
                let data = ChainWr {
                    op: data_op(k.address, k.key),
                    sges: &units,
                    inline: false,
                };
                if let Some(r) = pg.request_mut(req) {
                    r.user.moved = length;
                }
                let result = match response {
                    Some(response) => pg.post_chain_owned(req, &[data, response], true),
                    None => pg.post_chain_owned(req, &[data], false),
                };
                return result.map_err(|e| e.to_string());
            }
        }
        // Room for the response SEND and its SGE is kept in every chain.
        let mut pieces = ArrayVec::<Sge, { MAX_CHAIN_SGES - 1 }>::new();
        let mut cuts = ArrayVec::<sges::Cut, { MAX_CHAIN_WRS - 1 }>::new();
        let end = sges::next_chain(
            &units,
            keyed.iter().map(|k| k.length),
            from,
            wr_sges,
            &mut pieces,
            &mut cuts,
        )
        .ok_or("the data buffers do not cover the transfer")?;
        let mut chain = ArrayVec::<ChainWr, MAX_CHAIN_WRS>::new();
        for cut in &cuts {
            let k = &keyed[cut.keyed];
            chain.push(ChainWr {
                // Checked by `xfer::plan` (no keyed buffer wraps); wrapping keeps it so.
                op: data_op(k.address.wrapping_add(u64::from(cut.remote_offset)), k.key),
                sges: &pieces[cut.sges.0..cut.sges.1],
                inline: false,
            });
        }
        let last = end == length;
        if let (Some(response), true) = (response, last) {
            chain.push(response);
        }
        if let Some(r) = pg.request_mut(req) {
            r.user.moved = end;
        }
        let answers = send.is_some() && last;
        pg.post_chain_owned(req, &chain, answers)
            .map_err(|e| e.to_string())
    }

    /// Hands the command to the NVMe layer.
    fn execute(&mut self, pg: &mut PollGroup<Command>, req: ReqId) {
        let Some(r) = pg.request(req) else {
            return;
        };
        let (sqe, plan) = (r.user.sqe, r.user.plan);
        let length = plan.map_or(0, |p| p.length);
        // In-capsule write data: bytes `at..end` of the capsule, used in place.
        let in_capsule = plan.as_ref().and_then(in_capsule_write);
        if let Some((_, end)) = in_capsule {
            if pg.capsule(req).len() < end {
                // The receive was shorter than the SGL says: the host broke the protocol.
                pg.release_capsule(req);
                self.fail(pg, req, INTERNAL_ERROR);
                return;
            }
        }
        Self::enter(pg, req, CommandState::Executing);
        let Some(slot) = Self::queue_of(pg, req).and_then(|k| self.queues.get_mut(k)) else {
            Self::finish(pg, req);
            return;
        };
        // Answered by an event, not by block I/O: an AER, or an Abort waiting for its
        // victim's queue to decide.
        let event = slot.queue.qid() == Some(0)
            && (sqe.opcode == AdminOpcode::AsyncEventRequest.raw()
                || sqe.opcode == AdminOpcode::Abort.raw());
        let entry = self.pending.vacant_entry();
        let tag = entry.key();
        let (exec, zeroed) = {
            // Only the views used are written (a 16-entry array was initialised per command).
            let mut segs = ArrayVec::<&mut [u8], MAX_REQUEST_BUFFERS>::new();
            let known_zero = match in_capsule {
                Some((at, end)) => {
                    if let Some(data) = pg.capsule_mut(req).get_mut(at..end) {
                        segs.push(data);
                    }
                    false
                }
                None if length > 0 => pg.buffers_mut_zeroed(req, length, &mut segs).1,
                None => false,
            };
            let mut data = IoBuf::new(&mut segs);
            data.truncate(length as usize);
            data.set_zeroed(known_zero);
            let exec = slot
                .queue
                .execute(&mut self.io, &sqe, &mut data, tag as u64, Instant::now);
            (exec, data.is_zeroed())
        };
        // The data buffers hold zeroes (a null read filled them, or found them so): the next
        // null read through them skips the fill. Not for I/O still in flight: the device may
        // write them yet.
        if zeroed && length > 0 && in_capsule.is_none() && matches!(exec, Exec::Done(_)) {
            pg.mark_zeroed(req, length);
        }
        match exec {
            Exec::Done(cqe) => self.respond(pg, req, cqe),
            Exec::Pending => {
                entry.insert(req);
                if !event {
                    slot.in_flight += 1;
                }
                if let Some(r) = pg.request_mut(req) {
                    r.user.pending_tag = Some(tag);
                    r.user.pending_event = event;
                }
            }
        }
    }

    /// Sends `cqe` for `req`: RDMA WRITEs of its data first when it returns data.
    fn respond(&mut self, pg: &mut PollGroup<Command>, req: ReqId, cqe: Cqe) {
        let Some(r) = pg.request(req) else {
            return;
        };
        let qp_num = r.qp_num();
        // The block device is done with the command's data: an in-capsule write's receive
        // slot goes back to the SRQ now (no-op for any other command).
        pg.release_capsule(req);
        if self.responses.is_none() {
            let len = pg.config().max_requests as usize * RESPONSE_SIZE;
            match pg.pd().alloc_mr(len, Access::LOCAL_WRITE) {
                Ok(mr) => self.responses = Some(mr),
                Err(e) => {
                    tracing::error!(error = %e, "registering the response region failed");
                    Self::finish(pg, req);
                    self.disconnects.push(qp_num);
                    return;
                }
            }
        }
        let Some(responses) = self.responses.as_ref() else {
            return;
        };
        let at = req.index() as usize * RESPONSE_SIZE;
        if let Err(e) = responses.write_at(at, &cqe.to_bytes()) {
            tracing::error!(error = %e, "writing a response failed");
            Self::finish(pg, req);
            return;
        }
        if let Some(r) = pg.request_mut(req) {
            r.user.cqe = Some(cqe);
            r.user.moved = 0;
        }
        Self::enter(pg, req, CommandState::Responding);
        self.continue_response(pg, req);
    }

    /// Posts the next chain of `req`'s response (its CQE is in its response slot): the data
    /// WRITEs still to go, and the SEND with the last of them.
    fn continue_response(&mut self, pg: &mut PollGroup<Command>, req: ReqId) {
        let Some(r) = pg.request(req) else {
            return;
        };
        let qp_num = r.qp_num();
        let (plan, success) = (
            r.user.plan,
            r.user.cqe.is_some_and(|c| c.status.is_success()),
        );
        let Some(responses) = self.responses.as_ref() else {
            return;
        };
        let sge = responses.sge(req.index() as usize * RESPONSE_SIZE, RESPONSE_SIZE as u32);
        let count = match plan.map(|p| p.placement) {
            Some(Placement::Keyed { count }) => count,
            _ => 0,
        };
        let keyed = self
            .keyed
            .get(req.index() as usize)
            .map_or(&[][..], |l| &l[..usize::from(count)]);
        // The host asked for its key to be invalidated with the response. A SEND invalidates
        // one key: when the descriptors flag different keys, none is (a plain SEND), and the
        // host invalidates its own, as it does for a target that never invalidates.
        let flagged = keyed.iter().find(|k| k.invalidate);
        let send_op = match flagged.filter(|_| self.remote_invalidate) {
            Some(k) if keyed.iter().all(|o| !o.invalidate || o.key == k.key) => {
                SendOp::SendWithInv { rkey: k.key }
            }
            _ => SendOp::Send,
        };
        let (length, writes) = match plan {
            Some(p) if p.direction == Direction::ControllerToHost && success => (p.length, count),
            _ => (0, 0),
        };
        // Only the response goes: the data buffers (a write's data, a failed read's) are done
        // with, and a host slow to take the response (RNR) must not hold them. (An in-capsule
        // write holds none: no call.)
        if writes == 0 && pg.request(req).is_some_and(|r| r.buffer_count() > 0) {
            pg.release_buffers(req);
        }
        if let Err(e) = self.post_next(pg, req, length, writes, Some((send_op, sge))) {
            tracing::warn!(qp_num, error = %e, "posting the response failed");
            Self::finish(pg, req);
            self.disconnects.push(qp_num);
        }
    }

    /// A pending completion (block device or event) came back under `tag`.
    fn complete(&mut self, pg: &mut PollGroup<Command>, tag: u64, cqe: Cqe) {
        let Some(req) = self.pending.try_remove(tag as usize) else {
            return;
        };
        let Some(r) = pg.request_mut(req) else {
            return;
        };
        let (orphaned, event, key) = (r.user.orphaned, r.user.pending_event, r.user.queue);
        r.user.pending_tag = None;
        if let (false, Some(key)) = (event, key) {
            if let Some(slot) = self.queues.get_mut(key) {
                // Block I/O that failed: into the error log, as a command failing at once is.
                if !cqe.status.is_success() && !orphaned {
                    slot.queue.record_late_error(&r.user.sqe, &cqe);
                }
                slot.in_flight = slot.in_flight.saturating_sub(1);
                if slot.gone && slot.in_flight == 0 {
                    let slot = self.queues.remove(key);
                    tracing::debug!(
                        qp_num = slot.qp_num,
                        "NVMe queue dropped after its last I/O"
                    );
                }
            }
        }
        if orphaned {
            Self::finish(pg, req);
        } else {
            self.respond(pg, req, cqe);
        }
    }

    /// Abort commands aimed at this group's I/O queues: a victim that has not started (waiting
    /// for data buffers, or its RDMA READs waiting for read depth or send-queue room) is
    /// answered Command Abort Requested, with its buffers and capsule slot going back as for
    /// any answered command; anything else is declined.
    fn serve_aborts(&mut self, pg: &mut PollGroup<Command>) {
        let mut asked = std::mem::take(&mut self.aborts);
        for (key, slot) in &self.queues {
            if !slot.gone {
                slot.queue
                    .take_aborts(&mut |cid, abort_cid| asked.push((key, cid, abort_cid)));
            }
        }
        for (key, cid, abort_cid) in asked.drain(..) {
            let Some(qp_num) = self.queues.get(key).map(|s| s.qp_num) else {
                continue;
            };
            let aborted = self.abort_waiting(pg, qp_num, cid);
            tracing::debug!(qp_num, cid, aborted, "abort");
            if let Some(slot) = self.queues.get(key) {
                slot.queue.answer_abort(abort_cid, aborted);
            }
        }
        self.aborts = asked;
    }

    /// Aborts command `cid` of `qp_num` if it has not started; whether it did.
    fn abort_waiting(&mut self, pg: &mut PollGroup<Command>, qp_num: u32, cid: u16) -> bool {
        let victim = pg.requests_of(qp_num).find(|&r| {
            pg.request(r).is_some_and(|r| {
                r.user.sqe.cid == cid
                    && matches!(
                        r.user.state(),
                        CommandState::NeedBuffer | CommandState::ReadingData
                    )
            })
        });
        // READs already on the wire cannot be called back: declined.
        let Some(req) = victim.filter(|&r| pg.cancel_wait(r)) else {
            return false;
        };
        pg.release_capsule(req);
        self.fail(pg, req, ABORTED_BY_REQUEST);
        true
    }

    /// Disconnects the qpairs still without a controller past their deadline (the clock read
    /// only while some queue is unbound).
    fn expire_unbound(&mut self) {
        let unbound = |s: &QueueSlot| {
            !s.gone && !s.disconnecting && matches!(s.queue.state(), QueueState::Unbound)
        };
        if !self.queues.iter().any(|(_, s)| unbound(s)) {
            return;
        }
        let now = Instant::now();
        for (_, slot) in self.queues.iter_mut() {
            if unbound(slot) && now >= slot.connect_by {
                tracing::warn!(
                    qp_num = slot.qp_num,
                    deadline = ?self.connect_deadline,
                    "no successful Fabrics Connect in time: disconnecting the qpair"
                );
                slot.disconnecting = true;
                self.disconnects.push(slot.qp_num);
            }
        }
    }

    /// Disconnects `qp_num` when its queue says so: at once when its controller was torn
    /// down, after [`DISCONNECT_GRACE`] when the host sent Disconnect.
    #[inline]
    fn check_disconnect(&mut self, key: usize) {
        let Some(slot) = self.queues.get_mut(key) else {
            return;
        };
        if slot.gone || slot.disconnecting || !slot.queue.should_disconnect() {
            return;
        }
        if matches!(
            slot.queue.state(),
            QueueState::Closed | QueueState::Disconnected { .. }
        ) {
            // The clock only here: after a Disconnect command, never per I/O.
            let now = Instant::now();
            let at = *slot.disconnect_at.get_or_insert(now + DISCONNECT_GRACE);
            if now < at {
                return;
            }
        }
        slot.disconnecting = true;
        self.disconnects.push(slot.qp_num);
    }
}

/// The capsule byte range (from, to) of `plan`'s data when it is host-to-controller data
/// carried in the capsule (an SGL offset descriptor), used in place.
fn in_capsule_write(plan: &Plan) -> Option<(usize, usize)> {
    match (plan.direction, plan.placement) {
        (Direction::HostToController, Placement::InCapsule { offset, length }) => {
            let at = SQE_SIZE + offset as usize;
            Some((at, at + length as usize))
        }
        _ => None,
    }
}

impl Handler<Command> for NvmeHandler {
    fn capsule(&mut self, pg: &mut PollGroup<Command>, req: ReqId) {
        let Some((qp_num, index)) = pg.request(req).map(|r| (r.qp_num(), r.qpair_index())) else {
            return;
        };
        let key = match self.by_qpair.get(index as usize) {
            Some(&key) if key != NO_QUEUE => key,
            _ => self.ensure_queue(pg, qp_num, index),
        };
        if let Some(r) = pg.request_mut(req) {
            r.user.queue = Some(key);
            r.user.enter(CommandState::New, qp_num, req.index());
        }
        self.start(pg, req, qp_num);
    }

    fn chain_done(
        &mut self,
        pg: &mut PollGroup<Command>,
        req: ReqId,
        last: WrKind,
        status: WcStatus,
    ) {
        let Some(qp_num) = pg.request(req).map(|r| r.qp_num()) else {
            return;
        };
        if status == WcStatus::Success {
            match last {
                // The host's data is in, or more of it is to read.
                WrKind::Read => {
                    let (moved, plan) = pg
                        .request(req)
                        .map_or((0, None), |r| (r.user.moved, r.user.plan));
                    match plan {
                        Some(Plan {
                            length,
                            placement: Placement::Keyed { count },
                            ..
                        }) if moved < length => {
                            if let Err(e) = self.post_next(pg, req, length, count, None) {
                                tracing::warn!(qp_num, error = %e, "posting RDMA READs failed");
                                self.fail(pg, req, INTERNAL_ERROR);
                            }
                        }
                        _ => self.execute(pg, req),
                    }
                    return;
                }
                // A response too large for one chain: its next part.
                WrKind::Write => {
                    self.continue_response(pg, req);
                    return;
                }
                _ => {}
            }
        }
        if status != WcStatus::Success {
            // The qpair drains on the error completion; the request just ends.
            tracing::debug!(qp_num, ?last, ?status, "a request's chain failed");
        }
        let key = Self::queue_of(pg, req);
        Self::finish(pg, req);
        if let Some(key) = key {
            self.check_disconnect(key);
        }
    }

    fn qpair_event(
        &mut self,
        pg: &mut PollGroup<Command>,
        qp_num: u32,
        _token: u64,
        event: QpairEvent,
    ) {
        match event {
            QpairEvent::Active => {
                if let Some(index) = pg.qpair_index(qp_num) {
                    self.ensure_queue(pg, qp_num, index);
                }
            }
            QpairEvent::Draining(reason) => {
                tracing::debug!(qp_num, ?reason, "qpair draining");
            }
            QpairEvent::Gone { forced } => {
                if let Some(key) = self.by_qp_num.remove(&qp_num) {
                    if let Some(slot) = self.queues.get_mut(key) {
                        slot.gone = true;
                        // The group may give the slot to a new qpair now.
                        if let Some(k) = self.by_qpair.get_mut(slot.qpair_index as usize) {
                            if *k == key {
                                *k = NO_QUEUE;
                            }
                        }
                        if slot.in_flight == 0 {
                            self.queues.remove(key);
                        }
                    }
                }
                tracing::debug!(qp_num, forced, "qpair gone");
            }
        }
    }

    fn aborted(&mut self, pg: &mut PollGroup<Command>, req: ReqId) {
        let Some(r) = pg.request_mut(req) else {
            return;
        };
        match (r.user.pending_tag, r.user.pending_event) {
            // Block I/O still owns the buffers: finish when it completes.
            (Some(_), false) => r.user.orphaned = true,
            (Some(tag), true) => {
                self.pending.try_remove(tag);
                Self::finish(pg, req);
            }
            (None, _) => Self::finish(pg, req),
        }
    }

    fn buffers_ready(&mut self, pg: &mut PollGroup<Command>, req: ReqId) {
        self.have_buffers(pg, req);
    }

    fn poll_side(&mut self, pg: &mut PollGroup<Command>) -> usize {
        // Every pass comes here, idle ones too: with no block I/O in flight there is nothing
        // to reap (the list is empty between passes), so no list is taken or drained.
        if self.io.in_flight() == 0 {
            return 0;
        }
        let mut done = std::mem::take(&mut self.completions);
        let n = self.io.poll(&mut |tag, cqe| done.push((tag, cqe)));
        for (tag, cqe) in done.drain(..) {
            self.complete(pg, tag, cqe);
        }
        self.completions = done;
        n
    }

    fn tick(&mut self, pg: &mut PollGroup<Command>) {
        let mut done = std::mem::take(&mut self.completions);
        // Asynchronous Event Requests answered by an event.
        for (_, slot) in self.queues.iter_mut() {
            if slot.queue.qid() == Some(0) && !slot.gone {
                slot.queue
                    .poll_events(&mut self.io, &mut |tag, cqe| done.push((tag, cqe)));
            }
        }
        // Controllers torn down (keep-alive expiry, admin queue gone) and Disconnect graces.
        let doomed: Vec<usize> = self
            .queues
            .iter()
            .filter(|(_, s)| !s.gone && !s.disconnecting && s.queue.should_disconnect())
            .map(|(key, _)| key)
            .collect();
        for key in doomed {
            self.check_disconnect(key);
        }
        self.expire_unbound();
        for (tag, cqe) in done.drain(..) {
            self.complete(pg, tag, cqe);
        }
        self.completions = done;
        self.serve_aborts(pg);
    }

    fn busy(&self) -> bool {
        self.io.in_flight() > 0 || !self.disconnects.is_empty()
    }

    fn take_disconnect(&mut self) -> Option<u32> {
        self.disconnects.pop()
    }
}
