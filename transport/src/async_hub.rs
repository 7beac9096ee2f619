//! One device's async events, shared by everything in the process that owns QPs on it.
//!
//! A device's async events come out of one queue per process: librdmacm opens each device
//! once and every CM id's QP is made on that context, and the soft provider keeps one queue per
//! device. A process running a target and a host on the same device (the in-process bench,
//! tests) has two owners of QPs and one queue: whoever reads an event must hand it to the
//! owner of the QP it names, or a drain waits for a LAST_WQE_REACHED someone else swallowed.
//!
//! [`AsyncHub::of`] gives the process's hub of a device. An owner either routes its QPs
//! ([`AsyncHub::route`]: events naming that qp_num go to its sink) or listens
//! ([`AsyncHub::listen`]: events no route claims, e.g. the target's acceptor, which keeps its
//! own qp_num table). Events of no QP (CQ, SRQ, port, device) go to every distinct sink once.
//! [`AsyncHub::pump`] reads whatever is pending and delivers it; any owner may pump, from any
//! thread (control path: a mutex, a syscall on verbs). Sinks run on the pumping thread, so
//! they only hand the event over (a channel send, a wake-up).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use crate::device::Context;
use crate::types::{AsyncEventKind, ProviderKind};

/// Where an owner's events go. Runs on the pumping thread: it must only hand the event over.
pub type AsyncSink = Arc<dyn Fn(AsyncEventKind) + Send + Sync>;

/// The async events of one device in this process (see the module documentation).
#[derive(Clone)]
pub struct AsyncHub {
    inner: Arc<HubInner>,
}

struct HubInner {
    ctx: Context,
    sinks: Mutex<Sinks>,
    next_id: AtomicU64,
}

#[derive(Default)]
struct Sinks {
    /// qp_num -> (registration id, sink).
    routes: HashMap<u32, (u64, AsyncSink)>,
    /// (registration id, sink) of every listener.
    listeners: Vec<(u64, AsyncSink)>,
}

/// Hubs by device: weak, so a hub goes with its last user.
fn hubs() -> MutexGuard<'static, Vec<(ProviderKind, String, Weak<HubInner>)>> {
    static HUBS: Mutex<Vec<(ProviderKind, String, Weak<HubInner>)>> = Mutex::new(Vec::new());
    HUBS.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl AsyncHub {
    /// The hub of `ctx`'s device, made on first use.
    pub fn of(ctx: &Context) -> AsyncHub {
        let mut hubs = hubs();
        let (kind, name) = (ctx.kind(), ctx.name());
        if let Some(inner) = hubs
            .iter()
            .find(|(k, n, _)| *k == kind && n == name)
            .and_then(|(_, _, hub)| hub.upgrade())
        {
            return AsyncHub { inner };
        }
        hubs.retain(|(_, _, hub)| hub.strong_count() > 0);
        let inner = Arc::new(HubInner {
            ctx: ctx.clone(),
            sinks: Mutex::default(),
            next_id: AtomicU64::new(1),
        });
        hubs.push((kind, name.to_string(), Arc::downgrade(&inner)));
        AsyncHub { inner }
    }

    /// Events naming `qp_num` go to `sink` until the returned guard drops (or a later route
    /// of the same number replaces this one: QP numbers are reused).
    pub fn route(&self, qp_num: u32, sink: AsyncSink) -> AsyncRoute {
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        self.inner.sinks().routes.insert(qp_num, (id, sink));
        AsyncRoute {
            hub: self.inner.clone(),
            qp_num,
            id,
        }
    }

    /// Events no route claims, and those of no QP, go to `sink` until the guard drops.
    pub fn listen(&self, sink: AsyncSink) -> AsyncListener {
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        self.inner.sinks().listeners.push((id, sink));
        AsyncListener {
            hub: self.inner.clone(),
            id,
        }
    }

    /// Reads every pending event of the device and delivers each; returns how many it read.
    /// An event nobody routes or listens for is logged and dropped.
    pub fn pump(&self) -> usize {
        let mut read = 0;
        loop {
            match self.inner.ctx.poll_async_event() {
                Ok(Some(event)) => {
                    read += 1;
                    self.deliver(event.kind);
                }
                Ok(None) => return read,
                Err(e) => {
                    tracing::warn!(device = self.inner.ctx.name(), error = %e, "reading async events failed");
                    return read;
                }
            }
        }
    }

    /// The fd that is readable while an event is pending (to sleep on).
    pub fn fd(&self) -> std::os::fd::RawFd {
        self.inner.ctx.async_fd()
    }

    fn deliver(&self, kind: AsyncEventKind) {
        // Sinks run outside the lock: one may route or listen in turn.
        let targets: Vec<AsyncSink> = {
            let sinks = self.inner.sinks();
            match kind.qp_num() {
                Some(qp_num) => match sinks.routes.get(&qp_num) {
                    Some((_, sink)) => vec![sink.clone()],
                    None => sinks.listeners.iter().map(|(_, s)| s.clone()).collect(),
                },
                None => {
                    let mut all: Vec<AsyncSink> = Vec::new();
                    let every = sinks.routes.values().chain(&sinks.listeners);
                    for (_, sink) in every {
                        if !all.iter().any(|s| Arc::ptr_eq(s, sink)) {
                            all.push(sink.clone());
                        }
                    }
                    all
                }
            }
        };
        if targets.is_empty() {
            tracing::debug!(
                device = self.inner.ctx.name(),
                ?kind,
                "async event nobody here owns"
            );
        }
        for sink in targets {
            sink(kind);
        }
    }
}

