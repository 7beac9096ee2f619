//! nvme-cli-like output: `nvme id-ctrl` and `nvme id-ns` field names and layout (with a JSON
//! form using the same keys, numbers as numbers), a namespace list, `nvme discover`'s entry
//! blocks, get-feature lines, the SMART log, hex dumps for other log pages, and the controller
//! properties as `nvme show-regs` prints them.

use nvmf_protocol::features::FeatureId;
use nvmf_protocol::identify::{IdentifyController, IdentifyNamespace};
use nvmf_protocol::log::{
    DiscoveryLog, RdmaCms, RdmaProviderType, RdmaQpType, SmartLog, SubsystemType, TransportType,
    Tsas,
};
use nvmf_protocol::properties::{Cap, Cc, Csts, ShutdownNotification, ShutdownStatus, Vs};
use serde_json::{Map, Value};

use crate::controller::{Namespace, hex_id, uuid_string};

/// One printed field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Field {
    /// Decimal number.
    Num(u128),
    /// Number printed in hex ("0x1f"), a number in JSON.
    Hex(u64),
    /// Text.
    Text(String),
}

impl Field {
    fn text(&self) -> String {
        match self {
            Self::Num(n) => n.to_string(),
            Self::Hex(n) => c_hex(*n),
            Self::Text(s) => s.clone(),
        }
    }
    fn json(&self) -> Value {
        match self {
            Self::Num(n) => {
                u64::try_from(*n).map_or_else(|_| Value::String(n.to_string()), Value::from)
            }
            Self::Hex(n) => Value::from(*n),
            Self::Text(s) => Value::String(s.clone()),
        }
    }
}

/// C's `%#x`, which nvme-cli uses: zero prints as "0", anything else as "0x..".
fn c_hex(n: u64) -> String {
    if n == 0 {
        "0".into()
    } else {
        format!("{n:#x}")
    }
}

fn num(v: impl Into<u128>) -> Field {
    Field::Num(v.into())
}
fn hex(v: impl Into<u64>) -> Field {
    Field::Hex(v.into())
}
fn text(s: impl Into<String>) -> Field {
    Field::Text(s.into())
}

/// Identify Controller fields in nvme-cli's order and spelling.
pub fn id_ctrl_fields(id: &IdentifyController) -> Vec<(&'static str, Field)> {
    vec![
        ("vid", hex(id.vid)),
        ("ssvid", hex(id.ssvid)),
        ("sn", text(format!("{:<20}", id.sn.as_str()))),
        ("mn", text(format!("{:<40}", id.mn.as_str()))),
        ("fr", text(format!("{:<8}", id.fr.as_str()))),
        ("rab", num(id.rab)),
        (
            "ieee",
            text(format!(
                "{:02x}{:02x}{:02x}",
                id.ieee[2], id.ieee[1], id.ieee[0]
            )),
        ),
        ("cmic", num(id.cmic)),
        ("mdts", num(id.mdts)),
        ("cntlid", hex(id.cntlid)),
        ("ver", hex(id.ver)),
        ("rtd3r", hex(id.rtd3r)),
        ("rtd3e", hex(id.rtd3e)),
        ("oaes", hex(id.oaes)),
        ("ctratt", hex(id.ctratt)),
        ("rrls", hex(id.rrls)),
        ("cntrltype", num(id.cntrltype)),
        ("fguid", text(uuid_string(&id.fguid))),
        ("crdt1", num(id.crdt[0])),
        ("crdt2", num(id.crdt[1])),
        ("crdt3", num(id.crdt[2])),
        ("oacs", hex(id.oacs)),
        ("acl", num(id.acl)),
        ("aerl", num(id.aerl)),
        ("frmw", hex(id.frmw)),
        ("lpa", hex(id.lpa)),
        ("elpe", num(id.elpe)),
        ("npss", num(id.npss)),
        ("avscc", hex(id.avscc)),
        ("apsta", hex(id.apsta)),
        ("wctemp", num(id.wctemp)),
        ("cctemp", num(id.cctemp)),
        ("mtfa", num(id.mtfa)),
        ("hmpre", num(id.hmpre)),
        ("hmmin", num(id.hmmin)),
        ("tnvmcap", num(id.tnvmcap)),
        ("unvmcap", num(id.unvmcap)),
        ("rpmbs", num(id.rpmbs)),
        ("edstt", num(id.edstt)),
        ("dsto", num(id.dsto)),
        ("fwug", num(id.fwug)),
        ("kas", num(id.kas)),
        ("hctma", hex(id.hctma)),
        ("mntmt", num(id.mntmt)),
        ("mxtmt", num(id.mxtmt)),
        ("sanicap", hex(id.sanicap)),
        ("anatt", num(id.anatt)),
        ("anacap", num(id.anacap)),
        ("anagrpmax", num(id.anagrpmax)),
        ("nanagrpid", num(id.nanagrpid)),
        ("pels", num(id.pels)),
        ("sqes", hex(id.sqes)),
        ("cqes", hex(id.cqes)),
        ("maxcmd", num(id.maxcmd)),
        ("nn", num(id.nn)),
        ("oncs", hex(id.oncs)),
        ("fuses", hex(id.fuses)),
        ("fna", hex(id.fna)),
        ("vwc", hex(id.vwc)),
        ("awun", num(id.awun)),
        ("awupf", num(id.awupf)),
        ("icsvscc", num(id.icsvscc)),
        ("nwpc", num(id.nwpc)),
        ("acwu", num(id.acwu)),
        ("sgls", hex(id.sgls)),
        ("mnan", num(id.mnan)),
        ("subnqn", text(id.subnqn.as_str())),
        ("ioccsz", num(id.ioccsz)),
        ("iorcsz", num(id.iorcsz)),
        ("icdoff", num(id.icdoff)),
        ("fcatt", hex(id.fcatt)),
        ("msdbd", num(id.msdbd)),
        ("ofcs", num(id.ofcs)),
    ]
}

