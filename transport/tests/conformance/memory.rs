//! Memory: copies in and out of regions (bounds-checked), caller-owned and caller-kept memory,
//! type-2 memory windows (bind, access, LOCAL_INV, invalidation by SEND_WITH_INV), and the
//! hardware rule that a plain region's rkey cannot be invalidated.

use nvmf_transport::*;

use crate::fixture::*;

/// A connected pair on one PD: `a` is the requester, `b` owns the memory and the window.
struct Pair {
    fx: Fx,
    pd: Pd,
    cq_a: Cq,
    cq_b: Cq,
    a: Qp,
    b: Qp,
    /// `a`'s buffer.
    local: Mr,
    /// `b`'s buffer, bindable.
    target: Mr,
}

fn pair(flavor: Flavor) -> Option<Pair> {
    let fx = Fx::open(flavor)?;
    let pd = fx.ctx.alloc_pd().unwrap();
    let cq_a = fx.cq(64);
    let cq_b = fx.cq(64);
    let mut a = fx.qp(&pd, &cq_a, &cq_a, None);
    let mut b = fx.qp(&pd, &cq_b, &cq_b, None);
    fx.connect(&mut a, &mut b, 7);
    let local = pd.alloc_mr(16 * 1024, all_access()).unwrap();
    let target = pd
        .alloc_mr(16 * 1024, all_access() | Access::MW_BIND)
        .unwrap();
    Some(Pair {
        fx,
        pd,
        cq_a,
        cq_b,
        a,
        b,
        local,
        target,
    })
}

impl Pair {
    /// `a` runs one signaled WR against `b`'s memory; returns its completion.
    fn remote(&mut self, wr_id: u64, op: SendOp, len: u32) -> WorkCompletion {
        let sge = [self.local.sge(0, len)];
        self.a
            .post_send(&[SendWr {
                wr_id,
                op,
                sges: &sge,
                flags: SendFlags::SIGNALED,
            }])
            .unwrap();
        self.fx.wait_wcs(&self.cq_a, 1)[0]
    }

    /// `b` runs one signaled local WR (bind, invalidate); returns its completion.
    fn local_op(&mut self, wr_id: u64, op: SendOp) -> WorkCompletion {
        self.b
            .post_send(&[SendWr {
                wr_id,
                op,
                sges: &[],
                flags: SendFlags::SIGNALED,
            }])
            .unwrap();
        self.fx.wait_wcs(&self.cq_b, 1)[0]
    }

    /// Binds `mw` over `target[offset..offset + len]` for remote read and write.
    fn bind(&mut self, mw: &mut Mw, offset: usize, len: usize) -> u32 {
        let op = mw
            .bind(
                &self.target,
                offset,
                len,
                Access::REMOTE_READ | Access::REMOTE_WRITE,
            )
            .unwrap();
        let c = self.local_op(90, op);
        assert_eq!(
            (c.wr_id, c.status, c.opcode),
            (90, WcStatus::Success, WcOpcode::BindMw)
        );
        mw.rkey()
    }
}

pub fn read_write_at_bounds(flavor: Flavor) {
    let Some(p) = pair(flavor) else { return };
    let mr = &p.local;
    mr.write_at(3, b"abcdefghijk").unwrap();
    let mut back = [0u8; 11];
    mr.read_at(3, &mut back).unwrap();
    assert_eq!(&back, b"abcdefghijk");
    let size = mr.len();
    assert!(matches!(
        mr.write_at(size - 2, b"abc"),
        Err(TransportError::OutOfBounds { offset, len: 3, .. }) if offset == size - 2
    ));
    assert!(matches!(
        mr.read_at(usize::MAX, &mut back),
        Err(TransportError::OutOfBounds { .. })
    ));
    // Nothing is posted on this region and no peer writes it: a view is sound.
    // SAFETY: no work request uses `local`, and its rkey is not used by anyone here.
    let view = unsafe { mr.view(3..14) };
    assert_eq!(view, b"abcdefghijk");
}

