//! Admin data structures: Identify Controller/Namespace, namespace lists, namespace
//! identification descriptors, SMART and error log entries. Invariant: decode-encode-decode is
//! stable.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nvmf_protocol::identify::{IdentifyController, IdentifyNamespace, NsIdDescriptor, NsList};
use nvmf_protocol::log::{ErrorLogEntry, SmartLog};

fuzz_target!(|data: &[u8]| {
    let mut page = vec![0u8; 4096];
    if let Ok(c) = IdentifyController::decode(data) {
        c.encode_into(&mut page).unwrap();
        assert_eq!(IdentifyController::decode(&page), Ok(c));
    }
    if let Ok(n) = IdentifyNamespace::decode(data) {
        n.encode_into(&mut page).unwrap();
        assert_eq!(IdentifyNamespace::decode(&page), Ok(n));
        let _ = n.block_size();
    }
    if let Ok(l) = NsList::decode(data) {
        l.encode_into(&mut page).unwrap();
        assert_eq!(NsList::decode(&page), Ok(l));
    }
    if let Ok(v) = NsIdDescriptor::decode_list(data)
        && NsIdDescriptor::encode_list(&v, &mut page).is_ok()
    {
        assert_eq!(NsIdDescriptor::decode_list(&page), Ok(v));
    }
    if let Ok(s) = SmartLog::decode(data) {
        s.encode_into(&mut page).unwrap();
        assert_eq!(SmartLog::decode(&page), Ok(s));
    }
    if let Ok(e) = ErrorLogEntry::decode(data) {
        assert_eq!(ErrorLogEntry::decode(&e.to_bytes()), Ok(e));
    }
});
