//! nvmf: an nvme-cli-like tool for NVMe-oF subsystems: discover, identify, list namespaces,
//! read / write / compare LBA ranges, zero and deallocate them, flush, get / set features, get
//! log pages.
#![forbid(unsafe_code)]

use std::io::{Read, Write};
use std::sync::Arc;

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};

use nvmf_initiator::block::BlockDevice;
use nvmf_initiator::cli::args::{ConnectArgs, parse_size};
use nvmf_initiator::cli::format;
use nvmf_initiator::clock::SystemClock;
use nvmf_initiator::controller::{Controller, LOG_PAGE_MAX};
use nvmf_initiator::loopback::LoopbackFabric;
use nvmf_initiator::queue::{Fabric, HostQueue};
use nvmf_initiator::rdma::RdmaFabric;
use nvmf_protocol::DISCOVERY_NQN;
use nvmf_protocol::features::FeatureId;
use nvmf_protocol::log::{LogId, SMART_LOG_SIZE, SmartLog};
use nvmf_protocol::properties::PropertyOffset;

/// Talk to an NVMe-oF subsystem the way nvme-cli talks to a local controller.
///
/// The connection flags (--transport, -a, -s, -n, --hostnqn, --hostid, --kato...) go before
/// the command: `nvmf -a 10.0.0.1 -n NQN read -s 0 -c 8`.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    #[command(flatten)]
    connect: ConnectArgs,
    /// Print JSON instead of text (where the command prints structures).
    #[arg(long, global = true)]
    json: bool,
    /// Registered data memory of the I/O queue, e.g. 256K (default: the queue depth times the
    /// largest transfer, one slot per command: 16 MiB at 128 x 128 KiB). Less makes the
    /// commands in flight share it by their sizes, each waiting for room; kept between one
    /// largest transfer and one per command.
    #[arg(long, global = true, value_parser = parse_size)]
    queue_data_size: Option<u64>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// List the subsystems a discovery controller knows (connects to the discovery NQN).
    Discover,
    /// Connect, print what the association granted (controller id, queues, transfer sizes,
    /// namespaces), and disconnect cleanly.
    Connect {
        /// I/O queues to ask for, 1..=65535.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
        nr_io_queues: u16,
        /// I/O queue depth to ask for, 2..=65535 (a queue holds one entry fewer than its size).
        #[arg(long, default_value_t = 128, value_parser = clap::value_parser!(u16).range(2..))]
        queue_size: u16,
    },
    /// Connect and print Identify Controller (like `nvme id-ctrl`).
    IdCtrl,
    /// Connect and print Identify Namespace (like `nvme id-ns`).
    IdNs {
        /// Namespace id.
        #[arg(short = 'N', long, default_value_t = 1)]
        nsid: u32,
    },
    /// List the active namespaces with size, format and identifiers.
    List,
    /// Read blocks to a file (or stdout).
    Read(Range),
    /// Write blocks from a file (or stdin); short input is zero padded to whole blocks.
    Write(Range),
    /// Compare blocks with a file (or stdin); exit status 1 on a mismatch.
    Compare(Range),
    /// Zero blocks without sending data (Write Zeroes, like `nvme write-zeroes`), then flush.
    WriteZeroes(Blocks),
    /// Deallocate block ranges (Dataset Management with the Deallocate attribute, like `nvme dsm
    /// --ad`): the blocks then read as the namespace's DLFEAT says (zeroes on nvmf-tgt).
    Dsm {
        /// Namespace id.
        #[arg(short = 'N', long, default_value_t = 1)]
        nsid: u32,
        /// Deallocate (the one attribute supported: required, as nvme-cli's --ad).
        #[arg(short = 'd', long, required = true)]
        ad: bool,
        /// First LBA of each range, comma separated (e.g. 0,4096).
        #[arg(short = 's', long, value_delimiter = ',', required = true)]
        slbs: Vec<u64>,
        /// Number of blocks of each range, comma separated, one per --slbs entry (not 0's
        /// based, unlike nvme-cli's).
        #[arg(short = 'b', long, value_delimiter = ',', required = true)]
        blocks: Vec<u64>,
    },
    /// Flush the namespace's volatile write cache (like `nvme flush`).
    Flush {
        /// Namespace id.
        #[arg(short = 'N', long, default_value_t = 1)]
        nsid: u32,
    },
    /// Print a feature's current value (like `nvme get-feature`).
    GetFeature {
        /// Feature id, 0..=0xff (decimal or 0x hex).
        #[arg(short = 'f', long, value_parser = parse_id8)]
        feature_id: u32,
        /// Namespace id (0 for controller features).
        #[arg(short = 'N', long, default_value_t = 0)]
        nsid: u32,
        /// CDW11 (feature specific; Host Identifier 0x81 needs 1, EXHID, for its 16 bytes).
        #[arg(long, default_value = "0", value_parser = parse_u32)]
        cdw11: u32,
        /// Bytes of data the feature returns besides its value (Host Identifier: 16, LBA
        /// Range Type: 4096; 0 for none), printed as a hex dump (like nvme-cli's -l).
        #[arg(short = 'l', long, default_value_t = 0)]
        data_len: usize,
    },
    /// Set a feature (like `nvme set-feature`).
    SetFeature {
        /// Feature id, 0..=0xff (decimal or 0x hex).
        #[arg(short = 'f', long, value_parser = parse_id8)]
        feature_id: u32,
        /// New value (CDW11; decimal or 0x hex).
        #[arg(short = 'v', long, value_parser = parse_u32)]
        value: u32,
        /// Namespace id (0 for controller features).
        #[arg(short = 'N', long, default_value_t = 0)]
        nsid: u32,
        /// Make the value persist across resets.
        #[arg(long)]
        save: bool,
        /// A file whose bytes the feature takes as its data buffer (Timestamp: 8 bytes; like
        /// nvme-cli's -d); none by default.
        #[arg(short = 'd', long)]
        data: Option<std::path::PathBuf>,
    },
    /// Print the controller's properties CAP, VS, CC and CSTS, read now with Property Get (like
    /// `nvme show-regs` on a fabrics controller): hex values, decoded with -H.
    ShowRegs {
        /// Decode each register's fields (nvme-cli's -H).
        #[arg(short = 'H', long)]
        human_readable: bool,
    },
    /// Read a log page (SMART is decoded, others dumped in hex unless --raw).
    GetLog {
        /// Log page id, 0..=0xff (decimal or 0x hex): 1 error, 2 SMART, 0x70 discovery...
        #[arg(short = 'i', long, value_parser = parse_id8)]
        log_id: u32,
        /// Bytes to read, 1..=64M (4096, 4k, 1M...).
        #[arg(short = 'l', long, default_value = "512", value_parser = log_len)]
        log_len: usize,
        /// Namespace id (0xffffffff = controller wide).
        #[arg(short = 'N', long, default_value = "0xffffffff", value_parser = parse_u32)]
        nsid: u32,
        /// Write the raw bytes to stdout.
        #[arg(long)]
        raw: bool,
    },
}

