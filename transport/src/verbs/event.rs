//! Async events of a device (`ibv_get_async_event`): read without blocking (the async fd is
//! O_NONBLOCK), converted, and always acknowledged before returning, because destroying a QP,
//! CQ or SRQ waits for its events to be acknowledged.

use std::mem::MaybeUninit;
use std::ptr::addr_of;

use rdma_sys::*;

use crate::error::{Result, TransportError};
use crate::types::{AsyncEvent, AsyncEventKind};

/// Which member of the event's element union is valid for an event code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Element {
    Qp,
    Cq,
    Srq,
    Port,
    Device,
}

fn code(t: ibv_event_type) -> u32 {
    t as u32
}

pub(crate) fn element_of(c: u32) -> Element {
    use ibv_event_type::*;
    match c {
        _ if c == code(IBV_EVENT_CQ_ERR) => Element::Cq,
        _ if c == code(IBV_EVENT_QP_FATAL)
            || c == code(IBV_EVENT_QP_REQ_ERR)
            || c == code(IBV_EVENT_QP_ACCESS_ERR)
            || c == code(IBV_EVENT_COMM_EST)
            || c == code(IBV_EVENT_SQ_DRAINED)
            || c == code(IBV_EVENT_PATH_MIG)
            || c == code(IBV_EVENT_PATH_MIG_ERR)
            || c == code(IBV_EVENT_QP_LAST_WQE_REACHED) =>
        {
            Element::Qp
        }
        _ if c == code(IBV_EVENT_SRQ_ERR) || c == code(IBV_EVENT_SRQ_LIMIT_REACHED) => Element::Srq,
        _ if c == code(IBV_EVENT_PORT_ACTIVE)
            || c == code(IBV_EVENT_PORT_ERR)
            || c == code(IBV_EVENT_LID_CHANGE)
            || c == code(IBV_EVENT_PKEY_CHANGE)
            || c == code(IBV_EVENT_SM_CHANGE)
            || c == code(IBV_EVENT_CLIENT_REREGISTER)
            || c == code(IBV_EVENT_GID_CHANGE) =>
        {
            Element::Port
        }
        _ => Element::Device,
    }
}

/// The event kind for a code and the id read from its element (qp_num, CQ/SRQ handle or port).
pub(crate) fn kind_of(c: u32, id: u32) -> AsyncEventKind {
    use ibv_event_type::*;
    let port = id as u8;
    match c {
        _ if c == code(IBV_EVENT_CQ_ERR) => AsyncEventKind::CqErr { cq_id: id },
        _ if c == code(IBV_EVENT_QP_FATAL) => AsyncEventKind::QpFatal { qp_num: id },
        _ if c == code(IBV_EVENT_QP_REQ_ERR) => AsyncEventKind::QpReqErr { qp_num: id },
        _ if c == code(IBV_EVENT_QP_ACCESS_ERR) => AsyncEventKind::QpAccessErr { qp_num: id },
        _ if c == code(IBV_EVENT_COMM_EST) => AsyncEventKind::CommEstablished { qp_num: id },
        _ if c == code(IBV_EVENT_SQ_DRAINED) => AsyncEventKind::SqDrained { qp_num: id },
        _ if c == code(IBV_EVENT_PATH_MIG) => AsyncEventKind::PathMigrated { qp_num: id },
        _ if c == code(IBV_EVENT_QP_LAST_WQE_REACHED) => {
            AsyncEventKind::QpLastWqeReached { qp_num: id }
        }
        _ if c == code(IBV_EVENT_SRQ_LIMIT_REACHED) => {
            AsyncEventKind::SrqLimitReached { srq_id: id }
        }
        _ if c == code(IBV_EVENT_SRQ_ERR) => AsyncEventKind::SrqErr { srq_id: id },
        _ if c == code(IBV_EVENT_PORT_ACTIVE) => AsyncEventKind::PortActive { port },
        _ if c == code(IBV_EVENT_PORT_ERR) => AsyncEventKind::PortErr { port },
        _ if c == code(IBV_EVENT_LID_CHANGE) => AsyncEventKind::LidChange { port },
        _ if c == code(IBV_EVENT_GID_CHANGE) => AsyncEventKind::GidChange { port },
        _ if c == code(IBV_EVENT_DEVICE_FATAL) => AsyncEventKind::DeviceFatal,
        _ => AsyncEventKind::Other { code: c },
    }
}

