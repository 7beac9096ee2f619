//! A controller: the state one host's association with a subsystem (or with the discovery
//! service) holds, shared by its admin queue and its I/O queues, which may live on different
//! reactors.
//!
//! Everything here is control path: properties, features, the keep-alive timer, asynchronous
//! events, the error log, and the list of its queues' counters. It sits behind one mutex that
//! the I/O fast path never takes (I/O queues only read the immutable fields and an atomic
//! `defunct` flag). Outstanding Asynchronous Event Requests wait here; the admin queue's
//! reactor collects them once the `aer_ready` flag says an event arrived.
//!
//! A controller reset (CC.EN 1 -> 0 on a live controller) keeps the admin queue and the
//! association: the `epoch` counter grows, so every I/O queue bound under the old epoch sees
//! that it must go (the transport disconnects it, its outstanding commands end with it), and
//! outstanding AERs are answered as aborted. CSTS.RDY reads 1 until the last of those I/O
//! queues has closed, then 0; the host may then enable again and connect new I/O queues.
//!
//! A shutdown (CC.SHN) ends the association's I/O the same way, as SPDK does: the I/O queues
//! still connected go (a new epoch; Linux has torn its down already), the namespaces are
//! flushed once the last of them has closed, so that the flush covers every write they
//! completed, and CSTS.SHST turns Complete when the flushes have. From the notification on,
//! only Fabrics commands execute and no I/O queue connects, until a controller reset (as in
//! nvmet, where a shutdown drops CSTS.RDY). Enabling the controller again abandons a shutdown
//! still under way: its flushes still count down, and a later shutdown waits for them too.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use nvmf_protocol::admin::{AsyncEvent, AsyncEventType, notice};
use nvmf_protocol::features::{Arbitration, AsyncEventConfig, PowerManagement};
use nvmf_protocol::log::{ErrorLogEntry, LogId, SmartLog};
use nvmf_protocol::properties::{
    Cap, Cc, Csts, PropertyOffset, ShutdownNotification, ShutdownStatus, Vs,
};
use nvmf_protocol::status::MediaStatus;
use nvmf_protocol::{Status, StatusCode};

use super::counters::{IoCounters, IoSnapshot};
use super::status::INVALID_FIELD;
use super::subsystem::Subsystem;
use super::target::Limits;

/// Asynchronous Event Request Limit (AERL, 0's based): 4 outstanding.
pub const AERL: u8 = 3;
/// Abort Command Limit (ACL, 0's based): 4 Abort commands outstanding.
pub const ACL: u8 = 3;
/// Error log entries kept (ELPE, 0's based, is this minus one).
pub const ERROR_LOG_ENTRIES: usize = 16;
/// Changed Namespace List entries kept before it reports overflow.
const CHANGED_NS_MAX: usize = 1024;

/// An Abort command on its way to the queue holding its victim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AbortRequest {
    /// The victim's queue (its QID under the epoch the Abort arrived in) and CID.
    pub queue: IoQueueId,
    pub cid: u16,
    /// The Abort command's own CID (on the admin queue).
    pub abort_cid: u16,
}

/// More Asynchronous Event Requests than AERL + 1 outstanding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AerLimitExceeded;

/// A connected I/O queue: its id, and the epoch it connected under. After a reset a queue of
/// the old epoch may still be closing while the host connects the same QID again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IoQueueId {
    pub qid: u16,
    pub epoch: u32,
}

/// Where a shutdown (CC.SHN) is. See the module documentation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShutdownPhase {
    /// None under way.
    Idle,
    /// I/O queues were connected at the notification: they are going, and the flushes wait
    /// for the last of them to close (its in-flight I/O ended).
    WaitingForQueues,
    /// The last I/O queue closed: the admin queue's reactor starts the flushes.
    FlushDue,
    /// Its namespace flushes are in flight (`State::shutdown_flushes`).
    Flushing,
}

