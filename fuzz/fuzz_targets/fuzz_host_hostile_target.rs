//! The host against a target whose every answer comes from the input (CQEs with any CID, status
//! and result, repeated or not; the data each command asked for): bring-up, the discovery and
//! SMART logs, a read, shutdown. Invariant (checked in
//! `nvmf_initiator::controller::fuzzing::hostile_target`, whose module doc says how the input is
//! read): no panic and no hang; every call returns a value or a typed error.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nvmf_initiator::controller::fuzzing::hostile_target;

fuzz_target!(|data: &[u8]| hostile_target(data));
