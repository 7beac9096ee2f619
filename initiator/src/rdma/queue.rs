//! One NVMe-oF queue over RDMA: a qpair on its reactor's shared host poll group
//! ([`super::group`]), its registered data region, and the matching of responses to commands
//! by CID (in its [`Side`] of the group).
//!
//! Life of a command: `submit` refuses a CID that is in flight or whose CQE waits to be polled
//! (the consumer could not tell the two completions apart), takes a request object
//! (`PollGroup::submit`), writes the SQE into its 64-byte buffer, posts the SEND (any in-capsule
//! data as a second SGE over the region), and files the request under its CID. The SEND goes on
//! the wire at the end of the group's next poll, or at once on `flush` (the end of a submit
//! batch). A response is routed by the group to this queue's side, matched by CID and handed to
//! the group (`response_received`); the group calls `request_complete` once the SEND completed
//! too (or, for a SEND of the SQE alone that went without a completion of its own, at the
//! response: the request object, whose capsule slot the device may still read, is held until a
//! later completion; for a command whose per-I/O window the target left valid, after the host's
//! LOCAL_INV of it), and only then is the CQE queued for `poll`. A response that is not exactly
//! a CQE, that names a CID no command in flight has or one answered already (as the Linux host
//! resets on a command ID it does not know), or that invalidates a key other than its command's
//! window, like a qpair that drains (peer disconnect, error, flush), makes this queue lost, and
//! only this one: `poll` and `submit` report `Disconnected` from then on and queued CQEs are
//! dropped with the connection (the initiator fails what was in flight).
//!
//! Polling: a queue polls the group's CQ only when no other queue did since its own last poll,
//! so a reactor going over its queues polls the CQ once per pass; what a poll reaps for other
//! queues waits in their sides.
//!
//! Host memory: the initiator works on a plain host copy of the region (`host`); the
//! registered region (`mr`) is what the target reads and writes. A command naming a range of
//! the region by keyed SGL copies that range host -> registered at submit (not at
//! `submit_lazy`, for data nobody filled: the target then gets what the region holds) and registered ->
//! host when its CQE is taken by `poll`, or, after `poll_lazy`, when the consumer `fetch`es
//! it (`Mr::write_at` / `read_at`: race-free copies, no `unsafe`). The target touches only the
//! ranges of commands in flight, and the initiator leaves those alone until their CQE; a CQE
//! comes only once the target is done with the range, and the range is not reused before the
//! consumer fetched it (the `poll_lazy` contract, kept by `IoQueue`'s borrow-scoped
//! `ReadData`), so a copy, eager or late, reads exactly that command's data. A borrow of the
//! registered memory itself would let safe code alias bytes the peer writes concurrently; the
//! copy is the price of keeping this crate free of `unsafe`, and skipping it is what a
//! consumer that never reads the data (nvmf-perf without --verify) gains from `poll_lazy`.

use std::ops::Range;
use std::sync::{Arc, Mutex};

use nvmf_protocol::{Cqe, SglDescriptor, Sqe};
use nvmf_transport::pollgroup::{ChainWr, QpairHandle};
use nvmf_transport::{Access, CmChannel, CmEventKind, Mr, SendOp, Sge, TransportError};

use super::group::{GroupHandle, HostGroup, lock};
use super::side::{HostCommand, Side};
use super::windows::Windows;
use crate::queue::{CompletionGroup, DataRegion, HostQueue, QueueError};

/// A connected queue over RDMA (see the module documentation).
pub struct RdmaQueue {
    pub(super) group: Arc<Mutex<HostGroup>>,
    /// This queue's token in the group's router.
    pub(super) token: u64,
    pub(super) mr: Mr,
    pub(super) host: Vec<u8>,
    pub(super) qid: u16,
    pub(super) channel: CmChannel,
    pub(super) qp_num: u32,
    pub(super) handle: QpairHandle,
    pub(super) depth: u16,
    pub(super) in_capsule_limit: usize,
    pub(super) disconnected: bool,
    /// Mirror of the side's loss (for `is_connected`, which cannot lock).
    pub(super) lost: Option<String>,
    /// The group's poll count when this queue last looked.
    pub(super) seen_polls: u64,
    /// Polls that found nothing (paces the CM channel checks).
    pub(super) idle_polls: u32,
}

