//! Command-line pieces both tools share: where to connect (clap `Args`), size and core-list
//! parsing, and the in-process loopback target the tools can also run against (tests, demos
//! without a target).

use std::time::Duration;

use nvmf_protocol::Nqn;

use crate::controller::{ControllerOptions, ReconnectPolicy};
use crate::loopback::{LoopbackConfig, LoopbackTarget, NamespaceConfig};
use crate::queue::TransportAddress;

/// The most seconds a time flag takes: KATO's 32-bit milliseconds, and far below what would
/// overflow a deadline.
pub const MAX_SECONDS: u64 = u32::MAX as u64 / 1000;

/// The highest core number a core list may name (the machine's own limit is checked when the
/// reactors start).
pub const MAX_CORE: usize = 4095;

/// How and where to reach the controller.
#[derive(Debug, Clone, clap::Args)]
pub struct ConnectArgs {
    /// Transport: rdma (real verbs: an RDMA NIC, Soft-RoCE or siw), soft-tcp (the soft RDMA
    /// device over TCP: what nvmf-tgt with a soft TCP listener, e.g. configs/demo.toml, speaks),
    /// or loopback (an in-process fake target for testing the tools, fresh and zeroed on every
    /// run). "soft" (the in-process soft fabric) needs the target in the same process, so the
    /// tools refuse it.
    #[arg(long, default_value = "rdma", value_parser = ["rdma", "soft-tcp", "loopback", "soft"])]
    pub transport: String,
    /// Target address (IP or host name).
    #[arg(short = 'a', long, default_value = "127.0.0.1")]
    pub traddr: String,
    /// Target service id: the port, 1..=65535.
    #[arg(short = 's', long, default_value = "4420", value_parser = port)]
    pub trsvcid: String,
    /// Subsystem NQN to connect to.
    #[arg(short = 'n', long, default_value = "nqn.2024-01.io.nvmf-rs:loopback")]
    pub subnqn: String,
    /// This host's NQN (default: a UUID-based NQN derived from --hostid).
    #[arg(long)]
    pub hostnqn: Option<String>,
    /// This host's identifier as 32 hex digits (default: random).
    #[arg(long)]
    pub hostid: Option<String>,
    /// Keep Alive Timeout in seconds, 0..=4294967 (KATO's milliseconds fit 32 bits; 0 disables
    /// keep-alive).
    #[arg(long, default_value_t = 15, value_parser = clap::value_parser!(u64).range(0..=MAX_SECONDS))]
    pub kato: u64,
    /// Seconds between reconnect attempts after a lost connection, 1..=4294967 (nvme-cli
    /// --reconnect-delay).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=MAX_SECONDS))]
    pub reconnect_delay: u64,
    /// Seconds to keep trying before giving the controller up, up to 4294967: negative (-1)
    /// = forever, 0 = never reconnect (nvme-cli --ctrl-loss-tmo).
    #[arg(
        long,
        default_value_t = 600,
        allow_hyphen_values = true,
        value_parser = clap::value_parser!(i64).range(..=MAX_SECONDS as i64)
    )]
    pub ctrl_loss_tmo: i64,
    /// Give each I/O's data its own short-lived key (memory window, invalidated by the
    /// target's response, or by the host before the I/O completes when the target did not)
    /// where the transport supports it, instead of a long-lived key.
    #[arg(long)]
    pub per_io_keys: bool,
    /// Namespace sizes of the loopback target, e.g. "64M,64M" (loopback transport only).
    #[arg(long, default_value = "64M", hide = true)]
    pub loopback_namespaces: String,
}

impl ConnectArgs {
    /// Address of the target.
    pub fn address(&self) -> TransportAddress {
        TransportAddress {
            transport: self.transport.clone(),
            address: self.traddr.clone(),
            service: self.trsvcid.clone(),
        }
    }

    /// Controller options from the flags.
    pub fn options(&self, subnqn: &str) -> Result<ControllerOptions, String> {
        let hostid = match &self.hostid {
            Some(h) => parse_hostid(h)?,
            None => {
                let mut id = [0u8; 16];
                id.iter_mut().for_each(|b| *b = fastrand::u8(..));
                id
            }
        };
        let hostnqn = match &self.hostnqn {
            Some(n) => Nqn::parse(n)
                .map_err(|e| format!("--hostnqn: {e}"))?
                .as_str()
                .to_string(),
            None => Nqn::from_uuid(hostid).as_str().to_string(),
        };
        let mut o = ControllerOptions::new(subnqn, hostnqn, hostid);
        o.kato = Duration::from_secs(self.kato);
        o.per_io_keys = self.per_io_keys;
        o.reconnect = ReconnectPolicy {
            reconnect_delay: Duration::from_secs(self.reconnect_delay),
            ctrl_loss_timeout: u64::try_from(self.ctrl_loss_tmo)
                .ok()
                .map(Duration::from_secs),
            fast_io_fail: None,
        };
        Ok(o)
    }

