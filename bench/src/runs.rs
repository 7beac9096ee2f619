//! The measurements behind each subcommand: set up once, then run every case once per run
//! (runs interleaved across cases), collecting each run's figures into a [`Section`].

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use nvmf_initiator::clock::SystemClock;
use nvmf_initiator::controller::{Controller, ControllerOptions, ReconnectPolicy};
use nvmf_initiator::perf::job::JobSpec;
use nvmf_initiator::perf::runner::{RunConfig, run};
use nvmf_initiator::perf::workload::Pattern;
use nvmf_initiator::rdma::RdmaFabric;
use nvmf_poller::{BusyWindow, Runtime, RuntimeConfig};

use crate::Common;
use crate::host;
use crate::line_trip;
use crate::stats::{Collector, Metric, Section};
use crate::target::{self, Daemon, InProcessTarget};
use crate::tcp_limit;
use crate::wire::{self, Op, WireSpec};

/// Row names of the wire section, used to compute the in-process share.
const WIRE_SEND: &str = "SEND/RECV";
const WIRE_WRITE: &str = "RDMA WRITE";
const LINE_TRIP: &str = "cache line round trip";
/// Row name of (c)'s ceiling.
const TCP_LIMIT: &str = "loopback TCP limit";
/// The qpairs table's column reading each case against the first (the 1024-qpair goal).
const FIRST_CASE: &str = "% of first case (same run)";

const BUSY_NOTE: &str = "target busy %: share of the run's wall time (from the perf run's start \
     to its drain) the target reactor spent in passes that found work (its own busy-time \
     counter, as SPDK's reactors count busy ticks); below 100 % the target waited for \
     commands and the host side bound the IOPS.";

const HOST_BUSY_NOTE: &str = "host busy %: the same share for the initiator's reactor (nvmf-perf's \
     report); IOPS / host busy: what the one initiator core would carry busy all the time, a \
     low estimate (fed faster, its passes batch more).";

const PASS_NOTE: &str = "I/O per target pass: the I/O the run completed over the target \
     reactor's passes that found work in the same window (for a pass's fixed cost, how much each \
     pass batched); I/O per host pass: the same over the host reactor's busy passes.";

const COMPLETIONS_NOTE: &str = "completions per I/O: the completions the target's poll group \
     (and the host's) reaped from its CQ over the run's I/O in the same window: a capsule or a \
     response each, plus the send side's own, one per list of SENDs a qpair posts (with the \
     poll groups' default silent_answers 0): about two per I/O at depth 1 per qpair, about one \
     when a qpair's list carries many.";

/// `count` per unit of `units` (0 without units): I/O per busy pass, completions per I/O.
fn ratio(count: u64, units: u64) -> f64 {
    if units == 0 {
        0.0
    } else {
        count as f64 / units as f64
    }
}

/// Completions reaped so far by the in-process target's poll groups (0 without one) and by the
/// host fabric's poll groups (control path).
fn completions(target: Option<&InProcessTarget>, fabric: &RdmaFabric) -> Result<(u64, u64)> {
    let target = match target {
        Some(t) => t.completions()?,
        None => 0,
    };
    let host = fabric
        .host_groups()
        .iter()
        .map(|g| g.stats.completions)
        .sum();
    Ok((target, host))
}

fn command_line() -> String {
    let args: Vec<String> = std::env::args().skip(1).collect();
    format!("nvmf-bench {}", args.join(" "))
}