/// Idle polls between two looks at the CM channel.
const CM_CHECK_EVERY: u32 = 64;

// The CM channel is driven by one thread at a time (the owning reactor); the group is behind
// its mutex; the queue moves between threads only whole.
const _: () = {
    const fn send<T: Send>() {}
    send::<RdmaQueue>();
};

impl RdmaQueue {
    /// The side's loss, mirrored here; Err once lost.
    fn check_side(&mut self, side: Option<&Side>) -> Result<(), QueueError> {
        if self.lost.is_none() {
            self.lost = match side {
                Some(s) => s.lost.clone(),
                None => Some("left the poll group".into()),
            };
        }
        self.check()
    }

    /// Mirrors a loss the group reported (`why`) unless one is known already; Err.
    fn lose(&mut self, why: String) -> Result<(), QueueError> {
        if self.lost.is_none() {
            self.lost = Some(why);
        }
        self.check()
    }

    fn check(&self) -> Result<(), QueueError> {
        match &self.lost {
            Some(why) => Err(QueueError::Disconnected(format!(
                "queue {}: {why}",
                self.qid
            ))),
            None => Ok(()),
        }
    }

    /// Region range a keyed SGL (address, length, key) names. Inlined: on the submit path.
    #[inline(always)]
    fn keyed_range(
        &self,
        side: &Side,
        (address, length, key): KeyedSgl,
    ) -> Result<Range<usize>, QueueError> {
        if key != self.mr.rkey() {
            return match side.windows.as_ref().and_then(Option::as_ref) {
                Some(w) => w
                    .prepared_range(key)
                    .filter(|r| r.len() == length)
                    .ok_or_else(|| {
                        QueueError::Invalid(format!("SGL key {key:#x} names no bound window"))
                    }),
                None => Err(QueueError::Invalid(format!(
                    "SGL key {key:#x} is not the region's"
                ))),
            };
        }
        let start = address
            .checked_sub(self.mr.addr())
            .map(|s| s as usize)
            .filter(|s| s.checked_add(length).is_some_and(|e| e <= self.host.len()))
            .ok_or_else(|| {
                QueueError::Invalid(format!("SGL {address:#x}+{length} outside the region"))
            })?;
        Ok(start..start + length)
    }

    /// Polls under the group's lock, through disjoint borrows of the queue's fields (no `Arc`
    /// clone per poll). `copy`: bring each finished read's data into the host view (else
    /// the consumer `fetch`es what it reads). Err: the queue is lost, for that reason.
    fn poll_locked(&mut self, out: &mut [Cqe], copy: bool) -> Result<usize, String> {
        let RdmaQueue {
            group,
            token,
            mr,
            host,
            channel,
            qp_num,
            seen_polls,
            idle_polls,
            ..
        } = self;
        let mut g = lock(group);
        let empty = g
            .router
            .side(*token)
            .is_none_or(|side| side.done.is_empty());
        // Report what is already reaped first: a CQE taken from the CQ is never dropped. The CQ
        // is polled only when no other queue of the group did since this one last looked.
        if empty && g.polls == *seen_polls {
            g.poll();
            let idle = g
                .router
                .side(*token)
                .is_none_or(|side| side.done.is_empty());
            // Idle polls look at the CM channel now and then (a syscall on verbs): a peer's
            // disconnect usually shows first as flushed work on the CQ anyway.
            if idle {
                *idle_polls = idle_polls.wrapping_add(1);
                if *idle_polls % CM_CHECK_EVERY == 0 {
                    cm_events(channel, *token, *qp_num, &mut g);
                }
            }
        }
        *seen_polls = g.polls;
        let Some(side) = g.router.side(*token) else {
            return Err("left the poll group".into());
        };
        if let Some(why) = &side.lost {
            return Err(why.clone());
        }
        let n = out.len().min(side.done.len());
        for slot in out[..n].iter_mut() {
            let Some((cqe, data)) = side.done.pop_front() else {
                break;
            };
            *slot = cqe;
            if let Some(range) = data.filter(|_| copy) {
                if let Err(e) = mr.read_at(range.start, &mut host[range]) {
                    side.lose(format!("copy from the registered region: {e}"));
                    return Err(side.lost.clone().unwrap_or_default());
                }
            }
        }
        if !side.done.is_empty() {
            // `out` was too short: a ready-driven poller must come back for the rest.
            g.router.note(*token);
        }
        Ok(n)
    }