/// One controller. See the module documentation.
pub struct Controller {
    /// Controller id.
    pub cntlid: u16,
    /// The subsystem; `None` for a discovery controller.
    pub subsystem: Option<Arc<Subsystem>>,
    /// Host NQN of the association.
    pub hostnqn: String,
    /// Host identifier of the association.
    pub hostid: [u8; 16],
    defunct: AtomicBool,
    aer_ready: AtomicBool,
    /// Controller resets so far: I/O queues bound under an older epoch must go.
    epoch: AtomicU32,
    /// Volatile Write Cache enable (Set Features 06h): off, every write is forced unit
    /// access. An atomic: each write of every I/O queue reads it.
    write_cache: AtomicBool,
    /// Abort requests wait in `State::aborts` for the reactors owning their queues.
    aborts_pending: AtomicBool,
    /// Answers wait in `State::abort_answers` for the admin queue.
    aborts_answered: AtomicBool,
    /// A shutdown's flushes wait for the admin queue's reactor (`ShutdownPhase::FlushDue`).
    shutdown_flush_due: AtomicBool,
    state: Mutex<State>,
}

/// The mutable part (see [`Controller::state`]).
pub struct State {
    /// CC as last set.
    pub cc: Cc,
    /// CSTS as the host reads it.
    pub csts: Csts,
    /// Keep Alive Timeout in ms (0 = disabled).
    pub kato_ms: u32,
    /// Last Keep Alive (or connect).
    pub last_keep_alive: Instant,
    /// I/O queues granted by Set Features Number of Queues (count, not 0's based).
    pub io_queues_granted: Option<u16>,
    /// Connected I/O queues, the closing ones of older epochs included (a QID counts as taken
    /// only under the current epoch: [`State::io_queue_taken`]).
    pub io_queues: Vec<IoQueueId>,
    /// Asynchronous Event Configuration.
    pub aec: AsyncEventConfig,
    /// Arbitration (stored, not enforced: fabrics queues are served round robin).
    pub arbitration: Arbitration,
    /// Power Management (only state 0 exists).
    pub power: PowerManagement,
    /// CIDs of outstanding Asynchronous Event Requests, oldest first.
    pub aer_cids: VecDeque<u16>,
    /// CIDs of AERs a controller reset aborted, to be answered by the admin queue.
    pub aer_aborted: Vec<u16>,
    /// CC.EN went 1 -> 0 while I/O queues were connected: CSTS.RDY drops when the last closes.
    pub resetting: bool,
    /// Abort commands waiting for the reactor of their victim's queue.
    pub aborts: Vec<AbortRequest>,
    /// Abort commands answered, for the admin queue: (the Abort's CID, whether it aborted).
    pub abort_answers: Vec<(u16, bool)>,
    /// Events waiting for an AER.
    pub events: VecDeque<AsyncEvent>,
    /// A namespace notice was reported and the host has not read log 0x04 yet.
    pub ns_notice_masked: bool,
    /// Changed Namespace List (since last read).
    pub changed_ns: Vec<u32>,
    /// More than [`CHANGED_NS_MAX`] changed.
    pub changed_overflow: bool,
    /// Counters of this controller's open queues.
    pub counters: Vec<Arc<IoCounters>>,
    /// What the closed I/O queues counted (nothing in flight).
    pub closed_queues: IoSnapshot,
    /// Most recent errors, newest first.
    pub errors: VecDeque<ErrorLogEntry>,
    /// Errors ever logged.
    pub error_count: u64,
    /// Of them, unrecovered data integrity errors (Unrecovered Read Error, Write Fault): the
    /// SMART log's Media and Data Integrity Errors.
    pub media_errors: u64,
    /// The shutdown under way, if any.
    pub shutdown: ShutdownPhase,
    /// Shutdown flushes in flight, an abandoned shutdown's included (each completion counts
    /// down once, whatever has happened since it started).
    pub shutdown_flushes: usize,
}

