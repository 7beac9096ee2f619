//! Plain data shared by every provider: attributes, work requests, work completions, async
//! events, QP states and connection parameters. No behaviour beyond small conversions.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

/// Which implementation is behind a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ProviderKind {
    /// Real ibverbs + librdmacm (any RDMA NIC, Soft-RoCE, siw).
    Verbs,
    /// The software RDMA device.
    Soft,
}

impl std::fmt::Display for ProviderKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ProviderKind::Verbs => "verbs",
            ProviderKind::Soft => "soft",
        })
    }
}

/// Which wire a soft device moves bytes over.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SoftFabric {
    /// Direct memory copies between QPs of one process; no syscalls on the data path.
    InProcess,
    /// Framed messages over TCP, between processes or hosts.
    Tcp,
}

/// How to open a soft device.
#[derive(Clone, Debug)]
pub struct SoftConfig {
    /// Device name, e.g. `soft0`.
    pub name: String,
    pub fabric: SoftFabric,
    /// The device's IPv4 address: its RoCE v2 GID is the IPv4-mapped form of it, and the CM
    /// resolves addresses to the soft device that owns them.
    pub ip: Ipv4Addr,
    /// TCP fabric: the port the device accepts QP connections on (RoCE v2 uses UDP 4791; the soft
    /// device uses TCP). 0 = pick a free port.
    pub fabric_port: u16,
    /// Raise `QP_LAST_WQE_REACHED` for SRQ-attached QPs entering ERR. Off behaves like rxe and
    /// iWARP, which never raise it.
    pub last_wqe_reached: bool,
    /// Device limits reported by `query_device` and enforced on create.
    pub max_qp: u32,
    pub max_qp_wr: u32,
    pub max_srq_wr: u32,
    pub max_cqe: u32,
    pub max_sge: u32,
    /// SGEs an RDMA READ may carry (`max_sge_rd`): 1 on iWARP devices, whose READ lands in
    /// one local buffer. At most `max_sge`.
    pub max_sge_rd: u32,
    pub max_qp_rd_atom: u32,
    pub max_inline_data: u32,
}

impl Default for SoftConfig {
    fn default() -> Self {
        SoftConfig {
            name: "soft0".into(),
            fabric: SoftFabric::InProcess,
            ip: Ipv4Addr::LOCALHOST,
            fabric_port: 0,
            last_wqe_reached: true,
            max_qp: 1 << 17,
            max_qp_wr: 16384,
            max_srq_wr: 16384,
            max_cqe: 1 << 20,
            max_sge: 16,
            max_sge_rd: 16,
            max_qp_rd_atom: 16,
            max_inline_data: 256,
        }
    }
}

/// An entry of `Provider::devices()`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    pub name: String,
    pub provider: ProviderKind,
    /// Node GUID (0 where the provider has none).
    pub guid: u64,
    /// Kernel transport: "InfiniBand", "iWARP", "soft".
    pub transport: String,
}

bitflags::bitflags! {
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
    /// Device capability flags (the subset NVMe-oF cares about, verbs bit values).
    pub struct DeviceCapFlags: u64 {
        const RC_RNR_NAK_GEN = 1 << 12;
        const SRQ_RESIZE = 1 << 13;
        const MEM_WINDOW = 1 << 17;
        const MEM_MGT_EXTENSIONS = 1 << 21;
    }
}

/// `ibv_query_device` as plain data.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeviceAttr {
    pub fw_ver: String,
    pub node_guid: u64,
    pub sys_image_guid: u64,
    pub vendor_id: u32,
    pub vendor_part_id: u32,
    pub hw_ver: u32,
    pub phys_port_cnt: u8,
    pub max_mr_size: u64,
    pub max_qp: u32,
    pub max_qp_wr: u32,
    pub max_sge: u32,
    /// SGEs one RDMA READ may carry (0 where a device does not say).
    pub max_sge_rd: u32,
    pub max_cq: u32,
    pub max_cqe: u32,
    pub max_mr: u32,
    pub max_pd: u32,
    pub max_qp_rd_atom: u32,
    pub max_qp_init_rd_atom: u32,
    pub max_srq: u32,
    pub max_srq_wr: u32,
    pub max_srq_sge: u32,
    pub cap_flags: DeviceCapFlags,
    /// Whether SRQ-attached QPs raise `QP_LAST_WQE_REACHED` after entering ERR. False for rxe,
    /// siw / iWARP and a soft device configured like them: teardown must fall back to flush
    /// accounting and a timeout.
    pub raises_last_wqe_reached: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PortState {
    Nop,
    Down,
    Init,
    Armed,
    Active,
    ActiveDefer,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkLayer {
    InfiniBand,
    Ethernet,
    Unspecified,
}

/// IB MTU enumeration (256 .. 4096 bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Mtu {
    Mtu256 = 1,
    Mtu512 = 2,
    Mtu1024 = 3,
    Mtu2048 = 4,
    Mtu4096 = 5,
}

