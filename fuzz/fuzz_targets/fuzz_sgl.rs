//! SGL descriptors. Invariant: a decoded descriptor re-encodes to bytes that decode to the same
//! descriptor, and the meaningful bytes (address/offset, length, key, identifier) match.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nvmf_protocol::SglDescriptor;

fuzz_target!(|data: &[u8]| {
    if let Ok(d) = SglDescriptor::decode(data) {
        let b = d.to_bytes();
        assert_eq!(SglDescriptor::decode(&b), Ok(d));
        assert_eq!(b[15], data[15]);
        match d {
            SglDescriptor::KeyedDataBlock { .. } => assert_eq!(&b[..15], &data[..15]),
            SglDescriptor::BitBucket { .. } => assert_eq!(&b[8..12], &data[8..12]),
            _ => assert_eq!(&b[..12], &data[..12]),
        }
        let _ = d.is_null();
        let _ = d.data_length();
    }
    for d in SglDescriptor::list(data).flatten() {
        assert_eq!(SglDescriptor::decode(&d.to_bytes()), Ok(d));
    }
});
