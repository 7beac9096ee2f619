//! `tcp`'s ceiling: what the kernel's loopback TCP alone allows for the bytes of a 4 KiB read
//! over soft TCP, with no RDMA or NVMe work in user space. Two pinned threads (the target's
//! core and the host's), one loopback connection, non-blocking sockets polled in a busy loop as
//! the reactors poll theirs. The host keeps `depth` commands in flight; each is [`COMMAND`]
//! bytes (a soft TCP SEND frame carrying a 64-byte capsule). For each command it reads, the
//! target writes [`ANSWER`] bytes (a WRITE frame with 4 KiB of data and a SEND frame with the
//! 16-byte response), all of one pass's answers in one write, as the soft TCP target does; the
//! host counts an I/O done when its answer's last byte is read and writes the commands the
//! freed slots allow, also one write per pass.
//!
//! The figure bounds (c) from above: nvmf-tgt and nvmf-perf move these same bytes and do their
//! protocol work besides. The kernel copies every byte twice (into the socket, out of it) and
//! on loopback the sender's core also runs the receiving side's TCP processing.
//!
//! [`measure_connections`] is (e)'s ceiling over TCP: the same bytes over many connections
//! (one per qpair, as soft TCP carries each QP on its own), `depth` I/Os in flight on each,
//! both sides finding their ready connections through edge-triggered epoll polled with a zero
//! timeout, as the soft TCP fabric's CQs do.

use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use mio::{Events, Interest, Poll, Token};

/// Soft TCP frame header (transport/src/soft/tcp.rs).
const FRAME_HEADER: usize = 32;
/// A command as soft TCP carries it: one SEND frame with the 64-byte capsule.
pub const COMMAND: usize = FRAME_HEADER + 64;
/// A 4 KiB read's answer: a WRITE frame with the data and a SEND frame with the response.
pub const ANSWER: usize = FRAME_HEADER + 4096 + FRAME_HEADER + 16;
/// Warm-up before the measured window.
const WARMUP: Duration = Duration::from_millis(200);
/// The host's read buffer (soft TCP's largest input buffer).
const HOST_READ: usize = 256 * 1024;
/// The target's read buffer.
const TARGET_READ: usize = 64 * 1024;
/// How long a side waits on a silent peer before it gives up.
const STALL: Duration = Duration::from_secs(5);

/// I/Os per second and the average time each was in flight.
#[derive(Debug, Clone, Copy)]
pub struct Limit {
    /// Answers completed per second in the measured window.
    pub iops: f64,
    /// Average microseconds from a command's write to its answer's read (by Little's law:
    /// every I/O slot always in flight).
    pub avg_us: f64,
}

/// Where the two sides' threads run.
#[derive(Debug, Clone, Copy)]
pub struct Cores {
    /// The answering side's core (the target's).
    pub target: usize,
    /// The issuing side's core (the host's).
    pub host: usize,
    /// Pin the threads to those cores.
    pub pin: bool,
}

/// The loopback limit at `depth` I/Os in flight on one connection polled directly, measured
/// for `duration` after a warm-up.
pub fn measure(depth: usize, duration: Duration, cores: Cores) -> Result<Limit> {
    if depth == 0 {
        bail!("depth 0: nothing would be in flight");
    }
    run_pair(
        1,
        cores,
        |streams, stop| serve(&streams[0], depth, stop),
        |streams| issue(&streams[0], depth, duration),
    )
}

/// The loopback limit over `connections` connections with `depth` I/Os in flight on each,
/// both sides polling epoll for the ready ones, measured for `duration` after a warm-up.
pub fn measure_connections(
    connections: usize,
    depth: usize,
    duration: Duration,
    cores: Cores,
) -> Result<Limit> {
    if connections == 0 || depth == 0 {
        bail!("{connections} connections x depth {depth}: nothing would be in flight");
    }
    run_pair(
        connections,
        cores,
        |streams, stop| serve_many(streams, depth, stop),
        |streams| issue_many(streams, depth, duration),
    )
}

