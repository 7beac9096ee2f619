//! Work request chains, built on the stack in fixed-size chunks: posting a list of any length
//! allocates nothing. Each chunk is linked through `next` and handed to one post call; on
//! failure the index of the bad WR is translated back to the caller's list.
//!
//! SGEs are not copied: `Sge` is `repr(C)` and identical to `ibv_sge`, so `sg_list` points at
//! the caller's slice (providers read SGEs, they never write them).

use std::mem::{MaybeUninit, offset_of, size_of};
use std::os::raw::c_int;
use std::ptr::null_mut;

use rdma_sys::*;

use crate::error::{PostError, TransportError};
use crate::types::{RecvWr, SendFlags, SendOp, SendWr, Sge};

/// Work requests per chunk (per post call).
pub(crate) const CHUNK: usize = 16;

const _: () = {
    assert!(size_of::<Sge>() == size_of::<ibv_sge>());
    assert!(offset_of!(Sge, addr) == offset_of!(ibv_sge, addr));
    assert!(offset_of!(Sge, length) == offset_of!(ibv_sge, length));
    assert!(offset_of!(Sge, lkey) == offset_of!(ibv_sge, lkey));
    assert!(std::mem::align_of::<Sge>() == std::mem::align_of::<ibv_sge>());
};

/// Send flags in verbs encoding (the bit values are the same).
pub(crate) fn send_flags(f: SendFlags) -> u32 {
    let mut b = 0;
    if f.contains(SendFlags::FENCE) {
        b |= ibv_send_flags::IBV_SEND_FENCE.0;
    }
    if f.contains(SendFlags::SIGNALED) {
        b |= ibv_send_flags::IBV_SEND_SIGNALED.0;
    }
    if f.contains(SendFlags::SOLICITED) {
        b |= ibv_send_flags::IBV_SEND_SOLICITED.0;
    }
    if f.contains(SendFlags::INLINE) {
        b |= ibv_send_flags::IBV_SEND_INLINE.0;
    }
    b
}

fn sg_list(sges: &[Sge]) -> (*mut ibv_sge, c_int) {
    if sges.is_empty() {
        (null_mut(), 0)
    } else {
        // Same layout (checked above); the cast to *mut is what the C API takes, it never
        // writes through it.
        (
            sges.as_ptr().cast::<ibv_sge>().cast_mut(),
            sges.len().min(c_int::MAX as usize) as c_int,
        )
    }
}

/// One `ibv_send_wr`, linked to `next`.
pub(crate) fn build_send(wr: &SendWr<'_>, next: *mut ibv_send_wr) -> ibv_send_wr {
    // SAFETY: ibv_send_wr is plain C data (integers, pointers, unions of them): all-zero is a
    // valid value.
    let mut w: ibv_send_wr = unsafe { MaybeUninit::zeroed().assume_init() };
    w.wr_id = wr.wr_id;
    w.next = next;
    (w.sg_list, w.num_sge) = sg_list(wr.sges);
    w.send_flags = send_flags(wr.flags);
    match wr.op {
        SendOp::Send => w.opcode = ibv_wr_opcode::IBV_WR_SEND,
        SendOp::SendWithImm { imm } => {
            w.opcode = ibv_wr_opcode::IBV_WR_SEND_WITH_IMM;
            w.imm_data_invalidated_rkey_union.imm_data = imm.to_be();
        }
        SendOp::SendWithInv { rkey } => {
            w.opcode = ibv_wr_opcode::IBV_WR_SEND_WITH_INV;
            w.imm_data_invalidated_rkey_union.invalidated_rkey = rkey;
        }
        SendOp::RdmaWrite { remote_addr, rkey } => {
            w.opcode = ibv_wr_opcode::IBV_WR_RDMA_WRITE;
            w.wr.rdma = rdma_t { remote_addr, rkey };
        }
        SendOp::RdmaWriteWithImm {
            remote_addr,
            rkey,
            imm,
        } => {
            w.opcode = ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM;
            w.imm_data_invalidated_rkey_union.imm_data = imm.to_be();
            w.wr.rdma = rdma_t { remote_addr, rkey };
        }
        SendOp::RdmaRead { remote_addr, rkey } => {
            w.opcode = ibv_wr_opcode::IBV_WR_RDMA_READ;
            w.wr.rdma = rdma_t { remote_addr, rkey };
        }
        SendOp::LocalInv { rkey } => {
            w.opcode = ibv_wr_opcode::IBV_WR_LOCAL_INV;
            w.imm_data_invalidated_rkey_union.invalidated_rkey = rkey;
        }
        SendOp::BindMw {
            rkey,
            addr,
            length,
            access,
            ..
        } => {
            // The window and region pointers are filled by `VerbsQp::post_send`, which looks
            // them up in the PD (`bind_targets`); a null one is never posted.
            w.opcode = ibv_wr_opcode::IBV_WR_BIND_MW;
            w.bind_mw_tso_union.bind_mw = bind_mw_t {
                mw: null_mut(),
                rkey,
                bind_info: ibv_mw_bind_info {
                    mr: null_mut(),
                    addr,
                    length,
                    mw_access_flags: super::mr::access_bits(access),
                },
            };
        }
    }
    w
}

