//! Control-path sleeping on a file descriptor (CM channels, completion channels, async fds).

use std::os::fd::RawFd;
use std::time::Duration;

use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token};

use crate::error::Result;

/// Waits until `fd` is readable or `timeout` passes. Returns whether it became readable.
/// Builds an epoll instance per call: for control paths only, never per I/O.
pub fn wait_readable(fd: RawFd, timeout: Duration) -> Result<bool> {
    let mut poll = Poll::new()?;
    poll.registry()
        .register(&mut SourceFd(&fd), Token(0), Interest::READABLE)?;
    let mut events = Events::with_capacity(1);
    match poll.poll(&mut events, Some(timeout)) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => return Ok(false),
        Err(e) => return Err(e.into()),
    }
    Ok(!events.is_empty())
}
