//! NVMe Qualified Names: validation and an inline, validated `Nqn` type.
//!
//! Two forms are accepted (NVMe base spec, "NVMe Qualified Names"):
//! - `nqn.yyyy-mm.<reverse domain>[:<anything>]`, e.g. `nqn.2014-08.org.nvmexpress.discovery`;
//! - `nqn.2014-08.org.nvmexpress:uuid:xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
//!
//! At most 223 bytes of UTF-8, never a NUL.

use crate::bytes::FixedStr;

/// Maximum NQN length in bytes (the wire field is 256 bytes, NUL terminated).
pub const NQN_MAX_LEN: usize = 223;
/// The well-known discovery subsystem NQN.
pub const DISCOVERY_NQN: &str = "nqn.2014-08.org.nvmexpress.discovery";
/// Prefix of the UUID-based NQN form.
pub const UUID_NQN_PREFIX: &str = "nqn.2014-08.org.nvmexpress:uuid:";

/// Why a string is not a valid NQN.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum NqnError {
    /// Empty string.
    #[error("empty")]
    Empty,
    /// More than 223 bytes.
    #[error("{0} bytes exceed 223")]
    TooLong(usize),
    /// A NUL byte inside.
    #[error("contains NUL")]
    Nul,
    /// Does not start with `nqn.`.
    #[error("does not start with \"nqn.\"")]
    BadPrefix,
    /// The `yyyy-mm` date is malformed.
    #[error("malformed yyyy-mm date")]
    BadDate,
    /// The reverse domain name is empty or has invalid characters.
    #[error("malformed reverse domain name")]
    BadDomain,
    /// The UUID form has a malformed UUID.
    #[error("malformed UUID")]
    BadUuid,
}

/// Check that `s` is a well-formed NQN.
pub fn validate_nqn(s: &str) -> Result<(), NqnError> {
    let b = s.as_bytes();
    if b.is_empty() {
        return Err(NqnError::Empty);
    }
    if b.len() > NQN_MAX_LEN {
        return Err(NqnError::TooLong(b.len()));
    }
    if b.contains(&0) {
        return Err(NqnError::Nul);
    }
    if let Some(uuid) = s.strip_prefix(UUID_NQN_PREFIX) {
        return if is_uuid(uuid.as_bytes()) {
            Ok(())
        } else {
            Err(NqnError::BadUuid)
        };
    }
    let rest = s.strip_prefix("nqn.").ok_or(NqnError::BadPrefix)?;
    let rb = rest.as_bytes();
    // yyyy-mm.
    if rb.len() < 8
        || !rb[..4].iter().all(u8::is_ascii_digit)
        || rb[4] != b'-'
        || !rb[5..7].iter().all(u8::is_ascii_digit)
        || rb[7] != b'.'
    {
        return Err(NqnError::BadDate);
    }
    let month = (rb[5] - b'0') * 10 + (rb[6] - b'0');
    if !(1..=12).contains(&month) {
        return Err(NqnError::BadDate);
    }
    let after = &rest[8..];
    let domain = after.split(':').next().unwrap_or("");
    let domain_ok = !domain.is_empty()
        && !domain.starts_with('.')
        && !domain.ends_with('.')
        && !domain.contains("..")
        && domain
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'.');
    if !domain_ok {
        return Err(NqnError::BadDomain);
    }
    Ok(())
}

fn is_uuid(u: &[u8]) -> bool {
    u.len() == 36
        && u.iter().enumerate().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => *c == b'-',
            _ => c.is_ascii_hexdigit(),
        })
}

/// A validated NVMe Qualified Name, stored inline.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Nqn(FixedStr<NQN_MAX_LEN>);

impl Nqn {
    /// Validate and copy `s`.
    pub fn parse(s: &str) -> Result<Self, NqnError> {
        validate_nqn(s)?;
        // validate_nqn bounded the length and excluded NUL, so FixedStr::new cannot fail.
        FixedStr::new(s, "NQN")
            .map(Self)
            .map_err(|_| NqnError::TooLong(s.len()))
    }

    /// The UUID form for a 16-byte UUID (lowercase hex, 8-4-4-4-12).
    pub fn from_uuid(uuid: [u8; 16]) -> Self {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut buf = [0u8; 68];
        buf[..32].copy_from_slice(UUID_NQN_PREFIX.as_bytes());
        let mut p = 32;
        for (i, byte) in uuid.iter().enumerate() {
            if matches!(i, 4 | 6 | 8 | 10) {
                buf[p] = b'-';
                p += 1;
            }
            buf[p] = HEX[usize::from(byte >> 4)];
            buf[p + 1] = HEX[usize::from(byte & 0xf)];
            p += 2;
        }
        let s = core::str::from_utf8(&buf).unwrap_or(DISCOVERY_NQN);
        Self::parse(s).unwrap_or_else(|_| Self::discovery())
    }