impl State {
    /// Whether I/O queue `qid` is connected under `epoch` (the controller's current one).
    pub fn io_queue_taken(&self, qid: u16, epoch: u32) -> bool {
        self.io_queues.contains(&IoQueueId { qid, epoch })
    }

    /// Whether any I/O queue is connected under `epoch`.
    pub fn io_queues_under(&self, epoch: u32) -> bool {
        self.io_queues.iter().any(|q| q.epoch == epoch)
    }

    /// Enabled, ready, and no shutdown notified since: what commands other than Fabrics
    /// commands, and the Connect of an I/O queue, need.
    pub fn accepts_commands(&self) -> bool {
        self.cc.en
            && self.csts.rdy
            && self.cc.shn == ShutdownNotification::None
            && self.csts.shst == ShutdownStatus::Normal
    }

    /// The shutdown's last step is done: SHST Complete, unless the host withdrew the
    /// notification meanwhile (then it reads Normal again, as in nvmet).
    fn shutdown_done(&mut self) {
        self.shutdown = ShutdownPhase::Idle;
        self.csts.shst = if self.cc.shn == ShutdownNotification::None {
            ShutdownStatus::Normal
        } else {
            ShutdownStatus::Complete
        };
    }
}

impl Controller {
    /// A new controller, disabled (CC.EN = 0), keep-alive timer started at `now`.
    pub fn new(
        cntlid: u16,
        subsystem: Option<Arc<Subsystem>>,
        hostnqn: &str,
        hostid: [u8; 16],
        kato_ms: u32,
        now: Instant,
    ) -> Controller {
        Controller {
            cntlid,
            subsystem,
            hostnqn: hostnqn.to_owned(),
            hostid,
            defunct: AtomicBool::new(false),
            aer_ready: AtomicBool::new(false),
            epoch: AtomicU32::new(0),
            write_cache: AtomicBool::new(true),
            aborts_pending: AtomicBool::new(false),
            aborts_answered: AtomicBool::new(false),
            shutdown_flush_due: AtomicBool::new(false),
            state: Mutex::new(State {
                cc: Cc::default(),
                csts: Csts::default(),
                kato_ms,
                last_keep_alive: now,
                io_queues_granted: None,
                io_queues: Vec::new(),
                aec: AsyncEventConfig::default(),
                arbitration: Arbitration::default(),
                power: PowerManagement::default(),
                aer_cids: VecDeque::new(),
                aer_aborted: Vec::new(),
                resetting: false,
                aborts: Vec::new(),
                abort_answers: Vec::new(),
                events: VecDeque::new(),
                ns_notice_masked: false,
                changed_ns: Vec::new(),
                changed_overflow: false,
                counters: Vec::new(),
                closed_queues: IoSnapshot::default(),
                errors: VecDeque::new(),
                error_count: 0,
                media_errors: 0,
                shutdown: ShutdownPhase::Idle,
                shutdown_flushes: 0,
            }),
        }
    }

    /// A discovery controller.
    pub fn is_discovery(&self) -> bool {
        self.subsystem.is_none()
    }

    /// The subsystem NQN (the discovery NQN for a discovery controller).
    pub fn subnqn(&self) -> &str {
        self.subsystem
            .as_ref()
            .map_or(nvmf_protocol::DISCOVERY_NQN, |s| s.nqn.as_str())
    }

    /// The mutable state (control path only).
    pub fn state(&self) -> MutexGuard<'_, State> {
        // State is updated field by field with no cross-field invariant a panic could break.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Torn down (keep-alive expiry or the admin queue left): queues should disconnect.
    pub fn is_defunct(&self) -> bool {
        self.defunct.load(Ordering::Acquire)
    }

    /// Mark torn down. Under the state lock, which an I/O queue's Connect holds while it
    /// checks and joins: it either sees this or joined before (and its queue then sees it).
    pub fn set_defunct(&self) {
        let _state = self.state();
        self.defunct.store(true, Ordering::Release);
    }

