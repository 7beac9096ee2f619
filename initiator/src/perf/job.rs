//! One nvmf-perf job: a workload over its own LBA range of one namespace on one I/O queue,
//! keeping its queue full, timing every I/O, and (with --verify) tagging every block written
//! and checking every block read. Driven by whoever owns it: [`Job::step`] in a loop, or the
//! reactor poller in [`super::runner`].

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use hdrhistogram::Histogram;

use crate::io::{IoCompletion, IoKind, IoQueue, NsTarget, ReadData};
use crate::queue::HostQueue;

use super::in_flight::InFlightUnits;
use super::report::{JobResult, record_latency};
use super::verify;
use super::workload::{Generator, Op, Pattern};

/// Largest number of I/O units one verifying job tracks (8 bytes each: 32 MiB).
pub const VERIFY_MAX_UNITS: u64 = 1 << 22;

/// Parameters shared by every job of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JobSpec {
    /// Access pattern.
    pub pattern: Pattern,
    /// Percent reads for the mixed patterns.
    pub mix: u8,
    /// Bytes per I/O (a multiple of the block size).
    pub io_size: usize,
    /// Commands in flight.
    pub depth: usize,
    /// Tag and check data.
    pub verify: bool,
}

/// Live counters the progress line reads (updated once per step, not per I/O).
#[derive(Debug, Default)]
pub struct Progress {
    /// I/O completed.
    pub ios: AtomicU64,
    /// Bytes moved.
    pub bytes: AtomicU64,
    /// One more than the newest generation of I/O queues (0 at the start, one more at each
    /// reconnect's hand-over) a job found lost: a queue can be lost on its own (an I/O
    /// timeout, an answer the host cannot accept) while the admin queue lives, and the
    /// control thread, which sees only the admin queue, then loses the whole connection so
    /// the controller reconnects (or fails) by its policy, as the Linux host resets it.
    pub lost_queue_generation: AtomicU64,
}

/// One job.
pub struct Job<Q: HostQueue> {
    queue: IoQueue<Q>,
    ns: NsTarget,
    first_lba: u64,
    blocks_per_io: u32,
    generator: Generator,
    /// The spec, its depth capped by the queue's.
    spec: JobSpec,
    /// The depth asked, before the cap (a fresh queue after a reconnect caps it anew).
    asked_depth: usize,
    /// With --verify: the generation each unit holds (0 = unknown).
    generations: Vec<u64>,
    /// Units with I/O in flight and, for writes, the generation they carry (a table sized by
    /// the queue depth, not a per-unit table on big disks).
    in_flight: InFlightUnits,
    next_generation: u64,
    /// Whose blocks this job writes and reads (the run's stamp, the namespace).
    owner: verify::Owner,
    /// Queues this job was handed after reconnects (see [`Progress::lost_queue_generation`]).
    queue_generation: u64,
    stopping: bool,
    result: JobResult,
    progress: Arc<Progress>,
}

impl<Q: HostQueue> std::fmt::Debug for Job<Q> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job")
            .field("nsid", &self.ns.nsid)
            .field("first_lba", &self.first_lba)
            .field("units", &self.generator.units())
            .finish()
    }
}

/// The depth a job asking `asked` of `io_size` commands runs at over `queue`: at most what
/// the queue holds (its depth, and its data region when that is shared).
fn depth_on<Q: HostQueue>(asked: usize, io_size: usize, queue: &IoQueue<Q>) -> usize {
    asked.min(queue.depth_for(io_size)).max(1)
}

impl<Q: HostQueue> Job<Q> {
    /// A job over blocks `first_lba .. first_lba + blocks` of `ns`.
    pub fn new(
        queue: IoQueue<Q>,
        ns: NsTarget,
        first_lba: u64,
        blocks: u64,
        spec: JobSpec,
        seed: u64,
        progress: Arc<Progress>,
    ) -> crate::Result<Self> {
        let bs = ns.block_size as usize;
        if spec.io_size == 0 || spec.io_size % bs != 0 {
            return Err(crate::Error::InvalidArgument(format!(
                "I/O size {} is not a multiple of the block size {bs}",
                spec.io_size
            )));
        }
        if spec.io_size > queue.limits().max_transfer {
            return Err(crate::Error::InvalidArgument(format!(
                "I/O size {} exceeds the largest transfer {}",
                spec.io_size,
                queue.limits().max_transfer
            )));
        }
        let blocks_per_io = (spec.io_size / bs) as u32;
        let mut units = blocks / u64::from(blocks_per_io);
        if spec.verify && units > VERIFY_MAX_UNITS {
            tracing::info!(
                units,
                kept = VERIFY_MAX_UNITS,
                "--verify: job range capped to bound its generation table"
            );
            units = VERIFY_MAX_UNITS;
        }
        if units == 0 {
            return Err(crate::Error::InvalidArgument(format!(
                "job range of {blocks} blocks is smaller than one I/O"
            )));
        }
        let depth = depth_on(spec.depth, spec.io_size, &queue);
        Ok(Self {
            generator: Generator::new(spec.pattern, spec.mix, units, seed),
            generations: if spec.verify {
                vec![0; units as usize]
            } else {
                Vec::new()
            },
            in_flight: InFlightUnits::new(depth),
            result: JobResult::new(ns.nsid),
            spec: JobSpec { depth, ..spec },
            asked_depth: spec.depth,
            queue,
            ns,
            first_lba,
            blocks_per_io,
            next_generation: 0,
            owner: verify::Owner {
                run: verify::Owner::fresh_run(),
                nsid: ns.nsid,
            },
            queue_generation: 0,
            stopping: false,
            progress,
        })
    }