/// The bind WR `wr` with its window and region filled in.
pub(crate) fn build_bind(wr: &SendWr<'_>, mw: *mut ibv_mw, mr: *mut ibv_mr) -> ibv_send_wr {
    let mut w = build_send(wr, null_mut());
    if let SendOp::BindMw {
        rkey,
        addr,
        length,
        access,
        ..
    } = wr.op
    {
        w.bind_mw_tso_union.bind_mw = bind_mw_t {
            mw,
            rkey,
            bind_info: ibv_mw_bind_info {
                mr,
                addr,
                length,
                mw_access_flags: super::mr::access_bits(access),
            },
        };
    }
    w
}

/// One `ibv_recv_wr`, linked to `next`.
pub(crate) fn build_recv(wr: &RecvWr<'_>, next: *mut ibv_recv_wr) -> ibv_recv_wr {
    let (sg_list, num_sge) = sg_list(wr.sges);
    ibv_recv_wr {
        wr_id: wr.wr_id,
        next,
        sg_list,
        num_sge,
    }
}

/// The error of a failed post: a full queue is ENOMEM in verbs.
fn post_error(op: &'static str, queue: &'static str, rc: c_int) -> TransportError {
    match super::rc_error(op, rc) {
        TransportError::Os { source, .. } if source.raw_os_error() == Some(libc::ENOMEM) => {
            TransportError::QueueFull(queue)
        }
        e => e,
    }
}

/// Where `bad` points in a chunk of `len` starting at `base`; a failure naming no WR of the
/// chunk counts as `unnamed` of them posted (see [`RawWr::UNNAMED_FAILURE_POSTED`]).
fn bad_index<T>(base: *const T, bad: *const T, len: usize, unnamed: usize) -> usize {
    let (b, p) = (base as usize, bad as usize);
    let i = p.wrapping_sub(b) / size_of::<T>();
    if p >= b && i < len { i } else { unnamed }
}

/// A work request that builds the raw verbs struct it is posted as, linked to `next`.
pub(crate) trait RawWr {
    type Raw;
    /// "send" or "receive", for error messages.
    const QUEUE: &'static str;
    /// A failed post that names no WR (NULL `bad_wr`) queued them all: rxe's send side, whose
    /// doorbell fails after queueing every WR (they complete or flush; the caller drains the
    /// qpair, and a buffer taken back while the device may still use it is the worse mistake).
    /// rxe's receive side names none only when it queued nothing (bad arguments, a QP in
    /// RESET): counting those posted would lose them for good.
    const UNNAMED_FAILURE_POSTED: bool;
    fn build(&self, next: *mut Self::Raw) -> Self::Raw;
}

impl RawWr for SendWr<'_> {
    type Raw = ibv_send_wr;
    const QUEUE: &'static str = "send";
    const UNNAMED_FAILURE_POSTED: bool = true;
    fn build(&self, next: *mut ibv_send_wr) -> ibv_send_wr {
        build_send(self, next)
    }
}

impl RawWr for RecvWr<'_> {
    type Raw = ibv_recv_wr;
    const QUEUE: &'static str = "receive";
    const UNNAMED_FAILURE_POSTED: bool = false;
    fn build(&self, next: *mut ibv_recv_wr) -> ibv_recv_wr {
        build_recv(self, next)
    }
}

/// Post `wrs` as linked chains of at most CHUNK WRs built on the stack (no allocation), with
/// `post(head, &mut bad) -> rc`. On failure, WRs before `failed_index` were posted.
pub(crate) fn post_chunked<W: RawWr>(
    wrs: &[W],
    op: &'static str,
    mut post: impl FnMut(*mut W::Raw, &mut *mut W::Raw) -> c_int,
) -> Result<(), PostError> {
    for (c, chunk) in wrs.chunks(CHUNK).enumerate() {
        let mut buf: [MaybeUninit<W::Raw>; CHUNK] = [const { MaybeUninit::uninit() }; CHUNK];
        let base = buf.as_mut_ptr().cast::<W::Raw>();
        for (i, wr) in chunk.iter().enumerate() {
            let next = if i + 1 < chunk.len() {
                base.wrapping_add(i + 1)
            } else {
                null_mut()
            };
            // SAFETY: `i < CHUNK`: the slot is inside `buf`, written through the one raw
            // pointer every link is derived from.
            unsafe { base.add(i).write(wr.build(next)) };
        }
        let mut bad = null_mut();
        let rc = post(base, &mut bad);
        if rc != 0 {
            let unnamed = if W::UNNAMED_FAILURE_POSTED {
                chunk.len()
            } else {
                0
            };
            let failed_index = c * CHUNK + bad_index(base, bad, chunk.len(), unnamed);
            return Err(PostError {
                failed_index,
                error: post_error(op, W::QUEUE, rc),
            });
        }
    }
    Ok(())
}

