//! The host side where nvmf-perf's runner does not fit: many controllers (a controller has at
//! most the target's 64 I/O queues, so 1024 qpairs need 16 of them), jobs on only some of the
//! queues, a job poller on a reactor someone else owns (the target's, for the cost profile), and
//! a fixed number of I/O instead of a fixed time. Jobs are nvmf-perf's own (`perf::job::Job`).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use nvmf_initiator::clock::SystemClock;
use nvmf_initiator::controller::{Controller, ControllerOptions, ReconnectPolicy};
use nvmf_initiator::io::IoQueue;
use nvmf_initiator::perf::job::{Job, JobSpec, Progress};
use nvmf_initiator::perf::job_set::JobSet;
use nvmf_initiator::perf::report::{JobResult, Report};
use nvmf_initiator::queue::TransportAddress;
use nvmf_initiator::rdma::{HostGroupConfig, RdmaFabric, RdmaQueue};
use nvmf_poller::{Arm, PollStatus, Poller, PollerId, ReactorCtx, ReactorHandle, WakeFds};

/// Bytes per I/O of every job the bench runs (4 KiB, as the figures are).
pub const IO_SIZE: usize = 4096;

/// Most I/O queues one controller of nvmf-tgt grants.
pub const QUEUES_PER_CONTROLLER: usize = 64;

/// A host poll group for `io_queues` I/O queues of `depth` and the admin queues of
/// `controllers` (depth 32, the initiator's default).
pub fn group_config(io_queues: usize, controllers: usize, depth: usize) -> HostGroupConfig {
    const ADMIN_DEPTH: usize = 32;
    // A queue holds at least 2 entries (host_options and the NVMe SQSIZE minimum).
    let depth = depth.max(2);
    HostGroupConfig {
        max_queues: (io_queues + controllers) as u32,
        max_queue_depth: depth.max(ADMIN_DEPTH) as u32,
        requests: (io_queues * depth + controllers * ADMIN_DEPTH) as u32,
        ..HostGroupConfig::default()
    }
}

/// Controllers with `io_queues` I/O queues in all (at most 64 each) of depth `depth`.
pub fn connect(
    fabric: &RdmaFabric,
    address: &TransportAddress,
    io_queues: usize,
    depth: u16,
) -> Result<Vec<Controller<RdmaFabric>>> {
    let mut controllers = Vec::new();
    let mut left = io_queues;
    while left > 0 {
        let n = left.min(QUEUES_PER_CONTROLLER);
        let mut hostid = [0u8; 16];
        hostid[..8].copy_from_slice(&(controllers.len() as u64 + 1).to_be_bytes());
        let mut options = ControllerOptions::new(
            crate::target::NQN,
            format!(
                "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-{:012x}",
                controllers.len() + 1
            ),
            hostid,
        );
        options.io_queues = n as u16;
        options.io_queue_depth = depth;
        // A queue registers a data slot of the largest transfer per command: only what the
        // jobs use (the initiator's default, 128 KiB, made one qpair at QD 128 16 MiB).
        options.max_io_size = IO_SIZE;
        options.reconnect = ReconnectPolicy::never();
        // Bringing up 16 controllers of 64 queues over TCP takes longer than the default
        // 15 s keep-alive of the first ones; the benchmark measures I/O, not keep-alive.
        options.kato = Duration::from_secs(600);
        let controller = Controller::connect(
            fabric.clone(),
            address.clone(),
            options,
            Arc::new(SystemClock),
        )
        .with_context(|| format!("controller {} ({n} I/O queues)", controllers.len() + 1))?;
        if controller.io_queue_count() < n {
            bail!(
                "the target granted {} I/O queues, asked {n}",
                controller.io_queue_count()
            );
        }
        controllers.push(controller);
        left -= n;
        // Connecting 1024 queues over TCP takes seconds: keep the earlier controllers'
        // keep-alive going meanwhile.
        controllers.iter_mut().for_each(|c| {
            c.poll();
        });
    }
    Ok(controllers)
}

/// Jobs driven by a reactor (nvmf-perf's poller: only the jobs with completions or I/O to
/// submit are stepped in a pass); stops them all once `limit` I/O completed (if any).
pub struct JobPoller {
    jobs: JobSet<RdmaQueue>,
    progress: Arc<Progress>,
    limit: Option<u64>,
}

impl Poller for JobPoller {
    fn poll(&mut self, _ctx: &mut ReactorCtx) -> PollStatus {
        let n = self.jobs.step();
        if let Some(limit) = self.limit {
            if self.progress.ios.load(Ordering::Relaxed) >= limit {
                self.jobs.stop_all();
            }
        }
        PollStatus::from_count(n)
    }
    fn arm(&mut self, _fds: &mut WakeFds) -> Arm {
        if self.jobs.is_drained() {
            Arm::Armed
        } else {
            Arm::WorkPending
        }
    }
    fn stop(&mut self, _ctx: &mut ReactorCtx) -> bool {
        self.jobs.stop_all();
        self.jobs.step_all();
        self.jobs.is_drained()
    }
    fn name(&self) -> &str {
        "nvmf-bench jobs"
    }
}

