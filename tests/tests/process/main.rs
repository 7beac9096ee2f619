//! nvmf-tgt, nvmf and nvmf-perf as separate processes over the soft RDMA provider's TCP
//! fabric (`rig`): a target killed mid-I/O and restarted (`reconnect`); the block-range commands
//! end to end on a file and a malloc namespace (`block_commands`); nvmf-perf's count of the
//! per-I/O keys the host had to invalidate itself (`per_io_keys`); `nvmf show-regs` reading
//! nvmf-tgt's properties (`registers`); a feature's data buffer both ways (`features`).

mod block_commands;
mod features;
mod per_io_keys;
mod reconnect;
mod registers;
mod rig;