/// `nvme id-ctrl` text.
pub fn id_ctrl_text(id: &IdentifyController) -> String {
    let mut s = String::from("NVME Identify Controller:\n");
    for (k, v) in id_ctrl_fields(id) {
        s.push_str(&format!("{k:<10}: {}\n", v.text()));
    }
    for (i, ps) in id.psd.iter().enumerate().take(usize::from(id.npss) + 1) {
        // MP is in 0.01 W units unless MXPS says 0.0001 W.
        let watts = f64::from(ps.mp) / if ps.mxps { 10_000.0 } else { 100.0 };
        s.push_str(&format!(
            "ps {i:>4} : mp:{watts:.2}W {}operational enlat:{} exlat:{} rrt:{} rrl:{}\n",
            if ps.nops { "non-" } else { "" },
            ps.enlat,
            ps.exlat,
            ps.rrt,
            ps.rrl
        ));
        s.push_str(&format!(
            "          rwt:{} rwl:{} idle_power:- active_power:-\n",
            ps.rwt, ps.rwl
        ));
    }
    s
}

/// `nvme id-ctrl -o json`.
pub fn id_ctrl_json(id: &IdentifyController) -> Value {
    let mut m = Map::new();
    for (k, v) in id_ctrl_fields(id) {
        let v = match v {
            // JSON carries the trimmed strings.
            Field::Text(t) => Value::String(t.trim_end().to_string()),
            other => other.json(),
        };
        m.insert(k.to_string(), v);
    }
    Value::Object(m)
}

