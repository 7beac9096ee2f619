//! One NVMe-oF queue over RDMA: a qpair on its own host poll group, its registered data
//! region, and the matching of responses to commands by CID.
//!
//! Life of a command: `submit` takes a request object (`PollGroup::submit`), writes the SQE and
//! any in-capsule data into its send buffer, posts the SEND, and files the request under its
//! CID. A response (`Handler::response`) is matched by CID and handed to the group
//! (`response_received`); the group calls `request_complete` once the SEND completed too, and
//! only then is the CQE queued for `poll`. A qpair that drains (peer disconnect, error,
//! flush) makes the queue lost: `poll` and `submit` report `Disconnected` from then on and
//! queued CQEs are dropped with the connection (the initiator fails what was in flight).
//!
//! Host memory: the initiator works on a plain host copy of the region (`host`); the
//! registered region (`mr`) is what the target reads and writes. A command naming a range of
//! the region by keyed SGL copies that range host -> registered at submit and registered ->
//! host when it completes (`Mr::write_at` / `read_at`: race-free copies, no `unsafe`). The
//! target touches only the ranges of commands in flight, and the initiator leaves those alone
//! until their CQE, so both copies agree. A borrow of the registered memory itself would let
//! safe code alias bytes the peer writes concurrently; the copy is the price of keeping this
//! crate free of `unsafe`.

use std::collections::{HashMap, VecDeque};
use std::ops::Range;

use nvmf_protocol::{Cqe, SglDescriptor, Sqe};
use nvmf_transport::pollgroup::WrKind;
use nvmf_transport::pollgroup::{
    BufferGrant, ChainWr, Handler, PollGroup, QpairEvent, QpairHandle, ReqId,
};
use nvmf_transport::{Access, CmChannel, CmEventKind, Mr, SendOp, Sge, TransportError, WcStatus};

use super::windows::{Posting, Windows};
use crate::queue::{DataRegion, HostQueue, QueueError};

/// What the queue remembers about one command in flight (the poll group's per-request state).
#[derive(Debug, Default, Clone)]
pub(super) struct HostCommand {
    /// Region bytes the target may write for this command (copied back at completion; None
    /// for commands that only send data).
    pub(super) data: Option<Range<usize>>,
    /// The response, once it arrived (reported when the SEND completed too).
    pub(super) cqe: Option<Cqe>,
    /// The memory window the command's data goes through (per-I/O keys).
    pub(super) window: Option<usize>,
}

/// The handler side of the queue: what poll-group callbacks update.
pub(super) struct Side {
    pub(super) mr: Mr,
    pub(super) host: Vec<u8>,
    /// Commands in flight by CID.
    pub(super) by_cid: HashMap<u16, ReqId>,
    /// Finished commands not yet handed to the caller.
    pub(super) done: VecDeque<Cqe>,
    /// Why the connection is gone, once it is.
    pub(super) lost: Option<String>,
    /// Set by the qpair's `Active` event.
    pub(super) active: bool,
    pub(super) qid: u16,
    /// Memory windows for per-I/O keys: made at the first `bind_window`; None inside when the
    /// device has none.
    pub(super) windows: Option<Option<Windows>>,
}

impl Side {
    fn lose(&mut self, why: String) {
        if self.lost.is_none() {
            tracing::debug!(qid = self.qid, %why, "queue lost");
            self.lost = Some(why);
        }
        // Nothing is reported after the loss: the initiator fails every command in flight.
        self.done.clear();
    }
}

impl Handler<HostCommand> for Side {
    fn capsule(&mut self, _: &mut PollGroup<HostCommand>, req: ReqId) {
        tracing::warn!(?req, "a host group made a request from a capsule");
    }
    fn chain_done(
        &mut self,
        _: &mut PollGroup<HostCommand>,
        req: ReqId,
        _: WrKind,
        status: WcStatus,
    ) {
        tracing::warn!(
            ?req,
            ?status,
            "unexpected chain completion on a host request"
        );
    }
    fn qpair_event(&mut self, _: &mut PollGroup<HostCommand>, _: u32, _: u64, ev: QpairEvent) {
        match ev {
            QpairEvent::Active => self.active = true,
            QpairEvent::Draining(reason) => self.lose(format!("qpair draining: {reason:?}")),
            other => self.lose(format!("qpair {other:?}")),
        }
    }
    fn aborted(&mut self, pg: &mut PollGroup<HostCommand>, req: ReqId) {
        // The qpair is gone; the target can no longer touch the region for this command.
        pg.finish(req);
    }
    fn buffers_ready(&mut self, _: &mut PollGroup<HostCommand>, _: ReqId) {}

