//! Work completions: `ibv_wc` to the provider-neutral `WorkCompletion`.

use rdma_sys::*;

use crate::types::{WcOpcode, WcStatus, WorkCompletion};

pub(crate) fn status_from(s: ibv_wc_status::Type) -> WcStatus {
    use ibv_wc_status::*;
    match s {
        IBV_WC_SUCCESS => WcStatus::Success,
        IBV_WC_LOC_LEN_ERR => WcStatus::LocLenErr,
        IBV_WC_LOC_QP_OP_ERR => WcStatus::LocQpOpErr,
        IBV_WC_LOC_EEC_OP_ERR => WcStatus::LocEecOpErr,
        IBV_WC_LOC_PROT_ERR => WcStatus::LocProtErr,
        IBV_WC_WR_FLUSH_ERR => WcStatus::WrFlushErr,
        IBV_WC_MW_BIND_ERR => WcStatus::MwBindErr,
        IBV_WC_BAD_RESP_ERR => WcStatus::BadRespErr,
        IBV_WC_LOC_ACCESS_ERR => WcStatus::LocAccessErr,
        IBV_WC_REM_INV_REQ_ERR => WcStatus::RemInvReqErr,
        IBV_WC_REM_ACCESS_ERR => WcStatus::RemAccessErr,
        IBV_WC_REM_OP_ERR => WcStatus::RemOpErr,
        IBV_WC_RETRY_EXC_ERR => WcStatus::RetryExcErr,
        IBV_WC_RNR_RETRY_EXC_ERR => WcStatus::RnrRetryExcErr,
        IBV_WC_LOC_RDD_VIOL_ERR => WcStatus::LocRddViolErr,
        IBV_WC_REM_INV_RD_REQ_ERR => WcStatus::RemInvRdReqErr,
        IBV_WC_REM_ABORT_ERR => WcStatus::RemAbortErr,
        IBV_WC_INV_EECN_ERR => WcStatus::InvEecnErr,
        IBV_WC_INV_EEC_STATE_ERR => WcStatus::InvEecStateErr,
        IBV_WC_FATAL_ERR => WcStatus::FatalErr,
        IBV_WC_RESP_TIMEOUT_ERR => WcStatus::RespTimeoutErr,
        // IBV_WC_GENERAL_ERR and anything newer than this code
        _ => WcStatus::GeneralErr,
    }
}

/// The opcode; meaningful only on success. Codes we do not model (TSO, newer ones) read as
/// `Send`, since they can only be send-side completions of features this crate never posts.
pub(crate) fn opcode_from(o: ibv_wc_opcode::Type) -> WcOpcode {
    use ibv_wc_opcode::*;
    match o {
        IBV_WC_SEND => WcOpcode::Send,
        IBV_WC_RDMA_WRITE => WcOpcode::RdmaWrite,
        IBV_WC_RDMA_READ => WcOpcode::RdmaRead,
        IBV_WC_COMP_SWAP => WcOpcode::CompSwap,
        IBV_WC_FETCH_ADD => WcOpcode::FetchAdd,
        IBV_WC_BIND_MW => WcOpcode::BindMw,
        IBV_WC_LOCAL_INV => WcOpcode::LocalInv,
        IBV_WC_RECV => WcOpcode::Recv,
        IBV_WC_RECV_RDMA_WITH_IMM => WcOpcode::RecvRdmaWithImm,
        _ => WcOpcode::Send,
    }
}

