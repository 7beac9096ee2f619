//! Statistics: per reactor (loop counters from the poller, I/O counters from its `ReactorIo`)
//! and per subsystem (controllers, queues, I/O), as one serialisable snapshot.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use nvmf_poller::Runtime;
use nvmf_target::nvme::{IoCounters, IoSnapshot, Target};
use serde::Serialize;

/// What the daemon reads statistics from.
pub struct Stats {
    target: Arc<Target>,
    reactor_io: Vec<Arc<IoCounters>>,
}

#[derive(Serialize)]
pub struct ReactorLine {
    reactor: usize,
    core: usize,
    polls: u64,
    busy_ms: u128,
    sleeps: u64,
    io: IoSnapshot,
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
    reactors: Vec<ReactorLine>,
    subsystems: BTreeMap<String, SubsystemLine>,
}

impl Stats {
    pub fn new(target: Arc<Target>, reactor_io: Vec<Arc<IoCounters>>) -> Stats {
        Stats { target, reactor_io }
    }

    pub fn collect(&self, runtime: &Runtime) -> Snapshot {
        let reactors = runtime
            .reactors()
            .iter()
            .zip(&self.reactor_io)
            .map(|(h, io)| {
                let s = h.stats();
                ReactorLine {
                    reactor: s.reactor,
                    core: s.core,
                    polls: s.polls,
                    busy_ms: s.busy.as_millis(),
                    sleeps: s.sleeps,
                    io: io.snapshot(),
                }
            })
            .collect();
        let mut subsystems: BTreeMap<String, SubsystemLine> = self
            .target
            .subsystems()
            .iter()
            .map(|s| (s.nqn.clone(), SubsystemLine::default()))
            .collect();
        for c in self.target.controllers() {
            let line = subsystems.entry(c.subnqn().to_owned()).or_default();
            line.controllers += 1;
            line.qpairs += 1 + c.state().io_qids.len();
            line.io += c.io_totals();
        }
        Snapshot {
            reactors,
            subsystems,
        }
    }
}

impl Snapshot {
    /// Log every line (SIGUSR1).
    pub fn log(&self) {
        for r in &self.reactors {
            tracing::info!(reactor = r.reactor, core = r.core, polls = r.polls, busy_ms = r.busy_ms, sleeps = r.sleeps, io = ?r.io, "reactor stats");
        }
        for (nqn, s) in &self.subsystems {
            tracing::info!(subsystem = %nqn, controllers = s.controllers, qpairs = s.qpairs, io = ?s.io, "subsystem stats");
        }
    }

    /// Write as JSON to `path`, atomically (temporary file, then rename).
    pub fn write_file(&self, path: &Path) -> std::io::Result<()> {
        let tmp = path.with_extension("tmp");
        let mut f = std::fs::File::create(&tmp)?;
        serde_json::to_writer_pretty(&mut f, self).map_err(std::io::Error::other)?;
        f.write_all(b"\n")?;
        f.sync_data()?;
        std::fs::rename(&tmp, path)
    }
}
