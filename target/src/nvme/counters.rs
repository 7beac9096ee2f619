//! I/O counters with one writer (the reactor that owns the queue or the reactor's I/O context)
//! and any number of readers (SMART log, statistics). The writer updates them with a relaxed
//! load and store, not a read-modify-write, so the fast path pays no locked instruction.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Counters of one queue or one reactor.
#[derive(Debug, Default)]
pub struct IoCounters {
    reads: AtomicU64,
    writes: AtomicU64,
    bytes_read: AtomicU64,
    bytes_written: AtomicU64,
    other: AtomicU64,
    errors: AtomicU64,
    in_flight: AtomicU64,
}

/// A snapshot of [`IoCounters`] (also used for sums).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct IoSnapshot {
    /// Read and Compare commands.
    pub reads: u64,
    /// Write commands.
    pub writes: u64,
    /// Bytes read.
    pub bytes_read: u64,
    /// Bytes written.
    pub bytes_written: u64,
    /// Other commands (flush, write zeroes, DSM, admin).
    pub other: u64,
    /// Commands that failed.
    pub errors: u64,
    /// Commands started and not completed (queue occupancy).
    pub in_flight: u64,
}

fn bump(c: &AtomicU64, by: u64) {
    c.store(c.load(Relaxed).wrapping_add(by), Relaxed);
}

impl IoCounters {
    /// A read of `bytes` started.
    pub fn read(&self, bytes: u64) {
        bump(&self.reads, 1);
        bump(&self.bytes_read, bytes);
    }
    /// A write of `bytes` started.
    pub fn write(&self, bytes: u64) {
        bump(&self.writes, 1);
        bump(&self.bytes_written, bytes);
    }
    /// Another command started.
    pub fn other(&self) {
        bump(&self.other, 1);
    }
    /// A command failed.
    pub fn error(&self) {
        bump(&self.errors, 1);
    }
    /// A command went asynchronous.
    pub fn begin(&self) {
        bump(&self.in_flight, 1);
    }
    /// An asynchronous command completed.
    pub fn end(&self) {
        let v = self.in_flight.load(Relaxed);
        self.in_flight.store(v.saturating_sub(1), Relaxed);
    }
    /// Current values.
    pub fn snapshot(&self) -> IoSnapshot {
        IoSnapshot {
            reads: self.reads.load(Relaxed),
            writes: self.writes.load(Relaxed),
            bytes_read: self.bytes_read.load(Relaxed),
            bytes_written: self.bytes_written.load(Relaxed),
            other: self.other.load(Relaxed),
            errors: self.errors.load(Relaxed),
            in_flight: self.in_flight.load(Relaxed),
        }
    }
}

impl std::ops::AddAssign for IoSnapshot {
    fn add_assign(&mut self, o: IoSnapshot) {
        self.reads += o.reads;
        self.writes += o.writes;
        self.bytes_read += o.bytes_read;
        self.bytes_written += o.bytes_written;
        self.other += o.other;
        self.errors += o.errors;
        self.in_flight += o.in_flight;
    }
}
