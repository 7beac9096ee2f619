//! (d) instructions per I/O. The hardware counters of this VM are not exposed (perf stat:
//! "cycles <not supported>"), so instructions are counted by valgrind's callgrind.
//!
//! [`run`] is the profiled workload: the target engine and nvmf-perf's job on ONE reactor thread
//! (in-process fabric, null namespace), exactly N I/O. One thread makes the count independent of
//! how valgrind schedules threads (two busy-polling threads would count each other's waiting).
//! [`profile`] runs it under callgrind twice per side, collecting only inside that side's
//! poller (`--toggle-collect`: the target's poll-group poller, the initiator's job poller), for
//! N and 2N I/O: (Ir(2N) - Ir(N)) / (I/O(2N) - I/O(N)) cancels connection set-up. The top
//! functions (self cost) are the same difference per function, from `callgrind_annotate` of
//! both runs: what set-up and teardown spent in a function cancels there too.

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use nvmf_initiator::perf::job::JobSpec;
use nvmf_initiator::rdma::RdmaFabric;

use crate::host;
use crate::stats::{Collector, Section};
use crate::target::InProcessTarget;

/// callgrind's function patterns for each side's poller.
const TARGET_POLLER: &str = "*GroupPoller*as nvmf_poller::poller::Poller>::poll";
const HOST_POLLER: &str = "*JobPoller as nvmf_poller::poller::Poller>::poll";

/// The qpairs of a profiled run: `connected` I/O queues, jobs of depth `depth` on the first
/// `active` of them (the rest connected and idle), as in the many-qpairs figure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    /// Queue depth of each job.
    pub depth: usize,
    /// I/O queues connected.
    pub connected: usize,
    /// Queues carrying a job.
    pub active: usize,
}

impl Shape {
    /// Command-line arguments of `cost-run` for this shape.
    fn args(&self) -> [String; 6] {
        [
            "--depth".into(),
            self.depth.to_string(),
            "--qpairs".into(),
            self.connected.to_string(),
            "--active".into(),
            self.active.to_string(),
        ]
    }

    /// "QD 32", or "128 x QD 1 of 1008 qpairs".
    fn label(&self) -> String {
        if self.connected <= 1 {
            format!("QD {}", self.depth)
        } else {
            format!(
                "{} x QD {} of {} qpairs",
                self.active.min(self.connected),
                self.depth,
                self.connected
            )
        }
    }
}

/// I/O of the shorter profiled run when not given: more with many qpairs, whose set-up and
/// drain make a number of target polls that varies between runs (see `nvmf-bench cost --help`).
pub fn default_ios(shape: Shape) -> u64 {
    if shape.connected > 1 { 250_000 } else { 50_000 }
}

/// The profiled workload; returns the I/O completed.
pub fn run(ios: u64, shape: Shape, workload: &str, core: usize) -> Result<u64> {
    let Shape {
        depth,
        connected,
        active,
    } = shape;
    let connected = connected.max(1);
    let pattern = workload
        .parse()
        .map_err(|e| anyhow::anyhow!("workload '{workload}': {e}"))?;
    // Under valgrind the set-up and teardown (connects, drains) take seconds of wall time;
    // a reactor spinning 1 ms between their events ran ~10^5 idle passes through
    // the target's poller, a number set by the clock, which (Ir(2N) - Ir(N)) cannot cancel.
    // Sleeping as soon as a pass finds nothing keeps them out; the measured phase always has
    // work in every pass (both sides on this one reactor), so it never sleeps.
    let target = InProcessTarget::start(core, false, Some(Duration::from_micros(1)))?;
    let controllers_used = connected.div_ceil(host::QUEUES_PER_CONTROLLER);
    let fabric = RdmaFabric::new("soft", None)
        .context("in-process fabric")?
        .group_config(host::group_config(connected, controllers_used, depth));
    let address = host::address("soft", target.addr);
    let mut controllers = host::connect(&fabric, &address, connected, depth as u16)?;
    let spec = JobSpec {
        pattern,
        mix: 50,
        io_size: host::IO_SIZE,
        depth,
        verify: false,
    };
    let run = host::Run::new(&mut controllers, active.max(1), spec, Some(ios))?;
    let (report, queues) = run.drive(
        &target.runtime().reactors()[0],
        &mut controllers,
        Duration::from_secs(3600),
    )?;
    drop(queues);
    for mut c in controllers {
        let _ = c.shutdown();
    }
    target.stop()?;
    if !report.passed() {
        bail!("I/O failed: {:?}", report.errors);
    }
    Ok(report.total.ios)
}

