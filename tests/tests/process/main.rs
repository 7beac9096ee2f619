//! nvmf-tgt, nvmf and nvmf-perf as separate processes over the soft RDMA provider's TCP
//! fabric (`rig`): a target killed mid-I/O and restarted (`reconnect`).

mod reconnect;
mod rig;
