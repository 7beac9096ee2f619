//! One attached controller: bring-up, namespaces, keep-alive, admin commands for tools, clean
//! shutdown, and the reconnect state machine.
//!
//! The owner polls [`Controller::poll`] now and then (keep-alive every KATO/2, reconnect
//! attempts). I/O queues live in the controller and can be lent ([`Controller::io_queue_mut`])
//! or taken out to another reactor ([`Controller::take_io_queue`]); after a reconnect the
//! controller holds fresh queues again.
//!
//! Life cycle ([`ControllerState`]): Live -> (connection lost) -> Reconnecting -> Live, or ->
//! Failed when the loss timeout passes; Live -> ShutDown by [`Controller::shutdown`].

mod bringup;
mod namespace;
mod options;

pub use bringup::ADMIN_SLOT;
pub use namespace::{Namespace, hex_id, uuid_string};
pub use options::{ControllerOptions, ReconnectPolicy};

use std::time::{Duration, Instant};

use nvmf_protocol::admin::{FeatureSelect, GetFeaturesCmd, GetLogPageCmd, SetFeaturesCmd};
use nvmf_protocol::features::FeatureId;
use nvmf_protocol::identify::IdentifyController;
use nvmf_protocol::log::{DISCOVERY_RECORD_SIZE, DiscoveryLog, DiscoveryLogHeader, LogId};
use nvmf_protocol::properties::{Cap, PropertyOffset, Vs};
use nvmf_protocol::{DISCOVERY_NQN, SglDescriptor};

use crate::admin::{AdminQueue, DataPlacement, Transfer};
use crate::clock::SharedClock;
use crate::error::{Error, Result};
use crate::io::{IoLimits, IoQueue};
use crate::queue::{Fabric, TransportAddress};

/// The longest log page read at once (64 MiB: a discovery log of its 16,384 records fits; the
/// whole page is held in memory).
pub const LOG_PAGE_MAX: usize = 64 << 20;

/// Reads of a discovery log that keeps changing before the host gives up (nvme-cli's default).
pub const DISCOVERY_LOG_TRIES: usize = 10;
/// Discovery log records the host reads at most (16 MiB of log): a target's NUMREC sizes the
/// read, so a hostile one must not make the host allocate without bound.
pub const DISCOVERY_RECORDS_MAX: usize = 16_384;

/// Where the controller is in its life.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ControllerState {
    /// Connected and enabled.
    Live,
    /// Connection lost; trying again per the policy.
    Reconnecting {
        /// When the loss was noticed.
        lost_at: Instant,
        /// Next attempt.
        next_attempt: Instant,
        /// Attempts so far.
        attempts: u32,
        /// Why it was lost.
        reason: String,
    },
    /// Given up for good.
    Failed(String),
    /// Shut down cleanly by the host.
    ShutDown,
}

/// An attached NVMe-oF controller over fabric `F`.
pub struct Controller<F: Fabric> {
    fabric: F,
    address: TransportAddress,
    options: ControllerOptions,
    clock: SharedClock,
    admin: Option<AdminQueue<F::Queue>>,
    cntlid: u16,
    cap: Cap,
    vs: Vs,
    identify: Box<IdentifyController>,
    namespaces: Vec<Namespace>,
    io_queues: Vec<Option<IoQueue<F::Queue>>>,
    limits: IoLimits,
    keep_alive_every: Option<Duration>,
    next_keep_alive: Option<Instant>,
    state: ControllerState,
    reconnects: u32,
}

impl<F: Fabric> std::fmt::Debug for Controller<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Controller")
            .field("address", &self.address)
            .field("subnqn", &self.options.subnqn)
            .field("cntlid", &self.cntlid)
            .field("state", &self.state)
            .finish()
    }
}

/// Everything one successful bring-up produced.
struct Session<Q: crate::queue::HostQueue> {
    admin: AdminQueue<Q>,
    cntlid: u16,
    cap: Cap,
    vs: Vs,
    identify: Box<IdentifyController>,
    namespaces: Vec<Namespace>,
    io_queues: Vec<Option<IoQueue<Q>>>,
    limits: IoLimits,
}

