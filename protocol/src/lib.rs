//! nvmf-protocol: the NVMe and NVMe-oF wire formats both the target and the initiator speak.
//!
//! Owns every structure that crosses the wire (SQE/CQE capsules, SGL descriptors, Fabrics
//! commands, Identify data, log pages, features, controller properties, RDMA CM private data)
//! and NQN validation. Pure data: bytes in, typed values or typed errors out; no I/O.
