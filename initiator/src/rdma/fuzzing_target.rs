//! The raw target of `rdma::fuzzing`: one connection's QP, CQ and registered region (a receive
//! slot per command the host may have in flight, then per answer slot a staging chunk and a
//! response), how it answers a connect request, and how it answers a capsule (its data moved
//! first, the CQE after; after an RDMA READ's completion when it reads the host's data).

use nvmf_protocol::cm::{RdmaAccept, RdmaConnectRequest, RdmaReject, RejectStatus};
use nvmf_transport::{
    Access, CmId, ConnParam, Cq, Mr, Pd, Qp, QpCaps, QpInitAttr, RecvWr, SendFlags, SendOp, SendWr,
    WcStatus, WorkCompletion,
};

use super::{CHUNK, IN_CAPSULE, MAX_DEPTH};
use crate::queue::QueueConnectParams;

/// The target connection's region: a receive slot per command the host may have in flight
/// (SQE and in-capsule data), then per answer slot a staging chunk and a response.
const RECV_SLOT: usize = 64 + IN_CAPSULE;
const ANSWERS: usize = 32;
const STAGING_AT: usize = MAX_DEPTH * RECV_SLOT;
const RESPONSE_AT: usize = STAGING_AT + ANSWERS * CHUNK;
/// A response slot holds a CQE or a raw response of up to 32 bytes.
const RESPONSE_SLOT: usize = 32;
const TARGET_REGION: usize = RESPONSE_AT + ANSWERS * RESPONSE_SLOT;
/// Receive WR ids are this plus the slot; an answer's WRs `ANSWER_WR + slot * 4 + kind`.
const RECV_WR: u64 = 0x1000;
const ANSWER_WR: u64 = 0x10_0000;
const WR_READ: u64 = 0;
const WR_WRITE: u64 = 1;
const WR_SEND: u64 = 2;
const WR_PROBE: u64 = 3;

/// How the target answers a connect request.
pub(super) enum TargetAnswer {
    /// Accept, with this private data (None: a well-formed accept of the host's depth).
    Accept(Option<Vec<u8>>),
    /// Accept with this CRQSIZE.
    AcceptDepth(u16),
    /// Refuse: with an NVMe-oF reject of this status, or bare (None).
    Reject(Option<RejectStatus>),
}

/// What an answer does before its CQE.
pub(super) enum AnswerStep {
    None,
    /// RDMA WRITE `bytes` to the host.
    Write {
        address: u64,
        key: u32,
        bytes: Vec<u8>,
    },
    /// RDMA READ `len` bytes from the host; the CQE goes once it completes.
    Read {
        address: u64,
        key: u32,
        len: usize,
    },
}

/// What the target's CQ brought.
pub(super) enum TargetEvent {
    /// A capsule (its bytes).
    Capsule { capsule: Vec<u8> },
    /// An answer's RDMA READ of command `cid` completed with `data`.
    Read { cid: u16, data: Vec<u8> },
    /// A probe's RDMA WRITE landed in the host's memory.
    ProbeLanded,
    /// An error completion.
    Error(WcStatus),
}

/// An answer slot in use: the command, and the CQE waiting for its RDMA READ.
struct Answer {
    cid: u16,
    waiting: Option<(usize, Option<u32>, usize)>,
}

/// The target's side of one connection: its QP, CQ and region (receive slots, per answer a
/// staging chunk and a response slot).
pub(super) struct TargetConn {
    pub(super) id: CmId,
    qp: Qp,
    cq: Cq,
    mr: Mr,
    _pd: Pd,
    pub(super) token: u64,
    pub(super) qid: u16,
    /// The host's depth (HSQSIZE + 1): receive slots.
    pub(super) depth: u16,
    pub(super) sqhd: u16,
    /// Receive slots with a receive posted.
    posted: [bool; MAX_DEPTH],
    /// Stop re-posting receives.
    pub(super) hold: bool,
    /// CIDs of capsules received and not answered yet, in arrival order.
    pub(super) pending: Vec<u16>,
    answers: [Option<Answer>; ANSWERS],
    /// An error completion or a disconnect came.
    pub(super) broken: bool,
}

