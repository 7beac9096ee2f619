//! Typed views of the NVM command set I/O commands: Read, Write, Flush, Write Zeroes and
//! Dataset Management (plus its 16-byte range entries).
//!
//! Read/Write: CDW10..11 SLBA, CDW12 bits 15:0 NLB (0's based), 23:20 DTYPE (write),
//! 29:26 PRINFO, 30 FUA, 31 LR; CDW13 bits 7:0 DSM, 31:16 DSPEC (write); CDW14 ILBRT;
//! CDW15 bits 15:0 LBAT, 31:16 LBATM.

use crate::bytes::{bit32, bits32, flag32, put32, rd32, rd64, take, take_mut, wr32, wr64};
use crate::error::{ProtocolError, Result};
use crate::sgl::SglDescriptor;
use crate::sqe::{IoOpcode, Sqe};

/// Protection and access fields shared by Read, Write and Write Zeroes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RwControl {
    /// Limited Retry (CDW12 bit 31).
    pub limited_retry: bool,
    /// Force Unit Access (CDW12 bit 30).
    pub fua: bool,
    /// Protection Information field (CDW12 bits 29:26; low 4 bits used).
    pub prinfo: u8,
    /// Initial Logical Block Reference Tag (CDW14).
    pub ilbrt: u32,
    /// Logical Block Application Tag (CDW15 bits 15:0).
    pub lbat: u16,
    /// Logical Block Application Tag Mask (CDW15 bits 31:16).
    pub lbatm: u16,
}

impl RwControl {
    fn cdw12_bits(&self) -> u32 {
        flag32(self.limited_retry, 31) | flag32(self.fua, 30) | put32(u32::from(self.prinfo), 26, 4)
    }
    fn from_sqe(s: &Sqe) -> Self {
        Self {
            limited_retry: bit32(s.cdw12, 31),
            fua: bit32(s.cdw12, 30),
            prinfo: bits32(s.cdw12, 26, 4) as u8,
            ilbrt: s.cdw14,
            lbat: s.cdw15 as u16,
            lbatm: (s.cdw15 >> 16) as u16,
        }
    }
    fn apply(&self, s: &mut Sqe) {
        s.cdw12 |= self.cdw12_bits();
        s.cdw14 = self.ilbrt;
        s.cdw15 = u32::from(self.lbat) | (u32::from(self.lbatm) << 16);
    }
}

/// Read command (opcode 0x02).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ReadCmd {
    /// Command identifier.
    pub cid: u16,
    /// Namespace.
    pub nsid: u32,
    /// Starting LBA.
    pub slba: u64,
    /// Number of logical blocks, 0's based (0 = one block).
    pub nlb: u16,
    /// FUA, LR, protection information.
    pub control: RwControl,
    /// Dataset Management hints (CDW13 bits 7:0).
    pub dsm: u8,
    /// Where the data goes.
    pub sgl: SglDescriptor,
}

/// Write command (opcode 0x01).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct WriteCmd {
    /// Command identifier.
    pub cid: u16,
    /// Namespace.
    pub nsid: u32,
    /// Starting LBA.
    pub slba: u64,
    /// Number of logical blocks, 0's based (0 = one block).
    pub nlb: u16,
    /// FUA, LR, protection information.
    pub control: RwControl,
    /// Directive Type (CDW12 bits 23:20; low 4 bits used).
    pub dtype: u8,
    /// Dataset Management hints (CDW13 bits 7:0).
    pub dsm: u8,
    /// Directive Specific (CDW13 bits 31:16).
    pub dspec: u16,
    /// Where the data comes from.
    pub sgl: SglDescriptor,
}

impl ReadCmd {
    /// Number of blocks (NLB + 1).
    pub const fn blocks(&self) -> u32 {
        self.nlb as u32 + 1
    }
    /// Typed view of `s`.
    pub fn from_sqe(s: &Sqe) -> Result<Self> {
        s.expect_opcode(IoOpcode::Read.raw())?;
        Ok(Self {
            cid: s.cid,
            nsid: s.nsid,
            slba: u64::from(s.cdw10) | (u64::from(s.cdw11) << 32),
            nlb: s.cdw12 as u16,
            control: RwControl::from_sqe(s),
            dsm: s.cdw13 as u8,
            sgl: s.sgl1()?,
        })
    }
    /// Build the SQE.
    pub fn to_sqe(&self) -> Sqe {
        let mut s = Sqe::new(IoOpcode::Read.raw(), self.cid, self.nsid);
        s.cdw10 = self.slba as u32;
        s.cdw11 = (self.slba >> 32) as u32;
        s.cdw12 = u32::from(self.nlb);
        self.control.apply(&mut s);
        s.cdw13 = u32::from(self.dsm);
        s.set_sgl1(self.sgl);
        s
    }
}

