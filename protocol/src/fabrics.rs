//! Fabrics commands (opcode 0x7F, FCTYPE at byte 4): Connect (command, 1024-byte data and
//! response), Property Get, Property Set and Disconnect.
//!
//! Connect SQE: 40..42 RECFMT, 42..44 QID, 44..46 SQSIZE (0's based), 46 CATTR, 48..52 KATO.
//! Connect data: 0..16 HOSTID, 16..18 CNTLID, 256..512 SUBNQN, 512..768 HOSTNQN.
//! Property Get/Set: 40 ATTRIB (bits 2:0 size: 0 = 4 B, 1 = 8 B), 44..48 OFST, Set value 48..56.

use crate::bytes::{FixedStr, rd16, rdarr, take, take_mut, wire_enum, wr16, wrarr};
use crate::error::{ProtocolError, Result};
use crate::nqn::{NQN_MAX_LEN, Nqn};
use crate::properties::PropertyOffset;
use crate::sgl::SglDescriptor;
use crate::sqe::{FabricsType, Sqe};

/// Connect data size.
pub const CONNECT_DATA_SIZE: usize = 1024;
/// CNTLID a host sends on the admin queue connect to ask for any controller (dynamic model).
pub const CNTLID_DYNAMIC: u16 = 0xFFFF;
/// CATTR bit 2: SQ flow control disable (SQHD not maintained).
pub const CATTR_DISABLE_SQ_FLOW_CONTROL: u8 = 0x04;

/// Connect command (FCTYPE 0x01).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConnectCmd {
    /// Command identifier.
    pub cid: u16,
    /// Record format (0).
    pub recfmt: u16,
    /// Queue to connect (0 = admin).
    pub qid: u16,
    /// Submission queue size, 0's based (>= 1).
    pub sqsize: u16,
    /// Connect attributes.
    pub cattr: u8,
    /// Keep alive timeout in ms (admin queue only).
    pub kato: u32,
    /// Where the 1024-byte connect data is.
    pub sgl: SglDescriptor,
}

impl ConnectCmd {
    /// Queue depth the host asks for (SQSIZE + 1).
    pub const fn queue_depth(&self) -> u32 {
        self.sqsize as u32 + 1
    }
    /// Typed view of `s`.
    pub fn from_sqe(s: &Sqe) -> Result<Self> {
        s.expect_fabrics(FabricsType::Connect)?;
        Ok(Self {
            cid: s.cid,
            recfmt: s.cdw10 as u16,
            qid: (s.cdw10 >> 16) as u16,
            sqsize: s.cdw11 as u16,
            cattr: (s.cdw11 >> 16) as u8,
            kato: s.cdw12,
            sgl: s.sgl1()?,
        })
    }
    /// Build the SQE.
    pub fn to_sqe(&self) -> Sqe {
        let mut s = Sqe::new_fabrics(FabricsType::Connect, self.cid);
        s.cdw10 = u32::from(self.recfmt) | (u32::from(self.qid) << 16);
        s.cdw11 = u32::from(self.sqsize) | (u32::from(self.cattr) << 16);
        s.cdw12 = self.kato;
        s.set_sgl1(self.sgl);
        s
    }
}

/// The 1024-byte Connect data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConnectData {
    /// Host identifier.
    pub hostid: [u8; 16],
    /// Controller id: 0xFFFF on an admin connect (dynamic), the admin controller's id on I/O.
    pub cntlid: u16,
    /// Subsystem NQN (not validated beyond length and UTF-8; see [`ConnectData::subnqn`]).
    pub subnqn: FixedStr<NQN_MAX_LEN>,
    /// Host NQN.
    pub hostnqn: FixedStr<NQN_MAX_LEN>,
}