/// Blocks and the file their data comes from or goes to.
#[derive(Debug, clap::Args)]
struct Range {
    #[command(flatten)]
    blocks: Blocks,
    /// Data file (default stdin / stdout).
    #[arg(short = 'd', long)]
    data: Option<std::path::PathBuf>,
}

/// A namespace's blocks.
#[derive(Debug, clap::Args)]
struct Blocks {
    /// Namespace id.
    #[arg(short = 'N', long, default_value_t = 1)]
    nsid: u32,
    /// First LBA.
    #[arg(short = 's', long)]
    start_block: u64,
    /// Number of blocks, 1 or more (not 0's based, unlike nvme-cli's --block-count).
    #[arg(short = 'c', long, value_parser = clap::value_parser!(u64).range(1..))]
    block_count: u64,
}

impl Blocks {
    /// The byte offset and length of these blocks of `block_size` bytes, checked against a
    /// namespace of `size` bytes before any buffer is allocated (the arguments are the user's:
    /// unchecked, a start past 2^64 bytes wrapped to LBA 0).
    fn bytes(&self, block_size: u64, size: u64) -> anyhow::Result<(u64, usize)> {
        let offset = self.start_block.checked_mul(block_size);
        let len = self.block_count.checked_mul(block_size);
        match (offset, len) {
            (Some(offset), Some(len)) if offset.checked_add(len).is_some_and(|end| end <= size) => {
                Ok((offset, usize::try_from(len)?))
            }
            _ => bail!(
                "blocks {}+{} of {block_size} bytes end past namespace {} ({size} bytes)",
                self.start_block,
                self.block_count,
                self.nsid
            ),
        }
    }
}