/// Identify Namespace fields in nvme-cli's order and spelling (LBA formats separately).
pub fn id_ns_fields(id: &IdentifyNamespace) -> Vec<(&'static str, Field)> {
    vec![
        ("nsze", hex(id.nsze)),
        ("ncap", hex(id.ncap)),
        ("nuse", hex(id.nuse)),
        ("nsfeat", hex(id.nsfeat)),
        ("nlbaf", num(id.nlbaf)),
        ("flbas", hex(id.flbas)),
        ("mc", hex(id.mc)),
        ("dpc", hex(id.dpc)),
        ("dps", num(id.dps)),
        ("nmic", num(id.nmic)),
        ("rescap", num(id.rescap)),
        ("fpi", num(id.fpi)),
        ("dlfeat", num(id.dlfeat)),
        ("nawun", num(id.nawun)),
        ("nawupf", num(id.nawupf)),
        ("nacwu", num(id.nacwu)),
        ("nabsn", num(id.nabsn)),
        ("nabo", num(id.nabo)),
        ("nabspf", num(id.nabspf)),
        ("noiob", num(id.noiob)),
        ("nvmcap", num(id.nvmcap)),
        ("npwg", num(id.npwg)),
        ("npwa", num(id.npwa)),
        ("npdg", num(id.npdg)),
        ("npda", num(id.npda)),
        ("nows", num(id.nows)),
        ("mssrl", num(id.mssrl)),
        ("mcl", num(id.mcl)),
        ("msrc", num(id.msrc)),
        ("nulbaf", num(id.nulbaf)),
        ("anagrpid", num(id.anagrpid)),
        ("nsattr", num(id.nsattr)),
        ("nvmsetid", num(id.nvmsetid)),
        ("endgid", num(id.endgid)),
        ("nguid", text(hex_id(&id.nguid))),
        ("eui64", text(hex_id(&id.eui64))),
    ]
}

/// `nvme id-ns` text.
pub fn id_ns_text(nsid: u32, id: &IdentifyNamespace) -> String {
    let mut s = format!("NVME Identify Namespace {nsid}:\n");
    for (k, v) in id_ns_fields(id) {
        s.push_str(&format!("{k:<8}: {}\n", v.text()));
    }
    let current = id.lba_format_index();
    for (i, f) in id.lbaf.iter().enumerate().take(usize::from(id.nlbaf) + 1) {
        s.push_str(&format!(
            "lbaf {i:>2} : ms:{:<3} lbads:{:<2} rp:{} {}\n",
            f.ms,
            f.lbads,
            c_hex(u64::from(f.rp)),
            if i == current { "(in use)" } else { "" }
        ));
    }
    s
}

/// `nvme id-ns -o json`.
pub fn id_ns_json(id: &IdentifyNamespace) -> Value {
    let mut m = Map::new();
    for (k, v) in id_ns_fields(id) {
        m.insert(k.to_string(), v.json());
    }
    let lbafs: Vec<Value> = id
        .lbaf
        .iter()
        .take(usize::from(id.nlbaf) + 1)
        .map(|f| serde_json::json!({"ms": f.ms, "ds": f.lbads, "rp": f.rp}))
        .collect();
    m.insert("lbafs".into(), Value::Array(lbafs));
    Value::Object(m)
}

/// What `nvmf connect` prints about the association it made.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ConnectSummary {
    /// Transport address.
    pub address: String,
    /// Subsystem NQN.
    pub subnqn: String,
    /// Controller id.
    pub cntlid: u16,
    /// NVMe version "major.minor.tertiary".
    pub version: String,
    /// I/O queues connected.
    pub io_queues: usize,
    /// Largest transfer per command, bytes.
    pub max_transfer: usize,
    /// In-capsule data limit for writes, bytes (0 = keyed SGL only).
    pub in_capsule: usize,
    /// Registered data memory per I/O queue, bytes.
    pub queue_data: usize,
    /// Active namespaces.
    pub namespaces: Vec<u32>,
}

impl ConnectSummary {
    /// Text form, one `key: value` per line.
    pub fn to_text(&self) -> String {
        format!(
            "address     : {}\nsubnqn      : {}\ncntlid      : {}\nversion     : {}\nio_queues   : {}\nmax_transfer: {}\nin_capsule  : {}\nqueue_data  : {}\nnamespaces  : {}\n",
            self.address,
            self.subnqn,
            self.cntlid,
            self.version,
            self.io_queues,
            self.max_transfer,
            self.in_capsule,
            self.queue_data,
            self.namespaces
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(",")
        )
    }
}

/// Decimal size with a unit, like nvme-cli's list ("1.07  GB").
pub fn human_size(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "kB", "MB", "GB", "TB", "PB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1000.0 && u < UNITS.len() - 1 {
        v /= 1000.0;
        u += 1;
    }
    format!("{v:.2} {:>2}", UNITS[u])
}

