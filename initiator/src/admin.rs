//! Synchronous command execution on one queue: the admin queue for its whole life, and an I/O
//! queue during its Fabrics Connect. Control path: it waits for each answer (with a timeout)
//! and may allocate. Data for a command sits in the command's slot of the queue's region and
//! travels by keyed SGL (or in the capsule when asked).
//!
//! Keep Alive runs in the background: [`AdminQueue::send_keep_alive`] submits without waiting
//! and the answer is picked up by whichever later call polls the queue.

use std::ops::Range;
use std::time::{Duration, Instant};

use nvmf_protocol::sqe::FABRICS_OPCODE;
use nvmf_protocol::{Cqe, SglDescriptor, Sqe, StatusContext};

use crate::cid::{CidLookup, CidTable};
use crate::clock::SharedClock;
use crate::error::{Error, Result};
use crate::queue::HostQueue;

/// How a command's host-to-controller data travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataPlacement {
    /// Keyed SGL: the target reads it from the region.
    Keyed,
    /// In the capsule, after the SQE.
    InCapsule,
}

/// A command's data.
#[derive(Debug, Clone, Copy)]
pub enum Transfer<'a> {
    /// No data.
    None,
    /// Controller to host, this many bytes.
    ToHost(usize),
    /// Host to controller.
    FromHost(&'a [u8], DataPlacement),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Purpose {
    Wait,
    KeepAlive,
}

/// Statistics of one synchronous queue.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AdminStats {
    /// Completions whose CID matched nothing in flight (late or duplicate).
    pub stale_completions: u64,
    /// Keep Alive commands answered.
    pub keep_alives_answered: u64,
}

/// A queue driven one command at a time (plus background keep-alives).
pub struct AdminQueue<Q: HostQueue> {
    queue: Q,
    cids: CidTable<Purpose>,
    slot_size: usize,
    clock: SharedClock,
    timeout: Duration,
    finished: Vec<Option<Cqe>>,
    /// When the Keep Alive still unanswered was sent.
    keep_alive_sent: Option<Instant>,
    keep_alive_error: Option<Error>,
    stats: AdminStats,
    broken: Option<String>,
}

impl<Q: HostQueue> std::fmt::Debug for AdminQueue<Q> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminQueue")
            .field("qid", &self.queue.qid())
            .field("depth", &self.cids.depth())
            .field("slot_size", &self.slot_size)
            .finish()
    }
}

/// Poll interval while waiting for an answer: short, the admin path is rare.
const WAIT_STEP: Duration = Duration::from_micros(100);

impl<Q: HostQueue> AdminQueue<Q> {
    /// Drive `queue`, whose region holds `queue.depth()` slots of `slot_size` bytes.
    pub fn new(queue: Q, slot_size: usize, clock: SharedClock, timeout: Duration) -> Self {
        let depth = usize::from(queue.depth())
            .min(queue.region().len / slot_size.max(1))
            .max(1);
        Self {
            queue,
            cids: CidTable::new(depth),
            slot_size,
            clock,
            timeout,
            finished: vec![None; depth],
            keep_alive_sent: None,
            keep_alive_error: None,
            stats: AdminStats::default(),
            broken: None,
        }
    }

    /// The queue.
    pub fn queue(&self) -> &Q {
        &self.queue
    }
    /// Give the queue back (for an I/O queue after its Connect).
    pub fn into_queue(self) -> Q {
        self.queue
    }
    /// Largest data transfer of one command.
    pub fn slot_size(&self) -> usize {
        self.slot_size
    }
    /// Counters.
    pub fn stats(&self) -> AdminStats {
        self.stats
    }
    /// True while the connection is usable.
    pub fn is_connected(&self) -> bool {
        self.broken.is_none() && self.queue.is_connected()
    }
    /// Tear down.
    pub fn disconnect(&mut self) {
        self.queue.disconnect();
        self.mark_broken("disconnected by the host".into());
    }

    fn mark_broken(&mut self, why: String) {
        if self.broken.is_none() {
            self.broken = Some(why);
        }
        self.cids.drain(|_, _| {});
        self.keep_alive_sent = None;
    }

    fn lost(&self) -> Error {
        Error::ConnectionLost(
            self.broken
                .clone()
                .unwrap_or_else(|| "admin queue disconnected".into()),
        )
    }