    /// The discovery subsystem NQN.
    pub fn discovery() -> Self {
        match FixedStr::new(DISCOVERY_NQN, "NQN") {
            Ok(s) => Self(s),
            Err(_) => Self(FixedStr::EMPTY),
        }
    }

    /// True for the well-known discovery NQN.
    pub fn is_discovery(&self) -> bool {
        self.as_str() == DISCOVERY_NQN
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        self.0.as_str()
    }

    /// The inline string (the type wire structures carry).
    pub fn as_fixed(&self) -> FixedStr<NQN_MAX_LEN> {
        self.0
    }
}

impl TryFrom<&FixedStr<NQN_MAX_LEN>> for Nqn {
    type Error = NqnError;
    fn try_from(s: &FixedStr<NQN_MAX_LEN>) -> Result<Self, NqnError> {
        Self::parse(s.as_str())
    }
}

impl From<Nqn> for FixedStr<NQN_MAX_LEN> {
    fn from(n: Nqn) -> Self {
        n.0
    }
}

impl core::fmt::Debug for Nqn {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        core::fmt::Debug::fmt(self.as_str(), f)
    }
}
impl core::fmt::Display for Nqn {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.as_str())
    }
}
impl core::str::FromStr for Nqn {
    type Err = NqnError;
    fn from_str(s: &str) -> Result<Self, NqnError> {
        Self::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_valid_names() {
        for s in [
            DISCOVERY_NQN,
            "nqn.2016-06.io.spdk:cnode1",
            "nqn.2014-08.org.nvmexpress:uuid:0f8fad5b-d9cb-469f-a165-70867728950e",
            "nqn.2014-08.org.nvmexpress:uuid:0F8FAD5B-D9CB-469F-A165-70867728950E",
            "nqn.2024-12.com.example:subsystem:with:colons and spaces",
        ] {
            assert_eq!(validate_nqn(s), Ok(()), "{s}");
            assert_eq!(Nqn::parse(s).unwrap().as_str(), s);
        }
        assert!(Nqn::parse(DISCOVERY_NQN).unwrap().is_discovery());
    }

    #[test]
    fn rejects_invalid_names() {
        assert_eq!(validate_nqn(""), Err(NqnError::Empty));
        assert_eq!(validate_nqn("testnqn"), Err(NqnError::BadPrefix));
        assert_eq!(validate_nqn("nqn.14-08.org.x"), Err(NqnError::BadDate));
        assert_eq!(validate_nqn("nqn.2014-13.org.x"), Err(NqnError::BadDate));
        assert_eq!(validate_nqn("nqn.2014-00.org.x"), Err(NqnError::BadDate));
        assert_eq!(validate_nqn("nqn.2014-08."), Err(NqnError::BadDomain));
        assert_eq!(validate_nqn("nqn.2014-08.:x"), Err(NqnError::BadDomain));
        assert_eq!(validate_nqn("nqn.2014-08.a..b:x"), Err(NqnError::BadDomain));
        assert_eq!(validate_nqn("nqn.2014-08.a_b:x"), Err(NqnError::BadDomain));
        assert_eq!(validate_nqn("nqn.2014-08.org.x\0"), Err(NqnError::Nul));
        assert_eq!(
            validate_nqn("nqn.2014-08.org.nvmexpress:uuid:0f8fad5b-d9cb-469f-a165-70867728950"),
            Err(NqnError::BadUuid)
        );
        assert_eq!(
            validate_nqn("nqn.2014-08.org.nvmexpress:uuid:0f8fad5bxd9cb-469f-a165-70867728950e"),
            Err(NqnError::BadUuid)
        );
    }

    #[test]
    fn length_limit_is_223_bytes() {
        let base = "nqn.2014-08.com.example:";
        let ok = format!("{base}{}", "a".repeat(NQN_MAX_LEN - base.len()));
        assert_eq!(ok.len(), 223);
        assert_eq!(validate_nqn(&ok), Ok(()));
        let long = format!("{ok}a");
        assert_eq!(validate_nqn(&long), Err(NqnError::TooLong(224)));
    }

    #[test]
    fn uuid_form_from_bytes() {
        let n = Nqn::from_uuid([
            0x0f, 0x8f, 0xad, 0x5b, 0xd9, 0xcb, 0x46, 0x9f, 0xa1, 0x65, 0x70, 0x86, 0x77, 0x28,
            0x95, 0x0e,
        ]);
        assert_eq!(
            n.as_str(),
            "nqn.2014-08.org.nvmexpress:uuid:0f8fad5b-d9cb-469f-a165-70867728950e"
        );
    }
}
