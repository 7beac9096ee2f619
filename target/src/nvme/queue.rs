//! [`Queue`]: the NVMe side of one qpair, owned by the reactor that owns the qpair. Its life
//! is an explicit state ([`QueueState`]): unbound until a Fabrics Connect binds it to a
//! controller (a new one for an admin queue, an existing one by CNTLID for an I/O queue), then
//! bound, then closed by the controller's teardown or by being dropped. A Fabrics Disconnect
//! closes an admin queue at once; an I/O queue turns `Disconnected` (it executes nothing more)
//! and is closed when dropped, its in-flight I/O ended.
//!
//! This file owns Connect (every check with its status and IPO/IATTR), Property Get/Set,
//! Disconnect and the dispatch to `admin.rs` and `io.rs`. See the module documentation of
//! `nvme` for how the transport calls it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use nvmf_protocol::fabrics::{
    CNTLID_DYNAMIC, CONNECT_DATA_SIZE, ConnectCmd, ConnectData, ConnectInvalidParameter,
    ConnectResponse,
};
use nvmf_protocol::sqe::FLAGS_PSDT_SGL;
use nvmf_protocol::{Cqe, DISCOVERY_NQN, FabricsType, Sqe, Status};

use crate::bdev::{BlockRange, IoBuf};

use super::Exec;
use super::controller::{Controller, IoQueueId};
use super::counters::IoCounters;
use super::io::{NsIo, ReactorIo};
use super::status::*;
use super::subsystem::NsTable;
use super::target::Target;

/// Where a queue is in its life.
#[derive(Clone)]
pub enum QueueState {
    /// Waiting for Fabrics Connect.
    Unbound,
    /// Connected to `controller` as queue `qid`.
    Bound {
        /// The controller.
        controller: Arc<Controller>,
        /// Queue id (0 = admin).
        qid: u16,
        /// SQSIZE + 1.
        depth: u32,
        /// The controller's reset epoch when this queue connected: an I/O queue of an older
        /// epoch was reset away and must go.
        epoch: u32,
    },
    /// The host disconnected this I/O queue (Fabrics Disconnect): it executes nothing more,
    /// and its QID goes back to `controller` when the transport drops the queue, after its
    /// in-flight I/O ended (a new queue of that QID must not overlap it).
    Disconnected {
        controller: Arc<Controller>,
        queue: IoQueueId,
    },
    /// Disconnected; the transport should drop the qpair.
    Closed,
}

/// One qpair's command execution. See the module documentation.
pub struct Queue {
    pub(super) target: Arc<Target>,
    listener: SocketAddr,
    /// Depth the RDMA connection negotiated (an upper bound for SQSIZE + 1).
    transport_depth: u32,
    pub(super) state: QueueState,
    pub(super) sqhd: u16,
    pub(super) counters: Arc<IoCounters>,
    counters_slot: usize,
    /// The namespace table this queue uses, and its generation.
    pub(super) ns: Arc<NsTable>,
    pub(super) ns_generation: u64,
    /// Tags of Asynchronous Event Requests held by the controller, by CID.
    pub(super) aer_tags: Vec<(u16, u64)>,
    /// Tags of Abort commands waiting for the victim's queue to decide, by CID.
    pub(super) abort_tags: Vec<(u16, u64)>,
    /// Deallocate ranges of the current Dataset Management command (capacity kept).
    pub(super) ranges: Vec<BlockRange>,
}

/// FUSE (bits 1:0) and PSDT (bits 7:6) of the flags byte: a command is taken with FUSE 00b
/// (normal) and PSDT 01b (SGLs) only.
const FUSE_BITS: u8 = 0x03;
const PSDT_BITS: u8 = 0xC0;

impl Queue {
    /// A new, unbound queue on the reactor `io` belongs to; `listener` is the local address
    /// the connection came in on, `transport_depth` the depth its RDMA connection negotiated.
    pub fn new(
        target: Arc<Target>,
        io: &mut ReactorIo,
        listener: SocketAddr,
        transport_depth: u32,
    ) -> Queue {
        let counters = Arc::new(IoCounters::default());
        let counters_slot = io.register_queue(counters.clone());
        Queue {
            target,
            listener,
            transport_depth,
            state: QueueState::Unbound,
            sqhd: 0,
            counters,
            counters_slot,
            ns: Arc::new(NsTable::default()),
            ns_generation: u64::MAX,
            aer_tags: Vec::new(),
            abort_tags: Vec::new(),
            ranges: Vec::with_capacity(nvmf_protocol::nvm::DSM_MAX_RANGES),
        }
    }