/// (a) the fabric's own limit.
pub fn wire(common: &Common, window: u32, send_size: u32, write_size: u32) -> Result<Section> {
    let mut c = Collector::default();
    let cases = [
        (
            format!("{WIRE_SEND} {send_size} B"),
            Op::Send { size: send_size },
        ),
        (
            format!("{WIRE_WRITE} {write_size} B"),
            Op::Write { size: write_size },
        ),
    ];
    for round in 0..common.runs.max(1) {
        common.pause_before(round);
        for (name, op) in &cases {
            let rate = wire::measure(&WireSpec {
                op: *op,
                window,
                duration: common.duration(),
                requester_core: common.target_core,
                responder_core: common.host_core,
                pin: common.pin(),
            })
            .with_context(|| format!("wire {name}"))?;
            c.add(name, "Mops/s", rate / 1e6);
            let bytes = match op {
                Op::Send { size } | Op::Write { size } => *size,
            };
            c.add(name, "GiB/s", rate * f64::from(bytes) / (1u64 << 30) as f64);
        }
        let ns = line_trip::measure(
            common.duration(),
            common.target_core,
            common.host_core,
            common.pin(),
        )
        .context("cache line round trip")?;
        c.add(LINE_TRIP, "round trip ns", ns);
    }
    Ok(Section {
        id: "wire".into(),
        title: format!(
            "(a) Soft in-process fabric limit: transport API only, window {window}, one core each side"
        ),
        command: command_line(),
        rows: c.rows(),
        notes: vec![format!(
            "{LINE_TRIP}: one core stores a word, the other sees it and stores it back on a line \
             of its own, the first sees that: the least a depth-1 exchange between the two \
             cores costs (a QD 1 I/O makes at least one: command out, response back)."
        )],
    })
}

fn pattern(name: &str) -> Result<Pattern> {
    name.parse::<Pattern>()
        .map_err(|e| anyhow::anyhow!("workload '{name}': {e}"))
}

fn host_options(depth: usize, io_queues: u16) -> ControllerOptions {
    let mut options = ControllerOptions::new(
        target::NQN,
        "nqn.2014-08.org.nvmexpress:uuid:b0b0b0b0-0000-0000-0000-000000000001",
        [0xb0; 16],
    );
    options.io_queues = io_queues;
    options.io_queue_depth = depth.clamp(2, 4096) as u16;
    options.max_io_size = host::IO_SIZE;
    options.reconnect = ReconnectPolicy::never();
    options
}

/// (b) target and initiator engines in one process.
pub fn inproc(common: &Common, depths: &[usize], workloads: &[String]) -> Result<Section> {
    let target = InProcessTarget::start(common.target_core, common.pin(), None)?;
    let fabric = RdmaFabric::new("soft", None).context("in-process fabric")?;
    let address = host::address("soft", target.addr);
    let mut c = Collector::default();
    for round in 0..common.runs.max(1) {
        common.pause_before(round);
        for w in workloads {
            let pattern = pattern(w)?;
            for &depth in depths {
                let mut controller = Controller::connect(
                    fabric.clone(),
                    address.clone(),
                    host_options(depth, 1),
                    Arc::new(SystemClock),
                )
                .context("connecting to the in-process target")?;
                let busy = BusyWindow::start(&target.runtime().reactors()[0]);
                let report = run(
                    &mut controller,
                    &RunConfig {
                        spec: JobSpec {
                            pattern,
                            mix: 50,
                            io_size: host::IO_SIZE,
                            depth,
                            verify: false,
                        },
                        duration: common.duration(),
                        cores: vec![common.host_core],
                        pin: common.pin(),
                        qpairs_per_namespace: 1,
                        nsids: vec![],
                        seed: 1,
                        progress_every: None,
                    },
                    |_| {},
                )
                .context("perf run")?;
                if let Some(cap) = report.depth_capped {
                    bail!("{w} QD {depth}: {cap}");
                }
                let target_busy = busy.percent();
                let target_passes = busy.busy_passes();
                let _ = controller.shutdown();
                if !report.passed() {
                    bail!("{w} QD {depth}: {:?}", report.errors);
                }
                let case = format!("{w} QD {depth}");
                c.add(&case, "IOPS", report.total.iops);
                c.add(&case, "avg us", report.total.avg_us);
                c.add(&case, "p99 us", report.total.p99_us);
                c.add(&case, "target busy %", target_busy);
                c.add(
                    &case,
                    "I/O per target pass",
                    ratio(report.total.ios, target_passes),
                );
                if let Some(&host_busy) = report.host_busy_percent.first() {
                    c.add(&case, "host busy %", host_busy);
                    c.add(
                        &case,
                        "IOPS / host busy",
                        report.total.iops * 100.0 / host_busy.max(1.0),
                    );
                }
            }
        }
    }
    target.stop()?;
    Ok(Section {
        id: "inproc".into(),
        title: "(b) nvmf-tgt engine + nvmf-perf engine in one process, soft in-process fabric, \
                null namespace, 4 KiB, 1 target reactor + 1 initiator reactor"
            .into(),
        command: command_line(),
        rows: c.rows(),
        notes: vec![BUSY_NOTE.into(), HOST_BUSY_NOTE.into(), PASS_NOTE.into()],
    })
}

