//! The soft CM's messages (connect request, reply, reject, RTU, disconnect), as anyone who
//! connects to a soft CM listener may send them. Invariant: any bytes decode without panic, and
//! what decodes re-encodes to a message that decodes the same.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nvmf_transport::soft::fuzzing::cm_message;

fuzz_target!(|data: &[u8]| cm_message(data));