    /// Where the queue is in its life.
    pub fn state(&self) -> &QueueState {
        &self.state
    }

    /// The controller, once connected (and after a Disconnect, until the queue is dropped).
    pub fn controller(&self) -> Option<&Arc<Controller>> {
        match &self.state {
            QueueState::Bound { controller, .. } | QueueState::Disconnected { controller, .. } => {
                Some(controller)
            }
            _ => None,
        }
    }

    /// Queue id once connected (and after a Disconnect, until the queue is dropped: its
    /// answers still carry it as SQID).
    pub fn qid(&self) -> Option<u16> {
        match &self.state {
            QueueState::Bound { qid, .. } => Some(*qid),
            QueueState::Disconnected { queue, .. } => Some(queue.qid),
            _ => None,
        }
    }

    /// The listener the connection came in on.
    pub fn listener(&self) -> SocketAddr {
        self.listener
    }

    /// This queue's counters.
    pub fn counters(&self) -> &Arc<IoCounters> {
        &self.counters
    }

    /// The transport should disconnect this qpair: it was disconnected by the host, or its
    /// controller was torn down.
    pub fn should_disconnect(&self) -> bool {
        match &self.state {
            QueueState::Closed | QueueState::Disconnected { .. } => true,
            QueueState::Bound {
                controller,
                qid,
                epoch,
                ..
            } => controller.is_defunct() || (*qid != 0 && controller.epoch() != *epoch),
            QueueState::Unbound => false,
        }
    }

    /// Abort commands aimed at this I/O queue: `out(victim cid, abort cid)` for each; the
    /// transport answers each with [`Queue::answer_abort`]. Control path (a timer).
    pub fn take_aborts(&self, out: &mut dyn FnMut(u16, u16)) {
        match &self.state {
            QueueState::Bound {
                controller,
                qid,
                epoch,
                ..
            } if *qid != 0 => controller.take_aborts(
                IoQueueId {
                    qid: *qid,
                    epoch: *epoch,
                },
                out,
            ),
            // Its commands still waiting for buffers may be aborted too.
            QueueState::Disconnected { controller, queue } => controller.take_aborts(*queue, out),
            _ => {}
        }
    }

    /// The transport aborted the victim of Abort `abort_cid` (it had not started), or not.
    pub fn answer_abort(&self, abort_cid: u16, aborted: bool) {
        if let Some(c) = self.controller() {
            c.answer_abort(abort_cid, aborted);
        }
    }

    /// Index of this queue's counters in its reactor's table.
    pub(super) fn counters_slot(&self) -> usize {
        self.counters_slot
    }