/// Total instructions in a callgrind output file (its `totals:` / `summary:` line).
fn total_ir(file: &Path) -> Result<u64> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    text.lines()
        .rev()
        .find_map(|l| {
            l.strip_prefix("totals:")
                .or_else(|| l.strip_prefix("summary:"))
        })
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .with_context(|| format!("{}: no totals line", file.display()))
}

/// Every function's self instructions in a callgrind output file, largest first.
fn function_costs(file: &Path) -> Result<Vec<(u64, f64, String)>> {
    let out = Command::new("callgrind_annotate")
        // Every function, not only those above the default 0.1 % threshold: a function small
        // in the longer run may be big in the difference.
        .arg("--threshold=100")
        .arg(file)
        .output()
        .context("running callgrind_annotate (Debian package valgrind)")?;
    if !out.status.success() {
        bail!(
            "callgrind_annotate failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(parse_annotate(
        &String::from_utf8_lossy(&out.stdout),
        usize::MAX,
    ))
}

/// The `n` functions with the most self instructions per I/O in the steady state: per
/// function, (Ir in the longer run - Ir in the shorter) / the I/O between them, largest first.
fn steady_top(
    shorter: &[(u64, f64, String)],
    longer: &[(u64, f64, String)],
    ios: u64,
    n: usize,
) -> Vec<(f64, String)> {
    let before: HashMap<&str, u64> = shorter.iter().map(|(ir, _, f)| (f.as_str(), *ir)).collect();
    let mut rows: Vec<(f64, String)> = longer
        .iter()
        .map(|(ir2, _, func)| {
            let ir1 = before.get(func.as_str()).copied().unwrap_or(0);
            ((*ir2 as f64 - ir1 as f64) / ios.max(1) as f64, func.clone())
        })
        .collect();
    rows.sort_by(|a, b| b.0.total_cmp(&a.0));
    rows.truncate(n);
    rows
}

/// Parses callgrind_annotate's function table ("1,234 (12.5%)  file:function [object]"),
/// adding up the rows of one function (the table splits a function by the source file its
/// inlined code came from), largest first.
fn parse_annotate(text: &str, n: usize) -> Vec<(u64, f64, String)> {
    let mut rows: Vec<(u64, f64, String)> = Vec::new();
    let mut in_table = false;
    for line in text.lines() {
        if line.contains("file:function") {
            in_table = true;
            continue;
        }
        if !in_table {
            continue;
        }
        let t = line.trim();
        let Some((count, rest)) = t.split_once(char::is_whitespace) else {
            continue;
        };
        let Ok(ir) = count.replace(',', "").parse::<u64>() else {
            if rows.is_empty() {
                continue;
            }
            break;
        };
        let rest = rest.trim();
        let (pct, func) = match rest.strip_prefix('(') {
            Some(r) => match r.split_once("%)") {
                Some((p, f)) => (p.trim().parse().unwrap_or(0.0), f.trim()),
                None => (0.0, rest),
            },
            None => (0.0, rest),
        };
        // "path/file.rs:name [object]": keep the name.
        let func = func.rsplit_once(" [").map_or(func, |(f, _)| f);
        let func = match func.split_once(".rs:").or_else(|| func.split_once(".S:")) {
            Some((_, name)) => name,
            None => func.strip_prefix("???:").unwrap_or(func),
        };
        match rows.iter_mut().find(|r| r.2 == func) {
            Some(r) => {
                r.0 += ir;
                r.1 += pct;
            }
            None => rows.push((ir, pct, func.to_string())),
        }
    }
    rows.sort_by_key(|r| std::cmp::Reverse(r.0));
    rows.truncate(n);
    rows
}