pub fn register_owned_and_raw_memory(flavor: Flavor) {
    let Some(mut p) = pair(flavor) else { return };
    // Memory the caller hands over (kept by the region) ...
    let owned = p.pd.reg_mr_owned(vec![0u8; 4096], all_access()).unwrap();
    let mapped =
        p.pd.reg_mr_owned(MappedMemory::new(8192).unwrap(), all_access())
            .unwrap();
    assert_eq!(mapped.addr() % 4096, 0);
    // ... and memory the caller keeps (freed only after the region is dropped).
    let mut kept = vec![0u64; 512].into_boxed_slice();
    let kept_ptr = kept.as_mut_ptr().cast::<u8>();
    // SAFETY: `kept` outlives `raw` (dropped below, before `kept`), and is touched only
    // through `raw` until then.
    let raw = unsafe { p.pd.reg_mr_raw(kept_ptr, 4096, all_access()) }.unwrap();
    assert_eq!(raw.addr(), kept_ptr as u64);
    p.local.write_at(0, &pattern(64, 5)).unwrap();
    for (i, mr) in [&owned, &mapped, &raw].into_iter().enumerate() {
        let (addr, rkey) = (mr.addr() + 100, mr.rkey());
        let c = p.remote(
            i as u64,
            SendOp::RdmaWrite {
                remote_addr: addr,
                rkey,
            },
            64,
        );
        assert_eq!(c.status, WcStatus::Success, "region {i}");
        assert_eq!(mr.read_vec(100..164).unwrap(), pattern(64, 5), "region {i}");
    }
    drop(raw);
    // The caller's own memory holds what the peer wrote.
    let bytes: Vec<u8> = kept.iter().flat_map(|w| w.to_ne_bytes()).collect();
    assert_eq!(&bytes[100..164], &pattern(64, 5)[..]);
}

pub fn window_bind_access_and_local_invalidate(flavor: Flavor) {
    let Some(mut p) = pair(flavor) else { return };
    let mut mw = p.pd.alloc_mw().unwrap();
    let first = mw.rkey();
    let rkey = p.bind(&mut mw, 4096, 4096);
    assert_ne!(rkey, first, "a bind takes a new rkey");
    assert_ne!(rkey, p.target.rkey());
    let base = p.target.addr() + 4096;
    // Through the window: a WRITE and a READ inside it work.
    p.local.write_at(0, &pattern(256, 7)).unwrap();
    let c = p.remote(
        1,
        SendOp::RdmaWrite {
            remote_addr: base + 8,
            rkey,
        },
        256,
    );
    assert_eq!(c.status, WcStatus::Success);
    assert_eq!(
        p.target.read_vec(4096 + 8..4096 + 264).unwrap(),
        pattern(256, 7)
    );
    p.target.write_at(8192 - 16, &[0x5a; 16]).unwrap();
    let c = p.remote(
        2,
        SendOp::RdmaRead {
            remote_addr: base + 4096 - 16,
            rkey,
        },
        16,
    );
    assert_eq!(c.status, WcStatus::Success);
    assert_eq!(p.local.read_vec(0..16).unwrap(), [0x5a; 16]);
    // LOCAL_INV withdraws the rkey; the window binds again under a new one.
    let c = p.local_op(3, SendOp::LocalInv { rkey });
    assert_eq!(
        (c.wr_id, c.status, c.opcode),
        (3, WcStatus::Success, WcOpcode::LocalInv)
    );
    let again = p.bind(&mut mw, 0, 4096);
    assert_ne!(again, rkey);
    let c = p.remote(
        4,
        SendOp::RdmaWrite {
            remote_addr: p.target.addr(),
            rkey: again,
        },
        16,
    );
    assert_eq!(c.status, WcStatus::Success);
    // The invalidated rkey no longer reaches the memory: a remote access error.
    let c = p.remote(
        5,
        SendOp::RdmaWrite {
            remote_addr: base,
            rkey,
        },
        16,
    );
    assert_eq!(c.status, WcStatus::RemAccessErr);
}

