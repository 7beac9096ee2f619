//! nvmf-target: turns capsules into NVMe semantics.
//!
//! Will own Fabrics Connect / Property Get/Set / Disconnect, the admin and NVM command sets,
//! the per-request state machine (new -> need buffer -> RDMA READ -> execute -> RDMA WRITE +
//! SEND -> done), block devices (null, malloc, file via io_uring), subsystems with host
//! allow-lists, the discovery subsystem, and the nvmf-tgt daemon (config, signals, drain, stats).
//!
//! Built so far: [`rdma`], the RDMA transport side (per-core poll groups on reactors, the
//! acceptor thread, connection placement and event routing).

#![deny(unsafe_code)]

pub mod bdev;
pub mod config;
pub mod nvme;
pub mod rdma;