/// A run: queues taken from the controllers, jobs on the first `active` of them.
pub struct Run {
    /// Queues without a job, kept connected.
    pub idle: Vec<IoQueue<RdmaQueue>>,
    poller: Option<JobPoller>,
    progress: Arc<Progress>,
}

impl Run {
    /// Jobs of `spec` on the first `active` queues of `controllers` (namespace 1 of each, each
    /// job on its own LBA range), the remaining queues kept idle.
    pub fn new(
        controllers: &mut [Controller<RdmaFabric>],
        active: usize,
        spec: JobSpec,
        limit: Option<u64>,
    ) -> Result<Run> {
        let progress = Arc::new(Progress::default());
        let mut jobs = Vec::new();
        let mut idle = Vec::new();
        let total: usize = controllers.iter().map(|c| c.io_queue_count()).sum();
        let active = active.min(total).max(1);
        let mut index = 0u64;
        for c in controllers.iter_mut() {
            let ns = c
                .namespaces()
                .first()
                .map(|n| n.target())
                .context("the controller has no namespace")?;
            let share = ns.blocks / active as u64;
            for q in 0..c.io_queue_count() {
                let queue = c.take_io_queue(q)?;
                if (index as usize) < active {
                    let job = Job::new(
                        queue,
                        ns,
                        index * share,
                        share,
                        spec,
                        (index + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15),
                        progress.clone(),
                    )?;
                    if job.depth() < spec.depth {
                        // The figures would be labelled with a depth they did not run at.
                        bail!(
                            "queue depth {} asked per qpair, but the target's I/O queues hold {}: ask at most that",
                            spec.depth,
                            job.depth()
                        );
                    }
                    jobs.push(job);
                } else {
                    idle.push(queue);
                }
                index += 1;
            }
        }
        Ok(Run {
            idle,
            poller: Some(JobPoller {
                jobs: JobSet::new(jobs),
                progress: progress.clone(),
                limit,
            }),
            progress,
        })
    }

    /// Run on `reactor` for `duration` (or until the I/O limit), keeping the controllers'
    /// keep-alive going from this thread; stop, drain and report.
    pub fn drive(
        mut self,
        reactor: &ReactorHandle,
        controllers: &mut [Controller<RdmaFabric>],
        duration: Duration,
    ) -> Result<(Report, Vec<IoQueue<RdmaQueue>>)> {
        let poller = self.poller.take().context("run driven twice")?;
        let limit = poller.limit;
        let start = Instant::now();
        let id: PollerId = reactor
            .call(move |r| r.add_poller(Box::new(poller)))
            .map_err(|e| anyhow::anyhow!("reactor: {e}"))?;
        let deadline = start + duration;
        loop {
            let now = Instant::now();
            if now >= deadline
                || limit.is_some_and(|l| self.progress.ios.load(Ordering::Relaxed) >= l)
            {
                break;
            }
            std::thread::sleep((deadline - now).min(Duration::from_millis(20)));
            controllers.iter_mut().for_each(|c| {
                c.poll();
            });
        }
        reactor
            .call(move |r| {
                if let Some(p) = r.poller_mut::<JobPoller>(id) {
                    p.jobs.stop_all();
                }
            })
            .map_err(|e| anyhow::anyhow!("reactor: {e}"))?;
        let elapsed = start.elapsed();
        let drain_deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let drained = reactor
                .call(move |r| {
                    r.poller_mut::<JobPoller>(id)
                        .is_none_or(|p| p.jobs.is_drained())
                })
                .map_err(|e| anyhow::anyhow!("reactor: {e}"))?;
            if drained {
                break;
            }
            if Instant::now() >= drain_deadline {
                bail!("jobs did not drain within 30 s");
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        let poller = reactor
            .call(move |r| r.take_poller::<JobPoller>(id))
            .map_err(|e| anyhow::anyhow!("reactor: {e}"))?
            .context("job poller vanished")?;
        let mut results: Vec<JobResult> = Vec::new();
        let mut queues = std::mem::take(&mut self.idle);
        for (result, queue) in poller.jobs.finish() {
            results.push(result);
            queues.push(queue);
        }
        Ok((Report::build(&results, elapsed), queues))
    }
}

/// The address of a target in this process (soft) or on loopback (soft-tcp).
pub fn address(transport: &str, addr: std::net::SocketAddr) -> TransportAddress {
    TransportAddress {
        transport: transport.into(),
        address: addr.ip().to_string(),
        service: addr.port().to_string(),
    }
}