    /// Execute one command. `data` holds the command's data (host-to-controller: already
    /// transferred; controller-to-host: to be filled). See the module documentation.
    pub fn execute(
        &mut self,
        io: &mut ReactorIo,
        sqe: &Sqe,
        data: &mut IoBuf<'_, '_>,
        tag: u64,
        now: impl FnOnce() -> Instant,
    ) -> Exec {
        // SQHD advances for every command fetched (0's based SQSIZE wraps it).
        if let QueueState::Bound { depth, .. } = &self.state {
            self.sqhd = ((u32::from(self.sqhd) + 1) % depth.max(&1)) as u16;
        }
        let exec = match self.state.clone() {
            // Fused operations are not supported (FUSES = 0): run apart, a fused Compare and
            // Write would write even when the compare failed. PSDT must say SGL with a
            // contiguous metadata buffer (01b), the only form NVMe over Fabrics defines (as
            // nvmet checks; Linux and SPDK hosts set it on every command).
            // One mask on the flags byte: decoding both fields cost 18 instructions a command.
            _ if sqe.flags & (FUSE_BITS | PSDT_BITS) != FLAGS_PSDT_SGL => {
                Exec::Done(self.error(sqe, INVALID_FIELD))
            }
            QueueState::Unbound => {
                if sqe.is_fabrics() && sqe.fctype() == FabricsType::Connect {
                    self.connect(sqe, data, now())
                } else {
                    // Nothing but Connect before the queue is bound.
                    Exec::Done(self.error(sqe, SEQUENCE_ERROR))
                }
            }
            QueueState::Closed | QueueState::Disconnected { .. } => {
                Exec::Done(self.error(sqe, SEQUENCE_ERROR))
            }
            QueueState::Bound {
                controller,
                qid,
                epoch,
                ..
            } => {
                if qid != 0 && (controller.epoch() != epoch || controller.is_defunct()) {
                    // Its controller was reset or torn down (keep-alive expiry, admin queue
                    // gone): this queue is on its way out, and nothing more of the association
                    // executes (a host that failed over to another path must not see a late
                    // write from this one land after its own).
                    Exec::Done(self.error(sqe, ABORTED_SQ_DELETION))
                } else if sqe.is_fabrics() {
                    // Connect is refused on a bound queue before its data matters.
                    match self.data_length(sqe, data, 0) {
                        Err(cqe) if sqe.fctype() != FabricsType::Connect => Exec::Done(cqe),
                        _ => self.fabrics(io, &controller, qid, sqe),
                    }
                } else if qid == 0 {
                    self.counters.other();
                    self.admin(io, &controller, sqe, data, tag, now)
                } else {
                    self.nvm(io, &controller, sqe, data, tag)
                }
            }
        };
        // The status first: a success (every I/O's) looks at nothing else.
        if let Exec::Done(cqe) = &exec {
            if !cqe.status.is_success() {
                if let Some(c) = self.controller() {
                    self.counters.error();
                    c.record_error(cqe.sqid, cqe.cid, cqe.status, sqe.nsid, sqe.opcode);
                }
            }
        }
        exec
    }

    /// A command of this queue that completed later (its block I/O) ended with `cqe`'s error:
    /// logged as an executed command's error is (its counters were counted at the reap).
    pub fn record_late_error(&self, sqe: &Sqe, cqe: &Cqe) {
        if let Some(c) = self.controller() {
            c.record_error(cqe.sqid, cqe.cid, cqe.status, sqe.nsid, sqe.opcode);
        }
    }

    /// Answer `sqe` with `status` without executing it (the transport found its SGL malformed,
    /// or could not move its data): SQHD advances as for any fetched command and the error
    /// is logged like an executed command's.
    pub fn reject(&mut self, sqe: &Sqe, status: Status) -> Cqe {
        if let QueueState::Bound { depth, .. } = &self.state {
            self.sqhd = ((u32::from(self.sqhd) + 1) % depth.max(&1)) as u16;
        }
        let cqe = self.error(sqe, status);
        if let Some(c) = self.controller() {
            self.counters.error();
            c.record_error(cqe.sqid, cqe.cid, cqe.status, sqe.nsid, sqe.opcode);
        }
        cqe
    }

    /// Outstanding Asynchronous Event Requests answered by an event, and Abort commands
    /// answered by their victim's queue: `out(tag, cqe)`.
    pub fn poll_events(&mut self, io: &mut ReactorIo, out: &mut dyn FnMut(u64, Cqe)) -> usize {
        let Some(c) = self.controller().cloned() else {
            return 0;
        };
        // A shutdown whose I/O queues have all closed: its flushes start here.
        if self.qid() == Some(0) && c.take_shutdown_flush_due() {
            self.shutdown_flush(io, &c);
        }
        let mut n = 0;
        let sqhd = self.sqhd;
        let tags = &mut self.abort_tags;
        c.take_abort_answers(&mut |cid, aborted| {
            if let Some(i) = tags.iter().position(|(c, _)| *c == cid) {
                let (_, tag) = tags.swap_remove(i);
                // DW0 bit 0: 0 = aborted, 1 = not aborted.
                out(tag, Cqe::success(cid, 0, sqhd, u64::from(!aborted)));
                n += 1;
            }
        });
        let tags = &mut self.aer_tags;
        c.take_aer_completions(&mut |cid, dw0| {
            if let Some(i) = tags.iter().position(|(c, _)| *c == cid) {
                let (_, tag) = tags.swap_remove(i);
                out(
                    tag,
                    match dw0 {
                        Some(dw0) => Cqe::success(cid, 0, sqhd, u64::from(dw0)),
                        // A controller reset ended it.
                        None => Cqe::error(cid, 0, sqhd, ABORTED_SQ_DELETION),
                    },
                );
                n += 1;
            }
        });
        n
    }