    fn response(&mut self, pg: &mut PollGroup<HostCommand>, qp_num: u32, capsule: &[u8]) {
        let cqe = match Cqe::decode(capsule) {
            Ok(c) => c,
            Err(e) => {
                self.lose(format!("qpair {qp_num:#x}: malformed response: {e}"));
                return;
            }
        };
        let Some(&req) = self.by_cid.get(&cqe.cid) else {
            // A response for no command in flight (duplicate or stale): a broken target.
            tracing::warn!(
                qid = self.qid,
                cid = cqe.cid,
                "response for no command in flight"
            );
            return;
        };
        let invalidated = pg.response_invalidated_rkey();
        if let Some(r) = pg.request_mut(req) {
            if r.user.cqe.is_some() {
                tracing::warn!(
                    qid = self.qid,
                    cid = cqe.cid,
                    "second response for a command"
                );
                return;
            }
            r.user.cqe = Some(cqe);
            // The target is done with the window once it answers.
            if let (Some(w), Some(Some(windows))) = (r.user.window.take(), self.windows.as_mut()) {
                windows.answered(w, invalidated);
            }
        }
        if let Err(e) = pg.response_received(req) {
            tracing::warn!(qid = self.qid, cid = cqe.cid, %e, "response_received");
        }
    }

    fn request_complete(&mut self, pg: &mut PollGroup<HostCommand>, req: ReqId, status: WcStatus) {
        let command = pg
            .request_mut(req)
            .map(|r| std::mem::take(&mut r.user))
            .unwrap_or_default();
        pg.finish(req);
        if status != WcStatus::Success {
            self.lose(format!("command SEND failed: {status:?}"));
            return;
        }
        let Some(cqe) = command.cqe else {
            self.lose("request completed without a response".into());
            return;
        };
        self.by_cid.remove(&cqe.cid);
        if let Some(range) = command.data {
            if let Err(e) = self.mr.read_at(range.start, &mut self.host[range]) {
                self.lose(format!("copy from the registered region: {e}"));
                return;
            }
        }
        if self.lost.is_none() {
            self.done.push_back(cqe);
        }
    }

    fn group_failed(&mut self, _: &mut PollGroup<HostCommand>, error: &str) {
        self.lose(format!("poll group failed: {error}"));
    }
}

/// A connected queue over RDMA (see the module documentation).
pub struct RdmaQueue {
    pub(super) pg: PollGroup<HostCommand>,
    pub(super) side: Side,
    pub(super) channel: CmChannel,
    pub(super) qp_num: u32,
    pub(super) handle: QpairHandle,
    pub(super) depth: u16,
    pub(super) in_capsule_limit: usize,
    pub(super) disconnected: bool,
    /// Polls that found nothing (paces the CM channel checks).
    pub(super) idle_polls: u32,
}

/// Idle polls between two looks at the CM channel.
const CM_CHECK_EVERY: u32 = 64;

// The poll group and CM channel are driven by one thread at a time (the owning reactor); the
// queue moves between threads only whole.
const _: () = {
    const fn send<T: Send>() {}
    send::<RdmaQueue>();
};

impl RdmaQueue {
    fn check(&self) -> Result<(), QueueError> {
        match &self.side.lost {
            Some(why) => Err(QueueError::Disconnected(format!(
                "queue {}: {why}",
                self.side.qid
            ))),
            None => Ok(()),
        }
    }

    /// CM events for this queue's connection (peer disconnect).
    fn cm_events(&mut self) {
        loop {
            match self.channel.poll_event() {
                Ok(Some(ev)) => {
                    if matches!(
                        ev.kind,
                        CmEventKind::Disconnected | CmEventKind::DeviceRemoval
                    ) {
                        self.side.lose(format!("{:?}", ev.kind));
                    }
                    self.pg
                        .handle_cm_event(&mut self.side, self.qp_num, &ev.kind);
                }
                Ok(None) => return,
                Err(e) => {
                    self.side.lose(format!("CM channel: {e}"));
                    return;
                }
            }
        }
    }

    /// Region range a keyed SGL of `sqe` names (None: no region data for this command).
    fn keyed_range(&self, sqe: &Sqe) -> Result<Option<Range<usize>>, QueueError> {
        let Ok(SglDescriptor::KeyedDataBlock {
            address,
            length,
            key,
            ..
        }) = sqe.sgl1()
        else {
            return Ok(None);
        };
        let length = length.get() as usize;
        if length == 0 {
            return Ok(None);
        }
        if key != self.side.mr.rkey() {
            return match self.side.windows.as_ref().and_then(Option::as_ref) {
                Some(w) => w
                    .prepared_range(key)
                    .filter(|r| r.len() == length)
                    .map(Some)
                    .ok_or_else(|| {
                        QueueError::Invalid(format!("SGL key {key:#x} names no bound window"))
                    }),
                None => Err(QueueError::Invalid(format!(
                    "SGL key {key:#x} is not the region's"
                ))),
            };
        }
        let start = address
            .checked_sub(self.side.mr.addr())
            .map(|s| s as usize)
            .filter(|s| {
                s.checked_add(length)
                    .is_some_and(|e| e <= self.side.host.len())
            })
            .ok_or_else(|| {
                QueueError::Invalid(format!("SGL {address:#x}+{length} outside the region"))
            })?;
        Ok(Some(start..start + length))
    }
}

