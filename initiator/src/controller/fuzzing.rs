//! The host's handling of what a target sends, under a fuzzer (feature `fuzzing`; the
//! `fuzz_host_hostile_target` target in `fuzz/`), and the unit test that runs it on seeded
//! random bytes.
//!
//! A [`Controller`] attaches through a fabric whose every answer comes from the input: CQEs
//! with the command's CID or another, repeated or not, any status and result, and the data a
//! command asked for written into the host's buffer (printable bytes and NULs, so string fields
//! decode and runs get further). Where bring-up checks a value (Connect's CNTLID, CSTS.RDY) the
//! answer is plausible unless the input says otherwise, and an input used up answers
//! plausibly: its bytes perturb a working target. After bring-up the run reads the discovery log
//! and the SMART log, submits a read on an I/O queue and shuts down. Rules: no panic and no
//! hang, whatever the answers (each call returns a value or a typed error; waits end on the
//! virtual clock's timeouts).

use std::ops::Range;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nvmf_protocol::{Cqe, SglDescriptor, Sqe, Status, StatusContext};

use super::{Controller, ControllerOptions};
use crate::clock::{Clock, VirtualClock};
use crate::queue::{
    ConnectError, DataRegion, Fabric, HostQueue, QueueConnectParams, QueueError, TransportAddress,
};

/// Run one input; panics only where the host would.
pub fn hostile_target(data: &[u8]) {
    run(data);
}

/// One run; whether bring-up attached (so the test can tell runs reach the later paths).
pub(crate) fn run(data: &[u8]) -> bool {
    let clock = CoarseClock(VirtualClock::new());
    let mut o = ControllerOptions::new(
        "nqn.2024-01.io.nvmf-rs:loopback",
        "nqn.2014-08.org.nvmexpress:uuid:2b4c8d1e-0f3a-4e5b-9c6d-7e8f9a0b1c2d",
        [7; 16],
    );
    o.admin_timeout = Duration::from_millis(20);
    o.io_queues = 2;
    // Small queues: each run allocates and zeroes its queues' data regions.
    o.io_queue_depth = 4;
    o.max_io_size = 16 * 1024;
    let fabric = HostileFabric(Entropy::new(data));
    // Ok or a typed error, whatever the bytes.
    let Ok(mut c) = Controller::connect(fabric, TransportAddress::loopback(), o, Arc::new(clock))
    else {
        return false;
    };
    let _ = c.discovery_log();
    let _ = c.get_log_page(nvmf_protocol::log::LogId::SmartHealth, 0, 512);
    let ns: Vec<_> = c.namespaces().iter().map(|n| n.target()).collect();
    if let (Some(ns), Ok(q)) = (ns.first(), c.io_queue_mut(0)) {
        let _ = q.submit_read(ns, 0, 1, 1);
        q.poll(|_, _| {});
    }
    let _ = c.shutdown();
    true
}

/// Virtual time that moves at least 1 ms per idle: a wait for an answer that never comes ends
/// after tens of polls, not the 20,000 a microsecond step takes to reach a 20 ms timeout (the
/// run's speed is the fuzzer's).
struct CoarseClock(VirtualClock);

impl Clock for CoarseClock {
    fn now(&self) -> std::time::Instant {
        self.0.now()
    }
    fn idle(&self, d: Duration) {
        self.0.advance(d.max(Duration::from_millis(1)));
    }
}

/// The input's bytes, handed out in order as the target's choices; zeroes once used up.
#[derive(Clone)]
struct Entropy(Arc<Mutex<EntropyState>>);

struct EntropyState {
    bytes: Vec<u8>,
    at: usize,
    /// `bytes` as data (`PRINTABLE`), made once: fills are copies.
    printable: Vec<u8>,
}

impl Entropy {
    fn new(data: &[u8]) -> Entropy {
        Entropy(Arc::new(Mutex::new(EntropyState {
            bytes: data.to_vec(),
            at: 0,
            printable: data.iter().map(|&x| PRINTABLE[usize::from(x)]).collect(),
        })))
    }

    fn take<const N: usize>(&self) -> [u8; N] {
        let mut g = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let state = &mut *g;
        let mut out = [0u8; N];
        for b in &mut out {
            *b = state.bytes.get(state.at).copied().unwrap_or(0);
            state.at += 1;
        }
        out
    }

    fn u8(&self) -> u8 {
        self.take::<1>()[0]
    }

    fn u16(&self) -> u16 {
        u16::from_le_bytes(self.take())
    }

    fn u64(&self) -> u64 {
        u64::from_le_bytes(self.take())
    }

