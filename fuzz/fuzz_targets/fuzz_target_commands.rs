//! The target's command path: sequences of capsules, as a host on the network may send them, on a
//! connected admin queue, two I/O queues and an unconnected one (Connect, Fabrics, admin and NVM
//! commands, keep-alive expiry), on a malloc and a null namespace. Invariants (checked in
//! `nvmf_target::nvme::fuzzing::commands`, whose module doc gives the input's layout): no panic;
//! every command answered once with its CID; nothing left in flight; reads return what the
//! writes, zeroes and deallocations before them left (a shadow copy of the malloc namespace), the
//! null namespace reads zeroes; in-capsule data planned inside the capsule.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nvmf_target::nvme::fuzzing::commands;

fuzz_target!(|data: &[u8]| commands(data));
