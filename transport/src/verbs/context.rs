//! Device contexts: opening a device through librdmacm, device and port queries, the async
//! event fd, and the factory methods for PDs, completion channels and CQs.
//!
//! librdmacm owns the `ibv_context`s it hands out with `rdma_get_devices` (reference counted
//! per list), so a context is "closed" by freeing the list it came from, after every object
//! made on it is gone. A process-wide registry maps each `ibv_context` to its live inner
//! object, so `Verbs::open` and `VerbsCmId::context` share one inner per device.

use std::mem::MaybeUninit;
use std::os::fd::RawFd;
use std::sync::{Arc, Mutex, Weak};

use rdma_sys::*;

use super::cq::{VerbsCompChannel, VerbsCq};
use super::pd::VerbsPd;
use super::{Verbs, cstr_to_string, event, gid, set_nonblocking};
use crate::error::{Result, TransportError};
use crate::provider::ContextOps;
use crate::types::*;

pub(crate) struct ContextInner {
    pub(crate) ctx: *mut ibv_context,
    /// The `rdma_get_devices` list `ctx` came from: freeing it drops librdmacm's reference.
    list: *mut *mut ibv_context,
    name: String,
    node_type: ibv_node_type::Type,
    transport_type: ibv_transport_type::Type,
}

// SAFETY: an ibv_context is thread-safe in libibverbs (calls on it lock internally); the raw
// pointers are only dereferenced through libibverbs calls and read-only fields.
unsafe impl Send for ContextInner {}
// SAFETY: as above.
unsafe impl Sync for ContextInner {}

impl Drop for ContextInner {
    fn drop(&mut self) {
        // SAFETY: `list` came from rdma_get_devices and is freed exactly once, after every
        // object created on `ctx` (they all hold an Arc of this inner).
        unsafe { rdma_free_devices(self.list) };
    }
}

/// Live contexts, keyed by their `ibv_context` pointer. Control path only.
static OPEN: Mutex<Vec<Weak<ContextInner>>> = Mutex::new(Vec::new());

/// An opened RDMA device. Cheap to clone; every object made on it keeps it alive.
#[derive(Clone)]
pub struct VerbsContext {
    pub(crate) inner: Arc<ContextInner>,
}

impl std::fmt::Debug for VerbsContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerbsContext")
            .field("name", &self.inner.name)
            .finish()
    }
}

impl VerbsContext {
    pub(crate) fn open(name: &str) -> Result<VerbsContext> {
        Self::lookup(|c| c.name == name, |dev_name, _| dev_name == name).map_err(|e| match e {
            TransportError::NoDevice(_) => TransportError::NoDevice(name.to_string()),
            e => e,
        })
    }

    /// The context a CM id is bound to (`id->verbs`).
    pub(crate) fn from_raw(ctx: *mut ibv_context) -> Result<VerbsContext> {
        Self::lookup(|c| c.ctx == ctx, |_, p| p == ctx).map_err(|e| match e {
            TransportError::NoDevice(_) => TransportError::Cm(
                "the CM id's device is no longer listed by librdmacm (removed?)".into(),
            ),
            e => e,
        })
    }

