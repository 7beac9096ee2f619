//! nvmf-rdma: the RDMA diagnostics a user reaches for first, on any provider.
//!
//! `devices` prints what `ibv_devinfo -v` would (device and port attributes, the GID table with
//! types and the IPv4 address each carries) and the GID index that serves a given IP.
//! `pingpong server|client` is the classic RC example: exchange QP info over TCP, SEND/RECV,
//! RDMA WRITE and RDMA READ with verified contents, then latency percentiles and bandwidth.
#![forbid(unsafe_code)]

mod devices;
mod oob;
mod pingpong;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use anyhow::Result;
use clap::{Parser, Subcommand, ValueEnum};
use nvmf_transport::{DeviceSpec, SoftConfig, SoftFabric};

#[derive(Parser, Debug)]
#[command(
    name = "nvmf-rdma",
    version,
    about = "RDMA diagnostics: devices, GIDs, and an RC ping-pong with latency and bandwidth"
)]
struct Cli {
    /// Which RDMA provider to use: `verbs` (a real device, incl. Soft-RoCE rxe), `soft` (the
    /// software RDMA device), or `auto` (verbs when a device exists, else soft).
    #[arg(long, value_enum, default_value_t = ProviderArg::Auto, global = true)]
    provider: ProviderArg,
    /// Verbs device name (e.g. rxe0, mlx5_0); default: the first one.
    #[arg(long, global = true)]
    device: Option<String>,
    /// Soft provider: fabric between the two sides. `tcp` works across processes and hosts;
    /// `inprocess` only within one process (useful for `devices`).
    #[arg(long, value_enum, default_value_t = FabricArg::Tcp, global = true)]
    soft_fabric: FabricArg,
    /// Soft provider: the device's IPv4 address (its RoCE v2 GID is the IPv4-mapped form).
    #[arg(long, default_value_t = Ipv4Addr::LOCALHOST, global = true)]
    soft_ip: Ipv4Addr,
    /// Soft provider: make the device behave like rxe/iWARP and never raise LAST_WQE_REACHED.
    #[arg(long, global = true)]
    soft_no_last_wqe: bool,
    /// Log filter (tracing-subscriber EnvFilter syntax), e.g. `info` or `nvmf_transport=debug`.
    #[arg(long, default_value = "warn", global = true)]
    log: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Copy, Clone, Debug, ValueEnum)]
enum ProviderArg {
    Auto,
    Verbs,
    Soft,
}

#[derive(Copy, Clone, Debug, ValueEnum)]
enum FabricArg {
    Inprocess,
    Tcp,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// List devices with their attributes, ports and GID tables (like `ibv_devinfo -v`).
    Devices {
        /// Also name the RoCE v2 GID index that carries this IP address.
        #[arg(long)]
        ip: Option<IpAddr>,
    },
    /// The classic RC ping-pong between two processes, then latency and bandwidth.
    Pingpong {
        #[command(subcommand)]
        role: pingpong::Role,
    },
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(&cli.log))
        .with_writer(std::io::stderr)
        .init();
    match run(cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("nvmf-rdma: error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    let spec = device_spec(&cli);
    match cli.command {
        Command::Devices { ip } => devices::run(&spec, ip),
        Command::Pingpong { role } => pingpong::run(&spec, role),
    }
}

fn device_spec(cli: &Cli) -> DeviceSpec {
    let soft = || {
        DeviceSpec::Soft(SoftConfig {
            fabric: match cli.soft_fabric {
                FabricArg::Inprocess => SoftFabric::InProcess,
                FabricArg::Tcp => SoftFabric::Tcp,
            },
            ip: cli.soft_ip,
            last_wqe_reached: !cli.soft_no_last_wqe,
            ..SoftConfig::default()
        })
    };
    match cli.provider {
        ProviderArg::Verbs => DeviceSpec::Verbs(cli.device.clone()),
        ProviderArg::Soft => soft(),
        ProviderArg::Auto => match nvmf_transport::devices() {
            Ok(list)
                if list
                    .iter()
                    .any(|d| d.provider == nvmf_transport::ProviderKind::Verbs) =>
            {
                DeviceSpec::Verbs(cli.device.clone())
            }
            _ => soft(),
        },
    }
}

/// The default out-of-band port, as ibv_rc_pingpong's.
pub const DEFAULT_OOB_PORT: u16 = 18515;

/// `0.0.0.0:18515`.
pub fn default_listen() -> SocketAddr {
    SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), DEFAULT_OOB_PORT)
}
