//! nvmf-bench: the figures of docs/performance.md, each measured over several runs (median,
//! min, max). `scripts/bench.sh` runs them all and writes build/bench/bench.json.
#![forbid(unsafe_code)]

mod cost;
mod host;
mod line_trip;
mod runs;
mod stats;
mod target;
mod tcp_limit;
mod wire;

use std::path::PathBuf;

use anyhow::{Context as _, Result};
use clap::{Args, Parser, Subcommand};

use stats::Section;

/// Benchmarks of nvmf-rs on the soft RDMA provider: the in-process fabric's own limit, target
/// and initiator in one process, target and initiator as processes over soft TCP, many qpairs
/// on one target reactor, and instructions per I/O. Each prints a table (or JSON with --json)
/// of the median, min and max over --runs runs.
#[derive(Debug, Parser)]
#[command(version)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

/// Flags every measurement takes.
#[derive(Debug, Clone, Args)]
pub struct Common {
    /// Runs of every case; the table shows the median and the range. Runs are interleaved
    /// across cases, so a slow stretch of the machine hits every case alike.
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// Measured seconds per run and case (after a short warm-up where applicable).
    #[arg(long, default_value_t = 3.0, value_parser = seconds)]
    seconds: f64,
    /// Seconds to wait before each run after the first: spreads the runs over the machine's
    /// minute-long fast and slow stretches, as SPDK's reference figure for soft TCP was taken
    /// (10 runs in 15 minutes: `tcp --depths 32 --runs 10 --pause 80`).
    #[arg(long, default_value_t = 0.0, value_parser = seconds)]
    pause: f64,
    /// Core of the target (wire: the requester).
    #[arg(long, default_value_t = 0)]
    target_core: usize,
    /// Core of the initiator (wire: the responder).
    #[arg(long, default_value_t = 1)]
    host_core: usize,
    /// Do not pin threads to their cores.
    #[arg(long)]
    no_pin: bool,
    /// Print JSON (a list of sections) instead of a markdown table.
    #[arg(long)]
    json: bool,
}

/// A number of seconds: finite, not negative, at most a day.
fn seconds(text: &str) -> std::result::Result<f64, String> {
    let value: f64 = text
        .parse()
        .map_err(|_| format!("{text:?} is not a number of seconds"))?;
    if !(0.0..=86_400.0).contains(&value) {
        return Err(format!("{text} seconds: give 0 to 86400"));
    }
    Ok(value)
}

