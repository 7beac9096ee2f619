//! The initiator's side of the floor: a host-side poll group connects to the target through
//! the CM (resolve, `add_cm_qpair`, `connect`), submits commands and completes each one only
//! when both its SEND completion and its response are in.

use std::net::SocketAddr;
use std::time::Instant;

use nvmf_protocol::cm::RdmaAccept;
use nvmf_transport::pollgroup::*;
use nvmf_transport::*;

use crate::host::{patience, request};

#[derive(Default)]
pub struct Initiator {
    /// The command in flight (the echo target answers 16 bytes without a CID: one at a time).
    pub in_flight: Option<ReqId>,
    pub responses: u64,
    pub completed: u64,
    pub events: Vec<QpairEvent>,
}

impl Handler<()> for Initiator {
    fn capsule(&mut self, _: &mut PollGroup<()>, _: ReqId) {
        panic!("host groups make no requests from capsules");
    }
    fn chain_done(&mut self, _: &mut PollGroup<()>, _: ReqId, _: WrKind, _: WcStatus) {
        panic!("a host request's SEND completes through request_complete");
    }
    fn qpair_event(&mut self, _: &mut PollGroup<()>, _: u32, _: u64, event: QpairEvent) {
        self.events.push(event);
    }
    fn aborted(&mut self, pg: &mut PollGroup<()>, req: ReqId) {
        pg.finish(req);
    }
    fn buffers_ready(&mut self, _: &mut PollGroup<()>, _: ReqId) {}
    fn response(&mut self, pg: &mut PollGroup<()>, _qp_num: u32, _token: u64, capsule: &[u8]) {
        assert_eq!(&capsule[..16], &[0x5a; 16]);
        self.responses += 1;
        let req = self.in_flight.expect("a command in flight");
        pg.response_received(req).unwrap();
    }
    fn request_complete(&mut self, pg: &mut PollGroup<()>, req: ReqId, status: WcStatus) {
        assert_eq!(status, WcStatus::Success);
        assert_eq!(self.in_flight.take(), Some(req));
        self.completed += 1;
        pg.finish(req);
    }
}

/// Connects a host group to `addr` and runs `commands` round trips on it.
pub fn run(addr: SocketAddr, commands: u32) {
    let ch = CmChannel::new(ProviderKind::Soft).expect("CM channel");
    let id = ch.resolve(addr, None, patience(), 7).expect("resolve");
    let ctx = id.context().expect("id bound to a device");
    let cfg = PollGroupConfig {
        srq_depth: 64,
        max_qpairs: 2,
        max_queue_depth: 32,
        in_capsule_data_size: 0,
        io_unit_size: 4096,
        data_buffers: 16,
        max_requests: 32,
        ..PollGroupConfig::default()
    };
    let mut pg = PollGroup::<()>::new_host(&ctx, cfg, RecvMode::PerQpair { recvs: 32 }).unwrap();
    let mut h = Initiator::default();
    let qpn = pg.add_cm_qpair(id, 32, 1, 7).expect("host qpair");
    pg.connect(
        qpn,
        &ConnParam {
            private_data: request(1, 32, 31),
            responder_resources: 4,
            initiator_depth: 0,
            retry_count: 7,
            rnr_retry_count: 7,
        },
    )
    .expect("connect");
    let ev = ch.wait_event(patience()).expect("an answer to the connect");
    let CmEventKind::Established { private_data } = &ev.kind else {
        panic!("not accepted: {:?}", ev.kind);
    };
    assert_eq!(RdmaAccept::decode(private_data).unwrap().crqsize, 32);
    pg.handle_cm_event(&mut h, qpn, &ev.kind);
    assert_eq!(h.events, vec![QpairEvent::Active]);
    let handle = pg.qpair_handle(qpn).unwrap();
    for n in 0..commands {
        let req = pg.submit(handle).unwrap();
        assert_eq!(pg.alloc_buffers(req, 64).unwrap(), BufferGrant::Ready);
        let b = pg.buffer_mut(req, 0);
        b[..64].fill(0);
        b[..4].copy_from_slice(&n.to_le_bytes());
        let mut sge = [Sge::default(); 1];
        pg.buffer_sges(req, 64, &mut sge);
        let chain = [ChainWr {
            op: SendOp::Send,
            sges: &sge,
            inline: false,
        }];
        pg.post_chain(req, &chain, false).unwrap();
        h.in_flight = Some(req);
        let deadline = Instant::now() + patience();
        while h.completed <= n as u64 {
            pg.poll(&mut h).unwrap();
            assert!(Instant::now() < deadline, "command {n}: {:?}", pg.stats());
        }
    }
    assert_eq!(h.responses, commands as u64);
    assert_eq!(pg.requests_in_use(), 0);
    pg.disconnect(&mut h, qpn);
    let deadline = Instant::now() + patience();
    while pg.qpair_count() > 0 {
        pg.poll(&mut h).unwrap();
        assert!(Instant::now() < deadline, "drain: {:?}", pg.stats());
    }
    assert_eq!(pg.stats().drained_timeout, 0);
}
