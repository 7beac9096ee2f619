//! Runs nvmf-perf jobs on reactors (one per core, nvmf-poller): splits each namespace into
//! per-qpair ranges, moves each job with its I/O queue to a reactor, keeps the controller's
//! keep-alive going from the control thread, reports progress, stops, drains and collects.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use nvmf_poller::{
    Arm, BusyWindow, PollStatus, Poller, PollerId, ReactorCtx, Runtime, RuntimeConfig, WakeFds,
};

use crate::controller::{Controller, ControllerState};
use crate::error::{Error, Result};
use crate::io::NsTarget;
use crate::queue::{Fabric, HostQueue};

use super::job::{Job, JobSpec, Progress};
use super::job_set::JobSet;
use super::report::{DepthCap, JobResult, Report, progress_line};

/// A whole run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunConfig {
    /// Per-job parameters.
    pub spec: JobSpec,
    /// Run time.
    pub duration: Duration,
    /// Cores to run reactors on (one reactor each).
    pub cores: Vec<usize>,
    /// Pin reactors to their cores.
    pub pin: bool,
    /// I/O queues (jobs) per namespace.
    pub qpairs_per_namespace: usize,
    /// Namespaces to drive (empty: every active one). A null bdev cannot pass --verify, so
    /// verified runs name the namespaces that keep data.
    pub nsids: Vec<u32>,
    /// Random seed.
    pub seed: u64,
    /// Progress every this often (None = no progress callback).
    pub progress_every: Option<Duration>,
}

/// Where each job runs: (namespace, first LBA, blocks). Each namespace is cut into
/// `qpairs_per_namespace` equal ranges so jobs never touch each other's blocks.
pub fn plan_jobs(
    namespaces: &[NsTarget],
    qpairs_per_namespace: usize,
) -> Vec<(NsTarget, u64, u64)> {
    let per = qpairs_per_namespace.max(1) as u64;
    namespaces
        .iter()
        .flat_map(|ns| {
            let share = ns.blocks / per;
            (0..per).map(move |i| (*ns, i * share, share))
        })
        .collect()
}

/// The jobs of one reactor.
struct JobPoller<Q: HostQueue> {
    jobs: JobSet<Q>,
}

impl<Q: HostQueue + 'static> Poller for JobPoller<Q> {
    fn poll(&mut self, _ctx: &mut ReactorCtx) -> PollStatus {
        PollStatus::from_count(self.jobs.step())
    }
    fn arm(&mut self, _fds: &mut WakeFds) -> Arm {
        // Completions are only found by polling: never sleep while I/O is in flight.
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
        "nvmf-perf jobs"
    }
}

fn poller_error(e: nvmf_poller::PollerError) -> Error {
    Error::Target(format!("reactor: {e}"))
}

