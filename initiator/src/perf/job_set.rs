//! The jobs one reactor drives, stepped by readiness: in a pass only the jobs whose queue
//! has something to report (their completion group names it) or that have I/O to submit or
//! failures to deliver ([`Job::wants_step`]) are stepped, plus every job on a sweep pass
//! ([`ReadyQueues`]), so a reactor with many queues at low depth does work per completion,
//! not per job. Jobs over queues without a completion group are stepped every pass. A pass
//! steps a job with [`Job::step_reap_first`]: its completions, then its refill.
//!
//! Latency: one histogram per namespace for all the set's jobs on it, as spdk_nvme_perf keeps
//! one per namespace and core. A histogram per job (3 significant digits: tens of KiB each)
//! put every record of 128 jobs at queue depth 1 on a line the cache had lost: an eighth of
//! the host's time per I/O. The report merges per namespace anyway.

use hdrhistogram::Histogram;

use crate::io::{IoQueue, ReadyQueues};
use crate::queue::HostQueue;

use super::job::Job;
use super::report::{JobResult, latency_histogram};

/// Jobs stepped by one poller (see the module documentation).
pub struct JobSet<Q: HostQueue> {
    jobs: Vec<Job<Q>>,
    ready: ReadyQueues,
    /// One per namespace the jobs run on, in order of first appearance.
    latency: Vec<Histogram<u64>>,
    /// Job `i`'s histogram: `latency[latency_of[i]]`.
    latency_of: Vec<usize>,
}

impl<Q: HostQueue> JobSet<Q> {
    /// A poller over `jobs`.
    pub fn new(jobs: Vec<Job<Q>>) -> Self {
        let ready = ReadyQueues::with_queues(jobs.iter().map(|j| j.io_queue().queue()));
        let mut nsids = Vec::new();
        let latency_of = jobs
            .iter()
            .map(|job| {
                let nsid = job.result().nsid;
                nsids.iter().position(|&id| id == nsid).unwrap_or_else(|| {
                    nsids.push(nsid);
                    nsids.len() - 1
                })
            })
            .collect();
        let latency = nsids.iter().map(|_| latency_histogram()).collect();
        Self {
            jobs,
            ready,
            latency,
            latency_of,
        }
    }

    /// Steps every job (whatever its queue reports); returns the completions handled.
    pub fn step_all(&mut self) -> usize {
        self.jobs.iter_mut().map(Job::step).sum()
    }

    /// One pass: steps the jobs whose queue has something to report or that have I/O to
    /// submit (every job on a sweep pass); returns the completions handled.
    pub fn step(&mut self) -> usize {
        let Self {
            jobs,
            ready,
            latency,
            latency_of,
        } = self;
        let mut n = 0;
        // One clock read per pass for every job it steps (read only if one is stepped).
        let mut pass_time = None;
        ready.pass(|i| {
            let job = &mut jobs[i];
            let now = *pass_time.get_or_insert_with(|| job.io_queue().clock().now());
            n += job.step_reap_first(&mut latency[latency_of[i]], now);
            job.wants_step()
        });
        n
    }

    /// The jobs.
    pub fn jobs(&self) -> &[Job<Q>] {
        &self.jobs
    }

    /// Stops every job (in-flight I/O still completes).
    pub fn stop_all(&mut self) {
        self.jobs.iter_mut().for_each(Job::stop);
    }

    /// True when every job is drained.
    pub fn is_drained(&self) -> bool {
        self.jobs.iter().all(Job::is_drained)
    }

    /// Job `place` goes on over `queue` (after a reconnect: [`Job::replace_queue`]).
    pub fn replace_queue(&mut self, place: usize, queue: IoQueue<Q>) {
        if let Some(job) = self.jobs.get_mut(place) {
            job.replace_queue(queue);
            self.ready.add(place, job.io_queue().queue());
        }
    }

    /// Each job's result and queue, in job order; a namespace's latency histogram comes with
    /// its first job's result.
    pub fn finish(self) -> Vec<(JobResult, IoQueue<Q>)> {
        let mut latency: Vec<Option<Histogram<u64>>> = self.latency.into_iter().map(Some).collect();
        self.jobs
            .into_iter()
            .zip(self.latency_of)
            .map(|(job, index)| {
                let (mut result, queue) = job.finish();
                if let Some(shared) = latency[index].take() {
                    // The job's own histogram holds what `Job::step` recorded (the drain
                    // after a stop).
                    let _ = result.latency.add(&shared);
                }
                (result, queue)
            })
            .collect()
    }
}
