//! Submission and completion queue entries (64 B SQE, 16 B CQE) and opcodes.

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// Admin command opcodes.
pub mod admin_opcode {
    /// Delete I/O Submission Queue.
    pub const DELETE_IO_SQ: u8 = 0x00;
    /// Create I/O Submission Queue.
    pub const CREATE_IO_SQ: u8 = 0x01;
    /// Get Log Page.
    pub const GET_LOG_PAGE: u8 = 0x02;
    /// Delete I/O Completion Queue.
    pub const DELETE_IO_CQ: u8 = 0x04;
    /// Create I/O Completion Queue.
    pub const CREATE_IO_CQ: u8 = 0x05;
    /// Identify.
    pub const IDENTIFY: u8 = 0x06;
    /// Abort.
    pub const ABORT: u8 = 0x08;
    /// Set Features.
    pub const SET_FEATURES: u8 = 0x09;
    /// Get Features.
    pub const GET_FEATURES: u8 = 0x0a;
    /// Asynchronous Event Request.
    pub const ASYNC_EVENT_REQUEST: u8 = 0x0c;
    /// Doorbell Buffer Config (shadow doorbells).
    pub const DOORBELL_BUFFER_CONFIG: u8 = 0x7c;
}

/// NVM command set I/O opcodes.
pub mod io_opcode {
    /// Flush.
    pub const FLUSH: u8 = 0x00;
    /// Write.
    pub const WRITE: u8 = 0x01;
    /// Read.
    pub const READ: u8 = 0x02;
    /// Write Uncorrectable.
    pub const WRITE_UNCORRECTABLE: u8 = 0x04;
    /// Compare.
    pub const COMPARE: u8 = 0x05;
    /// Write Zeroes.
    pub const WRITE_ZEROES: u8 = 0x08;
    /// Dataset Management.
    pub const DATASET_MANAGEMENT: u8 = 0x09;
}

/// Identify CNS values.
pub mod cns {
    /// Identify Namespace.
    pub const NAMESPACE: u8 = 0x00;
    /// Identify Controller.
    pub const CONTROLLER: u8 = 0x01;
    /// Active Namespace ID list.
    pub const ACTIVE_NS_LIST: u8 = 0x02;
    /// Namespace Identification Descriptor list (NVMe 1.3 and later).
    pub const NS_ID_DESCRIPTORS: u8 = 0x03;
}

/// Feature identifiers.
pub mod feature {
    /// Arbitration.
    pub const ARBITRATION: u8 = 0x01;
    /// Power Management.
    pub const POWER_MANAGEMENT: u8 = 0x02;
    /// Temperature Threshold.
    pub const TEMPERATURE_THRESHOLD: u8 = 0x04;
    /// Volatile Write Cache.
    pub const VOLATILE_WRITE_CACHE: u8 = 0x06;
    /// Number of Queues.
    pub const NUMBER_OF_QUEUES: u8 = 0x07;
    /// Interrupt Coalescing.
    pub const INTERRUPT_COALESCING: u8 = 0x08;
    /// Asynchronous Event Configuration.
    pub const ASYNC_EVENT_CONFIG: u8 = 0x0b;
}

/// Log page identifiers.
pub mod log_page {
    /// Error Information.
    pub const ERROR_INFORMATION: u8 = 0x01;
    /// SMART / Health Information.
    pub const SMART_HEALTH: u8 = 0x02;
    /// Firmware Slot Information.
    pub const FIRMWARE_SLOT: u8 = 0x03;
}

/// Write / Read CDW12 bit: Force Unit Access.
pub const RW_FUA: u32 = 1 << 30;
/// Dataset Management CDW11 bit: Attribute Deallocate.
pub const DSM_ATTR_DEALLOCATE: u32 = 1 << 2;