impl ConnectData {
    /// Encode into the first 1024 bytes of `out` (reserved bytes zeroed); returns 1024.
    pub fn encode_into(&self, out: &mut [u8]) -> Result<usize> {
        let b = take_mut::<CONNECT_DATA_SIZE>(out, "Connect data")?;
        b.fill(0);
        wrarr(b, 0, &self.hostid);
        wr16(b, 16, self.cntlid);
        self.subnqn.write_field(&mut b[256..512], 0);
        self.hostnqn.write_field(&mut b[512..768], 0);
        Ok(CONNECT_DATA_SIZE)
    }
    /// Encode into a new array.
    pub fn to_bytes(&self) -> [u8; CONNECT_DATA_SIZE] {
        let mut b = [0u8; CONNECT_DATA_SIZE];
        // Cannot fail: the array is exactly the size.
        let _ = self.encode_into(&mut b);
        b
    }
    /// Decode; NQN fields must be UTF-8 of at most 223 bytes before their NUL.
    pub fn decode(buf: &[u8]) -> Result<Self> {
        let b = take::<CONNECT_DATA_SIZE>(buf, "Connect data")?;
        Ok(Self {
            hostid: rdarr(b, 0),
            cntlid: rd16(b, 16),
            subnqn: FixedStr::from_field(&b[256..512], "SUBNQN")?,
            hostnqn: FixedStr::from_field(&b[512..768], "HOSTNQN")?,
        })
    }
    /// The subsystem NQN, validated.
    pub fn subnqn(&self) -> Result<Nqn> {
        Ok(Nqn::try_from(&self.subnqn)?)
    }
    /// The host NQN, validated.
    pub fn hostnqn(&self) -> Result<Nqn> {
        Ok(Nqn::try_from(&self.hostnqn)?)
    }
}

/// DW0 of a successful Connect response: bits 15:0 CNTLID, 31:16 AUTHREQ.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConnectResponse {
    /// Controller id allocated (admin) or confirmed (I/O).
    pub cntlid: u16,
    /// Authentication requirements (0 = none).
    pub authreq: u16,
}

impl ConnectResponse {
    /// Pack into DW0.
    pub const fn to_dw0(&self) -> u32 {
        self.cntlid as u32 | ((self.authreq as u32) << 16)
    }
    /// Unpack from DW0.
    pub const fn from_dw0(dw0: u32) -> Self {
        Self {
            cntlid: dw0 as u16,
            authreq: (dw0 >> 16) as u16,
        }
    }
}

/// DW0 of a Connect failing with Invalid Parameters: bits 15:0 IPO (byte offset of the bad
/// parameter), bits 23:16 IATTR (bit 0: 0 = offset in the SQE, 1 = offset in the Connect data).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConnectInvalidParameter {
    /// Byte offset of the offending field.
    pub offset: u16,
    /// True when `offset` is into the Connect data, false when into the SQE.
    pub in_data: bool,
}

impl ConnectInvalidParameter {
    /// Points at the QID field of the SQE.
    pub const QID: Self = Self::sqe(42);
    /// Points at the SQSIZE field of the SQE.
    pub const SQSIZE: Self = Self::sqe(44);
    /// Points at the CNTLID field of the data.
    pub const CNTLID: Self = Self::data(16);
    /// Points at the SUBNQN field of the data.
    pub const SUBNQN: Self = Self::data(256);
    /// Points at the HOSTNQN field of the data.
    pub const HOSTNQN: Self = Self::data(512);

    /// An offset into the SQE.
    pub const fn sqe(offset: u16) -> Self {
        Self {
            offset,
            in_data: false,
        }
    }
    /// An offset into the Connect data.
    pub const fn data(offset: u16) -> Self {
        Self {
            offset,
            in_data: true,
        }
    }
    /// Pack into DW0.
    pub const fn to_dw0(&self) -> u32 {
        self.offset as u32 | ((self.in_data as u32) << 16)
    }
    /// Unpack from DW0 (other IATTR bits ignored).
    pub const fn from_dw0(dw0: u32) -> Self {
        Self {
            offset: dw0 as u16,
            in_data: (dw0 >> 16) & 1 == 1,
        }
    }
}

wire_enum! {
    /// Property size (ATTRIB bits 2:0).
    pub enum PropertySize: u8 {
        /// 4 bytes.
        Four = 0,
        /// 8 bytes.
        Eight = 1,
    }
}

impl PropertySize {
    /// Size in bytes; `None` for unknown encodings.
    pub const fn bytes(self) -> Option<usize> {
        match self {
            Self::Four => Some(4),
            Self::Eight => Some(8),
            Self::Unknown(_) => None,
        }
    }
}

/// Property Get (FCTYPE 0x04); the value returns in CQE DW0 (and DW1 for 8 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PropertyGetCmd {
    /// Command identifier.
    pub cid: u16,
    /// Property size.
    pub size: PropertySize,
    /// Property offset.
    pub offset: PropertyOffset,
}

impl PropertyGetCmd {
    /// Typed view of `s`.
    pub fn from_sqe(s: &Sqe) -> Result<Self> {
        s.expect_fabrics(FabricsType::PropertyGet)?;
        Ok(Self {
            cid: s.cid,
            size: PropertySize::from_raw((s.cdw10 & 7) as u8),
            offset: PropertyOffset::from_raw(s.cdw11),
        })
    }
    /// Build the SQE.
    pub fn to_sqe(&self) -> Sqe {
        let mut s = Sqe::new_fabrics(FabricsType::PropertyGet, self.cid);
        s.cdw10 = u32::from(self.size.raw() & 7);
        s.cdw11 = self.offset.raw();
        s
    }
}

