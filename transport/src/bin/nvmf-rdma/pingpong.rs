//! `nvmf-rdma pingpong`: the classic RC example between two processes.
//!
//! Both sides exchange QP endpoints and a buffer (address, rkey) over TCP, bring their QPs to
//! RTS, then the client drives phases the server follows:
//! - VERIFY: SEND/RECV both ways, RDMA WRITE into the server, RDMA READ from it, each checked
//!   byte for byte;
//! - LAT: SEND/RECV ping-pong per size (half round trip: min and percentiles, like ib_send_lat);
//! - BW: a window of RDMA WRITEs per size (like ib_write_bw).

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use clap::{Args, Subcommand};
use hdrhistogram::Histogram;
use nvmf_transport::*;

use crate::oob::{Oob, PeerInfo};

#[derive(Subcommand, Debug)]
pub enum Role {
    /// Wait for one client, then follow its phases.
    Server {
        /// Address to accept the client's out-of-band TCP connection on.
        #[arg(long, default_value_t = crate::default_listen())]
        listen: SocketAddr,
        #[command(flatten)]
        opts: Opts,
    },
    /// Connect to a server, verify data movement, then measure.
    Client {
        /// The server's out-of-band address (its --listen, e.g. 10.10.0.1:18515).
        #[arg(long)]
        connect: SocketAddr,
        /// Iterations per size for latency and bandwidth.
        #[arg(long, default_value_t = 1000)]
        iters: u32,
        /// Message sizes in bytes, comma separated.
        #[arg(long, value_delimiter = ',', default_value = "2,64,4096,65536")]
        sizes: Vec<u32>,
        /// RDMA WRITEs kept in flight in the bandwidth phase.
        #[arg(long, default_value_t = 32)]
        window: u32,
        #[command(flatten)]
        opts: Opts,
    },
}

#[derive(Args, Debug, Clone, Copy)]
pub struct Opts {
    /// Local GID index (RoCE: must hold the RoCE v2 GID of this host's address). Default: the
    /// index whose IPv4-mapped GID matches the out-of-band connection's local address.
    #[arg(long)]
    gid_index: Option<u8>,
    /// Device port.
    #[arg(long, default_value_t = 1)]
    ib_port: u8,
    /// Path MTU in bytes (256, 512, 1024, 2048, 4096), capped at the port's active MTU.
    #[arg(long, default_value_t = 1024)]
    mtu: u32,
    /// Seconds to wait for any single completion before giving up.
    #[arg(long, default_value_t = 30)]
    timeout: u64,
}

const WR_SEND: u64 = 1 << 32;
const WR_RECV: u64 = 2 << 32;
const WR_WRITE: u64 = 3 << 32;
const WR_READ: u64 = 4 << 32;
const KIND_MASK: u64 = 0xffff_ffff << 32;
/// Outstanding SENDs/RECVs in the ping-pong phases are at most this many.
const PP_DEPTH: u32 = 16;

pub fn run(spec: &DeviceSpec, role: Role) -> Result<()> {
    match role {
        Role::Server { listen, opts } => {
            let l = TcpListener::bind(listen).with_context(|| format!("listening on {listen}"))?;
            println!(
                "pingpong server: waiting for a client on {}",
                l.local_addr()?
            );
            let (s, peer) = l.accept()?;
            println!("pingpong server: client {peer}");
            let max = 65536;
            let mut pp = Pingpong::setup(spec, Oob::new(s)?, opts, max, 64, true)?;
            pp.serve()
        }
        Role::Client {
            connect,
            iters,
            sizes,
            window,
            opts,
        } => {
            if sizes.is_empty() || sizes.contains(&0) {
                bail!("--sizes needs one or more sizes above 0");
            }
            let max = *sizes.iter().max().unwrap_or(&4096);
            if max > 1 << 24 {
                bail!("--sizes: {max} is above the 16 MiB this tool supports");
            }
            let s = TcpStream::connect(connect)
                .with_context(|| format!("connecting to the pingpong server at {connect}"))?;
            let mut pp = Pingpong::setup(
                spec,
                Oob::new(s)?,
                opts,
                max.max(65536),
                window.max(1),
                false,
            )?;
            pp.drive(iters.max(1), &sizes, window.max(1))
        }
    }
}