/// A 64-byte submission queue entry.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
#[repr(C)]
pub struct Sqe {
    /// Opcode (7:0), fused (9:8), PSDT (15:14), command identifier (31:16).
    pub cdw0: u32,
    /// Namespace identifier.
    pub nsid: u32,
    /// Command dword 2.
    pub cdw2: u32,
    /// Command dword 3.
    pub cdw3: u32,
    /// Metadata pointer.
    pub mptr: u64,
    /// PRP entry 1.
    pub prp1: u64,
    /// PRP entry 2.
    pub prp2: u64,
    /// Command dword 10.
    pub cdw10: u32,
    /// Command dword 11.
    pub cdw11: u32,
    /// Command dword 12.
    pub cdw12: u32,
    /// Command dword 13.
    pub cdw13: u32,
    /// Command dword 14.
    pub cdw14: u32,
    /// Command dword 15.
    pub cdw15: u32,
}

const _: () = assert!(std::mem::size_of::<Sqe>() == 64);
const _: () = assert!(std::mem::size_of::<Cqe>() == 16);

impl Sqe {
    /// A zeroed entry with the opcode set (CID is filled in at submission).
    pub fn new(opcode: u8) -> Sqe {
        Sqe {
            cdw0: opcode as u32,
            ..Default::default()
        }
    }
    /// Opcode.
    pub fn opcode(&self) -> u8 {
        self.cdw0 as u8
    }
    /// Command identifier.
    pub fn cid(&self) -> u16 {
        (self.cdw0 >> 16) as u16
    }
    /// Set the command identifier.
    pub fn set_cid(&mut self, cid: u16) {
        self.cdw0 = (self.cdw0 & 0xffff) | ((cid as u32) << 16);
    }
    /// Set a 64-bit starting LBA into CDW10/11.
    pub fn set_slba(&mut self, slba: u64) {
        self.cdw10 = slba as u32;
        self.cdw11 = (slba >> 32) as u32;
    }
}

/// A 16-byte completion queue entry.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
#[repr(C)]
pub struct Cqe {
    /// Command specific result (DW0).
    pub result: u32,
    /// DW1 (reserved / command specific).
    pub dw1: u32,
    /// SQ head pointer.
    pub sq_head: u16,
    /// SQ identifier.
    pub sq_id: u16,
    /// Command identifier.
    pub cid: u16,
    /// Phase tag (bit 0) and status field (15:1).
    pub status: u16,
}

impl Cqe {
    /// Phase tag.
    pub fn phase(&self) -> bool {
        self.status & 1 != 0
    }
    /// The status field without the phase bit (bits 15:1 of the status word, shifted down).
    pub fn status_field(&self) -> u16 {
        self.status >> 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use zerocopy::IntoBytes;

    #[test]
    fn sqe_layout_matches_spec() {
        let mut s = Sqe::new(io_opcode::READ);
        s.set_cid(0x1234);
        s.nsid = 1;
        s.prp1 = 0x1122_3344_5566_7788;
        s.set_slba(0x0000_0001_0000_0002);
        s.cdw12 = 7 | RW_FUA;
        let b = s.as_bytes();
        assert_eq!(&b[0..4], &[0x02, 0x00, 0x34, 0x12]);
        assert_eq!(&b[4..8], &[1, 0, 0, 0]);
        assert_eq!(&b[24..32], &0x1122_3344_5566_7788u64.to_le_bytes());
        assert_eq!(&b[40..44], &[2, 0, 0, 0]);
        assert_eq!(&b[44..48], &[1, 0, 0, 0]);
        assert_eq!(&b[48..52], &(7u32 | 1 << 30).to_le_bytes());
        assert_eq!(s.cid(), 0x1234);
        assert_eq!(s.opcode(), 2);
    }

    #[test]
    fn cqe_layout_matches_spec() {
        let raw: [u8; 16] = [1, 0, 0, 0, 0, 0, 0, 0, 5, 0, 1, 0, 9, 0, 0x03, 0x80];
        let c = Cqe::read_from_bytes(&raw[..]).unwrap();
        assert_eq!(c.result, 1);
        assert_eq!(c.sq_head, 5);
        assert_eq!(c.sq_id, 1);
        assert_eq!(c.cid, 9);
        assert!(c.phase());
        assert_eq!(c.status_field(), 0x4001); // DNR set, SC 1
    }
}
