//! The daemon's TOML configuration: the schema (serde, `deny_unknown_fields` everywhere), loading,
//! and the errors that name the file, the line and the key.
//!
//! - this file: the schema types and [`Config::load`] / [`Config::parse`];
//! - `validate.rs`: semantic checks the schema cannot express (duplicates, dangling references,
//!   NQN syntax, sizes), every one reported with its location;
//! - `locate.rs`: turning a byte span of the source into `line` and a dotted key path.
//!
//! Every error is a [`ConfigError`] printed as `FILE:LINE: KEY: MESSAGE` (`FILE: MESSAGE` for
//! a file that cannot be read); [`Config::parse`]
//! returns all semantic errors at once so `nvmf-tgt --check` can print every one.
//!
//! ```toml
//! [reactors]
//! cores = [0, 1]
//!
//! [transport]
//! provider = "soft"            # auto | verbs | soft
//! fabric = "tcp"               # soft provider only: tcp | inproc
//! listen = ["127.0.0.1:4420"]
//!
//! [[bdev]]
//! name = "malloc0"
//! kind = "malloc"              # null | malloc | file
//! size = 67108864              # bytes
//! block_size = 512             # 512 | 4096
//!
//! [[subsystem]]
//! nqn = "nqn.2016-06.io.nvmf-rs:demo"
//! allow_any_host = true
//! [[subsystem.namespace]]
//! nsid = 1
//! bdev = "malloc0"
//! ```

mod locate;
mod validate;

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use toml::Spanned;

pub use validate::{parse_hex16, parse_uuid, validate};

/// One problem in a configuration file, with where it is.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ConfigError {
    /// The file (as given to [`Config::load`], or the name given to [`Config::parse`]).
    pub file: String,
    /// 1-based line; 0 when the problem has no place in the file (it could not be read).
    pub line: usize,
    /// Dotted key path, e.g. `subsystem.namespace.bdev`.
    pub key: String,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Line 0 and no key: about the whole file (it could not be read).
        match (self.line, self.key.as_str()) {
            (0, "") => write!(f, "{}: {}", self.file, self.message),
            (0, key) => write!(f, "{}: {}: {}", self.file, key, self.message),
            (line, key) => write!(f, "{}:{}: {}: {}", self.file, line, key, self.message),
        }
    }
}

/// Every problem found in one file (never empty).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

/// The whole daemon configuration.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Reactor cores.
    pub reactors: ReactorsConfig,
    /// The RDMA transport.
    pub transport: TransportConfig,
    /// Daemon behaviour (stats file, shutdown bound).
    #[serde(default)]
    pub daemon: DaemonConfig,
    /// Block devices, `[[bdev]]`.
    #[serde(default, rename = "bdev")]
    pub bdevs: Vec<BdevConfig>,
    /// NVM subsystems, `[[subsystem]]`.
    #[serde(default, rename = "subsystem")]
    pub subsystems: Vec<SubsystemConfig>,
}

/// `[reactors]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReactorsConfig {
    /// One reactor per entry, pinned to that core.
    pub cores: Spanned<Vec<usize>>,
    /// A reactor that found no work for this long sleeps until a message or an event wakes
    /// it (saves a core on an idle target; costs a wake-up on the next command). Default
    /// 1000 us.
    #[serde(default)]
    pub idle_after_us: Option<Spanned<u64>>,
    /// Never sleep: poll all the time, as SPDK's reactors do (lowest latency at low queue
    /// depth; the core stays busy). Excludes `idle_after_us`.
    #[serde(default)]
    pub busy_poll: bool,
}

impl ReactorsConfig {
    /// How long a reactor polls without work before it sleeps (`Duration::MAX`: never).
    pub fn idle_after(&self) -> std::time::Duration {
        if self.busy_poll {
            return std::time::Duration::MAX;
        }
        self.idle_after_us
            .as_ref()
            .map_or(nvmf_poller::DEFAULT_IDLE_AFTER, |us| {
                std::time::Duration::from_micros(*us.get_ref())
            })
    }
}

/// RDMA provider choice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Provider {
    /// Verbs when a device is present, else soft.
    #[default]
    Auto,
    /// Real verbs (rdma-core).
    Verbs,
    /// The software RDMA device.
    Soft,
}

/// Soft provider fabric.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Fabric {
    /// Separate processes over TCP.
    #[default]
    Tcp,
    /// In-process (tests, measuring the stack's own cost).
    Inproc,
}

