//! nvmf-initiator: the host side, mirror image of the target.
//!
//! Will own controller bring-up (CAP/VS/CC/CSTS), I/O queue creation, keyed-SGL and in-capsule
//! data, request completion (both the SEND and the response must complete), a host poll group
//! that maps completions by qp_num, a blocking block-device API over the polled one, and the
//! `nvmf-perf` and `nvmf` tools.
