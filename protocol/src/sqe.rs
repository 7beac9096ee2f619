//! The 64-byte submission queue entry (the NVMe-oF command capsule header) and opcodes.
//!
//! Common layout: 0 opcode, 1 flags (FUSE bits 1:0, PSDT bits 7:6; 01b = SGL), 2..4 CID,
//! 4..8 NSID (Fabrics commands: byte 4 = FCTYPE), 8..12 CDW2, 12..16 CDW3, 16..24 MPTR,
//! 24..40 DPTR (SGL1), 40..64 CDW10..CDW15.
//!
//! [`Sqe`] keeps every byte, so decode followed by encode reproduces the 64 input bytes. The
//! typed views (`as_read`, `as_identify`, `as_connect`, ...) live next to their command sets in
//! [`crate::nvm`], [`crate::admin`] and [`crate::fabrics`].

use crate::bytes::{rd16, rd32, rd64, rdarr, take, wire_enum, wr16, wr32, wr64, wrarr};
use crate::error::{ProtocolError, Result};
use crate::sgl::SglDescriptor;

/// Size of an SQE in bytes.
pub const SQE_SIZE: usize = 64;
/// Opcode of every Fabrics command.
pub const FABRICS_OPCODE: u8 = 0x7F;
/// PSDT value 01b (SGL for data, MPTR a contiguous buffer) placed in the flags byte; what
/// NVMe-oF hosts send (Linux: NVME_CMD_SGL_METABUF).
pub const FLAGS_PSDT_SGL: u8 = 0x40;

wire_enum! {
    /// Admin command set opcodes.
    pub enum AdminOpcode: u8 {
        /// Delete I/O Submission Queue.
        DeleteIoSq = 0x00,
        /// Create I/O Submission Queue.
        CreateIoSq = 0x01,
        /// Get Log Page.
        GetLogPage = 0x02,
        /// Delete I/O Completion Queue.
        DeleteIoCq = 0x04,
        /// Create I/O Completion Queue.
        CreateIoCq = 0x05,
        /// Identify.
        Identify = 0x06,
        /// Abort.
        Abort = 0x08,
        /// Set Features.
        SetFeatures = 0x09,
        /// Get Features.
        GetFeatures = 0x0A,
        /// Asynchronous Event Request.
        AsyncEventRequest = 0x0C,
        /// Namespace Management.
        NamespaceManagement = 0x0D,
        /// Firmware Commit.
        FirmwareCommit = 0x10,
        /// Firmware Image Download.
        FirmwareImageDownload = 0x11,
        /// Device Self-test.
        DeviceSelfTest = 0x14,
        /// Namespace Attachment.
        NamespaceAttachment = 0x15,
        /// Keep Alive.
        KeepAlive = 0x18,
        /// Directive Send.
        DirectiveSend = 0x19,
        /// Directive Receive.
        DirectiveReceive = 0x1A,
        /// Virtualization Management.
        VirtualizationManagement = 0x1C,
        /// NVMe-MI Send.
        NvmeMiSend = 0x1D,
        /// NVMe-MI Receive.
        NvmeMiReceive = 0x1E,
        /// Doorbell Buffer Config.
        DoorbellBufferConfig = 0x7C,
        /// Fabrics command (see FCTYPE).
        Fabrics = 0x7F,
        /// Format NVM.
        FormatNvm = 0x80,
        /// Security Send.
        SecuritySend = 0x81,
        /// Security Receive.
        SecurityReceive = 0x82,
        /// Sanitize.
        Sanitize = 0x84,
        /// Get LBA Status.
        GetLbaStatus = 0x86,
    }
}

wire_enum! {
    /// NVM command set (I/O queue) opcodes.
    pub enum IoOpcode: u8 {
        /// Flush.
        Flush = 0x00,
        /// Write.
        Write = 0x01,
        /// Read.
        Read = 0x02,
        /// Write Uncorrectable.
        WriteUncorrectable = 0x04,
        /// Compare.
        Compare = 0x05,
        /// Write Zeroes.
        WriteZeroes = 0x08,
        /// Dataset Management.
        DatasetManagement = 0x09,
        /// Verify.
        Verify = 0x0C,
        /// Reservation Register.
        ReservationRegister = 0x0D,
        /// Reservation Report.
        ReservationReport = 0x0E,
        /// Reservation Acquire.
        ReservationAcquire = 0x11,
        /// Reservation Release.
        ReservationRelease = 0x15,
        /// Copy.
        Copy = 0x19,
        /// Fabrics command (see FCTYPE).
        Fabrics = 0x7F,
    }
}

