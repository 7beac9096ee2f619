//! Reliable-connected queue pairs: creation (plain, or through the CM), the
//! RESET/INIT/RTR/RTS/ERR state machine, and posting send / receive lists.
//!
//! A QP holds Arcs of its PD, CQs, SRQ and (for CM-created QPs) CM id, so it is destroyed
//! before any of them. CM-created QPs are destroyed with `rdma_destroy_qp`, which also clears
//! `id->qp`.

use std::sync::Arc;

use rdma_sys::*;

use super::cm::CmIdInner;
use super::cq::CqInner;
use super::pd::{PdInner, VerbsPd};
use super::srq::SrqInner;
use super::{Verbs, gid, mr, wr};
use crate::error::{PostError, Result, TransportError};
use crate::provider::{QpInit, QpOps};
use crate::types::*;

/// A reliable-connected queue pair.
pub struct VerbsQp {
    qp: *mut ibv_qp,
    caps: QpCaps,
    /// Last state this side moved the QP to (the device may have moved it to ERR since).
    state: QpState,
    has_srq: bool,
    /// Set for CM-created QPs: destroyed through the id, which outlives the QP.
    cm: Option<Arc<CmIdInner>>,
    _send_cq: Arc<CqInner>,
    _recv_cq: Arc<CqInner>,
    _srq: Option<Arc<SrqInner>>,
    _pd: Arc<PdInner>,
}

// SAFETY: a QP is used by its owner only (`&mut self` to post or transition); libibverbs
// allows using and destroying it from any thread.
unsafe impl Send for VerbsQp {}

impl Drop for VerbsQp {
    fn drop(&mut self) {
        match &self.cm {
            Some(id) => {
                // Not while the channel's reader is inside an event that may use the QP.
                let _events = id.channel.lock_qps();
                // SAFETY: the id is live (this QP holds an Arc of it) and `id->qp` is this QP;
                // destroyed exactly once, before its CQs, SRQ, PD and id, and not while
                // librdmacm processes an event of its channel (the lock above).
                unsafe { rdma_destroy_qp(id.id) }
            }
            None => {
                // SAFETY: `qp` is live and destroyed exactly once, before its CQs, SRQ and PD;
                // its async events are acknowledged as they are read.
                let rc = unsafe { ibv_destroy_qp(self.qp) };
                if rc != 0 {
                    tracing::warn!(rc, qp_num = self.qp_num(), "ibv_destroy_qp failed");
                }
            }
        }
    }
}

impl std::fmt::Debug for VerbsQp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerbsQp")
            .field("qp_num", &self.qp_num())
            .field("state", &self.state)
            .field("cm", &self.cm.is_some())
            .finish()
    }
}

/// Checks that every object of `init` lives on `pd`'s device, then builds the verbs init
/// attributes.
fn init_attr(pd: &VerbsPd, init: &QpInit<'_, Verbs>) -> Result<ibv_qp_init_attr> {
    let ctx = &pd.inner.ctx;
    if !init.send_cq.inner.ctx.same_device(ctx) || !init.recv_cq.inner.ctx.same_device(ctx) {
        return Err(TransportError::Mismatch("QP and CQ on different devices"));
    }
    if let Some(srq) = init.srq {
        if !Arc::ptr_eq(&srq.inner.pd, &pd.inner) {
            return Err(TransportError::Mismatch(
                "SRQ made on another PD than the QP",
            ));
        }
    }
    let (max_recv_wr, max_recv_sge) = if init.srq.is_some() {
        (0, 0)
    } else {
        (init.caps.max_recv_wr, init.caps.max_recv_sge)
    };
    Ok(ibv_qp_init_attr {
        qp_context: std::ptr::null_mut(),
        send_cq: init.send_cq.inner.cq,
        recv_cq: init.recv_cq.inner.cq,
        srq: init.srq.map_or(std::ptr::null_mut(), |s| s.inner.srq),
        cap: ibv_qp_cap {
            max_send_wr: init.caps.max_send_wr,
            max_recv_wr,
            max_send_sge: init.caps.max_send_sge,
            max_recv_sge,
            max_inline_data: init.caps.max_inline_data,
        },
        qp_type: ibv_qp_type::IBV_QPT_RC,
        sq_sig_all: i32::from(init.sq_sig_all),
    })
}

