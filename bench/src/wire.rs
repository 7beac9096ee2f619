//! `wire`: the soft in-process fabric's own limit, measured with the transport API alone. Two
//! soft devices, one RC QP each, connected back to back; a requester thread keeps a fixed
//! window of work requests in flight (posting in batches, polling its CQ), a responder thread
//! keeps receives posted and reaps them. Each thread is pinned to its own core. On this fabric
//! the requester's post executes the transfer (key checks, copy, the responder's completion),
//! so the requester's core is the one that saturates.
//!
//! Flow control as NVMe-oF has it: a SEND counts as in flight until the responder has reaped
//! it and posted its receive again (a host never has more capsules out than the queue depth),
//! so the requester never meets an empty receive queue (RNR and its timer would measure the
//! retry delay, not the fabric). A WRITE is in flight until its own completion.

use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use nvmf_transport::{
    Access, Context, Cq, DeviceSpec, Mr, Mtu, Pd, Qp, QpCaps, QpInitAttr, RecvWr, RtrAttr, RtsAttr,
    SendFlags, SendOp, SendWr, SoftConfig, SoftFabric, WcStatus, WorkCompletion,
};

/// What the requester posts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// SEND of `size` bytes into a posted receive.
    Send { size: u32 },
    /// RDMA WRITE of `size` bytes into the responder's region.
    Write { size: u32 },
}

/// One measurement's parameters.
#[derive(Debug, Clone, Copy)]
pub struct WireSpec {
    /// The operation.
    pub op: Op,
    /// Work requests in flight.
    pub window: u32,
    /// Measured time (after a short warm-up).
    pub duration: Duration,
    /// Requester's core.
    pub requester_core: usize,
    /// Responder's core.
    pub responder_core: usize,
    /// Pin the threads.
    pub pin: bool,
}

/// Receives the responder keeps posted: deep enough that the requester never meets RNR.
const RECV_DEPTH: u32 = 4096;
/// Largest batch of WRs posted by one call.
const BATCH: usize = 16;
/// Warm-up before the measured window.
const WARMUP: Duration = Duration::from_millis(200);

struct Side {
    _ctx: Context,
    _pd: Pd,
    cq: Cq,
    qp: Qp,
    mr: Mr,
}

fn open_side(tag: &str, ip: Ipv4Addr, cq_depth: u32, caps: QpCaps, mr_len: usize) -> Result<Side> {
    let ctx = Context::open(&DeviceSpec::Soft(SoftConfig {
        name: format!("bench-wire-{tag}-{}-{ip}", std::process::id()),
        fabric: SoftFabric::InProcess,
        ip,
        ..SoftConfig::default()
    }))
    .context("opening a soft device")?;
    let pd = ctx.alloc_pd()?;
    let cq = ctx.create_cq(cq_depth, None)?;
    let qp = pd.create_qp(&QpInitAttr {
        send_cq: &cq,
        recv_cq: &cq,
        srq: None,
        caps,
        sq_sig_all: false,
    })?;
    let mr = pd.alloc_mr(
        mr_len,
        Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
    )?;
    Ok(Side {
        _ctx: ctx,
        _pd: pd,
        cq,
        qp,
        mr,
    })
}

fn connect(a: &mut Qp, b: &mut Qp) -> Result<()> {
    let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let ea = a.endpoint(1, 0, 0x100)?;
    let eb = b.endpoint(1, 0, 0x200)?;
    for (qp, remote) in [(&mut *a, eb), (&mut *b, ea)] {
        qp.modify_to_init(1, access)?;
        qp.modify_to_rtr(&RtrAttr {
            remote,
            port_num: 1,
            sgid_index: 0,
            path_mtu: Mtu::Mtu4096,
            max_dest_rd_atomic: 16,
            // 0.01 ms: an RNR (never expected) costs little.
            min_rnr_timer: 1,
        })?;
    }
    for qp in [a, b] {
        qp.modify_to_rts(&RtsAttr {
            sq_psn: 0,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            max_rd_atomic: 16,
        })?;
    }
    Ok(())
}

pub(crate) fn pin(core: usize, on: bool) {
    if on && !core_affinity::set_for_current(core_affinity::CoreId { id: core }) {
        tracing::warn!(core, "could not pin the thread");
    }
}

fn check(wcs: &[WorkCompletion]) -> Result<()> {
    if let Some(bad) = wcs.iter().find(|w| w.status != WcStatus::Success) {
        bail!(
            "work request {:#x} failed: {:?} (vendor error {:#x})",
            bad.wr_id,
            bad.status,
            bad.vendor_err
        );
    }
    Ok(())
}