/// get-log -l: a size of 1 byte up to the host's log page limit.
fn log_len(s: &str) -> Result<usize, String> {
    let n = parse_size(s)?;
    match usize::try_from(n) {
        Ok(n @ 1..=LOG_PAGE_MAX) => Ok(n),
        _ => Err(format!("{n} bytes: 1..={LOG_PAGE_MAX}")),
    }
}

/// A feature or log page id: 8 bits, decimal or 0x hex.
fn parse_id8(s: &str) -> Result<u32, String> {
    let n = parse_u32(s)?;
    if n > 0xff {
        return Err(format!("{n:#x}: ids are 8 bits (0..=0xff)"));
    }
    Ok(n)
}

fn parse_u32(s: &str) -> Result<u32, String> {
    let r = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(h) => u32::from_str_radix(h, 16),
        None => s.parse(),
    };
    r.map_err(|_| format!("'{s}' is not a number (decimal or 0x hex)"))
}

fn main() -> std::process::ExitCode {
    nvmf_initiator::cli::report::finish(run_tool())
}

fn run_tool() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    match args.connect.transport.as_str() {
        "loopback" => {
            let target = args.connect.loopback_target().map_err(anyhow::Error::msg)?;
            command(LoopbackFabric::new(target), &args)
        }
        "soft" => bail!(
            "--transport soft is the in-process soft fabric: the target would have to live in \
             this process; use --transport soft-tcp to reach nvmf-tgt's soft device"
        ),
        name => {
            let fabric =
                RdmaFabric::new(name, None).with_context(|| format!("transport '{name}'"))?;
            command(fabric, &args)
        }
    }
}

fn attach<F: Fabric>(fabric: F, args: &Args, subnqn: &str) -> anyhow::Result<Controller<F>> {
    let mut options = args.connect.options(subnqn).map_err(anyhow::Error::msg)?;
    if let Command::Connect {
        nr_io_queues,
        queue_size,
    } = args.command
    {
        options.io_queues = nr_io_queues;
        options.io_queue_depth = queue_size;
    }
    options.io_queue_data_size = args
        .queue_data_size
        .map(|bytes| usize::try_from(bytes).unwrap_or(usize::MAX));
    // A short-lived tool: no reconnect (a lost connection fails the command). Keep-alive goes
    // out as the block device is used (each operation polls the controller).
    options.reconnect = nvmf_initiator::controller::ReconnectPolicy::never();
    let address = args.connect.address();
    Controller::connect(fabric, address.clone(), options, Arc::new(SystemClock))
        .with_context(|| format!("connect to {address} subsystem {subnqn}"))
}

fn input(path: &Option<std::path::PathBuf>) -> anyhow::Result<Vec<u8>> {
    let mut buf = Vec::new();
    match path {
        Some(p) => buf = std::fs::read(p).with_context(|| format!("read {}", p.display()))?,
        None => {
            std::io::stdin()
                .read_to_end(&mut buf)
                .context("read stdin")?;
        }
    }
    Ok(buf)
}