/// The namespace list.
pub fn namespace_list_text(namespaces: &[Namespace]) -> String {
    let mut s = format!(
        "{:<10} {:<26} {:<16} {:<32} {:<16} {}\n",
        "Namespace", "Usage", "Format", "NGUID", "EUI64", "UUID"
    );
    for n in namespaces {
        let used = n.identify.nuse.saturating_mul(u64::from(n.block_size));
        s.push_str(&format!(
            "{:<10} {:<26} {:<16} {:<32} {:<16} {}\n",
            n.nsid,
            format!("{} / {}", human_size(used), human_size(n.size_bytes())),
            format!(
                "{} B + {} B",
                n.block_size,
                n.identify.current_lba_format().ms
            ),
            hex_id(&n.nguid),
            hex_id(&n.eui64),
            n.uuid
                .as_ref()
                .map(uuid_string)
                .unwrap_or_else(|| "-".into())
        ));
    }
    s
}

/// The namespace list as JSON.
pub fn namespace_list_json(namespaces: &[Namespace]) -> Value {
    Value::Array(
        namespaces
            .iter()
            .map(|n| {
                serde_json::json!({
                    "nsid": n.nsid,
                    "blocks": n.blocks,
                    "block_size": n.block_size,
                    "size_bytes": n.size_bytes(),
                    "nguid": hex_id(&n.nguid),
                    "eui64": hex_id(&n.eui64),
                    "uuid": n.uuid.as_ref().map(uuid_string),
                })
            })
            .collect(),
    )
}

fn trtype_name(t: TransportType) -> String {
    match t {
        TransportType::Rdma => "rdma".into(),
        TransportType::Fc => "fc".into(),
        TransportType::Tcp => "tcp".into(),
        TransportType::Loop => "loop".into(),
        TransportType::Unknown(v) => format!("unrecognized ({v})"),
    }
}

fn subtype_name(t: SubsystemType) -> String {
    match t {
        SubsystemType::DiscoveryReferral => "discovery subsystem referral".into(),
        SubsystemType::Nvm => "nvme subsystem".into(),
        SubsystemType::CurrentDiscovery => "current discovery subsystem".into(),
        SubsystemType::Unknown(v) => format!("unrecognized ({v})"),
    }
}

/// `nvme discover` text.
pub fn discovery_text(log: &DiscoveryLog) -> String {
    let mut s = format!(
        "\nDiscovery Log Number of Records {}, Generation counter {}\n",
        log.entries.len(),
        log.genctr
    );
    for (i, e) in log.entries.iter().enumerate() {
        s.push_str(&format!("=====Discovery Log Entry {i}======\n"));
        s.push_str(&format!("trtype:  {}\n", trtype_name(e.trtype)));
        s.push_str(&format!(
            "adrfam:  {}\n",
            format!("{:?}", e.adrfam).to_lowercase()
        ));
        s.push_str(&format!("subtype: {}\n", subtype_name(e.subtype)));
        s.push_str(&format!(
            "treq:    {}\n",
            match e.treq & 3 {
                1 => "required",
                2 => "not required",
                _ => "not specified",
            }
        ));
        s.push_str(&format!("portid:  {}\n", e.portid));
        s.push_str(&format!("trsvcid: {}\n", e.trsvcid.as_str()));
        s.push_str(&format!("subnqn:  {}\n", e.subnqn.as_str()));
        s.push_str(&format!("traddr:  {}\n", e.traddr.as_str()));
        s.push_str(&format!(
            "eflags:  {}\n",
            if e.eflags == 0 {
                "none".to_string()
            } else {
                format!("{:#x}", e.eflags)
            }
        ));
        if let Tsas::Rdma(r) = &e.tsas {
            let prtype = match r.prtype {
                RdmaProviderType::NotSpecified => "not specified",
                RdmaProviderType::Ib => "infiniband",
                RdmaProviderType::Roce => "roce",
                RdmaProviderType::RoceV2 => "roce-v2",
                RdmaProviderType::Iwarp => "iwarp",
                RdmaProviderType::Unknown(_) => "unrecognized",
            };
            let qptype = match r.qptype {
                RdmaQpType::ReliableConnected => "connected",
                RdmaQpType::ReliableDatagram => "datagram",
                RdmaQpType::Unknown(_) => "unrecognized",
            };
            let cms = match r.cms {
                RdmaCms::RdmaCm => "rdma-cm",
                RdmaCms::Unknown(_) => "unrecognized",
            };
            s.push_str(&format!("rdma_prtype: {prtype}\nrdma_qptype: {qptype}\nrdma_cms:    {cms}\nrdma_pkey: {:#06x}\n", r.pkey));
        }
    }
    s
}

