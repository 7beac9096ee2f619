//! The loopback queue: executes each capsule on the fake target at submit time and hands the
//! response back on the next poll (so commands are really "in flight" between the two).

use std::collections::{HashMap, VecDeque};
use std::ops::Range;

use nvmf_protocol::{Cqe, SglDescriptor, Sqe};

use super::target::{Capsule, LoopbackTarget};
use crate::queue::{ConnectError, DataRegion, HostQueue, QueueConnectParams, QueueError};

/// Base of the fake remote addresses: each queue's region sits at its own offset.
const REGION_BASE: u64 = 0x7f00_0000_0000;

/// One loopback queue.
#[derive(Debug)]
pub struct LoopbackQueue {
    target: LoopbackTarget,
    qid: u16,
    depth: u16,
    region: Vec<u8>,
    region_info: DataRegion,
    /// The target's connection epoch when this queue connected; a different epoch = dropped.
    epoch: u64,
    /// Controller this queue belongs to, learned from the Connect response.
    cntlid: Option<u16>,
    responses: VecDeque<Cqe>,
    in_capsule_limit: usize,
    connected: bool,
    sqhd: u16,
    /// Windows bound and not yet used: key -> region range.
    windows: HashMap<u32, Range<usize>>,
}

impl LoopbackQueue {
    pub(super) fn connect(
        target: LoopbackTarget,
        params: &QueueConnectParams,
    ) -> Result<Self, ConnectError> {
        let (epoch, key, depth) = target.accept(params)?;
        let address = REGION_BASE + (u64::from(key) << 32);
        Ok(Self {
            target,
            qid: params.qid,
            depth,
            region: vec![0; params.data_region_len],
            region_info: DataRegion {
                address,
                key,
                len: params.data_region_len,
            },
            epoch,
            cntlid: None,
            responses: VecDeque::new(),
            in_capsule_limit: params.in_capsule_data,
            connected: true,
            sqhd: 0,
            windows: HashMap::new(),
        })
    }

    fn check_link(&mut self) -> Result<(), QueueError> {
        if self.connected && self.target.epoch() != self.epoch {
            self.lose();
        }
        if self.connected {
            Ok(())
        } else {
            Err(QueueError::Disconnected(format!(
                "loopback queue {} disconnected",
                self.qid
            )))
        }
    }

    fn lose(&mut self) {
        self.connected = false;
        // Responses not yet delivered are lost with the connection, as on a real fabric.
        self.responses.clear();
    }
}

impl HostQueue for LoopbackQueue {
    fn qid(&self) -> u16 {
        self.qid
    }
    fn depth(&self) -> u16 {
        self.depth
    }
    fn region(&self) -> DataRegion {
        self.region_info
    }
    fn region_bytes(&self) -> &[u8] {
        &self.region
    }
    fn region_bytes_mut(&mut self) -> &mut [u8] {
        &mut self.region
    }

    fn submit(&mut self, sqe: &Sqe, in_capsule: Option<Range<usize>>) -> Result<(), QueueError> {
        self.check_link()?;
        if let Some(r) = &in_capsule {
            QueueError::check_in_capsule(r, self.region.len(), self.in_capsule_limit)?;
        }
        self.sqhd = (self.sqhd + 1) % self.depth.max(1);
        // A window key opens its range for this one command; the response invalidates it.
        let window = match sqe.sgl1() {
            Ok(SglDescriptor::KeyedDataBlock { key, .. }) if key != self.region_info.key => {
                self.windows.remove(&key).map(|range| (key, range))
            }
            _ => None,
        };
        let capsule = Capsule {
            window,
            qid: self.qid,
            cntlid: self.cntlid,
            sqe: *sqe,
            in_capsule,
            region_info: self.region_info,
            sqhd: self.sqhd,
        };
        let outcome = self.target.execute(&capsule, &mut self.region);
        if let Some(cntlid) = outcome.connected_cntlid {
            self.cntlid = Some(cntlid);
        }
        self.responses.extend(outcome.responses);
        if self.target.epoch() != self.epoch {
            // This very command triggered a connection drop.
            self.lose();
        }
        Ok(())
    }

    fn poll(&mut self, out: &mut [Cqe]) -> Result<usize, QueueError> {
        self.check_link()?;
        let mut n = 0;
        let newest_first = self.target.reordering();
        while n < out.len() {
            let next = if newest_first {
                self.responses.pop_back()
            } else {
                self.responses.pop_front()
            };
            match next {
                Some(c) => {
                    out[n] = c;
                    n += 1;
                }
                None => break,
            }
        }
        Ok(n)
    }

    fn bind_window(&mut self, range: Range<usize>) -> Result<Option<(u64, u32)>, QueueError> {
        if range.end > self.region.len() {
            return Err(QueueError::Invalid(format!(
                "window {range:?} outside the region"
            )));
        }
        let Some(key) = self.target.window_key() else {
            return Ok(None);
        };
        let address = self.region_info.address + range.start as u64;
        self.windows.insert(key, range);
        Ok(Some((address, key)))
    }

    fn is_connected(&self) -> bool {
        self.connected && self.target.epoch() == self.epoch
    }

    fn disconnect(&mut self) {
        if self.connected {
            self.lose();
            self.target.queue_disconnected(self.qid, self.cntlid);
        }
    }
}

impl Drop for LoopbackQueue {
    fn drop(&mut self) {
        self.disconnect();
    }
}