    fn lookup(
        live: impl Fn(&ContextInner) -> bool,
        wanted: impl Fn(&str, *mut ibv_context) -> bool,
    ) -> Result<VerbsContext> {
        let mut open = OPEN.lock().unwrap_or_else(|p| p.into_inner());
        open.retain(|w| w.strong_count() > 0);
        if let Some(inner) = open.iter().filter_map(Weak::upgrade).find(|c| live(c)) {
            return Ok(VerbsContext { inner });
        }
        let mut n = 0;
        // SAFETY: `n` is a valid out pointer; the list is owned by the guard below.
        let list = unsafe { rdma_get_devices(&mut n) };
        if list.is_null() {
            let err = std::io::Error::last_os_error();
            if super::list_devices().is_empty() {
                return Err(TransportError::NoDevice(String::new()));
            }
            return Err(TransportError::Os {
                op: "rdma_get_devices (is the rdma_ucm module loaded?)",
                source: err,
            });
        }
        let guard = DeviceList(list);
        for i in 0..n.max(0) as usize {
            // SAFETY: the list holds `n` context pointers followed by NULL.
            let ctx = unsafe { *list.add(i) };
            if ctx.is_null() {
                break;
            }
            // SAFETY: `ctx` is a live context owned by librdmacm; its device pointer and the
            // device's fixed-size name array are valid while the list is held.
            let (name, node_type, transport_type) = unsafe {
                let dev = (*ctx).device;
                (
                    cstr_to_string((*dev).name.as_ptr()),
                    (*dev).node_type,
                    (*dev).transport_type,
                )
            };
            if !wanted(&name, ctx) {
                continue;
            }
            // SAFETY: ctx is live; reading the async fd number.
            let async_fd = unsafe { (*ctx).async_fd };
            set_nonblocking(async_fd, "fcntl(async_fd, O_NONBLOCK)")?;
            let inner = Arc::new(ContextInner {
                ctx,
                list: guard.release(),
                name,
                node_type,
                transport_type,
            });
            open.push(Arc::downgrade(&inner));
            tracing::debug!(device = %inner.name, "opened verbs device through librdmacm");
            return Ok(VerbsContext { inner });
        }
        // `guard` frees the list.
        if list_has_ibv_device_only(&wanted) {
            return Err(TransportError::Cm(
                "the device is listed by ibverbs but not by librdmacm (is rdma_ucm loaded?)".into(),
            ));
        }
        Err(TransportError::NoDevice(String::new()))
    }

    pub(crate) fn raw(&self) -> *mut ibv_context {
        self.inner.ctx
    }

    pub(crate) fn same_device(&self, other: &VerbsContext) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// The RoCE v2 GID index on `port` whose IPv4-mapped address is `ip` (the index RTR and
    /// the CM need); `NoGidForAddress` listing the table when there is none.
    pub fn gid_index_for(&self, port: u8, ip: std::net::IpAddr) -> Result<u8> {
        let table = self.gid_table(port)?;
        let index = crate::gid::roce_v2_index(&table, ip)?;
        u8::try_from(index)
            .map_err(|_| TransportError::InvalidArgument(format!("GID index {index} exceeds 255")))
    }
}

/// Whether some ibverbs device (not seen by librdmacm) matches: for a clearer error.
fn list_has_ibv_device_only(wanted: &impl Fn(&str, *mut ibv_context) -> bool) -> bool {
    super::list_devices()
        .iter()
        .any(|d| wanted(&d.name, std::ptr::null_mut()))
}

/// Frees an `rdma_get_devices` list unless released.
struct DeviceList(*mut *mut ibv_context);

impl DeviceList {
    fn release(self) -> *mut *mut ibv_context {
        let p = self.0;
        std::mem::forget(self);
        p
    }
}

impl Drop for DeviceList {
    fn drop(&mut self) {
        // SAFETY: the list came from rdma_get_devices and was not handed to a ContextInner.
        unsafe { rdma_free_devices(self.0) };
    }
}

/// Rxe, siw and iWARP devices never raise `QP_LAST_WQE_REACHED`; detect them by transport,
/// node type, device name and vendor id (rxe: 0xFFFFFF, siw: 0x626d74).
pub(crate) fn raises_last_wqe_reached(
    name: &str,
    node_type: ibv_node_type::Type,
    transport_type: ibv_transport_type::Type,
    vendor_id: u32,
) -> bool {
    const RXE_VENDOR_ID: u32 = 0x00ff_ffff;
    const SIW_VENDOR_ID: u32 = 0x0062_6d74;
    !(transport_type == ibv_transport_type::IBV_TRANSPORT_IWARP
        || node_type == ibv_node_type::IBV_NODE_RNIC
        || name.starts_with("rxe")
        || name.starts_with("siw")
        || vendor_id == RXE_VENDOR_ID
        || vendor_id == SIW_VENDOR_ID)
}

fn non_neg(v: i32) -> u32 {
    v.max(0) as u32
}