    /// Ready (CC.EN = 1 and CSTS.RDY = 1) and not shut down ([`State::accepts_commands`]).
    pub fn is_ready(&self) -> bool {
        self.state().accepts_commands()
    }

    /// Controller resets so far (an I/O queue bound under another value must go). One
    /// atomic load: the I/O path reads it.
    pub fn epoch(&self) -> u32 {
        self.epoch.load(Ordering::Acquire)
    }

    /// Whether the volatile write cache is enabled (writes may complete before they are
    /// durable; a Flush makes them so).
    pub fn write_cache_enabled(&self) -> bool {
        self.write_cache.load(Ordering::Acquire)
    }

    /// Set Features Volatile Write Cache. Release: a write the host sends after this command's
    /// answer, on any reactor, sees it (a plain store and load on x86).
    pub fn set_write_cache(&self, enabled: bool) {
        self.write_cache.store(enabled, Ordering::Release);
    }

    /// I/O queue `queue`, counting into `counters`, closed (nothing of it in flight any more):
    /// its id is free again; the last one to close after a reset completes the reset
    /// (CSTS.RDY = 0). Its counters go into the closed queues' total: kept per queue, a host
    /// connecting and disconnecting I/O queues in a loop grew the list (and its reactor's
    /// table, which keeps what the controller holds) for the controller's life.
    pub fn io_queue_closed(&self, queue: IoQueueId, counters: &Arc<IoCounters>) {
        let mut s = self.state();
        s.io_queues.retain(|q| *q != queue);
        if let Some(i) = s.counters.iter().position(|c| Arc::ptr_eq(c, counters)) {
            let mut gone = s.counters.swap_remove(i).snapshot();
            // What it had in flight ends with it (its reactor still counts the completions).
            gone.in_flight = 0;
            s.closed_queues += gone;
        }
        // Aborts its reactor had not taken yet: nothing of that queue is left to abort.
        let mut answered = false;
        let mut i = 0;
        while i < s.aborts.len() {
            if s.aborts[i].queue == queue {
                let a = s.aborts.swap_remove(i);
                s.abort_answers.push((a.abort_cid, false));
                answered = true;
            } else {
                i += 1;
            }
        }
        if answered {
            self.aborts_answered.store(true, Ordering::Release);
        }
        if s.resetting && s.io_queues.is_empty() {
            s.resetting = false;
            s.csts.rdy = false;
        }
        if s.shutdown == ShutdownPhase::WaitingForQueues && s.io_queues.is_empty() {
            s.shutdown = ShutdownPhase::FlushDue;
            self.shutdown_flush_due.store(true, Ordering::Release);
        }
    }

    /// The keep-alive timer expired at `now` (KATO 0 never expires). The timer stops once the
    /// host has notified a shutdown (CC.SHN): from then on a host sends no Keep Alive (Linux
    /// does not), and a shutdown flush longer than what was left of KATO must not cost the
    /// host its controller while it waits for CSTS.SHST (as SPDK stops its timer there).
    pub fn expired(&self, now: Instant) -> bool {
        let s = self.state();
        s.kato_ms != 0
            && s.cc.shn == ShutdownNotification::None
            && now.saturating_duration_since(s.last_keep_alive)
                > Duration::from_millis(u64::from(s.kato_ms))
    }

    /// Restart the keep-alive timer.
    pub fn keep_alive(&self, now: Instant) {
        self.state().last_keep_alive = now;
    }

    /// Register a queue's counters.
    pub fn add_counters(&self, c: Arc<IoCounters>) {
        self.state().counters.push(c);
    }

    /// Sum of the queues' counters, closed queues' included.
    pub fn io_totals(&self) -> IoSnapshot {
        let s = self.state();
        let mut sum = s.closed_queues;
        for c in &s.counters {
            sum += c.snapshot();
        }
        sum
    }