    /// Reap completions; route them to their waiters.
    pub fn poll(&mut self) -> Result<usize> {
        if self.broken.is_some() {
            return Err(self.lost());
        }
        let mut cqes = [Cqe::success(0, 0, 0, 0); 16];
        let n = match self.queue.poll(&mut cqes) {
            Ok(n) => n,
            Err(e) => {
                self.mark_broken(e.to_string());
                return Err(self.lost());
            }
        };
        for cqe in &cqes[..n] {
            match self.cids.complete(cqe.cid) {
                CidLookup::Completed {
                    payload: Purpose::KeepAlive,
                    ..
                } => {
                    self.keep_alive_sent = None;
                    self.stats.keep_alives_answered += 1;
                    if !cqe.status.is_success() {
                        self.keep_alive_error = Some(Error::Nvme {
                            command: "Keep Alive",
                            status: cqe.status,
                        });
                    }
                }
                CidLookup::Completed { index, .. } => self.finished[index] = Some(*cqe),
                CidLookup::Stale => {
                    self.stats.stale_completions += 1;
                    tracing::warn!(
                        cid = cqe.cid,
                        qid = self.queue.qid(),
                        "stale completion ignored"
                    );
                }
            }
        }
        Ok(n)
    }

    /// Submit a Keep Alive without waiting. With the previous one still unanswered, none is
    /// sent; it errors once that one has waited `answer_within` (the Keep Alive Timeout, as
    /// the Linux host gives its keep-alive request: by then the controller has given the
    /// association up itself), and the connection is treated as dead.
    pub fn send_keep_alive(&mut self, answer_within: Duration) -> Result<()> {
        self.poll()?;
        if let Some(e) = self.keep_alive_error.take() {
            return Err(e);
        }
        if let Some(sent) = self.keep_alive_sent {
            if self.clock.now().saturating_duration_since(sent) < answer_within {
                return Ok(());
            }
            self.queue.disconnect();
            self.mark_broken(format!("keep alive unanswered for {answer_within:?}"));
            return Err(Error::Timeout {
                what: "Keep Alive",
                after: answer_within,
            });
        }
        let (_, cid) = self
            .cids
            .allocate(Purpose::KeepAlive)
            .ok_or(Error::QueueFull)?;
        let mut sqe = Sqe::new(nvmf_protocol::AdminOpcode::KeepAlive.raw(), cid, 0);
        sqe.set_sgl1(SglDescriptor::NULL);
        if let Err(e) = self.queue.submit(&sqe, None) {
            self.cids.complete(cid);
            self.mark_broken(e.to_string());
            return Err(self.lost());
        }
        self.keep_alive_sent = Some(self.clock.now());
        Ok(())
    }

    /// How command data of `transfer` travels through the slot at `base` of the queue's
    /// region: its SGL, the in-capsule range (if any) and the bytes to read back. Host-to-
    /// controller data is copied into the slot here.
    fn describe(
        &mut self,
        name: &'static str,
        base: usize,
        transfer: Transfer<'_>,
    ) -> Result<CommandData> {
        let (len, outgoing) = match transfer {
            Transfer::None => return Ok(CommandData::none()),
            Transfer::ToHost(len) => (len, None),
            Transfer::FromHost(data, placement) => (data.len(), Some((data, placement))),
        };
        if len > self.slot_size {
            return Err(Error::InvalidArgument(format!(
                "{name}: {len} bytes > slot {}",
                self.slot_size
            )));
        }
        let region = self.queue.region();
        let address = region.address + base as u64;
        match outgoing {
            None => Ok(CommandData {
                sgl: keyed(address, len, region.key)?,
                in_capsule: None,
                read_len: len,
            }),
            Some((data, placement)) => {
                self.queue.region_bytes_mut()[base..base + len].copy_from_slice(data);
                match placement {
                    DataPlacement::Keyed => Ok(CommandData {
                        sgl: keyed(address, len, region.key)?,
                        ..CommandData::none()
                    }),
                    DataPlacement::InCapsule => Ok(CommandData {
                        sgl: SglDescriptor::DataBlockOffset {
                            offset: 0,
                            length: len as u32,
                        },
                        in_capsule: Some(base..base + len),
                        read_len: 0,
                    }),
                }
            }
        }
    }

    /// Run one command and wait for its answer. `sqe`'s CID and SGL1 are filled in here.
    /// Returns the completion (success only) and, for `Transfer::ToHost`, the data.
    pub fn execute(
        &mut self,
        name: &'static str,
        mut sqe: Sqe,
        transfer: Transfer<'_>,
    ) -> Result<(Cqe, Vec<u8>)> {
        self.poll()?;
        let (index, cid) = self.cids.allocate(Purpose::Wait).ok_or(Error::QueueFull)?;
        let base = index * self.slot_size;
        sqe.cid = cid;
        // A command that cannot be described or sent gives its CID back, so the queue keeps
        // its depth.
        let CommandData {
            sgl,
            in_capsule,
            read_len,
        } = match self.describe(name, base, transfer) {
            Ok(described) => described,
            Err(e) => {
                self.cids.complete(cid);
                return Err(e);
            }
        };
        sqe.set_sgl1(sgl);
        if let Err(e) = self.queue.submit(&sqe, in_capsule) {
            self.cids.complete(cid);
            return Err(e.into());
        }
        let deadline = self.clock.now() + self.timeout;
        loop {
            self.poll()?;
            if let Some(cqe) = self.finished[index].take() {
                let ctx = if sqe.opcode == FABRICS_OPCODE {
                    StatusContext::Fabrics
                } else {
                    StatusContext::Nvm
                };
                let status = cqe.status.in_context(ctx);
                if !status.is_success() {
                    return Err(Error::Nvme {
                        command: name,
                        status,
                    });
                }
                let data = self.queue.region_bytes()[base..base + read_len].to_vec();
                return Ok((cqe, data));
            }
            if self.clock.now() >= deadline {
                // The CID cannot be reused safely while the controller may still answer it:
                // give the connection up, like the Linux host's error recovery does.
                self.queue.disconnect();
                self.mark_broken(format!("{name} timed out"));
                return Err(Error::Timeout {
                    what: name,
                    after: self.timeout,
                });
            }
            self.clock.idle(WAIT_STEP);
        }
    }
}