impl<F: Fabric> Controller<F> {
    /// Attach: connect the admin queue, enable the controller, identify it, connect the I/O
    /// queues and scan namespaces (a discovery controller stops after Identify).
    pub fn connect(
        fabric: F,
        address: TransportAddress,
        options: ControllerOptions,
        clock: SharedClock,
    ) -> Result<Self> {
        // KATO goes on the wire as 32-bit milliseconds; longer is the caller's mistake (and
        // a deadline from it could overflow).
        if options.kato.as_millis() > u128::from(u32::MAX) {
            return Err(Error::InvalidArgument(format!(
                "keep-alive timeout {:?}: at most {} ms",
                options.kato,
                u32::MAX
            )));
        }
        let s = Self::establish(&fabric, &address, &options, &clock)?;
        let keep_alive_every = (!options.kato.is_zero()).then(|| options.kato / 2);
        let now = clock.now();
        Ok(Self {
            next_keep_alive: keep_alive_every.map(|d| now + d),
            keep_alive_every,
            fabric,
            address,
            options,
            clock,
            admin: Some(s.admin),
            cntlid: s.cntlid,
            cap: s.cap,
            vs: s.vs,
            identify: s.identify,
            namespaces: s.namespaces,
            io_queues: s.io_queues,
            limits: s.limits,
            state: ControllerState::Live,
            reconnects: 0,
        })
    }

    fn establish(
        fabric: &F,
        address: &TransportAddress,
        o: &ControllerOptions,
        clock: &SharedClock,
    ) -> Result<Session<F::Queue>> {
        let mut a = bringup::bring_up_admin(fabric, address, o, clock)?;
        let limits = bringup::io_limits(&a.identify, o);
        if o.subnqn == DISCOVERY_NQN {
            return Ok(Session {
                admin: a.admin,
                cntlid: a.cntlid,
                cap: a.cap,
                vs: a.vs,
                identify: a.identify,
                namespaces: Vec::new(),
                io_queues: Vec::new(),
                limits,
            });
        }
        let granted = if o.io_queues == 0 {
            0
        } else {
            bringup::negotiate_queues(&mut a.admin, o.io_queues)?
        };
        let depth = bringup::io_depth(&a.cap, &a.identify, o);
        let mut io_queues = Vec::with_capacity(usize::from(granted));
        for qid in 1..=granted {
            let q =
                bringup::connect_io_queue(fabric, address, o, clock, a.cntlid, qid, depth, limits)?;
            io_queues.push(Some(q));
        }
        let namespaces = bringup::scan_namespaces(&mut a.admin)?;
        tracing::info!(%address, cntlid = a.cntlid, io_queues = granted, depth, namespaces = namespaces.len(), "controller live");
        Ok(Session {
            admin: a.admin,
            cntlid: a.cntlid,
            cap: a.cap,
            vs: a.vs,
            identify: a.identify,
            namespaces,
            io_queues,
            limits,
        })
    }

    /// State.
    pub fn state(&self) -> &ControllerState {
        &self.state
    }
    /// Controller id of the current association.
    pub fn cntlid(&self) -> u16 {
        self.cntlid
    }
    /// CAP as read at bring-up.
    pub fn cap(&self) -> Cap {
        self.cap
    }
    /// VS as read at bring-up.
    pub fn version(&self) -> Vs {
        self.vs
    }
    /// Identify Controller data.
    pub fn identify(&self) -> &IdentifyController {
        &self.identify
    }
    /// Active namespaces.
    pub fn namespaces(&self) -> &[Namespace] {
        &self.namespaces
    }
    /// Namespace by id.
    pub fn namespace(&self, nsid: u32) -> Option<&Namespace> {
        self.namespaces.iter().find(|n| n.nsid == nsid)
    }
    /// I/O limits (largest transfer, in-capsule size).
    pub fn limits(&self) -> IoLimits {
        self.limits
    }
    /// Number of I/O queues of the association.
    pub fn io_queue_count(&self) -> usize {
        self.io_queues.len()
    }
    /// Completed reconnects.
    pub fn reconnects(&self) -> u32 {
        self.reconnects
    }
    /// The options.
    pub fn options(&self) -> &ControllerOptions {
        &self.options
    }
    /// The admin queue (for its counters).
    pub fn admin(&self) -> Option<&AdminQueue<F::Queue>> {
        self.admin.as_ref()
    }

    /// Lend I/O queue `index` (0-based; QID index + 1).
    pub fn io_queue_mut(&mut self, index: usize) -> Result<&mut IoQueue<F::Queue>> {
        self.check_live()?;
        self.io_queues
            .get_mut(index)
            .and_then(Option::as_mut)
            .ok_or_else(|| {
                Error::InvalidArgument(format!("I/O queue {index} not held by the controller"))
            })
    }

