//! `nvmf-tgt`: the NVMe-oF target daemon.
//!
//! - `main.rs`: the command line (clap), logging (tracing, human or JSON), `--check`;
//! - `daemon.rs`: start (bdevs, subsystems, reactors), the signal loop, graceful stop;
//! - `stats.rs`: per-reactor and per-subsystem statistics, printed on SIGUSR1 and written to
//!   the stats file.
//!
//! Statistics of a running daemon: set `[daemon] stats_file` in the configuration; the daemon
//! rewrites it (JSON, atomically by rename) every `stats_interval_ms` and on SIGUSR1, and
//! `cat` reads it. SIGUSR1 also logs the same numbers.
#![forbid(unsafe_code)]

mod daemon;
mod stats;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, ValueEnum};
use nvmf_target::config::Config;

/// NVMe-over-Fabrics target daemon (RDMA), configured by a TOML file.
#[derive(Parser, Debug)]
#[command(version, long_about = None)]
struct Cli {
    /// The TOML configuration file (see configs/ for examples).
    #[arg(long, short = 'c', value_name = "FILE")]
    config: PathBuf,
    /// Validate the configuration and exit: 0 when valid, else 1 after printing every error
    /// as FILE:LINE: KEY: MESSAGE. Opens nothing, creates nothing.
    #[arg(long)]
    check: bool,
    /// Log format on stderr: `human` (default) or `json` (one object per line). The level is
    /// taken from RUST_LOG (default `info`).
    #[arg(long, value_enum, default_value_t = LogFormat::Human)]
    log_format: LogFormat,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum LogFormat {
    Human,
    Json,
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Human => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let config = match Config::load(&cli.config) {
        Ok(c) => c,
        Err(errors) => {
            for e in &errors.0 {
                eprintln!("{e}");
            }
            return ExitCode::FAILURE;
        }
    };
    if cli.check {
        println!("{}: ok", cli.config.display());
        return ExitCode::SUCCESS;
    }
    init_logging(cli.log_format);
    match daemon::run(&config) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{}", nvmf_transport::one_line(e.as_ref()));
            ExitCode::FAILURE
        }
    }
}