    pub(super) fn sqid(&self) -> u16 {
        self.qid().unwrap_or(0)
    }

    /// The host's buffer must be exactly the `expected` bytes the command moves: SGLS bit 18
    /// (a buffer longer than the data) is not advertised, as in nvmet, and what a command did
    /// not write of a controller-to-host buffer would reach the host as the pool buffer last
    /// held it (another host's data).
    #[inline(always)]
    pub(super) fn data_length(
        &self,
        sqe: &Sqe,
        data: &IoBuf<'_, '_>,
        expected: u64,
    ) -> Result<(), Cqe> {
        if data.len() as u64 == expected {
            Ok(())
        } else {
            Err(self.sgl_length_invalid(sqe))
        }
    }

    /// Kept out of the I/O path (`data_length`'s refusal).
    #[cold]
    #[inline(never)]
    fn sgl_length_invalid(&self, sqe: &Sqe) -> Cqe {
        self.error(sqe, SGL_LENGTH_INVALID)
    }

    /// A failed completion of `sqe` on this queue.
    pub(super) fn error(&self, sqe: &Sqe, status: Status) -> Cqe {
        Cqe::error(sqe.cid, self.sqid(), self.sqhd, status)
    }

    /// A successful completion with `result`.
    pub(super) fn success(&self, sqe: &Sqe, result: u64) -> Cqe {
        Cqe::success(sqe.cid, self.sqid(), self.sqhd, result)
    }

    fn connect_error(
        &self,
        sqe: &Sqe,
        status: Status,
        ipo: Option<ConnectInvalidParameter>,
    ) -> Exec {
        let mut cqe = self.error(sqe, status);
        if let Some(p) = ipo {
            cqe.dw0 = p.to_dw0();
        }
        tracing::info!(cid = sqe.cid, status = ?status.code, ?ipo, "connect refused");
        Exec::Done(cqe)
    }

    fn invalid(&self, sqe: &Sqe, p: ConnectInvalidParameter) -> Exec {
        self.connect_error(sqe, CONNECT_INVALID_PARAMETERS, Some(p))
    }

