//! Completion channels, and the pollable event queue they share with the device's async events
//! and the CM's event channels.
//!
//! An [`EventQueue`] is a mutex-protected queue plus a Unix socket pair whose read end is the
//! pollable fd: it is readable exactly while the queue is non-empty (one byte is written when
//! the queue becomes non-empty and drained when it empties). These are control-path or
//! armed-only paths: a busy-polled CQ never touches its channel.

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};

use crate::error::{Result, TransportError};
use crate::provider::CompChannelOps;

pub(crate) struct EventQueue<T> {
    q: Mutex<VecDeque<T>>,
    rx: UnixStream,
    tx: UnixStream,
}

impl<T> EventQueue<T> {
    pub(crate) fn new() -> Result<EventQueue<T>> {
        let (rx, tx) = nonblocking_pair()?;
        Ok(EventQueue {
            q: Mutex::new(VecDeque::new()),
            rx,
            tx,
        })
    }

    /// Events queued, not read yet.
    #[cfg(test)]
    pub(crate) fn queued(&self) -> usize {
        self.q.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    pub(crate) fn fd(&self) -> RawFd {
        self.rx.as_raw_fd()
    }

    pub(crate) fn push(&self, ev: T) {
        let mut q = self.q.lock().unwrap_or_else(|e| e.into_inner());
        if q.is_empty() {
            // Non-blocking; a full socket buffer is impossible with one byte outstanding.
            let _ = (&self.tx).write(&[1]);
        }
        q.push_back(ev);
    }

    pub(crate) fn pop(&self) -> Option<T> {
        let mut q = self.q.lock().unwrap_or_else(|e| e.into_inner());
        let ev = q.pop_front();
        if ev.is_some() && q.is_empty() {
            let mut b = [0u8; 16];
            while matches!((&self.rx).read(&mut b), Ok(n) if n > 0) {}
        }
        ev
    }
}

/// A connected Unix socket pair, non-blocking from its creation (`SOCK_NONBLOCK`, rather than
/// std's pair and a `FIONBIO` ioctl per end afterwards: one call, and one Miri can run).
fn nonblocking_pair() -> Result<(UnixStream, UnixStream)> {
    let mut fds: [libc::c_int; 2] = [-1; 2];
    // SAFETY: `fds` is a writable array of two ints, as socketpair(2) asks; nothing else is
    // read or written.
    let rc = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    };
    if rc != 0 {
        return Err(TransportError::last_os("socketpair"));
    }
    // SAFETY: on success socketpair(2) returned two new open descriptors that nothing else
    // owns; each becomes owned exactly once here.
    let (a, b) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    Ok((UnixStream::from(a), UnixStream::from(b)))
}

/// A completion channel of a soft device: ids of armed CQs that got a completion.
#[derive(Clone)]
pub struct SoftCompChannel {
    pub(crate) inner: Arc<EventQueue<u32>>,
}

impl SoftCompChannel {
    pub(crate) fn new() -> Result<SoftCompChannel> {
        Ok(SoftCompChannel {
            inner: Arc::new(EventQueue::new()?),
        })
    }
}

impl CompChannelOps for SoftCompChannel {
    fn fd(&self) -> RawFd {
        self.inner.fd()
    }
    fn get_event(&self) -> Result<Option<u32>> {
        Ok(self.inner.pop())
    }
}
