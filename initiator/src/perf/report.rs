//! nvmf-perf's results: per-job counters and latency histograms (hdrhistogram, nanoseconds),
//! merged per namespace and in total, printed as a table like spdk_nvme_perf's or as JSON;
//! and the live progress line.

use std::time::Duration;

use hdrhistogram::Histogram;

use super::verify::Mismatch;

/// Mismatches kept per job (the first ones tell the story).
pub const MAX_MISMATCHES: usize = 16;
/// Messages kept per job of I/O lost with the connection.
pub const MAX_LOST_MESSAGES: u64 = 4;

/// What one job measured.
#[derive(Debug, Clone)]
pub struct JobResult {
    /// Namespace the job ran on.
    pub nsid: u32,
    /// Reads completed successfully.
    pub reads: u64,
    /// Writes completed successfully.
    pub writes: u64,
    /// Bytes moved by successful I/O.
    pub bytes: u64,
    /// Failed I/O.
    pub errors: u64,
    /// I/O failed because the connection was lost (the reconnect policy decides what next).
    pub lost: u64,
    /// First error messages.
    pub error_messages: Vec<String>,
    /// Verify failures.
    pub verify_failures: u64,
    /// Reads whose content was checked against what this run last wrote there.
    pub verified_reads: u64,
    /// Reads of blocks whose content this run did not know (never written by it, or a write
    /// whose outcome is unknown): only their placement was checked.
    pub placement_reads: u64,
    /// I/O completed after the stop: not in the measured figures.
    pub drained: u64,
    /// First mismatches.
    pub mismatches: Vec<Mismatch>,
    /// Latency of successful I/O, ns. Jobs stepped by a `JobSet` share one histogram per
    /// namespace, given back with the namespace's first job (the others' stay empty).
    pub latency: Histogram<u64>,
}

impl JobResult {
    /// An empty result for `nsid`.
    pub fn new(nsid: u32) -> Self {
        Self {
            nsid,
            reads: 0,
            writes: 0,
            bytes: 0,
            errors: 0,
            lost: 0,
            error_messages: Vec::new(),
            verify_failures: 0,
            verified_reads: 0,
            placement_reads: 0,
            drained: 0,
            mismatches: Vec::new(),
            // 3 significant digits, auto-resizing: no upper bound to guess.
            latency: latency_histogram(),
        }
    }

    /// Record one successful I/O.
    pub fn record(&mut self, latency: Duration, bytes: u64, read: bool) {
        record_latency(&mut self.latency, latency);
        self.count(bytes, read);
    }

    /// Count one successful I/O whose latency went to a histogram shared by several jobs
    /// (see `JobSet`).
    pub fn count(&mut self, bytes: u64, read: bool) {
        self.bytes += bytes;
        if read {
            self.reads += 1;
        } else {
            self.writes += 1;
        }
    }

    /// Record a failed I/O.
    pub fn record_error(&mut self, message: String) {
        self.errors += 1;
        if self.error_messages.len() < MAX_MISMATCHES {
            self.error_messages.push(message);
        }
    }

    /// Record an I/O lost with the connection (its first messages are kept with the errors').
    pub fn record_lost(&mut self, message: String) {
        self.lost += 1;
        // A few tell the story; the rest of the list stays for real errors.
        if self.lost <= MAX_LOST_MESSAGES && self.error_messages.len() < MAX_MISMATCHES {
            self.error_messages.push(message);
        }
    }

    /// Record a verify mismatch.
    pub fn record_mismatch(&mut self, m: Mismatch) {
        self.verify_failures += 1;
        if self.mismatches.len() < MAX_MISMATCHES {
            self.mismatches.push(m);
        }
    }

    fn merge(&mut self, other: &JobResult) {
        self.reads += other.reads;
        self.writes += other.writes;
        self.bytes += other.bytes;
        self.errors += other.errors;
        self.lost += other.lost;
        self.verify_failures += other.verify_failures;
        self.verified_reads += other.verified_reads;
        self.placement_reads += other.placement_reads;
        self.drained += other.drained;
        for m in &other.error_messages {
            if self.error_messages.len() < MAX_MISMATCHES {
                self.error_messages.push(m.clone());
            }
        }
        for m in &other.mismatches {
            if self.mismatches.len() < MAX_MISMATCHES {
                self.mismatches.push(*m);
            }
        }
        let _ = self.latency.add(&other.latency);
    }
}