    /// Fabrics Connect.
    fn connect(&mut self, sqe: &Sqe, data: &mut IoBuf<'_, '_>, now: Instant) -> Exec {
        let Ok(cmd) = ConnectCmd::from_sqe(sqe) else {
            return Exec::Done(self.error(sqe, INVALID_FIELD));
        };
        if cmd.recfmt != 0 {
            return self.connect_error(sqe, CONNECT_INCOMPATIBLE_FORMAT, None);
        }
        if let Err(cqe) = self.data_length(sqe, data, CONNECT_DATA_SIZE as u64) {
            return Exec::Done(cqe);
        }
        let mut raw = [0u8; CONNECT_DATA_SIZE];
        data.read_at(0, &mut raw);
        let Ok(cd) = ConnectData::decode(&raw) else {
            return self.invalid(sqe, ConnectInvalidParameter::SUBNQN);
        };
        let Ok(subnqn) = cd.subnqn() else {
            return self.invalid(sqe, ConnectInvalidParameter::SUBNQN);
        };
        let Ok(hostnqn) = cd.hostnqn() else {
            return self.invalid(sqe, ConnectInvalidParameter::HOSTNQN);
        };
        let (subnqn, hostnqn) = (subnqn.as_str().to_owned(), hostnqn.as_str().to_owned());
        let discovery = subnqn == DISCOVERY_NQN;
        let subsystem = if discovery {
            None
        } else {
            match self.target.subsystem(&subnqn) {
                Some(s) => Some(s),
                None => return self.invalid(sqe, ConnectInvalidParameter::SUBNQN),
            }
        };
        if let Some(s) = &subsystem {
            if !s.allows(&hostnqn) {
                return self.connect_error(sqe, CONNECT_INVALID_HOST, None);
            }
            if !s.listen.contains(&self.listener) {
                // Not exposed where the host connected: as if it did not exist here.
                return self.invalid(sqe, ConnectInvalidParameter::SUBNQN);
            }
        }
        let limits = self.target.limits().clone();
        let depth = cmd.queue_depth();
        let max_depth = if cmd.qid == 0 {
            limits.max_aq_depth
        } else {
            limits.max_queue_depth
        };
        // SQSIZE is 0's based and must be at least 1.
        if cmd.sqsize == 0 || depth > max_depth || depth > self.transport_depth {
            return self.invalid(sqe, ConnectInvalidParameter::SQSIZE);
        }
        let (controller, epoch) = if cmd.qid == 0 {
            if cd.cntlid != CNTLID_DYNAMIC {
                // Only the dynamic controller model.
                return self.invalid(sqe, ConnectInvalidParameter::CNTLID);
            }
            let Some(c) = self
                .target
                .create_controller(subsystem, &hostnqn, cd.hostid, cmd.kato, now)
            else {
                return self.connect_error(sqe, CONNECT_CONTROLLER_BUSY, None);
            };
            tracing::info!(cntlid = c.cntlid, subsystem = %subnqn, host = %hostnqn, kato_ms = cmd.kato, "controller created");
            let epoch = c.epoch();
            (c, epoch)
        } else {
            if discovery {
                return self.invalid(sqe, ConnectInvalidParameter::QID);
            }
            let Some(c) = self.target.controller(cd.cntlid) else {
                return self.invalid(sqe, ConnectInvalidParameter::CNTLID);
            };
            if c.subnqn() != subnqn {
                return self.invalid(sqe, ConnectInvalidParameter::SUBNQN);
            }
            // The controller belongs to the host that created it.
            if c.hostnqn != hostnqn || c.hostid != cd.hostid {
                return self.invalid(sqe, ConnectInvalidParameter::HOSTNQN);
            }
            {
                let mut s = c.state();
                // Torn down since the lookup (its admin queue went, or keep-alive expired).
                if c.is_defunct() {
                    drop(s);
                    return self.invalid(sqe, ConnectInvalidParameter::CNTLID);
                }
                // Not before the controller is enabled, nor after a shutdown notification.
                if !s.accepts_commands() {
                    drop(s);
                    return self.connect_error(sqe, SEQUENCE_ERROR, None);
                }
                let granted = s.io_queues_granted.unwrap_or(limits.max_io_queues);
                // Read under the state lock, which a reset holds while it moves the epoch on.
                let epoch = c.epoch();
                if cmd.qid > granted || s.io_queue_taken(cmd.qid, epoch) {
                    drop(s);
                    return self.invalid(sqe, ConnectInvalidParameter::QID);
                }
                s.io_queues.push(IoQueueId {
                    qid: cmd.qid,
                    epoch,
                });
                drop(s);
                (c, epoch)
            }
        };
        controller.add_counters(self.counters.clone());
        self.state = QueueState::Bound {
            epoch,
            controller: controller.clone(),
            qid: cmd.qid,
            depth,
        };
        self.sqhd = 1 % depth as u16;
        let dw0 = ConnectResponse {
            cntlid: controller.cntlid,
            authreq: 0,
        }
        .to_dw0();
        Exec::Done(self.success(sqe, u64::from(dw0)))
    }