/// `nvme discover -o json`.
pub fn discovery_json(log: &DiscoveryLog) -> Value {
    let records: Vec<Value> = log
        .entries
        .iter()
        .map(|e| {
            serde_json::json!({
                "trtype": trtype_name(e.trtype),
                "adrfam": format!("{:?}", e.adrfam).to_lowercase(),
                "subtype": subtype_name(e.subtype),
                "portid": e.portid,
                "trsvcid": e.trsvcid.as_str(),
                "subnqn": e.subnqn.as_str(),
                "traddr": e.traddr.as_str(),
                "cntlid": e.cntlid,
                "asqsz": e.asqsz,
            })
        })
        .collect();
    serde_json::json!({"genctr": log.genctr, "records": records})
}

/// Name of a feature as nvme-cli prints it.
pub fn feature_name(fid: FeatureId) -> String {
    match fid {
        FeatureId::Unknown(v) => format!("Unknown ({v:#04x})"),
        // The enum's names are the spec's, split into words.
        named => {
            let debug = format!("{named:?}");
            let mut out = String::new();
            for (i, c) in debug.chars().enumerate() {
                if i > 0 && c.is_ascii_uppercase() {
                    out.push(' ');
                }
                out.push(c);
            }
            out
        }
    }
}

/// nvme-cli's get-feature line.
pub fn feature_line(fid: FeatureId, value: u32) -> String {
    format!(
        "get-feature:{:#04x} ({}), Current value:{value:#010x}",
        fid.raw(),
        feature_name(fid)
    )
}

/// SMART / Health log, nvme-cli style.
pub fn smart_text(s: &SmartLog) -> String {
    let kelvin = i32::from(s.composite_temperature);
    let rows: Vec<(&str, String)> = vec![
        ("critical_warning", s.critical_warning.to_string()),
        ("temperature", format!("{} °C ({kelvin} K)", kelvin - 273)),
        ("available_spare", format!("{}%", s.available_spare)),
        (
            "available_spare_threshold",
            format!("{}%", s.available_spare_threshold),
        ),
        ("percentage_used", format!("{}%", s.percentage_used)),
        (
            "endurance group critical warning summary",
            s.endurance_group_critical_warning.to_string(),
        ),
        ("Data Units Read", s.data_units_read.to_string()),
        ("Data Units Written", s.data_units_written.to_string()),
        ("host_read_commands", s.host_read_commands.to_string()),
        ("host_write_commands", s.host_write_commands.to_string()),
        ("controller_busy_time", s.controller_busy_time.to_string()),
        ("power_cycles", s.power_cycles.to_string()),
        ("power_on_hours", s.power_on_hours.to_string()),
        ("unsafe_shutdowns", s.unsafe_shutdowns.to_string()),
        ("media_errors", s.media_errors.to_string()),
        ("num_err_log_entries", s.error_log_entries.to_string()),
        (
            "Warning Temperature Time",
            s.warning_temperature_time.to_string(),
        ),
        (
            "Critical Composite Temperature Time",
            s.critical_temperature_time.to_string(),
        ),
    ];
    let mut out = String::from("Smart Log for NVME device namespace-id:ffffffff\n");
    for (k, v) in rows {
        out.push_str(&format!("{k:<41}: {v}\n"));
    }
    out
}

/// A hex dump like nvme-cli's raw log output: 16 bytes a line with offset and ASCII.
pub fn hexdump(bytes: &[u8]) -> String {
    let mut s = String::from("       0  1  2  3  4  5  6  7  8  9  a  b  c  d  e  f\n");
    for (i, line) in bytes.chunks(16).enumerate() {
        s.push_str(&format!("{:04x}:", i * 16));
        for b in line {
            s.push_str(&format!(" {b:02x}"));
        }
        for _ in line.len()..16 {
            s.push_str("   ");
        }
        s.push_str(" \"");
        s.extend(line.iter().map(|&b| {
            if (0x20..0x7f).contains(&b) {
                b as char
            } else {
                '.'
            }
        }));
        s.push_str("\"\n");
    }
    s
}