    /// Submits under the group's lock. Takes `&self` so the caller locks through its own
    /// field (no `Arc` clone per command); a loss is handed back for the caller to mirror.
    /// `copy`: bring the outgoing data from the host view into the registered region (else
    /// the target gets what the region holds: `submit_lazy`).
    fn submit_locked(
        &self,
        g: &mut HostGroup,
        sqe: &Sqe,
        inline: Range<usize>,
        copy: bool,
    ) -> Result<(), Failed> {
        let token = self.token;
        let HostGroup {
            pg,
            router,
            capsules,
            ..
        } = g;
        let Some(side) = router.side(token) else {
            return Err(Failed::left_group());
        };
        if let Some(why) = &side.lost {
            return Err(Failed::Lost(why.clone()));
        }
        if side.cid_busy(sqe.cid) {
            return Err(Failed::Refused(QueueError::Invalid(format!(
                "CID {} already in flight (or its CQE not yet polled)",
                sqe.cid
            ))));
        }
        // SGL1 parsed once: the region range and the window key both come from it.
        let keyed = keyed_sgl(sqe);
        let region = keyed.map(|k| self.keyed_range(side, k)).transpose()?;
        let (to_target, from_target) = directions(sqe);
        let data = region.clone().filter(|_| from_target);
        let req = match pg.submit(self.handle) {
            Ok(r) => r,
            Err(TransportError::QueueFull(_)) => return Err(QueueError::Full.into()),
            Err(e) => return Err(Failed::lose(side, format!("submit: {e}"))),
        };
        for range in [region.filter(|_| to_target), Some(inline.clone())]
            .into_iter()
            .flatten()
            .filter(|r| !r.is_empty() && copy)
        {
            if let Err(e) = self.mr.write_at(range.start, &self.host[range]) {
                pg.finish(req);
                return Err(QueueError::Invalid(format!("copy to the region: {e}")).into());
            }
        }
        // Into the group's capsule slot of this request.
        let Some(capsule) = capsules.write(req.index(), sqe) else {
            pg.finish(req);
            return Err(QueueError::Full.into());
        };
        // A window named by the SGL is bound in the same chain, ahead of the SEND.
        let window = match keyed
            .map(|(_, _, key)| key)
            .filter(|k| *k != self.mr.rkey())
        {
            Some(key) => side
                .windows
                .as_mut()
                .and_then(Option::as_mut)
                .and_then(|w| w.take(key)),
            None => None,
        };
        if let Some(r) = pg.request_mut(req) {
            r.user = HostCommand {
                queue: token,
                data,
                cqe: None,
                window: window.as_ref().map(|(i, _)| *i),
            };
        }
        let mut sge = [capsule, Sge::default()];
        let sges = if inline.is_empty() {
            &sge[..1]
        } else {
            // In-capsule data straight from the registered region: no copy into the capsule.
            sge[1] = self.mr.sge(inline.start, inline.len() as u32);
            &sge[..2]
        };
        let send = ChainWr {
            op: SendOp::Send,
            sges,
            inline: false,
        };
        let key_op = |op: SendOp| ChainWr {
            op,
            sges: &[],
            inline: false,
        };
        let posted = match &window {
            // The SQE in the request's capsule slot only: the request owns all the SEND reads,
            // so it may go without a completion (reported at its response, the object held
            // until a later completion). In-capsule data is the consumer's region: it waits.
            None if sges.len() == 1 => pg.post_chain_owned(req, &[send], false),
            None => pg.post_chain(req, &[send], false),
            Some((_, bind)) => pg.post_chain(req, &[key_op(*bind), send], false),
        };
        if let Err(e) = posted {
            if let (Some((i, _)), Some(Some(w))) = (&window, side.windows.as_mut()) {
                w.free(*i);
            }
            pg.finish(req);
            return Err(Failed::lose(side, format!("post: {e}")));
        }
        side.by_cid.insert(sqe.cid, req);
        Ok(())
    }