/// Convert one completion. Immediate data arrives in network order; the invalidated rkey in
/// host order (both share one union, told apart by `wc_flags`).
///
/// `rxe_inv_flag`: the device is rxe, whose kernel writes the kernel's IB_WC_WITH_INVALIDATE
/// (1 << 2) into user completions, where libibverbs reads it as IBV_WC_IP_CSUM_OK; on an RC
/// receive (all this crate makes) rxe sets that bit for nothing else, so it means an
/// invalidated rkey there.
///
/// Only the fields a provider writes are read: wr_id, status, vendor_err and qp_num always;
/// opcode, byte_len, wc_flags and the immediate / invalidated-rkey union on success only (an
/// error completion's are undefined: mlx5 leaves them unwritten). An error completion goes on
/// with opcode Send and length 0; src_qp (UD only) is 0: every QP here is RC.
///
/// # Safety
/// `wc` points at an `ibv_wc` that `ibv_poll_cq` filled (the fields above written).
pub(crate) unsafe fn convert(wc: *const ibv_wc, rxe_inv_flag: bool) -> WorkCompletion {
    // Reads go through the raw pointer, field by field, never through a reference to the
    // partly written struct.
    // SAFETY: per the function contract these four are written for every completion.
    let (wr_id, status, vendor_err, qp_num) =
        unsafe { ((*wc).wr_id, (*wc).status, (*wc).vendor_err, (*wc).qp_num) };
    let mut c = WorkCompletion {
        wr_id,
        status: status_from(status),
        opcode: WcOpcode::Send,
        vendor_err,
        byte_len: 0,
        qp_num,
        src_qp: 0,
        imm_data: None,
        invalidated_rkey: None,
    };
    if status != ibv_wc_status::IBV_WC_SUCCESS {
        return c;
    }
    // SAFETY: a successful completion's opcode, length, flags and union are written (both
    // union members are u32: any bit pattern is valid for either).
    let (opcode, byte_len, flags, raw) = unsafe {
        (
            (*wc).opcode,
            (*wc).byte_len,
            (*wc).wc_flags,
            (*wc).imm_data_invalidated_rkey_union.imm_data,
        )
    };
    let mut inv_bits = ibv_wc_flags::IBV_WC_WITH_INV.0;
    if rxe_inv_flag && opcode == ibv_wc_opcode::IBV_WC_RECV {
        inv_bits |= ibv_wc_flags::IBV_WC_IP_CSUM_OK.0;
    }
    c.opcode = opcode_from(opcode);
    c.byte_len = byte_len;
    c.imm_data = (flags & ibv_wc_flags::IBV_WC_WITH_IMM.0 != 0).then(|| u32::from_be(raw));
    c.invalidated_rkey = (flags & inv_bits != 0).then_some(raw);
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unsafe_convert(w: &ibv_wc, rxe: bool) -> WorkCompletion {
        // SAFETY: a whole, initialised ibv_wc.
        unsafe { convert(w, rxe) }
    }

    fn wc() -> ibv_wc {
        // SAFETY: ibv_wc is plain C data; all-zero is valid.
        unsafe { std::mem::zeroed() }
    }

    #[test]
    fn status_mapping_covers_every_code() {
        use ibv_wc_status::*;
        let all = [
            (IBV_WC_SUCCESS, WcStatus::Success),
            (IBV_WC_LOC_LEN_ERR, WcStatus::LocLenErr),
            (IBV_WC_LOC_QP_OP_ERR, WcStatus::LocQpOpErr),
            (IBV_WC_LOC_EEC_OP_ERR, WcStatus::LocEecOpErr),
            (IBV_WC_LOC_PROT_ERR, WcStatus::LocProtErr),
            (IBV_WC_WR_FLUSH_ERR, WcStatus::WrFlushErr),
            (IBV_WC_MW_BIND_ERR, WcStatus::MwBindErr),
            (IBV_WC_BAD_RESP_ERR, WcStatus::BadRespErr),
            (IBV_WC_LOC_ACCESS_ERR, WcStatus::LocAccessErr),
            (IBV_WC_REM_INV_REQ_ERR, WcStatus::RemInvReqErr),
            (IBV_WC_REM_ACCESS_ERR, WcStatus::RemAccessErr),
            (IBV_WC_REM_OP_ERR, WcStatus::RemOpErr),
            (IBV_WC_RETRY_EXC_ERR, WcStatus::RetryExcErr),
            (IBV_WC_RNR_RETRY_EXC_ERR, WcStatus::RnrRetryExcErr),
            (IBV_WC_LOC_RDD_VIOL_ERR, WcStatus::LocRddViolErr),
            (IBV_WC_REM_INV_RD_REQ_ERR, WcStatus::RemInvRdReqErr),
            (IBV_WC_REM_ABORT_ERR, WcStatus::RemAbortErr),
            (IBV_WC_INV_EECN_ERR, WcStatus::InvEecnErr),
            (IBV_WC_INV_EEC_STATE_ERR, WcStatus::InvEecStateErr),
            (IBV_WC_FATAL_ERR, WcStatus::FatalErr),
            (IBV_WC_RESP_TIMEOUT_ERR, WcStatus::RespTimeoutErr),
            (IBV_WC_GENERAL_ERR, WcStatus::GeneralErr),
        ];
        for (code, want) in all {
            assert_eq!(status_from(code), want, "code {code}");
        }
        assert_eq!(status_from(1000), WcStatus::GeneralErr);
        // the codes are the verbs numbering 0..=21
        assert_eq!(IBV_WC_REM_ACCESS_ERR, 10);
        assert_eq!(IBV_WC_WR_FLUSH_ERR, 5);
    }

    /// An error completion's opcode, length and flags are not defined: not read (Send, 0),
    /// whatever the buffer held, and rxe's invalidate flag not taken from them. src_qp (UD
    /// only) is never read.
    #[test]
    fn an_error_completion_carries_only_its_defined_fields() {
        let mut w = wc();
        w.wr_id = 9;
        w.qp_num = 0x11;
        w.status = ibv_wc_status::IBV_WC_WR_FLUSH_ERR;
        w.byte_len = 0xDEAD;
        w.src_qp = 0xBEEF;
        w.opcode = ibv_wc_opcode::IBV_WC_RECV;
        w.wc_flags = ibv_wc_flags::IBV_WC_IP_CSUM_OK.0;
        let c = unsafe_convert(&w, true);
        assert_eq!(
            (c.wr_id, c.qp_num, c.status),
            (9, 0x11, WcStatus::WrFlushErr)
        );
        assert_eq!(
            (c.opcode, c.byte_len, c.src_qp, c.invalidated_rkey),
            (WcOpcode::Send, 0, 0, None)
        );
        w.status = ibv_wc_status::IBV_WC_SUCCESS;
        let c = unsafe_convert(&w, true);
        assert_eq!(
            (c.opcode, c.byte_len, c.src_qp),
            (WcOpcode::Recv, 0xDEAD, 0)
        );
        assert!(c.invalidated_rkey.is_some());
    }

    #[test]
    fn opcode_mapping() {
        use ibv_wc_opcode::*;
        assert_eq!(opcode_from(IBV_WC_SEND), WcOpcode::Send);
        assert_eq!(opcode_from(IBV_WC_RDMA_WRITE), WcOpcode::RdmaWrite);
        assert_eq!(opcode_from(IBV_WC_RDMA_READ), WcOpcode::RdmaRead);
        assert_eq!(opcode_from(IBV_WC_COMP_SWAP), WcOpcode::CompSwap);
        assert_eq!(opcode_from(IBV_WC_FETCH_ADD), WcOpcode::FetchAdd);
        assert_eq!(opcode_from(IBV_WC_BIND_MW), WcOpcode::BindMw);
        assert_eq!(opcode_from(IBV_WC_LOCAL_INV), WcOpcode::LocalInv);
        assert_eq!(opcode_from(IBV_WC_RECV), WcOpcode::Recv);
        assert_eq!(
            opcode_from(IBV_WC_RECV_RDMA_WITH_IMM),
            WcOpcode::RecvRdmaWithImm
        );
        assert_eq!(IBV_WC_RECV, 128);
    }

    #[test]
    fn immediate_is_converted_from_network_order() {
        let mut w = wc();
        w.wr_id = u64::MAX - 1;
        w.opcode = ibv_wc_opcode::IBV_WC_RECV;
        w.byte_len = 4096;
        w.qp_num = 0x11;
        w.src_qp = 0x22;
        w.wc_flags = ibv_wc_flags::IBV_WC_WITH_IMM.0;
        w.imm_data_invalidated_rkey_union.imm_data = 0xdead_beefu32.to_be();
        let c = unsafe_convert(&w, false);
        assert_eq!(c.wr_id, u64::MAX - 1);
        assert_eq!(c.status, WcStatus::Success);
        assert_eq!(c.opcode, WcOpcode::Recv);
        assert_eq!((c.byte_len, c.qp_num, c.src_qp), (4096, 0x11, 0));
        assert_eq!(c.imm_data, Some(0xdead_beef));
        assert_eq!(c.invalidated_rkey, None);
    }

    #[test]
    fn invalidated_rkey_is_host_order() {
        let mut w = wc();
        w.opcode = ibv_wc_opcode::IBV_WC_RECV;
        w.wc_flags = ibv_wc_flags::IBV_WC_WITH_INV.0;
        w.imm_data_invalidated_rkey_union.invalidated_rkey = 0x1234;
        let c = unsafe_convert(&w, false);
        assert_eq!(c.invalidated_rkey, Some(0x1234));
        assert_eq!(c.imm_data, None);
    }

    #[test]
    fn error_completion_has_no_extras() {
        let mut w = wc();
        w.wr_id = 7;
        w.status = ibv_wc_status::IBV_WC_WR_FLUSH_ERR;
        w.opcode = 0x5555; // undefined on error
        w.wc_flags = ibv_wc_flags::IBV_WC_WITH_IMM.0;
        w.vendor_err = 0x81;
        let c = unsafe_convert(&w, false);
        assert_eq!(c.status, WcStatus::WrFlushErr);
        assert_eq!(c.vendor_err, 0x81);
        assert_eq!(c.imm_data, None);
        assert_eq!(c.wr_id, 7);
    }
}