/// Runs the target's side (`serve`, on its own thread) and the host's (`issue`, on this one)
/// over `connections` loopback connections; the host's result is the figure.
fn run_pair(
    connections: usize,
    cores: Cores,
    serve: impl FnOnce(Vec<TcpStream>, &AtomicBool) -> Result<()> + Send,
    issue: impl FnOnce(Vec<TcpStream>) -> Result<Limit>,
) -> Result<Limit> {
    let listener =
        TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).context("binding a loopback port")?;
    let addr = listener.local_addr()?;
    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| -> Result<Limit> {
        let stop = &stop;
        let target = scope.spawn(move || -> Result<()> {
            super::wire::pin(cores.target, cores.pin);
            // Non-blocking: a host that failed to connect them all sets `stop` instead.
            listener.set_nonblocking(true)?;
            let mut streams = Vec::with_capacity(connections);
            while streams.len() < connections {
                match listener.accept() {
                    Ok((stream, _)) => streams.push(stream),
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {
                        if stop.load(Ordering::Relaxed) {
                            return Ok(());
                        }
                        std::thread::yield_now();
                    }
                    Err(e) => return Err(e).context("accepting the host's connection"),
                }
            }
            // An error once the host is done is its close.
            match serve(streams, stop) {
                Err(_) if stop.load(Ordering::Relaxed) => Ok(()),
                other => other,
            }
        });
        let result = (|| {
            super::wire::pin(cores.host, cores.pin);
            let mut streams = Vec::with_capacity(connections);
            for _ in 0..connections {
                streams.push(TcpStream::connect(addr).context("connecting over loopback")?);
            }
            // `issue` closes what it is given when it returns: these copies keep the
            // connections open until `stop` is set, so that the target takes the close that
            // follows as the end.
            let open = streams
                .iter()
                .map(TcpStream::try_clone)
                .collect::<std::io::Result<Vec<_>>>()
                .context("duplicating a connection")?;
            let limit = issue(streams);
            stop.store(true, Ordering::Relaxed);
            drop(open);
            limit
        })();
        stop.store(true, Ordering::Relaxed);
        let served = target
            .join()
            .map_err(|_| anyhow::anyhow!("the target thread panicked"))?;
        let limit = result?;
        served.context("the target side")?;
        Ok(limit)
    })
}

fn prepare(stream: &TcpStream) -> Result<()> {
    stream.set_nodelay(true)?;
    stream.set_nonblocking(true)?;
    Ok(())
}

/// Bytes read into `buf`: 0 when nothing is there yet; an error when the peer closed.
fn read_some(mut stream: impl Read, buf: &mut [u8]) -> Result<usize> {
    match stream.read(buf) {
        Ok(0) => bail!("the peer closed the connection"),
        Ok(n) => Ok(n),
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => Ok(0),
        Err(e) => Err(e).context("reading"),
    }
}

/// Writes up to `owed` bytes from `data` (repeated as needed); returns what was written.
fn write_some(mut stream: impl Write, data: &[u8], owed: usize) -> Result<usize> {
    let len = owed.min(data.len());
    if len == 0 {
        return Ok(0);
    }
    match stream.write(&data[..len]) {
        Ok(n) => Ok(n),
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => Ok(0),
        Err(e) => Err(e).context("writing"),
    }
}

/// A side's watch on its peer: a pass that moved bytes is progress; none for [`STALL`] is an
/// error naming what did not come.
struct Progress {
    last: Instant,
    awaited: &'static str,
}

impl Progress {
    fn new(awaited: &'static str) -> Progress {
        Progress {
            last: Instant::now(),
            awaited,
        }
    }

    /// The pass's time when it moved bytes (one clock read); an error when none moved for
    /// too long.
    fn pass(&mut self, moved: usize) -> Result<Option<Instant>> {
        let now = Instant::now();
        if moved > 0 {
            self.last = now;
            Ok(Some(now))
        } else if now.duration_since(self.last) > STALL {
            bail!("no {} for {STALL:?}", self.awaited)
        } else {
            Ok(None)
        }
    }
}

/// The host's count: a warm-up, then `duration` of answers counted.
struct Window {
    start: Instant,
    duration: Duration,
    /// When the counted part began and the answers done by then.
    counting: Option<(Instant, u64)>,
    /// I/O slots always in flight (for the average by Little's law).
    in_flight: usize,
}

impl Window {
    fn new(duration: Duration, in_flight: usize) -> Window {
        Window {
            start: Instant::now(),
            duration,
            counting: None,
            in_flight,
        }
    }