/// The properties `nvme show-regs` reads of a fabrics controller (Property Get).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Registers {
    pub cap: u64,
    pub vs: u32,
    pub cc: u32,
    pub csts: u32,
}

/// 2^(12 + n) bytes: a memory page size field.
fn page_bytes(n: u8) -> u64 {
    4096u64 << n.min(20)
}

/// A register's name, value and decoded fields.
type Register = (&'static str, u64, Vec<(&'static str, Field)>);

/// Each register's decoded fields, named as nvme-cli's `show-regs -H` names them.
fn regs_decoded(r: &Registers) -> [Register; 4] {
    let cap = Cap::from_u64(r.cap);
    let vs = Vs::from_u32(r.vs);
    let cc = Cc::from_u32(r.cc);
    let csts = Csts::from_u32(r.csts);
    let css = |bits: u8| {
        let mut sets = Vec::new();
        if bits & 1 != 0 {
            sets.push("NVM");
        }
        if bits & (1 << 6) != 0 {
            sets.push("I/O command sets");
        }
        if bits & (1 << 7) != 0 {
            sets.push("admin only");
        }
        text(if sets.is_empty() {
            "none".to_string()
        } else {
            sets.join(", ")
        })
    };
    let shn = match cc.shn {
        ShutdownNotification::None => text("none"),
        ShutdownNotification::Normal => text("normal"),
        ShutdownNotification::Abrupt => text("abrupt"),
        other => text(format!("reserved ({})", other.raw())),
    };
    let shst = match csts.shst {
        ShutdownStatus::Normal => text("normal operation"),
        ShutdownStatus::Occurring => text("shutdown processing occurring"),
        ShutdownStatus::Complete => text("shutdown processing complete"),
        other => text(format!("reserved ({})", other.raw())),
    };
    [
        (
            "cap",
            r.cap,
            vec![
                (
                    "Memory Page Size Maximum (MPSMAX), bytes",
                    num(page_bytes(cap.mpsmax)),
                ),
                (
                    "Memory Page Size Minimum (MPSMIN), bytes",
                    num(page_bytes(cap.mpsmin)),
                ),
                ("Command Sets Supported (CSS)", css(cap.css)),
                ("NVM Subsystem Reset Supported (NSSRS)", num(cap.nssrs)),
                (
                    "Doorbell Stride (DSTRD), bytes",
                    num(4u64 << cap.dstrd.min(15)),
                ),
                ("Timeout (TO), ms", num(cap.timeout_ms())),
                ("Arbitration Mechanism Supported (AMS)", hex(cap.ams)),
                ("Contiguous Queues Required (CQR)", num(cap.cqr)),
                (
                    "Maximum Queue Entries Supported (MQES)",
                    num(cap.max_queue_entries()),
                ),
            ],
        ),
        (
            "version",
            u64::from(r.vs),
            vec![(
                "NVMe specification version",
                text(format!("{}.{}.{}", vs.major, vs.minor, vs.tertiary)),
            )],
        ),
        (
            "cc",
            u64::from(r.cc),
            vec![
                (
                    "I/O Completion Queue Entry Size (IOCQES), bytes",
                    num(1u64 << cc.iocqes.min(15)),
                ),
                (
                    "I/O Submission Queue Entry Size (IOSQES), bytes",
                    num(1u64 << cc.iosqes.min(15)),
                ),
                ("Shutdown Notification (SHN)", shn),
                ("Arbitration Mechanism Selected (AMS)", hex(cc.ams)),
                ("Memory Page Size (MPS), bytes", num(page_bytes(cc.mps))),
                ("I/O Command Set Selected (CSS)", hex(cc.css)),
                ("Enable (EN)", num(cc.en)),
            ],
        ),
        (
            "csts",
            u64::from(r.csts),
            vec![
                ("Processing Paused (PP)", num(csts.pp)),
                ("NVM Subsystem Reset Occurred (NSSRO)", num(csts.nssro)),
                ("Shutdown Status (SHST)", shst),
                ("Controller Fatal Status (CFS)", num(csts.cfs)),
                ("Ready (RDY)", num(csts.rdy)),
            ],
        ),
    ]
}