    /// Property Get: the value, or Invalid Field for an unknown offset or a wrong size.
    pub fn property_get(
        &self,
        offset: PropertyOffset,
        size: usize,
        limits: &Limits,
    ) -> Result<u64, Status> {
        if offset.width() != Some(size) {
            return Err(INVALID_FIELD);
        }
        let s = self.state();
        Ok(match offset {
            PropertyOffset::Cap => cap(limits).to_u64(),
            PropertyOffset::Vs => u64::from(Vs::V1_3.to_u32()),
            PropertyOffset::Cc => u64::from(s.cc.to_u32()),
            PropertyOffset::Csts => u64::from(s.csts.to_u32()),
            _ => return Err(INVALID_FIELD),
        })
    }

    /// Property Set: only CC is writable. Enabling with I/O queue entry sizes other than 64 /
    /// 16 bytes, or a command set, page size or arbitration CAP does not offer, sets CSTS.CFS
    /// (as a PCIe controller would, and nvmet) instead of RDY. Ok(true) when a shutdown began
    /// with no I/O queue connected (CSTS.SHST = Occurring): the caller flushes the namespaces
    /// now and reports how many flushes are in flight with [`Controller::shutdown_flushes`].
    /// With I/O queues connected the flush waits for them to go (module documentation).
    pub fn property_set(
        &self,
        offset: PropertyOffset,
        size: usize,
        value: u64,
    ) -> Result<bool, Status> {
        if offset != PropertyOffset::Cc || offset.width() != Some(size) {
            return Err(INVALID_FIELD);
        }
        let cc = Cc::from_u32(value as u32);
        let mut s = self.state();
        let was = s.cc;
        s.cc = cc;
        if cc.en && !was.en {
            // What CAP allows: the NVM command set, 4 KiB pages (MPSMIN = MPSMAX = 0), round
            // robin arbitration; entries of 64 and 16 bytes (an I/O controller's). Anything
            // else is a fatal status, as nvmet answers it.
            let sizes_ok = self.is_discovery() || (cc.iosqes == 6 && cc.iocqes == 4);
            let valid = sizes_ok && cc.css == 0 && cc.mps == 0 && cc.ams == 0;
            // A reset still waiting for its old I/O queues is over: they go anyway (epoch).
            s.resetting = false;
            // So is a shutdown the reset interrupted: what it waited for no longer matters to
            // the enabled controller (its flushes still count down in `shutdown_flushes`).
            s.shutdown = ShutdownPhase::Idle;
            self.shutdown_flush_due.store(false, Ordering::Release);
            if valid {
                s.csts.rdy = true;
                s.csts.shst = ShutdownStatus::Normal;
            } else {
                s.csts.cfs = true;
            }
        } else if !cc.en && was.en {
            // Controller reset: I/O queues go (a new epoch), outstanding AERs end, and the
            // controller is not ready once its I/O queues have closed.
            self.epoch.fetch_add(1, Ordering::AcqRel);
            s.csts.cfs = false;
            if s.io_queues.is_empty() {
                s.csts.rdy = false;
            } else {
                s.resetting = true;
            }
            let aborted: Vec<u16> = s.aer_cids.drain(..).collect();
            if !aborted.is_empty() {
                s.aer_aborted.extend(aborted);
                self.aer_ready.store(true, Ordering::Release);
            }
            s.events.clear();
            // The notice those events may have held back is re-armed with them: else a later
            // namespace change stays unreported until the host happens to read log 04h.
            s.ns_notice_masked = false;
            // The host asks for its queues again after a reset.
            s.io_queues_granted = None;
        }
        let notified =
            cc.shn != ShutdownNotification::None && was.shn == ShutdownNotification::None;
        // A notification while a shutdown is under way (no reset since) joins it: its flushes
        // are counted once, and it completes both.
        if !notified || s.shutdown != ShutdownPhase::Idle {
            return Ok(false);
        }
        s.csts.shst = ShutdownStatus::Occurring;
        if s.io_queues.is_empty() {
            return Ok(true);
        }
        // The I/O queues go first, as in a reset, and the flush follows the last of them.
        self.epoch.fetch_add(1, Ordering::AcqRel);
        s.shutdown = ShutdownPhase::WaitingForQueues;
        Ok(false)
    }