    /// Property Get / Set / Disconnect once bound.
    fn fabrics(
        &mut self,
        io: &mut ReactorIo,
        controller: &Arc<Controller>,
        qid: u16,
        sqe: &Sqe,
    ) -> Exec {
        let limits = self.target.limits().clone();
        match sqe.fctype() {
            FabricsType::PropertyGet if qid == 0 => {
                let Ok(cmd) = sqe.as_property_get() else {
                    return Exec::Done(self.error(sqe, INVALID_FIELD));
                };
                let size = cmd.size.bytes().unwrap_or(0);
                Exec::Done(match controller.property_get(cmd.offset, size, &limits) {
                    Ok(v) => self.success(sqe, v),
                    Err(s) => self.error(sqe, s),
                })
            }
            FabricsType::PropertySet if qid == 0 => {
                let Ok(cmd) = sqe.as_property_set() else {
                    return Exec::Done(self.error(sqe, INVALID_FIELD));
                };
                let size = cmd.size.bytes().unwrap_or(0);
                Exec::Done(match controller.property_set(cmd.offset, size, cmd.value) {
                    Ok(shutdown) => {
                        if shutdown {
                            self.shutdown_flush(io, controller);
                        }
                        self.success(sqe, 0)
                    }
                    Err(s) => self.error(sqe, s),
                })
            }
            FabricsType::PropertyGet | FabricsType::PropertySet => {
                Exec::Done(self.error(sqe, INVALID_QUEUE_TYPE))
            }
            FabricsType::Disconnect => {
                let cqe = self.success(sqe, 0);
                self.disconnect();
                Exec::Done(cqe)
            }
            FabricsType::Connect => Exec::Done(self.error(sqe, SEQUENCE_ERROR)),
            _ => Exec::Done(self.error(sqe, INVALID_OPCODE)),
        }
    }

    /// CC.SHN was set: flush every namespace's device with a volatile cache; CSTS.SHST turns
    /// Complete when the last flush completes (reaped by `ReactorIo::poll`).
    fn shutdown_flush(&mut self, io: &mut ReactorIo, controller: &Arc<Controller>) {
        self.namespace(controller, 0);
        let mut bdevs: Vec<usize> = self
            .ns
            .active()
            .filter(|n| n.info.volatile_cache)
            .map(|n| n.bdev_index)
            .collect();
        bdevs.sort_unstable();
        bdevs.dedup();
        let queued = bdevs
            .into_iter()
            .filter(|b| io.flush_for_shutdown(*b, controller))
            .count();
        controller.shutdown_flushes(queued);
    }

    /// Fabrics Disconnect: an admin queue tears the controller down at once (its I/O queues
    /// then disconnect); an I/O queue stops executing and keeps its QID until it is dropped.
    fn disconnect(&mut self) {
        match std::mem::replace(&mut self.state, QueueState::Closed) {
            QueueState::Bound {
                controller,
                qid,
                epoch,
                ..
            } if qid != 0 => {
                self.state = QueueState::Disconnected {
                    controller,
                    queue: IoQueueId { qid, epoch },
                };
            }
            other => {
                self.state = other;
                self.close();
            }
        }
    }

    /// Leave the controller (the queue is dropped, its in-flight I/O ended, or an admin queue
    /// got a Disconnect): an I/O queue frees its queue id, an admin queue tears the controller
    /// down (its I/O queues then disconnect).
    pub fn close(&mut self) {
        match std::mem::replace(&mut self.state, QueueState::Closed) {
            QueueState::Bound {
                controller, qid: 0, ..
            } => {
                self.target
                    .remove_controller(controller.cntlid, "admin queue disconnected");
            }
            QueueState::Bound {
                controller,
                qid,
                epoch,
                ..
            } => controller.io_queue_closed(IoQueueId { qid, epoch }, &self.counters),
            QueueState::Disconnected { controller, queue } => {
                controller.io_queue_closed(queue, &self.counters);
            }
            QueueState::Unbound | QueueState::Closed => {}
        }
    }

    /// Refresh the namespace snapshot if the subsystem changed; the namespace `nsid` for I/O.
    pub(super) fn namespace(&mut self, controller: &Controller, nsid: u32) -> Option<NsIo> {
        let sub = controller.subsystem.as_ref()?;
        // One relaxed-cost load per I/O; the lock is taken only after a change.
        if sub.generation() != self.ns_generation {
            let (table, generation) = sub.namespaces();
            self.ns = table;
            self.ns_generation = generation;
        }
        self.ns.get(nsid).map(|ns| NsIo {
            bdev_index: ns.bdev_index,
            block_size: ns.info.block_size,
            num_blocks: ns.info.num_blocks,
        })
    }
}

impl Drop for Queue {
    fn drop(&mut self) {
        self.close();
    }
}
