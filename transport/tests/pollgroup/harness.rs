//! A poll group on one device with a "host" side of plain QPs connected to its qpairs, and a
//! handler that answers every capsule with a 16-byte SEND, counting what it saw per qpair.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use nvmf_transport::pollgroup::*;
use nvmf_transport::*;

use crate::fixture::*;

/// Capsule payload: host index (u32) and sequence (u32).
pub const CAPSULE: u32 = 64;

#[derive(Default)]
pub struct Counting {
    /// Capsules seen per pg qp_num, with the host index each claimed to come from.
    pub per_qpair: HashMap<u32, u64>,
    pub wrong_sender: u64,
    /// pg qp_num -> host index, to check attribution.
    pub expect: HashMap<u32, u32>,
    /// Don't answer: keep requests (to make a host overrun its depth).
    pub hold: bool,
    pub held: Vec<ReqId>,
    pub events: Vec<(u32, QpairEvent)>,
    pub aborted: u64,
    /// Keep aborted requests (an "I/O in flight" the layer above must finish later).
    pub keep_aborted: bool,
    pub kept: Vec<ReqId>,
    /// Chains that ended, by status.
    pub chains_ok: u64,
    pub chains_failed: u64,
    /// Requests finished (each request must end exactly once: finish or abort+finish).
    pub finished: u64,
    /// `group_failed` calls.
    pub group_failures: Vec<String>,
}

impl Handler<()> for Counting {
    fn capsule(&mut self, pg: &mut PollGroup<()>, req: ReqId) {
        let qp_num = pg.request(req).unwrap().qp_num();
        let bytes = pg.capsule(req);
        let sender = u32::from_le_bytes(bytes[..4].try_into().unwrap());
        if let Some(&want) = self.expect.get(&qp_num) {
            if want != sender {
                self.wrong_sender += 1;
            }
        }
        *self.per_qpair.entry(qp_num).or_default() += 1;
        pg.release_capsule(req);
        if self.hold {
            self.held.push(req);
            return;
        }
        answer(pg, req);
    }

    fn chain_done(&mut self, pg: &mut PollGroup<()>, req: ReqId, _last: WrKind, status: WcStatus) {
        if status == WcStatus::Success {
            self.chains_ok += 1;
        } else {
            self.chains_failed += 1;
        }
        self.finished += 1;
        pg.finish(req);
    }

    fn qpair_event(
        &mut self,
        _pg: &mut PollGroup<()>,
        qp_num: u32,
        _token: u64,
        event: QpairEvent,
    ) {
        self.events.push((qp_num, event));
    }

    fn aborted(&mut self, pg: &mut PollGroup<()>, req: ReqId) {
        self.aborted += 1;
        self.held.retain(|&r| r != req);
        if self.keep_aborted {
            self.kept.push(req);
        } else {
            self.finished += 1;
            pg.finish(req);
        }
    }

    fn buffers_ready(&mut self, pg: &mut PollGroup<()>, req: ReqId) {
        post_answer(pg, req);
    }

    fn group_failed(&mut self, _pg: &mut PollGroup<()>, error: &str) {
        self.group_failures.push(error.to_string());
    }
}

/// Answers `req` with a 16-byte response SEND from its data buffer.
pub fn answer(pg: &mut PollGroup<()>, req: ReqId) {
    if pg.alloc_buffers(req, 16).expect("a data buffer") == BufferGrant::Ready {
        post_answer(pg, req);
    }
}

fn post_answer(pg: &mut PollGroup<()>, req: ReqId) {
    pg.buffer_mut(req, 0)[..16].fill(0x5a);
    let mut sges = [Sge::default(); MAX_WR_SGES];
    let n = pg.buffer_sges(req, 16, &mut sges);
    // Its memory is the request's data buffer: a lone answer may go silent.
    pg.post_chain_owned(
        req,
        &[ChainWr {
            op: SendOp::Send,
            sges: &sges[..n],
            inline: true,
        }],
        true,
    )
    .expect("post the response");
}

pub struct Host {
    pub cq: Cq,
    pub qps: Vec<Qp>,
    pub mr: Mr,
    /// Successful sends per host QP.
    pub ok: Vec<u64>,
    pub failed: Vec<u64>,
    pub recvs: u64,
}

pub struct Rig {
    pub fx: Fx,
    pub pg: PollGroup<()>,
    pub h: Counting,
    pub host: Host,
    /// pg qp_num of host QP i.
    pub pg_qpn: Vec<u32>,
}

pub fn config(qpairs: u32) -> PollGroupConfig {
    PollGroupConfig {
        srq_depth: 256.max(qpairs * 2),
        max_qpairs: qpairs + 8,
        max_queue_depth: 32,
        in_capsule_data_size: 0,
        io_unit_size: 4096,
        data_buffers: 512.max(qpairs * 2),
        max_requests: 256.max(qpairs * 2),
        batch: 32,
        drain_timeout: Duration::from_secs(20),
        drain_grace: Duration::from_millis(20),
        recv_repost: RecvRepost::EndOfPass,
        silent_answers: 3,
        silent_flush_idle_polls: 4096,
    }
}

