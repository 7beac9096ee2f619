//! The RDMA transport of the target: per-core poll groups on reactors, and the control thread
//! that takes connections and routes connection and async events to the reactor owning each
//! qpair. NVMe command semantics are not here: the layer above plugs in a
//! `pollgroup::Handler`, one per group.
//!
//! - `group_poller.rs`: [`GroupPoller`], a poll group and its handler as a reactor poller
//!   (polling, idle sleep, connection set-up on its own CQ/SRQ, CM/async events, drain on stop).
//! - `acceptor.rs`: the control thread: CM channels, listeners, async-event fds, connect
//!   request checks, placement, and routing of events as messages.
//! - `connect.rs`: the accept/reject decision on NVMe-oF connect private data.
//! - `link.rs`: what reactors report back to the acceptor.
//! - `group_stats.rs`: [`GroupSnapshot`], a poll group's figures for the statistics.
//! - this file: the public face, [`RdmaTransport::start`] / [`RdmaTransport::stop`].
//!
//! # Threading
//! A poll group is created, polled, fed and dropped on its reactor's thread only. The acceptor
//! thread owns the CM ids until a connection is placed; the id then moves inside a message to
//! the chosen reactor, which builds the QP on its group's CQ and SRQ and accepts. From then on
//! the acceptor only forwards events (CM events by token, async events by qp_num) as messages.
//! The `Placement` counters are the one piece shared by both sides (atomics): the acceptor
//! counts a connection when it chooses, the reactor releases it when the qpair is gone.

mod acceptor;
mod connect;
mod group_poller;
mod group_stats;
mod link;

use std::marker::PhantomData;
use std::net::SocketAddr;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::Sender;
use nvmf_poller::{PollerError, ReactorHandle};
use nvmf_transport::pollgroup::{Handler, Placement, PollGroup};
use nvmf_transport::{AsyncHub, CmChannel, Context, TransportError};

pub use acceptor::AcceptorStats;
pub use connect::{ConnectLimits, Grant, decide};
pub use group_poller::{GroupInfo, GroupPoller};
pub use group_stats::{DataBuffers, GroupCounters, GroupSnapshot, RecvSlots, Requests};
pub use nvmf_transport::pollgroup::{PlacementPolicy, PollGroupConfig};

use acceptor::{Acceptor, Counters, DeviceSlot, GroupRef, LISTENER_BIT};
use link::{Control, GroupLink};

/// How often each group's handler does its slow work (`Handler::tick`).
const TICK: Duration = Duration::from_millis(50);
/// How long a control-path call to a poll group (statistics, inspection) waits for its reactor.
pub const GROUP_ANSWER: Duration = Duration::from_secs(5);

/// One device the target serves, and the addresses it listens on there.
#[derive(Clone)]
pub struct DeviceListen {
    pub ctx: Context,
    pub listen: Vec<SocketAddr>,
}

/// How to start the transport.
#[derive(Clone)]
pub struct RdmaConfig {
    pub devices: Vec<DeviceListen>,
    /// Sizing of each poll group (one per device and reactor). `max_queue_depth` is also the
    /// most a connection is granted.
    pub group: PollGroupConfig,
    pub placement: PlacementPolicy,
    /// Highest queue id a host may connect (the subsystem's I/O queue limit).
    pub max_qid: u16,
    /// Most RDMA READs the target issues at once per queue (capped by the device and the host).
    pub max_read_depth: u8,
    /// CM listen backlog.
    pub backlog: u32,
}