/// `nvme show-regs` text: one line per register in hex; `human` adds its decoded fields.
pub fn regs_text(r: &Registers, human: bool) -> String {
    let mut s = String::new();
    for (name, value, fields) in regs_decoded(r) {
        s.push_str(&format!("{name:<8}: {value:x}\n"));
        if human {
            for (field, v) in fields {
                s.push_str(&format!("\t{field}: {}\n", v.text()));
            }
            s.push('\n');
        }
    }
    s
}

/// `nvme show-regs -o json`: each register as a number (and with `human` its decoded fields
/// under "<register>_decoded").
pub fn regs_json(r: &Registers, human: bool) -> Value {
    let mut m = Map::new();
    for (name, value, fields) in regs_decoded(r) {
        m.insert(name.to_string(), Value::from(value));
        if human {
            let decoded: Map<String, Value> = fields
                .into_iter()
                .map(|(field, v)| (field.to_string(), v.json()))
                .collect();
            m.insert(format!("{name}_decoded"), Value::Object(decoded));
        }
    }
    Value::Object(m)
}

#[cfg(test)]
mod tests {
    use super::*;
    use nvmf_protocol::FixedStr;
    use nvmf_protocol::identify::LbaFormat;

    fn ctrl() -> IdentifyController {
        IdentifyController {
            vid: 0x1b36,
            sn: FixedStr::new("SN123", "SN").unwrap(),
            mn: FixedStr::new("nvmf-rs", "MN").unwrap(),
            mdts: 5,
            cntlid: 1,
            ver: 0x10300,
            sqes: 0x66,
            cqes: 0x44,
            nn: 2,
            sgls: 0x100005,
            ioccsz: 260,
            subnqn: FixedStr::new("nqn.2024-01.io.example:a", "SUBNQN").unwrap(),
            ..IdentifyController::default()
        }
    }

