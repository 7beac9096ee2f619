//! One queue's share of a host poll group: its commands in flight by CID, the CQEs reaped for
//! it and not yet handed out, its memory windows, and whether its connection is gone. The
//! group's [`super::group::Router`] hands each poll-group callback to the `Side` of the qpair
//! it concerns; a `Side` never sees another queue's completions. The queue's registered region
//! stays with the queue ([`super::RdmaQueue`]), which copies a finished read's data when it
//! takes the CQE (or, polled lazily, when the consumer fetches it).

use std::collections::VecDeque;
use std::ops::Range;

use nvmf_protocol::{CQE_SIZE, Cqe};
use nvmf_transport::WcStatus;
use nvmf_transport::pollgroup::{PollGroup, ReqId};

use super::by_cid::ByCid;
use super::windows::Windows;

/// What the group remembers about one command in flight (the poll group's per-request state).
#[derive(Debug, Default, Clone)]
pub(super) struct HostCommand {
    /// The queue (router token) the command belongs to.
    pub(super) queue: u64,
    /// Region bytes the target may write for this command (copied back at completion; None
    /// for commands that only send data).
    pub(super) data: Option<Range<usize>>,
    /// The response, once it arrived (reported when the SEND completed too).
    pub(super) cqe: Option<Cqe>,
    /// The memory window the command's data goes through (per-I/O keys), until its key is
    /// dead: the target's invalidation in the response, or the host's own LOCAL_INV.
    pub(super) window: Option<usize>,
}

/// One queue's handler state inside the shared group.
pub(super) struct Side {
    /// Commands in flight by CID.
    pub(super) by_cid: ByCid<ReqId>,
    /// Finished commands not yet handed to the caller, with the region bytes the target wrote
    /// for them.
    pub(super) done: VecDeque<(Cqe, Option<Range<usize>>)>,
    /// Why the connection is gone, once it is.
    pub(super) lost: Option<String>,
    /// Set by the qpair's `Active` event.
    pub(super) active: bool,
    /// Set once the qpair is out of the group (its QP destroyed).
    pub(super) gone: bool,
    /// Listed in the group's router for `poll_ready` (has something to report).
    pub(super) listed: bool,
    pub(super) qid: u16,
    /// Memory windows for per-I/O keys: made at the first `bind_window`; None inside when the
    /// device has none.
    pub(super) windows: Option<Option<Windows>>,
}

impl Side {
    pub(super) fn new(qid: u16, depth: usize) -> Side {
        Side {
            by_cid: ByCid::new(depth),
            done: VecDeque::with_capacity(depth),
            lost: None,
            active: false,
            gone: false,
            listed: false,
            qid,
            windows: None,
        }
    }

    /// A command with `cid` is in flight, or its CQE waits to be reported: a new command may
    /// not take the CID yet (the consumer could not tell the two completions apart).
    #[inline]
    pub(super) fn cid_busy(&self, cid: u16) -> bool {
        self.by_cid.contains(cid) || (!self.done.is_empty() && self.cid_waits(cid))
    }

    /// A CQE of `cid` waits to be polled. Out of line: consumers poll before they submit, so
    /// the submit path rarely finds CQEs waiting.
    #[inline(never)]
    fn cid_waits(&self, cid: u16) -> bool {
        self.done.iter().any(|(cqe, _)| cqe.cid == cid)
    }

    /// A response of `len` bytes came: not a CQE, the queue is lost.
    #[cold]
    #[inline(never)]
    fn lose_to_length(&mut self, len: usize) {
        self.lose(format!(
            "malformed response: {len} bytes, not a {CQE_SIZE}-byte CQE"
        ));
    }

    /// A response for a command that `state` says cannot take one: the queue is lost.
    #[cold]
    #[inline(never)]
    fn lose_to_stray(&mut self, cid: u16, state: &str, invalidated: Option<u32>) {
        let ended = invalidated
            .map(|rkey| format!(", and it invalidated rkey {rkey:#x}"))
            .unwrap_or_default();
        self.lose(format!("a response for CID {cid}, {state}{ended}"));
    }

    pub(super) fn lose(&mut self, why: String) {
        if self.lost.is_none() {
            tracing::debug!(qid = self.qid, %why, "queue lost");
            self.lost = Some(why);
        }
        // Nothing is reported after the loss: the initiator fails every command in flight.
        self.done.clear();
    }

    /// A response capsule for this queue's qpair.
    pub(super) fn response(&mut self, pg: &mut PollGroup<HostCommand>, capsule: &[u8]) {
        // A response is a CQE and nothing else (NVMe-oF RDMA carries no data in it): longer is
        // as malformed as shorter. The receive slots are larger (the poll group's capsule
        // header), so the device does not refuse it as the Linux host's 16-byte buffers would.
        let Ok(bytes) = <&[u8; CQE_SIZE]>::try_from(capsule) else {
            self.lose_to_length(capsule.len());
            return;
        };
        let cqe = match Cqe::decode(bytes) {
            Ok(c) => c,
            Err(e) => {
                self.lose(format!("malformed response: {e}"));
                return;
            }
        };
        let invalidated = pg.response_invalidated_rkey();
        // A response for no command in flight (duplicate or stale), or a second one for a
        // command, comes from a broken target, and the next may as well carry a CID the host
        // has reused and complete that command early: the queue is lost, as the Linux host
        // resets the controller on a command ID it does not know.
        let Some(req) = self.by_cid.get(cqe.cid) else {
            self.lose_to_stray(cqe.cid, "not in flight", invalidated);
            return;
        };
        if let Some(r) = pg.request_mut(req) {
            if r.user.cqe.is_some() {
                self.lose_to_stray(cqe.cid, "answered already", invalidated);
                return;
            }
            let windows = self.windows.as_mut().and_then(Option::as_mut);
            if let Some(rkey) = invalidated {
                // Only the command's own window may go (the Linux host resets the connection
                // on any other): another command's key died under it, or the region's.
                let own = r.user.window.zip(windows.as_deref());
                if own.and_then(|(w, windows)| windows.in_use_key(w)) != Some(rkey) {
                    let cid = cqe.cid;
                    self.lose(format!(
                        "the response to CID {cid} invalidated rkey {rkey:#x}, not its command's window"
                    ));
                    return;
                }
            }
            r.user.cqe = Some(cqe);
            // A window the target invalidated is free; one it left valid is invalidated by
            // the host before the command is reported (`Router::request_complete`).
            if let (Some(_), Some(w), Some(windows)) = (invalidated, r.user.window, windows) {
                windows.free(w);
                r.user.window = None;
            }
        }
        if let Err(e) = pg.response_received(req) {
            tracing::warn!(qid = self.qid, cid = cqe.cid, %e, "response_received");
        }
    }

    /// A command of this queue is finished on the wire (SEND completed and response in); the
    /// request object is already back in the group.
    #[inline(always)]
    pub(super) fn complete(&mut self, command: HostCommand, status: WcStatus) {
        if status != WcStatus::Success {
            self.lose(format!("command SEND failed: {status:?}"));
            return;
        }
        let Some(cqe) = command.cqe else {
            self.lose("request completed without a response".into());
            return;
        };
        self.by_cid.remove(cqe.cid);
        if self.lost.is_none() {
            self.done.push_back((cqe, command.data));
        }
    }
}
