//! Poll-group micro-benchmark on the soft in-process fabric (the stack's own cost, no wire):
//! - lookup: ns per qp_num -> qpair lookup in the RB-tree, random keys;
//! - poll: ns per completion of the whole poll loop (reap, look up, hand up, re-post the
//!   receive as part of a list), capsules spread round-robin over every qpair so consecutive
//!   completions hit different tree nodes;
//! - echo: the same plus a 16-byte response SEND per capsule and its completion.
//!
//! with 1, 100 and 10,000 qpairs in the tree; with RB-tree lookups per capsule in the echo
//! case (the group's own count); and bytes allocated per qpair added (a counting global
//! allocator) at 1, 64 and 1024 qpairs: the group's share, and with the provider's QP.
//! Run: `cargo bench -p nvmf-transport --bench pollgroup` (`-- --quick` for a short run).
//! Figures, not assertions.
#![forbid(unsafe_code)]

use std::alloc::System;
use std::time::{Duration, Instant};

use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

use nvmf_transport::pollgroup::*;
use nvmf_transport::*;

struct Sink {
    respond: bool,
}

impl Handler<()> for Sink {
    fn capsule(&mut self, pg: &mut PollGroup<()>, req: ReqId) {
        pg.release_capsule(req);
        if !self.respond {
            pg.finish(req);
            return;
        }
        if pg.alloc_buffers(req, 16).ok() == Some(BufferGrant::Ready) {
            respond(pg, req);
        }
    }
    fn chain_done(&mut self, pg: &mut PollGroup<()>, req: ReqId, _: WrKind, _: WcStatus) {
        pg.finish(req);
    }
    fn qpair_event(&mut self, _: &mut PollGroup<()>, _: u32, _: u64, _: QpairEvent) {}
    fn aborted(&mut self, pg: &mut PollGroup<()>, req: ReqId) {
        pg.finish(req);
    }
    fn buffers_ready(&mut self, pg: &mut PollGroup<()>, req: ReqId) {
        respond(pg, req);
    }
}

fn respond(pg: &mut PollGroup<()>, req: ReqId) {
    {
        let mut sges = [Sge::default(); MAX_WR_SGES];
        let n = pg.buffer_sges(req, 16, &mut sges);
        let wr = ChainWr {
            op: SendOp::Send,
            sges: &sges[..n],
            inline: true,
        };
        if pg.post_chain(req, &[wr], true).is_err() {
            pg.finish(req);
        }
    }
}

struct Bench {
    pg: PollGroup<()>,
    hosts: Vec<Qp>,
    host_cq: Cq,
    host_mr: Mr,
    pg_qpns: Vec<u32>,
}

fn setup(n: usize, dev: u32) -> Bench {
    let ctx = Context::open(&DeviceSpec::Soft(SoftConfig {
        name: format!("bench{dev}"),
        fabric: SoftFabric::InProcess,
        ..SoftConfig::default()
    }))
    .expect("soft device");
    let cfg = PollGroupConfig {
        srq_depth: 4096,
        max_qpairs: n as u32 + 1,
        max_queue_depth: 128,
        in_capsule_data_size: 0,
        io_unit_size: 4096,
        data_buffers: 4096,
        max_requests: 4096,
        batch: 32,
        ..PollGroupConfig::default()
    };
    let mut pg = PollGroup::<()>::new(&ctx, cfg).expect("poll group");
    let pd = ctx.alloc_pd().unwrap();
    let host_cq = ctx.create_cq(1 << 16, None).unwrap();
    let host_mr = pd.alloc_mr(4096, Access::LOCAL_WRITE).unwrap();
    let gid_index = ctx.gid_index_for(1, "127.0.0.1".parse().unwrap()).unwrap() as u8;
    let mut hosts = Vec::with_capacity(n);
    let mut pg_qpns = Vec::with_capacity(n);
    let access = Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE;
    for _ in 0..n {
        let mut h = pd
            .create_qp(&QpInitAttr {
                send_cq: &host_cq,
                recv_cq: &host_cq,
                srq: None,
                caps: QpCaps {
                    max_send_wr: 256,
                    max_recv_wr: 256,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: 64,
                },
                sq_sig_all: false,
            })
            .unwrap();
        let mut t = pg.create_qp().unwrap();
        h.modify_to_init(1, access).unwrap();
        t.modify_to_init(1, access).unwrap();
        let eh = h.endpoint(1, gid_index, 0).unwrap();
        let et = t.endpoint(1, gid_index, 0).unwrap();
        for (qp, remote) in [(&mut h, et), (&mut t, eh)] {
            qp.modify_to_rtr(&RtrAttr {
                remote,
                port_num: 1,
                sgid_index: gid_index,
                path_mtu: Mtu::Mtu4096,
                max_dest_rd_atomic: 16,
                min_rnr_timer: 1,
            })
            .unwrap();
            qp.modify_to_rts(&RtsAttr {
                sq_psn: 0,
                timeout: 14,
                retry_cnt: 7,
                rnr_retry: 7,
                max_rd_atomic: 16,
            })
            .unwrap();
        }
        pg_qpns.push(pg.add_qp(t, 128, 16, 0).unwrap());
        hosts.push(h);
    }
    Bench {
        pg,
        hosts,
        host_cq,
        host_mr,
        pg_qpns,
    }
}

/// A cheap deterministic shuffle (xorshift), so keys are visited in no useful order.
fn shuffled(keys: &[u32]) -> Vec<u32> {
    let mut v = keys.to_vec();
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for i in (1..v.len()).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.swap(i, (x % (i as u64 + 1)) as usize);
    }
    v
}

