//! nvmf-poller: the reactor runtime.
//!
//! Will own one pinned reactor thread per configured core, the busy loop over registered
//! pollers, the crossbeam-channel inbox for messages from other reactors and the control
//! thread, timers, and the idle mode that sleeps on file descriptors when no work arrives.
//! It knows nothing of RDMA or NVMe.