    /// This job as one of a run's, which share `run` as their --verify stamp (a job alone
    /// has one of its own).
    pub fn with_run(mut self, run: u64) -> Self {
        self.owner.run = run;
        self
    }

    /// Commands it keeps in flight at most: the depth asked, capped by its queue's.
    pub fn depth(&self) -> usize {
        self.spec.depth
    }

    /// Stop submitting; in-flight I/O still completes.
    pub fn stop(&mut self) {
        self.stopping = true;
    }

    /// True when stopped (or dead) and nothing is in flight.
    pub fn is_drained(&self) -> bool {
        (self.stopping || !self.queue.is_connected()) && self.queue.in_flight() == 0
    }

    /// Results so far.
    pub fn result(&self) -> &JobResult {
        &self.result
    }

    /// The job's I/O queue.
    pub fn io_queue(&self) -> &IoQueue<Q> {
        &self.queue
    }

    /// True when a step has work even if the queue reports nothing: room to submit, or
    /// failures of a lost connection to deliver. A poller stepping only the jobs whose queue
    /// has completions ([`crate::io::ReadyQueues`]) steps these too.
    pub fn wants_step(&self) -> bool {
        let submits =
            !self.stopping && self.queue.is_connected() && self.queue.in_flight() < self.spec.depth;
        submits || self.queue.wants_poll()
    }

    /// After the controller reconnected: the job goes on over `queue`. Whatever was still in
    /// flight on the old one is failed first (lost with the connection). The target may have
    /// restarted and lost what was not flushed (a volatile cache, a malloc namespace), so every
    /// block's generation becomes unknown: reads still check the LBA tags, and each block is
    /// fully checked again once this run writes it anew.
    pub fn replace_queue(&mut self, queue: IoQueue<Q>) {
        self.queue.disconnect("replaced after a reconnect");
        self.step();
        // The target may have come back with shallower (or deeper) queues.
        let depth = depth_on(self.asked_depth, self.spec.io_size, &queue);
        self.spec.depth = depth;
        self.in_flight = InFlightUnits::new(depth);
        self.generations.fill(0);
        self.queue = queue;
        self.queue_generation += 1;
    }

    /// Give the results (and the queue) back.
    pub fn finish(self) -> (JobResult, IoQueue<Q>) {
        (self.result, self.queue)
    }

    /// Fill the queue, reap completions; returns the completions handled. (A transport that
    /// completes at submit, the loopback, reports the submissions of a step in that step.)
    pub fn step(&mut self) -> usize {
        self.refill(None);
        self.reap(None, None)
    }

    /// Reap completions, then refill the queue, so a completion's slot is reused in the same
    /// step: for a poller that steps a job when its queue has completions
    /// ([`super::job_set::JobSet`]), one step per completion instead of one to reap and
    /// another to submit. `now` is the poller's one clock read for its pass: the completions'
    /// time and the submissions' (a clock read per job and step was a sixteenth of the host's
    /// time per I/O with 128 jobs at queue depth 1). Latencies go to `latency` (the set's
    /// histogram for this job's namespace), not to the job's own result. Returns the
    /// completions handled.
    pub fn step_reap_first(&mut self, latency: &mut Histogram<u64>, now: Instant) -> usize {
        let n = self.reap(Some(latency), Some(now));
        self.refill(Some(now));
        n
    }

    /// `at`: the pass's time (else the refill reads the clock once for all it submits).
    fn refill(&mut self, at: Option<Instant>) {
        if !self.stopping && self.queue.is_connected() {
            // One clock read for the whole refill (the latency resolution is one pass).
            match at {
                Some(now) => self.queue.begin_batch_at(now),
                None => self.queue.begin_batch(),
            }
            self.submit_some();
            // On the wire now, not at the next poll.
            self.queue.end_batch();
        } else if !self.queue.is_connected() {
            self.progress
                .lost_queue_generation
                .fetch_max(self.queue_generation + 1, Ordering::Relaxed);
        }
    }

