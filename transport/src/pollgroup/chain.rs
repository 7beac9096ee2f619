//! A request's chain of send-side work requests (RDMA READs, or RDMA WRITEs + the response
//! SEND, or a SEND alone), stored in the request so that it can wait for send-queue room and be
//! posted later. Each WR is written once, here; posting builds the provider's `SendWr` list by
//! borrowing this storage.
//!
//! Accounting: `posted` WRs reached the QP, `retired` of them are known to be done. A
//! completion for position p retires every WR up to p (see `wrid`); WRs a post refused never
//! reached the QP and only set the status. The chain is over when `retired == posted`; its
//! status is the first error seen.

use arrayvec::ArrayVec;

use crate::error::{Result, TransportError};
use crate::types::{SendFlags, SendOp, SendWr, Sge, WcStatus};

use super::wrid::{self, WrKind};

/// Most WRs in one chain: up to 16 keyed SGL descriptors (NVMe-oF MSDBD) each needing its own
/// RDMA READ or WRITE, plus the response SEND.
pub const MAX_CHAIN_WRS: usize = 17;
/// Most SGEs one chain holds in all (its WRs share them): a 128 KiB transfer in 4 KiB io units
/// is 32.
pub const MAX_CHAIN_SGES: usize = 32;
/// Most SGEs one WR carries (the send queue's max_send_sge), on a device that allows as many.
pub const MAX_WR_SGES: usize = 16;

/// The SGEs one work request may carry on a poll group's QPs: the device's limits, at most
/// [`MAX_WR_SGES`]. A READ may carry fewer than a WRITE or SEND (`max_sge_rd`: 1 on iWARP,
/// whose READ lands in one local buffer; Intel's irdma allows 13 of anything). A transfer
/// needing more is cut into more work requests by the layer above.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SgeLimits {
    /// SEND and RDMA WRITE (the QP's max_send_sge).
    pub send: usize,
    /// RDMA READ.
    pub read: usize,
}

impl SgeLimits {
    /// A device's `max_sge` and `max_sge_rd` as limits: each at most [`MAX_WR_SGES`], the READ
    /// one at most the other (a READ is on the send queue too). A device that reports 0 gets
    /// 1, which every device allows.
    pub fn of_device(max_sge: u32, max_sge_rd: u32) -> SgeLimits {
        let clamp = |n: u32| (n as usize).clamp(1, MAX_WR_SGES);
        let send = clamp(max_sge);
        SgeLimits {
            send,
            read: clamp(max_sge_rd).min(send),
        }
    }

    /// The SGEs a WR of `op` may carry.
    pub fn for_op(self, op: &SendOp) -> usize {
        match op {
            SendOp::RdmaRead { .. } => self.read,
            _ => self.send,
        }
    }
}

impl Default for SgeLimits {
    /// [`MAX_WR_SGES`] of each.
    fn default() -> SgeLimits {
        SgeLimits {
            send: MAX_WR_SGES,
            read: MAX_WR_SGES,
        }
    }
}

const _: () = assert!(MAX_CHAIN_WRS as u32 <= wrid::MAX_POSITION);

/// One work request of a chain, as the layer above describes it. Its kind (READ, WRITE, SEND)
/// follows from `op`.
#[derive(Clone, Copy, Debug)]
pub struct ChainWr<'a> {
    pub op: SendOp,
    pub sges: &'a [Sge],
    /// Copy the payload into the WR when it fits the QP's inline limit (small SENDs).
    pub inline: bool,
}

/// The kind a WR with `op` is accounted as.
pub fn kind_of(op: &SendOp) -> WrKind {
    match op {
        SendOp::RdmaRead { .. } => WrKind::Read,
        SendOp::RdmaWrite { .. } | SendOp::RdmaWriteWithImm { .. } => WrKind::Write,
        SendOp::Send | SendOp::SendWithImm { .. } | SendOp::SendWithInv { .. } => WrKind::Send,
        SendOp::BindMw { .. } | SendOp::LocalInv { .. } => WrKind::KeyOp,
    }
}

#[derive(Clone, Copy, Debug)]
struct Entry {
    kind: WrKind,
    op: SendOp,
    flags: SendFlags,
    first_sge: u8,
    nsge: u8,
}