impl Common {
    fn duration(&self) -> std::time::Duration {
        std::time::Duration::from_secs_f64(self.seconds.max(0.1))
    }
    /// Called at the start of run `run` (0-based): waits --pause before every run but the first.
    fn pause_before(&self, run: usize) {
        if run > 0 && self.pause > 0.0 {
            std::thread::sleep(std::time::Duration::from_secs_f64(self.pause));
        }
    }
    fn pin(&self) -> bool {
        !self.no_pin
    }
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// The soft in-process fabric's limit, transport API only: SEND/RECV messages per second
    /// and 4 KiB RDMA WRITEs per second, one pinned thread per side, a fixed window in flight;
    /// and the machine's floor for depth 1, the round trip of one cache line between the two
    /// cores.
    Wire {
        #[command(flatten)]
        common: Common,
        /// Work requests kept in flight by the requester.
        #[arg(long, default_value_t = 64)]
        window: u32,
        /// SEND size in bytes (64: an NVMe command capsule).
        #[arg(long, default_value_t = 64)]
        send_size: u32,
        /// RDMA WRITE size in bytes.
        #[arg(long, default_value_t = 4096)]
        write_size: u32,
    },
    /// nvmf-tgt's engine (null namespace, one reactor) and nvmf-perf's engine (one reactor) in
    /// this process on the soft in-process fabric: 4 KiB randread and randwrite at each queue
    /// depth: IOPS, average and p99 latency.
    Inproc {
        #[command(flatten)]
        common: Common,
        /// Queue depths, comma separated.
        #[arg(long, value_delimiter = ',', default_value = "1,32,128")]
        depths: Vec<usize>,
        /// Workloads, comma separated (randread, randwrite, read, write).
        #[arg(long, value_delimiter = ',', default_value = "randread,randwrite")]
        workloads: Vec<String>,
    },
    /// nvmf-tgt (binary, null namespace, one reactor) and nvmf-perf (binary, --json, one
    /// reactor) as two processes over the soft TCP fabric on loopback: 4 KiB randread; and
    /// before each case, the kernel's loopback TCP limit for the same bytes per I/O at the
    /// same depth (two busy-polling threads, no RDMA or NVMe work).
    Tcp {
        #[command(flatten)]
        common: Common,
        /// Queue depths, comma separated.
        #[arg(long, value_delimiter = ',', default_value = "32,1")]
        depths: Vec<usize>,
        /// TCP port nvmf-tgt listens on (127.0.0.1).
        #[arg(long, default_value_t = target::TCP_PORT)]
        port: u16,
        /// Where the daemon's configuration copy and log go.
        #[arg(long, default_value = "build/bench")]
        work_dir: PathBuf,
    },
    /// Connected I/O qpairs on one target reactor at one total queue depth: IOPS and resident
    /// memory. With more qpairs than the total depth, that many carry I/O at depth 1 and the
    /// rest stay connected and idle. Over TCP, before each case, the kernel's loopback TCP
    /// limit for the same bytes over as many connections as the case has busy qpairs.
    Qpairs {
        #[command(flatten)]
        common: Common,
        /// Qpair counts, comma separated.
        #[arg(long, value_delimiter = ',', default_value = "1,64,1024")]
        counts: Vec<usize>,
        /// Total queue depth over all qpairs.
        #[arg(long, default_value_t = 128)]
        total_depth: usize,
        /// inproc: target and host in this process (RSS is the whole process's); tcp: nvmf-tgt
        /// as its own process over soft TCP (RSS is the daemon's alone).
        #[arg(long, default_value = "inproc")]
        fabric: String,
        /// TCP port for --fabric tcp.
        #[arg(long, default_value_t = target::TCP_PORT + 1)]
        port: u16,
        /// Where the daemon's configuration copy and log go (--fabric tcp).
        #[arg(long, default_value = "build/bench")]
        work_dir: PathBuf,
    },
    /// Instructions per I/O on the target and on the initiator, and their top functions:
    /// runs `cost-run` under valgrind's callgrind (both sides' pollers on one reactor thread),
    /// once collecting only inside the target's poll group poller and once only inside the
    /// initiator's job poller, for two I/O counts; the difference cancels the set-up.
    Cost {
        /// I/O of the shorter run (the longer does twice as many). Default 50000, and 250000
        /// with --qpairs above 1: connecting and draining many qpairs makes a number of target
        /// polls that varies by tens of thousands between runs, which the difference of the
        /// two runs cannot cancel (at 50000 I/O the target's figure for 1024 qpairs moved by
        /// 160 instructions per I/O between two runs of one binary, at 250000 by 30).
        #[arg(long)]
        ios: Option<u64>,
        /// Queue depth (of each job).
        #[arg(long, default_value_t = 32)]
        depth: usize,
        /// I/O qpairs connected (64 per controller): with more than 1, the many-qpairs
        /// figure's host side (jobs on --active of them, the rest connected and idle). Capped,
        /// as in `qpairs`, so they and their controllers' admin qpairs fit one poll group:
        /// 1024 connects 1008 I/O + 16 admin.
        #[arg(long, default_value_t = 1)]
        qpairs: usize,
        /// Qpairs carrying a job (at most --qpairs).
        #[arg(long, default_value_t = 1)]
        active: usize,
        /// Workload (randread, randwrite).
        #[arg(long, default_value = "randread")]
        workload: String,
        /// Functions listed per side.
        #[arg(long, default_value_t = 12)]
        top: usize,
        /// Where callgrind's output files go.
        #[arg(long, default_value = "build/bench/callgrind")]
        out_dir: PathBuf,
        /// Print JSON instead of markdown.
        #[arg(long)]
        json: bool,
    },
    /// The workload `cost` profiles: target and initiator pollers on one reactor thread,
    /// exactly --ios I/O (then stop). Prints the I/O count done.
    CostRun {
        /// I/O to complete.
        #[arg(long)]
        ios: u64,
        /// Queue depth (of each job).
        #[arg(long, default_value_t = 32)]
        depth: usize,
        /// I/O qpairs connected.
        #[arg(long, default_value_t = 1)]
        qpairs: usize,
        /// Qpairs carrying a job (at most --qpairs).
        #[arg(long, default_value_t = 1)]
        active: usize,
        /// Workload (randread, randwrite).
        #[arg(long, default_value = "randread")]
        workload: String,
        /// Core of the one reactor.
        #[arg(long, default_value_t = 0)]
        core: usize,
    },
    /// Merge JSON outputs of the other commands into one file and print the markdown tables
    /// (with the in-process share of the wire limit when both are present).
    Report {
        /// JSON files written by --json runs.
        files: Vec<PathBuf>,
        /// Write the merged JSON here.
        #[arg(long)]
        out: Option<PathBuf>,
        /// A line printed above the tables (e.g. the machine and N).
        #[arg(long)]
        header: Option<String>,
    },
}

