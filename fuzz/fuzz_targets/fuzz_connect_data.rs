//! Fabrics Connect data (1024 bytes) and NQN validation. Invariant: decode-encode-decode is
//! stable and the fixed fields are byte exact.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nvmf_protocol::fabrics::ConnectData;

fuzz_target!(|data: &[u8]| {
    if let Ok(d) = ConnectData::decode(data) {
        let b = d.to_bytes();
        assert_eq!(ConnectData::decode(&b), Ok(d));
        assert_eq!(&b[..18], &data[..18]);
        if let Ok(n) = d.subnqn() {
            assert_eq!(n.as_str(), d.subnqn.as_str());
        }
        let _ = d.hostnqn();
    }
    if let Ok(s) = core::str::from_utf8(data)
        && nvmf_protocol::validate_nqn(s).is_ok()
    {
        assert!(s.len() <= 223);
        assert_eq!(
            nvmf_protocol::Nqn::parse(s).map(|n| n.as_str().len()),
            Ok(s.len())
        );
    }
});