/// A latency histogram as a result keeps it (ns, 3 significant digits, auto-resizing).
pub fn latency_histogram() -> Histogram<u64> {
    Histogram::new(3).unwrap_or_else(|_| unreachable_histogram())
}

/// Record one I/O's latency into `histogram` (ns, at least 1).
pub fn record_latency(histogram: &mut Histogram<u64>, latency: Duration) {
    let ns = u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX).max(1);
    let _ = histogram.record(ns);
}

fn unreachable_histogram() -> Histogram<u64> {
    // 3 significant figures is always valid; keep a bounded fallback rather than panic.
    Histogram::new_with_bounds(1, u64::MAX / 2, 2).unwrap_or_else(|_| {
        Histogram::new_with_max(1 << 40, 1).unwrap_or_else(|_| std::process::abort())
    })
}

/// One row of the report.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Summary {
    /// "nsid 1" or "Total".
    pub name: String,
    /// I/O completed successfully.
    pub ios: u64,
    /// Reads.
    pub reads: u64,
    /// Writes.
    pub writes: u64,
    /// I/O per second.
    pub iops: f64,
    /// MiB per second.
    pub mib_per_s: f64,
    /// Mean latency, µs.
    pub avg_us: f64,
    /// Minimum latency, µs.
    pub min_us: f64,
    /// Maximum latency, µs.
    pub max_us: f64,
    /// Median latency, µs.
    pub p50_us: f64,
    /// 99th percentile, µs.
    pub p99_us: f64,
    /// 99.9th percentile, µs.
    pub p999_us: f64,
    /// Failed I/O.
    pub errors: u64,
    /// I/O lost with the connection.
    pub lost: u64,
    /// Verify failures.
    pub verify_failures: u64,
    /// Reads checked against what this run wrote (--verify).
    pub verified_reads: u64,
    /// Reads of blocks this run had not written: placement checked only (--verify).
    pub placement_reads: u64,
    /// I/O completed after the measured window (not counted above).
    pub drained: u64,
}

fn summarize(name: String, r: &JobResult, seconds: f64) -> Summary {
    let h = &r.latency;
    let us = |ns: u64| ns as f64 / 1000.0;
    let empty = h.is_empty();
    let secs = seconds.max(1e-9);
    Summary {
        name,
        ios: r.reads + r.writes,
        reads: r.reads,
        writes: r.writes,
        iops: (r.reads + r.writes) as f64 / secs,
        mib_per_s: r.bytes as f64 / secs / (1024.0 * 1024.0),
        avg_us: if empty { 0.0 } else { h.mean() / 1000.0 },
        min_us: if empty { 0.0 } else { us(h.min()) },
        max_us: if empty { 0.0 } else { us(h.max()) },
        p50_us: us(h.value_at_quantile(0.5)),
        p99_us: us(h.value_at_quantile(0.99)),
        p999_us: us(h.value_at_quantile(0.999)),
        errors: r.errors,
        lost: r.lost,
        verify_failures: r.verify_failures,
        verified_reads: r.verified_reads,
        placement_reads: r.placement_reads,
        drained: r.drained,
    }
}

/// The final report.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Report {
    /// Measured run time, seconds.
    pub seconds: f64,
    /// One row per namespace, by NSID.
    pub namespaces: Vec<Summary>,
    /// All namespaces.
    pub total: Summary,
    /// First verify mismatches.
    pub mismatches: Vec<Mismatch>,
    /// First error messages.
    pub errors: Vec<String>,
    /// Reconnects of the controller during the run.
    pub reconnects: u32,
    /// I/O completed after the last reconnect (0 without one).
    pub ios_after_reconnect: u64,
    /// The controller was connected when the run ended.
    pub connected_at_end: bool,
    /// Per host reactor that ran jobs (in the order of the run's cores): the share of the
    /// measured window its loop spent in passes that found work, in percent. Below 100 the
    /// host waited for completions (the target bound the run); IOPS / busy share then
    /// estimates what the host cores could carry.
    pub host_busy_percent: Vec<f64>,
    /// Set when jobs ran shallower than the queue depth asked: their I/O queues hold fewer
    /// commands (the controller's CAP.MQES + 1 or the depth the target granted; for a library
    /// caller, also a shared data region smaller than depth x I/O size), so every figure above
    /// is at the smaller depth.
    pub depth_capped: Option<DepthCap>,
    /// Per-I/O keys (nvmf-perf --per-io-keys) the host invalidated itself because the
    /// target's response left them valid (a target that does not send SEND_WITH_INVALIDATE):
    /// a LOCAL_INV per such I/O before it completes. 0 when the fabric does not count them.
    pub host_invalidations: u64,
}