    /// The admin queue's reactor: whether a shutdown's flushes are due now (the I/O queues
    /// it waited for have closed). One atomic load when none is.
    pub fn take_shutdown_flush_due(&self) -> bool {
        self.shutdown_flush_due.load(Ordering::Acquire)
            && self.shutdown_flush_due.swap(false, Ordering::AcqRel)
    }

    /// The shutdown started `n` more flushes; it completes when no shutdown flush is in
    /// flight (at once when none is).
    pub fn shutdown_flushes(&self, n: usize) {
        let mut s = self.state();
        s.shutdown_flushes += n;
        s.shutdown = ShutdownPhase::Flushing;
        if s.shutdown_flushes == 0 {
            s.shutdown_done();
        }
    }

    /// One shutdown flush finished; the last one in flight completes the shutdown under way.
    pub fn shutdown_flushed(&self) {
        let mut s = self.state();
        s.shutdown_flushes = s.shutdown_flushes.saturating_sub(1);
        if s.shutdown_flushes == 0 && s.shutdown == ShutdownPhase::Flushing {
            s.shutdown_done();
        }
    }

    /// A namespace was added or removed: remember it for log 0x04 and raise a namespace
    /// attribute notice when the host enabled it and is not masked.
    pub fn namespace_changed(&self, nsid: u32) {
        let mut s = self.state();
        if s.changed_ns.len() >= CHANGED_NS_MAX {
            s.changed_overflow = true;
        } else if !s.changed_ns.contains(&nsid) {
            s.changed_ns.push(nsid);
        }
        if s.aec.namespace_attribute && !s.ns_notice_masked {
            s.ns_notice_masked = true;
            s.events.push_back(AsyncEvent {
                event_type: AsyncEventType::Notice,
                info: notice::NAMESPACE_ATTRIBUTE_CHANGED,
                log_page: LogId::ChangedNamespaceList.raw(),
            });
            self.aer_ready.store(true, Ordering::Release);
        }
    }

    /// Pair queued events with outstanding AERs: `(cid, Some(dw0))` for each, and
    /// `(cid, None)` for each AER a controller reset aborted.
    pub fn take_aer_completions(&self, out: &mut impl FnMut(u16, Option<u32>)) {
        if !self.aer_ready.swap(false, Ordering::AcqRel) {
            return;
        }
        let mut s = self.state();
        for cid in std::mem::take(&mut s.aer_aborted) {
            out(cid, None);
        }
        while !s.events.is_empty() && !s.aer_cids.is_empty() {
            if let (Some(e), Some(cid)) = (s.events.pop_front(), s.aer_cids.pop_front()) {
                out(cid, Some(e.to_dw0()));
            }
        }
    }

    /// An AER arrived: Some(dw0) when an event already waits, else it is held; Err when
    /// AERL + 1 are already outstanding.
    pub fn queue_aer(&self, cid: u16) -> Result<Option<u32>, AerLimitExceeded> {
        let mut s = self.state();
        if let Some(e) = s.events.pop_front() {
            return Ok(Some(e.to_dw0()));
        }
        if s.aer_cids.len() > usize::from(AERL) {
            return Err(AerLimitExceeded);
        }
        s.aer_cids.push_back(cid);
        Ok(None)
    }

    /// An Abort for command `cid` of I/O queue `sqid`: queued for the reactor owning that
    /// queue. False (decline at once) when no such I/O queue is connected.
    pub fn request_abort(&self, sqid: u16, cid: u16, abort_cid: u16) -> bool {
        let mut s = self.state();
        let queue = IoQueueId {
            qid: sqid,
            epoch: self.epoch(),
        };
        if !s.io_queues.contains(&queue) {
            return false;
        }
        s.aborts.push(AbortRequest {
            queue,
            cid,
            abort_cid,
        });
        self.aborts_pending.store(true, Ordering::Release);
        true
    }