/// How one command's data travels (see `AdminQueue::describe`).
struct CommandData {
    sgl: SglDescriptor,
    /// The slot's bytes sent in the capsule.
    in_capsule: Option<Range<usize>>,
    /// Bytes the controller writes into the slot, read back at completion.
    read_len: usize,
}

impl CommandData {
    fn none() -> CommandData {
        CommandData {
            sgl: SglDescriptor::NULL,
            in_capsule: None,
            read_len: 0,
        }
    }
}

/// A keyed data block over `len` bytes at `address`.
pub(crate) fn keyed(address: u64, len: usize, key: u32) -> Result<SglDescriptor> {
    SglDescriptor::keyed(address, len as u32, key, false)
        .filter(|_| u32::try_from(len).is_ok())
        .ok_or_else(|| {
            Error::InvalidArgument(format!("{len} bytes exceed a keyed SGL's 24-bit length"))
        })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::clock::VirtualClock;
    use crate::loopback::{LoopbackConfig, LoopbackFabric, LoopbackTarget};
    use crate::queue::{Fabric, QueueConnectParams, TransportAddress};

    /// An admin queue with one command slot of `slot` bytes (and so one CID).
    fn one_slot_admin(slot: usize) -> AdminQueue<crate::loopback::LoopbackQueue> {
        let target = LoopbackTarget::new(LoopbackConfig::default());
        let queue = LoopbackFabric::new(target)
            .connect(&QueueConnectParams {
                address: TransportAddress::loopback(),
                qid: 0,
                hrqsize: 2,
                hsqsize: 1,
                cntlid: 0xffff,
                data_region_len: slot,
                in_capsule_data: 0,
            })
            .unwrap();
        AdminQueue::new(
            queue,
            slot,
            Arc::new(VirtualClock::new()),
            Duration::from_secs(1),
        )
    }

    #[test]
    fn a_transfer_no_keyed_sgl_can_name_gives_its_cid_back() {
        // A slot larger than a keyed SGL's 24-bit length can name.
        let slot = (16 << 20) + 512;
        let mut admin = one_slot_admin(slot);
        let data = vec![0u8; 16 << 20];
        let log_page = Sqe::new(nvmf_protocol::AdminOpcode::GetLogPage.raw(), 0, 0);
        let set_features = Sqe::new(nvmf_protocol::AdminOpcode::SetFeatures.raw(), 0, 0);
        // Each twice: had the first kept the only CID, the second would find the queue full.
        for _ in 0..2 {
            match admin.execute("Get Log Page", log_page, Transfer::ToHost(16 << 20)) {
                Err(Error::InvalidArgument(why)) => assert!(why.contains("24-bit"), "{why}"),
                other => panic!("{other:?}"),
            }
            let keyed = Transfer::FromHost(&data, DataPlacement::Keyed);
            match admin.execute("Set Features", set_features, keyed) {
                Err(Error::InvalidArgument(why)) => assert!(why.contains("24-bit"), "{why}"),
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn a_transfer_larger_than_its_slot_gives_its_cid_back() {
        let mut admin = one_slot_admin(4096);
        let data = vec![0u8; 4097];
        let log_page = Sqe::new(nvmf_protocol::AdminOpcode::GetLogPage.raw(), 0, 0);
        let set_features = Sqe::new(nvmf_protocol::AdminOpcode::SetFeatures.raw(), 0, 0);
        for _ in 0..2 {
            match admin.execute("Get Log Page", log_page, Transfer::ToHost(4097)) {
                Err(Error::InvalidArgument(why)) => {
                    assert!(why.contains("4097 bytes > slot 4096"), "{why}")
                }
                other => panic!("{other:?}"),
            }
            for placement in [DataPlacement::Keyed, DataPlacement::InCapsule] {
                let transfer = Transfer::FromHost(&data, placement);
                match admin.execute("Set Features", set_features, transfer) {
                    Err(Error::InvalidArgument(why)) => {
                        assert!(why.contains("4097 bytes > slot 4096"), "{why}")
                    }
                    other => panic!("{other:?}"),
                }
            }
        }
    }
}