struct Pingpong {
    _ctx: Context,
    _pd: Pd,
    cq: Cq,
    qp: Qp,
    /// First half: what this side sends or writes from; second half: where it receives/reads.
    mr: Mr,
    half: usize,
    peer: PeerInfo,
    oob: Oob,
    max_inline: u32,
    timeout: Duration,
    /// Completions taken off the CQ while waiting for another kind.
    stash: Vec<WorkCompletion>,
}

impl Pingpong {
    fn setup(
        spec: &DeviceSpec,
        mut oob: Oob,
        opts: Opts,
        max: u32,
        window: u32,
        server: bool,
    ) -> Result<Pingpong> {
        let ctx =
            Context::open(spec).with_context(|| format!("opening the RDMA device ({spec:?})"))?;
        let local_ip = oob.local_ip()?;
        let port = ctx
            .query_port(opts.ib_port)
            .with_context(|| format!("port {}", opts.ib_port))?;
        let table = ctx.gid_table(opts.ib_port)?;
        let gid_index = match opts.gid_index {
            Some(i) => {
                if let Some(why) = gid::check_index(&table, i as u32, local_ip) {
                    bail!("{why}");
                }
                i
            }
            None => gid::roce_v2_index(&table, local_ip).with_context(|| {
                format!("choosing the GID index for {local_ip} (pass --gid-index)")
            })? as u8,
        };
        println!(
            "device {} ({}), port {}: {:?}, active MTU {}, GID index {gid_index} for {local_ip}",
            ctx.name(),
            ctx.kind(),
            opts.ib_port,
            port.state,
            port.active_mtu.bytes()
        );
        let pd = ctx.alloc_pd()?;
        let depth = window + PP_DEPTH + 16;
        let cq = ctx.create_cq(depth * 2, None)?;
        let mut qp = pd.create_qp(&QpInitAttr {
            send_cq: &cq,
            recv_cq: &cq,
            srq: None,
            caps: QpCaps {
                max_send_wr: depth,
                max_recv_wr: PP_DEPTH + 4,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 64,
            },
            sq_sig_all: false,
        })?;
        let half = max as usize;
        let mr = pd.alloc_mr(
            2 * half,
            Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE,
        )?;
        let access = Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE;
        qp.modify_to_init(opts.ib_port, access)?;
        let psn = if server { 0x1000 } else { 0x2000 };
        let me = PeerInfo {
            ep: qp.endpoint(opts.ib_port, gid_index, psn)?,
            addr: mr.addr(),
            rkey: mr.rkey(),
            len: mr.len() as u64,
        };
        oob.send_info(&me)?;
        let peer = oob.recv_info()?;
        println!(
            "local  QP {:#08x} PSN {:#08x} LID {} GID {}\nremote QP {:#08x} PSN {:#08x} LID {} GID {}",
            me.ep.qp_num,
            me.ep.psn,
            me.ep.lid,
            me.ep.gid,
            peer.ep.qp_num,
            peer.ep.psn,
            peer.ep.lid,
            peer.ep.gid
        );
        let mtu = Mtu::from_code(match opts.mtu {
            256 => 1,
            512 => 2,
            1024 => 3,
            2048 => 4,
            4096 => 5,
            other => bail!("--mtu {other}: use 256, 512, 1024, 2048 or 4096"),
        })
        .unwrap_or(Mtu::Mtu1024)
        .min(port.active_mtu);
        let rd = ctx.query_device()?.max_qp_rd_atom.clamp(1, 16) as u8;
        qp.modify_to_rtr(&RtrAttr {
            remote: peer.ep,
            port_num: opts.ib_port,
            sgid_index: gid_index,
            path_mtu: mtu,
            max_dest_rd_atomic: rd,
            min_rnr_timer: 12,
        })
        .map_err(|e| {
            let hint = gid::check_index(&table, gid_index as u32, local_ip)
                .unwrap_or_else(|| format!("GID index {gid_index} carries {local_ip}"));
            anyhow::anyhow!("failed to modify QP state to RTR: {e} ({hint})")
        })?;
        qp.modify_to_rts(&RtsAttr {
            sq_psn: psn,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            max_rd_atomic: rd,
        })
        .context("failed to modify QP state to RTS")?;
        // Both sides at RTS before anyone sends.
        oob.send("RTS")?;
        oob.expect("RTS")?;
        let max_inline = qp.caps().max_inline_data;
        Ok(Pingpong {
            _ctx: ctx,
            _pd: pd,
            cq,
            qp,
            mr,
            half,
            peer,
            oob,
            max_inline,
            timeout: Duration::from_secs(opts.timeout),
            stash: Vec::new(),
        })
    }