impl WriteCmd {
    /// Number of blocks (NLB + 1).
    pub const fn blocks(&self) -> u32 {
        self.nlb as u32 + 1
    }
    /// Typed view of `s`.
    pub fn from_sqe(s: &Sqe) -> Result<Self> {
        s.expect_opcode(IoOpcode::Write.raw())?;
        Ok(Self {
            cid: s.cid,
            nsid: s.nsid,
            slba: u64::from(s.cdw10) | (u64::from(s.cdw11) << 32),
            nlb: s.cdw12 as u16,
            control: RwControl::from_sqe(s),
            dtype: bits32(s.cdw12, 20, 4) as u8,
            dsm: s.cdw13 as u8,
            dspec: (s.cdw13 >> 16) as u16,
            sgl: s.sgl1()?,
        })
    }
    /// Build the SQE.
    pub fn to_sqe(&self) -> Sqe {
        let mut s = Sqe::new(IoOpcode::Write.raw(), self.cid, self.nsid);
        s.cdw10 = self.slba as u32;
        s.cdw11 = (self.slba >> 32) as u32;
        s.cdw12 = u32::from(self.nlb) | put32(u32::from(self.dtype), 20, 4);
        self.control.apply(&mut s);
        s.cdw13 = u32::from(self.dsm) | (u32::from(self.dspec) << 16);
        s.set_sgl1(self.sgl);
        s
    }
}

/// Flush command (opcode 0x00): no data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FlushCmd {
    /// Command identifier.
    pub cid: u16,
    /// Namespace (0xFFFFFFFF = all).
    pub nsid: u32,
}

impl FlushCmd {
    /// Typed view of `s`.
    pub fn from_sqe(s: &Sqe) -> Result<Self> {
        s.expect_opcode(IoOpcode::Flush.raw())?;
        Ok(Self {
            cid: s.cid,
            nsid: s.nsid,
        })
    }
    /// Build the SQE (null SGL).
    pub fn to_sqe(&self) -> Sqe {
        Sqe::new(IoOpcode::Flush.raw(), self.cid, self.nsid)
    }
}

/// Write Zeroes command (opcode 0x08): no data transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct WriteZeroesCmd {
    /// Command identifier.
    pub cid: u16,
    /// Namespace.
    pub nsid: u32,
    /// Starting LBA.
    pub slba: u64,
    /// Number of logical blocks, 0's based.
    pub nlb: u16,
    /// Deallocate (CDW12 bit 25).
    pub deac: bool,
    /// FUA, LR, protection information.
    pub control: RwControl,
}

impl WriteZeroesCmd {
    /// Number of blocks (NLB + 1).
    pub const fn blocks(&self) -> u32 {
        self.nlb as u32 + 1
    }
    /// Typed view of `s`.
    pub fn from_sqe(s: &Sqe) -> Result<Self> {
        s.expect_opcode(IoOpcode::WriteZeroes.raw())?;
        Ok(Self {
            cid: s.cid,
            nsid: s.nsid,
            slba: u64::from(s.cdw10) | (u64::from(s.cdw11) << 32),
            nlb: s.cdw12 as u16,
            deac: bit32(s.cdw12, 25),
            control: RwControl::from_sqe(s),
        })
    }
    /// Build the SQE (null SGL).
    pub fn to_sqe(&self) -> Sqe {
        let mut s = Sqe::new(IoOpcode::WriteZeroes.raw(), self.cid, self.nsid);
        s.cdw10 = self.slba as u32;
        s.cdw11 = (self.slba >> 32) as u32;
        s.cdw12 = u32::from(self.nlb) | flag32(self.deac, 25);
        self.control.apply(&mut s);
        s
    }
}

/// Dataset Management command (opcode 0x09): the ranges travel as data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DatasetManagementCmd {
    /// Command identifier.
    pub cid: u16,
    /// Namespace.
    pub nsid: u32,
    /// Number of ranges, 0's based (CDW10 bits 7:0).
    pub nr: u8,
    /// Integral Dataset for Read (CDW11 bit 0).
    pub idr: bool,
    /// Integral Dataset for Write (CDW11 bit 1).
    pub idw: bool,
    /// Deallocate (CDW11 bit 2).
    pub ad: bool,
    /// Where the range list is.
    pub sgl: SglDescriptor,
}