/// Property Set (FCTYPE 0x00).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PropertySetCmd {
    /// Command identifier.
    pub cid: u16,
    /// Property size.
    pub size: PropertySize,
    /// Property offset.
    pub offset: PropertyOffset,
    /// Value (bytes 48..56; only the low 4 bytes for 4-byte properties).
    pub value: u64,
}

impl PropertySetCmd {
    /// Typed view of `s`.
    pub fn from_sqe(s: &Sqe) -> Result<Self> {
        s.expect_fabrics(FabricsType::PropertySet)?;
        Ok(Self {
            cid: s.cid,
            size: PropertySize::from_raw((s.cdw10 & 7) as u8),
            offset: PropertyOffset::from_raw(s.cdw11),
            value: u64::from(s.cdw12) | (u64::from(s.cdw13) << 32),
        })
    }
    /// Build the SQE.
    pub fn to_sqe(&self) -> Sqe {
        let mut s = Sqe::new_fabrics(FabricsType::PropertySet, self.cid);
        s.cdw10 = u32::from(self.size.raw() & 7);
        s.cdw11 = self.offset.raw();
        s.cdw12 = self.value as u32;
        s.cdw13 = (self.value >> 32) as u32;
        s
    }
    /// Check that `size` matches the property's width (CAP is 8 bytes, the others 4).
    pub fn check_size(&self) -> Result<()> {
        match (self.offset.width(), self.size.bytes()) {
            (Some(w), Some(b)) if w == b => Ok(()),
            _ => Err(ProtocolError::InvalidValue {
                field: "ATTRIB",
                value: u64::from(self.size.raw()),
            }),
        }
    }
}

/// Disconnect (FCTYPE 0x08): 40..42 RECFMT.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DisconnectCmd {
    /// Command identifier.
    pub cid: u16,
    /// Record format (0).
    pub recfmt: u16,
}

impl DisconnectCmd {
    /// Typed view of `s`.
    pub fn from_sqe(s: &Sqe) -> Result<Self> {
        s.expect_fabrics(FabricsType::Disconnect)?;
        Ok(Self {
            cid: s.cid,
            recfmt: s.cdw10 as u16,
        })
    }
    /// Build the SQE.
    pub fn to_sqe(&self) -> Sqe {
        let mut s = Sqe::new_fabrics(FabricsType::Disconnect, self.cid);
        s.cdw10 = u32::from(self.recfmt);
        s
    }
}

