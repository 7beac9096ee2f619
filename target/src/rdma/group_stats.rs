//! [`GroupSnapshot`]: what one poll group holds and has counted, copied out on its own reactor
//! (through [`super::RdmaTransport::each_group`], a control-path message) for the statistics.
//! Plain data, serialisable: the daemon writes it into its stats file.

use nvmf_transport::pollgroup::PollGroup;
use serde::Serialize;

use super::group_poller::GroupInfo;

/// One poll group's figures at one moment.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct GroupSnapshot {
    /// Index of the device in the transport's configuration.
    pub device: usize,
    /// The device's name (`rxe0`, a soft device's name).
    pub device_name: String,
    /// Index of the reactor.
    pub reactor: usize,
    /// The group's completion queue: its number on the device (as `rdma res show cq` names
    /// it; the soft provider's faults take it).
    pub cq: u32,
    /// Qpairs in the group (connecting, active or draining).
    pub qpairs: usize,
    pub recv_slots: RecvSlots,
    pub requests: Requests,
    pub data_buffers: DataBuffers,
    pub counters: GroupCounters,
    /// Why the group failed (its CQ did), if it has: it then serves nothing.
    pub failed: Option<String>,
}

/// Receive slots (capsule buffers) of the group's SRQ, by state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RecvSlots {
    /// Slots the group owns (`srq_depth`).
    pub total: u32,
    /// Posted on the SRQ, ready for a capsule.
    pub posted: u32,
    /// Kept off the SRQ: the group posts what its qpairs' hosts may send (their queue depths)
    /// and a margin, so the posted slots stay warm in cache.
    pub spare: u32,
    /// Back from a capsule, waiting to be re-posted at the end of a poll.
    pub queued: u32,
    /// Holding a capsule: its request has not released it yet (an in-capsule write keeps it
    /// until its block I/O is done), or it waits for a request object. With no qpair left this must be 0 (else slots leaked).
    pub held: u32,
}

/// Request objects: queue occupancy and what waits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Requests {
    /// Request objects in use (commands between capsule and finish, aborted ones included).
    pub in_use: usize,
    /// Request objects the group has (`max_requests`).
    pub total: u32,
    /// Requests waiting for data buffers.
    pub waiting_buffers: u32,
    /// Requests whose chain waits for send-queue room or RDMA READ depth on their qpair.
    pub waiting_to_post: u32,
    /// Capsules waiting for a free request object.
    pub capsules_waiting: u32,
}

/// Data buffers (io_unit_size each).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct DataBuffers {
    pub total: u32,
    pub free: u32,
}

/// The group's counters since it started: traffic, waits, and the errors it keeps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct GroupCounters {
    /// Completions reaped from the CQ (capsules' receives and the send side's own).
    pub completions: u64,
    pub capsules: u64,
    /// Lone responses sent without a completion of their own, and the zero-length RDMA
    /// WRITEs that retired such responses when the group went quiet (`silent_answers`).
    pub silent_answers: u64,
    pub silent_flushes: u64,
    pub qpairs_added: u64,
    pub qpairs_gone: u64,
    /// Capsules that waited for a request object; requests that waited for buffers; posts
    /// that stopped for send-queue or READ room.
    pub queued_for_request: u64,
    pub buffer_waits: u64,
    pub post_stalls: u64,
    /// Requests aborted because their qpair went.
    pub requests_aborted: u64,
    /// Error completions (flushes included).
    pub error_completions: u64,
    /// Receive completions for a qpair already gone (slot re-posted), or for a draining one.
    pub orphans: u64,
    pub discarded: u64,
    /// Hosts that sent more commands than their queue depth (disconnected).
    pub overruns: u64,
    /// Completions dropped: stale generation, opcode not fitting the kind, receive for a slot
    /// that was not posted. Each is a bug somewhere if it grows.
    pub stale_completions: u64,
    pub kind_mismatches: u64,
    pub recv_slot_errors: u64,
    /// LAST_WQE_REACHED for a qpair neither draining nor in error (ignored).
    pub last_wqe_ignored: u64,
    /// Drains forced by the drain timeout.
    pub drained_timeout: u64,
}

impl GroupSnapshot {
    /// The figures of `pg`, the group `info` names. Control path (walks the qpairs).
    pub fn of<R>(info: GroupInfo, pg: &PollGroup<R>) -> GroupSnapshot {
        let cfg = pg.config();
        let (posted, queued, held) = pg.recv_accounting();
        let waiting = pg.waiting();
        let s = pg.stats();
        GroupSnapshot {
            device: info.device,
            device_name: pg.context().name().to_owned(),
            reactor: info.reactor,
            cq: pg.cq().id(),
            qpairs: pg.qpair_count(),
            recv_slots: RecvSlots {
                total: cfg.srq_depth,
                posted,
                spare: cfg.srq_depth - posted - queued - held,
                queued,
                held,
            },
            requests: Requests {
                in_use: pg.requests_in_use(),
                total: cfg.max_requests,
                waiting_buffers: waiting.buffers,
                waiting_to_post: waiting.to_post,
                capsules_waiting: waiting.capsules,
            },
            data_buffers: DataBuffers {
                total: cfg.data_buffers,
                free: pg.buffers_free(),
            },
            counters: GroupCounters {
                completions: s.completions,
                capsules: s.capsules,
                silent_answers: s.silent_lone,
                silent_flushes: s.silent_flushes,
                qpairs_added: s.qpairs_added,
                qpairs_gone: s.qpairs_gone,
                queued_for_request: s.queued_for_request,
                buffer_waits: s.buffer_waits,
                post_stalls: s.post_stalls,
                requests_aborted: s.requests_aborted,
                error_completions: s.error_completions,
                orphans: s.orphans,
                discarded: s.discarded,
                overruns: s.overruns,
                stale_completions: s.stale_completions,
                kind_mismatches: s.kind_mismatches,
                recv_slot_errors: s.recv_slot_errors,
                last_wqe_ignored: s.last_wqe_ignored,
                drained_timeout: s.drained_timeout,
            },
            failed: pg.failed().map(str::to_owned),
        }
    }
}