/// `[transport]`: the RDMA transport and its poll groups.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TransportConfig {
    /// auto | verbs | soft.
    #[serde(default)]
    pub provider: Provider,
    /// Soft provider only: tcp | inproc.
    #[serde(default)]
    pub fabric: Option<Spanned<Fabric>>,
    /// Listen addresses (ip:port); 4420 serves I/O and discovery.
    pub listen: Spanned<Vec<Spanned<SocketAddr>>>,
    /// Most commands outstanding per I/O queue.
    #[serde(default = "default_queue_depth")]
    pub max_queue_depth: Spanned<u32>,
    /// Most commands outstanding on the admin queue.
    #[serde(default = "default_queue_depth")]
    pub max_aq_depth: Spanned<u32>,
    /// In-capsule data bytes on I/O queues.
    #[serde(default = "default_in_capsule")]
    pub in_capsule_data_size: Spanned<u32>,
    /// Largest data transfer of one command (MDTS is derived from it).
    #[serde(default = "default_max_io")]
    pub max_io_size: Spanned<u32>,
    /// Size of one poll-group data buffer.
    #[serde(default = "default_io_unit")]
    pub io_unit_size: Spanned<u32>,
    /// Receive slots on each poll group's SRQ.
    #[serde(default = "default_srq_depth")]
    pub srq_depth: Spanned<u32>,
    /// Data buffers per poll group.
    #[serde(default = "default_data_buffers")]
    pub data_buffers: Spanned<u32>,
    /// Lone responses (a qpair's only one in a pass, as at queue depth 1) a qpair may send
    /// in a row without a completion of their own, each held until a later completion on
    /// its qpair (or a flush when the reactor idles) retires it; 0 (the default) signals every
    /// one.
    #[serde(default = "default_silent_answers")]
    pub silent_answers: Spanned<u32>,
    /// Answer a host that asks for its key to be invalidated (keyed SGL subtype Invalidate
    /// Key) with SEND_WITH_INVALIDATE, on devices that support it (memory management
    /// extensions), as SPDK and nvmet do; false sends plain SENDs, and the host invalidates
    /// its keys itself (a LOCAL_INV per command).
    #[serde(default = "default_remote_invalidate")]
    pub remote_invalidate: bool,
}

fn default_queue_depth() -> Spanned<u32> {
    Spanned::new(0..0, 128)
}
fn default_in_capsule() -> Spanned<u32> {
    Spanned::new(0..0, 4096)
}
fn default_max_io() -> Spanned<u32> {
    Spanned::new(0..0, 131_072)
}
fn default_io_unit() -> Spanned<u32> {
    Spanned::new(0..0, 8192)
}
fn default_srq_depth() -> Spanned<u32> {
    Spanned::new(0..0, 4096)
}
fn default_data_buffers() -> Spanned<u32> {
    Spanned::new(0..0, 1024)
}
fn default_silent_answers() -> Spanned<u32> {
    Spanned::new(
        0..0,
        nvmf_transport::pollgroup::PollGroupConfig::default().silent_answers,
    )
}

fn default_remote_invalidate() -> bool {
    true
}

/// `[daemon]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DaemonConfig {
    /// Where the daemon writes its statistics (rewritten every `stats_interval_ms` and on
    /// SIGUSR1); none when absent.
    #[serde(default)]
    pub stats_file: Option<PathBuf>,
    /// How often the stats file is rewritten.
    #[serde(default = "default_stats_interval")]
    pub stats_interval_ms: u64,
    /// Bound on a graceful stop (in-flight I/O, flushes, disconnects).
    #[serde(default = "default_shutdown_timeout")]
    pub shutdown_timeout_ms: u64,
}

fn default_stats_interval() -> u64 {
    1000
}
fn default_shutdown_timeout() -> u64 {
    5000
}

impl Default for DaemonConfig {
    fn default() -> Self {
        DaemonConfig {
            stats_file: None,
            stats_interval_ms: default_stats_interval(),
            shutdown_timeout_ms: default_shutdown_timeout(),
        }
    }
}

/// Block device kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BdevKind {
    /// Discards writes, reads zeroes.
    Null,
    /// Memory.
    Malloc,
    /// A file or block device through io_uring.
    File,
}