impl TargetConn {
    /// Answers a connect request as `answer` says; the connection when it accepted.
    pub(super) fn answer(
        mut id: CmId,
        private_data: &[u8],
        params: &QueueConnectParams,
        token: u64,
        answer: &TargetAnswer,
    ) -> Option<TargetConn> {
        let request = RdmaConnectRequest::decode(private_data)
            .expect("the host's connect carries NVMe-oF private data");
        let asked = (params.hsqsize + 1)
            .min(params.hrqsize)
            .min(MAX_DEPTH as u16);
        assert!(
            request.qid == params.qid
                && request.hrqsize == request.hsqsize + 1
                && request.hrqsize >= 1
                && request.hrqsize <= asked
                && request.cntlid == params.cntlid,
            "the host's connect private data {request:?} does not match {params:?}"
        );
        let reject = |id: &mut CmId, status: Option<RejectStatus>| {
            let data = status.map(|s| RdmaReject::new(s).to_bytes().to_vec());
            id.reject(data.as_deref().unwrap_or(&[])).expect("reject");
        };
        if let TargetAnswer::Reject(status) = answer {
            reject(&mut id, *status);
            return None;
        }
        let depth = request.hrqsize;
        id.set_token(token);
        let ctx = id.context().expect("device");
        let pd = ctx.alloc_pd().expect("pd");
        let cq = ctx
            .create_cq((MAX_DEPTH + 2 * ANSWERS) as u32, None)
            .expect("cq");
        let qp = id
            .create_qp(
                &pd,
                &QpInitAttr {
                    send_cq: &cq,
                    recv_cq: &cq,
                    srq: None,
                    caps: QpCaps {
                        max_send_wr: (2 * ANSWERS) as u32,
                        max_recv_wr: MAX_DEPTH as u32,
                        max_send_sge: 1,
                        max_recv_sge: 1,
                        max_inline_data: 0,
                    },
                    sq_sig_all: true,
                },
            )
            .expect("target QP");
        let access = Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE;
        let mr = pd.alloc_mr(TARGET_REGION, access).expect("target region");
        let mut conn = TargetConn {
            id,
            qp,
            cq,
            mr,
            _pd: pd,
            token,
            qid: request.qid,
            depth,
            sqhd: 0,
            posted: [false; MAX_DEPTH],
            hold: false,
            pending: Vec::new(),
            answers: std::array::from_fn(|_| None),
            broken: false,
        };
        conn.post_receives();
        let private_data = match answer {
            TargetAnswer::Accept(Some(bytes)) => bytes.clone(),
            TargetAnswer::AcceptDepth(crqsize) => RdmaAccept {
                recfmt: 0,
                crqsize: *crqsize,
            }
            .to_bytes()
            .to_vec(),
            _ => RdmaAccept {
                recfmt: 0,
                crqsize: depth,
            }
            .to_bytes()
            .to_vec(),
        };
        conn.id
            .accept(&ConnParam {
                private_data,
                responder_resources: 0,
                initiator_depth: 16,
                retry_count: 7,
                rnr_retry_count: 7,
            })
            .expect("accept");
        Some(conn)
    }

    /// Posts a receive into every slot without one.
    pub(super) fn post_receives(&mut self) {
        for slot in 0..usize::from(self.depth) {
            if !self.posted[slot] && !self.broken {
                let sge = self.mr.sge(slot * RECV_SLOT, RECV_SLOT as u32);
                let wr = RecvWr {
                    wr_id: RECV_WR + slot as u64,
                    sges: &[sge],
                };
                if self.qp.post_recv(&[wr]).is_err() {
                    self.broken = true;
                    return;
                }
                self.posted[slot] = true;
            }
        }
    }

    pub(super) fn free_answer(&self) -> Option<usize> {
        self.answers.iter().position(Option::is_none)
    }

    /// Posts an answer in `slot`: its data step, then `response` (at once, or after an RDMA
    /// READ completes).
    pub(super) fn post_answer(
        &mut self,
        slot: usize,
        cid: u16,
        step: AnswerStep,
        response: &[u8],
        invalidate: Option<u32>,
    ) {
        let staging = STAGING_AT + slot * CHUNK;
        let response_at = RESPONSE_AT + slot * RESPONSE_SLOT;
        self.mr
            .write_at(response_at, response)
            .expect("inside the region");
        let wr = |kind: u64| ANSWER_WR + slot as u64 * 4 + kind;
        let mut answer = Answer { cid, waiting: None };
        let posted = match step {
            AnswerStep::Read { address, key, len } => {
                answer.waiting = Some((response.len(), invalidate, len));
                self.qp.post_send(&[SendWr {
                    wr_id: wr(WR_READ),
                    op: SendOp::RdmaRead {
                        remote_addr: address,
                        rkey: key,
                    },
                    sges: &[self.mr.sge(staging, len as u32)],
                    flags: SendFlags::SIGNALED,
                }])
            }
            AnswerStep::Write {
                address,
                key,
                bytes,
            } => {
                self.mr
                    .write_at(staging, &bytes)
                    .expect("inside the region");
                let send = ResponseSend::of(&self.mr, slot, response.len(), invalidate);
                self.qp.post_send(&[
                    SendWr {
                        wr_id: wr(WR_WRITE),
                        op: SendOp::RdmaWrite {
                            remote_addr: address,
                            rkey: key,
                        },
                        sges: &[self.mr.sge(staging, bytes.len() as u32)],
                        flags: SendFlags::SIGNALED,
                    },
                    send.wr(),
                ])
            }
            AnswerStep::None => {
                let send = ResponseSend::of(&self.mr, slot, response.len(), invalidate);
                self.qp.post_send(&[send.wr()])
            }
        };
        if posted.is_err() {
            self.broken = true;
            return;
        }
        self.answers[slot] = Some(answer);
    }