    /// `submit` (`copy`) or `submit_lazy`. Inlined into both, as the one `submit` was.
    #[inline(always)]
    fn submit_with(
        &mut self,
        sqe: &Sqe,
        in_capsule: Option<Range<usize>>,
        copy: bool,
    ) -> Result<(), QueueError> {
        self.check()?;
        let inline = in_capsule.unwrap_or(0..0);
        QueueError::check_in_capsule(&inline, self.host.len(), self.in_capsule_limit)?;
        let submitted = self.submit_locked(&mut lock(&self.group), sqe, inline, copy);
        match submitted {
            Ok(()) => Ok(()),
            Err(Failed::Refused(e)) => Err(e),
            Err(Failed::Lost(why)) => self.lose(why),
        }
    }
}

/// CM events for this queue's connection (peer disconnect).
fn cm_events(channel: &CmChannel, token: u64, qp_num: u32, g: &mut HostGroup) {
    loop {
        match channel.poll_event() {
            Ok(Some(ev)) => {
                if matches!(
                    ev.kind,
                    CmEventKind::Disconnected | CmEventKind::DeviceRemoval
                ) {
                    if let Some(side) = g.router.side(token) {
                        side.lose(format!("{:?}", ev.kind));
                    }
                }
                g.pg.handle_cm_event(&mut g.router, qp_num, &ev.kind);
            }
            Ok(None) => return,
            Err(e) => {
                if let Some(side) = g.router.side(token) {
                    side.lose(format!("CM channel: {e}"));
                }
                return;
            }
        }
    }
}

/// Why a submission under the group's lock failed.
enum Failed {
    /// The queue is lost (the side's reason); the caller mirrors it and reports Disconnected.
    Lost(String),
    /// This command only.
    Refused(QueueError),
}

impl Failed {
    fn left_group() -> Failed {
        Failed::Lost("left the poll group".into())
    }

    /// Makes `side` lost for `why` and reports it.
    fn lose(side: &mut Side, why: String) -> Failed {
        side.lose(why);
        Failed::Lost(side.lost.clone().unwrap_or_default())
    }
}

impl From<QueueError> for Failed {
    fn from(e: QueueError) -> Failed {
        Failed::Refused(e)
    }
}

/// A keyed SGL's (address, length, key).
type KeyedSgl = (u64, usize, u32);