/// nvmf-perf's JSON total: (IOPS, avg us, p99 us). A run at a smaller queue depth than asked
/// is refused: its figures would be labelled with a depth they were not measured at.
fn perf_totals(json: &str) -> Result<(f64, f64, f64)> {
    let v: serde_json::Value = serde_json::from_str(json).context("nvmf-perf --json output")?;
    let cap = &v["depth_capped"];
    if !cap.is_null() {
        bail!(
            "nvmf-perf asked queue depth {} but ran at {}: the target's I/O queues are smaller",
            cap["asked"],
            cap["ran"]
        );
    }
    let total = &v["total"];
    let get = |k: &str| {
        total[k]
            .as_f64()
            .with_context(|| format!("nvmf-perf JSON has no total.{k}"))
    };
    Ok((get("iops")?, get("avg_us")?, get("p99_us")?))
}

/// The loopback limit's threads on the target's and the host's cores.
fn limit_cores(common: &Common) -> tcp_limit::Cores {
    tcp_limit::Cores {
        target: common.target_core,
        host: common.host_core,
        pin: common.pin(),
    }
}

/// (c) nvmf-tgt and nvmf-perf as processes over soft TCP.
pub fn tcp(common: &Common, depths: &[usize], port: u16, work_dir: &Path) -> Result<Section> {
    let daemon = Daemon::start(common.target_core, port, work_dir)?;
    let perf = target::sibling_binary("nvmf-perf")?;
    let mut c = Collector::default();
    let seconds = common.seconds.max(1.0).round() as u64;
    for round in 0..common.runs.max(1) {
        common.pause_before(round);
        for &depth in depths {
            let limit = tcp_limit::measure(depth, common.duration(), limit_cores(common))
                .with_context(|| format!("loopback TCP limit at QD {depth}"))?;
            let mut cmd = Command::new(&perf);
            cmd.args(["--transport", "soft-tcp", "-a", "127.0.0.1"])
                .args(["-s", &port.to_string(), "-n", target::NQN])
                .args(["-q", &depth.to_string(), "-o", "4096", "-w", "randread"])
                .args([
                    "-t",
                    &seconds.to_string(),
                    "-c",
                    &common.host_core.to_string(),
                ])
                .args(["--kato", "5", "--json"]);
            if !common.pin() {
                cmd.arg("--no-pin");
            }
            let out = cmd.output().context("running nvmf-perf")?;
            if !out.status.success() {
                bail!(
                    "nvmf-perf QD {depth} failed: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            let (iops, avg, p99) = perf_totals(&String::from_utf8_lossy(&out.stdout))?;
            let case = format!("randread QD {depth}");
            c.add(&case, "IOPS", iops);
            c.add(&case, "avg us", avg);
            c.add(&case, "p99 us", p99);
            c.add(
                &case,
                "target RSS MiB",
                target::rss_kib(&daemon.pid().to_string())? as f64 / 1024.0,
            );
            c.add(&case, "% of limit", 100.0 * iops / limit.iops);
            let case = format!("{TCP_LIMIT} QD {depth}");
            c.add(&case, "IOPS", limit.iops);
            c.add(&case, "avg us", limit.avg_us);
        }
    }
    daemon.stop()?;
    Ok(Section {
        id: "tcp".into(),
        title: format!(
            "(c) nvmf-tgt + nvmf-perf as processes over soft TCP on loopback, null namespace, \
             4 KiB, 1 target core + 1 host core ({seconds} s per run)"
        ),
        command: command_line(),
        rows: c.rows(),
        notes: vec![format!(
            "{TCP_LIMIT}: the kernel's loopback TCP alone, no RDMA or NVMe work in user space: \
             two threads on the same cores over one connection, non-blocking sockets polled in \
             a busy loop, the host keeping QD commands of {} bytes in flight, the target \
             answering each with {} bytes (soft TCP's frames of a 4 KiB read: the command's \
             SEND; the data's WRITE and the response's SEND), one write per pass each side. \
             % of limit: IOPS / that limit in the same run.",
            tcp_limit::COMMAND,
            tcp_limit::ANSWER
        )],
    })
}

/// (e) many qpairs on one target reactor.
pub fn qpairs(
    common: &Common,
    counts: &[usize],
    total_depth: usize,
    fabric_name: &str,
    port: u16,
    work_dir: &Path,
) -> Result<Section> {
    let (inproc, daemon, transport) = match fabric_name {
        "inproc" => (
            Some(InProcessTarget::start(
                common.target_core,
                common.pin(),
                None,
            )?),
            None,
            "soft",
        ),
        "tcp" => (
            None,
            Some(Daemon::start(common.target_core, port, work_dir)?),
            "soft-tcp",
        ),
        other => bail!("--fabric {other}: inproc or tcp"),
    };
    let addr = match (&inproc, &daemon) {
        (Some(t), _) => t.addr,
        (_, Some(d)) => d.addr,
        _ => unreachable!("one target was started"),
    };
    let rss = || -> Result<f64> {
        let pid = daemon
            .as_ref()
            .map(|d| d.pid().to_string())
            .unwrap_or_else(|| "self".into());
        Ok(target::rss_kib(&pid)? as f64 / 1024.0)
    };
    let address = host::address(transport, addr);
    let mut c = Collector::default();
    let rss_before = rss()?;
    for round in 0..common.runs.max(1) {
        common.pause_before(round);
        // The round's first case's IOPS: every case is read against it (the goal's figure).
        let mut first_iops = None;
        for &asked in counts {
            let count = io_qpairs(asked);
            let controllers_used = count.div_ceil(host::QUEUES_PER_CONTROLLER);
            let active = count.min(total_depth).max(1);
            let depth = (total_depth / active).max(1);
            // Over TCP, the kernel's own ceiling for this case's busy connections first.
            let limit = match daemon {
                Some(_) => Some(
                    tcp_limit::measure_connections(
                        active,
                        depth,
                        common.duration(),
                        limit_cores(common),
                    )
                    .with_context(|| {
                        format!("loopback TCP limit, {active} connections x QD {depth}")
                    })?,
                ),
                None => None,
            };
            // Started after the limit: its busy-polling reactor would share the limit's core.
            let runtime = Runtime::start(
                RuntimeConfig::new([common.host_core])
                    .pin(common.pin())
                    .idle_after(Duration::MAX),
            )
            .context("host reactor")?;
            // All the host's queues share one host poll group: size it for this case (a
            // fresh fabric per case, since a group's size is fixed when it is made).
            let fabric = RdmaFabric::new(transport, None)
                .context("host fabric")?
                .group_config(host::group_config(count, controllers_used, depth));
            let mut controllers = host::connect(&fabric, &address, count, depth as u16)?;
            let connected_rss = rss()?;
            let spec = JobSpec {
                pattern: Pattern::RandRead,
                mix: 50,
                io_size: host::IO_SIZE,
                depth,
                verify: false,
            };
            let run = host::Run::new(&mut controllers, active, spec, None)?;
            let busy = inproc
                .as_ref()
                .map(|t| BusyWindow::start(&t.runtime().reactors()[0]));
            let host_window = BusyWindow::start(&runtime.reactors()[0]);
            let completions_before = completions(inproc.as_ref(), &fabric)?;
            let (report, queues) =
                run.drive(&runtime.reactors()[0], &mut controllers, common.duration())?;
            let completions_after = completions(inproc.as_ref(), &fabric)?;
            let target_busy = busy.as_ref().map(|b| (b.percent(), b.busy_passes()));
            let host_busy = host_window.percent();
            let host_passes = host_window.busy_passes();
            // Dropping a queue disconnects it (quietly, unlike `disconnect`).
            drop(queues);
            for mut ctrl in controllers {
                let _ = ctrl.shutdown();
            }
            runtime.stop().map_err(|e| anyhow::anyhow!("{e}"))?;
            if !report.passed() {
                bail!("{count} qpairs: {:?}", report.errors);
            }
            let case = format!(
                "{} qpairs ({count} I/O + {controllers_used} admin), {active} x QD {depth}",
                count + controllers_used
            );
            c.add(&case, "IOPS", report.total.iops);
            let first = *first_iops.get_or_insert(report.total.iops);
            c.add(
                &case,
                FIRST_CASE,
                100.0 * report.total.iops / first.max(f64::MIN_POSITIVE),
            );
            c.add(&case, "avg us", report.total.avg_us);
            if let Some(limit) = limit {
                c.add(&case, "% of limit", 100.0 * report.total.iops / limit.iops);
            }
            if let Some((percent, passes)) = target_busy {
                c.add(&case, "target busy %", percent);
                c.add(
                    &case,
                    "IOPS / target busy",
                    report.total.iops * 100.0 / percent.max(1.0),
                );
                c.add(
                    &case,
                    "I/O per target pass",
                    ratio(report.total.ios, passes),
                );
                c.add(&case, "host busy %", host_busy);
                c.add(
                    &case,
                    "I/O per host pass",
                    ratio(report.total.ios, host_passes),
                );
                for (column, before, after) in [
                    (
                        "target completions per I/O",
                        completions_before.0,
                        completions_after.0,
                    ),
                    (
                        "host completions per I/O",
                        completions_before.1,
                        completions_after.1,
                    ),
                ] {
                    c.add(
                        &case,
                        column,
                        ratio(after.saturating_sub(before), report.total.ios),
                    );
                }
            }
            // Freed memory is not given back to the system: after a bigger case, RSS stays
            // high, so only the first run (cases in ascending order) measures it.
            if round == 0 {
                c.add(&case, "RSS MiB (run 1)", connected_rss);
                c.add(
                    &case,
                    "RSS KiB per qpair (run 1)",
                    (connected_rss - rss_before) * 1024.0 / (count + controllers_used) as f64,
                );
            }
            if let Some(limit) = limit {
                let plural = if active == 1 { "" } else { "s" };
                let case = format!("{TCP_LIMIT}, {active} connection{plural} x QD {depth}");
                c.add(&case, "IOPS", limit.iops);
                c.add(&case, "avg us", limit.avg_us);
            }
        }
    }
    if let Some(t) = inproc {
        t.stop()?;
    }
    if let Some(d) = daemon {
        d.stop()?;
    }
    let whose = if fabric_name == "tcp" {
        "nvmf-tgt's own RSS (separate process)"
    } else {
        "the whole process's RSS (target and host together: the host's queues share one host \
         poll group sized for the case, its receive slots included; each host queue registers \
         4 KiB of data slot per command)"
    };
    let notes = |rss_note: String| {
        let mut notes = vec![
            rss_note,
            format!(
                "{FIRST_CASE}: a case's IOPS over the first case's in the same run (the cases \
                 of a run follow each other, so a slow stretch of the machine hits both): the \
                 issue's 1024-qpair goal is this figure at 90 % or more."
            ),
        ];
        if fabric_name == "tcp" {
            notes.push(format!(
                "{TCP_LIMIT}: the kernel's loopback TCP alone moving the case's bytes (commands \
                 of {} bytes, answers of {}) over as many connections as the case has busy \
                 qpairs, each at the case's depth, both sides' threads on the same cores \
                 finding their ready connections through edge-triggered epoll polled with a \
                 zero timeout (as soft TCP's CQs do), one read run and one write per ready \
                 connection and pass; idle connections are left out (they raise no event). % \
                 of limit: IOPS / that limit in the same run.",
                tcp_limit::COMMAND,
                tcp_limit::ANSWER
            ));
        }
        if fabric_name == "inproc" {
            notes.push(format!(
                "{BUSY_NOTE} IOPS / target busy: what the target reactor would carry busy all \
                 the time, a low estimate (fed faster, its passes batch more). host busy %: the \
                 same share for the host's reactor over the run (its drain included)."
            ));
            notes.push(PASS_NOTE.into());
            notes.push(COMPLETIONS_NOTE.into());
        }
        notes
    };
    Ok(Section {
        id: format!("qpairs-{fabric_name}"),
        title: format!(
            "(e) qpairs on one target reactor, total depth {total_depth}, 4 KiB randread, \
             {fabric_name} fabric"
        ),
        command: command_line(),
        rows: c.rows(),
        notes: notes(format!(
            "RSS: {whose}, measured with every qpair connected; per qpair = (RSS - RSS before \
             any connection, {rss_before:.1} MiB) / qpairs. Each controller adds an admin qpair \
             (64 I/O queues per controller); a poll group holds 1024 qpairs, so 1024 asked is \
             1008 I/O + 16 admin."
        )),
    })
}

/// Qpairs one poll group holds by default (nvmf-tgt's `PollGroupConfig::max_qpairs`).
const GROUP_QPAIRS: usize = 1024;

/// I/O qpairs for `asked`, fewer when they and their controllers' admin qpairs (one per 64)
/// would not fit one poll group: 1024 asked gives 1008 I/O + 16 admin = 1024.
pub fn io_qpairs(asked: usize) -> usize {
    let mut io = asked.max(1);
    while io > 1 && io + io.div_ceil(host::QUEUES_PER_CONTROLLER) > GROUP_QPAIRS {
        io -= 1;
    }
    io
}

/// Adds "share of wire" to the in-process rows: IOPS over the wire bound of one target core,
/// which per 4 KiB I/O posts one 4 KiB RDMA WRITE (or takes a 4 KiB in-capsule SEND) and one
/// response SEND: bound = 1 / (1 / write rate + 1 / send rate).
pub fn add_wire_share(sections: &mut [Section]) {
    let rate = |prefix: &str| -> Option<f64> {
        sections
            .iter()
            .find(|s| s.id == "wire")?
            .rows
            .iter()
            .find(|r| r.case.starts_with(prefix))?
            .metrics
            .iter()
            .find(|m| m.name == "Mops/s")
            .map(|m| m.median * 1e6)
    };
    let (Some(send), Some(write)) = (rate(WIRE_SEND), rate(WIRE_WRITE)) else {
        return;
    };
    let bound = 1.0 / (1.0 / write + 1.0 / send);
    for s in sections.iter_mut().filter(|s| s.id == "inproc") {
        for row in &mut s.rows {
            let Some(iops) = row.metrics.iter().find(|m| m.name == "IOPS").cloned() else {
                continue;
            };
            row.metrics.retain(|m| m.name != "% of wire");
            row.metrics.push(Metric::new(
                "% of wire",
                iops.runs.iter().map(|v| 100.0 * v / bound).collect(),
            ));
        }
        s.notes.retain(|n| !n.starts_with("% of wire"));
        s.notes.push(format!(
            "% of wire: IOPS / the fabric's bound for one target core, 1 / (1 / WRITE rate + \
             1 / SEND rate) = {:.0} IOPS from (a)'s medians.",
            bound
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::{io_qpairs, perf_totals, ratio};

    #[test]
    fn qpairs_fit_one_poll_group_with_their_admin_queues() {
        assert_eq!(io_qpairs(1), 1);
        assert_eq!(io_qpairs(64), 64);
        assert_eq!(io_qpairs(1024), 1008);
        let io = io_qpairs(1024);
        assert!(io + io.div_ceil(64) <= 1024);
    }

    #[test]
    fn a_ratio_is_the_count_over_its_units_and_zero_without_units() {
        assert_eq!(ratio(1000, 250), 4.0);
        assert_eq!(ratio(2000, 1000), 2.0);
        assert_eq!(ratio(1000, 0), 0.0);
    }

    #[test]
    fn nvmf_perf_output_at_a_smaller_depth_than_asked_is_refused() {
        let total = r#""total": {"iops": 1000.0, "avg_us": 5.0, "p99_us": 9.0}"#;
        let ran = format!("{{{total}, \"depth_capped\": null}}");
        assert_eq!(perf_totals(&ran).unwrap(), (1000.0, 5.0, 9.0));
        let capped = format!("{{{total}, \"depth_capped\": {{\"asked\": 1024, \"ran\": 128}}}}");
        let error = perf_totals(&capped).unwrap_err().to_string();
        assert!(
            error.contains("asked queue depth 1024 but ran at 128"),
            "{error}"
        );
    }
}