    /// Writes one byte to the host's `address` under `key` from answer `slot` (its completion
    /// says whether the key let the target in).
    pub(super) fn post_probe(&mut self, slot: usize, address: u64, key: u32) {
        let posted = self.qp.post_send(&[SendWr {
            wr_id: ANSWER_WR + slot as u64 * 4 + WR_PROBE,
            op: SendOp::RdmaWrite {
                remote_addr: address,
                rkey: key,
            },
            sges: &[self.mr.sge(STAGING_AT + slot * CHUNK, 1)],
            flags: SendFlags::SIGNALED,
        }]);
        if posted.is_err() {
            self.broken = true;
            return;
        }
        self.answers[slot] = Some(Answer {
            cid: 0,
            waiting: None,
        });
    }

    /// Reaps the CQ: capsules (receive slots re-posted unless held), finished READs (their
    /// CQE then goes), errors.
    pub(super) fn poll(&mut self) -> Vec<TargetEvent> {
        let mut events = Vec::new();
        let mut wcs = [WorkCompletion::default(); 16];
        loop {
            let n = self.cq.poll(&mut wcs).expect("target CQ");
            for wc in &wcs[..n] {
                if wc.status != WcStatus::Success && !self.broken {
                    self.broken = true;
                    events.push(TargetEvent::Error(wc.status));
                }
                if (RECV_WR..RECV_WR + MAX_DEPTH as u64).contains(&wc.wr_id) {
                    let slot = (wc.wr_id - RECV_WR) as usize;
                    self.posted[slot] = false;
                    if wc.status == WcStatus::Success {
                        let at = slot * RECV_SLOT;
                        let capsule = self
                            .mr
                            .read_vec(at..at + wc.byte_len as usize)
                            .expect("inside the region");
                        events.push(TargetEvent::Capsule { capsule });
                    }
                    continue;
                }
                let slot = ((wc.wr_id - ANSWER_WR) / 4) as usize;
                let kind = (wc.wr_id - ANSWER_WR) % 4;
                if kind == WR_PROBE && wc.status == WcStatus::Success {
                    events.push(TargetEvent::ProbeLanded);
                }
                if wc.status != WcStatus::Success || kind == WR_SEND || kind == WR_PROBE {
                    self.answers[slot] = None;
                    continue;
                }
                if kind != WR_READ {
                    continue;
                }
                let Some(Answer {
                    cid,
                    waiting: Some((response_len, invalidate, len)),
                }) = self.answers[slot].take()
                else {
                    continue;
                };
                let staging = STAGING_AT + slot * CHUNK;
                let data = self
                    .mr
                    .read_vec(staging..staging + len)
                    .expect("inside the region");
                events.push(TargetEvent::Read { cid, data });
                let send = ResponseSend::of(&self.mr, slot, response_len, invalidate);
                if self.qp.post_send(&[send.wr()]).is_err() {
                    self.broken = true;
                } else {
                    self.answers[slot] = Some(Answer { cid, waiting: None });
                }
            }
            if n < wcs.len() {
                break;
            }
        }
        if !self.hold {
            self.post_receives();
        }
        events
    }

    /// Reaps the CQ of a connection nobody sends on (the anchor's): anything it brings is a
    /// rule broken.
    pub(super) fn target_poll_quiet(&mut self) {
        let events = self.poll();
        assert!(
            events.is_empty(),
            "the anchor's target connection got traffic"
        );
    }

    /// Fails the connection without a word to the CM: the QP goes to the error state (its work
    /// flushed), the peer hears no disconnect. The connection itself goes when dropped.
    pub(super) fn vanish(&mut self) {
        self.broken = true;
        let _ = self.qp.modify_to_err();
    }
}

/// The response SEND of an answer slot (with invalidate when asked).
struct ResponseSend {
    wr_id: u64,
    sge: nvmf_transport::Sge,
    invalidate: Option<u32>,
}

impl ResponseSend {
    /// The SEND of answer `slot`'s first `len` response bytes.
    fn of(mr: &Mr, slot: usize, len: usize, invalidate: Option<u32>) -> ResponseSend {
        ResponseSend {
            wr_id: ANSWER_WR + slot as u64 * 4 + WR_SEND,
            sge: mr.sge(RESPONSE_AT + slot * RESPONSE_SLOT, len as u32),
            invalidate,
        }
    }

    fn wr(&self) -> SendWr<'_> {
        SendWr {
            wr_id: self.wr_id,
            op: match self.invalidate {
                Some(rkey) => SendOp::SendWithInv { rkey },
                None => SendOp::Send,
            },
            sges: std::slice::from_ref(&self.sge),
            flags: SendFlags::SIGNALED,
        }
    }
}