/// Work requests per second over the measured window.
pub fn measure(spec: &WireSpec) -> Result<f64> {
    static RUN: AtomicU32 = AtomicU32::new(0);
    let run = RUN.fetch_add(1, Ordering::Relaxed);
    let size = match spec.op {
        Op::Send { size } | Op::Write { size } => size,
    };
    if size == 0 || spec.window == 0 {
        bail!("size and window must be above 0");
    }
    let window = spec.window.min(RECV_DEPTH);
    let caps = |send: u32, recv: u32| QpCaps {
        max_send_wr: send,
        max_recv_wr: recv,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    // Distinct loopback addresses per run: the in-process fabric finds devices by IP.
    let ip = |side: u8| Ipv4Addr::new(127, 77, (run % 250) as u8, side);
    let mut requester = open_side(
        "req",
        ip(1),
        window * 2 + 16,
        caps(window + BATCH as u32, 4),
        size as usize,
    )?;
    let mut responder = open_side(
        "resp",
        ip(2),
        RECV_DEPTH * 2,
        caps(4, RECV_DEPTH),
        size as usize,
    )?;
    connect(&mut requester.qp, &mut responder.qp)?;
    let remote = (responder.mr.addr(), responder.mr.rkey());
    let receiving = matches!(spec.op, Op::Send { .. });
    if receiving {
        let sge = [responder.mr.sge(0, size)];
        let wr = RecvWr {
            wr_id: 0,
            sges: &sge,
        };
        for _ in 0..RECV_DEPTH {
            responder
                .qp
                .post_recv(&[wr])
                .map_err(|e| anyhow::anyhow!("post_recv: {e:?}"))?;
        }
    }
    let stop = AtomicBool::new(false);
    // SEND: messages the responder reaped and re-posted a receive for.
    let consumed = AtomicU64::new(0);
    let spec = *spec;
    std::thread::scope(|scope| -> Result<f64> {
        let stop = &stop;
        let consumed = &consumed;
        let responder_thread = scope.spawn(move || -> Result<()> {
            pin(spec.responder_core, spec.pin);
            let sge = [responder.mr.sge(0, size)];
            let wr = RecvWr {
                wr_id: 0,
                sges: &sge,
            };
            let wrs = [wr; 64];
            let mut wcs = [WorkCompletion::default(); 64];
            while !stop.load(Ordering::Relaxed) {
                let n = responder.cq.poll(&mut wcs)?;
                if n > 0 {
                    check(&wcs[..n])?;
                    responder
                        .qp
                        .post_recv(&wrs[..n])
                        .map_err(|e| anyhow::anyhow!("post_recv: {e:?}"))?;
                    consumed.fetch_add(n as u64, Ordering::Release);
                }
            }
            Ok(())
        });
        let requester_thread = scope.spawn(move || -> Result<f64> {
            pin(spec.requester_core, spec.pin);
            let sge = [requester.mr.sge(0, size)];
            let op = match spec.op {
                Op::Send { .. } => SendOp::Send,
                Op::Write { .. } => SendOp::RdmaWrite {
                    remote_addr: remote.0,
                    rkey: remote.1,
                },
            };
            let wr = SendWr {
                wr_id: 1,
                op,
                sges: &sge,
                flags: SendFlags::SIGNALED,
            };
            let wrs = [wr; BATCH];
            let mut wcs = [WorkCompletion::default(); 64];
            let (mut posted, mut completed) = (0u64, 0u64);
            let start = Instant::now();
            let mut measured: Option<(Instant, u64)> = None;
            let end = start + WARMUP + spec.duration;
            let mut loops = 0u32;
            loop {
                // In flight: until completed (WRITE) or until the responder re-posted (SEND).
                let retired = if receiving {
                    consumed.load(Ordering::Acquire).min(completed)
                } else {
                    completed
                };
                let room = (u64::from(window) - (posted - retired)) as usize;
                if room > 0 {
                    let k = room.min(BATCH);
                    requester
                        .qp
                        .post_send(&wrs[..k])
                        .map_err(|e| anyhow::anyhow!("post_send: {e:?}"))?;
                    posted += k as u64;
                }
                let n = requester.cq.poll(&mut wcs)?;
                check(&wcs[..n])?;
                completed += n as u64;
                loops = loops.wrapping_add(1);
                if loops % 256 == 0 {
                    let now = Instant::now();
                    if measured.is_none() && now >= start + WARMUP {
                        measured = Some((now, completed));
                    }
                    if now >= end {
                        break;
                    }
                }
            }
            let (t0, c0) = measured.unwrap_or((start, 0));
            let rate = (completed - c0) as f64 / t0.elapsed().as_secs_f64();
            // Let the last WRs finish before the QPs go.
            let deadline = Instant::now() + Duration::from_secs(5);
            while (completed < posted || (receiving && consumed.load(Ordering::Acquire) < posted))
                && Instant::now() < deadline
            {
                let n = requester.cq.poll(&mut wcs)?;
                completed += n as u64;
            }
            stop.store(true, Ordering::Relaxed);
            Ok(rate)
        });
        let rate = requester_thread
            .join()
            .map_err(|_| anyhow::anyhow!("requester thread panicked"))?;
        stop.store(true, Ordering::Relaxed);
        responder_thread
            .join()
            .map_err(|_| anyhow::anyhow!("responder thread panicked"))??;
        rate
    })
}
