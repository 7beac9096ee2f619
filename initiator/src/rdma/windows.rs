//! Per-command memory windows (the `per_io_keys` option): a pool of type-2 windows on the
//! queue's PD, each bound over one command's share of the data region under a fresh rkey, bound
//! in the same chain as the command's SEND, and invalidated by the target's
//! SEND_WITH_INVALIDATE (or locally before the window's next bind when the target did not).
//! No long-lived rkey then exposes the host's memory.

use std::ops::Range;

use nvmf_transport::{Access, Mr, Mw, Pd, SendOp};

/// Where one window is in its life.
#[derive(Debug, Clone)]
enum WindowState {
    /// Unbound: free to bind.
    Free,
    /// Still bound under `rkey` (the target did not invalidate it): a LOCAL_INV goes first.
    Stale { rkey: u32 },
    /// Bind built for the next submission, not posted yet.
    Prepared {
        bind: SendOp,
        rkey: u32,
        range: Range<usize>,
        stale: Option<u32>,
    },
    /// Bound and named by a command in flight.
    InUse { rkey: u32 },
}

/// The window pool of one queue.
pub(super) struct Windows {
    mws: Vec<Mw>,
    state: Vec<WindowState>,
    next: usize,
}

/// What a submission posts before its SEND for a prepared window.
pub(super) struct Posting {
    pub(super) invalidate: Option<SendOp>,
    pub(super) bind: SendOp,
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
            let stale = match &self.state[i] {
                WindowState::Free => None,
                WindowState::Stale { rkey } => Some(*rkey),
                // Never posted: still whatever it was before (its old key, if any, stays stale).
                WindowState::Prepared { stale, .. } => *stale,
                WindowState::InUse { .. } => continue,
            };
            let access = Access::REMOTE_READ | Access::REMOTE_WRITE;
            let Ok(bind) = self.mws[i].bind(mr, range.start, range.len(), access) else {
                continue;
            };
            let rkey = self.mws[i].rkey();
            self.state[i] = WindowState::Prepared {
                bind,
                rkey,
                range,
                stale,
            };
            self.next = (i + 1) % n;
            return Some(rkey);
        }
        None
    }

    /// The window a submission names by `rkey`, if prepared: what to post, and it is in use
    /// from now on. Returns (window index, posting).
    pub(super) fn take(&mut self, rkey: u32) -> Option<(usize, Posting)> {
        let i = self
            .state
            .iter()
            .position(|s| matches!(s, WindowState::Prepared { rkey: k, .. } if *k == rkey))?;
        let WindowState::Prepared { bind, stale, .. } =
            std::mem::replace(&mut self.state[i], WindowState::InUse { rkey })
        else {
            return None;
        };
        Some((
            i,
            Posting {
                invalidate: stale.map(|rkey| SendOp::LocalInv { rkey }),
                bind,
            },
        ))
    }

    /// Command on window `index` answered; `invalidated` is the rkey its response's
    /// SEND_WITH_INVALIDATE invalidated, if any.
    pub(super) fn answered(&mut self, index: usize, invalidated: Option<u32>) {
        if let Some(WindowState::InUse { rkey }) = self.state.get(index).cloned() {
            self.state[index] = if invalidated == Some(rkey) {
                WindowState::Free
            } else {
                WindowState::Stale { rkey }
            };
        }
    }

    /// A posting that never reached the queue: the window goes back as it was.
    pub(super) fn unpost(&mut self, index: usize, stale: Option<u32>) {
        if let Some(s) = self.state.get_mut(index) {
            *s = match stale {
                Some(rkey) => WindowState::Stale { rkey },
                None => WindowState::Free,
            };
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
