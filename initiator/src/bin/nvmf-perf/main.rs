//! nvmf-perf: an NVMe-oF load generator and latency histogram (like spdk_nvme_perf / fio).
#![forbid(unsafe_code)]

use std::io::{IsTerminal, Write};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Parser;

use nvmf_initiator::cli::args::{ConnectArgs, MAX_SECONDS, parse_cores, parse_size};
use nvmf_initiator::clock::SystemClock;
use nvmf_initiator::controller::Controller;
use nvmf_initiator::loopback::LoopbackFabric;
use nvmf_initiator::perf::job::JobSpec;
use nvmf_initiator::perf::runner::{RunConfig, run};
use nvmf_initiator::perf::workload::Pattern;
use nvmf_initiator::queue::Fabric;
use nvmf_initiator::rdma::{HostGroupConfig, RdmaFabric};

/// Drive I/O at every namespace of one NVMe-oF subsystem and report IOPS, bandwidth and
/// latency percentiles per namespace and in total.
///
/// A lost connection fails the I/O in flight (counted as "lost with the connection"); the
/// controller then reconnects per --reconnect-delay / --ctrl-loss-tmo and the run goes on over
/// fresh queues. The exit status is non-zero on any I/O error or verify failure, when the
/// controller is given up (ctrl-loss-tmo passed, or 0), or when it is not back at the end.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    #[command(flatten)]
    connect: ConnectArgs,
    /// Commands in flight per I/O queue. At most what the target's I/O queues hold (its
    /// CAP.MQES + 1): deeper runs at that depth, and the report ends with a warning saying so.
    #[arg(short = 'q', long = "queue-depth", default_value_t = 32, value_parser = at_least_one)]
    queue_depth: usize,
    /// Bytes per I/O (a multiple of the block size; 4096, 4k, 128k...).
    #[arg(short = 'o', long = "io-size", default_value = "4096", value_parser = io_size)]
    io_size: u64,
    /// Workload: read, write, randread, randwrite, rw, randrw.
    #[arg(short = 'w', long, default_value = "randread")]
    workload: Pattern,
    /// Percent reads for rw and randrw, 0..=100 (default 50; only those two workloads mix).
    #[arg(short = 'M', long, value_parser = clap::value_parser!(u8).range(0..=100))]
    mix: Option<u8>,
    /// Run time in seconds, 1..=4294967.
    #[arg(short = 't', long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=MAX_SECONDS))]
    time: u64,
    /// Cores to run reactors on, one reactor each: "0", "0-3", "0,2" (0..=4095, and each must
    /// be available to this process).
    #[arg(short = 'c', long, default_value = "0", value_parser = cores)]
    cores: String,
    /// I/O queues per namespace, 1..=1024 (each one a job over its own share of the LBAs).
    #[arg(long, default_value_t = 1, value_parser = qpairs)]
    qpairs: usize,
    /// Namespaces to drive, e.g. "1" or "1,3" (default: every active namespace).
    #[arg(long, value_delimiter = ',')]
    nsid: Vec<u32>,
    /// Tag every block written with its LBA, a generation, the run's random stamp and the
    /// namespace, the rest a pattern of all four; check every block read: against what this
    /// run last wrote there, or (blocks it has not written) that none is this run's data
    /// misplaced. The report counts both kinds of read. Without it, writes carry whatever their buffer last held (no fill, no copy per I/O,
    /// as SPDK's perf), so the namespace's contents after a run are undefined.
    #[arg(long)]
    verify: bool,
    /// Print the final report as JSON.
    #[arg(long)]
    json: bool,
    /// Do not pin reactors to their cores.
    #[arg(long)]
    no_pin: bool,
    /// Seed for random offsets and mixes.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

/// -q: a count of 1 or more.
fn at_least_one(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("at least 1".into()),
        Ok(n) => Ok(n),
        Err(_) => Err(format!("'{s}' is not a whole number")),
    }
}

/// --qpairs: 1..=1024 (a host poll group's qpairs).
fn qpairs(s: &str) -> Result<usize, String> {
    at_least_one(s).and_then(|n| {
        if n <= 1024 {
            Ok(n)
        } else {
            Err("at most 1024".into())
        }
    })
}

/// -o: a size of 1 byte or more (the block size is checked once connected).
fn io_size(s: &str) -> Result<u64, String> {
    match parse_size(s)? {
        0 => Err("at least one block".into()),
        n => Ok(n),
    }
}

/// -c: a core list (kept as written; parsed again where used).
fn cores(s: &str) -> Result<String, String> {
    parse_cores(s).map(|_| s.to_owned())
}

fn main() -> std::process::ExitCode {
    nvmf_initiator::cli::report::finish(run_tool())
}