    /// The data a command asked for: the input from an offset it names, wrapped, as printable
    /// bytes or NULs (two bytes of input per fill, not one per byte).
    fn fill(&self, out: &mut [u8]) {
        let from = usize::from(self.u16());
        let g = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let source = &g.printable;
        if source.is_empty() {
            out.fill(0);
            return;
        }
        let mut start = from % source.len();
        let mut done = 0;
        while done < out.len() {
            let n = (source.len() - start).min(out.len() - done);
            out[done..done + n].copy_from_slice(&source[start..start + n]);
            done += n;
            start = 0;
        }
    }
}

/// A byte of input as data: below 16 a NUL, else printable.
const PRINTABLE: [u8; 256] = {
    let mut table = [0u8; 256];
    let mut i = 16;
    while i < 256 {
        table[i] = 0x20 + (i as u8) % 0x5f;
        i += 1;
    }
    table
};

/// A queue whose target answers with the input's bytes.
struct HostileQueue {
    entropy: Entropy,
    region: Vec<u8>,
    pending: Vec<Cqe>,
    qid: u16,
}

impl HostQueue for HostileQueue {
    fn qid(&self) -> u16 {
        self.qid
    }
    fn depth(&self) -> u16 {
        32
    }
    fn region(&self) -> DataRegion {
        DataRegion {
            address: 0x1000,
            key: 1,
            len: self.region.len(),
        }
    }
    fn region_bytes(&self) -> &[u8] {
        &self.region
    }
    fn region_bytes_mut(&mut self) -> &mut [u8] {
        &mut self.region
    }
    fn submit(&mut self, sqe: &Sqe, _in_capsule: Option<Range<usize>>) -> Result<(), QueueError> {
        let e = &self.entropy;
        if let Ok(SglDescriptor::KeyedDataBlock {
            address, length, ..
        }) = sqe.sgl1()
            && address >= 0x1000
        {
            let start = (address - 0x1000) as usize;
            let end = start + length.get() as usize;
            if let Some(data) = self.region.get_mut(start..end) {
                e.fill(data);
                if sqe.opcode == 0x06 && sqe.cdw10 & 0xff == 2 && data.len() >= 12 {
                    // A short active namespace list (random ones run to 1024 entries).
                    data[..12].copy_from_slice(&[1, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0]);
                }
            }
        }
        // Plausible where bring-up checks a value (Connect's CNTLID, CSTS.RDY) unless the
        // input's byte says otherwise, so runs reach the later paths; the input's elsewhere.
        let result = match (sqe.opcode, sqe.nsid as u8, sqe.cdw11) {
            (0x7F, 0x01, _) | (0x7F, 0x04, 0x1C) if e.u8() < 250 => 1,
            _ => e.u64(),
        };
        let cid = if e.u16() < 65000 { sqe.cid } else { e.u16() };
        let mut cqe = Cqe::success(cid, e.u16(), e.u16(), result);
        let status = e.u16();
        if status >= 65236 {
            cqe.status = Status::from_field(e.u16(), StatusContext::Nvm);
        }
        self.pending.push(cqe);
        if e.u8() >= 226 {
            self.pending.push(cqe);
        }
        Ok(())
    }
    fn poll(&mut self, out: &mut [Cqe]) -> Result<usize, QueueError> {
        let n = self.pending.len().min(out.len());
        out[..n].copy_from_slice(&self.pending[..n]);
        self.pending.drain(..n);
        Ok(n)
    }
    fn is_connected(&self) -> bool {
        true
    }
    fn disconnect(&mut self) {}
}

/// Every queue it connects answers from the same input, in the order the host asks.
struct HostileFabric(Entropy);

impl Fabric for HostileFabric {
    type Queue = HostileQueue;
    fn connect(&self, p: &QueueConnectParams) -> Result<HostileQueue, ConnectError> {
        Ok(HostileQueue {
            entropy: self.0.clone(),
            region: vec![0; p.data_region_len],
            pending: Vec::new(),
            qid: p.qid,
        })
    }
}

#[cfg(test)]
mod tests {
    /// Seeded random inputs (what the fuzzer explores by coverage): never a panic or a hang,
    /// and some get past bring-up to the later paths.
    #[test]
    fn a_target_answering_garbage_never_panics_the_host() {
        let mut attached = 0;
        for seed in 0..200 {
            let mut rng = fastrand::Rng::with_seed(seed);
            let len = rng.usize(0..4096);
            let bytes: Vec<u8> = (0..len).map(|_| rng.u8(..)).collect();
            attached += usize::from(super::run(&bytes));
        }
        assert!(
            attached > 0,
            "some garbage must get past bring-up to test the later paths"
        );
    }
}
