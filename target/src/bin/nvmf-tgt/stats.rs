//! Statistics: per reactor (loop counters from the poller; I/O counters and poll-group figures
//! of every group on it, one per RDMA device) and per subsystem (controllers, queues, I/O), as
//! one serialisable snapshot. The poll groups are read on their own reactors (a control-path
//! message each); the field list is documented in configs/README.md.

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result};
use nvmf_poller::Runtime;
use nvmf_target::nvme::{IoSnapshot, Target};
use nvmf_target::rdma::{GroupSnapshot, RdmaTransport};
use nvmf_target::transport_glue::{Command, NvmeHandler};
use serde::Serialize;

/// What the daemon reads statistics from.
pub struct Stats {
    target: Arc<Target>,
    /// Snapshots taken so far (the `sequence` of the next one).
    taken: u64,
    /// SIGUSR1 signals handled so far.
    signals: u64,
}

#[derive(Serialize)]
pub struct ReactorLine {
    reactor: usize,
    core: usize,
    polls: u64,
    busy_ms: u128,
    sleeps: u64,
    /// I/O of every group on this reactor.
    io: IoSnapshot,
    /// Qpairs of every group on this reactor.
    qpairs: usize,
    /// One poll group per RDMA device.
    groups: Vec<GroupSnapshot>,
}

#[derive(Serialize, Default)]
pub struct SubsystemLine {
    controllers: usize,
    /// Admin plus I/O queues of its controllers.
    qpairs: usize,
    io: IoSnapshot,
}

/// One snapshot.
#[derive(Serialize)]
pub struct Snapshot {
    /// Counts snapshots since the daemon started.
    sequence: u64,
    /// SIGUSR1 signals handled before this snapshot was collected: a reader that wants the
    /// state after its own signal waits for this to grow past what it read before sending.
    signals: u64,
    /// Qpairs in every poll group.
    qpairs: usize,
    /// Receive slots held in every poll group (0 when idle: none leaked).
    recv_slots_held: u32,
    reactors: Vec<ReactorLine>,
    subsystems: BTreeMap<String, SubsystemLine>,
}

impl Stats {
    pub fn new(target: Arc<Target>) -> Stats {
        Stats {
            target,
            taken: 0,
            signals: 0,
        }
    }

    /// A snapshot; `signalled`: one SIGUSR1 was handled for it.
    pub fn collect(
        &mut self,
        signalled: bool,
        runtime: &Runtime,
        transport: &RdmaTransport<Command, NvmeHandler>,
    ) -> Result<Snapshot> {
        let groups = transport
            .each_group(|g| (g.snapshot(), g.handler().io().counters().snapshot()))
            .context("reading the poll groups")?;
        let mut reactors: Vec<ReactorLine> = runtime
            .reactors()
            .iter()
            .map(|h| {
                let s = h.stats();
                ReactorLine {
                    reactor: s.reactor,
                    core: s.core,
                    polls: s.polls,
                    busy_ms: s.busy.as_millis(),
                    sleeps: s.sleeps,
                    io: IoSnapshot::default(),
                    qpairs: 0,
                    groups: Vec::new(),
                }
            })
            .collect();
        let (mut qpairs, mut held) = (0, 0);
        for (info, (group, io)) in groups {
            qpairs += group.qpairs;
            held += group.recv_slots.held;
            if let Some(line) = reactors.get_mut(info.reactor) {
                line.io += io;
                line.qpairs += group.qpairs;
                line.groups.push(group);
            }
        }
        let mut subsystems: BTreeMap<String, SubsystemLine> = self
            .target
            .subsystems()
            .iter()
            .map(|s| (s.nqn.clone(), SubsystemLine::default()))
            .collect();
        for c in self.target.controllers() {
            let line = subsystems.entry(c.subnqn().to_owned()).or_default();
            line.controllers += 1;
            line.qpairs += 1 + c.state().io_queues.len();
            line.io += c.io_totals();
        }
        self.taken += 1;
        self.signals += u64::from(signalled);
        Ok(Snapshot {
            sequence: self.taken,
            signals: self.signals,
            qpairs,
            recv_slots_held: held,
            reactors,
            subsystems,
        })
    }
}

impl Snapshot {
    /// Log every line (SIGUSR1).
    pub fn log(&self) {
        for r in &self.reactors {
            tracing::info!(reactor = r.reactor, core = r.core, polls = r.polls, busy_ms = r.busy_ms, sleeps = r.sleeps, qpairs = r.qpairs, io = ?r.io, "reactor stats");
            for g in &r.groups {
                tracing::info!(reactor = r.reactor, device = %g.device_name, qpairs = g.qpairs, recv_slots = ?g.recv_slots, requests = ?g.requests, data_buffers = ?g.data_buffers, counters = ?g.counters, failed = ?g.failed, "poll group stats");
            }
        }
        for (nqn, s) in &self.subsystems {
            tracing::info!(subsystem = %nqn, controllers = s.controllers, qpairs = s.qpairs, io = ?s.io, "subsystem stats");
        }
    }

    /// Write as JSON to `path`, atomically: a new temporary file of a random name beside it
    /// (created exclusively, so no file or link someone put there in advance is followed or
    /// reused), then renamed over it.
    pub fn write_file(&self, path: &Path) -> std::io::Result<()> {
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        let tmp = tempfile::Builder::new()
            .prefix(".nvmf-tgt-stats")
            .tempfile_in(dir)?;
        let mut out = std::io::BufWriter::new(tmp);
        serde_json::to_writer_pretty(&mut out, self).map_err(std::io::Error::other)?;
        out.write_all(b"\n")?;
        let tmp = out.into_inner().map_err(|e| e.into_error())?;
        // Readable by monitoring as the file it replaces was (a temporary file is 0600).
        tmp.as_file()
            .set_permissions(std::fs::Permissions::from_mode(0o644))?;
        tmp.as_file().sync_data()?;
        tmp.persist(path).map(|_| ()).map_err(|e| e.error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn empty() -> Snapshot {
        Snapshot {
            sequence: 7,
            signals: 0,
            qpairs: 0,
            recv_slots_held: 0,
            reactors: Vec::new(),
            subsystems: BTreeMap::new(),
        }
    }

    /// The file is replaced whole, readable by others, and nothing already at a predictable
    /// temporary name (a link to another file) is followed.
    #[test]
    fn the_stats_file_is_replaced_through_a_fresh_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nvmf-tgt.stats");
        let victim = dir.path().join("victim");
        std::fs::write(&victim, b"keep").unwrap();
        for name in ["nvmf-tgt.tmp", "nvmf-tgt.stats.tmp"] {
            std::os::unix::fs::symlink(&victim, dir.path().join(name)).unwrap();
        }
        std::fs::write(&path, b"old").unwrap();
        empty().write_file(&path).unwrap();
        let written: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(written["sequence"], 7);
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o644);
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(left.len(), 4, "no temporary file left: {left:?}");
    }
}