/// SGL1 when it is a keyed data block with data (None: no region data for this command).
fn keyed_sgl(sqe: &Sqe) -> Option<KeyedSgl> {
    match sqe.sgl1() {
        Ok(SglDescriptor::KeyedDataBlock {
            address,
            length,
            key,
            ..
        }) if length.get() > 0 => Some((address, length.get() as usize, key)),
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
        self.qid
    }
    fn depth(&self) -> u16 {
        self.depth
    }
    fn region(&self) -> DataRegion {
        DataRegion {
            address: self.mr.addr(),
            key: self.mr.rkey(),
            len: self.host.len(),
        }
    }
    fn region_bytes(&self) -> &[u8] {
        &self.host
    }
    fn region_bytes_mut(&mut self) -> &mut [u8] {
        &mut self.host
    }

    fn submit(&mut self, sqe: &Sqe, in_capsule: Option<Range<usize>>) -> Result<(), QueueError> {
        self.submit_with(sqe, in_capsule, true)
    }

    fn submit_lazy(
        &mut self,
        sqe: &Sqe,
        in_capsule: Option<Range<usize>>,
    ) -> Result<(), QueueError> {
        self.submit_with(sqe, in_capsule, false)
    }

    fn poll(&mut self, out: &mut [Cqe]) -> Result<usize, QueueError> {
        self.check()?;
        let polled = self.poll_locked(out, true);
        polled.or_else(|why| self.lose(why).map(|()| 0))
    }

    fn poll_lazy(&mut self, out: &mut [Cqe]) -> Result<usize, QueueError> {
        self.check()?;
        let polled = self.poll_locked(out, false);
        polled.or_else(|why| self.lose(why).map(|()| 0))
    }

    fn fetch(&mut self, range: Range<usize>) -> Result<(), QueueError> {
        // No loss check: a reported CQE means the data landed, and the region outlives the
        // connection.
        let Some(host) = self.host.get_mut(range.clone()) else {
            return Err(QueueError::Invalid(format!(
                "fetch {range:?} outside the region"
            )));
        };
        self.mr
            .read_at(range.start, host)
            .map_err(|e| QueueError::Invalid(format!("copy from the registered region: {e}")))
    }
    fn flush(&mut self) -> Result<(), QueueError> {
        self.check()?;
        let lost = {
            let mut g = lock(&self.group);
            let HostGroup { pg, router, .. } = &mut *g;
            pg.post_waiting(router);
            match router.side(self.token) {
                Some(side) => side.lost.clone(),
                None => Some("left the poll group".into()),
            }
        };
        match lost {
            Some(why) => self.lose(why),
            None => Ok(()),
        }
    }

    fn bind_window(&mut self, range: Range<usize>) -> Result<Option<(u64, u32)>, QueueError> {
        self.check()?;
        if range.start > range.end || range.end > self.host.len() {
            return Err(QueueError::Invalid(format!(
                "window {range:?} outside the region"
            )));
        }
        let group = self.group.clone();
        let mut g = lock(&group);
        let HostGroup { pg, router, .. } = &mut *g;
        let Some(side) = router.side(self.token) else {
            return self.check_side(None).map(|()| None);
        };
        let mr = &self.mr;
        let depth = usize::from(self.depth);
        let windows = side.windows.get_or_insert_with(|| {
            // Control path, once per queue: as many windows as commands may be in flight.
            if mr.access().contains(Access::MW_BIND) {
                Windows::new(pg.pd(), depth)
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
        self.lost.is_none() && !self.disconnected
    }

    fn completion_group(&self) -> Option<(Box<dyn CompletionGroup>, u64)> {
        Some((Box::new(GroupHandle(self.group.clone())), self.token))
    }

    fn disconnect(&mut self) {
        if self.disconnected {
            return;
        }
        self.disconnected = true;
        if self.lost.is_none() {
            self.lost = Some("disconnected by the host".into());
        }
        let group = self.group.clone();
        let mut g = lock(&group);
        let gone = |g: &mut HostGroup| g.router.side(self.token).is_none_or(|s| s.gone);
        if let Some(side) = g.router.side(self.token) {
            side.lose("disconnected by the host".into());
        }
        // Out of the group already (the target disconnected it, or the group failed): its
        // qp_num may name a newer queue's qpair by now, which must not be drained.
        if !gone(&mut g) {
            let HostGroup { pg, router, .. } = &mut *g;
            pg.disconnect(router, self.qp_num);
        }
        // Let the drain run to its end so the QP and its CM id go before the region does; the
        // other queues' completions reaped meanwhile wait in their sides.
        let deadline = std::time::Instant::now() + g.pg.config().drain_timeout * 2;
        while !gone(&mut g) && std::time::Instant::now() < deadline {
            g.poll();
            while let Ok(Some(ev)) = self.channel.poll_event() {
                let HostGroup { pg, router, .. } = &mut *g;
                pg.handle_cm_event(router, self.qp_num, &ev.kind);
            }
            drop(g);
            std::thread::yield_now();
            g = lock(&group);
        }
        if !gone(&mut g) {
            let HostGroup { pg, router, .. } = &mut *g;
            pg.destroy_qpair(router, self.qp_num);
        }
        g.leave(self.token);
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