fn lookup_ns(b: &Bench, rounds: usize) -> f64 {
    let keys = shuffled(&b.pg_qpns);
    let probes: Vec<u32> = keys
        .iter()
        .cycle()
        .take(rounds.max(keys.len()))
        .copied()
        .collect();
    let t = Instant::now();
    let mut found = 0usize;
    for &k in &probes {
        found += b.pg.qpair_phase(std::hint::black_box(k)).is_some() as usize;
    }
    let ns = t.elapsed().as_nanos() as f64 / probes.len() as f64;
    assert_eq!(found, probes.len());
    ns
}

/// Returns ns of pg.poll time per completion handled, and tree lookups per capsule.
fn poll_ns(b: &mut Bench, total: usize, respond: bool) -> (f64, f64) {
    let (lookups0, capsules0) = (b.pg.stats().tree_lookups, b.pg.stats().capsules);
    let mut h = Sink { respond };
    let order = shuffled(&(0..b.hosts.len() as u32).collect::<Vec<_>>());
    let sge = b.host_mr.sge(0, 64);
    let mut wc = [WorkCompletion::default(); 64];
    let mut in_poll = Duration::ZERO;
    let mut handled = 0usize;
    let mut sent = 0usize;
    // Each host QP has a 256-entry send queue, freed as its completions are reaped per chunk.
    let chunk = 512.min(total).min(128 * b.hosts.len());
    while sent < total {
        for k in 0..chunk {
            let i = order[(sent + k) % order.len()] as usize;
            if respond {
                // Room for the answer, or it waits on RNR forever.
                let rsge = b.host_mr.sge(2048, 64);
                b.hosts[i]
                    .post_recv(&[RecvWr {
                        wr_id: u64::MAX,
                        sges: &[rsge],
                    }])
                    .unwrap();
            }
            // Every host send signaled: a QP's unsignaled sends retire only behind a signaled one
            // of its own (the host side is not what is measured).
            let flags = SendFlags::SIGNALED | SendFlags::INLINE;
            b.hosts[i]
                .post_send(&[SendWr {
                    wr_id: i as u64,
                    op: SendOp::Send,
                    sges: &[sge],
                    flags,
                }])
                .unwrap();
        }
        sent += chunk;
        let want = b.pg.stats().capsules as usize + chunk;
        let t = Instant::now();
        let deadline = Instant::now() + Duration::from_secs(30);
        while (b.pg.stats().capsules as usize) < want || b.pg.requests_in_use() > 0 {
            handled += b.pg.poll(&mut h).unwrap();
            if Instant::now() > deadline {
                panic!(
                    "stalled: want {want} capsules, stats {:?}, requests {}",
                    b.pg.stats(),
                    b.pg.requests_in_use()
                );
            }
        }
        in_poll += t.elapsed();
        while b.host_cq.poll(&mut wc).unwrap() > 0 {}
    }
    let s = b.pg.stats();
    let per_capsule = (s.tree_lookups - lookups0) as f64 / (s.capsules - capsules0).max(1) as f64;
    (
        in_poll.as_nanos() as f64 / handled.max(1) as f64,
        per_capsule,
    )
}

fn net_bytes(r: &Region<'_, System>) -> i64 {
    let c = r.change();
    c.bytes_allocated as i64 - c.bytes_deallocated as i64 + c.bytes_reallocated as i64
}

/// Bytes allocated per qpair added to a group sized for `n`: (the group's share, with the
/// provider's QP made by `create_qp`).
fn bytes_per_qpair(n: usize, dev: u32) -> (f64, f64) {
    let ctx = Context::open(&DeviceSpec::Soft(SoftConfig {
        name: format!("benchmem{dev}"),
        fabric: SoftFabric::InProcess,
        ..SoftConfig::default()
    }))
    .expect("soft device");
    let cfg = PollGroupConfig {
        max_qpairs: n as u32 + 1,
        ..PollGroupConfig::default()
    };
    let mut pg = PollGroup::<()>::new(&ctx, cfg).expect("poll group");
    let mut group = 0i64;
    let all = Region::new(GLOBAL);
    for _ in 0..n {
        let qp = pg.create_qp().unwrap();
        let r = Region::new(GLOBAL);
        pg.add_qp(qp, 128, 16, 0).unwrap();
        group += net_bytes(&r);
    }
    let total = net_bytes(&all);
    (group as f64 / n as f64, total as f64 / n as f64)
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let total = if quick { 20_000 } else { 200_000 };
    println!(
        "poll group on the soft in-process fabric, batch 32 ({} capsules per case)",
        total
    );
    println!(
        "{:>8} {:>12} {:>16} {:>18} {:>20}",
        "qpairs", "lookup ns", "poll ns/compl", "echo ns/compl", "lookups/capsule"
    );
    for (dev, n) in [1usize, 100, 10_000].into_iter().enumerate() {
        let mut b = setup(n, dev as u32);
        let lookup = lookup_ns(&b, 1_000_000);
        // Warm up, then measure.
        poll_ns(&mut b, 4096, false);
        let (poll, _) = poll_ns(&mut b, total, false);
        let (echo, lookups) = poll_ns(&mut b, total, true);
        println!("{n:>8} {lookup:>12.1} {poll:>16.1} {echo:>18.1} {lookups:>20.2}");
    }
    println!();
    println!(
        "{:>8} {:>22} {:>22}",
        "qpairs", "group bytes/qpair", "with QP bytes/qpair"
    );
    for (dev, n) in [1usize, 64, 1024].into_iter().enumerate() {
        let (group, with_qp) = bytes_per_qpair(n, dev as u32);
        println!("{n:>8} {group:>22.0} {with_qp:>22.0}");
    }
}