/// The key of a keyed SGL1, if it is one.
fn sgl_key(sqe: &Sqe) -> Option<u32> {
    match sqe.sgl1() {
        Ok(SglDescriptor::KeyedDataBlock { key, length, .. }) if length.get() > 0 => Some(key),
        _ => None,
    }
}

/// Which ways a command's data moves: (host to target, target to host), from the opcode's
/// data-transfer bits (1:0). Fabrics commands and opcodes that claim no data but carry a
/// keyed SGL anyway copy both ways: a wasted copy, never a lost byte.
fn directions(sqe: &Sqe) -> (bool, bool) {
    const FABRICS: u8 = 0x7f;
    match sqe.opcode & 3 {
        _ if sqe.opcode == FABRICS => (true, true),
        0b01 => (true, false),
        0b10 => (false, true),
        _ => (true, true),
    }
}

impl HostQueue for RdmaQueue {
    fn qid(&self) -> u16 {
        self.side.qid
    }
    fn depth(&self) -> u16 {
        self.depth
    }
    fn region(&self) -> DataRegion {
        DataRegion {
            address: self.side.mr.addr(),
            key: self.side.mr.rkey(),
            len: self.side.host.len(),
        }
    }
    fn region_bytes(&self) -> &[u8] {
        &self.side.host
    }
    fn region_bytes_mut(&mut self) -> &mut [u8] {
        &mut self.side.host
    }

    fn submit(&mut self, sqe: &Sqe, in_capsule: Option<Range<usize>>) -> Result<(), QueueError> {
        self.check()?;
        let inline = in_capsule.unwrap_or(0..0);
        if inline.start > inline.end || inline.end > self.side.host.len() {
            return Err(QueueError::Invalid(format!("in-capsule range {inline:?}")));
        }
        if inline.len() > self.in_capsule_limit {
            return Err(QueueError::Invalid(format!(
                "in-capsule data {} bytes > {}",
                inline.len(),
                self.in_capsule_limit
            )));
        }
        if self.side.by_cid.contains_key(&sqe.cid) {
            return Err(QueueError::Invalid(format!(
                "CID {} already in flight",
                sqe.cid
            )));
        }
        let region = self.keyed_range(sqe)?;
        let (to_target, from_target) = directions(sqe);
        let data = region.clone().filter(|_| from_target);
        let req = match self.pg.submit(self.handle) {
            Ok(r) => r,
            Err(TransportError::QueueFull(_)) => return Err(QueueError::Full),
            Err(e) => {
                self.side.lose(format!("submit: {e}"));
                return self.check();
            }
        };
        let capsule_len = 64 + inline.len();
        match self.pg.alloc_buffers(req, capsule_len as u32) {
            Ok(BufferGrant::Ready) => {}
            Ok(BufferGrant::Waiting) | Err(_) => {
                // Sized for the depth: only a depth beyond the group's buffers gets here.
                self.pg.finish(req);
                return Err(QueueError::Full);
            }
        }
        if let Some(range) = region.filter(|_| to_target) {
            if let Err(e) = self.side.mr.write_at(range.start, &self.side.host[range]) {
                self.pg.finish(req);
                return Err(QueueError::Invalid(format!("copy to the region: {e}")));
            }
        }
        {
            let buffer = self.pg.buffer_mut(req, 0);
            buffer[..64].copy_from_slice(&sqe.to_bytes());
            buffer[64..capsule_len].copy_from_slice(&self.side.host[inline]);
        }
        // A window named by the SGL is bound in the same chain, ahead of the SEND (after a
        // local invalidate when the target left its previous key valid).
        let window = match sgl_key(sqe).filter(|k| *k != self.side.mr.rkey()) {
            Some(key) => self
                .side
                .windows
                .as_mut()
                .and_then(Option::as_mut)
                .and_then(|w| w.take(key)),
            None => None,
        };
        if let Some(r) = self.pg.request_mut(req) {
            r.user = HostCommand {
                data,
                cqe: None,
                window: window.as_ref().map(|(i, _)| *i),
            };
        }
        let mut sge = [Sge::default(); 1];
        self.pg.buffer_sges(req, capsule_len as u32, &mut sge);
        let send = ChainWr {
            op: SendOp::Send,
            sges: &sge,
            inline: false,
        };
        let key_op = |op: SendOp| ChainWr {
            op,
            sges: &[],
            inline: false,
        };
        let posted = match &window {
            None => self.pg.post_chain(req, &[send], false),
            Some((
                _,
                Posting {
                    invalidate: None,
                    bind,
                    ..
                },
            )) => self.pg.post_chain(req, &[key_op(*bind), send], false),
            Some((
                _,
                Posting {
                    invalidate: Some(inv),
                    bind,
                    ..
                },
            )) => self
                .pg
                .post_chain(req, &[key_op(*inv), key_op(*bind), send], false),
        };
        if let Err(e) = posted {
            if let (Some((i, p)), Some(Some(w))) = (&window, self.side.windows.as_mut()) {
                let stale = match p.invalidate {
                    Some(SendOp::LocalInv { rkey }) => Some(rkey),
                    _ => None,
                };
                w.unpost(*i, stale);
            }
            self.pg.finish(req);
            self.side.lose(format!("post: {e}"));
            return self.check();
        }
        self.side.by_cid.insert(sqe.cid, req);
        Ok(())
    }