    fn post_recv(&mut self, len: u32) -> Result<()> {
        let sge = self.mr.sge(self.half, len);
        self.qp.post_recv(&[RecvWr {
            wr_id: WR_RECV,
            sges: &[sge],
        }])?;
        Ok(())
    }

    fn post_send(&mut self, len: u32) -> Result<()> {
        let sge = self.mr.sge(0, len);
        let mut flags = SendFlags::SIGNALED;
        if len <= self.max_inline {
            flags |= SendFlags::INLINE;
        }
        self.qp.post_send(&[SendWr {
            wr_id: WR_SEND,
            op: SendOp::Send,
            sges: &[sge],
            flags,
        }])?;
        Ok(())
    }

    /// Polls until a completion of `kind` arrives; others are kept for later.
    fn wait(&mut self, kind: u64) -> Result<WorkCompletion> {
        if let Some(i) = self.stash.iter().position(|w| w.wr_id & KIND_MASK == kind) {
            return Ok(self.stash.remove(i));
        }
        let deadline = Instant::now() + self.timeout;
        let mut wc = [WorkCompletion::default(); 16];
        loop {
            let n = self.cq.poll(&mut wc)?;
            let mut found = None;
            for w in &wc[..n] {
                if w.status != WcStatus::Success {
                    bail!(
                        "work request {:#x} failed: {:?} (vendor error {:#x})",
                        w.wr_id,
                        w.status,
                        w.vendor_err
                    );
                }
                if found.is_none() && w.wr_id & KIND_MASK == kind {
                    found = Some(*w);
                } else {
                    self.stash.push(*w);
                }
            }
            if let Some(w) = found {
                return Ok(w);
            }
            if n == 0 && Instant::now() > deadline {
                bail!(
                    "no completion within {:?} (is the peer still polling?)",
                    self.timeout
                );
            }
        }
    }

    /// Server: follow the client's phases until BYE.
    fn serve(&mut self) -> Result<()> {
        loop {
            let line = self.oob.recv()?;
            let mut f = line.split_whitespace();
            let cmd = f.next().unwrap_or("");
            let size: u32 = f.next().and_then(|s| s.parse().ok()).unwrap_or(0);
            if size as usize > self.half {
                bail!(
                    "client asked for {size} bytes, above this server's {}",
                    self.half
                );
            }
            match cmd {
                "VERIFY" => self.serve_verify(size)?,
                "LAT" => {
                    self.post_recv(size)?;
                    self.oob.send("READY")?;
                    self.serve_echo()?;
                }
                "BW" => {
                    self.oob.send("READY")?;
                    self.serve_idle()?;
                }
                "BYE" => {
                    println!("pingpong server: done");
                    return Ok(());
                }
                other => bail!("protocol: unknown phase {other:?}"),
            }
        }
    }

    fn serve_verify(&mut self, size: u32) -> Result<()> {
        // SEND/RECV: receive the client's pattern, check it, send it back.
        self.post_recv(size)?;
        self.oob.send("READY")?;
        let w = self.wait(WR_RECV)?;
        check(w.byte_len == size, "SEND/RECV length", w.byte_len, size)?;
        let got = self.mr.read_vec(self.half..self.half + size as usize)?;
        if got != pattern(size, 1) {
            self.oob.send("BAD recv")?;
            bail!("SEND/RECV: the received data differs from what the client sent");
        }
        self.mr.write_at(0, &got)?;
        self.post_send(size)?;
        self.wait(WR_SEND)?;
        // RDMA WRITE: the client writes into our first half, then says so.
        self.oob.send("OK")?;
        self.expect_polling("WROTE")?;
        if self.mr.read_vec(0..size as usize)? != pattern(size, 2) {
            self.oob.send("BAD write")?;
            bail!("RDMA WRITE: the data in the server's buffer differs from what the client wrote");
        }
        // RDMA READ: the client reads our first half.
        self.mr.write_at(0, &pattern(size, 3))?;
        self.oob.send("OK")?;
        self.expect_polling("READ")?;
        Ok(())
    }

