//! Semantic checks of a parsed [`Config`]: what serde cannot say. Every problem is collected (not
//! only the first) with the span of the offending value, so `--check` prints them all.

use std::collections::{HashMap, HashSet};
use std::ops::Range;

use nvmf_protocol::{DISCOVERY_NQN, validate_nqn};
use toml::Spanned;

use super::locate::{key_at, line_of};
use super::{BdevKind, Config, ConfigError, Provider};

/// Smallest admin queue the Linux host asks for (HRQSIZE 32).
const MIN_AQ_DEPTH: u32 = 32;
/// A request holds at most this many data buffers (one io unit each). Beyond that a transfer
/// within max_io_size always works: one needing more SGEs or work requests than one chain
/// holds (many descriptors, small io units) is moved in several chains.
const MAX_BUFFERS_PER_IO: u32 = nvmf_transport::pollgroup::MAX_REQUEST_BUFFERS as u32;

struct Report<'a> {
    text: &'a str,
    file: &'a str,
    errors: Vec<ConfigError>,
}

impl Report<'_> {
    /// An error at `span`; `key` names it when given, else the key is read from the source.
    fn at(&mut self, span: Range<usize>, key: &str, message: impl Into<String>) {
        let line = line_of(self.text, span.start);
        let key = if key.is_empty() {
            key_at(self.text, line)
        } else {
            key.to_owned()
        };
        self.errors.push(ConfigError {
            file: self.file.to_owned(),
            line,
            key,
            message: message.into(),
        });
    }
}

/// Every semantic problem of `config` (parsed from `text`, named `file`).
pub fn validate(config: &Config, text: &str, file: &str) -> Vec<ConfigError> {
    let mut r = Report {
        text,
        file,
        errors: Vec::new(),
    };
    reactors(config, &mut r);
    transport(config, &mut r);
    let bdevs = bdevs(config, &mut r);
    subsystems(config, &bdevs, &mut r);
    r.errors
}

fn reactors(config: &Config, r: &mut Report<'_>) {
    let cores = &config.reactors.cores;
    if cores.get_ref().is_empty() {
        r.at(
            cores.span(),
            "reactors.cores",
            "at least one core is needed",
        );
    }
    if let (true, Some(idle)) = (config.reactors.busy_poll, &config.reactors.idle_after_us) {
        r.at(
            idle.span(),
            "reactors.idle_after_us",
            "has no effect with busy_poll = true (a busy-polling reactor never sleeps)",
        );
    }
    let mut seen = HashSet::new();
    for c in cores.get_ref() {
        if !seen.insert(*c) {
            r.at(
                cores.span(),
                "reactors.cores",
                format!("core {c} listed twice"),
            );
        }
    }
}