    /// The aborts asked for I/O queue `queue`: `out(victim cid, abort cid)` for each (one atomic
    /// load when there is none).
    pub fn take_aborts(&self, queue: IoQueueId, out: &mut dyn FnMut(u16, u16)) {
        if !self.aborts_pending.load(Ordering::Acquire) {
            return;
        }
        let mut s = self.state();
        let mut i = 0;
        while i < s.aborts.len() {
            if s.aborts[i].queue == queue {
                let a = s.aborts.swap_remove(i);
                out(a.cid, a.abort_cid);
            } else {
                i += 1;
            }
        }
        if s.aborts.is_empty() {
            self.aborts_pending.store(false, Ordering::Release);
        }
    }

    /// The queue holding an Abort's victim decided: `aborted` or declined.
    pub fn answer_abort(&self, abort_cid: u16, aborted: bool) {
        self.state().abort_answers.push((abort_cid, aborted));
        self.aborts_answered.store(true, Ordering::Release);
    }

    /// Answers for the admin queue: `out(abort cid, aborted)` for each.
    pub fn take_abort_answers(&self, out: &mut dyn FnMut(u16, bool)) {
        if !self.aborts_answered.swap(false, Ordering::AcqRel) {
            return;
        }
        for (cid, aborted) in std::mem::take(&mut self.state().abort_answers) {
            out(cid, aborted);
        }
    }

    /// Log a failed command in the error log.
    pub fn record_error(&self, sqid: u16, cid: u16, status: Status, nsid: u32, opcode: u8) {
        let mut s = self.state();
        s.error_count += 1;
        if matches!(
            status.code,
            StatusCode::Media(MediaStatus::UnrecoveredReadError | MediaStatus::WriteFault)
        ) {
            s.media_errors += 1;
        }
        let entry = ErrorLogEntry {
            error_count: s.error_count,
            sqid,
            cid,
            status_field: status.to_field(),
            parameter_error_location: 0xFFFF,
            lba: 0,
            nsid,
            vendor_specific: 0,
            trtype: nvmf_protocol::log::TransportType::Rdma.raw(),
            csi: 0,
            opcode,
            command_specific: 0,
            transport_specific: 0,
            log_page_version: 0,
        };
        s.errors.push_front(entry);
        s.errors.truncate(ERROR_LOG_ENTRIES);
    }

    /// SMART / Health log from the queues' counters. Data units are thousands of 512-byte
    /// units, rounded up.
    pub fn smart(&self) -> SmartLog {
        let t = self.io_totals();
        let units = |bytes: u64| u128::from(bytes.div_ceil(512 * 1000));
        let (errors, media_errors) = {
            let s = self.state();
            (s.error_count, s.media_errors)
        };
        SmartLog {
            // 0 Kelvin would read as "sensor broken": report a plausible 300 K.
            composite_temperature: 300,
            available_spare: 100,
            available_spare_threshold: 10,
            data_units_read: units(t.bytes_read),
            data_units_written: units(t.bytes_written),
            host_read_commands: u128::from(t.reads),
            host_write_commands: u128::from(t.writes),
            media_errors: u128::from(media_errors),
            error_log_entries: u128::from(errors),
            ..SmartLog::default()
        }
    }
}

/// CAP for these limits: MQES, CQR, TO, CSS NVM, DSTRD 0, MPSMIN/MAX 0 (4 KiB).
pub fn cap(limits: &Limits) -> Cap {
    Cap {
        mqes: (limits.max_queue_depth - 1) as u16,
        cqr: true,
        // 500 ms units: 15 s to become ready is far more than we ever take.
        to: 30,
        css: Cap::CSS_NVM,
        ..Cap::default()
    }
}