    /// Echo every message back until the client says DONE.
    fn serve_echo(&mut self) -> Result<()> {
        let mut wc = [WorkCompletion::default(); 16];
        let mut polls = 0u32;
        loop {
            let n = self.cq.poll(&mut wc)?;
            for w in &wc[..n] {
                if w.status != WcStatus::Success {
                    bail!("work request {:#x} failed: {:?}", w.wr_id, w.status);
                }
                if w.wr_id & KIND_MASK == WR_RECV {
                    self.post_recv(self.half as u32)?;
                    self.post_send(w.byte_len)?;
                }
            }
            polls += 1;
            if polls % 1024 == 0 && self.oob.try_recv()?.is_some() {
                return Ok(());
            }
        }
    }

    /// Keep polling (the soft TCP fabric answers RDMA traffic only when polled) until DONE.
    fn serve_idle(&mut self) -> Result<()> {
        self.expect_polling("DONE")
    }

    fn expect_polling(&mut self, want: &str) -> Result<()> {
        let mut wc = [WorkCompletion::default(); 16];
        let mut polls = 0u32;
        loop {
            let n = self.cq.poll(&mut wc)?;
            self.stash.extend_from_slice(&wc[..n]);
            polls += 1;
            if polls % 256 == 0 {
                if let Some(line) = self.oob.try_recv()? {
                    if line != want {
                        bail!("protocol: expected {want:?} from the client, got {line:?}");
                    }
                    return Ok(());
                }
            }
        }
    }

    /// Client: verify, then measure each size, then print the table.
    fn drive(&mut self, iters: u32, sizes: &[u32], window: u32) -> Result<()> {
        let vsize = *sizes.iter().max().unwrap_or(&4096);
        self.verify(vsize)?;
        println!(
            "verify: SEND/RECV both ways, RDMA WRITE and RDMA READ of {vsize} bytes: contents OK"
        );
        println!(
            "\n{:>8} {:>7} {:>9} {:>9} {:>9} {:>9} {:>9} {:>11} {:>10}",
            "bytes",
            "iters",
            "lat min",
            "lat p50",
            "lat p99",
            "p99.9",
            "max",
            "write MB/s",
            "Mmsg/s"
        );
        println!(
            "{:>8} {:>7} {:>9} {:>9} {:>9} {:>9} {:>9}",
            "", "", "(us)", "(us)", "(us)", "(us)", "(us)"
        );
        for &size in sizes {
            let h = self.latency(size, iters)?;
            let (mbs, mmsgs) = self.bandwidth(size, iters, window)?;
            let us = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;
            println!(
                "{size:>8} {iters:>7} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {mbs:>11.1} {mmsgs:>10.3}",
                h.min() as f64 / 1000.0,
                us(0.5),
                us(0.99),
                us(0.999),
                h.max() as f64 / 1000.0
            );
        }
        self.oob.send("BYE")?;
        println!("\npingpong: PASS");
        Ok(())
    }