/// The next async event of `ctx`, acknowledged, or None when none is pending.
pub(crate) fn poll_async_event(ctx: *mut ibv_context) -> Result<Option<AsyncEvent>> {
    let mut ev = MaybeUninit::<ibv_async_event>::zeroed();
    // SAFETY: ctx is a live context (the caller holds it); `ev` is writable.
    let rc = unsafe { ibv_get_async_event(ctx, ev.as_mut_ptr()) };
    if rc != 0 {
        let e = super::errno();
        if e == libc::EAGAIN || e == libc::EWOULDBLOCK {
            return Ok(None);
        }
        return Err(TransportError::from_errno("ibv_get_async_event", e));
    }
    let p = ev.as_mut_ptr();
    // SAFETY: the event was filled in. The type is read as a raw u32, not as the Rust enum,
    // so a code newer than the bindings cannot be an invalid enum value.
    let c = unsafe { addr_of!((*p).event_type).cast::<u32>().read() };
    // SAFETY: the union member read is the one `element_of` says the code uses; the object
    // it points to cannot be destroyed before this event is acknowledged below.
    let id = unsafe {
        let el = addr_of!((*p).element);
        match element_of(c) {
            Element::Qp => (*(*el).qp).qp_num,
            Element::Cq => (*(*el).cq).handle,
            Element::Srq => (*(*el).srq).handle,
            Element::Port => (*el).port_num as u32,
            Element::Device => 0,
        }
    };
    // SAFETY: acknowledges exactly the event returned by ibv_get_async_event above.
    unsafe { ibv_ack_async_event(p) };
    let kind = kind_of(c, id);
    tracing::debug!(?kind, "async event");
    Ok(Some(AsyncEvent { kind }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ibv_event_type::*;

    #[test]
    fn mapping() {
        assert_eq!(element_of(code(IBV_EVENT_QP_FATAL)), Element::Qp);
        assert_eq!(element_of(code(IBV_EVENT_QP_LAST_WQE_REACHED)), Element::Qp);
        assert_eq!(element_of(code(IBV_EVENT_SRQ_LIMIT_REACHED)), Element::Srq);
        assert_eq!(element_of(code(IBV_EVENT_CQ_ERR)), Element::Cq);
        assert_eq!(element_of(code(IBV_EVENT_PORT_ACTIVE)), Element::Port);
        assert_eq!(element_of(code(IBV_EVENT_PORT_ERR)), Element::Port);
        assert_eq!(element_of(code(IBV_EVENT_DEVICE_FATAL)), Element::Device);
        assert_eq!(element_of(999), Element::Device);

        assert_eq!(
            kind_of(code(IBV_EVENT_QP_FATAL), 7),
            AsyncEventKind::QpFatal { qp_num: 7 }
        );
        assert_eq!(
            kind_of(code(IBV_EVENT_QP_LAST_WQE_REACHED), 0x11),
            AsyncEventKind::QpLastWqeReached { qp_num: 0x11 }
        );
        assert_eq!(
            kind_of(code(IBV_EVENT_SRQ_LIMIT_REACHED), 3),
            AsyncEventKind::SrqLimitReached { srq_id: 3 }
        );
        assert_eq!(
            kind_of(code(IBV_EVENT_CQ_ERR), 4),
            AsyncEventKind::CqErr { cq_id: 4 }
        );
        assert_eq!(
            kind_of(code(IBV_EVENT_DEVICE_FATAL), 0),
            AsyncEventKind::DeviceFatal
        );
        assert_eq!(
            kind_of(code(IBV_EVENT_PORT_ACTIVE), 1),
            AsyncEventKind::PortActive { port: 1 }
        );
        assert_eq!(
            kind_of(code(IBV_EVENT_PORT_ERR), 2),
            AsyncEventKind::PortErr { port: 2 }
        );
        assert_eq!(
            kind_of(code(IBV_EVENT_SM_CHANGE), 1),
            AsyncEventKind::Other { code: 13 }
        );
        assert_eq!(kind_of(999, 0), AsyncEventKind::Other { code: 999 });
    }
}