    /// Take I/O queue `index` out (to move it to a reactor).
    pub fn take_io_queue(&mut self, index: usize) -> Result<IoQueue<F::Queue>> {
        self.check_live()?;
        self.io_queues
            .get_mut(index)
            .and_then(Option::take)
            .ok_or_else(|| {
                Error::InvalidArgument(format!("I/O queue {index} not held by the controller"))
            })
    }

    fn check_live(&self) -> Result<()> {
        match &self.state {
            ControllerState::Live => Ok(()),
            ControllerState::Reconnecting { .. } => Err(Error::Reconnecting),
            ControllerState::Failed(why) => Err(Error::ControllerFailed(why.clone())),
            ControllerState::ShutDown => Err(Error::ControllerFailed("shut down".into())),
        }
    }

    fn admin_mut(&mut self) -> Result<&mut AdminQueue<F::Queue>> {
        self.check_live()?;
        self.admin
            .as_mut()
            .ok_or_else(|| Error::ControllerFailed("no admin queue".into()))
    }

    /// Record a connection loss: every queue is torn down (their in-flight commands fail at
    /// their next poll) and, per the policy, reconnecting starts or the controller fails.
    pub fn connection_lost(&mut self, reason: &str) {
        if self.state != ControllerState::Live {
            return;
        }
        tracing::warn!(address = %self.address, reason, "controller connection lost");
        if let Some(a) = self.admin.as_mut() {
            a.disconnect();
        }
        for q in self.io_queues.iter_mut().flatten() {
            q.disconnect(reason);
        }
        let now = self.clock.now();
        let policy = self.options.reconnect;
        self.state = if policy.ctrl_loss_timeout == Some(Duration::ZERO) {
            ControllerState::Failed(format!("connection lost ({reason}); reconnect disabled"))
        } else {
            ControllerState::Reconnecting {
                lost_at: now,
                next_attempt: now + policy.reconnect_delay,
                attempts: 0,
                reason: reason.to_string(),
            }
        };
    }

    /// Owner's periodic call: keep-alive when due, notice a dead admin or I/O queue, drive
    /// reconnect attempts. Returns the state afterwards.
    pub fn poll(&mut self) -> &ControllerState {
        match self.state {
            ControllerState::Live => self.poll_live(),
            ControllerState::Reconnecting { .. } => self.poll_reconnect(),
            _ => {}
        }
        &self.state
    }

    fn poll_live(&mut self) {
        let now = self.clock.now();
        let Some(admin) = self.admin.as_mut() else {
            return;
        };
        let mut result = admin.poll().map(|_| ());
        if result.is_ok() {
            if let (Some(every), Some(next)) = (self.keep_alive_every, self.next_keep_alive) {
                if now >= next {
                    result = admin.send_keep_alive(self.options.kato);
                    self.next_keep_alive = Some(now + every);
                }
            }
        }
        if let Err(e) = result {
            self.connection_lost(&e.to_string());
            return;
        }
        let dead = self
            .io_queues
            .iter()
            .flatten()
            .find_map(|q| q.loss_reason().map(str::to_string));
        if let Some(why) = dead {
            self.connection_lost(&why);
        }
    }

    fn poll_reconnect(&mut self) {
        let ControllerState::Reconnecting {
            lost_at,
            next_attempt,
            attempts,
            ref reason,
        } = self.state
        else {
            return;
        };
        let now = self.clock.now();
        let policy = self.options.reconnect;
        if policy
            .ctrl_loss_timeout
            .is_some_and(|t| now.saturating_duration_since(lost_at) >= t)
        {
            self.state = ControllerState::Failed(format!(
                "connection lost ({reason}); not back within ctrl-loss-tmo {:?} after {attempts} attempts",
                policy.ctrl_loss_timeout.unwrap_or_default()
            ));
            return;
        }
        if now < next_attempt {
            return;
        }
        let reason = reason.clone();
        match Self::establish(&self.fabric, &self.address, &self.options, &self.clock) {
            Ok(s) => {
                tracing::info!(address = %self.address, attempts = attempts + 1, "controller reconnected");
                self.admin = Some(s.admin);
                self.cntlid = s.cntlid;
                self.cap = s.cap;
                self.vs = s.vs;
                self.identify = s.identify;
                self.namespaces = s.namespaces;
                self.io_queues = s.io_queues;
                self.limits = s.limits;
                self.next_keep_alive = self.keep_alive_every.map(|d| now + d);
                self.reconnects += 1;
                self.state = ControllerState::Live;
            }
            Err(e) => {
                tracing::warn!(address = %self.address, error = %e, "reconnect attempt failed");
                self.state = ControllerState::Reconnecting {
                    lost_at,
                    next_attempt: now + policy.reconnect_delay,
                    attempts: attempts + 1,
                    reason,
                };
            }
        }
    }