const EMPTY: Entry = Entry {
    kind: WrKind::Send,
    op: SendOp::Send,
    flags: SendFlags::empty(),
    first_sge: 0,
    nsge: 0,
};

pub(crate) struct Chain {
    wrs: [Entry; MAX_CHAIN_WRS],
    sges: [Sge; MAX_CHAIN_SGES],
    len: u8,
    reads: u8,
    posted: u8,
    retired: u8,
    status: WcStatus,
}

/// WRs (and RDMA READs among them) a step of accounting took off the QP's send queue.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Retired {
    pub wrs: u32,
    pub reads: u32,
}

impl Chain {
    pub(crate) fn new() -> Chain {
        Chain {
            wrs: [EMPTY; MAX_CHAIN_WRS],
            sges: [Sge::default(); MAX_CHAIN_SGES],
            len: 0,
            reads: 0,
            posted: 0,
            retired: 0,
            status: WcStatus::Success,
        }
    }

    /// Writes a new chain; the last WR is signaled, the others are not. Checked whole before
    /// anything is written (a refused chain leaves the old one as it was); then one pass
    /// writes it (it runs once or twice per NVMe I/O).
    pub(crate) fn set(
        &mut self,
        chain: &[ChainWr<'_>],
        max_inline: u32,
        limits: SgeLimits,
    ) -> Result<()> {
        let bad = |m: String| Err(TransportError::InvalidArgument(m));
        if chain.is_empty() || chain.len() > MAX_CHAIN_WRS {
            return bad(format!("a chain has 1..={MAX_CHAIN_WRS} work requests"));
        }
        let mut total = 0usize;
        for wr in chain {
            let n = wr.sges.len();
            total += n;
            // The READ limit is the lower: only a WR above it needs its kind looked at.
            if n > limits.read && n > limits.for_op(&wr.op) {
                return bad(format!(
                    "{n} SGEs in one work request: the device allows {} ({} for an RDMA READ)",
                    limits.send, limits.read
                ));
            }
        }
        if total > MAX_CHAIN_SGES {
            return bad(format!("a chain holds at most {MAX_CHAIN_SGES} SGEs"));
        }
        let mut at = 0usize;
        let mut reads = 0u8;
        for (i, (wr, entry)) in chain.iter().zip(self.wrs.iter_mut()).enumerate() {
            let kind = kind_of(&wr.op);
            reads += (kind == WrKind::Read) as u8;
            let mut flags = if i + 1 == chain.len() {
                SendFlags::SIGNALED
            } else {
                SendFlags::empty()
            };
            // The payload is summed only for a WR that may go inline (the response SEND).
            if wr.inline
                && kind != WrKind::Read
                && wr.sges.iter().map(|s| s.length as u64).sum::<u64>() <= max_inline as u64
            {
                flags |= SendFlags::INLINE;
            }
            for (slot, sge) in self.sges[at..].iter_mut().zip(wr.sges) {
                *slot = *sge;
            }
            *entry = Entry {
                kind,
                op: wr.op,
                flags,
                first_sge: at as u8,
                nsge: wr.sges.len() as u8,
            };
            at += wr.sges.len();
        }
        self.len = chain.len() as u8;
        self.reads = reads;
        self.posted = 0;
        self.retired = 0;
        self.status = WcStatus::Success;
        Ok(())
    }

    pub(crate) fn len(&self) -> u32 {
        self.len as u32
    }
    pub(crate) fn reads(&self) -> u32 {
        self.reads as u32
    }
    pub(crate) fn status(&self) -> WcStatus {
        self.status
    }
    pub(crate) fn last_kind(&self) -> WrKind {
        self.wrs[self.len.saturating_sub(1) as usize].kind
    }
    pub(crate) fn kind_at(&self, position: u8) -> Option<WrKind> {
        (position < self.posted).then(|| self.wrs[position as usize].kind)
    }
    /// Every WR that reached the QP is accounted for.
    pub(crate) fn is_over(&self) -> bool {
        self.retired == self.posted
    }

    /// Appends the provider's WR list for the whole chain to `out`, borrowing this storage
    /// (an ArrayVec: the caller's batch is not initialised first); returns how many were
    /// appended (fewer only when `out` is full, which the caller's room check prevents).
    pub(crate) fn work_requests<'a, const N: usize>(
        &'a self,
        generation: u32,
        index: u32,
        out: &mut ArrayVec<SendWr<'a>, N>,
    ) -> usize {
        let before = out.len();
        for (i, e) in self.wrs[..self.len as usize].iter().enumerate() {
            let wr = SendWr {
                wr_id: wrid::encode(e.kind, i as u8, generation, index),
                op: e.op,
                sges: &self.sges[e.first_sge as usize..(e.first_sge + e.nsge) as usize],
                flags: e.flags,
            };
            if out.try_push(wr).is_err() {
                break;
            }
        }
        out.len() - before
    }