/// `ibv_device_attr` as plain data.
pub(crate) fn device_attr_from(
    a: &ibv_device_attr,
    name: &str,
    node_type: ibv_node_type::Type,
    transport_type: ibv_transport_type::Type,
) -> DeviceAttr {
    DeviceAttr {
        fw_ver: cstr_to_string(a.fw_ver.as_ptr()),
        node_guid: u64::from_be(a.node_guid),
        sys_image_guid: u64::from_be(a.sys_image_guid),
        vendor_id: a.vendor_id,
        vendor_part_id: a.vendor_part_id,
        hw_ver: a.hw_ver,
        phys_port_cnt: a.phys_port_cnt,
        max_mr_size: a.max_mr_size,
        max_qp: non_neg(a.max_qp),
        max_qp_wr: non_neg(a.max_qp_wr),
        max_sge: non_neg(a.max_sge),
        max_sge_rd: non_neg(a.max_sge_rd),
        max_cq: non_neg(a.max_cq),
        max_cqe: non_neg(a.max_cqe),
        max_mr: non_neg(a.max_mr),
        max_pd: non_neg(a.max_pd),
        max_qp_rd_atom: non_neg(a.max_qp_rd_atom),
        max_qp_init_rd_atom: non_neg(a.max_qp_init_rd_atom),
        max_srq: non_neg(a.max_srq),
        max_srq_wr: non_neg(a.max_srq_wr),
        max_srq_sge: non_neg(a.max_srq_sge),
        cap_flags: DeviceCapFlags::from_bits_truncate(u64::from(a.device_cap_flags)),
        raises_last_wqe_reached: raises_last_wqe_reached(
            name,
            node_type,
            transport_type,
            a.vendor_id,
        ),
    }
}

pub(crate) fn port_state_from(s: ibv_port_state::Type) -> PortState {
    match s {
        ibv_port_state::IBV_PORT_DOWN => PortState::Down,
        ibv_port_state::IBV_PORT_INIT => PortState::Init,
        ibv_port_state::IBV_PORT_ARMED => PortState::Armed,
        ibv_port_state::IBV_PORT_ACTIVE => PortState::Active,
        ibv_port_state::IBV_PORT_ACTIVE_DEFER => PortState::ActiveDefer,
        _ => PortState::Nop,
    }
}

/// `IBV_LINK_LAYER_*` (an anonymous enum in verbs.h that bindgen does not emit).
pub(crate) const IBV_LINK_LAYER_INFINIBAND: u8 = 1;
pub(crate) const IBV_LINK_LAYER_ETHERNET: u8 = 2;

pub(crate) fn link_layer_from(l: u8) -> LinkLayer {
    match l {
        IBV_LINK_LAYER_INFINIBAND => LinkLayer::InfiniBand,
        IBV_LINK_LAYER_ETHERNET => LinkLayer::Ethernet,
        _ => LinkLayer::Unspecified,
    }
}

/// An MTU code from the device; a code we do not know reads as the smallest MTU.
pub(crate) fn mtu_from(code: ibv_mtu::Type) -> Mtu {
    Mtu::from_code(code).unwrap_or(Mtu::Mtu256)
}

pub(crate) fn port_attr_from(port: u8, a: &ibv_port_attr) -> PortAttr {
    PortAttr {
        port_num: port,
        state: port_state_from(a.state),
        max_mtu: mtu_from(a.max_mtu),
        active_mtu: mtu_from(a.active_mtu),
        gid_tbl_len: non_neg(a.gid_tbl_len),
        lid: a.lid,
        sm_lid: a.sm_lid,
        link_layer: link_layer_from(a.link_layer),
        active_speed: u32::from(a.active_speed),
        active_width: u32::from(a.active_width),
    }
}

impl VerbsContext {
    pub(crate) fn query_port_raw(&self, port: u8) -> Result<ibv_port_attr> {
        let mut attr = MaybeUninit::<ibv_port_attr>::zeroed();
        // SAFETY: ctx is live; `attr` is a zeroed, writable ibv_port_attr of the size the
        // call is told.
        let rc = unsafe { ___ibv_query_port(self.inner.ctx, port, attr.as_mut_ptr()) };
        if rc != 0 {
            return Err(super::rc_error("ibv_query_port", rc));
        }
        // SAFETY: zero-initialised plain data, filled in by a successful query.
        Ok(unsafe { attr.assume_init() })
    }
}