fn caps_from(c: &ibv_qp_cap) -> QpCaps {
    QpCaps {
        max_send_wr: c.max_send_wr,
        max_recv_wr: c.max_recv_wr,
        max_send_sge: c.max_send_sge,
        max_recv_sge: c.max_recv_sge,
        max_inline_data: c.max_inline_data,
    }
}

pub(crate) fn qp_state_from(s: ibv_qp_state::Type) -> QpState {
    use ibv_qp_state::*;
    match s {
        IBV_QPS_RESET => QpState::Reset,
        IBV_QPS_INIT => QpState::Init,
        IBV_QPS_RTR => QpState::Rtr,
        IBV_QPS_RTS => QpState::Rts,
        IBV_QPS_SQD => QpState::Sqd,
        IBV_QPS_SQE => QpState::Sqe,
        _ => QpState::Err,
    }
}

/// What ibv_modify_qp to RTR failed with, naming the GID index used: on RoCE, a wrong index
/// is the usual cause.
#[derive(Debug)]
pub(crate) struct RtrError {
    pub(crate) errno: i32,
    pub(crate) sgid_index: u8,
    pub(crate) dgid: Gid,
}

impl std::fmt::Display for RtrError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} with source GID index {} (remote GID {}); on RoCE the index must hold the \
             RoCE v2 GID of the local IP address (VerbsContext::gid_index_for finds it)",
            std::io::Error::from_raw_os_error(self.errno),
            self.sgid_index,
            self.dgid
        )
    }
}

impl std::error::Error for RtrError {}

pub(crate) fn rtr_error(errno: i32, sgid_index: u8, dgid: Gid) -> TransportError {
    let kind = std::io::Error::from_raw_os_error(errno).kind();
    TransportError::Os {
        op: "ibv_modify_qp(INIT->RTR)",
        source: std::io::Error::new(
            kind,
            RtrError {
                errno,
                sgid_index,
                dgid,
            },
        ),
    }
}

impl VerbsQp {
    pub(crate) fn new(pd: &VerbsPd, init: &QpInit<'_, Verbs>) -> Result<VerbsQp> {
        let mut attr = init_attr(pd, init)?;
        // SAFETY: the PD, CQs and SRQ in `attr` are live (held by `init`); `attr` is valid
        // and updated with the granted caps.
        let qp = unsafe { ibv_create_qp(pd.inner.pd, &mut attr) };
        if qp.is_null() {
            return Err(TransportError::last_os("ibv_create_qp"));
        }
        Ok(Self::wrap(qp, &attr, pd, init, None))
    }

    /// A QP made by `rdma_create_qp` on `id`: the CM drives its transitions.
    pub(crate) fn new_cm(
        id: &Arc<CmIdInner>,
        pd: &VerbsPd,
        init: &QpInit<'_, Verbs>,
    ) -> Result<VerbsQp> {
        let mut attr = init_attr(pd, init)?;
        // SAFETY: the id is live; reading the context it is bound to.
        let verbs = unsafe { (*id.id).verbs };
        if verbs != pd.inner.ctx.raw() {
            return Err(TransportError::Mismatch(
                "PD made on another device than the CM id is bound to",
            ));
        }
        // SAFETY: the id, PD, CQs and SRQ are live; `attr` is valid.
        let rc = unsafe { rdma_create_qp(id.id, pd.inner.pd, &mut attr) };
        if rc != 0 {
            return Err(super::rc_error("rdma_create_qp", rc));
        }
        // SAFETY: on success librdmacm stored the new QP in the id.
        let qp = unsafe { (*id.id).qp };
        Ok(Self::wrap(qp, &attr, pd, init, Some(id.clone())))
    }

