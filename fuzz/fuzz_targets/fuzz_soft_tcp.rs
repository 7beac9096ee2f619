//! The soft TCP fabric's frames, as a buggy or hostile peer's stream may carry them, read by a
//! connected QP with receives and requests of its own outstanding. Invariants (checked in
//! `nvmf_transport::soft::fuzzing::tcp_stream`, whose module doc gives the input's layout): no
//! panic, memory changed only where the peer may write, completions only of the QP's own work
//! requests, the QP in RTS or ERR, and the stream read to its end.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nvmf_transport::soft::fuzzing::tcp_stream;

fuzz_target!(|data: &[u8]| tcp_stream(data));