    /// A loopback target serving `--subnqn` with `--loopback-namespaces`.
    pub fn loopback_target(&self) -> Result<LoopbackTarget, String> {
        let mut namespaces = Vec::new();
        for part in self
            .loopback_namespaces
            .split(',')
            .filter(|p| !p.is_empty())
        {
            let bytes = parse_size(part)?;
            namespaces.push(NamespaceConfig {
                blocks: bytes / 512,
                block_shift: 9,
            });
        }
        Ok(LoopbackTarget::new(LoopbackConfig {
            subnqn: self.subnqn.clone(),
            namespaces,
            max_io_queues: 64,
            memory_windows: true,
            discovery_entries: vec![(
                self.subnqn.clone(),
                self.traddr.clone(),
                self.trsvcid.clone(),
            )],
            ..LoopbackConfig::default()
        }))
    }
}

/// --trsvcid: a port number (kept as the text given).
fn port(s: &str) -> Result<String, String> {
    match s.parse::<u16>() {
        Ok(1..) => Ok(s.to_owned()),
        _ => Err(format!("'{s}' is not a port (1..=65535)")),
    }
}

/// "4096", "4k", "64K", "1M", "2G" (binary units).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (digits, shift) = match s.chars().last().map(|c| c.to_ascii_lowercase()) {
        Some('k') => (&s[..s.len() - 1], 10),
        Some('m') => (&s[..s.len() - 1], 20),
        Some('g') => (&s[..s.len() - 1], 30),
        _ => (s, 0),
    };
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("'{s}' is not a size (e.g. 4096, 4k, 1M)"))?;
    n.checked_shl(shift)
        .filter(|v| v >> shift == n)
        .ok_or_else(|| format!("'{s}' is too large"))
}

/// "0", "0,2", "0-3", "0-1,4".
pub fn parse_cores(s: &str) -> Result<Vec<usize>, String> {
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let bad = || format!("'{part}' is not a core or range (e.g. 0, 0-3, 0,2)");
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (usize, usize) =
                    (a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?);
                if a > b {
                    return Err(bad());
                }
                if b > MAX_CORE {
                    return Err(format!("core {b}: core numbers go up to {MAX_CORE}"));
                }
                out.extend(a..=b);
            }
            None => {
                let core = part.parse().map_err(|_| bad())?;
                if core > MAX_CORE {
                    return Err(format!("core {core}: core numbers go up to {MAX_CORE}"));
                }
                out.push(core);
            }
        }
    }
    if out.is_empty() {
        return Err("no cores given".into());
    }
    Ok(out)
}

/// 32 hex digits (dashes allowed, as in a UUID).
pub fn parse_hostid(s: &str) -> Result<[u8; 16], String> {
    let hex: String = s.chars().filter(|c| *c != '-').collect();
    // ASCII hex digits only: the bytes are sliced in pairs below (and from_str_radix would
    // take a '+').
    if hex.len() != 32 || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(format!("--hostid '{s}': need 32 hex digits"));
    }
    let mut id = [0u8; 16];
    for (i, b) in id.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16)
            .map_err(|_| format!("--hostid '{s}': not hex"))?;
    }
    Ok(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_cores_and_host_ids() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("4k"), Ok(4096));
        assert_eq!(parse_size("64M"), Ok(64 << 20));
        assert!(parse_size("x").is_err());
        assert!(parse_size("99999999999999G").is_err());
        assert_eq!(parse_cores("0-2,5"), Ok(vec![0, 1, 2, 5]));
        assert!(parse_cores("3-1").is_err());
        assert!(parse_cores("").is_err());
        // A range that would allocate without bound, and a core past any machine's.
        assert!(parse_cores("0-99999999999").is_err());
        assert!(parse_cores("4096").is_err());
        assert_eq!(parse_cores("4095"), Ok(vec![4095]));
        let id = parse_hostid("00112233-4455-6677-8899-aabbccddeeff").unwrap();
        assert_eq!(id[0], 0x00);
        assert_eq!(id[15], 0xff);
        assert!(parse_hostid("0011").is_err());
        // 32 characters that are not all ASCII hex digits (a multi-byte one sliced in half
        // panicked; '+' passed from_str_radix).
        assert!(parse_hostid("00000000000000000000000000000\u{e9}0").is_err());
        assert!(parse_hostid(&"+f".repeat(16)).is_err());
    }

    /// Time flags end where a deadline computed from them could overflow.
    #[test]
    fn time_flags_are_bounded() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            connect: ConnectArgs,
        }
        let parse = |args: &[&str]| Cli::try_parse_from([&["t"], args].concat());
        assert!(parse(&["--kato", "4294967"]).is_ok());
        let e = parse(&["--kato", "18446744073709551615"]).err().unwrap();
        assert!(e.to_string().contains("--kato"), "{e}");
        assert!(parse(&["--reconnect-delay", "0"]).is_err());
        assert!(parse(&["--ctrl-loss-tmo", "-1"]).is_ok());
        // Any negative is "forever", as nvme-cli and Linux take it.
        assert!(parse(&["--ctrl-loss-tmo", "-7"]).is_ok());
        assert!(parse(&["--ctrl-loss-tmo", "4294968"]).is_err());
        let e = parse(&["--transport", "foo"]).err().unwrap();
        assert!(e.to_string().contains("loopback"), "{e}");
    }
}