impl Mtu {
    pub fn bytes(self) -> u32 {
        128 << (self as u32)
    }
    pub fn from_code(code: u32) -> Option<Mtu> {
        Some(match code {
            1 => Mtu::Mtu256,
            2 => Mtu::Mtu512,
            3 => Mtu::Mtu1024,
            4 => Mtu::Mtu2048,
            5 => Mtu::Mtu4096,
            _ => return None,
        })
    }
}

/// `ibv_query_port` as plain data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortAttr {
    pub port_num: u8,
    pub state: PortState,
    pub max_mtu: Mtu,
    pub active_mtu: Mtu,
    pub gid_tbl_len: u32,
    pub lid: u16,
    pub sm_lid: u16,
    pub link_layer: LinkLayer,
    pub active_speed: u32,
    pub active_width: u32,
}

/// A 128-bit GID as it appears on the wire (network byte order).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// The IPv4-mapped GID `::ffff:a.b.c.d` (RoCE v2 over IPv4).
    pub fn from_ipv4(ip: Ipv4Addr) -> Gid {
        Gid(ip.to_ipv6_mapped().octets())
    }
    /// `Some(a.b.c.d)` when this GID is IPv4-mapped.
    pub fn to_ipv4(&self) -> Option<Ipv4Addr> {
        Ipv6Addr::from(self.0).to_ipv4_mapped()
    }
    pub fn is_zero(&self) -> bool {
        self.0 == [0; 16]
    }
    pub fn to_ipv6(&self) -> Ipv6Addr {
        Ipv6Addr::from(self.0)
    }
}

impl std::fmt::Display for Gid {
    /// The sysfs / ibv_devinfo form: eight groups of four hex digits.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, pair) in self.0.chunks_exact(2).enumerate() {
            if i > 0 {
                f.write_str(":")?;
            }
            write!(f, "{:02x}{:02x}", pair[0], pair[1])?;
        }
        Ok(())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GidType {
    Ib,
    RoceV1,
    RoceV2,
}

/// One populated entry of a port's GID table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GidEntry {
    pub index: u32,
    pub gid: Gid,
    pub gid_type: GidType,
    /// The network device the GID belongs to (RoCE), when known.
    pub netdev: Option<String>,
}

bitflags::bitflags! {
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
    /// Memory region access flags (verbs bit values).
    pub struct Access: u32 {
        const LOCAL_WRITE = 1;
        const REMOTE_WRITE = 1 << 1;
        const REMOTE_READ = 1 << 2;
        /// A memory window may be bound over the region (`IBV_ACCESS_MW_BIND`).
        const MW_BIND = 1 << 4;
    }
}

/// A scatter/gather element. Same layout as `struct ibv_sge`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

bitflags::bitflags! {
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
    /// Send work request flags (verbs bit values).
    pub struct SendFlags: u32 {
        const FENCE = 1;
        const SIGNALED = 1 << 1;
        const SOLICITED = 1 << 2;
        const INLINE = 1 << 3;
    }
}

/// What a send work request does. Remote addresses and keys travel with the opcode that
/// needs them, so an RDMA READ without an rkey cannot be expressed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SendOp {
    Send,
    SendWithImm {
        imm: u32,
    },
    /// SEND that invalidates `rkey` at the responder (NVMe-oF: the host's keyed-SGL key).
    SendWithInv {
        rkey: u32,
    },
    RdmaWrite {
        remote_addr: u64,
        rkey: u32,
    },
    RdmaWriteWithImm {
        remote_addr: u64,
        rkey: u32,
        imm: u32,
    },
    RdmaRead {
        remote_addr: u64,
        rkey: u32,
    },
    /// Invalidate `rkey` (a bound type-2 memory window of this QP's PD) at this side, in send
    /// queue order. A key that is not a bound window of the PD fails the WR (LOC_QP_OP_ERR).
    LocalInv {
        rkey: u32,
    },
    /// Bind a type-2 memory window over `addr..addr + length` of the region `lkey` names (which
    /// was registered with `Access::MW_BIND`), granting `access`; once it executes the window
    /// answers to `rkey`. Build it with `Mw::bind` (it picks the next rkey), never by hand.
    BindMw {
        /// The window's handle (`Mw::handle`).
        mw: u32,
        /// The rkey the window takes (the old one with its low byte incremented).
        rkey: u32,
        lkey: u32,
        addr: u64,
        length: u64,
        access: Access,
    },
}

