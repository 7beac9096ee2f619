//! Discovery log page (header + entries). Invariant: a decoded log re-encodes to exactly its
//! encoded length and decodes back to the same value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nvmf_protocol::log::{DiscoveryLog, DiscoveryLogEntry, DiscoveryLogHeader};

fuzz_target!(|data: &[u8]| {
    let _ = DiscoveryLogHeader::decode(data);
    if let Ok(e) = DiscoveryLogEntry::decode(data) {
        let mut b = [0u8; 1024];
        e.encode_into(&mut b).unwrap();
        assert_eq!(DiscoveryLogEntry::decode(&b), Ok(e));
        assert_eq!(&b[..12], &data[..12]);
    }
    if let Ok(log) = DiscoveryLog::decode(data) {
        let mut b = vec![0u8; log.encoded_len()];
        assert_eq!(log.encode_into(&mut b), Ok(b.len()));
        assert_eq!(DiscoveryLog::decode(&b).as_ref(), Ok(&log));
        assert_eq!(&b[..18], &data[..18]);
    }
});