/// Send lists: see `post_chunked`.
pub(crate) fn post_send_chunked(
    wrs: &[SendWr<'_>],
    op: &'static str,
    post: impl FnMut(*mut ibv_send_wr, &mut *mut ibv_send_wr) -> c_int,
) -> Result<(), PostError> {
    post_chunked(wrs, op, post)
}

/// Receive lists (QP or SRQ): see `post_chunked`.
pub(crate) fn post_recv_chunked(
    wrs: &[RecvWr<'_>],
    op: &'static str,
    post: impl FnMut(*mut ibv_recv_wr, &mut *mut ibv_recv_wr) -> c_int,
) -> Result<(), PostError> {
    post_chunked(wrs, op, post)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a fake provider saw of one send WR.
    #[derive(Debug, PartialEq)]
    struct Seen {
        wr_id: u64,
        opcode: u32,
        flags: u32,
        num_sge: i32,
        sg_list: usize,
        imm: u32,
        remote_addr: u64,
        rkey: u32,
    }

    fn walk_send(mut p: *mut ibv_send_wr) -> Vec<Seen> {
        let mut v = Vec::new();
        while !p.is_null() {
            // SAFETY: the chain was built by post_send_chunked and is live during the call.
            let w = unsafe { &*p };
            // SAFETY: union members are plain integers.
            let (imm, rdma) = unsafe { (w.imm_data_invalidated_rkey_union.imm_data, w.wr.rdma) };
            v.push(Seen {
                wr_id: w.wr_id,
                opcode: w.opcode,
                flags: w.send_flags,
                num_sge: w.num_sge,
                sg_list: w.sg_list as usize,
                imm,
                remote_addr: rdma.remote_addr,
                rkey: rdma.rkey,
            });
            p = w.next;
        }
        v
    }

    #[test]
    fn send_wr_fields() {
        let sges = [
            Sge {
                addr: 0x1000,
                length: 64,
                lkey: 9,
            },
            Sge {
                addr: 0x2000,
                length: 8,
                lkey: 9,
            },
        ];
        let ops = [
            (SendOp::Send, ibv_wr_opcode::IBV_WR_SEND, 0, 0, 0),
            (
                SendOp::SendWithImm { imm: 0x0102_0304 },
                ibv_wr_opcode::IBV_WR_SEND_WITH_IMM,
                0x0102_0304u32.to_be(),
                0,
                0,
            ),
            (
                SendOp::SendWithInv { rkey: 0xabcd },
                ibv_wr_opcode::IBV_WR_SEND_WITH_INV,
                0xabcd,
                0,
                0,
            ),
            (
                SendOp::RdmaWrite {
                    remote_addr: 0x5000,
                    rkey: 77,
                },
                ibv_wr_opcode::IBV_WR_RDMA_WRITE,
                0,
                0x5000,
                77,
            ),
            (
                SendOp::RdmaWriteWithImm {
                    remote_addr: 0x6000,
                    rkey: 78,
                    imm: 5,
                },
                ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM,
                5u32.to_be(),
                0x6000,
                78,
            ),
            (
                SendOp::RdmaRead {
                    remote_addr: 0x7000,
                    rkey: 79,
                },
                ibv_wr_opcode::IBV_WR_RDMA_READ,
                0,
                0x7000,
                79,
            ),
        ];
        let wrs: Vec<SendWr<'_>> = ops
            .iter()
            .enumerate()
            .map(|(i, o)| SendWr {
                wr_id: i as u64,
                op: o.0,
                sges: &sges,
                flags: SendFlags::SIGNALED | SendFlags::INLINE,
            })
            .collect();
        let mut seen = Vec::new();
        post_send_chunked(&wrs, "test", |head, _| {
            seen = walk_send(head);
            0
        })
        .unwrap();
        assert_eq!(seen.len(), ops.len());
        for (s, o) in seen.iter().zip(ops.iter()) {
            assert_eq!(s.opcode, o.1);
            assert_eq!(s.num_sge, 2);
            assert_eq!(
                s.sg_list,
                sges.as_ptr() as usize,
                "SGEs are passed, not copied"
            );
            assert_eq!(
                s.flags,
                ibv_send_flags::IBV_SEND_SIGNALED.0 | ibv_send_flags::IBV_SEND_INLINE.0
            );
            if o.2 != 0 {
                assert_eq!(s.imm, o.2);
            }
            if o.3 != 0 {
                assert_eq!((s.remote_addr, s.rkey), (o.3, o.4));
            }
        }
    }

    #[test]
    fn flags_mapping() {
        assert_eq!(send_flags(SendFlags::empty()), 0);
        assert_eq!(send_flags(SendFlags::all()), SendFlags::all().bits());
        assert_eq!(
            send_flags(SendFlags::FENCE),
            ibv_send_flags::IBV_SEND_FENCE.0
        );
        assert_eq!(
            send_flags(SendFlags::SOLICITED),
            ibv_send_flags::IBV_SEND_SOLICITED.0
        );
    }

    #[test]
    fn chunks_cover_long_lists_in_order() {
        let sge = [Sge {
            addr: 1,
            length: 1,
            lkey: 1,
        }];
        let wrs: Vec<SendWr<'_>> = (0..(3 * CHUNK + 5) as u64)
            .map(|i| SendWr {
                wr_id: i,
                op: SendOp::Send,
                sges: &sge,
                flags: SendFlags::empty(),
            })
            .collect();
        let mut calls = Vec::new();
        post_send_chunked(&wrs, "test", |head, _| {
            calls.push(walk_send(head).iter().map(|s| s.wr_id).collect::<Vec<_>>());
            0
        })
        .unwrap();
        assert_eq!(calls.len(), 4);
        assert!(calls[..3].iter().all(|c| c.len() == CHUNK));
        assert_eq!(calls[3].len(), 5);
        let all: Vec<u64> = calls.concat();
        assert_eq!(all, (0..(3 * CHUNK + 5) as u64).collect::<Vec<_>>());
        // empty list: no call at all
        post_send_chunked(&[], "test", |_, _| panic!("no post for an empty list")).unwrap();
    }

    #[test]
    fn failure_index_is_translated_across_chunks() {
        let sge = [Sge::default()];
        let wrs: Vec<SendWr<'_>> = (0..40u64)
            .map(|i| SendWr {
                wr_id: i,
                op: SendOp::Send,
                sges: &sge,
                flags: SendFlags::empty(),
            })
            .collect();
        let mut calls = 0;
        // the second chunk fails at its 4th WR with a full queue
        let err = post_send_chunked(&wrs, "ibv_post_send", |head, bad| {
            calls += 1;
            if calls == 2 {
                *bad = head.wrapping_add(3);
                libc::ENOMEM
            } else {
                0
            }
        })
        .unwrap_err();
        assert_eq!(err.failed_index, CHUNK + 3);
        assert!(
            matches!(err.error, TransportError::QueueFull("send")),
            "{}",
            err.error
        );
        assert_eq!(calls, 2, "nothing after the failed chunk is posted");

        // another errno keeps the op name; a NULL bad pointer counts the chunk as posted
        let err = post_send_chunked(&wrs, "ibv_post_send", |_, _| libc::EINVAL).unwrap_err();
        assert_eq!(err.failed_index, CHUNK);
        assert!(
            err.error.to_string().contains("ibv_post_send"),
            "{}",
            err.error
        );
    }

    #[test]
    fn recv_chunks() {
        let sges = [Sge {
            addr: 0x9000,
            length: 4096,
            lkey: 3,
        }];
        let wrs: Vec<RecvWr<'_>> = (0..(CHUNK + 1) as u64)
            .map(|i| RecvWr {
                wr_id: 100 + i,
                sges: &sges,
            })
            .collect();
        let mut ids = Vec::new();
        post_recv_chunked(&wrs, "ibv_post_recv", |head, _| {
            let mut p = head;
            while !p.is_null() {
                // SAFETY: chain built by post_recv_chunked, live during the call.
                let w = unsafe { &*p };
                assert_eq!(w.num_sge, 1);
                assert_eq!(w.sg_list as usize, sges.as_ptr() as usize);
                ids.push(w.wr_id);
                p = w.next;
            }
            0
        })
        .unwrap();
        assert_eq!(ids, (100..100 + (CHUNK + 1) as u64).collect::<Vec<_>>());
        let err = post_recv_chunked(&wrs, "ibv_post_srq_recv", |head, bad| {
            *bad = head.wrapping_add(1);
            libc::ENOMEM
        })
        .unwrap_err();
        assert_eq!(err.failed_index, 1);
        assert!(matches!(err.error, TransportError::QueueFull("receive")));
        // a receive failure naming no WR queued none of them
        let err = post_recv_chunked(&wrs, "ibv_post_srq_recv", |_, _| libc::EINVAL).unwrap_err();
        assert_eq!(err.failed_index, 0);
    }

    #[test]
    fn empty_sge_list_is_null() {
        let w = build_recv(
            &RecvWr {
                wr_id: 1,
                sges: &[],
            },
            null_mut(),
        );
        assert!(w.sg_list.is_null());
        assert_eq!(w.num_sge, 0);
    }
}
