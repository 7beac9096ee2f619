//! nvmf-target: turns capsules into NVMe semantics, and the `nvmf-tgt` daemon.
//!
//! - [`config`]: the daemon's TOML configuration, validated with FILE:LINE: KEY messages.
//! - [`bdev`]: block devices behind one trait (null, malloc, file via io_uring), with
//!   per-reactor channels; the io_uring file device is the crate's only `unsafe` module.
//! - [`nvme`]: subsystems, controllers, Fabrics Connect / properties, the admin and NVM command
//!   sets, discovery, keep-alive; transport-free, with the execution interface the RDMA glue
//!   calls (documented in that module).
//! - [`rdma`]: the RDMA transport side (per-core poll groups on reactors, the acceptor thread,
//!   connection placement and event routing).
//!
//! - [`transport_glue`]: the request state machine with RDMA data movement that joins [`rdma`]
//!   to [`nvme`] (new -> need buffer -> RDMA READ -> execute -> RDMA WRITE + SEND -> done).
#![deny(unsafe_code)]

pub mod bdev;
pub mod config;
pub mod nvme;
pub mod rdma;
pub mod transport_glue;