    #[test]
    fn id_ctrl_matches_nvme_cli_layout() {
        let t = id_ctrl_text(&ctrl());
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines[0], "NVME Identify Controller:");
        assert_eq!(lines[1], "vid       : 0x1b36");
        assert!(t.contains("\nsn        : SN123               \n"), "{t}");
        assert!(t.contains("\nmdts      : 5\n"));
        assert!(t.contains("\nrtd3r     : 0\n"), "C's %#x prints zero as 0");
        assert!(t.contains("\ncntlid    : 0x1\n"));
        assert!(t.contains("\nver       : 0x10300\n"));
        assert!(t.contains("\nsqes      : 0x66\n"));
        assert!(t.contains("\nsgls      : 0x100005\n"));
        assert!(t.contains("\nsubnqn    : nqn.2024-01.io.example:a\n"));
        assert!(t.contains("\nioccsz    : 260\n"));
        assert!(
            t.contains("\nps    0 : mp:0.00W operational enlat:0 exlat:0 rrt:0 rrl:0\n"),
            "{t}"
        );
        let j = id_ctrl_json(&ctrl());
        assert_eq!(j["vid"], 0x1b36);
        assert_eq!(j["sn"], "SN123");
        assert_eq!(j["nn"], 2);
    }

    #[test]
    fn id_ns_matches_nvme_cli_layout() {
        let mut id = IdentifyNamespace::simple(0x100000, 9);
        id.nlbaf = 1;
        id.flbas = 1;
        id.lbaf[1] = LbaFormat::with_block_shift(12);
        id.nguid = [0xab; 16];
        let t = id_ns_text(1, &id);
        assert!(
            t.starts_with("NVME Identify Namespace 1:\nnsze    : 0x100000\n"),
            "{t}"
        );
        assert!(t.contains("\nnlbaf   : 1\n"));
        assert!(t.contains("\nnguid   : abababababababababababababababab\n"));
        assert!(t.contains("\nlbaf  0 : ms:0   lbads:9  rp:0 \n"), "{t}");
        assert!(
            t.contains("\nlbaf  1 : ms:0   lbads:12 rp:0 (in use)\n"),
            "{t}"
        );
        let j = id_ns_json(&id);
        assert_eq!(j["nsze"], 0x100000);
        assert_eq!(j["lbafs"][1]["ds"], 12);
    }

    #[test]
    fn discovery_features_sizes_and_hexdump() {
        use nvmf_protocol::log::{AddressFamily, DiscoveryLogEntry, RdmaTsas};
        let e = DiscoveryLogEntry {
            trtype: TransportType::Rdma,
            adrfam: AddressFamily::Ipv4,
            subtype: SubsystemType::Nvm,
            treq: 0,
            portid: 1,
            cntlid: 0xffff,
            asqsz: 32,
            eflags: 0,
            trsvcid: FixedStr::new("4420", "t").unwrap(),
            subnqn: FixedStr::new("nqn.2024-01.io.example:a", "s").unwrap(),
            traddr: FixedStr::new("10.0.0.1", "a").unwrap(),
            tsas: Tsas::Rdma(RdmaTsas::default()),
        };
        let log = DiscoveryLog {
            genctr: 3,
            recfmt: 0,
            entries: vec![e],
        };
        let t = discovery_text(&log);
        assert!(t.contains("Discovery Log Number of Records 1, Generation counter 3"));
        assert!(t.contains("=====Discovery Log Entry 0======\ntrtype:  rdma\nadrfam:  ipv4\nsubtype: nvme subsystem\n"), "{t}");
        assert!(t.contains("traddr:  10.0.0.1\n") && t.contains("rdma_cms:    rdma-cm\n"));
        assert_eq!(discovery_json(&log)["records"][0]["traddr"], "10.0.0.1");
        assert_eq!(
            feature_line(FeatureId::NumberOfQueues, 0x0007_0007),
            "get-feature:0x07 (Number Of Queues), Current value:0x00070007"
        );
        assert_eq!(human_size(1_073_741_824), "1.07 GB");
        let d = hexdump(b"NVMe\x00\x01");
        assert_eq!(
            d.lines().nth(1).unwrap(),
            format!("0000: 4e 56 4d 65 00 01{} \"NVMe..\"", "   ".repeat(10))
        );
        assert!(
            smart_text(&SmartLog {
                composite_temperature: 310,
                ..SmartLog::default()
            })
            .contains("37 °C (310 K)")
        );
    }

    #[test]
    fn show_regs_decodes_each_register() {
        use nvmf_protocol::properties::{Cap, Csts};
        let cap = Cap {
            mqes: 127,
            to: 30,
            css: 1,
            mpsmax: 4,
            ..Cap::default()
        };
        let csts = Csts {
            rdy: false,
            cfs: true,
            shst: ShutdownStatus::Complete,
            ..Csts::default()
        };
        let regs = Registers {
            cap: cap.to_u64(),
            vs: 0x0002_0100,
            cc: 0x0046_4001,
            csts: csts.to_u32(),
        };
        let plain = regs_text(&regs, false);
        assert_eq!(
            plain,
            format!(
                "cap     : {:x}\nversion : 20100\ncc      : 464001\ncsts    : {:x}\n",
                cap.to_u64(),
                csts.to_u32()
            )
        );
        let human = regs_text(&regs, true);
        for line in [
            "\tMaximum Queue Entries Supported (MQES): 128\n",
            "\tTimeout (TO), ms: 15000\n",
            "\tMemory Page Size Maximum (MPSMAX), bytes: 65536\n",
            "\tCommand Sets Supported (CSS): NVM\n",
            "\tNVMe specification version: 2.1.0\n",
            "\tShutdown Notification (SHN): normal\n",
            "\tEnable (EN): 1\n",
            "\tShutdown Status (SHST): shutdown processing complete\n",
            "\tController Fatal Status (CFS): 1\n",
            "\tReady (RDY): 0\n",
        ] {
            assert!(human.contains(line), "{line:?} not in\n{human}");
        }
        let json = regs_json(&regs, true);
        assert_eq!(json["cc"], 0x0046_4001);
        assert_eq!(json["csts_decoded"]["Ready (RDY)"], 0);
        assert_eq!(
            json["cap_decoded"]["Maximum Queue Entries Supported (MQES)"],
            128
        );
        assert!(regs_json(&regs, false).get("cap_decoded").is_none());
    }
}
