//! The transport conformance suite: one set of behaviours, run against every provider that is
//! available (soft in-process, soft TCP, and verbs when a device exists, e.g. rxe in the QEMU
//! lab). `cargo test -p nvmf-transport conformance` runs them all; the verbs cases skip with a
//! notice where there is no device.

mod cm;
mod data;
mod fixture;
mod queues;

/// Instantiates every conformance case for one provider flavor, as `conformance_<flavor>::<case>`.
macro_rules! conformance {
    ($module:ident, $flavor:expr) => {
        mod $module {
            use crate::fixture::Flavor;
            const F: Flavor = $flavor;
            #[test]
            fn send_recv() {
                crate::data::send_recv(F)
            }
            #[test]
            fn send_recv_inline() {
                crate::data::send_recv_inline(F)
            }
            #[test]
            fn send_with_imm() {
                crate::data::send_with_imm(F)
            }
            #[test]
            fn unsignaled_sends_complete_silently() {
                crate::data::unsignaled_sends(F)
            }
            #[test]
            fn rdma_write_good_rkey() {
                crate::data::rdma_write_good_rkey(F)
            }
            #[test]
            fn rdma_write_bad_rkey() {
                crate::data::rdma_write_bad_rkey(F)
            }
            #[test]
            fn rdma_read_good_rkey() {
                crate::data::rdma_read_good_rkey(F)
            }
            #[test]
            fn rdma_read_bad_rkey() {
                crate::data::rdma_read_bad_rkey(F)
            }
            #[test]
            fn rdma_read_out_of_bounds() {
                crate::data::rdma_read_out_of_bounds(F)
            }
            #[test]
            fn srq_shared_by_many_qps() {
                crate::queues::srq_shared_by_many_qps(F)
            }
            #[test]
            fn flush_on_error() {
                crate::queues::flush_on_error(F)
            }
            #[test]
            fn last_wqe_reached_per_device() {
                crate::queues::last_wqe_reached(F)
            }
            #[test]
            fn rnr_retry_forever_then_receive() {
                crate::queues::rnr_retry_forever(F)
            }
            #[test]
            fn rnr_retry_exceeded() {
                crate::queues::rnr_retry_exceeded(F)
            }
            #[test]
            fn completion_channel_wakes() {
                crate::queues::completion_channel_wakes(F)
            }
            #[test]
            fn thousand_qps_one_cq() {
                crate::queues::thousand_qps_one_cq(F)
            }
            #[test]
            fn cm_connect_accept_disconnect() {
                crate::cm::connect_accept_disconnect(F)
            }
            #[test]
            fn cm_reject_with_private_data() {
                crate::cm::reject_with_private_data(F)
            }
            #[test]
            fn cm_private_data_limits() {
                crate::cm::private_data_limits(F)
            }
        }
    };
}

conformance!(conformance_soft_inprocess, Flavor::SoftInProcess);
conformance!(conformance_soft_tcp, Flavor::SoftTcp);
conformance!(conformance_verbs, Flavor::Verbs);