impl DatasetManagementCmd {
    /// Number of ranges (NR + 1).
    pub const fn ranges(&self) -> usize {
        self.nr as usize + 1
    }
    /// Bytes of range data the command carries.
    pub const fn data_len(&self) -> usize {
        self.ranges() * DSM_RANGE_SIZE
    }
    /// Typed view of `s`.
    pub fn from_sqe(s: &Sqe) -> Result<Self> {
        s.expect_opcode(IoOpcode::DatasetManagement.raw())?;
        Ok(Self {
            cid: s.cid,
            nsid: s.nsid,
            nr: s.cdw10 as u8,
            idr: bit32(s.cdw11, 0),
            idw: bit32(s.cdw11, 1),
            ad: bit32(s.cdw11, 2),
            sgl: s.sgl1()?,
        })
    }
    /// Build the SQE.
    pub fn to_sqe(&self) -> Sqe {
        let mut s = Sqe::new(IoOpcode::DatasetManagement.raw(), self.cid, self.nsid);
        s.cdw10 = u32::from(self.nr);
        s.cdw11 = flag32(self.idr, 0) | flag32(self.idw, 1) | flag32(self.ad, 2);
        s.set_sgl1(self.sgl);
        s
    }
}

/// Size of one Dataset Management range.
pub const DSM_RANGE_SIZE: usize = 16;
/// Most ranges one Dataset Management command may carry.
pub const DSM_MAX_RANGES: usize = 256;

/// One Dataset Management range: 0..4 context attributes, 4..8 length in LBAs, 8..16 SLBA.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct DsmRange {
    /// Context attributes.
    pub context_attributes: u32,
    /// Length in logical blocks (not 0's based).
    pub length: u32,
    /// Starting LBA.
    pub slba: u64,
}

impl DsmRange {
    /// Encode into exactly 16 bytes.
    pub fn to_bytes(&self) -> [u8; DSM_RANGE_SIZE] {
        let mut b = [0u8; DSM_RANGE_SIZE];
        wr32(&mut b, 0, self.context_attributes);
        wr32(&mut b, 4, self.length);
        wr64(&mut b, 8, self.slba);
        b
    }
    /// Encode into the first 16 bytes of `out`.
    pub fn encode_into(&self, out: &mut [u8]) -> Result<usize> {
        *take_mut::<DSM_RANGE_SIZE>(out, "DSM range")? = self.to_bytes();
        Ok(DSM_RANGE_SIZE)
    }
    /// Decode one range.
    pub fn decode(buf: &[u8]) -> Result<Self> {
        let b = take::<DSM_RANGE_SIZE>(buf, "DSM range")?;
        Ok(Self {
            context_attributes: rd32(b, 0),
            length: rd32(b, 4),
            slba: rd64(b, 8),
        })
    }
    /// Iterate over `count` ranges in `buf` (allocation free); fails up front if `buf` is short
    /// or `count` exceeds 256.
    pub fn decode_list(buf: &[u8], count: usize) -> Result<impl Iterator<Item = DsmRange> + '_> {
        if count > DSM_MAX_RANGES {
            return Err(ProtocolError::InvalidValue {
                field: "DSM range count",
                value: count as u64,
            });
        }
        let need = count * DSM_RANGE_SIZE;
        let data = buf.get(..need).ok_or(ProtocolError::Truncated {
            what: "DSM range list",
            need,
            got: buf.len(),
        })?;
        Ok(data
            .chunks_exact(DSM_RANGE_SIZE)
            .filter_map(|c| DsmRange::decode(c).ok()))
    }
}