    /// Reaps the queue's completions into the results, their latencies into `shared_latency`
    /// if given (else the result's own histogram); returns how many.
    /// `pass_time`: the poller's time for this pass (see [`Job::step_reap_first`]).
    fn reap(
        &mut self,
        mut shared_latency: Option<&mut Histogram<u64>>,
        pass_time: Option<Instant>,
    ) -> usize {
        let (before_ios, before_bytes) =
            (self.result.reads + self.result.writes, self.result.bytes);
        let bs = self.ns.block_size as usize;
        let blocks_per_io = u64::from(self.blocks_per_io);
        let Self {
            queue,
            result,
            in_flight,
            generations,
            first_lba,
            spec,
            owner,
            stopping,
            ..
        } = self;
        let (owner, stopping) = (*owner, *stopping);
        // Lazy: read data is copied out of the registered region only to be verified.
        let on_complete = |c: IoCompletion, mut data: ReadData<'_, Q>| {
            // The token names the I/O's slot in `in_flight`.
            let Some((unit, carried)) = in_flight.take(c.token) else {
                result.record_error(format!("{} completion of no I/O in flight", c.kind.name()));
                return;
            };
            let lba = *first_lba + unit * blocks_per_io;
            let unit = unit as usize;
            match c.result {
                Ok(()) => {
                    let read = c.kind == IoKind::Read;
                    if read {
                        if spec.verify {
                            match data.bytes() {
                                Ok(data) => {
                                    match verify::check(data, bs, owner, lba, generations[unit]) {
                                        Ok(verify::Checked::Content) => result.verified_reads += 1,
                                        Ok(verify::Checked::Placement) => {
                                            result.placement_reads += 1
                                        }
                                        Err(m) => result.record_mismatch(m),
                                    }
                                }
                                Err(e) => result.record_error(format!("Read LBA {lba} data: {e}")),
                            }
                        }
                    } else if spec.verify {
                        generations[unit] = carried;
                    }
                    match shared_latency.as_deref_mut() {
                        // After the stop: outside the measured window (its data still checked).
                        _ if stopping => result.drained += 1,
                        Some(histogram) => {
                            record_latency(histogram, c.latency);
                            result.count(spec.io_size as u64, read);
                        }
                        None => result.record(c.latency, spec.io_size as u64, read),
                    }
                }
                Err(e) => {
                    if c.kind == IoKind::Write && spec.verify {
                        // The write may or may not have landed: only the LBA is known now.
                        generations[unit] = 0;
                    }
                    let message = format!("{} LBA {lba}: {e}", c.kind.name());
                    if matches!(e, crate::Error::ConnectionLost(_)) {
                        result.record_lost(message);
                    } else {
                        result.record_error(message);
                    }
                }
            }
        };
        let n = match pass_time {
            Some(now) => queue.poll_lazy_at(now, on_complete),
            None => queue.poll_lazy(on_complete),
        };
        let ios = self.result.reads + self.result.writes - before_ios;
        if ios > 0 {
            self.progress.ios.fetch_add(ios, Ordering::Relaxed);
            self.progress
                .bytes
                .fetch_add(self.result.bytes - before_bytes, Ordering::Relaxed);
        }
        n
    }

    fn submit_some(&mut self) {
        let bs = self.ns.block_size as usize;
        // In a shared data region (the host's `io_queue_data_size`) the depth is what it holds
        // of this job's I/O size (`depth_on`): runs of one size stay aligned to it, so that
        // many always fit, whatever order they complete in.
        while self.queue.in_flight() < self.spec.depth {
            let in_flight = &self.in_flight;
            let Some((op, unit)) = self.generator.next(|u| in_flight.contains(u)) else {
                return;
            };
            let lba = self.first_lba + unit * u64::from(self.blocks_per_io);
            let token = self.in_flight.next_slot();
            let mut generation = 0;
            let submitted = match op {
                Op::Read => self
                    .queue
                    .submit_read(&self.ns, lba, self.blocks_per_io, token),
                Op::Write if self.spec.verify => {
                    let owner = self.owner;
                    self.next_generation += 1;
                    generation = self.next_generation;
                    self.queue
                        .submit_write(&self.ns, lba, self.blocks_per_io, token, |slot| {
                            verify::fill(slot, bs, owner, lba, generation);
                        })
                }
                // Nobody checks what unverified writes carry: no fill, and no copy of the
                // slot into the queue's registered region either.
                Op::Write => {
                    self.queue
                        .submit_write_unfilled(&self.ns, lba, self.blocks_per_io, token)
                }
            };
            match submitted {
                Ok(()) => self.in_flight.fill(unit, generation),
                // Not an I/O: the job waits for a fresh queue (`replace_queue`) or the end.
                Err(crate::Error::ConnectionLost(_)) => return,
                Err(e) => {
                    self.result.record_error(format!("submit LBA {lba}: {e}"));
                    return;
                }
            }
        }
    }
}