/// `[[bdev]]`. One flat table (not a tagged enum) so every field keeps its span; which keys a
/// kind accepts is checked in `validate.rs`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BdevConfig {
    /// Name namespaces refer to.
    pub name: Spanned<String>,
    /// null | malloc | file.
    pub kind: Spanned<BdevKind>,
    /// Bytes (required for null and malloc; for file, the size to create or extend to, else
    /// the file's size).
    #[serde(default)]
    pub size: Option<Spanned<u64>>,
    /// 512 or 4096.
    #[serde(default = "default_block_size")]
    pub block_size: Spanned<u32>,
    /// File only: the path.
    #[serde(default)]
    pub path: Option<Spanned<PathBuf>>,
    /// File only: open with O_DIRECT (bypass the page cache).
    #[serde(default)]
    pub direct: Option<Spanned<bool>>,
}

fn default_block_size() -> Spanned<u32> {
    Spanned::new(0..0, 512)
}

/// `[[subsystem]]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubsystemConfig {
    /// Subsystem NQN.
    pub nqn: Spanned<String>,
    /// Serial number (at most 20 ASCII characters).
    #[serde(default)]
    pub serial: Option<Spanned<String>>,
    /// Model number (at most 40 ASCII characters).
    #[serde(default)]
    pub model: Option<Spanned<String>>,
    /// Any host may connect (then `hosts` must be empty).
    #[serde(default)]
    pub allow_any_host: bool,
    /// Host NQNs allowed to connect when `allow_any_host` is false (then at least one).
    #[serde(default)]
    pub hosts: Vec<Spanned<String>>,
    /// Largest NSID (and the NN field of Identify Controller).
    #[serde(default = "default_max_namespaces")]
    pub max_namespaces: Spanned<u32>,
    /// Listen addresses (of `transport.listen`) this subsystem is exposed on; all when absent.
    #[serde(default)]
    pub listen: Option<Vec<Spanned<SocketAddr>>>,
    /// `[[subsystem.namespace]]`.
    #[serde(default, rename = "namespace")]
    pub namespaces: Vec<NamespaceConfig>,
}

fn default_max_namespaces() -> Spanned<u32> {
    Spanned::new(0..0, 32)
}

/// `[[subsystem.namespace]]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NamespaceConfig {
    /// Namespace id (1..=max_namespaces).
    pub nsid: Spanned<u32>,
    /// Name of a `[[bdev]]`.
    pub bdev: Spanned<String>,
    /// Optional UUID (8-4-4-4-12 hex).
    #[serde(default)]
    pub uuid: Option<Spanned<String>>,
    /// Optional NGUID (32 hex digits).
    #[serde(default)]
    pub nguid: Option<Spanned<String>>,
}

impl Config {
    /// Read, parse and validate `path`.
    pub fn load(path: &Path) -> Result<Config, ConfigErrors> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| {
            ConfigErrors(vec![ConfigError {
                file: file.clone(),
                line: 0,
                key: String::new(),
                message: format!("cannot read: {e}"),
            }])
        })?;
        Config::parse(&text, &file)
    }

    /// Parse and validate `text`; `file` names it in errors.
    pub fn parse(text: &str, file: &str) -> Result<Config, ConfigErrors> {
        let config: Config = toml::from_str(text).map_err(|e| {
            let (line, key) = match e.span() {
                Some(span) => locate::line_and_key(text, span, e.message()),
                None => (0, String::new()),
            };
            ConfigErrors(vec![ConfigError {
                file: file.to_owned(),
                line,
                key,
                message: e.message().trim().to_owned(),
            }])
        })?;
        let errors = validate(&config, text, file);
        if errors.is_empty() {
            Ok(config)
        } else {
            Err(ConfigErrors(errors))
        }
    }
}

impl TransportConfig {
    /// The fabric the soft provider uses (tcp when not given).
    pub fn fabric(&self) -> Fabric {
        self.fabric
            .as_ref()
            .map(|f| *f.get_ref())
            .unwrap_or_default()
    }
    /// MDTS in units of 4 KiB pages (CAP.MPSMIN = 0), as Identify Controller reports it.
    pub fn mdts(&self) -> u8 {
        let pages = (*self.max_io_size.get_ref() / 4096).max(1);
        // Largest n with 2^n pages <= max_io_size.
        (31 - pages.leading_zeros()) as u8
    }
}

impl BdevConfig {
    /// O_DIRECT requested.
    pub fn direct(&self) -> bool {
        self.direct.as_ref().is_some_and(|d| *d.get_ref())
    }
}

#[cfg(test)]
mod tests;