impl Sqe {
    /// Read view.
    pub fn as_read(&self) -> Result<ReadCmd> {
        ReadCmd::from_sqe(self)
    }
    /// Write view.
    pub fn as_write(&self) -> Result<WriteCmd> {
        WriteCmd::from_sqe(self)
    }
    /// Flush view.
    pub fn as_flush(&self) -> Result<FlushCmd> {
        FlushCmd::from_sqe(self)
    }
    /// Write Zeroes view.
    pub fn as_write_zeroes(&self) -> Result<WriteZeroesCmd> {
        WriteZeroesCmd::from_sqe(self)
    }
    /// Dataset Management view.
    pub fn as_dataset_management(&self) -> Result<DatasetManagementCmd> {
        DatasetManagementCmd::from_sqe(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keyed() -> SglDescriptor {
        SglDescriptor::keyed(0x1000, 8192, 0xabcd, true).unwrap()
    }

    #[test]
    fn read_offsets() {
        let r = ReadCmd {
            cid: 0x1234,
            nsid: 1,
            slba: 0x1122_3344_5566_7788,
            nlb: 7,
            control: RwControl {
                limited_retry: true,
                fua: true,
                prinfo: 0xF,
                ilbrt: 0xdead_beef,
                lbat: 0x0102,
                lbatm: 0x0304,
            },
            dsm: 0x55,
            sgl: keyed(),
        };
        let b = r.to_sqe().to_bytes();
        assert_eq!(b[0], 0x02);
        assert_eq!(b[1], 0x40);
        assert_eq!(&b[2..4], &[0x34, 0x12]);
        assert_eq!(&b[4..8], &[1, 0, 0, 0]);
        assert_eq!(&b[40..48], &0x1122_3344_5566_7788u64.to_le_bytes());
        assert_eq!(&b[48..50], &[7, 0]);
        assert_eq!(b[51], 0x80 | 0x40 | 0x3C); // LR, FUA, PRINFO 29:26
        assert_eq!(b[52], 0x55);
        assert_eq!(&b[56..60], &0xdead_beefu32.to_le_bytes());
        assert_eq!(&b[60..64], &[2, 1, 4, 3]);
        assert_eq!(&b[24..40], &keyed().to_bytes());
        assert_eq!(Sqe::decode(&b).unwrap().as_read().unwrap(), r);
        assert_eq!(r.blocks(), 8);
    }

    #[test]
    fn write_offsets_and_wrong_opcode() {
        let w = WriteCmd {
            cid: 1,
            nsid: 2,
            slba: 3,
            nlb: 0,
            control: RwControl::default(),
            dtype: 2,
            dsm: 1,
            dspec: 0xBEEF,
            sgl: SglDescriptor::DataBlockOffset {
                offset: 0,
                length: 512,
            },
        };
        let s = w.to_sqe();
        let b = s.to_bytes();
        assert_eq!(b[0], 0x01);
        assert_eq!(b[50], 0x20); // DTYPE bits 23:20
        assert_eq!(&b[54..56], &[0xEF, 0xBE]);
        assert_eq!(s.as_write().unwrap(), w);
        assert_eq!(
            s.as_read(),
            Err(ProtocolError::WrongOpcode {
                expected: 2,
                got: 1
            })
        );
    }

    #[test]
    fn write_zeroes_and_flush() {
        let z = WriteZeroesCmd {
            cid: 3,
            nsid: 1,
            slba: 100,
            nlb: 0xFFFF,
            deac: true,
            control: RwControl {
                fua: true,
                ..Default::default()
            },
        };
        let b = z.to_sqe().to_bytes();
        assert_eq!(b[0], 0x08);
        assert_eq!(&b[48..50], &[0xFF, 0xFF]);
        assert_eq!(b[51], 0x42); // FUA bit 30, DEAC bit 25
        assert_eq!(Sqe::decode(&b).unwrap().as_write_zeroes().unwrap(), z);
        assert_eq!(z.blocks(), 65536);
        let f = FlushCmd {
            cid: 4,
            nsid: 0xFFFF_FFFF,
        };
        let fb = f.to_sqe().to_bytes();
        assert_eq!(fb[0], 0x00);
        assert_eq!(Sqe::decode(&fb).unwrap().as_flush().unwrap(), f);
    }

    #[test]
    fn dataset_management_and_ranges() {
        let d = DatasetManagementCmd {
            cid: 5,
            nsid: 1,
            nr: 1,
            idr: false,
            idw: true,
            ad: true,
            sgl: keyed(),
        };
        let b = d.to_sqe().to_bytes();
        assert_eq!(b[0], 0x09);
        assert_eq!(b[40], 1);
        assert_eq!(b[44], 0b110);
        assert_eq!(Sqe::decode(&b).unwrap().as_dataset_management().unwrap(), d);
        assert_eq!(d.data_len(), 32);

        let r = DsmRange {
            context_attributes: 0x0403_0201,
            length: 0x0807_0605,
            slba: 0x100f_0e0d_0c0b_0a09,
        };
        let rb = r.to_bytes();
        assert_eq!(
            &rb[..],
            &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]
        );
        let mut two = [0u8; 32];
        two[..16].copy_from_slice(&rb);
        two[16..].copy_from_slice(&rb);
        assert_eq!(DsmRange::decode_list(&two, 2).unwrap().count(), 2);
        assert!(DsmRange::decode_list(&two, 3).is_err());
        assert!(DsmRange::decode_list(&two, 257).is_err());
    }

    #[test]
    fn invalid_sgl_is_an_error() {
        let mut s = ReadCmd {
            cid: 1,
            nsid: 1,
            slba: 0,
            nlb: 0,
            control: RwControl::default(),
            dsm: 0,
            sgl: keyed(),
        }
        .to_sqe();
        s.dptr[15] = 0xE0;
        assert!(matches!(
            s.as_read(),
            Err(ProtocolError::InvalidValue {
                field: "SGL identifier",
                ..
            })
        ));
    }
}