    /// Block until Live, driving reconnect; fails per the policy (fast_io_fail, loss
    /// timeout). Used by blocking callers that met a lost connection.
    pub fn wait_live(&mut self) -> Result<()> {
        loop {
            match self.poll().clone() {
                ControllerState::Live => return Ok(()),
                ControllerState::Reconnecting {
                    lost_at,
                    next_attempt,
                    ..
                } => {
                    let now = self.clock.now();
                    if let Some(limit) = self.options.reconnect.fast_io_fail {
                        if now.saturating_duration_since(lost_at) >= limit {
                            return Err(Error::Reconnecting);
                        }
                    }
                    let mut wait = next_attempt.saturating_duration_since(now);
                    if let Some(limit) = self.options.reconnect.fast_io_fail {
                        wait = wait.min((lost_at + limit).saturating_duration_since(now));
                    }
                    self.clock.idle(wait.min(Duration::from_millis(100)));
                }
                ControllerState::Failed(why) => return Err(Error::ControllerFailed(why)),
                ControllerState::ShutDown => {
                    return Err(Error::ControllerFailed("shut down".into()));
                }
            }
        }
    }

    /// Clean shutdown: the I/O queues disconnected, CC.SHN, a wait for CSTS.SHST complete,
    /// then the admin queue disconnected.
    pub fn shutdown(&mut self) -> Result<()> {
        // The I/O queues go first, as Linux tears them down before CC.SHN: the target's
        // shutdown flush then covers every write this host sent.
        for q in self.io_queues.iter_mut().flatten() {
            q.disconnect("controller shut down");
        }
        let (rtd3e, cap) = (self.identify.rtd3e, self.cap);
        let clock = self.clock.clone();
        let result = match self.admin_mut() {
            Ok(a) => bringup::shutdown(a, rtd3e, &cap, &clock),
            Err(e) => Err(e),
        };
        if let Some(a) = self.admin.as_mut() {
            a.disconnect();
        }
        self.state = ControllerState::ShutDown;
        result
    }

    /// Get Log Page `lid` for `nsid`, `len` bytes from offset 0 (read in admin-slot pieces),
    /// at most [`LOG_PAGE_MAX`].
    pub fn get_log_page(&mut self, lid: LogId, nsid: u32, len: usize) -> Result<Vec<u8>> {
        if len > LOG_PAGE_MAX {
            return Err(Error::InvalidArgument(format!(
                "log page of {len} bytes: at most {LOG_PAGE_MAX} read at once"
            )));
        }
        let admin = self.admin_mut()?;
        let mut out = Vec::with_capacity(len);
        while out.len() < len {
            let piece = (len - out.len()).min(ADMIN_SLOT);
            let sqe = GetLogPageCmd {
                cid: 0,
                nsid,
                lid,
                lsp: 0,
                rae: false,
                numd: GetLogPageCmd::numd_for(piece as u64),
                lsi: 0,
                lpo: out.len() as u64,
                uuid_index: 0,
                ot: false,
                csi: 0,
                sgl: SglDescriptor::NULL,
            }
            .to_sqe();
            let (_, data) =
                admin.execute("Get Log Page", sqe, Transfer::ToHost(piece.div_ceil(4) * 4))?;
            out.extend_from_slice(&data[..piece]);
        }
        Ok(out)
    }

    /// The discovery log: its header first to learn NUMREC, then the whole log, then the
    /// header again. A log that changed meanwhile (GENCTR moved, or the whole log's header
    /// disagrees with the first) is read again, up to [`DISCOVERY_LOG_TRIES`] times, as
    /// nvme-cli does: the pieces of one read must come from one generation.
    pub fn discovery_log(&mut self) -> Result<DiscoveryLog> {
        for _ in 0..DISCOVERY_LOG_TRIES {
            let first = self.discovery_log_header()?;
            // NUMREC is the target's word: bound it before it sizes a read.
            let records = usize::try_from(first.numrec)
                .ok()
                .filter(|n| *n <= DISCOVERY_RECORDS_MAX)
                .ok_or_else(|| {
                    Error::Target(format!(
                        "discovery log lists {} records, more than the {DISCOVERY_RECORDS_MAX} \
                         this host reads",
                        first.numrec
                    ))
                })?;
            let full =
                self.get_log_page(LogId::Discovery, 0, DISCOVERY_RECORD_SIZE * (1 + records))?;
            let whole = DiscoveryLogHeader::decode(&full)?;
            let last = self.discovery_log_header()?;
            if whole.genctr == first.genctr
                && whole.numrec == first.numrec
                && last.genctr == first.genctr
            {
                return Ok(DiscoveryLog::decode(&full)?);
            }
            tracing::debug!(
                genctr = first.genctr,
                now = last.genctr,
                "discovery log changed while read; reading it again"
            );
        }
        Err(Error::Target(format!(
            "discovery log changed on each of {DISCOVERY_LOG_TRIES} reads"
        )))
    }