wire_enum! {
    /// Fabrics command type (FCTYPE, SQE byte 4).
    pub enum FabricsType: u8 {
        /// Property Set.
        PropertySet = 0x00,
        /// Connect.
        Connect = 0x01,
        /// Property Get.
        PropertyGet = 0x04,
        /// Authentication Send.
        AuthenticationSend = 0x05,
        /// Authentication Receive.
        AuthenticationReceive = 0x06,
        /// Disconnect.
        Disconnect = 0x08,
    }
}

wire_enum! {
    /// PRP or SGL for Data Transfer (flags bits 7:6).
    pub enum Psdt: u8 {
        /// PRPs (PCIe only).
        Prp = 0,
        /// SGL for data; MPTR is a contiguous buffer (what fabrics uses).
        SglContiguousMeta = 1,
        /// SGL for data; MPTR points at an SGL segment.
        SglMetaSgl = 2,
    }
}

wire_enum! {
    /// Fused operation (flags bits 1:0).
    pub enum Fuse: u8 {
        /// Normal operation.
        Normal = 0,
        /// First command of a fused pair.
        First = 1,
        /// Second command of a fused pair.
        Second = 2,
    }
}

/// A submission queue entry, every byte kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Sqe {
    /// Opcode (byte 0).
    pub opcode: u8,
    /// Flags: FUSE bits 1:0, PSDT bits 7:6 (byte 1).
    pub flags: u8,
    /// Command identifier (bytes 2..4).
    pub cid: u16,
    /// Namespace identifier (bytes 4..8); byte 4 is FCTYPE for Fabrics commands.
    pub nsid: u32,
    /// Command dword 2.
    pub cdw2: u32,
    /// Command dword 3.
    pub cdw3: u32,
    /// Metadata pointer (bytes 16..24).
    pub mptr: u64,
    /// Data pointer: SGL descriptor 1 (bytes 24..40), kept raw.
    pub dptr: [u8; 16],
    /// Command dword 10 (bytes 40..44).
    pub cdw10: u32,
    /// Command dword 11 (bytes 44..48).
    pub cdw11: u32,
    /// Command dword 12 (bytes 48..52).
    pub cdw12: u32,
    /// Command dword 13 (bytes 52..56).
    pub cdw13: u32,
    /// Command dword 14 (bytes 56..60).
    pub cdw14: u32,
    /// Command dword 15 (bytes 60..64).
    pub cdw15: u32,
}

impl Sqe {
    /// A zeroed command with `opcode`, `cid`, `nsid`, PSDT = SGL and a null SGL1.
    pub fn new(opcode: u8, cid: u16, nsid: u32) -> Self {
        Self {
            opcode,
            flags: FLAGS_PSDT_SGL,
            cid,
            nsid,
            dptr: SglDescriptor::NULL.to_bytes(),
            ..Self::default()
        }
    }

    /// A zeroed Fabrics command of type `fctype`.
    pub fn new_fabrics(fctype: FabricsType, cid: u16) -> Self {
        Self::new(FABRICS_OPCODE, cid, u32::from(fctype.raw()))
    }

    /// Encode into exactly 64 bytes.
    pub fn encode(&self, out: &mut [u8; SQE_SIZE]) {
        out[0] = self.opcode;
        out[1] = self.flags;
        wr16(out, 2, self.cid);
        wr32(out, 4, self.nsid);
        wr32(out, 8, self.cdw2);
        wr32(out, 12, self.cdw3);
        wr64(out, 16, self.mptr);
        wrarr(out, 24, &self.dptr);
        wr32(out, 40, self.cdw10);
        wr32(out, 44, self.cdw11);
        wr32(out, 48, self.cdw12);
        wr32(out, 52, self.cdw13);
        wr32(out, 56, self.cdw14);
        wr32(out, 60, self.cdw15);
    }

    /// Encode into a new array.
    pub fn to_bytes(&self) -> [u8; SQE_SIZE] {
        let mut b = [0u8; SQE_SIZE];
        self.encode(&mut b);
        b
    }

    /// Decode the first 64 bytes of `buf` (a capsule may carry in-capsule data after them).
    pub fn decode(buf: &[u8]) -> Result<Self> {
        let b = take::<SQE_SIZE>(buf, "SQE")?;
        Ok(Self {
            opcode: b[0],
            flags: b[1],
            cid: rd16(b, 2),
            nsid: rd32(b, 4),
            cdw2: rd32(b, 8),
            cdw3: rd32(b, 12),
            mptr: rd64(b, 16),
            dptr: rdarr(b, 24),
            cdw10: rd32(b, 40),
            cdw11: rd32(b, 44),
            cdw12: rd32(b, 48),
            cdw13: rd32(b, 52),
            cdw14: rd32(b, 56),
            cdw15: rd32(b, 60),
        })
    }