    /// After a pass at `now` with `done` answers in all: the figure once the window is over.
    fn after(&mut self, now: Instant, done: u64) -> Option<Limit> {
        let since_start = now.duration_since(self.start);
        match self.counting {
            None if since_start >= WARMUP => self.counting = Some((now, done)),
            Some((t0, first)) if since_start >= WARMUP + self.duration => {
                let iops = (done - first) as f64 / now.duration_since(t0).as_secs_f64();
                return Some(Limit {
                    iops,
                    avg_us: self.in_flight as f64 / iops * 1e6,
                });
            }
            _ => {}
        }
        None
    }
}

/// The target's side on one connection: reads commands, writes their answers, until `stop`.
fn serve(stream: &TcpStream, depth: usize, stop: &AtomicBool) -> Result<()> {
    prepare(stream)?;
    let mut inbound = vec![0u8; TARGET_READ];
    // Answers carry data: a pattern, not zeroes, though the kernel copies either alike.
    let answers: Vec<u8> = (0..depth * ANSWER).map(|i| i as u8).collect();
    let mut command_bytes = 0usize;
    let mut owed = 0usize;
    let mut progress = Progress::new("command from the host");
    while !stop.load(Ordering::Relaxed) {
        let got = read_some(stream, &mut inbound)?;
        command_bytes += got;
        owed += command_bytes / COMMAND * ANSWER;
        command_bytes %= COMMAND;
        let wrote = write_some(stream, &answers, owed)?;
        owed -= wrote;
        progress.pass(got + wrote)?;
    }
    Ok(())
}

/// The host's side on one connection: keeps `depth` commands in flight and counts answers.
fn issue(stream: &TcpStream, depth: usize, duration: Duration) -> Result<Limit> {
    prepare(stream)?;
    let mut inbound = vec![0u8; HOST_READ];
    let commands = vec![0x5au8; depth * COMMAND];
    let mut owed = depth * COMMAND;
    let mut answer_bytes = 0usize;
    let mut done = 0u64;
    let mut window = Window::new(duration, depth);
    let mut progress = Progress::new("answer from the target");
    loop {
        let wrote = write_some(stream, &commands, owed)?;
        owed -= wrote;
        let got = read_some(stream, &mut inbound)?;
        answer_bytes += got;
        let answered = answer_bytes / ANSWER;
        answer_bytes %= ANSWER;
        done += answered as u64;
        owed += answered * COMMAND;
        if let Some(now) = progress.pass(got + wrote)? {
            if let Some(limit) = window.after(now, done) {
                return Ok(limit);
            }
        }
    }
}

/// One side's connections, each registered for edge-triggered readiness under its index.
struct Ready {
    poll: Poll,
    events: Events,
    streams: Vec<mio::net::TcpStream>,
}

impl Ready {
    fn new(streams: Vec<TcpStream>) -> Result<Ready> {
        let poll = Poll::new().context("epoll")?;
        let mut registered = Vec::with_capacity(streams.len());
        for (index, stream) in streams.into_iter().enumerate() {
            prepare(&stream)?;
            let mut stream = mio::net::TcpStream::from_std(stream);
            poll.registry()
                .register(
                    &mut stream,
                    Token(index),
                    Interest::READABLE | Interest::WRITABLE,
                )
                .context("registering a connection")?;
            registered.push(stream);
        }
        Ok(Ready {
            poll,
            events: Events::with_capacity(registered.len()),
            streams: registered,
        })
    }

    /// Indexes of the connections with a readiness event since the last call (no wait).
    fn poll(&mut self, ready: &mut Vec<usize>) -> Result<()> {
        ready.clear();
        match self.poll.poll(&mut self.events, Some(Duration::ZERO)) {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::Interrupted => return Ok(()),
            Err(e) => return Err(e).context("epoll_wait"),
        }
        ready.extend(self.events.iter().map(|event| event.token().0));
        Ok(())
    }

    /// Bytes read from connection `index` until a short read (edge-triggered: what arrives
    /// later raises a new event).
    fn drain(&self, index: usize, buf: &mut [u8]) -> Result<usize> {
        let mut total = 0;
        loop {
            let got = read_some(&self.streams[index], buf)?;
            total += got;
            if got < buf.len() {
                return Ok(total);
            }
        }
    }
}

