//! A scripted target over a poll group: each capsule says what chain to run (SEND only;
//! RDMA WRITEs + SEND; RDMA READs then a SEND; or hold), with an optional bad rkey at one
//! position to make that WR fail. The host side is plain QPs with a data region the target
//! READs and WRITEs, and it records the sequence number of every answer it receives.

use std::collections::HashMap;
use std::time::Instant;

use nvmf_transport::pollgroup::*;
use nvmf_transport::*;

use crate::fixture::*;

pub const OP_SEND: u8 = 0;
pub const OP_WRITE: u8 = 1;
pub const OP_READ: u8 = 2;
pub const OP_HOLD: u8 = 3;
/// No WR is made to fail.
pub const NONE: u8 = 0xff;
/// Bytes each READ / WRITE moves.
pub const PIECE: u32 = 64;
const DATA_LEN: usize = 64 * 1024;
const RING: usize = 32;

#[derive(Clone, Copy, Debug)]
pub struct Cmd {
    pub seq: u32,
    pub op: u8,
    /// READs or WRITEs in the chain.
    pub count: u8,
    /// The position whose WR gets a bad rkey (NONE: none).
    pub bad_at: u8,
}

impl Cmd {
    pub fn new(seq: u32, op: u8, count: u8) -> Cmd {
        Cmd {
            seq,
            op,
            count,
            bad_at: NONE,
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct Parsed {
    cmd: Cmd,
    rkey: u32,
    addr: u64,
}

#[derive(Default)]
pub struct Scripted {
    cmds: HashMap<ReqId, Parsed>,
    pub held: Vec<ReqId>,
    pub keep_aborted: bool,
    pub kept: Vec<ReqId>,
    pub chains_ok: u64,
    pub chains_failed: u64,
    pub aborted: u64,
    /// Requests that ended (finished by the handler), by id: each must end exactly once.
    pub ended: HashMap<ReqId, u32>,
    pub events: Vec<(u32, QpairEvent)>,
    pub group_failures: Vec<String>,
    /// `capsule` calls.
    pub capsules: u64,
}

impl Scripted {
    fn end(&mut self, pg: &mut PollGroup<()>, req: ReqId) {
        *self.ended.entry(req).or_default() += 1;
        self.cmds.remove(&req);
        pg.finish(req);
    }

    /// Every request that ended did so once.
    pub fn assert_each_ended_once(&self) {
        let twice: Vec<_> = self.ended.iter().filter(|(_, n)| **n != 1).collect();
        assert!(twice.is_empty(), "requests ended more than once: {twice:?}");
    }

    fn start(&mut self, pg: &mut PollGroup<()>, req: ReqId) {
        let p = self.cmds[&req];
        match p.cmd.op {
            OP_WRITE | OP_READ => {
                let op = |k: u8| {
                    let rkey = if k == p.cmd.bad_at {
                        p.rkey ^ 0x00ab_cd00
                    } else {
                        p.rkey
                    };
                    let remote_addr = p.addr + k as u64 * PIECE as u64;
                    if p.cmd.op == OP_WRITE {
                        SendOp::RdmaWrite { remote_addr, rkey }
                    } else {
                        SendOp::RdmaRead { remote_addr, rkey }
                    }
                };
                let mut whole = [Sge::default(); 1];
                pg.buffer_sges(req, PIECE * p.cmd.count as u32, &mut whole);
                let sges: Vec<Sge> = (0..p.cmd.count)
                    .map(|k| Sge {
                        addr: whole[0].addr + k as u64 * PIECE as u64,
                        length: PIECE,
                        lkey: whole[0].lkey,
                    })
                    .collect();
                let mut chain: Vec<ChainWr<'_>> = (0..p.cmd.count)
                    .map(|k| ChainWr {
                        op: op(k),
                        sges: std::slice::from_ref(&sges[k as usize]),
                        inline: false,
                    })
                    .collect();
                if p.cmd.op == OP_READ {
                    pg.post_chain(req, &chain, false).expect("post READs");
                    return;
                }
                let answer = answer_sge(pg, req, p.cmd.seq);
                chain.push(ChainWr {
                    op: SendOp::Send,
                    sges: std::slice::from_ref(&answer),
                    inline: false,
                });
                pg.post_chain(req, &chain, true)
                    .expect("post WRITEs + SEND");
            }
            _ => {
                let answer = answer_sge(pg, req, p.cmd.seq);
                let chain = [ChainWr {
                    op: SendOp::Send,
                    sges: std::slice::from_ref(&answer),
                    inline: false,
                }];
                pg.post_chain(req, &chain, true).expect("post SEND");
            }
        }
    }
}

/// The answer: 16 bytes at offset 2048 of the request's first buffer, carrying `seq`.
fn answer_sge(pg: &mut PollGroup<()>, req: ReqId, seq: u32) -> Sge {
    let b = pg.buffer_mut(req, 0);
    b[2048..2052].copy_from_slice(&seq.to_le_bytes());
    let mut whole = [Sge::default(); 1];
    pg.buffer_sges(req, 4096, &mut whole);
    Sge {
        addr: whole[0].addr + 2048,
        length: 16,
        lkey: whole[0].lkey,
    }
}

impl Handler<()> for Scripted {
    fn capsule(&mut self, pg: &mut PollGroup<()>, req: ReqId) {
        self.capsules += 1;
        let b = pg.capsule(req);
        let cmd = Cmd {
            seq: u32::from_le_bytes(b[4..8].try_into().unwrap()),
            op: b[8],
            count: b[9],
            bad_at: b[10],
        };
        let rkey = u32::from_le_bytes(b[12..16].try_into().unwrap());
        let addr = u64::from_le_bytes(b[16..24].try_into().unwrap());
        pg.release_capsule(req);
        self.cmds.insert(req, Parsed { cmd, rkey, addr });
        // Held requests take their buffers too: an "I/O in flight" writing into them.
        match pg.alloc_buffers(req, 4096).expect("buffers") {
            BufferGrant::Ready => self.buffers_ready(pg, req),
            BufferGrant::Waiting => {}
        }
    }

    fn buffers_ready(&mut self, pg: &mut PollGroup<()>, req: ReqId) {
        if self.cmds[&req].cmd.op == OP_HOLD {
            self.held.push(req);
        } else {
            self.start(pg, req);
        }
    }

    fn chain_done(&mut self, pg: &mut PollGroup<()>, req: ReqId, last: WrKind, status: WcStatus) {
        if status != WcStatus::Success {
            self.chains_failed += 1;
            self.end(pg, req);
            return;
        }
        self.chains_ok += 1;
        if last == WrKind::Read {
            // The data is in: answer.
            let seq = self.cmds[&req].cmd.seq;
            let answer = answer_sge(pg, req, seq);
            let chain = [ChainWr {
                op: SendOp::Send,
                sges: std::slice::from_ref(&answer),
                inline: false,
            }];
            pg.post_chain(req, &chain, true).expect("post the answer");
            return;
        }
        self.end(pg, req);
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
            self.end(pg, req);
        }
    }

    fn group_failed(&mut self, _pg: &mut PollGroup<()>, error: &str) {
        self.group_failures.push(error.to_string());
    }
}

pub struct ScriptRig {
    pub fx: Fx,
    pub pd: Pd,
    pub shape: QpairShape,
    pub pg: PollGroup<()>,
    pub h: Scripted,
    pub cq: Cq,
    pub qps: Vec<Qp>,
    /// Capsules (64 bytes per host) then answer rings (RING x 64 bytes per host).
    pub mr: Mr,
    /// What the target READs and WRITEs.
    pub data: Mr,
    pub pg_qpn: Vec<u32>,
    /// Sequence numbers of the answers each host received, in order.
    pub answers: Vec<Vec<u32>>,
    pub sends_ok: Vec<u64>,
    pub sends_failed: Vec<u64>,
    /// Answers that completed on a host's QP after `replace` swapped it out (its completions
    /// were still in the shared CQ): not counted in `answers`.
    pub stale_answers: u64,
    next_ring: Vec<usize>,
    /// Per host: how many times `replace` made it a new QP (carried in its receive WR ids, so
    /// a completion of a replaced QP is told apart from the new one's).
    generation: Vec<u16>,
}

/// How the group's qpairs are made.
#[derive(Clone, Copy, Debug)]
pub struct QpairShape {
    pub depth: u32,
    pub read_depth: u32,
    pub rnr_retry: u8,
    /// Send queue of the group's QPs (None: the group's own sizing).
    pub send_queue: Option<u32>,
}

impl ScriptRig {
    pub fn new(fx: Fx, n: usize, cfg: PollGroupConfig, shape: QpairShape) -> ScriptRig {
        let mut pg = PollGroup::<()>::new(&fx.ctx, cfg).expect("poll group");
        let pd = fx.ctx.alloc_pd().unwrap();
        let cq = fx.cq((n as u32 * 64).max(256));
        let mr = pd.alloc_mr(n * 64 + n * RING * 64, all_access()).unwrap();
        let data = pd.alloc_mr(DATA_LEN, all_access()).unwrap();
        let mut qps = Vec::with_capacity(n);
        let mut pg_qpn = Vec::with_capacity(n);
        for i in 0..n {
            let mut hq = fx.qp(&pd, &cq, &cq, None);
            let mut tq = match shape.send_queue {
                None => pg.create_qp().expect("pg qp"),
                // Made by hand on the group's CQ and SRQ, with a small send queue.
                Some(wr) => pg
                    .pd()
                    .create_qp(&QpInitAttr {
                        send_cq: pg.cq(),
                        recv_cq: pg.cq(),
                        srq: pg.srq(),
                        caps: QpCaps {
                            max_send_wr: wr,
                            max_recv_wr: 0,
                            max_send_sge: MAX_WR_SGES as u32,
                            max_recv_sge: 1,
                            max_inline_data: 64,
                        },
                        sq_sig_all: false,
                    })
                    .expect("small-SQ qp"),
            };
            fx.connect(&mut hq, &mut tq, shape.rnr_retry);
            let qpn = pg
                .add_qp(tq, shape.depth, shape.read_depth, i as u64)
                .expect("add qp");
            pg_qpn.push(qpn);
            qps.push(hq);
        }
        ScriptRig {
            pg_qpn,
            qps,
            answers: vec![Vec::new(); n],
            sends_ok: vec![0; n],
            sends_failed: vec![0; n],
            next_ring: vec![0; n],
            stale_answers: 0,
            generation: vec![0; n],
            h: Scripted::default(),
            fx,
            pd,
            shape,
            pg,
            cq,
            mr,
            data,
        }
    }

    /// Host `i` gets a new QP connected to a new qpair of the group (its old one failed).
    pub fn replace(&mut self, i: usize) {
        let mut hq = self.fx.qp(&self.pd, &self.cq, &self.cq, None);
        let mut tq = self.pg.create_qp().expect("pg qp");
        self.fx.connect(&mut hq, &mut tq, self.shape.rnr_retry);
        self.pg_qpn[i] = self
            .pg
            .add_qp(tq, self.shape.depth, self.shape.read_depth, i as u64)
            .expect("add qp");
        self.qps[i] = hq;
        self.generation[i] = self.generation[i].wrapping_add(1);
    }

    /// Host `i` sends `cmd`; with `recv`, it first posts a receive for the answer.
    pub fn cmd(&mut self, i: usize, cmd: Cmd, recv: bool) -> bool {
        let off = i * 64;
        let (rkey, addr) = (self.data.rkey(), self.data.addr());
        let mut b = [0u8; 64];
        b[..4].copy_from_slice(&(i as u32).to_le_bytes());
        b[4..8].copy_from_slice(&cmd.seq.to_le_bytes());
        b[8] = cmd.op;
        b[9] = cmd.count;
        b[10] = cmd.bad_at;
        b[12..16].copy_from_slice(&rkey.to_le_bytes());
        b[16..24].copy_from_slice(&addr.to_le_bytes());
        self.mr.write_at(off, &b).expect("command in bounds");
        if recv {
            let slot = self.next_ring[i];
            self.next_ring[i] = (slot + 1) % RING;
            let at = self.qps.len() * 64 + (i * RING + slot) * 64;
            let sge = self.mr.sge(at, 64);
            if self.qps[i]
                .post_recv(&[RecvWr {
                    wr_id: (1 << 40)
                        | (u64::from(self.generation[i]) << 24)
                        | ((i as u64) << 8)
                        | slot as u64,
                    sges: &[sge],
                }])
                .is_err()
            {
                return false;
            }
        }
        let sge = self.mr.sge(off, 64);
        self.qps[i]
            .post_send(&[SendWr {
                wr_id: i as u64,
                op: SendOp::Send,
                sges: &[sge],
                flags: SendFlags::SIGNALED | SendFlags::INLINE,
            }])
            .is_ok()
    }

    pub fn poll_host(&mut self) -> usize {
        let mut wc = [WorkCompletion::default(); 64];
        let n = self.cq.poll(&mut wc).unwrap();
        for w in &wc[..n] {
            if w.wr_id >> 40 == 1 {
                if w.status == WcStatus::Success {
                    let i = ((w.wr_id >> 8) & 0xffff) as usize;
                    let slot = (w.wr_id & 0xff) as usize;
                    if (w.wr_id >> 24) as u16 != self.generation[i] {
                        self.stale_answers += 1;
                        continue;
                    }
                    let at = self.qps.len() * 64 + (i * RING + slot) * 64;
                    let seq = u32::from_le_bytes(
                        self.mr.read_vec(at..at + 4).unwrap().try_into().unwrap(),
                    );
                    self.answers[i].push(seq);
                }
                continue;
            }
            let i = w.wr_id as usize;
            if w.status == WcStatus::Success {
                self.sends_ok[i] += 1;
            } else {
                self.sends_failed[i] += 1;
            }
        }
        n
    }

    pub fn poll_pg(&mut self) -> usize {
        while let Some(ev) = self.fx.ctx.poll_async_event().unwrap() {
            self.pg.handle_async_event(&mut self.h, ev.kind);
        }
        self.pg.poll(&mut self.h).unwrap_or(0)
    }

    pub fn run_until(&mut self, what: &str, mut done: impl FnMut(&ScriptRig) -> bool) {
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

    pub fn gone(&self, qpn: u32) -> bool {
        self.h
            .events
            .iter()
            .any(|&(q, e)| q == qpn && matches!(e, QpairEvent::Gone { .. }))
    }

    /// Receives the SRQ really holds (the soft SRQ's own count), not the group's opinion.
    pub fn srq_occupancy(&self) -> Option<usize> {
        match self.pg.srq()? {
            Srq::Soft(s) => Some(s.posted()),
            #[allow(unreachable_patterns)]
            _ => None,
        }
    }

    /// Every slot is back on the SRQ, checked against the SRQ's real occupancy; no request,
    /// buffer or send-queue room held.
    pub fn assert_nothing_leaked(&mut self) {
        // Every slot posted or spare (kept off the SRQ by the post limit), at least the
        // limit posted (more while a gone qpair's share is still on the SRQ).
        self.run_until("receive slots back on the SRQ", |r| {
            let (posted, queued, held) = r.pg.recv_accounting();
            (queued, held) == (0, 0)
                && posted >= r.pg.recv_post_limit()
                && r.pg.requests_in_use() == 0
        });
        if let Some(real) = self.srq_occupancy() {
            let posted = self.pg.recv_accounting().0;
            assert_eq!(
                real, posted as usize,
                "the SRQ really holds {real} receives"
            );
        }
        assert_eq!(
            self.pg.buffers_free(),
            self.pg.config().data_buffers,
            "data buffers leaked"
        );
        self.h.assert_each_ended_once();
    }
}
