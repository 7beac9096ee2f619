//! Command and response capsules: SQE (and every typed view), CQE, in-capsule SGL lists.
//! Invariants: SQE/CQE decode-encode is byte exact; every view that decodes rebuilds an SQE
//! that decodes to the same view.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nvmf_protocol::{Cqe, SglDescriptor, Sqe, StatusContext};

macro_rules! view_roundtrip {
    ($sqe:expr, $($as:ident),+) => {
        $(
            if let Ok(v) = $sqe.$as() {
                let again = v.to_sqe().$as().expect(concat!(stringify!($as), " re-decode"));
                assert_eq!(again, v, stringify!($as));
            }
        )+
    };
}

fuzz_target!(|data: &[u8]| {
    if let Ok(sqe) = Sqe::decode(data) {
        assert_eq!(&sqe.to_bytes()[..], &data[..64]);
        let _ = sqe.psdt();
        let _ = sqe.fuse();
        let _ = sqe.fctype();
        if let Ok(sgl) = sqe.sgl1() {
            assert_eq!(SglDescriptor::decode(&sgl.to_bytes()), Ok(sgl));
        }
        view_roundtrip!(
            sqe,
            as_read,
            as_write,
            as_flush,
            as_write_zeroes,
            as_dataset_management,
            as_identify,
            as_get_log_page,
            as_set_features,
            as_get_features,
            as_keep_alive,
            as_async_event_request,
            as_abort,
            as_connect,
            as_property_get,
            as_property_set,
            as_disconnect
        );
        if let Ok(g) = sqe.as_get_log_page() {
            let _ = g.transfer_len();
        }
        if let Ok(d) = sqe.as_dataset_management()
            && let Ok(it) = nvmf_protocol::nvm::DsmRange::decode_list(&data[64..], d.ranges())
        {
            for r in it {
                assert_eq!(nvmf_protocol::nvm::DsmRange::decode(&r.to_bytes()), Ok(r));
            }
        }
        if let Ok(s) = sqe.as_property_set() {
            let _ = s.check_size();
        }
        for d in SglDescriptor::list(&data[64..]).flatten() {
            assert_eq!(SglDescriptor::decode(&d.to_bytes()), Ok(d));
        }
    }
    for ctx in [StatusContext::Nvm, StatusContext::Fabrics] {
        if let Ok(cqe) = Cqe::decode_in(data, ctx) {
            assert_eq!(&cqe.to_bytes()[..], &data[..16]);
            assert_eq!(Cqe::decode_in(&cqe.to_bytes(), ctx), Ok(cqe));
        }
    }
});
