//! A handler that answers every capsule with a 16-byte SEND (as the transport's poll group
//! tests do) and records, for every callback, which reactor's group ran it and on which thread.

use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::ThreadId;

use nvmf_target::rdma::GroupInfo;
use nvmf_transport::pollgroup::*;
use nvmf_transport::*;

/// A capsule as seen by a group.
#[derive(Clone, Copy, Debug)]
pub struct Seen {
    pub reactor: usize,
    pub qp_num: u32,
    /// The host index carried in the capsule's first 4 bytes.
    pub host: u32,
}

#[derive(Default)]
pub struct Log {
    pub capsules: Vec<Seen>,
    /// (reactor, qp_num, event)
    pub events: Vec<(usize, u32, QpairEvent)>,
    /// (reactor, thread) of every callback.
    pub threads: Vec<(usize, ThreadId)>,
}

#[derive(Clone, Default)]
pub struct Shared(pub Arc<Mutex<Log>>);

impl Shared {
    pub fn lock(&self) -> MutexGuard<'_, Log> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
    /// The target qp_num and reactor of host `host`'s latest capsule.
    pub fn placed(&self, host: u32) -> Option<(usize, u32)> {
        self.lock()
            .capsules
            .iter()
            .rev()
            .find(|s| s.host == host)
            .map(|s| (s.reactor, s.qp_num))
    }
    pub fn gone(&self, qp_num: u32) -> bool {
        self.lock()
            .events
            .iter()
            .any(|&(_, q, e)| q == qp_num && matches!(e, QpairEvent::Gone { .. }))
    }
    pub fn drain_reason(&self, qp_num: u32) -> Option<DrainReason> {
        self.lock().events.iter().find_map(|&(_, q, e)| match e {
            QpairEvent::Draining(r) if q == qp_num => Some(r),
            _ => None,
        })
    }
}

pub struct Echo {
    pub info: GroupInfo,
    pub log: Shared,
}

impl Echo {
    fn touch(&self) {
        self.log
            .lock()
            .threads
            .push((self.info.reactor, std::thread::current().id()));
    }
}

impl Handler<()> for Echo {
    fn capsule(&mut self, pg: &mut PollGroup<()>, req: ReqId) {
        self.touch();
        let qp_num = pg.request(req).map(|r| r.qp_num()).unwrap_or(0);
        let bytes = pg.capsule(req);
        let host = bytes
            .get(..4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .unwrap_or(u32::MAX);
        self.log.lock().capsules.push(Seen {
            reactor: self.info.reactor,
            qp_num,
            host,
        });
        pg.release_capsule(req);
        answer(pg, req);
    }

    fn chain_done(&mut self, pg: &mut PollGroup<()>, req: ReqId, _last: WrKind, _status: WcStatus) {
        self.touch();
        pg.finish(req);
    }

    fn qpair_event(
        &mut self,
        _pg: &mut PollGroup<()>,
        qp_num: u32,
        _token: u64,
        event: QpairEvent,
    ) {
        self.touch();
        self.log
            .lock()
            .events
            .push((self.info.reactor, qp_num, event));
    }

    fn aborted(&mut self, pg: &mut PollGroup<()>, req: ReqId) {
        self.touch();
        pg.finish(req);
    }

    fn buffers_ready(&mut self, pg: &mut PollGroup<()>, req: ReqId) {
        self.touch();
        post_answer(pg, req);
    }
}

/// Answers `req` with a 16-byte SEND from a data buffer (or gives it up when none is free).
pub fn answer(pg: &mut PollGroup<()>, req: ReqId) {
    match pg.alloc_buffers(req, 16) {
        Ok(BufferGrant::Ready) => post_answer(pg, req),
        Ok(BufferGrant::Waiting) => {}
        Err(_) => pg.finish(req),
    }
}

fn post_answer(pg: &mut PollGroup<()>, req: ReqId) {
    pg.buffer_mut(req, 0)[..16].fill(0x5a);
    let mut sges = [Sge::default(); MAX_WR_SGES];
    let n = pg.buffer_sges(req, 16, &mut sges);
    let posted = pg.post_chain(
        req,
        &[ChainWr {
            op: SendOp::Send,
            sges: &sges[..n],
            inline: true,
        }],
        true,
    );
    if posted.is_err() {
        pg.finish(req);
    }
}
