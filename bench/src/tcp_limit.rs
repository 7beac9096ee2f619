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

use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};

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
    /// `depth` I/Os always in flight).
    pub avg_us: f64,
}

/// The loopback limit at `depth` I/Os in flight, measured for `duration` after a warm-up.
pub fn measure(
    depth: usize,
    duration: Duration,
    target_core: usize,
    host_core: usize,
    pin: bool,
) -> Result<Limit> {
    if depth == 0 {
        bail!("depth 0: nothing would be in flight");
    }
    let listener =
        TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).context("binding a loopback port")?;
    let addr = listener.local_addr()?;
    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| -> Result<Limit> {
        let stop = &stop;
        let target = scope.spawn(move || -> Result<()> {
            super::wire::pin(target_core, pin);
            let (stream, _) = listener
                .accept()
                .context("accepting the host's connection")?;
            answer(stream, depth, stop)
        });
        let result = (|| {
            super::wire::pin(host_core, pin);
            let stream = TcpStream::connect(addr).context("connecting over loopback")?;
            let limit = issue(&stream, depth, duration);
            // Before the close: the target takes the reset that follows as the end.
            stop.store(true, Ordering::Relaxed);
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
fn read_some(mut stream: &TcpStream, buf: &mut [u8]) -> Result<usize> {
    match stream.read(buf) {
        Ok(0) => bail!("the peer closed the connection"),
        Ok(n) => Ok(n),
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => Ok(0),
        Err(e) => Err(e).context("reading"),
    }
}

/// Writes up to `owed` bytes from `data` (repeated as needed); returns what was written.
fn write_some(mut stream: &TcpStream, data: &[u8], owed: usize) -> Result<usize> {
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

/// The target's side: reads commands, writes their answers, until `stop` (set before the host
/// closes: an error after it is the close).
fn answer(stream: TcpStream, depth: usize, stop: &AtomicBool) -> Result<()> {
    match serve(&stream, depth, stop) {
        Err(_) if stop.load(Ordering::Relaxed) => Ok(()),
        other => other,
    }
}

fn serve(stream: &TcpStream, depth: usize, stop: &AtomicBool) -> Result<()> {
    prepare(stream)?;
    let mut inbound = vec![0u8; TARGET_READ];
    // Answers carry data: a pattern, not zeroes, though the kernel copies either alike.
    let answers: Vec<u8> = (0..depth * ANSWER).map(|i| i as u8).collect();
    let mut command_bytes = 0usize;
    let mut owed = 0usize;
    let mut last_progress = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        let got = read_some(stream, &mut inbound)?;
        command_bytes += got;
        owed += command_bytes / COMMAND * ANSWER;
        command_bytes %= COMMAND;
        let wrote = write_some(stream, &answers, owed)?;
        owed -= wrote;
        if got + wrote > 0 {
            last_progress = Instant::now();
        } else if last_progress.elapsed() > STALL {
            bail!("no command from the host for {STALL:?}");
        }
    }
    Ok(())
}

/// The host's side: keeps `depth` commands in flight and counts answers.
fn issue(stream: &TcpStream, depth: usize, duration: Duration) -> Result<Limit> {
    prepare(stream)?;
    let mut inbound = vec![0u8; HOST_READ];
    let commands = vec![0x5au8; depth * COMMAND];
    let mut owed = depth * COMMAND;
    let mut answer_bytes = 0usize;
    let mut done = 0u64;
    let start = Instant::now();
    let mut measured: Option<(Instant, u64)> = None;
    let mut last_progress = start;
    loop {
        let wrote = write_some(stream, &commands, owed)?;
        owed -= wrote;
        let got = read_some(stream, &mut inbound)?;
        answer_bytes += got;
        let answered = answer_bytes / ANSWER;
        answer_bytes %= ANSWER;
        done += answered as u64;
        owed += answered * COMMAND;
        if got + wrote > 0 {
            last_progress = Instant::now();
            let now = start.elapsed();
            match measured {
                None if now >= WARMUP => measured = Some((Instant::now(), done)),
                Some((t0, first)) if now >= WARMUP + duration => {
                    let iops = (done - first) as f64 / t0.elapsed().as_secs_f64();
                    return Ok(Limit {
                        iops,
                        avg_us: depth as f64 / iops * 1e6,
                    });
                }
                _ => {}
            }
        } else if last_progress.elapsed() > STALL {
            bail!("no answer from the target for {STALL:?}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_flow_and_both_sides_stop() {
        // Unpinned (a test machine may have one core): that it ends and counts answers.
        for depth in [1, 8] {
            let limit = measure(depth, Duration::from_millis(50), 0, 1, false).unwrap();
            assert!(limit.iops > 0.0 && limit.avg_us > 0.0, "{limit:?}");
        }
    }

    #[test]
    fn depth_zero_is_refused() {
        assert!(measure(0, Duration::from_millis(1), 0, 1, false).is_err());
    }
}