impl Sqe {
    /// Fabrics Connect view.
    pub fn as_connect(&self) -> Result<ConnectCmd> {
        ConnectCmd::from_sqe(self)
    }
    /// Fabrics Property Get view.
    pub fn as_property_get(&self) -> Result<PropertyGetCmd> {
        PropertyGetCmd::from_sqe(self)
    }
    /// Fabrics Property Set view.
    pub fn as_property_set(&self) -> Result<PropertySetCmd> {
        PropertySetCmd::from_sqe(self)
    }
    /// Fabrics Disconnect view.
    pub fn as_disconnect(&self) -> Result<DisconnectCmd> {
        DisconnectCmd::from_sqe(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nqn::DISCOVERY_NQN;

    #[test]
    fn connect_sqe_offsets() {
        let c = ConnectCmd {
            cid: 0x0102,
            recfmt: 0,
            qid: 3,
            sqsize: 127,
            cattr: CATTR_DISABLE_SQ_FLOW_CONTROL,
            kato: 15000,
            sgl: SglDescriptor::keyed(0x1000, 1024, 0x42, true).unwrap(),
        };
        let b = c.to_sqe().to_bytes();
        assert_eq!(b[0], 0x7F);
        assert_eq!(b[1], 0x40);
        assert_eq!(&b[2..4], &[0x02, 0x01]);
        assert_eq!(b[4], 0x01);
        assert_eq!(&b[40..42], &[0, 0]);
        assert_eq!(&b[42..44], &[3, 0]);
        assert_eq!(&b[44..46], &[127, 0]);
        assert_eq!(b[46], 0x04);
        assert_eq!(&b[48..52], &15000u32.to_le_bytes());
        assert_eq!(b[39], 0x4F);
        let d = Sqe::decode(&b).unwrap().as_connect().unwrap();
        assert_eq!(d, c);
        assert_eq!(d.queue_depth(), 128);
    }

    #[test]
    fn connect_data_offsets() {
        let d = ConnectData {
            hostid: [0xAA; 16],
            cntlid: CNTLID_DYNAMIC,
            subnqn: FixedStr::new("nqn.2016-06.io.spdk:cnode1", "x").unwrap(),
            hostnqn: FixedStr::new(DISCOVERY_NQN, "x").unwrap(),
        };
        let b = d.to_bytes();
        assert_eq!(&b[0..16], &[0xAA; 16]);
        assert_eq!(&b[16..18], &[0xFF, 0xFF]);
        assert!(b[18..256].iter().all(|&x| x == 0));
        assert_eq!(&b[256..282], b"nqn.2016-06.io.spdk:cnode1");
        assert_eq!(b[282], 0);
        assert_eq!(&b[512..512 + DISCOVERY_NQN.len()], DISCOVERY_NQN.as_bytes());
        assert!(b[768..].iter().all(|&x| x == 0));
        let back = ConnectData::decode(&b).unwrap();
        assert_eq!(back, d);
        assert!(back.subnqn().is_ok());
        assert!(back.hostnqn().unwrap().is_discovery());
        let mut small = [0u8; 1000];
        assert!(matches!(
            d.encode_into(&mut small),
            Err(ProtocolError::BufferTooSmall { need: 1024, .. })
        ));
    }

    #[test]
    fn connect_data_rejects_overlong_nqn() {
        let mut b = [0u8; 1024];
        b[256..256 + 224].fill(b'a');
        assert!(matches!(
            ConnectData::decode(&b),
            Err(ProtocolError::StringTooLong {
                field: "SUBNQN",
                len: 224,
                ..
            })
        ));
        // A field with no NUL at all is 256 bytes long: also too long.
        b[256..512].fill(b'a');
        assert!(ConnectData::decode(&b).is_err());
        assert!(ConnectData::decode(&b[..1023]).is_err());
        // A malformed name decodes (length/UTF-8 only) but fails validation.
        let mut ok = [0u8; 1024];
        ok[256..263].copy_from_slice(b"testnqn");
        let d = ConnectData::decode(&ok).unwrap();
        assert_eq!(d.subnqn.as_str(), "testnqn");
        assert!(d.subnqn().is_err());
    }

    #[test]
    fn connect_response_dw0() {
        assert_eq!(
            ConnectResponse {
                cntlid: 1,
                authreq: 0
            }
            .to_dw0(),
            1
        );
        assert_eq!(ConnectInvalidParameter::HOSTNQN.to_dw0(), 0x0001_0200);
        assert_eq!(ConnectInvalidParameter::SQSIZE.to_dw0(), 44);
        assert_eq!(
            ConnectInvalidParameter::from_dw0(0x0001_0100),
            ConnectInvalidParameter::SUBNQN
        );
    }

    #[test]
    fn property_get_set_disconnect() {
        let g = PropertyGetCmd {
            cid: 5,
            size: PropertySize::Eight,
            offset: PropertyOffset::Cap,
        };
        let b = g.to_sqe().to_bytes();
        assert_eq!(b[4], 0x04);
        assert_eq!(b[40], 1);
        assert_eq!(&b[44..48], &[0, 0, 0, 0]);
        assert_eq!(Sqe::decode(&b).unwrap().as_property_get().unwrap(), g);

        let s = PropertySetCmd {
            cid: 6,
            size: PropertySize::Four,
            offset: PropertyOffset::Cc,
            value: 0x0046_0001,
        };
        let b = s.to_sqe().to_bytes();
        assert_eq!(b[4], 0x00);
        assert_eq!(b[40], 0);
        assert_eq!(&b[44..48], &[0x14, 0, 0, 0]);
        assert_eq!(&b[48..56], &0x0046_0001u64.to_le_bytes());
        let back = Sqe::decode(&b).unwrap().as_property_set().unwrap();
        assert_eq!(back, s);
        assert!(back.check_size().is_ok());
        let bad = PropertySetCmd {
            size: PropertySize::Eight,
            ..s
        };
        assert!(bad.check_size().is_err());

        let d = DisconnectCmd { cid: 7, recfmt: 0 };
        let b = d.to_sqe().to_bytes();
        assert_eq!(b[4], 0x08);
        assert_eq!(Sqe::decode(&b).unwrap().as_disconnect().unwrap(), d);
        assert_eq!(
            Sqe::decode(&b).unwrap().as_connect(),
            Err(ProtocolError::WrongFabricsType {
                expected: 1,
                got: 8
            })
        );
    }
}
