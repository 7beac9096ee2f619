//! CPU time of a thread, read from /proc: how "an idle reactor does not burn its core" is
//! measured (benchmarks and examples, never the fast path).

use std::time::Duration;

/// The kernel thread id of the calling thread.
pub fn current_tid() -> std::io::Result<u32> {
    let link = std::fs::read_link("/proc/thread-self")?;
    link.file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("unexpected /proc/thread-self: {link:?}")))
}

/// CPU time thread `tid` of this process has used: schedstat's run time (ns), or utime + stime
/// from stat (clock ticks, USER_HZ = 100) where schedstat is missing.
pub fn thread_cpu_time(tid: u32) -> std::io::Result<Duration> {
    if let Ok(s) = std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat")) {
        if let Some(ns) = s.split_whitespace().next().and_then(|v| v.parse().ok()) {
            return Ok(Duration::from_nanos(ns));
        }
    }
    let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat"))?;
    // Fields after the parenthesised command name; utime and stime are the 12th and 13th.
    let rest = stat.rfind(')').map(|i| &stat[i + 1..]).unwrap_or("");
    let f: Vec<u64> = rest
        .split_whitespace()
        .map(|v| v.parse().unwrap_or(0))
        .collect();
    match (f.get(11), f.get(12)) {
        (Some(u), Some(s)) => Ok(Duration::from_millis((u + s) * 10)),
        _ => Err(std::io::Error::other(format!(
            "unexpected /proc/self/task/{tid}/stat"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_busy_thread_accumulates_cpu_time() {
        let tid = current_tid().unwrap();
        let before = thread_cpu_time(tid).unwrap();
        let t = std::time::Instant::now();
        let mut x = 0u64;
        while t.elapsed() < Duration::from_millis(30) {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        assert!(thread_cpu_time(tid).unwrap() > before);
    }
}