impl HubInner {
    fn sinks(&self) -> MutexGuard<'_, Sinks> {
        self.sinks
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// A QP's route in its device's hub; dropping it ends the route.
pub struct AsyncRoute {
    hub: Arc<HubInner>,
    qp_num: u32,
    id: u64,
}

impl Drop for AsyncRoute {
    fn drop(&mut self) {
        let mut sinks = self.hub.sinks();
        // A later route of the same number is not this one's to end.
        if sinks
            .routes
            .get(&self.qp_num)
            .is_some_and(|(id, _)| *id == self.id)
        {
            sinks.routes.remove(&self.qp_num);
        }
    }
}

/// A listener in a device's hub; dropping it ends the listening.
pub struct AsyncListener {
    hub: Arc<HubInner>,
    id: u64,
}

impl Drop for AsyncListener {
    fn drop(&mut self) {
        self.hub.sinks().listeners.retain(|(id, _)| *id != self.id);
    }
}

#[cfg(all(test, feature = "soft"))]
mod tests {
    use super::*;
    use crate::device::DeviceSpec;
    use crate::types::SoftConfig;
    use std::sync::mpsc::{Receiver, channel};

    /// A fresh soft device and its hub.
    fn device(name: &str) -> (Context, AsyncHub) {
        let ctx = Context::open(&DeviceSpec::Soft(SoftConfig {
            name: name.into(),
            ..SoftConfig::default()
        }))
        .unwrap();
        let hub = AsyncHub::of(&ctx);
        (ctx, hub)
    }

    fn sink() -> (AsyncSink, Receiver<AsyncEventKind>) {
        let (tx, rx) = channel();
        (
            Arc::new(move |kind| {
                let _ = tx.send(kind);
            }),
            rx,
        )
    }

    fn raise(ctx: &Context, kind: AsyncEventKind) {
        ctx.as_soft().unwrap().inner.raise(kind);
    }

    fn last_wqe(qp_num: u32) -> AsyncEventKind {
        AsyncEventKind::QpLastWqeReached { qp_num }
    }

    #[test]
    fn an_event_goes_to_the_route_of_its_qp_and_the_rest_to_listeners() {
        let (ctx, hub) = device("hub-route");
        let (host, host_rx) = sink();
        let (target, target_rx) = sink();
        let _route = hub.route(7, host);
        // A second `of` for the device is the same hub.
        let _listener = AsyncHub::of(&ctx).listen(target);
        raise(&ctx, last_wqe(7));
        raise(&ctx, last_wqe(8));
        assert_eq!(hub.pump(), 2);
        assert_eq!(host_rx.try_iter().collect::<Vec<_>>(), [last_wqe(7)]);
        assert_eq!(target_rx.try_iter().collect::<Vec<_>>(), [last_wqe(8)]);
    }

    #[test]
    fn an_event_of_no_qp_reaches_every_sink_once() {
        let (ctx, hub) = device("hub-device-wide");
        let (host, host_rx) = sink();
        let (target, target_rx) = sink();
        // One owner's sink behind two routes hears a device-wide event once.
        let _a = hub.route(7, host.clone());
        let _b = hub.route(9, host);
        let _listener = hub.listen(target);
        raise(&ctx, AsyncEventKind::DeviceFatal);
        hub.pump();
        assert_eq!(host_rx.try_iter().count(), 1);
        assert_eq!(target_rx.try_iter().count(), 1);
    }

    #[test]
    fn a_dropped_route_ends_only_itself() {
        let (ctx, hub) = device("hub-drop");
        let (old, old_rx) = sink();
        let (new, new_rx) = sink();
        let (target, target_rx) = sink();
        let _listener = hub.listen(target);
        let first = hub.route(7, old);
        // The number is reused before the first owner lets go of it.
        let _second = hub.route(7, new);
        drop(first);
        raise(&ctx, last_wqe(7));
        hub.pump();
        assert_eq!(new_rx.try_iter().count(), 1, "the newer route still holds");
        assert_eq!(old_rx.try_iter().count(), 0);
        drop(_second);
        raise(&ctx, last_wqe(7));
        hub.pump();
        assert_eq!(target_rx.try_iter().count(), 1, "unrouted: to the listener");
    }

    #[test]
    fn a_dropped_listener_hears_nothing_more() {
        let (ctx, hub) = device("hub-listener");
        let (target, target_rx) = sink();
        let listener = hub.listen(target);
        drop(listener);
        raise(&ctx, last_wqe(3));
        assert_eq!(hub.pump(), 1, "read and dropped");
        assert_eq!(target_rx.try_iter().count(), 0);
    }
}