fn command<F: Fabric>(fabric: F, args: &Args) -> anyhow::Result<()> {
    let print_json =
        |v: serde_json::Value| println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
    if let Command::Discover = args.command {
        let mut c = attach(fabric, args, DISCOVERY_NQN)?;
        let log = c.discovery_log().context("discovery log")?;
        if args.json {
            print_json(format::discovery_json(&log));
        } else {
            print!("{}", format::discovery_text(&log));
        }
        let _ = c.shutdown();
        return Ok(());
    }
    if let Command::Dsm { slbs, blocks, .. } = &args.command {
        // Before connecting: nothing to ask the target.
        if slbs.len() != blocks.len() {
            bail!(
                "--slbs has {} entries and --blocks {}: one block count per range",
                slbs.len(),
                blocks.len()
            );
        }
    }
    // The data to send is read before connecting: a slow stdin must not hold a connection
    // whose keep-alive nobody sends meanwhile (the target would give the controller up).
    let mut data_in = match &args.command {
        Command::Write(r) | Command::Compare(r) => Some(input(&r.data)?),
        Command::SetFeature {
            data: Some(path), ..
        } => Some(input(&Some(path.clone()))?),
        _ => None,
    };
    let mut c = attach(fabric, args, &args.connect.subnqn)?;
    let mut mismatch = false;
    match &args.command {
        Command::Discover => {}
        Command::Connect { .. } => {
            let v = c.version();
            let summary = format::ConnectSummary {
                address: args.connect.address().to_string(),
                subnqn: args.connect.subnqn.clone(),
                cntlid: c.cntlid(),
                version: format!("{}.{}.{}", v.major, v.minor, v.tertiary),
                io_queues: c.io_queue_count(),
                max_transfer: c.limits().max_transfer,
                in_capsule: c.limits().in_capsule,
                queue_data: c
                    .io_queue_mut(0)
                    .map(|q| q.queue().region().len)
                    .unwrap_or(0),
                namespaces: c.namespaces().iter().map(|n| n.nsid).collect(),
            };
            if args.json {
                print_json(serde_json::to_value(&summary).unwrap_or_default());
            } else {
                print!("{}", summary.to_text());
            }
        }
        Command::IdCtrl => {
            if args.json {
                print_json(format::id_ctrl_json(c.identify()));
            } else {
                print!("{}", format::id_ctrl_text(c.identify()));
            }
        }
        Command::IdNs { nsid } => {
            let ns = c
                .namespace(*nsid)
                .with_context(|| format!("namespace {nsid} is not active"))?;
            if args.json {
                print_json(format::id_ns_json(&ns.identify));
            } else {
                print!("{}", format::id_ns_text(*nsid, &ns.identify));
            }
        }
        Command::List => {
            if args.json {
                print_json(format::namespace_list_json(c.namespaces()));
            } else {
                print!("{}", format::namespace_list_text(c.namespaces()));
            }
        }
        Command::Read(r) | Command::Write(r) | Command::Compare(r) => {
            let (data_file, r) = (&r.data, &r.blocks);
            let mut dev = BlockDevice::new(c, r.nsid)?;
            let (offset, len) = r.bytes(u64::from(dev.block_size()), dev.size())?;
            match &args.command {
                Command::Read(_) => {
                    let mut buf = vec![0u8; len];
                    dev.read_at(offset, &mut buf)?;
                    match data_file {
                        Some(p) => std::fs::write(p, &buf)
                            .with_context(|| format!("write {}", p.display()))?,
                        None => std::io::stdout().write_all(&buf).context("write stdout")?,
                    }
                }
                Command::Write(_) => {
                    let mut data = data_in.take().unwrap_or_default();
                    if data.len() > len {
                        bail!(
                            "{} bytes of input exceed {} blocks ({len} bytes)",
                            data.len(),
                            r.block_count
                        );
                    }
                    data.resize(len, 0);
                    dev.write_at(offset, &data)?;
                    dev.flush()?;
                }
                _ => {
                    let mut data = data_in.take().unwrap_or_default();
                    data.resize(len, 0);
                    mismatch = !dev.compare_blocks(r.start_block, &data)?;
                    eprintln!("compare: {}", if mismatch { "MISMATCH" } else { "Success" });
                }
            }
            c = dev.into_controller();
        }
        Command::WriteZeroes(b) => {
            let mut dev = BlockDevice::new(c, b.nsid)?;
            dev.write_zeroes(b.start_block, b.block_count)?;
            dev.flush()?;
            println!(
                "write-zeroes: Success ({} blocks from {})",
                b.block_count, b.start_block
            );
            c = dev.into_controller();
        }
        Command::Dsm {
            nsid, slbs, blocks, ..
        } => {
            let ranges: Vec<(u64, u64)> =
                slbs.iter().copied().zip(blocks.iter().copied()).collect();
            let mut dev = BlockDevice::new(c, *nsid)?;
            dev.deallocate(&ranges)?;
            println!("dsm: Success ({} ranges deallocated)", ranges.len());
            c = dev.into_controller();
        }
        Command::Flush { nsid } => {
            let mut dev = BlockDevice::new(c, *nsid)?;
            dev.flush()?;
            println!("flush: Success (namespace {nsid})");
            c = dev.into_controller();
        }
        Command::GetFeature {
            feature_id,
            nsid,
            cdw11,
            data_len,
        } => {
            let fid =
                FeatureId::from_raw(u8::try_from(*feature_id).context("feature id is 8 bits")?);
            let (v, data) = c.get_features_data(fid, *nsid, *cdw11, *data_len)?;
            if args.json {
                let mut out = serde_json::json!({"feature_id": feature_id, "name": format::feature_name(fid), "value": v});
                if !data.is_empty() {
                    out["data"] = serde_json::Value::from(
                        data.iter().map(|b| format!("{b:02x}")).collect::<String>(),
                    );
                }
                print_json(out);
            } else {
                println!("{}", format::feature_line(fid, v));
                if !data.is_empty() {
                    print!("{}", format::hexdump(&data));
                }
            }
        }
        Command::SetFeature {
            feature_id,
            value,
            nsid,
            save,
            data,
        } => {
            let fid =
                FeatureId::from_raw(u8::try_from(*feature_id).context("feature id is 8 bits")?);
            let feature_data = if data.is_some() {
                data_in.take().unwrap_or_default()
            } else {
                Vec::new()
            };
            let v = c.set_features_data(fid, *nsid, *value, *save, &feature_data)?;
            println!(
                "set-feature:{:#04x} ({}), value:{value:#010x}, cdw0:{v:#010x}",
                fid.raw(),
                format::feature_name(fid)
            );
        }
        Command::ShowRegs { human_readable } => {
            let mut read = |offset| {
                c.property(offset)
                    .with_context(|| format!("Property Get of {offset:?}"))
            };
            let regs = format::Registers {
                cap: read(PropertyOffset::Cap)?,
                vs: read(PropertyOffset::Vs)? as u32,
                cc: read(PropertyOffset::Cc)? as u32,
                csts: read(PropertyOffset::Csts)? as u32,
            };
            if args.json {
                print_json(format::regs_json(&regs, *human_readable));
            } else {
                print!("{}", format::regs_text(&regs, *human_readable));
            }
        }
        Command::GetLog {
            log_id,
            log_len,
            nsid,
            raw,
        } => {
            let lid = LogId::from_raw(u8::try_from(*log_id).context("log id is 8 bits")?);
            let data = c.get_log_page(lid, *nsid, *log_len)?;
            if *raw {
                std::io::stdout().write_all(&data).context("write stdout")?;
            } else if lid == LogId::SmartHealth && data.len() >= SMART_LOG_SIZE {
                print!("{}", format::smart_text(&SmartLog::decode(&data)?));
            } else {
                print!("{}", format::hexdump(&data));
            }
        }
    }
    let _ = c.shutdown();
    if mismatch {
        std::process::exit(1);
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