    /// The whole chain was handed to the QP.
    pub(crate) fn all_posted(&mut self) {
        self.posted = self.len;
    }

    /// A post refused WR `position` and everything after it: those never reached the QP, so
    /// they fail here with `status` (like a flush) and are returned, to give their room back.
    pub(crate) fn refused_from(&mut self, position: u8, status: WcStatus) -> Retired {
        let from = position.min(self.len);
        let gone = &self.wrs[from as usize..self.len as usize];
        let out = Retired {
            wrs: gone.len() as u32,
            reads: gone.iter().filter(|e| e.kind == WrKind::Read).count() as u32,
        };
        self.posted = from;
        self.retired = self.retired.min(from);
        if self.status == WcStatus::Success {
            self.status = status;
        }
        out
    }

    /// A completion for `position` with `status`: WRs up to it are done.
    #[inline]
    pub(crate) fn retire_through(&mut self, position: u8, status: WcStatus) -> Retired {
        if status != WcStatus::Success && self.status == WcStatus::Success {
            self.status = status;
        }
        self.retire_to((position + 1).min(self.posted))
    }

    /// The drain marker came back: every posted WR is done (silently, where nothing said
    /// otherwise).
    pub(crate) fn retire_all(&mut self) -> Retired {
        self.retire_to(self.posted)
    }

