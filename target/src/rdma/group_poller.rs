//! `GroupPoller`: one poll group and its handler as a reactor poller. It owns everything a
//! reactor needs to run a group: polling, idle sleep on the group's completion channel (plus the
//! provider's progress fd), the reactor-side map from CM token to qp_num, the connection set-up
//! the acceptor asks for (QP on this group's CQ and SRQ, then accept), CM and async events
//! delivered as messages, and the drain on stop. Nothing here is touched by another thread:
//! the acceptor only sends messages (closures run on this reactor).

use std::collections::HashMap;

use nvmf_poller::{Arm, PollStatus, Poller, ReactorCtx, WakeFds};
use nvmf_protocol::cm::{RdmaReject, RejectStatus};
use nvmf_transport::pollgroup::{AddQpairError, Handler, PollGroup, QpairEvent, ReqId, WrKind};
use nvmf_transport::{AsyncEventKind, CmEventKind, CmId, ConnParam, WcStatus};

use super::group_stats::GroupSnapshot;
use super::link::{Control, GroupLink};

/// Which group a handler serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GroupInfo {
    /// Index of the device in `RdmaConfig::devices`.
    pub device: usize,
    /// Index of the reactor (in the handles given to `RdmaTransport::start`).
    pub reactor: usize,
}

/// A poll group and its handler, polled by one reactor. See the module documentation.
pub struct GroupPoller<R, H> {
    /// Declared (so dropped) before `pg`: a group dropped on a drain timeout may still have
    /// block I/O in flight into the group's data buffers and receive slots, and the handler's
    /// drop waits for it (a file channel waits for its io_uring); the buffers must outlive it.
    handler: H,
    pg: PollGroup<R>,
    info: GroupInfo,
    /// CM token -> qp_num of this group's connections (CM events name the token only).
    by_token: HashMap<u64, u32>,
    link: GroupLink,
    /// `arm` returned Armed: the next poll consumes the completion channel's events.
    armed: bool,
    stopping: bool,
    /// A failing CQ is logged once, not on every poll.
    poll_failed: bool,
    arm_failed: bool,
}

/// Forwards to the layer above's handler, and keeps the routing state true when a qpair goes.
struct Tracker<'a, H> {
    inner: &'a mut H,
    by_token: &'a mut HashMap<u64, u32>,
    link: &'a GroupLink,
}

impl<R, H: Handler<R>> Handler<R> for Tracker<'_, H> {
    #[inline]
    fn capsule(&mut self, pg: &mut PollGroup<R>, req: ReqId) {
        self.inner.capsule(pg, req);
    }
    #[inline]
    fn chain_done(&mut self, pg: &mut PollGroup<R>, req: ReqId, last: WrKind, status: WcStatus) {
        self.inner.chain_done(pg, req, last, status);
    }
    fn qpair_event(&mut self, pg: &mut PollGroup<R>, qp_num: u32, token: u64, event: QpairEvent) {
        self.inner.qpair_event(pg, qp_num, token, event);
        if let QpairEvent::Gone { .. } = event {
            if self.by_token.get(&token) == Some(&qp_num) {
                self.by_token.remove(&token);
                self.link.placement.release(self.link.group);
                self.link.tell(Control::Gone {
                    device: self.link.device,
                    token,
                    qp_num,
                });
            }
        }
    }
    fn aborted(&mut self, pg: &mut PollGroup<R>, req: ReqId) {
        self.inner.aborted(pg, req);
    }
    #[inline]
    fn buffers_ready(&mut self, pg: &mut PollGroup<R>, req: ReqId) {
        self.inner.buffers_ready(pg, req);
    }
    fn group_failed(&mut self, pg: &mut PollGroup<R>, error: &str) {
        self.inner.group_failed(pg, error);
    }
}

impl<R: Default, H: Handler<R>> GroupPoller<R, H> {
    pub(crate) fn new(pg: PollGroup<R>, handler: H, info: GroupInfo, link: GroupLink) -> Self {
        GroupPoller {
            pg,
            handler,
            info,
            by_token: HashMap::new(),
            link,
            armed: false,
            stopping: false,
            poll_failed: false,
            arm_failed: false,
        }
    }

    /// Splits `self` into the group and a tracking handler, and runs `f` on them.
    fn with_parts<T>(&mut self, f: impl FnOnce(&mut PollGroup<R>, &mut Tracker<'_, H>) -> T) -> T {
        let mut t = Tracker {
            inner: &mut self.handler,
            by_token: &mut self.by_token,
            link: &self.link,
        };
        f(&mut self.pg, &mut t)
    }

    pub fn info(&self) -> GroupInfo {
        self.info
    }
    pub fn poll_group(&self) -> &PollGroup<R> {
        &self.pg
    }
    pub fn handler(&self) -> &H {
        &self.handler
    }
    pub fn handler_mut(&mut self) -> &mut H {
        &mut self.handler
    }
    /// This group's figures (queue occupancy, receive slots, error counters).
    pub fn snapshot(&self) -> GroupSnapshot {
        GroupSnapshot::of(self.info, &self.pg)
    }
    /// Qpairs of this group that came through the CM, by token.
    pub fn connections(&self) -> impl Iterator<Item = (u64, u32)> + '_ {
        self.by_token.iter().map(|(&t, &q)| (t, q))
    }