impl Rig {
    /// `n` host QPs, each connected to a qpair of a poll group sized by `cfg`, with `depth`.
    pub fn new(fx: Fx, n: usize, cfg: PollGroupConfig, depth: u32, rnr_retry: u8) -> Rig {
        let mut pg = PollGroup::<()>::new(&fx.ctx, cfg).expect("poll group");
        let pd = fx.ctx.alloc_pd().unwrap();
        let cq = fx.cq((n as u32 * 8).max(256));
        let mr = pd.alloc_mr(n * 64 + 16 * 64, all_access()).unwrap();
        let mut h = Counting::default();
        let mut qps = Vec::with_capacity(n);
        let mut pg_qpn = Vec::with_capacity(n);
        for i in 0..n {
            let mut hq = fx.qp(&pd, &cq, &cq, None);
            let mut tq = pg.create_qp().expect("pg qp");
            fx.connect(&mut hq, &mut tq, rnr_retry);
            let qpn = pg.add_qp(tq, depth, 16, i as u64).expect("add qp");
            h.expect.insert(qpn, i as u32);
            pg_qpn.push(qpn);
            qps.push(hq);
        }
        let host = Host {
            cq,
            qps,
            mr,
            ok: vec![0; n],
            failed: vec![0; n],
            recvs: 0,
        };
        Rig {
            fx,
            pg,
            h,
            host,
            pg_qpn,
        }
    }

    /// Host QP `i` sends one capsule (its index, `seq`) and posts a receive for the answer.
    pub fn send(&mut self, i: usize, seq: u32) -> bool {
        let off = i * 64;
        let mut capsule = [0u8; 8];
        capsule[..4].copy_from_slice(&(i as u32).to_le_bytes());
        capsule[4..].copy_from_slice(&seq.to_le_bytes());
        self.host.mr.write_at(off, &capsule).unwrap();
        let recv_sge = self
            .host
            .mr
            .sge(self.host.qps.len() * 64 + (i % 16) * 64, 64);
        let send_sge = self.host.mr.sge(off, CAPSULE);
        let qp = &mut self.host.qps[i];
        if qp
            .post_recv(&[RecvWr {
                wr_id: (1 << 40) | i as u64,
                sges: &[recv_sge],
            }])
            .is_err()
        {
            return false;
        }
        qp.post_send(&[SendWr {
            wr_id: i as u64,
            op: SendOp::Send,
            sges: &[send_sge],
            flags: SendFlags::SIGNALED,
        }])
        .is_ok()
    }

    /// Reaps host completions (which also drives the soft TCP fabric's host side).
    pub fn poll_host(&mut self) -> usize {
        let mut wc = [WorkCompletion::default(); 64];
        let n = self.host.cq.poll(&mut wc).unwrap();
        for w in &wc[..n] {
            if w.wr_id >> 40 == 1 {
                if w.status == WcStatus::Success {
                    self.host.recvs += 1;
                }
                continue;
            }
            let i = w.wr_id as usize;
            if w.status == WcStatus::Success {
                self.host.ok[i] += 1;
            } else {
                self.host.failed[i] += 1;
            }
        }
        n
    }

    /// Polls the group (and routes the device's async events to it, as a reactor would).
    pub fn poll_pg(&mut self) -> usize {
        while let Some(ev) = self.fx.ctx.poll_async_event().unwrap() {
            self.pg.handle_async_event(&mut self.h, ev.kind);
        }
        self.pg.poll(&mut self.h).unwrap()
    }

    /// Polls both sides until `done` or the patience runs out.
    pub fn run_until(&mut self, what: &str, mut done: impl FnMut(&Rig) -> bool) {
        let deadline = Instant::now() + patience();
        while !done(self) {
            let a = self.poll_pg();
            let b = self.poll_host();
            if a + b == 0 {
                assert!(
                    Instant::now() < deadline,
                    "timed out waiting for {what}: stats {:?}",
                    self.pg.stats()
                );
                std::thread::yield_now();
            }
        }
    }

    /// Polls both sides until a few passes in a row find nothing: what is already in either
    /// CQ is reaped (a CQ keeps send and receive completions apart, so the group having no
    /// request in use says nothing about receives still queued).
    pub fn run_until_quiet(&mut self) {
        const QUIET_PASSES: u32 = 3;
        let deadline = Instant::now() + patience();
        let mut quiet = 0;
        while quiet < QUIET_PASSES {
            if self.poll_pg() + self.poll_host() == 0 {
                quiet += 1;
            } else {
                quiet = 0;
                assert!(
                    Instant::now() < deadline,
                    "never quiet: stats {:?}",
                    self.pg.stats()
                );
            }
        }
    }

    /// Every receive slot is on the SRQ again, and no request or buffer is held.
    pub fn assert_nothing_leaked(&mut self) {
        // Every slot posted or spare (kept off the SRQ by the post limit), at least the
        // limit posted (more while a gone qpair's share is still on the SRQ).
        self.run_until("receive slots back on the SRQ", |r| {
            let (posted, queued, held) = r.pg.recv_accounting();
            (queued, held) == (0, 0)
                && posted >= r.pg.recv_post_limit()
                && r.pg.requests_in_use() == 0
        });
        assert_eq!(
            self.pg.buffers_free(),
            self.pg.config().data_buffers,
            "data buffers leaked"
        );
    }

    pub fn capsules_for(&self, pg_qpn: u32) -> u64 {
        self.h.per_qpair.get(&pg_qpn).copied().unwrap_or(0)
    }

    pub fn gone(&self, pg_qpn: u32) -> bool {
        self.h
            .events
            .iter()
            .any(|&(q, e)| q == pg_qpn && matches!(e, QpairEvent::Gone { .. }))
    }
}