    fn wrap(
        qp: *mut ibv_qp,
        attr: &ibv_qp_init_attr,
        pd: &VerbsPd,
        init: &QpInit<'_, Verbs>,
        cm: Option<Arc<CmIdInner>>,
    ) -> VerbsQp {
        let state = if cm.is_some() {
            QpState::Init
        } else {
            QpState::Reset
        };
        VerbsQp {
            qp,
            caps: caps_from(&attr.cap),
            state,
            has_srq: init.srq.is_some(),
            cm,
            _send_cq: init.send_cq.inner.clone(),
            _recv_cq: init.recv_cq.inner.clone(),
            _srq: init.srq.map(|s| s.inner.clone()),
            _pd: pd.inner.clone(),
        }
    }

    fn modify(&mut self, attr: &mut ibv_qp_attr, mask: ibv_qp_attr_mask) -> i32 {
        // SAFETY: the QP is live; `attr` is valid for the fields `mask` names.
        unsafe { ibv_modify_qp(self.qp, attr, mask.0 as i32) }
    }

    fn zeroed_attr() -> ibv_qp_attr {
        // SAFETY: ibv_qp_attr is plain C data; all-zero is valid.
        unsafe { std::mem::zeroed() }
    }

    fn set_state(&mut self, state: ibv_qp_state::Type, op: &'static str) -> Result<()> {
        let mut attr = Self::zeroed_attr();
        attr.qp_state = state;
        let rc = self.modify(&mut attr, ibv_qp_attr_mask::IBV_QP_STATE);
        if rc != 0 {
            return Err(super::rc_error(op, rc));
        }
        self.state = qp_state_from(state);
        Ok(())
    }
}

impl QpOps for VerbsQp {
    fn qp_num(&self) -> u32 {
        // SAFETY: the QP is live while self is.
        unsafe { (*self.qp).qp_num }
    }

    /// The QP's state as the device sees it (`ibv_query_qp`; a syscall, control path only).
    fn state(&self) -> QpState {
        let mut attr = Self::zeroed_attr();
        // SAFETY: plain C data, all-zero is valid.
        let mut init: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        // SAFETY: the QP is live; both out structs are writable.
        let rc = unsafe {
            ibv_query_qp(
                self.qp,
                &mut attr,
                ibv_qp_attr_mask::IBV_QP_STATE.0 as i32,
                &mut init,
            )
        };
        if rc != 0 {
            self.state
        } else {
            qp_state_from(attr.qp_state)
        }
    }

    fn caps(&self) -> QpCaps {
        self.caps
    }

    fn endpoint(&self, port: u8, gid_index: u8, psn: u32) -> Result<QpEndpoint> {
        let ctx = &self._pd.ctx;
        let pattr = ctx.query_port_raw(port)?;
        let gid = gid::query_gid(ctx, port, i32::from(gid_index))?.unwrap_or_default();
        if gid.is_zero() && pattr.link_layer != super::context::IBV_LINK_LAYER_INFINIBAND {
            return Err(TransportError::InvalidArgument(format!(
                "GID index {gid_index} of port {port} is empty (RoCE needs a GID)"
            )));
        }
        Ok(QpEndpoint {
            qp_num: self.qp_num(),
            psn: psn & 0xff_ffff,
            lid: pattr.lid,
            gid,
        })
    }

    fn modify_to_init(&mut self, port: u8, access: Access) -> Result<()> {
        mr::check_access(access)?;
        let mut attr = Self::zeroed_attr();
        attr.qp_state = ibv_qp_state::IBV_QPS_INIT;
        attr.pkey_index = 0;
        attr.port_num = port;
        attr.qp_access_flags = mr::access_bits(access);
        let mask = ibv_qp_attr_mask::IBV_QP_STATE
            | ibv_qp_attr_mask::IBV_QP_PKEY_INDEX
            | ibv_qp_attr_mask::IBV_QP_PORT
            | ibv_qp_attr_mask::IBV_QP_ACCESS_FLAGS;
        let rc = self.modify(&mut attr, mask);
        if rc != 0 {
            return Err(super::rc_error("ibv_modify_qp(RESET->INIT)", rc));
        }
        self.state = QpState::Init;
        Ok(())
    }