    fn discovery_log_header(&mut self) -> Result<DiscoveryLogHeader> {
        let head = self.get_log_page(LogId::Discovery, 0, DISCOVERY_RECORD_SIZE)?;
        Ok(DiscoveryLogHeader::decode(&head)?)
    }

    /// Property Get of `offset` on the admin queue now (CAP is 8 bytes, the others 4): what
    /// `nvme show-regs` reads of a fabrics controller. `cap()` and `version()` are the values
    /// read at bring-up.
    pub fn property(&mut self, offset: PropertyOffset) -> Result<u64> {
        bringup::property_get(self.admin_mut()?, offset)
    }

    /// Get Features `fid` (current value); returns completion DW0.
    pub fn get_features(&mut self, fid: FeatureId, nsid: u32, cdw11: u32) -> Result<u32> {
        Ok(self.get_features_data(fid, nsid, cdw11, 0)?.0)
    }

    /// Get Features `fid` (current value) of a feature that also returns a data buffer of
    /// `data_len` bytes (Host Identifier's 16 with CDW11 EXHID, LBA Range Type's 4096; 0 for
    /// none): completion DW0 and the data. At most [`ADMIN_SLOT`] bytes.
    pub fn get_features_data(
        &mut self,
        fid: FeatureId,
        nsid: u32,
        cdw11: u32,
        data_len: usize,
    ) -> Result<(u32, Vec<u8>)> {
        let sqe = GetFeaturesCmd {
            cid: 0,
            nsid,
            fid,
            sel: FeatureSelect::Current,
            cdw11,
            uuid_index: 0,
            sgl: SglDescriptor::NULL,
        }
        .to_sqe();
        let transfer = if data_len == 0 {
            Transfer::None
        } else {
            Transfer::ToHost(data_len)
        };
        let (cqe, data) = self.admin_mut()?.execute("Get Features", sqe, transfer)?;
        Ok((cqe.dw0, data))
    }

    /// Set Features `fid` to `cdw11`; returns completion DW0.
    pub fn set_features(
        &mut self,
        fid: FeatureId,
        nsid: u32,
        cdw11: u32,
        save: bool,
    ) -> Result<u32> {
        self.set_features_data(fid, nsid, cdw11, save, &[])
    }

    /// Set Features `fid` to `cdw11` with a data buffer the feature takes (empty for none;
    /// sent by keyed SGL, at most [`ADMIN_SLOT`] bytes); returns completion DW0.
    pub fn set_features_data(
        &mut self,
        fid: FeatureId,
        nsid: u32,
        cdw11: u32,
        save: bool,
        data: &[u8],
    ) -> Result<u32> {
        let sqe = SetFeaturesCmd {
            cid: 0,
            nsid,
            fid,
            save,
            cdw11,
            cdw12: 0,
            cdw13: 0,
            uuid_index: 0,
            cdw15: 0,
            sgl: SglDescriptor::NULL,
        }
        .to_sqe();
        let transfer = if data.is_empty() {
            Transfer::None
        } else {
            Transfer::FromHost(data, DataPlacement::Keyed)
        };
        Ok(self
            .admin_mut()?
            .execute("Set Features", sqe, transfer)?
            .0
            .dw0)
    }

    /// Raw Identify page (for the CLI's --raw and tests).
    pub fn identify_raw(
        &mut self,
        cns: nvmf_protocol::identify::Cns,
        nsid: u32,
    ) -> Result<Vec<u8>> {
        bringup::identify(self.admin_mut()?, cns, nsid)
    }
}

#[cfg(test)]
pub(crate) mod tests;

/// The host under a hostile target's answers: see the module's own doc.
#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub mod fuzzing;
