//! The target's whole request path under a hostile host: a running RDMA transport with the NVMe
//! handler on a reactor (soft in-process fabric), and raw host queues that connect (well-formed or
//! garbage private data), send capsules (garbage, steered SGLs, without receives for their
//! answers, with immediate data), send runts and disconnect as the input says. Invariants (checked
//! in `nvmf_target::transport_glue::fuzzing::hostile_host`, whose module doc gives the input's
//! layout): no panic on any thread; connects and sends answered; only 16-byte responses, each to a
//! CID outstanding on its queue; every command answered while its connection stands; after the
//! host leaves, no qpair, controller, request, buffer or receive slot held by the target.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nvmf_target::transport_glue::fuzzing::hostile_host;

fuzz_target!(|data: &[u8]| hostile_host(data));