    fn retire_to(&mut self, to: u8) -> Retired {
        if to <= self.retired {
            return Retired::default();
        }
        let span = &self.wrs[self.retired as usize..to as usize];
        let out = Retired {
            wrs: span.len() as u32,
            reads: span.iter().filter(|e| e.kind == WrKind::Read).count() as u32,
        };
        self.retired = to;
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sge(n: u64) -> Sge {
        Sge {
            addr: n,
            length: 8,
            lkey: 1,
        }
    }

    fn read() -> SendOp {
        SendOp::RdmaRead {
            remote_addr: 0,
            rkey: 1,
        }
    }

    fn write() -> SendOp {
        SendOp::RdmaWrite {
            remote_addr: 0,
            rkey: 1,
        }
    }

    fn chain(ops: &[SendOp]) -> Chain {
        let s = [sge(1), sge(2)];
        let wrs: Vec<ChainWr<'_>> = ops
            .iter()
            .map(|&op| ChainWr {
                op,
                sges: &s,
                inline: false,
            })
            .collect();
        let mut c = Chain::new();
        c.set(&wrs, 0, SgeLimits::default()).unwrap();
        c.all_posted();
        c
    }

    #[test]
    fn only_the_last_wr_is_signaled_and_kinds_follow_the_op() {
        let c = chain(&[write(), write(), SendOp::Send]);
        let mut out = ArrayVec::<SendWr, MAX_CHAIN_WRS>::new();
        let n = c.work_requests(5, 9, &mut out);
        assert_eq!(n, 3);
        let ids: Vec<_> = out[..n]
            .iter()
            .map(|w| wrid::decode(w.wr_id).unwrap())
            .collect();
        assert_eq!(
            ids.iter().map(|i| (i.kind, i.position)).collect::<Vec<_>>(),
            vec![(WrKind::Write, 0), (WrKind::Write, 1), (WrKind::Send, 2)]
        );
        assert!(ids.iter().all(|i| (i.generation, i.index) == (5, 9)));
        assert!(!out[0].flags.contains(SendFlags::SIGNALED));
        assert!(out[2].flags.contains(SendFlags::SIGNALED));
        assert_eq!(out[1].sges, &[sge(1), sge(2)]);
    }

    /// WRITE succeeds silently, SEND fails: the one error completion retires both.
    #[test]
    fn an_error_on_the_send_retires_the_silent_write_too() {
        let mut c = chain(&[write(), SendOp::Send]);
        let r = c.retire_through(1, WcStatus::RemAccessErr);
        assert_eq!(r, Retired { wrs: 2, reads: 0 });
        assert!(c.is_over());
        assert_eq!(c.status(), WcStatus::RemAccessErr);
    }

    /// READ chains failing at every position: every WR retired exactly once.
    #[test]
    fn errors_at_every_position_retire_every_wr_once() {
        for fail_at in 0..4u8 {
            let mut c = chain(&[read(), read(), read(), read()]);
            let mut total = Retired::default();
            for p in fail_at..4 {
                let status = if p == fail_at {
                    WcStatus::RemAccessErr
                } else {
                    WcStatus::WrFlushErr
                };
                let r = c.retire_through(p, status);
                total.wrs += r.wrs;
                total.reads += r.reads;
            }
            assert_eq!(total, Retired { wrs: 4, reads: 4 }, "fail at {fail_at}");
            assert!(c.is_over());
            assert_eq!(c.status(), WcStatus::RemAccessErr);
        }
    }

    #[test]
    fn a_partially_posted_chain_is_over_when_its_posted_wrs_are() {
        let mut c = chain(&[read(), read(), SendOp::Send]);
        assert_eq!(
            c.refused_from(1, WcStatus::GeneralErr),
            Retired { wrs: 2, reads: 1 }
        );
        assert!(!c.is_over());
        // The QP went to ERR; the drain marker says the one posted READ is done.
        assert_eq!(c.retire_all(), Retired { wrs: 1, reads: 1 });
        assert!(c.is_over());
        assert_eq!(c.status(), WcStatus::GeneralErr);
        // Refused at 0: nothing reached the QP, over at once.
        let mut c = chain(&[SendOp::Send]);
        c.refused_from(0, WcStatus::GeneralErr);
        assert!(c.is_over());
    }

    #[test]
    fn limits_are_checked() {
        let all = SgeLimits::default();
        let s = [sge(0); MAX_WR_SGES + 1];
        let mut c = Chain::new();
        assert!(c.set(&[], 0, all).is_err());
        let big = ChainWr {
            op: SendOp::Send,
            sges: &s,
            inline: false,
        };
        assert!(c.set(&[big], 0, all).is_err());
        let ok = ChainWr {
            op: SendOp::Send,
            sges: &s[..1],
            inline: false,
        };
        assert!(c.set(&[ok; MAX_CHAIN_WRS + 1], 0, all).is_err());
        assert!(c.set(&[ok; MAX_CHAIN_WRS], 0, all).is_ok());
    }

    #[test]
    fn a_device_narrower_than_sixteen_sges() {
        let narrow = SgeLimits::of_device(4, 1);
        assert_eq!((narrow.send, narrow.read), (4, 1));
        assert_eq!(SgeLimits::of_device(32, 30), SgeLimits::default());
        assert_eq!(SgeLimits::of_device(0, 0), SgeLimits { send: 1, read: 1 });
        assert_eq!(SgeLimits::of_device(2, 8), SgeLimits { send: 2, read: 2 });
        let s = [sge(0); 5];
        let wr = |op: SendOp, n: usize| ChainWr {
            op,
            sges: &s[..n],
            inline: false,
        };
        let read = SendOp::RdmaRead {
            remote_addr: 0,
            rkey: 1,
        };
        let write = SendOp::RdmaWrite {
            remote_addr: 0,
            rkey: 1,
        };
        let mut c = Chain::new();
        assert!(c.set(&[wr(read, 1), wr(read, 1)], 0, narrow).is_ok());
        c = Chain::new();
        assert!(c.set(&[wr(read, 2)], 0, narrow).is_err());
        assert!(
            c.set(&[wr(write, 4), wr(SendOp::Send, 1)], 0, narrow)
                .is_ok()
        );
        c = Chain::new();
        assert!(c.set(&[wr(write, 5)], 0, narrow).is_err());
        assert!(c.set(&[wr(SendOp::Send, 5)], 0, narrow).is_err());
    }
}