/// A send work request. Borrowed SGEs: posting never allocates.
#[derive(Clone, Copy, Debug)]
pub struct SendWr<'a> {
    pub wr_id: u64,
    pub op: SendOp,
    pub sges: &'a [Sge],
    pub flags: SendFlags,
}

/// A receive work request (QP receive queue or SRQ).
#[derive(Clone, Copy, Debug)]
pub struct RecvWr<'a> {
    pub wr_id: u64,
    pub sges: &'a [Sge],
}

/// `enum ibv_wc_status`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum WcStatus {
    #[default]
    Success,
    LocLenErr,
    LocQpOpErr,
    LocEecOpErr,
    LocProtErr,
    WrFlushErr,
    MwBindErr,
    BadRespErr,
    LocAccessErr,
    RemInvReqErr,
    RemAccessErr,
    RemOpErr,
    RetryExcErr,
    RnrRetryExcErr,
    LocRddViolErr,
    RemInvRdReqErr,
    RemAbortErr,
    InvEecnErr,
    InvEecStateErr,
    FatalErr,
    RespTimeoutErr,
    GeneralErr,
}

impl WcStatus {
    /// Every status, in the order of its discriminant (a soft CQ's receive ring stores the
    /// index).
    #[cfg(any(test, feature = "soft"))]
    pub(crate) const ALL: [WcStatus; 22] = [
        WcStatus::Success,
        WcStatus::LocLenErr,
        WcStatus::LocQpOpErr,
        WcStatus::LocEecOpErr,
        WcStatus::LocProtErr,
        WcStatus::WrFlushErr,
        WcStatus::MwBindErr,
        WcStatus::BadRespErr,
        WcStatus::LocAccessErr,
        WcStatus::RemInvReqErr,
        WcStatus::RemAccessErr,
        WcStatus::RemOpErr,
        WcStatus::RetryExcErr,
        WcStatus::RnrRetryExcErr,
        WcStatus::LocRddViolErr,
        WcStatus::RemInvRdReqErr,
        WcStatus::RemAbortErr,
        WcStatus::InvEecnErr,
        WcStatus::InvEecStateErr,
        WcStatus::FatalErr,
        WcStatus::RespTimeoutErr,
        WcStatus::GeneralErr,
    ];
}

/// `enum ibv_wc_opcode`. Valid only when the status is Success (verbs leaves it undefined on
/// errors): classify failed completions by their wr_id.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum WcOpcode {
    #[default]
    Send,
    RdmaWrite,
    RdmaRead,
    CompSwap,
    FetchAdd,
    BindMw,
    LocalInv,
    Recv,
    RecvRdmaWithImm,
}

impl WcOpcode {
    /// Every opcode, in the order of its discriminant.
    #[cfg(any(test, feature = "soft"))]
    pub(crate) const ALL: [WcOpcode; 9] = [
        WcOpcode::Send,
        WcOpcode::RdmaWrite,
        WcOpcode::RdmaRead,
        WcOpcode::CompSwap,
        WcOpcode::FetchAdd,
        WcOpcode::BindMw,
        WcOpcode::LocalInv,
        WcOpcode::Recv,
        WcOpcode::RecvRdmaWithImm,
    ];
}

/// A work completion. Plain `Copy` data so a batch is polled into a caller's slice.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WorkCompletion {
    pub wr_id: u64,
    pub status: WcStatus,
    pub opcode: WcOpcode,
    pub vendor_err: u32,
    pub byte_len: u32,
    pub qp_num: u32,
    pub src_qp: u32,
    /// Immediate data (host order) of SEND_WITH_IMM / RDMA_WRITE_WITH_IMM.
    pub imm_data: Option<u32>,
    /// The rkey a SEND_WITH_INV invalidated at this (responder) side.
    pub invalidated_rkey: Option<u32>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QpState {
    Reset,
    Init,
    Rtr,
    Rts,
    Sqd,
    Sqe,
    Err,
}

/// Queue sizes asked for at QP creation; the provider reports what it granted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QpCaps {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

/// SRQ creation attributes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SrqInit {
    pub max_wr: u32,
    pub max_sge: u32,
    /// Arm SRQ_LIMIT_REACHED when fewer than this many receives remain (0 = off).
    pub limit: u32,
}

/// The address of a QP as exchanged out of band (pingpong style) to bring it to RTR.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpEndpoint {
    pub qp_num: u32,
    pub psn: u32,
    pub lid: u16,
    pub gid: Gid,
}