fn emit(sections: &[Section], json: bool) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(sections)?);
    } else {
        print!("{}", stats::markdown(sections, None));
    }
    Ok(())
}

fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    match cli.command {
        Cmd::Wire {
            common,
            window,
            send_size,
            write_size,
        } => {
            let s = runs::wire(&common, window, send_size, write_size)?;
            emit(&[s], common.json)
        }
        Cmd::Inproc {
            common,
            depths,
            workloads,
        } => {
            let s = runs::inproc(&common, &depths, &workloads)?;
            emit(&[s], common.json)
        }
        Cmd::Tcp {
            common,
            depths,
            port,
            work_dir,
        } => {
            let s = runs::tcp(&common, &depths, port, &work_dir)?;
            emit(&[s], common.json)
        }
        Cmd::Qpairs {
            common,
            counts,
            total_depth,
            fabric,
            port,
            work_dir,
        } => {
            let s = runs::qpairs(&common, &counts, total_depth, &fabric, port, &work_dir)?;
            emit(&[s], common.json)
        }
        Cmd::Cost {
            ios,
            depth,
            qpairs,
            active,
            workload,
            top,
            out_dir,
            json,
        } => {
            let shape = cost::Shape {
                depth,
                connected: runs::io_qpairs(qpairs),
                active,
            };
            let ios = ios.unwrap_or(cost::default_ios(shape));
            let s = cost::profile(ios, shape, &workload, top, &out_dir)?;
            emit(&[s], json)
        }
        Cmd::CostRun {
            ios,
            depth,
            qpairs,
            active,
            workload,
            core,
        } => {
            let shape = cost::Shape {
                depth,
                connected: qpairs,
                active,
            };
            let done = cost::run(ios, shape, &workload, core)?;
            println!("{done}");
            Ok(())
        }
        Cmd::Report { files, out, header } => {
            let mut sections: Vec<Section> = Vec::new();
            for f in &files {
                let text = std::fs::read_to_string(f)
                    .with_context(|| format!("reading {}", f.display()))?;
                let mut s: Vec<Section> = serde_json::from_str(&text)
                    .with_context(|| format!("{}: not nvmf-bench JSON", f.display()))?;
                sections.append(&mut s);
            }
            runs::add_wire_share(&mut sections);
            if let Some(out) = out {
                std::fs::write(&out, serde_json::to_string_pretty(&sections)?)
                    .with_context(|| format!("writing {}", out.display()))?;
            }
            print!("{}", stats::markdown(&sections, header.as_deref()));
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    #[test]
    fn seconds_must_be_a_finite_count_up_to_a_day() {
        for good in ["0", "2.5", "86", "86400"] {
            assert_eq!(super::seconds(good), Ok(good.parse().unwrap()), "{good}");
        }
        for bad in ["-1", "inf", "NaN", "1e9", "ten", ""] {
            assert!(super::seconds(bad).is_err(), "{bad}");
        }
        // The flag as a user gives it: refused by clap with the reason, no panic later.
        let refused =
            <super::Cli as clap::Parser>::try_parse_from(["nvmf-bench", "tcp", "--pause", "-5"]);
        assert!(refused.is_err());
        let taken = <super::Cli as clap::Parser>::try_parse_from([
            "nvmf-bench",
            "tcp",
            "--runs",
            "10",
            "--pause",
            "86",
        ]);
        assert!(taken.is_ok());
    }

    #[test]
    fn every_flag_of_every_subcommand_is_documented() {
        let cmd = super::Cli::command();
        cmd.clone().debug_assert();
        for sub in cmd.get_subcommands() {
            assert!(sub.get_about().is_some(), "{} has no help", sub.get_name());
            for arg in sub.get_arguments() {
                assert!(
                    arg.get_help().is_some(),
                    "{} --{} has no help",
                    sub.get_name(),
                    arg.get_id()
                );
            }
        }
    }
}