    fn modify_to_rtr(&mut self, a: &RtrAttr) -> Result<()> {
        let mut attr = Self::zeroed_attr();
        attr.qp_state = ibv_qp_state::IBV_QPS_RTR;
        attr.path_mtu = a.path_mtu as u32;
        attr.dest_qp_num = a.remote.qp_num;
        attr.rq_psn = a.remote.psn & 0xff_ffff;
        attr.max_dest_rd_atomic = a.max_dest_rd_atomic;
        attr.min_rnr_timer = a.min_rnr_timer;
        attr.ah_attr.dlid = a.remote.lid;
        attr.ah_attr.sl = 0;
        attr.ah_attr.src_path_bits = 0;
        attr.ah_attr.port_num = a.port_num;
        if !a.remote.gid.is_zero() {
            // RoCE always routes by GID (GRH); IB only when a GID is given.
            attr.ah_attr.is_global = 1;
            attr.ah_attr.grh.dgid = ibv_gid {
                raw: a.remote.gid.0,
            };
            attr.ah_attr.grh.sgid_index = a.sgid_index;
            attr.ah_attr.grh.hop_limit = 64;
            attr.ah_attr.grh.flow_label = 0;
            attr.ah_attr.grh.traffic_class = 0;
        }
        let mask = ibv_qp_attr_mask::IBV_QP_STATE
            | ibv_qp_attr_mask::IBV_QP_AV
            | ibv_qp_attr_mask::IBV_QP_PATH_MTU
            | ibv_qp_attr_mask::IBV_QP_DEST_QPN
            | ibv_qp_attr_mask::IBV_QP_RQ_PSN
            | ibv_qp_attr_mask::IBV_QP_MAX_DEST_RD_ATOMIC
            | ibv_qp_attr_mask::IBV_QP_MIN_RNR_TIMER;
        let rc = self.modify(&mut attr, mask);
        if rc != 0 {
            let e = if rc > 0 { rc } else { super::errno() };
            return Err(rtr_error(e, a.sgid_index, a.remote.gid));
        }
        self.state = QpState::Rtr;
        Ok(())
    }

    fn modify_to_rts(&mut self, a: &RtsAttr) -> Result<()> {
        let mut attr = Self::zeroed_attr();
        attr.qp_state = ibv_qp_state::IBV_QPS_RTS;
        attr.sq_psn = a.sq_psn & 0xff_ffff;
        attr.timeout = a.timeout;
        attr.retry_cnt = a.retry_cnt;
        attr.rnr_retry = a.rnr_retry;
        attr.max_rd_atomic = a.max_rd_atomic;
        let mask = ibv_qp_attr_mask::IBV_QP_STATE
            | ibv_qp_attr_mask::IBV_QP_SQ_PSN
            | ibv_qp_attr_mask::IBV_QP_TIMEOUT
            | ibv_qp_attr_mask::IBV_QP_RETRY_CNT
            | ibv_qp_attr_mask::IBV_QP_RNR_RETRY
            | ibv_qp_attr_mask::IBV_QP_MAX_QP_RD_ATOMIC;
        let rc = self.modify(&mut attr, mask);
        if rc != 0 {
            return Err(super::rc_error("ibv_modify_qp(RTR->RTS)", rc));
        }
        self.state = QpState::Rts;
        Ok(())
    }

    fn modify_to_err(&mut self) -> Result<()> {
        self.set_state(ibv_qp_state::IBV_QPS_ERR, "ibv_modify_qp(->ERR)")
    }

    fn modify_to_reset(&mut self) -> Result<()> {
        self.set_state(ibv_qp_state::IBV_QPS_RESET, "ibv_modify_qp(->RESET)")
    }