fn callgrind(
    out_dir: &Path,
    side: &str,
    pattern: &str,
    ios: u64,
    shape: Shape,
    workload: &str,
) -> Result<(u64, std::path::PathBuf)> {
    let file = out_dir.join(format!(
        "{side}-{workload}-qd{}-q{}-a{}-{ios}.out",
        shape.depth, shape.connected, shape.active
    ));
    let exe = std::env::current_exe().context("locating nvmf-bench")?;
    let out = Command::new("valgrind")
        .arg("--tool=callgrind")
        .arg(format!("--callgrind-out-file={}", file.display()))
        .arg(format!("--toggle-collect={pattern}"))
        .arg(exe)
        .args(["cost-run", "--ios", &ios.to_string()])
        .args(shape.args())
        .args(["--workload", workload])
        .output()
        .context("running valgrind (Debian package valgrind)")?;
    if !out.status.success() {
        bail!(
            "valgrind cost-run failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let done: u64 = String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .and_then(|l| l.trim().parse().ok())
        .context("cost-run printed no I/O count")?;
    Ok((done, file))
}

/// The profile section: instructions per I/O per side, and the top functions.
pub fn profile(
    ios: u64,
    shape: Shape,
    workload: &str,
    top: usize,
    out_dir: &Path,
) -> Result<Section> {
    std::fs::create_dir_all(out_dir).with_context(|| format!("creating {}", out_dir.display()))?;
    let mut c = Collector::default();
    let mut notes = Vec::new();
    for (side, pattern) in [("target", TARGET_POLLER), ("initiator", HOST_POLLER)] {
        let (done1, f1) = callgrind(out_dir, side, pattern, ios, shape, workload)?;
        let (done2, f2) = callgrind(out_dir, side, pattern, ios * 2, shape, workload)?;
        let (ir1, ir2) = (total_ir(&f1)?, total_ir(&f2)?);
        if done2 <= done1 || ir2 <= ir1 {
            bail!("{side}: no growth between runs ({done1} / {done2} I/O, {ir1} / {ir2} Ir)");
        }
        let per_io = (ir2 - ir1) as f64 / (done2 - done1) as f64;
        let case = format!("{side}, {workload} {}", shape.label());
        c.add(&case, "instructions per I/O", per_io);
        c.add(&case, "I/O counted", (done2 - done1) as f64);
        let mut lines = vec![format!(
            "Top functions, {side} side (self instructions per I/O, share of the side; per \
             function, the difference between {} and {}):",
            f1.display(),
            f2.display()
        )];
        lines.push(String::new());
        lines.push("| instr/I/O | share | function |".into());
        lines.push("|---:|---:|---|".into());
        let top_rows = steady_top(
            &function_costs(&f1)?,
            &function_costs(&f2)?,
            done2 - done1,
            top,
        );
        for (ir, func) in top_rows {
            lines.push(format!(
                "| {ir:.0} | {:.1} % | `{}` |",
                100.0 * ir / per_io,
                func.replace('|', "\\|")
            ));
        }
        notes.push(lines.join("\n"));
    }
    Ok(Section {
        id: "cost".into(),
        title: format!(
            "(d) Instructions per I/O (callgrind), {workload} 4 KiB {}, in-process fabric, \
             both sides' pollers on one reactor thread",
            shape.label()
        ),
        command: if shape.connected <= 1 {
            format!(
                "nvmf-bench cost --ios {ios} --depth {} --workload {workload}",
                shape.depth
            )
        } else {
            format!(
                "nvmf-bench cost --ios {ios} --depth {} --qpairs {} --active {} \
                 --workload {workload}",
                shape.depth, shape.connected, shape.active
            )
        },
        rows: c.rows(),
        notes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn many_qpairs_profile_more_io_by_default() {
        let one = Shape {
            depth: 32,
            connected: 1,
            active: 1,
        };
        let many = Shape {
            depth: 1,
            connected: 1008,
            active: 128,
        };
        assert_eq!(default_ios(one), 50_000);
        assert_eq!(default_ios(many), 250_000);
    }

    #[test]
    fn annotate_table_is_parsed() {
        let text = "\
--------------------------------------------------------------------------------
Ir                  file:function
--------------------------------------------------------------------------------
1,000,000 (50.00%)  ???:nvmf_transport::soft::cq::poll [/x/nvmf-bench]
  250,000 (12.50%)  /rustc/abc/library/core/src/ptr.rs:memcpy [/x/nvmf-bench]
  100,000 ( 5.00%)  transport/src/soft/cq.rs:nvmf_transport::soft::cq::poll [/x/nvmf-bench]

--------------------------------------------------------------------------------
";
        let rows = parse_annotate(text, 10);
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].0, 1_100_000, "one function's rows add up");
        assert_eq!(rows[0].1, 55.0);
        assert_eq!(rows[0].2, "nvmf_transport::soft::cq::poll");
        assert_eq!(rows[1].2, "memcpy");
        assert_eq!(rows[1].0, 250_000);
        assert_eq!(parse_annotate(text, 1).len(), 1);
    }

    #[test]
    fn steady_top_is_the_per_function_difference() {
        let f = |ir: u64, name: &str| (ir, 0.0, name.to_string());
        // Set-up: 900 in `idle` in both runs; `copy` grows with the I/O, `late` only in the
        // longer run.
        let shorter = [f(900, "idle"), f(1_000, "copy")];
        let longer = [f(2_000, "copy"), f(900, "idle"), f(300, "late")];
        let top = steady_top(&shorter, &longer, 100, 2);
        assert_eq!(
            top,
            vec![(10.0, "copy".to_string()), (3.0, "late".to_string())]
        );
    }
}
