//! The jobs one reactor drives, stepped by readiness: in a pass only the jobs whose queue
//! has something to report (their completion group names it) or that have I/O to submit or
//! failures to deliver ([`Job::wants_step`]) are stepped, plus every job on a sweep pass
//! ([`ReadyQueues`]), so a reactor with many queues at low depth does work per completion,
//! not per job. Jobs over queues without a completion group are stepped every pass. A pass
//! steps a job with [`Job::step_reap_first`]: its completions, then its refill.

use crate::io::{IoQueue, ReadyQueues};
use crate::queue::HostQueue;

use super::job::Job;

/// Jobs stepped by one poller (see the module documentation).
pub struct JobSet<Q: HostQueue> {
    jobs: Vec<Job<Q>>,
    ready: ReadyQueues,
}

impl<Q: HostQueue> JobSet<Q> {
    /// A poller over `jobs`.
    pub fn new(jobs: Vec<Job<Q>>) -> Self {
        let ready = ReadyQueues::with_queues(jobs.iter().map(|j| j.io_queue().queue()));
        Self { jobs, ready }
    }

    /// Steps every job (whatever its queue reports); returns the completions handled.
    pub fn step_all(&mut self) -> usize {
        self.jobs.iter_mut().map(Job::step).sum()
    }

    /// One pass: steps the jobs whose queue has something to report or that have I/O to
    /// submit (every job on a sweep pass); returns the completions handled.
    pub fn step(&mut self) -> usize {
        let Self { jobs, ready } = self;
        let mut n = 0;
        ready.pass(|i| {
            let job = &mut jobs[i];
            n += job.step_reap_first();
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

    /// The jobs, given back.
    pub fn into_jobs(self) -> Vec<Job<Q>> {
        self.jobs
    }
}
