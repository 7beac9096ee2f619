//! The transport conformance suite: one set of behaviours, run against every provider that is
//! available (soft in-process, soft TCP, and verbs when a device exists, e.g. rxe in the QEMU
//! lab). `cargo test -p nvmf-transport conformance` runs the soft ones; the verbs cases are
//! `#[ignore]`d (skipped) and run with `--include-ignored` where a device exists.

mod cm;
mod data;
mod fixture;
mod memory;
mod queues;

/// Instantiates every conformance case for one provider flavor, as `conformance_<flavor>::<case>`.
macro_rules! conformance {
    ($module:ident, $flavor:expr $(, #[$attr:meta])*) => {
        mod $module {
            use crate::fixture::Flavor;
            const F: Flavor = $flavor;
            #[test]
            $(#[$attr])*
            fn send_recv() {
                crate::data::send_recv(F)
            }
            #[test]
            $(#[$attr])*
            fn send_recv_inline() {
                crate::data::send_recv_inline(F)
            }
            #[test]
            $(#[$attr])*
            fn send_with_imm() {
                crate::data::send_with_imm(F)
            }
            #[test]
            $(#[$attr])*
            fn unsignaled_sends_complete_silently() {
                crate::data::unsignaled_sends(F)
            }
            #[test]
            $(#[$attr])*
            fn rdma_write_good_rkey() {
                crate::data::rdma_write_good_rkey(F)
            }
            #[test]
            $(#[$attr])*
            fn rdma_write_bad_rkey() {
                crate::data::rdma_write_bad_rkey(F)
            }
            #[test]
            $(#[$attr])*
            fn rdma_read_good_rkey() {
                crate::data::rdma_read_good_rkey(F)
            }
            #[test]
            $(#[$attr])*
            fn rdma_read_bad_rkey() {
                crate::data::rdma_read_bad_rkey(F)
            }
            #[test]
            $(#[$attr])*
            fn rdma_read_out_of_bounds() {
                crate::data::rdma_read_out_of_bounds(F)
            }
            #[test]
            $(#[$attr])*
            fn srq_shared_by_many_qps() {
                crate::queues::srq_shared_by_many_qps(F)
            }
            #[test]
            $(#[$attr])*
            fn flush_on_error() {
                crate::queues::flush_on_error(F)
            }
            #[test]
            $(#[$attr])*
            fn last_wqe_reached_per_device() {
                crate::queues::last_wqe_reached(F)
            }
            #[test]
            $(#[$attr])*
            fn rnr_retry_forever_then_receive() {
                crate::queues::rnr_retry_forever(F)
            }
            #[test]
            $(#[$attr])*
            fn rnr_retry_exceeded() {
                crate::queues::rnr_retry_exceeded(F)
            }
            #[test]
            $(#[$attr])*
            fn completion_channel_wakes() {
                crate::queues::completion_channel_wakes(F)
            }
            #[test]
            $(#[$attr])*
            fn thousand_qps_one_cq() {
                crate::queues::thousand_qps_one_cq(F)
            }
            #[test]
            $(#[$attr])*
            fn cm_connect_accept_disconnect() {
                crate::cm::connect_accept_disconnect(F)
            }
            #[test]
            $(#[$attr])*
            fn cm_reject_with_private_data() {
                crate::cm::reject_with_private_data(F)
            }
            #[test]
            $(#[$attr])*
            fn cm_private_data_limits() {
                crate::cm::private_data_limits(F)
            }
            #[test]
            $(#[$attr])*
            fn memory_read_write_at_bounds() {
                crate::memory::read_write_at_bounds(F)
            }
            #[test]
            $(#[$attr])*
            fn memory_register_owned_and_raw_memory() {
                crate::memory::register_owned_and_raw_memory(F)
            }
            #[test]
            $(#[$attr])*
            fn memory_window_bind_access_and_local_invalidate() {
                crate::memory::window_bind_access_and_local_invalidate(F)
            }

            #[test]
            $(#[$attr])*
            fn memory_window_invalidated_by_send_with_inv() {
                crate::memory::window_invalidated_by_send_with_inv(F)
            }
            #[test]
            $(#[$attr])*
            fn memory_send_with_inv_of_region_rkey_fails() {
                crate::memory::send_with_inv_of_region_rkey_fails(F)
            }
            #[test]
            $(#[$attr])*
            fn memory_local_invalidate_of_region_rkey_fails() {
                crate::memory::local_invalidate_of_region_rkey_fails(F)
            }
        }
    };
}

/// Cases where rxe departs from the spec (see each case): soft flavors only.
mod conformance_soft_only {
    use crate::fixture::Flavor;
    #[test]
    fn memory_window_bounds_are_enforced_inprocess() {
        crate::memory::window_bounds_are_enforced(Flavor::SoftInProcess)
    }
    #[test]
    fn memory_window_bounds_are_enforced_tcp() {
        crate::memory::window_bounds_are_enforced(Flavor::SoftTcp)
    }
}

conformance!(conformance_soft_inprocess, Flavor::SoftInProcess);
conformance!(conformance_soft_tcp, Flavor::SoftTcp);
// Ignored (reported as skipped) where there is no RDMA device; the QEMU lab runs them with
// `--include-ignored`, and there a missing device is a failure.
conformance!(
    conformance_verbs,
    Flavor::Verbs,
    #[ignore = "needs an RDMA device: run in the QEMU lab (scripts/interop.sh verbs)"]
);
