//! The host's RDMA queues (the initiator's transport glue on a soft fabric, in process and over
//! TCP) against raw target connections that accept or refuse, take capsules, move data and answer
//! as the input says: malformed and misdirected responses, RDMA outside the offered keys, remote
//! invalidation, held receives, disconnects. Rules (checked in
//! `nvmf_initiator::rdma::fuzzing::hostile_target`, whose module doc says how the input is read):
//! no panic; every capsule is a command the host accepted, byte for byte; a CQE only for a command
//! in flight, once; data both ways exactly as sent while the target behaves; every command
//! reported at a settle; the host poll group back to its anchor afterwards.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nvmf_initiator::rdma::fuzzing::hostile_target;

fuzz_target!(|data: &[u8]| hostile_target(data));