    fn verify(&mut self, size: u32) -> Result<()> {
        self.oob.send(&format!("VERIFY {size}"))?;
        self.oob.expect("READY")?;
        // SEND/RECV there and back.
        self.post_recv(size)?;
        self.mr.write_at(0, &pattern(size, 1))?;
        self.post_send(size)?;
        self.wait(WR_SEND)?;
        let w = self.wait(WR_RECV)?;
        check(w.byte_len == size, "echoed length", w.byte_len, size)?;
        if self.mr.read_vec(self.half..self.half + size as usize)? != pattern(size, 1) {
            bail!("SEND/RECV: the echoed data differs from what was sent");
        }
        self.oob.expect("OK")?;
        // RDMA WRITE into the server's first half.
        self.mr.write_at(0, &pattern(size, 2))?;
        let sge = self.mr.sge(0, size);
        let op = SendOp::RdmaWrite {
            remote_addr: self.peer.addr,
            rkey: self.peer.rkey,
        };
        self.qp.post_send(&[SendWr {
            wr_id: WR_WRITE,
            op,
            sges: &[sge],
            flags: SendFlags::SIGNALED,
        }])?;
        self.wait(WR_WRITE)?;
        self.oob.send("WROTE")?;
        match self.oob.recv()?.as_str() {
            "OK" => {}
            other => bail!("RDMA WRITE: the server reports {other:?}"),
        }
        // RDMA READ of the server's first half into our second half.
        let sge = self.mr.sge(self.half, size);
        let op = SendOp::RdmaRead {
            remote_addr: self.peer.addr,
            rkey: self.peer.rkey,
        };
        self.qp.post_send(&[SendWr {
            wr_id: WR_READ,
            op,
            sges: &[sge],
            flags: SendFlags::SIGNALED,
        }])?;
        self.wait(WR_READ)?;
        if self.mr.read_vec(self.half..self.half + size as usize)? != pattern(size, 3) {
            bail!("RDMA READ: the data read differs from the server's buffer");
        }
        self.oob.send("READ")?;
        Ok(())
    }

    /// SEND/RECV ping-pong: half of each round trip, in nanoseconds.
    fn latency(&mut self, size: u32, iters: u32) -> Result<Histogram<u64>> {
        self.oob.send(&format!("LAT {size}"))?;
        self.oob.expect("READY")?;
        let mut h = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3)?;
        for _ in 0..iters {
            self.post_recv(size)?;
            let t0 = Instant::now();
            self.post_send(size)?;
            self.wait(WR_RECV)?;
            let half_rtt = t0.elapsed().as_nanos() as u64 / 2;
            h.record(half_rtt.max(1))?;
            self.wait(WR_SEND)?;
        }
        self.oob.send("DONE")?;
        Ok(h)
    }

    /// A window of RDMA WRITEs: MB/s and millions of messages per second.
    fn bandwidth(&mut self, size: u32, iters: u32, window: u32) -> Result<(f64, f64)> {
        self.oob.send(&format!("BW {size}"))?;
        self.oob.expect("READY")?;
        let size = size.min(self.peer.len as u32);
        let sge = self.mr.sge(0, size);
        let op = SendOp::RdmaWrite {
            remote_addr: self.peer.addr,
            rkey: self.peer.rkey,
        };
        let (mut posted, mut done) = (0u32, 0u32);
        let mut wc = [WorkCompletion::default(); 32];
        let t0 = Instant::now();
        let mut last_progress = Instant::now();
        while done < iters {
            while posted < iters && posted - done < window {
                let flags = if size <= self.max_inline {
                    SendFlags::SIGNALED | SendFlags::INLINE
                } else {
                    SendFlags::SIGNALED
                };
                self.qp.post_send(&[SendWr {
                    wr_id: WR_WRITE | posted as u64,
                    op,
                    sges: &[sge],
                    flags,
                }])?;
                posted += 1;
            }
            let n = self.cq.poll(&mut wc)?;
            for w in &wc[..n] {
                if w.status != WcStatus::Success {
                    bail!("RDMA WRITE {:#x} failed: {:?}", w.wr_id, w.status);
                }
                done += 1;
            }
            if n > 0 {
                last_progress = Instant::now();
            } else if last_progress.elapsed() > self.timeout {
                bail!("bandwidth phase stalled: {done} of {iters} writes completed");
            }
        }
        let secs = t0.elapsed().as_secs_f64();
        self.oob.send("DONE")?;
        Ok((
            iters as f64 * size as f64 / secs / 1e6,
            iters as f64 / secs / 1e6,
        ))
    }
}

fn pattern(size: u32, seed: u8) -> Vec<u8> {
    (0..size)
        .map(|i| {
            (i as u8)
                .wrapping_mul(13)
                .wrapping_add(seed)
                .rotate_left(seed as u32 % 8)
        })
        .collect()
}

fn check(ok: bool, what: &str, got: u32, want: u32) -> Result<()> {
    if !ok {
        bail!("{what}: got {got}, expected {want}");
    }
    Ok(())
}