fn transport(config: &Config, r: &mut Report<'_>) {
    let t = &config.transport;
    if let Some(f) = &t.fabric {
        if t.provider == Provider::Verbs {
            r.at(
                f.span(),
                "transport.fabric",
                "fabric applies to the soft provider only",
            );
        }
    }
    if t.listen.get_ref().is_empty() {
        r.at(
            t.listen.span(),
            "transport.listen",
            "at least one listen address is needed",
        );
    }
    let mut seen = HashSet::new();
    for a in t.listen.get_ref() {
        let addr = a.get_ref();
        if !seen.insert(*addr) {
            r.at(a.span(), "transport.listen", format!("{addr} listed twice"));
        }
        // A host connects to an address and port the discovery log names, and a subsystem is
        // served on the listen address the connection arrived at: a wildcard or port 0
        // would be an address no connection ever matches.
        if addr.ip().is_unspecified() {
            r.at(
                a.span(),
                "transport.listen",
                format!("{addr}: name the address hosts connect to, not a wildcard"),
            );
        }
        if addr.port() == 0 {
            r.at(
                a.span(),
                "transport.listen",
                format!("{addr}: name the port hosts connect to (4420 is NVMe-oF's)"),
            );
        }
    }
    let range = |r: &mut Report<'_>, v: &Spanned<u32>, key: &str, lo: u32, hi: u32| {
        if !(lo..=hi).contains(v.get_ref()) {
            r.at(
                v.span(),
                key,
                format!("{} is outside {lo}..={hi}", v.get_ref()),
            );
        }
    };
    range(r, &t.max_queue_depth, "transport.max_queue_depth", 2, 4096);
    range(
        r,
        &t.max_aq_depth,
        "transport.max_aq_depth",
        MIN_AQ_DEPTH,
        4096,
    );
    range(
        r,
        &t.in_capsule_data_size,
        "transport.in_capsule_data_size",
        0,
        65536,
    );
    if t.in_capsule_data_size.get_ref() % 16 != 0 {
        r.at(
            t.in_capsule_data_size.span(),
            "transport.in_capsule_data_size",
            "must be a multiple of 16 (IOCCSZ counts 16-byte units)",
        );
    }
    let unit = *t.io_unit_size.get_ref();
    range(r, &t.io_unit_size, "transport.io_unit_size", 4096, 1 << 20);
    if unit % 4096 != 0 {
        r.at(
            t.io_unit_size.span(),
            "transport.io_unit_size",
            "must be a multiple of 4096",
        );
    }
    let max_io = *t.max_io_size.get_ref();
    if max_io < 4096 || !max_io.is_power_of_two() {
        r.at(
            t.max_io_size.span(),
            "transport.max_io_size",
            format!("{max_io} must be a power of two of at least 4096 (MDTS is a power of two)"),
        );
    } else if unit >= 4096 && max_io > unit.saturating_mul(MAX_BUFFERS_PER_IO) {
        r.at(
            t.max_io_size.span(),
            "transport.max_io_size",
            format!(
                "{max_io} needs more than {MAX_BUFFERS_PER_IO} buffers of io_unit_size {unit} \
                 (a request holds at most {MAX_BUFFERS_PER_IO}): raise io_unit_size or lower max_io_size"
            ),
        );
    }
    range(r, &t.srq_depth, "transport.srq_depth", 1, 1 << 20);
    if t.srq_depth.get_ref() < t.max_queue_depth.get_ref() {
        r.at(
            t.srq_depth.span(),
            "transport.srq_depth",
            "must be at least max_queue_depth",
        );
    }
    range(
        r,
        &t.silent_answers,
        "transport.silent_answers",
        0,
        nvmf_transport::pollgroup::MAX_SILENT_ANSWERS,
    );
    if unit >= 4096 && *t.data_buffers.get_ref() < max_io.div_ceil(unit) {
        r.at(
            t.data_buffers.span(),
            "transport.data_buffers",
            "too few to hold one max_io_size transfer",
        );
    }
    // Each reactor's poll group has a pool of its own.
    let groups = config.reactors.cores.get_ref().len().max(1) as u64;
    let pool = u64::from(*t.data_buffers.get_ref()) * u64::from(unit) * groups;
    if let Some(memory) = memory_total().filter(|m| pool > *m) {
        // The default (not written) has no place in the file: point at the io unit, or the
        // table.
        let span = [
            t.data_buffers.span(),
            t.io_unit_size.span(),
            t.listen.span(),
        ]
        .into_iter()
        .find(|s| !s.is_empty())
        .unwrap_or(0..0);
        r.at(
            span,
            "transport.data_buffers",
            format!(
                "{} buffers of io_unit_size {unit} on each of {groups} reactors are {pool} bytes, \
                 more than this machine's {memory} bytes of memory",
                t.data_buffers.get_ref()
            ),
        );
    }
}

