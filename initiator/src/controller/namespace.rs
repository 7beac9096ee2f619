//! A namespace as the host sees it: size, block size and identifiers, from Identify Namespace
//! and the Namespace Identification Descriptor list.

use nvmf_protocol::identify::{IdentifyNamespace, NsIdDescriptor};

use crate::error::{Error, Result};
use crate::io::NsTarget;

/// One active namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Namespace {
    /// Namespace id.
    pub nsid: u32,
    /// Size in blocks (NSZE).
    pub blocks: u64,
    /// Block size in bytes.
    pub block_size: u32,
    /// NGUID (zero when not reported).
    pub nguid: [u8; 16],
    /// EUI-64 (zero when not reported).
    pub eui64: [u8; 8],
    /// UUID, when the descriptor list has one.
    pub uuid: Option<[u8; 16]>,
    /// The full Identify Namespace data.
    pub identify: IdentifyNamespace,
}

impl Namespace {
    /// Build from Identify Namespace and (possibly empty) descriptors; descriptors win over the
    /// Identify fields when both are present.
    pub fn from_identify(
        nsid: u32,
        id: IdentifyNamespace,
        descriptors: &[NsIdDescriptor],
    ) -> Result<Self> {
        let block_size = id.block_size().ok_or_else(|| {
            Error::Target(format!(
                "namespace {nsid}: unusable LBA format {:?}",
                id.current_lba_format()
            ))
        })?;
        let mut ns = Self {
            nsid,
            blocks: id.nsze,
            block_size,
            nguid: id.nguid,
            eui64: id.eui64,
            uuid: None,
            identify: id,
        };
        for d in descriptors {
            match *d {
                NsIdDescriptor::Nguid(g) => ns.nguid = g,
                NsIdDescriptor::Eui64(e) => ns.eui64 = e,
                NsIdDescriptor::Uuid(u) => ns.uuid = Some(u),
                NsIdDescriptor::Csi(_) => {}
            }
        }
        Ok(ns)
    }

    /// Size in bytes.
    pub fn size_bytes(&self) -> u64 {
        self.blocks.saturating_mul(u64::from(self.block_size))
    }

    /// What the I/O path needs.
    pub fn target(&self) -> NsTarget {
        NsTarget {
            nsid: self.nsid,
            block_size: self.block_size,
            blocks: self.blocks,
        }
    }
}

/// Lowercase hex of an identifier, the way nvme-cli prints NGUID and EUI-64.
pub fn hex_id(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A UUID in 8-4-4-4-12 form.
pub fn uuid_string(u: &[u8; 16]) -> String {
    let h = hex_id(u);
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptors_fill_identifiers_and_block_size_comes_from_the_format() {
        let id = IdentifyNamespace::simple(100, 12);
        let ns = Namespace::from_identify(
            3,
            id,
            &[
                NsIdDescriptor::Uuid([0xab; 16]),
                NsIdDescriptor::Eui64([1, 2, 3, 4, 5, 6, 7, 8]),
            ],
        )
        .unwrap();
        assert_eq!(ns.block_size, 4096);
        assert_eq!(ns.size_bytes(), 409_600);
        assert_eq!(hex_id(&ns.eui64), "0102030405060708");
        assert_eq!(
            uuid_string(&ns.uuid.unwrap()),
            "abababab-abab-abab-abab-abababababab"
        );
        let bad = IdentifyNamespace::simple(1, 3);
        assert!(Namespace::from_identify(1, bad, &[]).is_err());
    }
}