    fn post_send(&mut self, wrs: &[SendWr<'_>]) -> std::result::Result<(), PostError> {
        let qp = self.qp;
        let post_run = |run: &[SendWr<'_>]| {
            wr::post_send_chunked(run, "ibv_post_send", |head, bad| {
                // SAFETY: the QP is live; `head` is a well-formed chain valid for this call
                // whose SGEs point at the caller's memory descriptors.
                unsafe { ibv_post_send(qp, head, bad) }
            })
        };
        // Binds name their window and region by number: each is posted on its own with the
        // pointers looked up; the runs between them go as lists.
        let mut start = 0;
        for (i, w) in wrs.iter().enumerate() {
            let SendOp::BindMw { mw, lkey, .. } = w.op else {
                continue;
            };
            post_run(&wrs[start..i]).map_err(|e| PostError {
                failed_index: start + e.failed_index,
                error: e.error,
            })?;
            self._pd
                .with_bind_targets(mw, lkey, |mw, mr| {
                    if let SendOp::BindMw { rkey, .. } = w.op {
                        // rxe's provider sends `mw->rkey` as the window's current key, which
                        // must match the kernel's: for a type-2 window nobody updates it after
                        // a bind, so set it to the key the previous bind gave (this one's
                        // with the low byte decremented).
                        // SAFETY: the window is live (table lock held); only posts write it.
                        unsafe { (*mw).rkey = (rkey & !0xff) | (rkey.wrapping_sub(1) & 0xff) };
                    }
                    let mut raw = wr::build_bind(w, mw, mr);
                    let mut bad = std::ptr::null_mut();
                    // SAFETY: the QP is live; `raw` is one WR whose window and region are
                    // live (the PD's table lock is held across this call).
                    let rc = unsafe { ibv_post_send(qp, &mut raw, &mut bad) };
                    if rc == 0 {
                        Ok(())
                    } else {
                        Err(super::rc_error("ibv_post_send(BIND_MW)", rc))
                    }
                })
                .map_err(|error| PostError {
                    failed_index: i,
                    error,
                })?;
            start = i + 1;
        }
        post_run(&wrs[start..]).map_err(|e| PostError {
            failed_index: start + e.failed_index,
            error: e.error,
        })
    }

    fn post_recv(&mut self, wrs: &[RecvWr<'_>]) -> std::result::Result<(), PostError> {
        if self.has_srq {
            return Err(PostError {
                failed_index: 0,
                error: TransportError::InvalidArgument(
                    "post_recv on a QP attached to an SRQ: post to the SRQ".into(),
                ),
            });
        }
        let qp = self.qp;
        wr::post_recv_chunked(wrs, "ibv_post_recv", |head, bad| {
            // SAFETY: the QP is live; `head` is a well-formed chain valid for this call.
            unsafe { ibv_post_recv(qp, head, bad) }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qp_states() {
        use ibv_qp_state::*;
        assert_eq!(qp_state_from(IBV_QPS_RESET), QpState::Reset);
        assert_eq!(qp_state_from(IBV_QPS_INIT), QpState::Init);
        assert_eq!(qp_state_from(IBV_QPS_RTR), QpState::Rtr);
        assert_eq!(qp_state_from(IBV_QPS_RTS), QpState::Rts);
        assert_eq!(qp_state_from(IBV_QPS_SQD), QpState::Sqd);
        assert_eq!(qp_state_from(IBV_QPS_SQE), QpState::Sqe);
        assert_eq!(qp_state_from(IBV_QPS_ERR), QpState::Err);
        assert_eq!(qp_state_from(IBV_QPS_UNKNOWN), QpState::Err);
    }

    #[test]
    fn rtr_error_names_the_gid_index() {
        let e = rtr_error(
            libc::EINVAL,
            0,
            Gid::from_ipv4(std::net::Ipv4Addr::new(10, 10, 0, 1)),
        );
        let msg = e.to_string();
        assert!(msg.contains("ibv_modify_qp(INIT->RTR)"), "{msg}");
        assert!(msg.contains("GID index 0"), "{msg}");
        assert!(
            msg.contains("0000:0000:0000:0000:0000:ffff:0a0a:0001"),
            "{msg}"
        );
        match e {
            TransportError::Os { source, .. } => {
                assert_eq!(source.kind(), std::io::ErrorKind::InvalidInput)
            }
            e => panic!("{e}"),
        }
    }

    #[test]
    fn mtu_codes_match_verbs() {
        assert_eq!(Mtu::Mtu1024 as u32, ibv_mtu::IBV_MTU_1024);
        assert_eq!(Mtu::Mtu4096 as u32, ibv_mtu::IBV_MTU_4096);
        assert_eq!(Mtu::Mtu256 as u32, ibv_mtu::IBV_MTU_256);
    }
}
