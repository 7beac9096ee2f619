//! Per-command memory windows (the `per_io_keys` option): a pool of type-2 windows on the
//! queue's PD, each bound over one command's share of the data region under a fresh rkey, bound
//! in the same chain as the command's SEND, and invalidated by the target's
//! SEND_WITH_INVALIDATE, or by the host's own LOCAL_INV before the command is reported when
//! the target did not (as the Linux host does): once a command is reported, no key of it lets
//! the target into the host's memory, which the consumer may then reuse.

use std::ops::Range;

use nvmf_transport::{Access, Mr, Mw, Pd, SendOp};

/// Where one window is in its life.
#[derive(Debug, Clone)]
enum WindowState {
    /// Unbound: free to bind.
    Free,
    /// Bind built for the next submission, not posted yet.
    Prepared {
        bind: SendOp,
        rkey: u32,
        range: Range<usize>,
    },
    /// Bound and named by a command in flight (until the target invalidates it in its
    /// response, or the host's LOCAL_INV completes).
    InUse { rkey: u32 },
}

/// The window pool of one queue.
pub(super) struct Windows {
    mws: Vec<Mw>,
    state: Vec<WindowState>,
    next: usize,
}

impl Windows {
    /// `count` windows on `pd`, or None when the device has no memory windows.
    pub(super) fn new(pd: &Pd, count: usize) -> Option<Windows> {
        let mut mws = Vec::with_capacity(count);
        for _ in 0..count {
            match pd.alloc_mw() {
                Ok(mw) => mws.push(mw),
                Err(e) => {
                    tracing::debug!(%e, "no memory windows: per-I/O keys fall back to the region key");
                    return None;
                }
            }
        }
        tracing::debug!(count, "memory windows for per-I/O keys");
        Some(Windows {
            state: vec![WindowState::Free; count],
            mws,
            next: 0,
        })
    }

    /// Builds a bind of a free window over `range` of `mr`; returns its rkey. None when every
    /// window is in use.
    pub(super) fn prepare(&mut self, mr: &Mr, range: Range<usize>) -> Option<u32> {
        let n = self.mws.len();
        for step in 0..n {
            let i = (self.next + step) % n;
            // A prepared window was never posted: still unbound.
            if matches!(self.state[i], WindowState::InUse { .. }) {
                continue;
            }
            let access = Access::REMOTE_READ | Access::REMOTE_WRITE;
            let Ok(bind) = self.mws[i].bind(mr, range.start, range.len(), access) else {
                continue;
            };
            let rkey = self.mws[i].rkey();
            self.state[i] = WindowState::Prepared { bind, rkey, range };
            self.next = (i + 1) % n;
            return Some(rkey);
        }
        None
    }

    /// The window a submission names by `rkey`, if prepared: its bind to post before the
    /// SEND, and it is in use from now on. Returns (window index, bind).
    pub(super) fn take(&mut self, rkey: u32) -> Option<(usize, SendOp)> {
        let i = self
            .state
            .iter()
            .position(|s| matches!(s, WindowState::Prepared { rkey: k, .. } if *k == rkey))?;
        let WindowState::Prepared { bind, .. } =
            std::mem::replace(&mut self.state[i], WindowState::InUse { rkey })
        else {
            return None;
        };
        Some((i, bind))
    }

    /// The key window `index` is bound under while a command uses it.
    pub(super) fn in_use_key(&self, index: usize) -> Option<u32> {
        match self.state.get(index) {
            Some(WindowState::InUse { rkey }) => Some(*rkey),
            _ => None,
        }
    }

    /// Window `index`'s key is dead (the target's SEND_WITH_INVALIDATE or the host's
    /// LOCAL_INV ended it), or its bind never reached the queue: free to bind again.
    pub(super) fn free(&mut self, index: usize) {
        if let Some(s) = self.state.get_mut(index) {
            *s = WindowState::Free;
        }
    }

    /// Range of the window prepared under `rkey`.
    pub(super) fn prepared_range(&self, rkey: u32) -> Option<Range<usize>> {
        self.state.iter().find_map(|s| match s {
            WindowState::Prepared { rkey: k, range, .. } if *k == rkey => Some(range.clone()),
            _ => None,
        })
    }
}
