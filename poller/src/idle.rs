//! The epoll side of idle mode: the reactor's `mio::Poll`, the set of fds pollers armed, and the
//! sleep itself. Only used on the way into and out of a sleep, never on the busy path.
//!
//! mio registers edge-triggered. Each sleep therefore first flushes stale readiness (events that
//! fired while the reactor was busy and were handled by polling), then (re)registers every armed
//! fd with `EPOLL_CTL_MOD`/`ADD`, which makes the kernel re-check readiness: an fd that is
//! readable right now still wakes the sleep at once, so nothing is lost to the flush.

use std::io;
use std::os::fd::RawFd;
use std::time::Duration;

use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token};

use crate::poller::WakeFds;

/// Token of the eventfd that `ReactorHandle::send` writes to wake a sleeping reactor.
pub(crate) const WAKER_TOKEN: Token = Token(usize::MAX);

const EVENTS_CAPACITY: usize = 64;

pub(crate) struct Sleeper {
    poll: Poll,
    events: Events,
    /// Filled by `Poller::arm` for the coming sleep.
    pub(crate) armed: WakeFds,
    /// Fds currently registered with epoll (sorted).
    registered: Vec<RawFd>,
}

impl Sleeper {
    pub(crate) fn new(poll: Poll) -> Self {
        Sleeper {
            poll,
            events: Events::with_capacity(EVENTS_CAPACITY),
            armed: WakeFds::default(),
            registered: Vec::new(),
        }
    }

    /// Drop readiness events left from busy time, so the next wait reports only fresh ones.
    pub(crate) fn flush(&mut self) {
        if let Err(e) = self.poll.poll(&mut self.events, Some(Duration::ZERO)) {
            tracing::debug!(error = %e, "flushing stale epoll events");
        }
    }

    /// Make epoll watch exactly the fds in `armed` (and the waker, always registered).
    pub(crate) fn register_armed(&mut self) {
        let armed = &mut self.armed.fds;
        armed.sort_unstable();
        armed.dedup();
        let registry = self.poll.registry();

        // Fds no poller armed this time (poller removed, or it has nothing to wait for).
        for fd in &self.registered {
            if armed.binary_search(fd).is_err() {
                // The fd may already be closed (epoll then dropped it itself): ignore errors.
                let _ = registry.deregister(&mut SourceFd(fd));
            }
        }

        armed.retain(|&fd| {
            if fd < 0 {
                tracing::warn!(fd, "poller armed a negative fd; ignored");
                return false;
            }
            // Fds are non-negative, so the cast is lossless; tokens are never read back.
            let token = Token(fd as usize);
            let mut src = SourceFd(&fd);
            let was = self.registered.binary_search(&fd).is_ok();
            // MOD an fd we registered earlier; if it was closed and its number reused, epoll
            // forgot it (ENOENT), so ADD it. ADD a new fd; EEXIST means someone else's stale
            // registration, so MOD it.
            let res = if was {
                registry
                    .reregister(&mut src, token, Interest::READABLE)
                    .or_else(|_| registry.register(&mut src, token, Interest::READABLE))
            } else {
                registry
                    .register(&mut src, token, Interest::READABLE)
                    .or_else(|e| match e.kind() {
                        io::ErrorKind::AlreadyExists => {
                            registry.reregister(&mut src, token, Interest::READABLE)
                        }
                        _ => Err(e),
                    })
            };
            match res {
                Ok(()) => true,
                Err(e) => {
                    tracing::warn!(fd, error = %e, "cannot watch armed fd; ignored");
                    false
                }
            }
        });
        self.registered.clear();
        self.registered.extend_from_slice(armed);
    }

    /// Sleep until an fd is readable, the waker fires or `timeout` passes (`None`: no limit).
    /// Returns true if woken by an fd or a message rather than the timeout.
    pub(crate) fn wait(&mut self, timeout: Option<Duration>) -> bool {
        match self.poll.poll(&mut self.events, timeout) {
            Ok(()) => !self.events.is_empty(),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => true,
            Err(e) => {
                tracing::warn!(error = %e, "epoll_wait failed; back to polling");
                true
            }
        }
    }
}