/// Soft flavors only: rxe checks an access through a window against the window's region,
/// not the window (rxe_resp.c, check_rkey), so the case fails there; the IB spec (o10-37)
/// and the soft device check the window.
pub fn window_bounds_are_enforced(flavor: Flavor) {
    let Some(mut p) = pair(flavor) else { return };
    let mut mw = p.pd.alloc_mw().unwrap();
    let rkey = p.bind(&mut mw, 4096, 4096);
    // One byte past the window (still inside the region): a remote access error.
    let c = p.remote(
        1,
        SendOp::RdmaWrite {
            remote_addr: p.target.addr() + 8192 - 8,
            rkey,
        },
        16,
    );
    assert_eq!(c.status, WcStatus::RemAccessErr);
}

pub fn window_invalidated_by_send_with_inv(flavor: Flavor) {
    let Some(mut p) = pair(flavor) else { return };
    let mut mw = p.pd.alloc_mw().unwrap();
    let rkey = p.bind(&mut mw, 0, 4096);
    let recv = [p.target.sge(8192, 64)];
    p.b.post_recv(&[RecvWr {
        wr_id: 7,
        sges: &recv,
    }])
    .unwrap();
    let c = p.remote(1, SendOp::SendWithInv { rkey }, 16);
    assert_eq!(c.status, WcStatus::Success);
    let r = p.fx.wait_wcs(&p.cq_b, 1)[0];
    assert_eq!(
        (r.wr_id, r.status, r.invalidated_rkey),
        (7, WcStatus::Success, Some(rkey))
    );
    let c = p.remote(
        2,
        SendOp::RdmaRead {
            remote_addr: p.target.addr(),
            rkey,
        },
        16,
    );
    assert_eq!(c.status, WcStatus::RemAccessErr);
}

/// SEND_WITH_INV naming a plain region's rkey: a remote error at the receiving side (only
/// windows, and fast registrations, are invalidated); the rkey stays valid.
pub fn send_with_inv_of_region_rkey_fails(flavor: Flavor) {
    let Some(mut p) = pair(flavor) else { return };
    let recv = [p.target.sge(0, 64)];
    p.b.post_recv(&[RecvWr {
        wr_id: 7,
        sges: &recv,
    }])
    .unwrap();
    let rkey = p.target.rkey();
    // The requester's status differs by device (rxe acknowledges the SEND before the
    // responder fails it; the soft device answers REM_OP_ERR): only the receive is specified.
    let sge = [p.local.sge(0, 16)];
    p.a.post_send(&[SendWr {
        wr_id: 1,
        op: SendOp::SendWithInv { rkey },
        sges: &sge,
        flags: SendFlags::SIGNALED,
    }])
    .unwrap();
    let r = p.fx.wait_wcs(&p.cq_b, 1)[0];
    assert_ne!(r.status, WcStatus::Success, "{r:?}");
    assert_eq!(r.invalidated_rkey, None);
    // The region's rkey still works from a healthy QP pair.
    let cq_c = p.fx.cq(16);
    let cq_d = p.fx.cq(16);
    let mut c_qp = p.fx.qp(&p.pd, &cq_c, &cq_c, None);
    let mut d_qp = p.fx.qp(&p.pd, &cq_d, &cq_d, None);
    p.fx.connect(&mut c_qp, &mut d_qp, 7);
    let sge = [p.local.sge(0, 16)];
    c_qp.post_send(&[SendWr {
        wr_id: 3,
        op: SendOp::RdmaWrite {
            remote_addr: p.target.addr() + 512,
            rkey,
        },
        sges: &sge,
        flags: SendFlags::SIGNALED,
    }])
    .unwrap();
    assert_eq!(p.fx.wait_wcs(&cq_c, 1)[0].status, WcStatus::Success);
}

pub fn local_invalidate_of_region_rkey_fails(flavor: Flavor) {
    let Some(mut p) = pair(flavor) else { return };
    let rkey = p.target.rkey();
    let c = p.local_op(1, SendOp::LocalInv { rkey });
    assert_ne!(c.status, WcStatus::Success, "{c:?}");
}