    /// PSDT (flags bits 7:6).
    pub const fn psdt(&self) -> Psdt {
        Psdt::from_raw(self.flags >> 6)
    }
    /// FUSE (flags bits 1:0).
    pub const fn fuse(&self) -> Fuse {
        Fuse::from_raw(self.flags & 3)
    }
    /// True for a Fabrics command (opcode 0x7F).
    pub const fn is_fabrics(&self) -> bool {
        self.opcode == FABRICS_OPCODE
    }
    /// FCTYPE (byte 4), meaningful only for Fabrics commands.
    pub const fn fctype(&self) -> FabricsType {
        FabricsType::from_raw(self.nsid as u8)
    }
    /// Decode SGL1 from DPTR.
    pub fn sgl1(&self) -> Result<SglDescriptor> {
        SglDescriptor::decode(&self.dptr)
    }
    /// Store `sgl` in DPTR and set PSDT to SGL.
    pub fn set_sgl1(&mut self, sgl: SglDescriptor) {
        self.dptr = sgl.to_bytes();
        self.flags = (self.flags & 0x3F) | FLAGS_PSDT_SGL;
    }

    /// Fail unless the opcode is `expected`.
    pub(crate) fn expect_opcode(&self, expected: u8) -> Result<()> {
        if self.opcode == expected {
            Ok(())
        } else {
            Err(ProtocolError::WrongOpcode {
                expected,
                got: self.opcode,
            })
        }
    }

    /// Fail unless this is the Fabrics command `expected`.
    pub(crate) fn expect_fabrics(&self, expected: FabricsType) -> Result<()> {
        self.expect_opcode(FABRICS_OPCODE)?;
        let got = self.nsid as u8;
        if got == expected.raw() {
            Ok(())
        } else {
            Err(ProtocolError::WrongFabricsType {
                expected: expected.raw(),
                got,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image() -> [u8; 64] {
        let mut b = [0u8; 64];
        for (i, x) in b.iter_mut().enumerate() {
            *x = i as u8;
        }
        b
    }

    #[test]
    fn decode_pins_common_offsets() {
        let b = image();
        let s = Sqe::decode(&b).unwrap();
        assert_eq!(s.opcode, 0);
        assert_eq!(s.flags, 1);
        assert_eq!(s.cid, 0x0302);
        assert_eq!(s.nsid, 0x0706_0504);
        assert_eq!(s.cdw2, 0x0b0a_0908);
        assert_eq!(s.cdw3, 0x0f0e_0d0c);
        assert_eq!(s.mptr, 0x1716_1514_1312_1110);
        assert_eq!(s.dptr[0], 24);
        assert_eq!(s.dptr[15], 39);
        assert_eq!(s.cdw10, 0x2b2a_2928);
        assert_eq!(s.cdw11, 0x2f2e_2d2c);
        assert_eq!(s.cdw12, 0x3332_3130);
        assert_eq!(s.cdw13, 0x3736_3534);
        assert_eq!(s.cdw14, 0x3b3a_3938);
        assert_eq!(s.cdw15, 0x3f3e_3d3c);
        assert_eq!(s.to_bytes(), b);
    }

    #[test]
    fn flags_psdt_fuse_fctype() {
        let mut s = Sqe::new(FABRICS_OPCODE, 9, 0);
        assert_eq!(s.psdt(), Psdt::SglContiguousMeta);
        assert_eq!(s.to_bytes()[1], 0x40);
        s.flags |= 1;
        assert_eq!(s.fuse(), Fuse::First);
        let f = Sqe::new_fabrics(FabricsType::Connect, 1);
        assert_eq!(f.to_bytes()[4], 0x01);
        assert_eq!(f.fctype(), FabricsType::Connect);
        assert!(f.is_fabrics());
        assert_eq!(f.sgl1().unwrap(), SglDescriptor::NULL);
        assert_eq!(&f.to_bytes()[24..40], &SglDescriptor::NULL.to_bytes());
    }

    #[test]
    fn truncated_sqe() {
        assert!(matches!(
            Sqe::decode(&[0u8; 63]),
            Err(ProtocolError::Truncated {
                need: 64,
                got: 63,
                ..
            })
        ));
        assert!(Sqe::decode(&[0u8; 64 + 4096]).is_ok());
    }

    #[test]
    fn opcode_values() {
        assert_eq!(AdminOpcode::GetLogPage.raw(), 0x02);
        assert_eq!(AdminOpcode::Identify.raw(), 0x06);
        assert_eq!(AdminOpcode::KeepAlive.raw(), 0x18);
        assert_eq!(AdminOpcode::AsyncEventRequest.raw(), 0x0C);
        assert_eq!(IoOpcode::WriteZeroes.raw(), 0x08);
        assert_eq!(IoOpcode::DatasetManagement.raw(), 0x09);
        assert_eq!(FabricsType::Disconnect.raw(), 0x08);
        assert_eq!(FabricsType::PropertyGet.raw(), 0x04);
    }
}