/// The target's side over many connections: each ready connection's commands read and their
/// answers written in one write (what the socket does not take waits for its write event).
fn serve_many(streams: Vec<TcpStream>, depth: usize, stop: &AtomicBool) -> Result<()> {
    let mut ready = Ready::new(streams)?;
    let count = ready.streams.len();
    let mut inbound = vec![0u8; TARGET_READ];
    let answers: Vec<u8> = (0..depth * ANSWER).map(|i| i as u8).collect();
    let mut command_bytes = vec![0usize; count];
    let mut owed = vec![0usize; count];
    let mut indexes = Vec::with_capacity(count);
    let mut progress = Progress::new("command from the host");
    while !stop.load(Ordering::Relaxed) {
        ready.poll(&mut indexes)?;
        let mut moved = 0;
        for &index in &indexes {
            let got = ready.drain(index, &mut inbound)?;
            command_bytes[index] += got;
            owed[index] += command_bytes[index] / COMMAND * ANSWER;
            command_bytes[index] %= COMMAND;
            let wrote = write_some(&ready.streams[index], &answers, owed[index])?;
            owed[index] -= wrote;
            moved += got + wrote;
        }
        progress.pass(moved)?;
    }
    Ok(())
}

/// The host's side over many connections: keeps `depth` commands in flight on each and
/// counts answers.
fn issue_many(streams: Vec<TcpStream>, depth: usize, duration: Duration) -> Result<Limit> {
    let mut ready = Ready::new(streams)?;
    let count = ready.streams.len();
    let mut inbound = vec![0u8; HOST_READ];
    let commands = vec![0x5au8; depth * COMMAND];
    // Each connection's first commands go out on its first (writable) event.
    let mut owed = vec![depth * COMMAND; count];
    let mut answer_bytes = vec![0usize; count];
    let mut answered_on = vec![0u64; count];
    let mut indexes = Vec::with_capacity(count);
    let mut done = 0u64;
    let mut window = Window::new(duration, count * depth);
    let mut progress = Progress::new("answer from the target");
    loop {
        ready.poll(&mut indexes)?;
        let mut moved = 0;
        for &index in &indexes {
            let got = ready.drain(index, &mut inbound)?;
            answer_bytes[index] += got;
            let answered = answer_bytes[index] / ANSWER;
            answer_bytes[index] %= ANSWER;
            done += answered as u64;
            answered_on[index] += answered as u64;
            owed[index] += answered * COMMAND;
            let wrote = write_some(&ready.streams[index], &commands, owed[index])?;
            owed[index] -= wrote;
            moved += got + wrote;
        }
        if let Some(now) = progress.pass(moved)? {
            if let Some(limit) = window.after(now, done) {
                // A connection never answered would make this a figure of fewer connections.
                if let Some(idle) = answered_on.iter().position(|&n| n == 0) {
                    bail!("connection {idle} of {count} had no answer in the run");
                }
                return Ok(limit);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A test machine may have one core: that it ends and counts answers.
    const UNPINNED: Cores = Cores {
        target: 0,
        host: 1,
        pin: false,
    };

    #[test]
    fn answers_flow_and_both_sides_stop() {
        for depth in [1, 8] {
            let limit = measure(depth, Duration::from_millis(50), UNPINNED).unwrap();
            assert!(limit.iops > 0.0 && limit.avg_us > 0.0, "{limit:?}");
        }
    }

    #[test]
    fn depth_zero_is_refused() {
        assert!(measure(0, Duration::from_millis(1), UNPINNED).is_err());
        assert!(measure_connections(4, 0, Duration::from_millis(1), UNPINNED).is_err());
        assert!(measure_connections(0, 4, Duration::from_millis(1), UNPINNED).is_err());
    }

    #[test]
    fn answers_flow_on_every_connection() {
        for (connections, depth) in [(1, 4), (16, 1), (8, 2)] {
            let limit =
                measure_connections(connections, depth, Duration::from_millis(50), UNPINNED)
                    .unwrap();
            assert!(limit.iops > 0.0 && limit.avg_us > 0.0, "{limit:?}");
        }
    }
}
