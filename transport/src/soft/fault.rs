//! Fault injection on demand: fail a QP (ERR + QP_FATAL), drop a QP's connection, delay
//! completions on a CQ, reorder completions of different QPs on a CQ (each QP's order kept),
//! and a device-fatal event.

use std::sync::Arc;
use std::time::Duration;

use super::device::DeviceInner;
use super::qp::QpShared;
use crate::error::{Result, TransportError};
use crate::types::*;

/// Injects faults into one soft device (`SoftContext::faults()`).
#[derive(Clone)]
pub struct FaultInjector {
    pub(crate) dev: Arc<DeviceInner>,
}

pub(crate) fn fail_qp(qp: &Arc<QpShared>) {
    qp.enter_err(true);
    qp.dev().raise(AsyncEventKind::QpFatal {
        qp_num: qp.qp_num(),
    });
}

impl FaultInjector {
    fn qp(&self, qp_num: u32) -> Result<Arc<QpShared>> {
        self.dev.qp(qp_num).ok_or_else(|| {
            TransportError::InvalidArgument(format!(
                "no QP {qp_num:#x} on soft device {}",
                self.dev.name()
            ))
        })
    }

    /// Move QP `qp_num` to ERR (flushing its work requests) and raise QP_FATAL.
    pub fn fail_qp(&self, qp_num: u32) -> Result<()> {
        fail_qp(&self.qp(qp_num)?);
        Ok(())
    }

    /// Cut the link of QP `qp_num`: on TCP the data connection is shut down (both sides see it
    /// drop); in-process the link is marked down. Either way outstanding and later sends on
    /// both QPs fail with RETRY_EXC_ERR and the QPs go to ERR, as when a cable is pulled.
    pub fn drop_connection(&self, qp_num: u32) -> Result<()> {
        let qp = self.qp(qp_num)?;
        match qp.fabric() {
            SoftFabric::InProcess => {
                qp.set_link_down();
                let peer = qp.lock().peer.clone();
                if let Some(p) = peer {
                    p.set_link_down();
                }
                Ok(())
            }
            SoftFabric::Tcp => super::tcp::drop_connection(&qp),
        }
    }

    /// TCP: lose the next request frame QP `qp_num` transmits, as a network would. The
    /// responder sees the gap at the next request and NAKs it; the requester re-sends.
    pub fn lose_next_request(&self, qp_num: u32) -> Result<()> {
        super::tcp::lose_next_request(&self.qp(qp_num)?)
    }

    /// TCP: replace QP `qp_num`'s data connection with a new one (the side that connects
    /// opens it; the other side's acceptor attaches it), dropping what was on the old wire.
    pub fn reconnect(&self, qp_num: u32) -> Result<()> {
        super::tcp::reconnect(&self.qp(qp_num)?)
    }

    /// Hold every completion of CQ `cq_id` for `delay` (zero switches it off).
    pub fn delay_completions(&self, cq_id: u32, delay: Duration) -> Result<()> {
        self.cq(cq_id)?.set_delay(delay);
        Ok(())
    }

    /// Hold the send-queue completions of CQ `cq_id` while receive completions go past them
    /// (`on`), as when a NIC's ACK for a SEND arrives after the peer's answer to it; switched
    /// off, the held ones come at the next poll, in order. With `delay_completions` too, the
    /// receives still wait out the delay.
    pub fn hold_send_completions(&self, cq_id: u32, on: bool) -> Result<()> {
        self.cq(cq_id)?.set_hold_sends(on);
        Ok(())
    }

    /// Raise CQ_ERR for CQ `cq_id`, as its overrun does (without losing a completion): its
    /// owner must take the CQ as failed.
    pub fn fail_cq(&self, cq_id: u32) -> Result<()> {
        let cq = self.cq(cq_id)?;
        self.dev.raise(AsyncEventKind::CqErr { cq_id: cq.id });
        Ok(())
    }

    /// Reorder completions of different QPs on CQ `cq_id` (each QP's order is kept).
    pub fn reorder_completions(&self, cq_id: u32, on: bool) -> Result<()> {
        self.cq(cq_id)?.set_reorder(on);
        Ok(())
    }

    /// Raise DEVICE_FATAL (and DEVICE_REMOVAL on CM ids bound to this device).
    pub fn device_fatal(&self) {
        self.dev.raise(AsyncEventKind::DeviceFatal);
        super::cm::device_removed(&self.dev);
    }

