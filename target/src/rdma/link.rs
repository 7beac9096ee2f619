//! The way back from a reactor to the acceptor: what a group reports about its qpairs
//! (placed, failed, gone) so the acceptor's routing tables stay true, and the placement slot a
//! gone qpair frees. Control path only: one message per qpair life event.

use std::sync::Arc;

use crossbeam_channel::Sender;
use nvmf_transport::AsyncEventKind;
use nvmf_transport::pollgroup::Placement;

/// A message to the acceptor thread.
#[derive(Debug)]
pub(crate) enum Control {
    /// The reactor created the QP of connection `token`: async events naming `qp_num` go to it.
    Placed {
        device: usize,
        token: u64,
        qp_num: u32,
    },
    /// Connection `token` never got a qpair (the group refused it).
    Failed { token: u64 },
    /// The qpair of connection `token` is out of its group and destroyed.
    Gone {
        device: usize,
        token: u64,
        qp_num: u32,
    },
    /// An async event of device `device` that no other owner in the process routes (the
    /// device's hub hands it over from whichever thread read it).
    Async { device: usize, kind: AsyncEventKind },
    /// Stop listening; refuse connect requests from now on. Answers on the sender.
    Quiesce(Sender<()>),
    /// Leave the thread.
    Stop,
}

/// What a group poller holds to reach the acceptor.
#[derive(Clone)]
pub(crate) struct GroupLink {
    pub device: usize,
    /// This group's index in the device's placement (= its reactor's position).
    pub group: usize,
    pub placement: Placement,
    pub tx: Sender<Control>,
    pub waker: Arc<mio::Waker>,
}

impl GroupLink {
    /// Tells the acceptor; a stopped acceptor is fine (nothing left to route).
    pub fn tell(&self, msg: Control) {
        if self.tx.send(msg).is_ok() {
            if let Err(e) = self.waker.wake() {
                tracing::warn!(error = %e, "cannot wake the acceptor");
            }
        }
    }
}