impl ContextOps<Verbs> for VerbsContext {
    fn name(&self) -> &str {
        &self.inner.name
    }

    fn query_device(&self) -> Result<DeviceAttr> {
        let mut attr = MaybeUninit::<ibv_device_attr>::zeroed();
        // SAFETY: ctx is live; `attr` is a writable ibv_device_attr.
        let rc = unsafe { ibv_query_device(self.inner.ctx, attr.as_mut_ptr()) };
        if rc != 0 {
            return Err(super::rc_error("ibv_query_device", rc));
        }
        // SAFETY: zero-initialised plain data, filled in by a successful query.
        let attr = unsafe { attr.assume_init() };
        Ok(device_attr_from(
            &attr,
            &self.inner.name,
            self.inner.node_type,
            self.inner.transport_type,
        ))
    }

    fn query_port(&self, port: u8) -> Result<PortAttr> {
        Ok(port_attr_from(port, &self.query_port_raw(port)?))
    }

    fn gid_table(&self, port: u8) -> Result<Vec<GidEntry>> {
        let attr = self.query_port_raw(port)?;
        gid::read_gid_table(self, &self.inner.name, port, &attr)
    }

    fn alloc_pd(&self) -> Result<VerbsPd> {
        VerbsPd::new(self)
    }

    fn create_comp_channel(&self) -> Result<VerbsCompChannel> {
        VerbsCompChannel::new(self)
    }

    fn create_cq(&self, depth: u32, channel: Option<&VerbsCompChannel>) -> Result<VerbsCq> {
        VerbsCq::new(self, depth, channel)
    }

    fn poll_async_event(&self) -> Result<Option<AsyncEvent>> {
        event::poll_async_event(self.inner.ctx)
    }