/// This machine's memory in bytes (MemTotal), when /proc/meminfo says.
fn memory_total() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// Checks `[[bdev]]` and returns name -> kind of the valid-named ones.
fn bdevs(config: &Config, r: &mut Report<'_>) -> HashMap<String, BdevKind> {
    let mut names = HashMap::new();
    // Malloc bdevs live in memory: together they must fit in it.
    let memory = memory_total();
    let mut in_memory = 0u64;
    for b in &config.bdevs {
        if let (BdevKind::Malloc, Some(size), Some(memory)) = (*b.kind.get_ref(), &b.size, memory) {
            in_memory = in_memory.saturating_add(*size.get_ref());
            if in_memory > memory {
                r.at(
                    size.span(),
                    "bdev.size",
                    format!(
                        "malloc bdevs up to this one need {in_memory} bytes, more than this \
                         machine's {memory} bytes of memory"
                    ),
                );
            }
        }
        let name = b.name.get_ref();
        if name.is_empty() {
            r.at(b.name.span(), "bdev.name", "must not be empty");
        } else if names.insert(name.clone(), *b.kind.get_ref()).is_some() {
            r.at(
                b.name.span(),
                "bdev.name",
                format!("duplicate bdev name {name:?}"),
            );
        }
        let bs = *b.block_size.get_ref();
        if bs != 512 && bs != 4096 {
            r.at(
                b.block_size.span(),
                "bdev.block_size",
                format!("{bs} is not a supported block size (512 or 4096)"),
            );
        }
        let kind = *b.kind.get_ref();
        match (&b.size, kind) {
            (None, BdevKind::Null | BdevKind::Malloc) => r.at(
                b.name.span(),
                "bdev.size",
                "null and malloc bdevs need a size",
            ),
            (Some(s), _) if *s.get_ref() == 0 => r.at(s.span(), "bdev.size", "must not be 0"),
            (Some(s), _) if (bs == 512 || bs == 4096) && s.get_ref() % u64::from(bs) != 0 => r.at(
                s.span(),
                "bdev.size",
                format!("{} is not a multiple of block_size {bs}", s.get_ref()),
            ),
            _ => {}
        }
        match (kind, &b.path) {
            (BdevKind::File, None) => r.at(b.kind.span(), "bdev.path", "a file bdev needs a path"),
            (BdevKind::Null | BdevKind::Malloc, Some(p)) => {
                r.at(p.span(), "bdev.path", "only file bdevs take a path")
            }
            _ => {}
        }
        if let (BdevKind::Null | BdevKind::Malloc, Some(d)) = (kind, &b.direct) {
            r.at(d.span(), "bdev.direct", "only file bdevs take direct");
        }
    }
    names
}