/// A queue depth asked and the one the jobs could run at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct DepthCap {
    /// Commands in flight asked per job (nvmf-perf's -q).
    pub asked: usize,
    /// Commands in flight the shallowest job's I/O queue allowed.
    pub ran: usize,
}

impl std::fmt::Display for DepthCap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "queue depth {} asked, but the controller's I/O queues hold {} commands: \
             the jobs ran at depth {}",
            self.asked, self.ran, self.ran
        )
    }
}

impl Report {
    /// Merge job results into per-namespace rows and a total.
    pub fn build(results: &[JobResult], elapsed: Duration) -> Self {
        let seconds = elapsed.as_secs_f64();
        let mut nsids: Vec<u32> = results.iter().map(|r| r.nsid).collect();
        nsids.sort_unstable();
        nsids.dedup();
        let mut total = JobResult::new(0);
        let namespaces = nsids
            .iter()
            .map(|&nsid| {
                let mut ns = JobResult::new(nsid);
                for r in results.iter().filter(|r| r.nsid == nsid) {
                    ns.merge(r);
                }
                total.merge(&ns);
                summarize(format!("nsid {nsid}"), &ns, seconds)
            })
            .collect();
        Self {
            seconds,
            namespaces,
            total: summarize("Total".into(), &total, seconds),
            mismatches: total.mismatches.clone(),
            errors: total.error_messages.clone(),
            reconnects: 0,
            ios_after_reconnect: 0,
            connected_at_end: true,
            host_busy_percent: Vec::new(),
            depth_capped: None,
            host_invalidations: 0,
        }
    }

    /// True when nothing failed: no I/O error, no verify failure, and the controller connected
    /// at the end (I/O lost with a connection that came back is counted, not a failure).
    pub fn passed(&self) -> bool {
        self.total.errors == 0 && self.total.verify_failures == 0 && self.connected_at_end
    }

    /// The table (latencies in microseconds).
    pub fn to_text(&self) -> String {
        let mut s = String::new();
        s.push_str(&format!(
            "{:<20} {:>12} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}\n",
            "Device",
            "IOPS",
            "MiB/s",
            "avg(us)",
            "min(us)",
            "max(us)",
            "p50(us)",
            "p99(us)",
            "p99.9(us)"
        ));
        for row in self.namespaces.iter().chain(std::iter::once(&self.total)) {
            s.push_str(&format!(
                "{:<20} {:>12.2} {:>10.2} {:>10.2} {:>10.2} {:>10.2} {:>10.2} {:>10.2} {:>10.2}\n",
                row.name,
                row.iops,
                row.mib_per_s,
                row.avg_us,
                row.min_us,
                row.max_us,
                row.p50_us,
                row.p99_us,
                row.p999_us
            ));
        }
        s.push_str(&format!(
            "errors: {}  verify failures: {}  run time: {:.2} s\n",
            self.total.errors, self.total.verify_failures, self.seconds
        ));
        let t = &self.total;
        if t.verified_reads + t.placement_reads > 0 {
            s.push_str(&format!(
                "verified reads: {} against this run's writes, {} of blocks it had not written \
                 (placement only)\n",
                t.verified_reads, t.placement_reads
            ));
        }
        if t.drained > 0 {
            s.push_str(&format!(
                "completed after the stop, not counted: {} I/O\n",
                t.drained
            ));
        }
        if !self.host_busy_percent.is_empty() {
            let shares: Vec<String> = self
                .host_busy_percent
                .iter()
                .map(|p| format!("{p:.1} %"))
                .collect();
            s.push_str(&format!(
                "host reactor busy (passes that found work): {}\n",
                shares.join(", ")
            ));
        }
        if self.total.lost > 0 || self.reconnects > 0 || !self.connected_at_end {
            s.push_str(&format!(
                "lost with the connection: {}  reconnects: {}  I/O after the last reconnect: {}  \
                 connected at the end: {}\n",
                self.total.lost, self.reconnects, self.ios_after_reconnect, self.connected_at_end
            ));
        }
        if self.host_invalidations > 0 {
            s.push_str(&format!(
                "per-I/O keys the host invalidated itself (the target left them valid): {}\n",
                self.host_invalidations
            ));
        }
        if let Some(cap) = &self.depth_capped {
            s.push_str(&format!("warning: {cap}\n"));
        }
        for m in &self.mismatches {
            s.push_str(&format!("{m}\n"));
        }
        for e in &self.errors {
            s.push_str(&format!("error: {e}\n"));
        }
        s
    }