    fn async_fd(&self) -> RawFd {
        // SAFETY: ctx is live for as long as self.
        unsafe { (*self.inner.ctx).async_fd }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn zeroed_attr() -> ibv_device_attr {
        // SAFETY: ibv_device_attr is plain C data for which all-zero is valid.
        unsafe { std::mem::zeroed() }
    }

    #[test]
    fn last_wqe_detection() {
        use ibv_node_type::*;
        use ibv_transport_type::*;
        assert!(!raises_last_wqe_reached(
            "rxe0",
            IBV_NODE_CA,
            IBV_TRANSPORT_IB,
            0xffffff
        ));
        assert!(!raises_last_wqe_reached(
            "roce_lab",
            IBV_NODE_CA,
            IBV_TRANSPORT_IB,
            0xffffff
        ));
        assert!(!raises_last_wqe_reached(
            "rxe_eth1",
            IBV_NODE_CA,
            IBV_TRANSPORT_IB,
            0
        ));
        assert!(!raises_last_wqe_reached(
            "siw0",
            IBV_NODE_RNIC,
            IBV_TRANSPORT_IWARP,
            0x626d74
        ));
        assert!(!raises_last_wqe_reached(
            "iwp1s0",
            IBV_NODE_RNIC,
            IBV_TRANSPORT_IWARP,
            0x1425
        ));
        assert!(raises_last_wqe_reached(
            "mlx5_0",
            IBV_NODE_CA,
            IBV_TRANSPORT_IB,
            0x02c9
        ));
    }

    #[test]
    fn device_attr_conversion() {
        let mut a = zeroed_attr();
        a.fw_ver[0] = b'1' as _;
        a.fw_ver[1] = b'.' as _;
        a.fw_ver[2] = b'2' as _;
        a.node_guid = 0x0102_0304_0506_0708u64.to_be();
        a.max_qp = 1024;
        a.max_qp_wr = 16384;
        a.max_srq_wr = 8192;
        a.max_sge = 32;
        a.max_sge_rd = 1;
        a.max_qp_rd_atom = 128;
        a.max_qp_init_rd_atom = 64;
        a.max_cqe = -1; // nonsense from a device must not wrap
        a.device_cap_flags = (ibv_device_cap_flags::IBV_DEVICE_MEM_MGT_EXTENSIONS
            | ibv_device_cap_flags::IBV_DEVICE_RC_RNR_NAK_GEN
            | ibv_device_cap_flags::IBV_DEVICE_RESIZE_MAX_WR)
            .0;
        a.phys_port_cnt = 1;
        let d = device_attr_from(
            &a,
            "mlx5_0",
            ibv_node_type::IBV_NODE_CA,
            ibv_transport_type::IBV_TRANSPORT_IB,
        );
        assert_eq!(d.fw_ver, "1.2");
        assert_eq!(d.node_guid, 0x0102_0304_0506_0708);
        assert_eq!(
            (d.max_qp, d.max_qp_wr, d.max_srq_wr, d.max_sge, d.max_sge_rd),
            (1024, 16384, 8192, 32, 1)
        );
        assert_eq!((d.max_qp_rd_atom, d.max_qp_init_rd_atom), (128, 64));
        assert_eq!(d.max_cqe, 0);
        assert!(d.cap_flags.contains(DeviceCapFlags::MEM_MGT_EXTENSIONS));
        assert!(d.cap_flags.contains(DeviceCapFlags::RC_RNR_NAK_GEN));
        assert!(!d.cap_flags.contains(DeviceCapFlags::SRQ_RESIZE));
        // bits outside the subset are dropped, not kept as unknown flags
        assert_eq!(d.cap_flags.bits() & !DeviceCapFlags::all().bits(), 0);
        assert!(d.raises_last_wqe_reached);
        // verbs bit values and ours agree
        assert_eq!(
            DeviceCapFlags::MEM_MGT_EXTENSIONS.bits(),
            u64::from(ibv_device_cap_flags::IBV_DEVICE_MEM_MGT_EXTENSIONS.0)
        );
        assert_eq!(
            DeviceCapFlags::SRQ_RESIZE.bits(),
            u64::from(ibv_device_cap_flags::IBV_DEVICE_SRQ_RESIZE.0)
        );
        assert_eq!(
            DeviceCapFlags::MEM_WINDOW.bits(),
            u64::from(ibv_device_cap_flags::IBV_DEVICE_MEM_WINDOW.0)
        );
    }

    #[test]
    fn port_conversions() {
        assert_eq!(
            port_state_from(ibv_port_state::IBV_PORT_ACTIVE),
            PortState::Active
        );
        assert_eq!(
            port_state_from(ibv_port_state::IBV_PORT_DOWN),
            PortState::Down
        );
        assert_eq!(port_state_from(77), PortState::Nop);
        assert_eq!(
            link_layer_from(IBV_LINK_LAYER_ETHERNET),
            LinkLayer::Ethernet
        );
        assert_eq!(
            link_layer_from(IBV_LINK_LAYER_INFINIBAND),
            LinkLayer::InfiniBand
        );
        assert_eq!(link_layer_from(0), LinkLayer::Unspecified);
        assert_eq!(mtu_from(ibv_mtu::IBV_MTU_1024), Mtu::Mtu1024);
        assert_eq!(mtu_from(ibv_mtu::IBV_MTU_4096), Mtu::Mtu4096);
        assert_eq!(mtu_from(0), Mtu::Mtu256);
        // SAFETY: plain C data, all-zero is valid.
        let mut p: ibv_port_attr = unsafe { std::mem::zeroed() };
        p.state = ibv_port_state::IBV_PORT_ACTIVE;
        p.active_mtu = ibv_mtu::IBV_MTU_1024;
        p.max_mtu = ibv_mtu::IBV_MTU_4096;
        p.gid_tbl_len = 1024;
        p.link_layer = IBV_LINK_LAYER_ETHERNET;
        let a = port_attr_from(1, &p);
        assert_eq!(a.port_num, 1);
        assert_eq!(a.state, PortState::Active);
        assert_eq!((a.active_mtu, a.max_mtu), (Mtu::Mtu1024, Mtu::Mtu4096));
        assert_eq!(a.gid_tbl_len, 1024);
        assert_eq!(a.link_layer, LinkLayer::Ethernet);
    }
}