fn subsystems(config: &Config, bdevs: &HashMap<String, BdevKind>, r: &mut Report<'_>) {
    let listen: HashSet<_> = config
        .transport
        .listen
        .get_ref()
        .iter()
        .map(|a| *a.get_ref())
        .collect();
    let mut nqns = HashSet::new();
    let mut claimed: HashMap<&str, &str> = HashMap::new();
    for s in &config.subsystems {
        let nqn = s.nqn.get_ref();
        if let Err(e) = validate_nqn(nqn) {
            r.at(
                s.nqn.span(),
                "subsystem.nqn",
                format!("invalid NQN {nqn:?}: {e}"),
            );
        } else if nqn == DISCOVERY_NQN {
            r.at(
                s.nqn.span(),
                "subsystem.nqn",
                "the discovery NQN is served by the target itself",
            );
        } else if !nqns.insert(nqn.as_str()) {
            r.at(
                s.nqn.span(),
                "subsystem.nqn",
                format!("duplicate subsystem NQN {nqn:?}"),
            );
        }
        for (field, value, max) in [("serial", &s.serial, 20usize), ("model", &s.model, 40)] {
            if let Some(v) = value {
                let text = v.get_ref();
                if text.len() > max || !text.bytes().all(|b| (0x20..0x7f).contains(&b)) {
                    r.at(
                        v.span(),
                        &format!("subsystem.{field}"),
                        format!("must be at most {max} printable ASCII characters"),
                    );
                }
            }
        }
        let mut hosts = HashSet::new();
        for h in &s.hosts {
            if let Err(e) = validate_nqn(h.get_ref()) {
                r.at(
                    h.span(),
                    "subsystem.hosts",
                    format!("invalid host NQN {:?}: {e}", h.get_ref()),
                );
            } else if !hosts.insert(h.get_ref()) {
                r.at(
                    h.span(),
                    "subsystem.hosts",
                    format!("{:?} listed twice", h.get_ref()),
                );
            }
        }
        let max_ns = *s.max_namespaces.get_ref();
        if !(1..=1024).contains(&max_ns) {
            r.at(
                s.max_namespaces.span(),
                "subsystem.max_namespaces",
                format!("{max_ns} is outside 1..=1024"),
            );
        }
        // Who may connect: everyone, or the hosts listed, not both and not no one.
        match (s.allow_any_host, s.hosts.first()) {
            (true, Some(h)) => r.at(
                h.span(),
                "subsystem.hosts",
                "allow_any_host = true admits every host: list hosts or allow any, not both",
            ),
            (false, None) => r.at(
                s.nqn.span(),
                "subsystem.hosts",
                "no host could connect: list the host NQNs allowed, or set allow_any_host = true",
            ),
            _ => {}
        }
        if let Some(addrs) = &s.listen {
            if addrs.is_empty() {
                r.at(
                    s.nqn.span(),
                    "subsystem.listen",
                    "empty: the subsystem would be reachable nowhere (leave listen out to serve it \
                     on every transport.listen address)",
                );
            }
            for a in addrs {
                if !listen.contains(a.get_ref()) {
                    r.at(
                        a.span(),
                        "subsystem.listen",
                        format!("{} is not in transport.listen", a.get_ref()),
                    );
                }
            }
        }
        let mut nsids = HashSet::new();
        for ns in &s.namespaces {
            let nsid = *ns.nsid.get_ref();
            if nsid == 0 || nsid > max_ns {
                r.at(
                    ns.nsid.span(),
                    "subsystem.namespace.nsid",
                    format!("{nsid} is outside 1..=max_namespaces ({max_ns})"),
                );
            } else if !nsids.insert(nsid) {
                r.at(
                    ns.nsid.span(),
                    "subsystem.namespace.nsid",
                    format!("duplicate nsid {nsid}"),
                );
            }
            let bdev = ns.bdev.get_ref();
            if !bdevs.contains_key(bdev) {
                r.at(
                    ns.bdev.span(),
                    "subsystem.namespace.bdev",
                    format!("no [[bdev]] named {bdev:?}"),
                );
            } else if let Some(other) = claimed.insert(bdev, nqn) {
                r.at(
                    ns.bdev.span(),
                    "subsystem.namespace.bdev",
                    format!("bdev {bdev:?} is already a namespace of {other}"),
                );
            }
            if let Some(u) = &ns.uuid {
                if parse_uuid(u.get_ref()).is_none() {
                    r.at(
                        u.span(),
                        "subsystem.namespace.uuid",
                        "not a UUID (8-4-4-4-12 hex digits)",
                    );
                }
            }
            if let Some(g) = &ns.nguid {
                if parse_hex16(g.get_ref()).is_none() {
                    r.at(
                        g.span(),
                        "subsystem.namespace.nguid",
                        "not an NGUID (32 hex digits)",
                    );
                }
            }
        }
    }
}

/// `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` to bytes.
pub fn parse_uuid(s: &str) -> Option<[u8; 16]> {
    let groups: Vec<&str> = s.split('-').collect();
    let lens: Vec<usize> = groups.iter().map(|g| g.len()).collect();
    if lens != [8, 4, 4, 4, 12] {
        return None;
    }
    parse_hex16(&groups.concat())
}

/// 32 hex digits to bytes.
pub fn parse_hex16(s: &str) -> Option<[u8; 16]> {
    if s.len() != 32 || !s.is_ascii() {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}
