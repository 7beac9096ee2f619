//! Stress: 64 qpairs, a random mix of chains (SEND only, RDMA WRITEs + SEND, RDMA READs then
//! SEND, some failing by a bad rkey), with QP failures and connection drops injected, each
//! failed host reconnected on a fresh qpair. At the end: nothing leaked (receive slots checked
//! against the SRQ's real occupancy, buffers, requests), no drain ended by its timeout, and
//! every request ended exactly once (completed or aborted).
//!
//! A few seconds by default; `NVMF_STRESS_SECS=60 cargo test -p nvmf-transport --test
//! pollgroup -- --ignored stress` runs the long version.

use std::time::{Duration, Instant};

use nvmf_transport::pollgroup::*;

use crate::fixture::{Flavor, Fx};
use crate::script::*;

const QPAIRS: usize = 64;
/// Commands a host keeps in flight (below the depth: the group must never see an overrun).
const IN_FLIGHT: usize = 6;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

pub fn stress(flavor: Flavor, secs: u64) {
    let Some(fx) = Fx::open(flavor) else { return };
    let soft = fx.ctx.as_soft().ok().map(|s| s.faults());
    let cfg = PollGroupConfig {
        srq_depth: 1024,
        max_qpairs: QPAIRS as u32 + 8,
        max_queue_depth: 16,
        in_capsule_data_size: 0,
        io_unit_size: 4096,
        data_buffers: 256,
        max_requests: 512,
        batch: 32,
        drain_timeout: Duration::from_secs(10),
        drain_grace: Duration::from_millis(20),
        recv_repost: RecvRepost::EndOfPass,
        silent_answers: 3,
        silent_flush_idle_polls: 4096,
    };
    let shape = QpairShape {
        depth: 16,
        read_depth: 4,
        rnr_retry: 7,
        send_queue: None,
    };
    let mut rig = ScriptRig::new(fx, QPAIRS, cfg, shape);
    let mut rng = Rng(0x2545_f491_4f6c_dd1d ^ secs);
    // Per host: commands sent and answers counted since its last (re)connection.
    let mut sent = vec![0usize; QPAIRS];
    let mut base = vec![0usize; QPAIRS];
    let mut dead = [false; QPAIRS];
    // Why each dead host is dead (for the report when a fault had no effect).
    let mut why = [""; QPAIRS];
    let mut seq = 0u32;
    let (mut faults, mut reconnects) = (0u64, 0u64);
    let end = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < end {
        for i in 0..QPAIRS {
            if dead[i] || sent[i] - (rig.answers[i].len() - base[i]) >= IN_FLIGHT {
                continue;
            }
            let mut cmd = match rng.below(3) {
                0 => Cmd::new(seq, OP_SEND, 0),
                1 => Cmd::new(seq, OP_WRITE, 1 + rng.below(4) as u8),
                _ => Cmd::new(seq, OP_READ, 1 + rng.below(6) as u8),
            };
            if cmd.op != OP_SEND && rng.below(200) == 0 {
                cmd.bad_at = rng.below(cmd.count as u64) as u8;
                dead[i] = true; // the qpair will drain
                why[i] = "bad rkey";
            }
            seq += 1;
            if rig.cmd(i, cmd, true) {
                sent[i] += 1;
            } else {
                dead[i] = true;
                why[i] = "host post failed";
            }
        }
        if let Some(f) = &soft {
            if rng.below(40) == 0 {
                let i = rng.below(QPAIRS as u64) as usize;
                if !dead[i] {
                    let qpn = rig.pg_qpn[i];
                    let injected = if rng.below(2) == 0 {
                        why[i] = "fail_qp";
                        f.fail_qp(qpn).expect("fail a QP");
                        true
                    } else {
                        why[i] = "drop_connection";
                        // The soft TCP fabric opens a QP's data connection lazily: a QP
                        // with none yet has nothing to drop (an error, no fault injected).
                        f.drop_connection(qpn).is_ok()
                    };
                    if injected {
                        dead[i] = true;
                        faults += 1;
                    }
                }
            }
        }
        for _ in 0..4 {
            rig.poll_pg();
            rig.poll_host();
        }
        for i in 0..QPAIRS {
            if dead[i] && rig.gone(rig.pg_qpn[i]) {
                rig.replace(i);
                dead[i] = false;
                sent[i] = 0;
                base[i] = rig.answers[i].len();
                reconnects += 1;
            }
        }
    }
    // A fault can leave its qpair untouched (the soft TCP fabric's drop before the data
    // connection is up): the group has nothing to drain there, so the test disconnects those.
    let mut no_effect = Vec::new();
    for i in 0..QPAIRS {
        let qpn = rig.pg_qpn[i];
        if dead[i] && !rig.gone(qpn) && rig.pg.qpair_phase(qpn) == Some(QpairPhase::Active) {
            no_effect.push((i, why[i]));
            rig.pg.disconnect(&mut rig.h, qpn);
        }
    }
    // Quiesce: the live hosts get every answer; the failed qpairs finish draining.
    let deadline = Instant::now() + crate::fixture::patience();
    loop {
        let missing: Vec<(usize, usize, usize)> = (0..QPAIRS)
            .filter(|&i| !dead[i] && rig.answers[i].len() - base[i] != sent[i])
            .map(|i| (i, sent[i], rig.answers[i].len() - base[i]))
            .collect();
        let draining: Vec<(usize, &str, Option<QpairPhase>)> = (0..QPAIRS)
            .filter(|&i| dead[i] && !rig.gone(rig.pg_qpn[i]))
            .map(|i| (i, why[i], rig.pg.qpair_phase(rig.pg_qpn[i])))
            .collect();
        if missing.is_empty() && draining.is_empty() && rig.pg.requests_in_use() == 0 {
            break;
        }
        if Instant::now() > deadline {
            let states: Vec<_> = missing
                .iter()
                .map(|&(i, _, _)| {
                    (
                        rig.pg.qpair_phase(rig.pg_qpn[i]),
                        rig.pg.qpair_send_usage(rig.pg_qpn[i]),
                        rig.sends_ok[i],
                        rig.sends_failed[i],
                    )
                })
                .collect();
            panic!(
                "quiesce: hosts missing answers (host, sent, answered) {missing:?} states \
                 {states:?}; still draining {draining:?}; requests {}; {:?}",
                rig.pg.requests_in_use(),
                rig.pg.stats()
            );
        }
        rig.poll_pg();
        rig.poll_host();
    }
    eprintln!("faults that left their qpair healthy (disconnected by the test): {no_effect:?}");
    let s = rig.pg.stats();
    eprintln!(
        "stress {flavor:?} {secs}s: {} capsules, {faults} faults, {reconnects} reconnects, {s:?}",
        rig.h.capsules
    );
    assert_eq!(s.drained_timeout, 0, "a drain needed its timeout: {s:?}");
    assert_eq!(s.overruns, 0, "{s:?}");
    assert_eq!(s.recv_slot_errors, 0, "{s:?}");
    assert_eq!(s.kind_mismatches, 0, "{s:?}");
    assert!(rig.h.capsules > QPAIRS as u64, "the rig did work");
    if soft.is_some() {
        assert!(faults > 0, "faults were injected");
    }
    // Every request born ended exactly once (answered, failed, or aborted then finished).
    rig.h.assert_each_ended_once();
    assert_eq!(rig.h.ended.len() as u64, rig.h.capsules);
    rig.assert_nothing_leaked();
}

/// Seconds for the long run (`NVMF_STRESS_SECS`, 60 by default).
pub fn long_secs() -> u64 {
    std::env::var("NVMF_STRESS_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60)
}