/// Run the workload on every active namespace of `controller`; `on_progress` gets the live
/// line every `progress_every`.
pub fn run<F: Fabric>(
    controller: &mut Controller<F>,
    cfg: &RunConfig,
    mut on_progress: impl FnMut(&str),
) -> Result<Report>
where
    F::Queue: 'static,
{
    let namespaces: Vec<NsTarget> = controller
        .namespaces()
        .iter()
        .map(|n| n.target())
        .filter(|n| cfg.nsids.is_empty() || cfg.nsids.contains(&n.nsid))
        .collect();
    if let Some(missing) = cfg
        .nsids
        .iter()
        .find(|id| !namespaces.iter().any(|n| n.nsid == **id))
    {
        return Err(Error::InvalidArgument(format!(
            "namespace {missing} is not an active namespace of the controller"
        )));
    }
    if namespaces.is_empty() {
        return Err(Error::Target(
            "the controller has no active namespace".into(),
        ));
    }
    // A run whose end no clock can hold is the caller's mistake, not a panic at the deadline.
    let end = cfg.duration.checked_mul(2);
    if end.and_then(|d| Instant::now().checked_add(d)).is_none() {
        return Err(Error::InvalidArgument(format!(
            "run time {:?} is too long",
            cfg.duration
        )));
    }
    let plan = plan_jobs(&namespaces, cfg.qpairs_per_namespace);
    if controller.io_queue_count() < plan.len() {
        return Err(Error::InvalidArgument(format!(
            "{} jobs need {} I/O queues; the controller granted {}",
            plan.len(),
            plan.len(),
            controller.io_queue_count()
        )));
    }
    let jobs = plan.len();
    let mut ran_depth = cfg.spec.depth;
    let progress = Arc::new(Progress::default());
    // One --verify stamp for the run's jobs: a block one of them misplaced is still this run's.
    let run_stamp = super::verify::Owner::fresh_run();
    let mut per_reactor: Vec<Vec<Job<F::Queue>>> =
        (0..cfg.cores.len().max(1)).map(|_| Vec::new()).collect();
    for (i, (ns, first, blocks)) in plan.into_iter().enumerate() {
        let queue = controller.take_io_queue(i)?;
        let seed = cfg
            .seed
            .wrapping_add(i as u64)
            .wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let job = Job::new(queue, ns, first, blocks, cfg.spec, seed, progress.clone())?
            .with_run(run_stamp);
        ran_depth = ran_depth.min(job.depth());
        // Queue index i (QID i + 1) goes to reactor i % n: `RdmaFabric::spread` placed it in
        // that reactor's host poll group.
        let slot = i % per_reactor.len();
        per_reactor[slot].push(job);
    }
    let capped = |ran: usize| {
        (ran < cfg.spec.depth).then_some(DepthCap {
            asked: cfg.spec.depth,
            ran,
        })
    };
    if let Some(cap) = capped(ran_depth) {
        // As spdk_nvme_perf warns when its queue depth exceeds the I/O queue size.
        tracing::warn!("{cap}");
    }
    let runtime = Runtime::start(
        RuntimeConfig::new(cfg.cores.clone())
            .pin(cfg.pin)
            // Pure poll mode, like spdk_nvme_perf: the run is short and latency is the point.
            .idle_after(Duration::MAX),
    )
    .map_err(poller_error)?;
    let mut ids: Vec<(usize, PollerId)> = Vec::new();
    let start = Instant::now();
    for (r, jobs) in per_reactor.into_iter().enumerate() {
        if jobs.is_empty() {
            continue;
        }
        let handle = &runtime.reactors()[r];
        let id = handle
            .call(move |reactor| {
                reactor.add_poller(Box::new(JobPoller {
                    jobs: JobSet::new(jobs),
                }))
            })
            .map_err(poller_error)?;
        ids.push((r, id));
    }
    let busy: Vec<BusyWindow> = ids
        .iter()
        .map(|&(r, _)| BusyWindow::start(&runtime.reactors()[r]))
        .collect();
    let deadline = start + cfg.duration;
    let mut last = (start, 0u64, 0u64);
    let mut reconnects = controller.reconnects();
    // Hand-overs of fresh queues so far: the jobs' queue generation.
    let mut handed = 0u64;
    let mut ios_at_reconnect = None;
    let mut failed = None;
    loop {
        let now = Instant::now();
        if now >= deadline {
            break;
        }
        std::thread::sleep((deadline - now).min(Duration::from_millis(50)));
        // Keep-alive, loss and reconnect per the controller's policy.
        match controller.poll().clone() {
            ControllerState::Failed(why) => {
                failed = Some(why);
                break;
            }
            ControllerState::Live if controller.reconnects() > reconnects => {
                reconnects = controller.reconnects();
                hand_fresh_queues(controller, &runtime, &ids, jobs)?;
                handed += 1;
                ios_at_reconnect = Some(progress.ios.load(Ordering::Relaxed));
            }
            _ => {}
        }
        // A queue of the current generation lost while the controller looks live (a loss
        // noticed by a job before a reconnect names an older generation by then).
        if progress.lost_queue_generation.load(Ordering::Relaxed) > handed
            && *controller.state() == ControllerState::Live
        {
            controller.connection_lost("an I/O queue was lost");
        }
        if let Some(every) = cfg.progress_every {
            let now = Instant::now();
            if now - last.0 >= every {
                let ios = progress.ios.load(Ordering::Relaxed);
                let bytes = progress.bytes.load(Ordering::Relaxed);
                on_progress(&progress_line(
                    now - start,
                    now - last.0,
                    ios - last.1,
                    bytes - last.2,
                ));
                last = (now, ios, bytes);
            }
        }
    }
    // Stop submitting everywhere first so the measured window ends for all at once.
    for &(r, id) in &ids {
        runtime.reactors()[r]
            .call(move |reactor| {
                if let Some(p) = reactor.poller_mut::<JobPoller<F::Queue>>(id) {
                    p.jobs.stop_all();
                }
            })
            .map_err(poller_error)?;
    }
    let elapsed = start.elapsed();
    let host_busy_percent: Vec<f64> = busy.iter().map(BusyWindow::percent).collect();
    drop(busy);
    let mut results: Vec<JobResult> = Vec::new();
    for &(r, id) in &ids {
        let handle = &runtime.reactors()[r];
        let drain_deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let drained = handle
                .call(move |reactor| {
                    reactor
                        .poller_mut::<JobPoller<F::Queue>>(id)
                        .is_none_or(|p| p.jobs.is_drained())
                })
                .map_err(poller_error)?;
            if drained {
                break;
            }
            if Instant::now() >= drain_deadline {
                return Err(Error::Timeout {
                    what: "draining nvmf-perf jobs",
                    after: Duration::from_secs(30),
                });
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        let poller = handle
            .call(move |reactor| reactor.take_poller::<JobPoller<F::Queue>>(id))
            .map_err(poller_error)?;
        if let Some(p) = poller {
            for (result, queue) in p.jobs.finish() {
                // After a reconnect the job ran over this queue, at most what it holds.
                ran_depth = ran_depth.min(queue.depth_for(cfg.spec.io_size));
                results.push(result);
            }
        }
    }
    runtime.stop().map_err(poller_error)?;
    if let Some(why) = failed {
        return Err(Error::ControllerFailed(why));
    }
    let mut report = Report::build(&results, elapsed);
    report.reconnects = controller.reconnects();
    report.connected_at_end = *controller.state() == ControllerState::Live;
    report.host_busy_percent = host_busy_percent;
    report.depth_capped = capped(ran_depth);
    report.ios_after_reconnect = ios_at_reconnect.map_or(0, |at| {
        progress.ios.load(Ordering::Relaxed).saturating_sub(at)
    });
    Ok(report)
}

/// After a reconnect: the controller's fresh I/O queues go to the jobs on their reactors (job
/// i runs on reactor i % n, at place i / n there), which go on over them.
fn hand_fresh_queues<F: Fabric>(
    controller: &mut Controller<F>,
    runtime: &Runtime,
    ids: &[(usize, PollerId)],
    jobs: usize,
) -> Result<()>
where
    F::Queue: 'static,
{
    if controller.io_queue_count() < jobs {
        return Err(Error::Target(format!(
            "after the reconnect the controller granted {} I/O queues; the run's {jobs} jobs \
             need {jobs}",
            controller.io_queue_count()
        )));
    }
    let reactors = runtime.reactors().len().max(1);
    for i in 0..jobs {
        let queue = controller.take_io_queue(i)?;
        let r = i % reactors;
        let Some(&(_, id)) = ids.iter().find(|(reactor, _)| *reactor == r) else {
            continue;
        };
        let place = i / reactors;
        runtime.reactors()[r]
            .call(move |reactor| {
                if let Some(p) = reactor.poller_mut::<JobPoller<F::Queue>>(id) {
                    p.jobs.replace_queue(place, queue);
                }
            })
            .map_err(poller_error)?;
    }
    tracing::info!(jobs, "jobs go on over the reconnected controller's queues");
    Ok(())
}
