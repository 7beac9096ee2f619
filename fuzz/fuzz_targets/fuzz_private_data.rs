//! RDMA CM private data: connect request, accept, reject. Invariant: decode-encode reproduces
//! the field bytes and decodes to the same value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nvmf_protocol::cm::{RdmaAccept, RdmaConnectRequest, RdmaReject};

fuzz_target!(|data: &[u8]| {
    if let Ok(r) = RdmaConnectRequest::decode(data) {
        let b = r.to_bytes();
        assert_eq!(&b[..10], &data[..10]);
        assert_eq!(RdmaConnectRequest::decode(&b), Ok(r));
        let _ = r.check();
        for own in [0u16, 1, 128, u16::MAX] {
            let d = r.negotiated_depth(own);
            assert!(d <= own && d <= r.hrqsize);
        }
    }
    if let Ok(a) = RdmaAccept::decode(data) {
        let b = a.to_bytes();
        assert_eq!(&b[..4], &data[..4]);
        assert_eq!(RdmaAccept::decode(&b), Ok(a));
    }
    if let Ok(j) = RdmaReject::decode(data) {
        let b = j.to_bytes();
        assert_eq!(&b[..], &data[..4]);
        assert_eq!(RdmaReject::decode(&b), Ok(j));
    }
});