/// INIT -> RTR attributes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RtrAttr {
    pub remote: QpEndpoint,
    pub port_num: u8,
    /// Local GID index to source from (RoCE: must hold a GID of the right type and address).
    pub sgid_index: u8,
    pub path_mtu: Mtu,
    /// Incoming RDMA READs the responder accepts at once.
    pub max_dest_rd_atomic: u8,
    /// RNR NAK timer code (IB encoding, 12 = 0.64 ms).
    pub min_rnr_timer: u8,
}

/// RTR -> RTS attributes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RtsAttr {
    pub sq_psn: u32,
    /// Local ACK timeout code (4.096 us * 2^timeout).
    pub timeout: u8,
    pub retry_cnt: u8,
    /// 7 = retry forever.
    pub rnr_retry: u8,
    /// Outstanding RDMA READs this side may issue.
    pub max_rd_atomic: u8,
}

/// What an async event is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AsyncEventKind {
    QpFatal { qp_num: u32 },
    QpReqErr { qp_num: u32 },
    QpAccessErr { qp_num: u32 },
    CommEstablished { qp_num: u32 },
    SqDrained { qp_num: u32 },
    PathMigrated { qp_num: u32 },
    QpLastWqeReached { qp_num: u32 },
    SrqLimitReached { srq_id: u32 },
    SrqErr { srq_id: u32 },
    CqErr { cq_id: u32 },
    PortActive { port: u8 },
    PortErr { port: u8 },
    LidChange { port: u8 },
    GidChange { port: u8 },
    DeviceFatal,
    Other { code: u32 },
}

impl AsyncEventKind {
    /// The QP the event names; None for events of an SRQ, a CQ, a port or the whole device.
    pub fn qp_num(&self) -> Option<u32> {
        match *self {
            Self::QpFatal { qp_num }
            | Self::QpReqErr { qp_num }
            | Self::QpAccessErr { qp_num }
            | Self::CommEstablished { qp_num }
            | Self::SqDrained { qp_num }
            | Self::PathMigrated { qp_num }
            | Self::QpLastWqeReached { qp_num } => Some(qp_num),
            _ => None,
        }
    }
}

/// An async event; the provider has already acknowledged it (destroying a QP blocks on
/// unacknowledged events in verbs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AsyncEvent {
    pub kind: AsyncEventKind,
}

/// Connection parameters for connect / accept (the rdma_conn_param subset RC uses).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConnParam {
    /// At most 56 bytes on connect and 196 on accept (IB CM limits); longer is refused.
    pub private_data: Vec<u8>,
    /// Incoming RDMA READs this side accepts at once.
    pub responder_resources: u8,
    /// RDMA READs this side issues at once.
    pub initiator_depth: u8,
    pub retry_count: u8,
    /// 7 = retry forever.
    pub rnr_retry_count: u8,
}

/// Most private data a connect request may carry.
pub const MAX_CONNECT_PRIVATE_DATA: usize = 56;
/// Most private data an accept may carry.
pub const MAX_ACCEPT_PRIVATE_DATA: usize = 196;
/// Most private data a reject may carry.
pub const MAX_REJECT_PRIVATE_DATA: usize = 148;

/// Connection manager events (rdma_cm_event_type, the ones RC servers and clients see).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CmEventKind {
    /// On a listener: a peer wants to connect. The event carries the new id.
    ConnectRequest {
        private_data: Vec<u8>,
        /// The peer's offered depths (its responder_resources / initiator_depth).
        responder_resources: u8,
        initiator_depth: u8,
        local: SocketAddr,
        remote: SocketAddr,
    },
    Established {
        private_data: Vec<u8>,
    },
    Rejected {
        /// Transport reject reason (IB CM: 28 = consumer reject).
        reason: u32,
        private_data: Vec<u8>,
    },
    Unreachable,
    ConnectError,
    Disconnected,
    TimewaitExit,
    DeviceRemoval,
    AddrChange,
}

/// How long a connect may take before it is reported as `Unreachable`.
pub const DEFAULT_CM_TIMEOUT: Duration = Duration::from_secs(5);

#[cfg(test)]
mod tests {
    use super::{WcOpcode, WcStatus};

    #[test]
    fn the_variant_lists_follow_the_discriminants_to_the_last_variant() {
        for (i, s) in WcStatus::ALL.iter().enumerate() {
            assert_eq!(*s as usize, i, "{s:?}");
        }
        assert_eq!(WcStatus::ALL.len(), WcStatus::GeneralErr as usize + 1);
        for (i, o) in WcOpcode::ALL.iter().enumerate() {
            assert_eq!(*o as usize, i, "{o:?}");
        }
        assert_eq!(WcOpcode::ALL.len(), WcOpcode::RecvRdmaWithImm as usize + 1);
    }
}