fn run_tool() -> anyhow::Result<()> {
    // Without RUST_LOG: warnings, and the controller's connection story (lost, reconnected).
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new(
            "warn,nvmf_initiator::controller=info,nvmf_initiator::perf=info",
        )
    });
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    // Before any transport is opened: a flag the workload ignores is the user's mistake.
    if let (Some(_), Pattern::Read | Pattern::Write | Pattern::RandRead | Pattern::RandWrite) =
        (args.mix, args.workload)
    {
        bail!(
            "-M/--mix: {} does not mix reads and writes (rw, randrw do)",
            args.workload
        );
    }
    match args.connect.transport.as_str() {
        "loopback" => {
            let target = args.connect.loopback_target().map_err(anyhow::Error::msg)?;
            perf(LoopbackFabric::new(target), &args, || 0)
        }
        "soft" => bail!(
            "--transport soft is the in-process soft fabric: the target would have to live in \
             this process; use --transport soft-tcp to reach nvmf-tgt's soft device"
        ),
        name => {
            let reactors = parse_cores(&args.cores).map_err(anyhow::Error::msg)?.len();
            // One host poll group per reactor: I/O queue i joins reactor i % n's group, where
            // the runner moves it.
            let fabric = RdmaFabric::new(name, None)
                .with_context(|| format!("transport '{name}'"))?
                .spread(reactors)
                .group_config(host_groups(&args, reactors));
            let counted = fabric.clone();
            perf(fabric, &args, move || counted.local_invalidations())
        }
    }
}

/// Host poll groups sized for this run: each reactor's group takes its share of the I/O queues
/// (qpairs per namespace times the namespaces driven; 4 assumed when --nsid is not given) at
/// -q each, and a queue as deep as -q.
fn host_groups(args: &Args, reactors: usize) -> HostGroupConfig {
    let default = HostGroupConfig::default();
    let depth = args.queue_depth.clamp(2, 4096) as u32;
    let namespaces = if args.nsid.is_empty() {
        4
    } else {
        args.nsid.len()
    };
    let queues = (args.qpairs.max(1) * namespaces).div_ceil(reactors.max(1)) as u32;
    HostGroupConfig {
        max_queues: default.max_queues.min(queues + 8),
        max_queue_depth: default.max_queue_depth.max(depth),
        requests: default.requests.max(depth * queues),
        silent_answers: default.silent_answers,
    }
}

/// Runs the load and prints the report; `host_invalidations` reads the fabric's count of
/// per-I/O keys the host had to invalidate itself.
fn perf<F: Fabric + Clone>(
    fabric: F,
    args: &Args,
    host_invalidations: impl Fn() -> u64,
) -> anyhow::Result<()>
where
    F::Queue: 'static,
{
    let io_size = usize::try_from(args.io_size).context("-o/--io-size")?;
    let cores = parse_cores(&args.cores).map_err(anyhow::Error::msg)?;
    let mix = args.mix.unwrap_or(50);
    let mut options = args
        .connect
        .options(&args.connect.subnqn)
        .map_err(anyhow::Error::msg)?;
    options.io_queue_depth = args.queue_depth.clamp(2, 4096) as u16;
    options.io_queues = args.qpairs.clamp(1, 1024) as u16;
    // Each I/O queue registers a data slot of the largest transfer per command: size them for
    // this run's I/O, as spdk_nvme_perf allocates io_size per task (the default 128 KiB made
    // -q 128 register 16 MiB per queue).
    options.max_io_size = io_size;
    let address = args.connect.address();
    let connect = |options| {
        Controller::connect(
            fabric.clone(),
            address.clone(),
            options,
            Arc::new(SystemClock),
        )
        .with_context(|| format!("connect to {address} subsystem {}", args.connect.subnqn))
    };
    let mut controller = connect(options.clone())?;
    // Namespaces are known only once connected: with several, attach again with a queue per
    // job (qpairs per namespace).
    let driven = controller
        .namespaces()
        .iter()
        .filter(|n| args.nsid.is_empty() || args.nsid.contains(&n.target().nsid))
        .count();
    let wanted = args.qpairs * driven.max(1);
    if controller.io_queue_count() < wanted {
        let _ = controller.shutdown();
        options.io_queues = wanted.min(1024) as u16;
        controller = connect(options)?;
    }
    let cfg = RunConfig {
        spec: JobSpec {
            pattern: args.workload,
            mix,
            io_size,
            depth: args.queue_depth,
            verify: args.verify,
        },
        duration: Duration::from_secs(args.time),
        cores,
        pin: !args.no_pin,
        qpairs_per_namespace: args.qpairs,
        nsids: args.nsid.clone(),
        seed: args.seed,
        progress_every: std::io::stdout()
            .is_terminal()
            .then_some(Duration::from_secs(1)),
    };
    let mut report = run(&mut controller, &cfg, |line| {
        let mut out = std::io::stdout();
        let _ = write!(out, "\r{line}");
        let _ = out.flush();
    })
    .context("perf run")?;
    report.host_invalidations = host_invalidations();
    if cfg.progress_every.is_some() {
        println!();
    }
    if let Err(e) = controller.shutdown() {
        tracing::warn!(error = %e, "controller shutdown");
    }
    if args.json {
        println!("{}", report.to_json());
    } else {
        print!("{}", report.to_text());
    }
    if !report.passed() {
        bail!(
            "{} I/O errors, {} verify failures{}",
            report.total.errors,
            report.total.verify_failures,
            if report.connected_at_end {
                String::new()
            } else {
                format!(
                    ", the connection was lost ({} I/O failed with it) and not back at the end",
                    report.total.lost
                )
            }
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    #[test]
    fn flags_are_consistent_and_documented() {
        let cmd = super::Args::command();
        cmd.clone().debug_assert();
        for arg in cmd.get_arguments() {
            assert!(
                arg.is_hide_set() || arg.get_help().is_some(),
                "--{} has no help",
                arg.get_id()
            );
        }
    }
}
