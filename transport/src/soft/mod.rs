//! The software RDMA device (to be written).