    /// JSON for scripts.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }
}

/// The live line: elapsed time, IOPS and MiB/s over the last interval.
pub fn progress_line(elapsed: Duration, interval: Duration, ios: u64, bytes: u64) -> String {
    let secs = interval.as_secs_f64().max(1e-9);
    format!(
        "[{:>6.1}s] {:>12.0} IOPS {:>10.2} MiB/s",
        elapsed.as_secs_f64(),
        ios as f64 / secs,
        bytes as f64 / secs / (1024.0 * 1024.0)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(nsid: u32, latencies_us: &[u64], bytes: u64) -> JobResult {
        let mut j = JobResult::new(nsid);
        for &l in latencies_us {
            j.record(Duration::from_micros(l), bytes, true);
        }
        j
    }

    #[test]
    fn rows_per_namespace_and_total_with_percentiles() {
        let lat: Vec<u64> = (1..=1000).collect();
        let a = job(1, &lat, 4096);
        let b = job(1, &[2000], 4096);
        let c = job(2, &[10, 10], 1 << 20);
        let r = Report::build(&[a, b, c], Duration::from_secs(2));
        assert_eq!(r.namespaces.len(), 2);
        let ns1 = &r.namespaces[0];
        assert_eq!(ns1.ios, 1001);
        assert!((ns1.iops - 500.5).abs() < 1e-9);
        assert!((ns1.p50_us - 501.0).abs() < 1.0, "{}", ns1.p50_us);
        assert!((ns1.p99_us - 990.0).abs() < 2.0, "{}", ns1.p99_us);
        assert!((ns1.max_us - 2000.0).abs() < 2.0, "{}", ns1.max_us);
        assert!((ns1.min_us - 1.0).abs() < 0.01);
        let ns2 = &r.namespaces[1];
        assert!((ns2.mib_per_s - 1.0).abs() < 1e-9);
        assert_eq!(r.total.ios, 1003);
        assert!(r.passed());
        let text = r.to_text();
        assert!(
            text.lines()
                .any(|l| l.starts_with("nsid 2 ") && l.contains("1.00")),
            "{text}"
        );
        assert!(text.lines().any(|l| l.starts_with("Total")), "{text}");
        let json: serde_json::Value = serde_json::from_str(&r.to_json()).unwrap();
        assert_eq!(json["total"]["ios"], 1003);
        assert_eq!(json["namespaces"][1]["name"], "nsid 2");
        assert!(json["depth_capped"].is_null());
        assert!(!text.contains("warning"), "{text}");
    }

    #[test]
    fn a_capped_queue_depth_is_stated_in_the_text_and_the_json() {
        let mut r = Report::build(&[job(1, &[10], 4096)], Duration::from_secs(1));
        r.depth_capped = Some(DepthCap {
            asked: 1024,
            ran: 128,
        });
        assert!(r.passed(), "a smaller depth is not a failure");
        let text = r.to_text();
        assert!(
            text.contains(
                "warning: queue depth 1024 asked, but the controller's I/O queues hold 128 \
                 commands: the jobs ran at depth 128"
            ),
            "{text}"
        );
        let json: serde_json::Value = serde_json::from_str(&r.to_json()).unwrap();
        assert_eq!(json["depth_capped"]["asked"], 1024);
        assert_eq!(json["depth_capped"]["ran"], 128);
    }

    #[test]
    fn failures_fail_the_report_and_are_listed() {
        let mut j = JobResult::new(1);
        j.record_mismatch(Mismatch {
            nsid: 1,
            lba: 42,
            expected_generation: 3,
            found_lba: 42,
            found_generation: 2,
            found_nsid: 1,
            other_run: false,
            offset: 0,
        });
        j.record_error("Read: connection lost".into());
        let r = Report::build(&[j], Duration::from_secs(1));
        assert!(!r.passed());
        let text = r.to_text();
        assert!(
            text.contains("LBA 42: expected LBA 42 generation 3, found nsid 1 LBA 42 generation 2"),
            "{text}"
        );
        assert!(text.contains("error: Read: connection lost"));
        assert_eq!(
            progress_line(
                Duration::from_secs(3),
                Duration::from_secs(1),
                1000,
                1 << 20
            ),
            "[   3.0s]         1000 IOPS       1.00 MiB/s"
        );
    }
}
