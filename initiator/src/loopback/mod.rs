//! An in-memory loopback fabric with a fake NVMe-oF target behind it, so the whole initiator
//! (bring-up, I/O, block API, reconnect, perf, CLI formatting) runs and is tested without any
//! transport. Not a fast path: the fake target sits behind a mutex shared by all its queues.
//!
//! - [`LoopbackConfig`]: what the fake controller advertises (MDTS, MQES, SGLS, IOCCSZ, KAS,
//!   namespaces, discovery entries, CSTS.RDY delay).
//! - [`LoopbackTarget`]: the shared target; faults are injected through it (drop every
//!   connection now or after N commands, refuse connects, answer twice, swallow commands).
//! - [`LoopbackFabric`] / [`LoopbackQueue`]: the [`crate::queue`] traits.

mod queue;
mod target;

pub use queue::LoopbackQueue;
pub use target::{LoopbackConfig, LoopbackStats, LoopbackTarget, NamespaceConfig};

/// The identifiers the fake target gives namespace `nsid` (so tests can expect them).
pub mod target_ids {
    pub use super::target::{ns_eui64 as eui64, ns_nguid as nguid, ns_uuid as uuid};
}

use crate::queue::{ConnectError, Fabric, QueueConnectParams};

/// Connects queues to a [`LoopbackTarget`].
#[derive(Debug, Clone)]
pub struct LoopbackFabric {
    target: LoopbackTarget,
}

impl LoopbackFabric {
    /// A fabric reaching `target`.
    pub fn new(target: LoopbackTarget) -> Self {
        Self { target }
    }
    /// The target behind this fabric.
    pub fn target(&self) -> &LoopbackTarget {
        &self.target
    }
}

impl Fabric for LoopbackFabric {
    type Queue = LoopbackQueue;
    fn connect(&self, params: &QueueConnectParams) -> Result<LoopbackQueue, ConnectError> {
        LoopbackQueue::connect(self.target.clone(), params)
    }
}