    /// A new connection the acceptor placed here: its QP is created on this group's CQ and
    /// SRQ, on this thread, then accepted. `read_depth` is the grant's (`Grant::read_depth`):
    /// the RDMA READs this group may have in flight on the connection. Any failure gives the
    /// placement slot back.
    pub(crate) fn connect(
        &mut self,
        mut id: CmId,
        token: u64,
        depth: u32,
        read_depth: u32,
        param: ConnParam,
    ) {
        if self.stopping {
            reject(&mut id, RejectStatus::NoResources);
            self.refused(token);
            return;
        }
        let qp_num = match self.pg.add_cm_qpair(id, depth, read_depth, token) {
            Ok(q) => q,
            Err(AddQpairError { error, mut id }) => {
                tracing::warn!(token, %error, "creating the qpair failed");
                reject(&mut id, RejectStatus::NoResources);
                self.refused(token);
                return;
            }
        };
        self.by_token.insert(token, qp_num);
        self.link.tell(Control::Placed {
            device: self.info.device,
            token,
            qp_num,
        });
        if let Err(e) = self.pg.accept(qp_num, &param) {
            tracing::warn!(token, qp_num, error = %e, "accept failed");
            // Gone follows: the slot is released and the acceptor forgets the connection.
            self.with_parts(|pg, h| pg.destroy_qpair(h, qp_num));
        } else {
            tracing::debug!(
                token,
                qp_num,
                depth,
                reactor = self.info.reactor,
                "connection accepted"
            );
        }
    }

    fn refused(&mut self, token: u64) {
        self.link.placement.release(self.link.group);
        self.link.tell(Control::Failed { token });
    }

    /// A CM event for connection `token` (ESTABLISHED, DISCONNECTED, ...).
    pub(crate) fn cm_event(&mut self, token: u64, kind: &CmEventKind) {
        let Some(&qp_num) = self.by_token.get(&token) else {
            // Gone already (a late TIMEWAIT_EXIT, say).
            tracing::debug!(token, ?kind, "CM event for a connection no longer here");
            return;
        };
        self.with_parts(|pg, h| pg.handle_cm_event(h, qp_num, kind));
    }

    /// An async event of this group's device (qp_nums not in this group are ignored).
    pub(crate) fn async_event(&mut self, kind: AsyncEventKind) {
        self.with_parts(|pg, h| pg.handle_async_event(h, kind));
    }

    /// The handler's slow work, on the reactor's timer (see `TICK`).
    pub(crate) fn tick(&mut self) {
        self.handler.tick(&mut self.pg);
        while let Some(qp_num) = self.handler.take_disconnect() {
            self.disconnect(qp_num);
        }
    }

    /// Starts draining every qpair of the group (no-op for those already draining).
    pub fn disconnect_all(&mut self) {
        let all: Vec<u32> = self.pg.qpair_nums().collect();
        self.with_parts(|pg, h| {
            for q in all {
                pg.disconnect(h, q);
            }
        });
    }

    /// Starts draining connection `qp_num`.
    pub fn disconnect(&mut self, qp_num: u32) {
        self.with_parts(|pg, h| pg.disconnect(h, qp_num));
    }

    /// Refuse new connections and drain the existing ones; true once none is left and the
    /// handler has nothing in flight (block I/O may still own buffers of aborted requests:
    /// the group must not be dropped under it).
    pub(crate) fn quiesce(&mut self) -> bool {
        if !self.stopping {
            self.stopping = true;
            self.disconnect_all();
        }
        self.pg.qpair_count() == 0 && !self.handler.busy()
    }
}

fn reject(id: &mut CmId, status: RejectStatus) {
    if let Err(e) = id.reject(&RdmaReject::new(status).to_bytes()) {
        tracing::warn!(error = %e, ?status, "reject failed");
    }
}

impl<R, H> Poller for GroupPoller<R, H>
where
    R: Default + Send + 'static,
    H: Handler<R> + Send + 'static,
{
    #[inline]
    fn poll(&mut self, _ctx: &mut ReactorCtx) -> PollStatus {
        if self.armed {
            // First poll after a sleep: consume the channel events that woke us (one syscall,
            // only after a sleep).
            self.armed = false;
            if let Err(e) = self.pg.ack_wakeups() {
                tracing::warn!(error = %e, "reading the completion channel failed");
            }
        }
        let side = self.handler.poll_side(&mut self.pg);
        while let Some(qp_num) = self.handler.take_disconnect() {
            self.disconnect(qp_num);
        }
        match self.with_parts(|pg, h| pg.poll(h)) {
            Ok(n) => PollStatus::from_count(n + side),
            Err(e) => {
                if !self.poll_failed {
                    self.poll_failed = true;
                    // The group failed itself (qpairs torn down, handler told); it polls as idle.
                    tracing::error!(error = %e, reactor = self.info.reactor, "polling the CQ failed");
                }
                PollStatus::Idle
            }
        }
    }

    fn arm(&mut self, fds: &mut WakeFds) -> Arm {
        if self.handler.busy() {
            // Block-device completions are polled, not signalled on the channel.
            return Arm::WorkPending;
        }
        match self.pg.arm() {
            Ok(Some(wake)) => {
                for fd in wake.into_iter().flatten() {
                    fds.watch_raw(fd);
                }
                self.armed = true;
                Arm::Armed
            }
            Ok(None) => Arm::WorkPending,
            Err(e) => {
                if !self.arm_failed {
                    self.arm_failed = true;
                    tracing::warn!(error = %e, "arming the CQ failed: this reactor keeps polling");
                }
                // Without an armed CQ a sleep could miss completions: stay awake.
                Arm::WorkPending
            }
        }
    }

    fn stop(&mut self, _ctx: &mut ReactorCtx) -> bool {
        self.quiesce()
    }

    fn name(&self) -> &str {
        "rdma poll group"
    }
}