    fn poll(&mut self, out: &mut [Cqe]) -> Result<usize, QueueError> {
        // Report what is already reaped first: a CQE taken from the CQ is never dropped.
        if self.side.done.is_empty() {
            self.check()?;
            if let Err(e) = self.pg.poll(&mut self.side) {
                self.side.lose(format!("poll: {e}"));
            }
            // Idle polls look at the CM channel now and then (a syscall on verbs): a peer's
            // disconnect usually shows first as flushed work on the CQ anyway.
            if self.side.done.is_empty() {
                self.idle_polls = self.idle_polls.wrapping_add(1);
                if self.idle_polls % CM_CHECK_EVERY == 0 {
                    self.cm_events();
                }
            }
        }
        self.check()?;
        let n = out.len().min(self.side.done.len());
        for (slot, cqe) in out.iter_mut().zip(self.side.done.drain(..n)) {
            *slot = cqe;
        }
        Ok(n)
    }

    fn bind_window(&mut self, range: Range<usize>) -> Result<Option<(u64, u32)>, QueueError> {
        self.check()?;
        if range.start > range.end || range.end > self.side.host.len() {
            return Err(QueueError::Invalid(format!(
                "window {range:?} outside the region"
            )));
        }
        let mr = &self.side.mr;
        let windows = self.side.windows.get_or_insert_with(|| {
            // Control path, once per queue: as many windows as commands may be in flight.
            if mr.access().contains(Access::MW_BIND) {
                Windows::new(self.pg.pd(), usize::from(self.depth))
            } else {
                None
            }
        });
        let Some(windows) = windows.as_mut() else {
            return Ok(None);
        };
        let address = mr.addr() + range.start as u64;
        match windows.prepare(mr, range) {
            Some(rkey) => Ok(Some((address, rkey))),
            None => Err(QueueError::Full),
        }
    }

    fn is_connected(&self) -> bool {
        self.side.lost.is_none() && !self.disconnected
    }

    fn disconnect(&mut self) {
        if self.disconnected {
            return;
        }
        self.disconnected = true;
        self.side.lose("disconnected by the host".into());
        self.pg.disconnect(&mut self.side, self.qp_num);
        // Let the drain run to its end so the QP and its CM id go before the group does.
        let deadline = std::time::Instant::now() + self.pg.config().drain_timeout * 2;
        while self.pg.qpair_count() > 0 && std::time::Instant::now() < deadline {
            if self.pg.poll(&mut self.side).is_err() {
                break;
            }
            while let Ok(Some(ev)) = self.channel.poll_event() {
                self.pg
                    .handle_cm_event(&mut self.side, self.qp_num, &ev.kind);
            }
            std::thread::yield_now();
        }
    }
}

impl Drop for RdmaQueue {
    fn drop(&mut self) {
        self.disconnect();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_directions_follow_the_opcode() {
        let dir = |opcode| directions(&Sqe::new(opcode, 1, 1));
        assert_eq!(dir(0x01), (true, false), "Write");
        assert_eq!(dir(0x02), (false, true), "Read");
        assert_eq!(dir(0x06), (false, true), "Identify");
        assert_eq!(dir(0x09), (true, false), "Set Features");
        assert_eq!(dir(0x7f), (true, true), "Fabrics");
        assert_eq!(dir(0x00), (true, true), "no data claimed");
    }
}