    fn cq(&self, id: u32) -> Result<Arc<super::cq::CqInner>> {
        self.dev.cq(id).ok_or_else(|| {
            TransportError::InvalidArgument(format!(
                "no CQ {id} on soft device {}",
                self.dev.name()
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::super::testutil::*;
    use crate::provider::*;
    use crate::soft::*;
    use crate::types::*;

    both_fabrics!(
        fail_qp,
        drop_connection,
        delay_completions,
        reorder_completions,
        hold_send_completions
    );

    fn fail_qp(f: SoftFabric) {
        let (mut a, b) = pair(f, &Opts::default());
        let net = Net::new(&[&a.cq, &b.cq]);
        a.qp.post_recv(&[RecvWr {
            wr_id: 1,
            sges: &[a.mr.sge(0, 8)],
        }])
        .unwrap();
        a.ctx.faults().fail_qp(a.qp.qp_num()).unwrap();
        assert_eq!(a.qp.state(), QpState::Err);
        assert!(async_events(&a.ctx).contains(&AsyncEventKind::QpFatal {
            qp_num: a.qp.qp_num()
        }));
        let c = net.wait(&a.cq, 1);
        assert_eq!((c[0].wr_id, c[0].status), (1, WcStatus::WrFlushErr));
        // The peer's requests now go unanswered: retries exhausted.
        let mut b = b;
        b.qp.post_send(&[send_wr(
            5,
            SendOp::RdmaWrite {
                remote_addr: a.mr.addr(),
                rkey: a.mr.rkey(),
            },
            &[b.mr.sge(0, 8)],
            SendFlags::SIGNALED,
        )])
        .unwrap();
        assert_eq!(net.wait(&b.cq, 1)[0].status, WcStatus::RetryExcErr);
        assert!(a.ctx.faults().fail_qp(0xfff_fff).is_err());
    }

    fn drop_connection(f: SoftFabric) {
        let (mut a, mut b) = pair(f, &Opts::default());
        let net = Net::new(&[&a.cq, &b.cq]);
        let w = |m: &SoftMr, r: &SoftMr, id| {
            (
                id,
                SendOp::RdmaWrite {
                    remote_addr: r.addr(),
                    rkey: r.rkey(),
                },
                [m.sge(0, 8)],
            )
        };
        let (id, op, sg) = w(&a.mr, &b.mr, 1);
        a.qp.post_send(&[send_wr(id, op, &sg, SendFlags::SIGNALED)])
            .unwrap();
        assert_eq!(net.wait(&a.cq, 1)[0].status, WcStatus::Success);
        a.ctx.faults().drop_connection(a.qp.qp_num()).unwrap();
        let (id, op, sg) = w(&a.mr, &b.mr, 2);
        a.qp.post_send(&[send_wr(id, op, &sg, SendFlags::SIGNALED)])
            .unwrap();
        assert_eq!(net.wait(&a.cq, 1)[0].status, WcStatus::RetryExcErr);
        assert_eq!(a.qp.state(), QpState::Err);
        // The other side sees the link gone too.
        let _ = net.settle(&b.cq, Duration::from_millis(10));
        let (id, op, sg) = w(&b.mr, &a.mr, 3);
        b.qp.post_send(&[send_wr(id, op, &sg, SendFlags::SIGNALED)])
            .unwrap();
        assert_eq!(net.wait(&b.cq, 1)[0].status, WcStatus::RetryExcErr);
    }

    fn delay_completions(f: SoftFabric) {
        let (mut a, b) = pair(f, &Opts::default());
        let net = Net::new(&[&a.cq, &b.cq]);
        let delay = Duration::from_millis(60);
        a.ctx.faults().delay_completions(a.cq.id(), delay).unwrap();
        let t0 = Instant::now();
        a.qp.post_send(&[send_wr(
            1,
            SendOp::RdmaWrite {
                remote_addr: b.mr.addr(),
                rkey: b.mr.rkey(),
            },
            &[a.mr.sge(0, 8)],
            SendFlags::SIGNALED,
        )])
        .unwrap();
        assert_eq!(net.wait(&a.cq, 1)[0].status, WcStatus::Success);
        assert!(
            t0.elapsed() >= delay,
            "completion came after {:?}",
            t0.elapsed()
        );
        a.ctx
            .faults()
            .delay_completions(a.cq.id(), Duration::ZERO)
            .unwrap();
        let t1 = Instant::now();
        a.qp.post_send(&[send_wr(
            2,
            SendOp::RdmaWrite {
                remote_addr: b.mr.addr(),
                rkey: b.mr.rkey(),
            },
            &[a.mr.sge(0, 8)],
            SendFlags::SIGNALED,
        )])
        .unwrap();
        assert_eq!(net.wait(&a.cq, 1)[0].wr_id, 2);
        assert!(t1.elapsed() < delay);
    }

    /// A's SEND completion is held while the answer to it (b's SEND) completes on a's CQ;
    /// switched off, the held one comes at the next poll.
    fn hold_send_completions(f: SoftFabric) {
        let (mut a, mut b) = pair(f, &Opts::default());
        let net = Net::new(&[&a.cq, &b.cq]);
        let recv = |side: &mut Side, id| {
            side.qp
                .post_recv(&[RecvWr {
                    wr_id: id,
                    sges: &[side.mr.sge(64, 8)],
                }])
                .unwrap();
        };
        let send = |side: &mut Side, id| {
            let sge = [side.mr.sge(0, 8)];
            side.qp
                .post_send(&[send_wr(id, SendOp::Send, &sge, SendFlags::SIGNALED)])
                .unwrap();
        };
        recv(&mut a, 100);
        recv(&mut b, 200);
        a.ctx
            .faults()
            .hold_send_completions(a.cq.id(), true)
            .unwrap();
        send(&mut a, 1);
        assert_eq!(net.wait(&b.cq, 1)[0].wr_id, 200, "b got a's SEND");
        send(&mut b, 2);
        assert_eq!(net.wait(&b.cq, 1)[0].wr_id, 2);
        let answer = net.wait(&a.cq, 1)[0];
        assert_eq!(
            (answer.wr_id, answer.opcode),
            (100, WcOpcode::Recv),
            "the answer came before a's own SEND completion"
        );
        assert!(
            net.settle(&a.cq, Duration::from_millis(50)).is_empty(),
            "a's SEND completion is held"
        );
        a.ctx
            .faults()
            .hold_send_completions(a.cq.id(), false)
            .unwrap();
        let sent = net.wait(&a.cq, 1)[0];
        assert_eq!((sent.wr_id, sent.status), (1, WcStatus::Success));
        assert!(a.ctx.faults().hold_send_completions(0xffff, true).is_err());
    }

    fn reorder_completions(f: SoftFabric) {
        let o = Opts::default();
        let (dc, ds) = (device(f, true), device(f, true));
        let mut c1 = side(&dc, &o);
        let mut s1 = side(&ds, &o);
        connect(&mut c1.qp, &mut s1.qp, &o);
        // A second QP on the same client CQ.
        let mut q2 = qp_on(&c1.pd, &c1.cq, &o, true);
        let mut s2 = side(&ds, &o);
        connect(&mut q2, &mut s2.qp, &o);
        let net = Net::new(&[&c1.cq, &s1.cq, &s2.cq]);
        let faults = dc.faults();
        faults.reorder_completions(c1.cq.id(), true).unwrap();
        // Hold completions long enough that the whole set is one ready batch.
        faults
            .delay_completions(c1.cq.id(), Duration::from_millis(150))
            .unwrap();
        let (lo, hi) = if c1.qp.qp_num() < q2.qp_num() {
            (1u64, 2u64)
        } else {
            (2, 1)
        };
        for i in 0..3u64 {
            let sg = [c1.mr.sge(0, 8)];
            let op = SendOp::RdmaWrite {
                remote_addr: s1.mr.addr(),
                rkey: s1.mr.rkey(),
            };
            c1.qp
                .post_send(&[send_wr(10 + i, op, &sg, SendFlags::SIGNALED)])
                .unwrap();
        }
        for i in 0..3u64 {
            let sg = [c1.mr.sge(0, 8)];
            let op = SendOp::RdmaWrite {
                remote_addr: s2.mr.addr(),
                rkey: s2.mr.rkey(),
            };
            q2.post_send(&[send_wr(20 + i, op, &sg, SendFlags::SIGNALED)])
                .unwrap();
        }
        // Let every ACK land (TCP) without any completion becoming ready, then reap at once.
        let _ = net.settle(&c1.cq, Duration::from_millis(60));
        std::thread::sleep(Duration::from_millis(150));
        let got = net.wait(&c1.cq, 6);
        let ids: Vec<u64> = got.iter().map(|c| c.wr_id).collect();
        // Each QP's own order holds.
        let q1: Vec<u64> = ids.iter().copied().filter(|i| *i < 20).collect();
        let q2v: Vec<u64> = ids.iter().copied().filter(|i| *i >= 20).collect();
        assert_eq!(q1, vec![10, 11, 12]);
        assert_eq!(q2v, vec![20, 21, 22]);
        // Across QPs the order differs from posting order: the higher qp_num comes first.
        let first_group = if hi == 2 { 20 } else { 10 };
        assert_eq!(ids[0], first_group, "{ids:?} (lo {lo})");
        assert_ne!(ids, vec![10, 11, 12, 20, 21, 22]);
    }
}