impl RdmaConfig {
    /// Defaults: SPDK-like poll groups, round robin, 64 I/O queues, 16 reads, backlog 128.
    pub fn new(devices: Vec<DeviceListen>) -> RdmaConfig {
        RdmaConfig {
            devices,
            group: PollGroupConfig::default(),
            placement: PlacementPolicy::RoundRobin,
            max_qid: 64,
            max_read_depth: 16,
            backlog: 128,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RdmaError {
    #[error("invalid RDMA transport configuration: {0}")]
    Config(&'static str),
    #[error(transparent)]
    Transport(#[from] TransportError),
    #[error("reactor {reactor}: {source}")]
    Reactor {
        reactor: usize,
        #[source]
        source: PollerError,
    },
    #[error("acceptor thread: {0}")]
    Io(#[from] std::io::Error),
    #[error("listen on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        #[source]
        source: TransportError,
    },
    #[error("{left} qpair(s) still draining after {timeout:?}; destroyed anyway")]
    DrainTimeout { left: usize, timeout: Duration },
}

pub type Result<T> = std::result::Result<T, RdmaError>;

/// A running RDMA transport. See the module documentation.
pub struct RdmaTransport<R, H> {
    /// [device][reactor]
    groups: Vec<Vec<GroupRef>>,
    placements: Vec<Placement>,
    listening: Vec<SocketAddr>,
    ctl: Sender<Control>,
    waker: Arc<mio::Waker>,
    counters: Arc<Counters>,
    thread: Option<JoinHandle<()>>,
    _types: PhantomData<fn() -> (R, H)>,
}

impl<R, H> RdmaTransport<R, H>
where
    R: Default + Send + 'static,
    H: Handler<R> + Send + 'static,
{
    /// Creates a poll group per device on every reactor in `reactors` (on the reactor's own
    /// thread), listens on every address, and starts the acceptor thread. `make_handler` is
    /// called once per group. Call from a control thread, not from a reactor.
    pub fn start(
        reactors: &[ReactorHandle],
        cfg: RdmaConfig,
        mut make_handler: impl FnMut(GroupInfo) -> H,
    ) -> Result<Self> {
        if cfg.devices.is_empty() {
            return Err(RdmaError::Config("no device to serve"));
        }
        if reactors.is_empty() {
            return Err(RdmaError::Config("no reactor to place connections on"));
        }
        let poll = mio::Poll::new()?;
        let waker = Arc::new(mio::Waker::new(poll.registry(), acceptor::WAKER)?);
        let (tx, rx) = crossbeam_channel::unbounded();

        let mut created: Vec<Vec<GroupRef>> = Vec::new();
        let mut slots = Vec::new();
        let built = (|| -> Result<()> {
            for (d, dev) in cfg.devices.iter().enumerate() {
                let attr = dev.ctx.query_device()?;
                let placement = Placement::new(cfg.placement, reactors.len());
                created.push(Vec::new());
                for (i, reactor) in reactors.iter().enumerate() {
                    let info = GroupInfo {
                        device: d,
                        reactor: i,
                    };
                    let handler = make_handler(info);
                    let link = GroupLink {
                        device: d,
                        group: i,
                        placement: placement.clone(),
                        tx: tx.clone(),
                        waker: waker.clone(),
                    };
                    let ctx = dev.ctx.clone();
                    let gcfg = cfg.group.clone();
                    let poller = reactor
                        .call(move |r| {
                            let pg = PollGroup::<R>::new(&ctx, gcfg)?;
                            let pid =
                                r.add_poller(Box::new(GroupPoller::new(pg, handler, info, link)));
                            // The handler's slow work runs on a timer, so it happens while the
                            // reactor sleeps too; the timer ends when the group is gone.
                            let timer = std::rc::Rc::new(std::cell::Cell::new(None));
                            let own = timer.clone();
                            let id = r.add_timer(TICK, Some(TICK), move |r| {
                                match r.poller_mut::<GroupPoller<R, H>>(pid) {
                                    Some(g) => g.tick(),
                                    None => {
                                        if let Some(t) = own.take() {
                                            r.cancel_timer(t);
                                        }
                                    }
                                }
                            });
                            timer.set(Some(id));
                            Ok::<_, TransportError>(pid)
                        })
                        .map_err(|source| RdmaError::Reactor { reactor: i, source })??;
                    created[d].push(GroupRef {
                        reactor: reactor.clone(),
                        poller,
                    });
                }
                let max_read = u8::try_from(attr.max_qp_init_rd_atom).unwrap_or(u8::MAX);
                let hub = AsyncHub::of(&dev.ctx);
                let (to_acceptor, wake) = (tx.clone(), waker.clone());
                let listener = hub.listen(Arc::new(move |kind| {
                    if to_acceptor.send(Control::Async { device: d, kind }).is_ok() {
                        let _ = wake.wake();
                    }
                }));
                slots.push(DeviceSlot {
                    ctx: dev.ctx.clone(),
                    hub,
                    _listener: listener,
                    groups: created[d].clone(),
                    placement,
                    limits: ConnectLimits {
                        max_queue_depth: u16::try_from(cfg.group.max_queue_depth)
                            .unwrap_or(u16::MAX),
                        max_qid: cfg.max_qid,
                        max_read_depth: cfg.max_read_depth.min(max_read),
                    },
                });
            }
            Ok(())
        })();
        if let Err(e) = built {
            remove_groups::<R, H>(&created);
            return Err(e);
        }

        let listened =
            (|| -> Result<(Vec<CmChannel>, Vec<nvmf_transport::CmId>, Vec<SocketAddr>)> {
                let mut channels: Vec<CmChannel> = Vec::new();
                let mut listeners = Vec::new();
                let mut addrs = Vec::new();
                for dev in &cfg.devices {
                    let kind = dev.ctx.kind();
                    let ch = match channels.iter().find(|c| c.kind() == kind) {
                        Some(c) => c.clone(),
                        None => {
                            let c = CmChannel::new(kind)?;
                            channels.push(c.clone());
                            c
                        }
                    };
                    for &addr in &dev.listen {
                        let token = LISTENER_BIT | listeners.len() as u64;
                        let id = ch
                            .listen(addr, cfg.backlog, token)
                            .map_err(|source| RdmaError::Listen { addr, source })?;
                        addrs.push(id.local_addr().unwrap_or(addr));
                        tracing::info!(%addr, device = dev.ctx.name(), "listening");
                        listeners.push(id);
                    }
                }
                Ok((channels, listeners, addrs))
            })();
        let (channels, listeners, listening) = match listened {
            Ok(x) => x,
            Err(e) => {
                remove_groups::<R, H>(&created);
                return Err(e);
            }
        };
        let placements = slots.iter().map(|s| s.placement.clone()).collect();
        let counters = Arc::new(Counters::default());
        let acceptor =
            match Acceptor::<R, H>::new(channels, listeners, slots, rx, poll, counters.clone()) {
                Ok(a) => a,
                Err(e) => {
                    remove_groups::<R, H>(&created);
                    return Err(e.into());
                }
            };
        let thread = std::thread::Builder::new()
            .name("nvmf-acceptor".into())
            .spawn(move || acceptor.run());
        let thread = match thread {
            Ok(t) => t,
            Err(e) => {
                remove_groups::<R, H>(&created);
                return Err(e.into());
            }
        };
        Ok(RdmaTransport {
            groups: created,
            placements,
            listening,
            ctl: tx,
            waker,
            counters,
            thread: Some(thread),
            _types: PhantomData,
        })
    }

    /// The addresses listened on (as bound).
    pub fn listening(&self) -> &[SocketAddr] {
        &self.listening
    }

    /// The acceptor's counters.
    pub fn acceptor_stats(&self) -> AcceptorStats {
        self.counters.snapshot()
    }

    /// Connections counted on `device`'s group of `reactor` by the placement.
    pub fn load(&self, device: usize, reactor: usize) -> u32 {
        self.placements.get(device).map_or(0, |p| p.load(reactor))
    }

    /// Runs `f` on a group, on its reactor's thread, and waits for the result (control path;
    /// None when that group does not exist; an error when the reactor does not answer within
    /// [`GROUP_ANSWER`], so a stuck reactor cannot hang the daemon's signal loop).
    pub fn with_group<T, F>(&self, device: usize, reactor: usize, f: F) -> Result<Option<T>>
    where
        T: Send + 'static,
        F: FnOnce(&mut GroupPoller<R, H>) -> T + Send + 'static,
    {
        let Some(g) = self.groups.get(device).and_then(|d| d.get(reactor)) else {
            return Ok(None);
        };
        let pid = g.poller;
        g.reactor
            .call_timeout(GROUP_ANSWER, move |r| {
                r.poller_mut::<GroupPoller<R, H>>(pid).map(f)
            })
            .map_err(|source| RdmaError::Reactor { reactor, source })
    }

    /// Runs `f` on every group (each on its own reactor, one after the other; control path)
    /// and returns what each gave with the group it came from, by device then reactor. Groups
    /// already removed from their reactor are left out; a reactor that cannot take the
    /// message is an error.
    pub fn each_group<T, F>(&self, f: F) -> Result<Vec<(GroupInfo, T)>>
    where
        T: Send + 'static,
        F: Fn(&mut GroupPoller<R, H>) -> T + Clone + Send + 'static,
    {
        let mut out = Vec::new();
        for (device, groups) in self.groups.iter().enumerate() {
            for reactor in 0..groups.len() {
                if let Some(v) = self.with_group(device, reactor, f.clone())? {
                    out.push((GroupInfo { device, reactor }, v));
                }
            }
        }
        Ok(out)
    }

    /// Stops taking connections, drains every qpair (bounded by `timeout`), removes the poll
    /// groups from their reactors (dropped on their own threads) and stops the acceptor. The
    /// acceptor keeps routing async events meanwhile, so drains end on LAST_WQE_REACHED.
    pub fn stop(mut self, timeout: Duration) -> Result<()> {
        let (ack_tx, ack_rx) = crossbeam_channel::bounded(1);
        self.tell(Control::Quiesce(ack_tx));
        let _ = ack_rx.recv_timeout(Duration::from_secs(5));

        let deadline = Instant::now() + timeout;
        let mut left;
        loop {
            left = 0;
            for g in self.groups.iter().flatten() {
                let pid = g.poller;
                // A stopped reactor dropped its groups already.
                left += g
                    .reactor
                    .call(move |r| {
                        r.poller_mut::<GroupPoller<R, H>>(pid).map_or(0, |gp| {
                            let done = gp.quiesce();
                            gp.poll_group().qpair_count().max(usize::from(!done))
                        })
                    })
                    .unwrap_or(0);
            }
            if left == 0 || Instant::now() >= deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        remove_groups::<R, H>(&self.groups);
        self.shutdown_acceptor();
        if left > 0 {
            return Err(RdmaError::DrainTimeout { left, timeout });
        }
        Ok(())
    }

    fn tell(&self, msg: Control) {
        if self.ctl.send(msg).is_ok() {
            let _ = self.waker.wake();
        }
    }
}

impl<R, H> RdmaTransport<R, H> {
    fn shutdown_acceptor(&mut self) {
        if let Some(t) = self.thread.take() {
            if self.ctl.send(Control::Stop).is_ok() {
                let _ = self.waker.wake();
            }
            if t.join().is_err() {
                tracing::error!("the acceptor thread panicked");
            }
        }
    }
}

impl<R, H> Drop for RdmaTransport<R, H> {
    /// Without `stop`: the acceptor stops; the groups stay on their reactors and drain when the
    /// runtime stops.
    fn drop(&mut self) {
        self.shutdown_acceptor();
    }
}

/// Takes the groups off their reactors; each is dropped on its own thread.
fn remove_groups<R, H>(groups: &[Vec<GroupRef>])
where
    R: Default + Send + 'static,
    H: Handler<R> + Send + 'static,
{
    for g in groups.iter().flatten() {
        let pid = g.poller;
        let _ = g.reactor.call(move |r| {
            drop(r.take_poller::<GroupPoller<R, H>>(pid));
        });
    }
}
