//! Identify Controller and Identify Namespace data structures (4096 B each).

use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// Size of every Identify data structure.
pub const IDENTIFY_LEN: usize = 4096;

/// OACS bit 8: Doorbell Buffer Config command supported.
pub const OACS_DOORBELL_BUFFER_CONFIG: u16 = 1 << 8;
/// ONCS bit 2: Dataset Management supported.
pub const ONCS_DSM: u16 = 1 << 2;
/// ONCS bit 3: Write Zeroes supported.
pub const ONCS_WRITE_ZEROES: u16 = 1 << 3;
/// VWC bit 0: a volatile write cache is present.
pub const VWC_PRESENT: u8 = 1;

/// Identify Controller data structure (CNS 01h); the fields this driver uses.
#[derive(Clone, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct IdentifyController {
    /// PCI Vendor ID.
    pub vid: U16,
    /// PCI Subsystem Vendor ID.
    pub ssvid: U16,
    /// Serial Number (ASCII, space padded).
    pub sn: [u8; 20],
    /// Model Number (ASCII, space padded).
    pub mn: [u8; 40],
    /// Firmware Revision (ASCII, space padded).
    pub fr: [u8; 8],
    /// Recommended Arbitration Burst.
    pub rab: u8,
    /// IEEE OUI.
    pub ieee: [u8; 3],
    /// Controller Multi-Path I/O and Namespace Sharing Capabilities.
    pub cmic: u8,
    /// Maximum Data Transfer Size (2^MDTS minimum memory pages; 0 = no limit).
    pub mdts: u8,
    /// Controller ID.
    pub cntlid: U16,
    /// Version.
    pub ver: U32,
    /// RTD3 Resume Latency (us).
    pub rtd3r: U32,
    /// RTD3 Entry Latency (us): worst-case time to shut down.
    pub rtd3e: U32,
    _rsvd92: [u8; 256 - 92],
    /// Optional Admin Command Support.
    pub oacs: U16,
    /// Abort Command Limit (0-based).
    pub acl: u8,
    /// Asynchronous Event Request Limit (0-based).
    pub aerl: u8,
    /// Firmware Updates.
    pub frmw: u8,
    /// Log Page Attributes.
    pub lpa: u8,
    /// Error Log Page Entries (0-based).
    pub elpe: u8,
    /// Number of Power States Support (0-based).
    pub npss: u8,
    _rsvd264: [u8; 512 - 264],
    /// Submission Queue Entry Size (3:0 required, 7:4 maximum; log2).
    pub sqes: u8,
    /// Completion Queue Entry Size (3:0 required, 7:4 maximum; log2).
    pub cqes: u8,
    /// Maximum Outstanding Commands.
    pub maxcmd: U16,
    /// Number of Namespaces (largest namespace ID).
    pub nn: U32,
    /// Optional NVM Command Support.
    pub oncs: U16,
    /// Fused Operation Support.
    pub fuses: U16,
    /// Format NVM Attributes.
    pub fna: u8,
    /// Volatile Write Cache.
    pub vwc: u8,
    /// Atomic Write Unit Normal.
    pub awun: U16,
    /// Atomic Write Unit Power Fail.
    pub awupf: U16,
    /// I/O Command Set Vendor Specific Command Configuration.
    pub icsvscc: u8,
    /// Namespace Write Protection Capabilities.
    pub nwpc: u8,
    /// Atomic Compare & Write Unit.
    pub acwu: U16,
    _rsvd534: [u8; 2],
    /// SGL Support.
    pub sgls: U32,
    _rsvd540: [u8; 768 - 540],
    /// NVM Subsystem NVMe Qualified Name.
    pub subnqn: [u8; 256],
    _rsvd1024: [u8; 4096 - 1024],
}

const _: () = assert!(std::mem::size_of::<IdentifyController>() == IDENTIFY_LEN);

/// One LBA Format descriptor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct LbaFormat {
    /// Metadata Size in bytes.
    pub ms: U16,
    /// LBA Data Size (log2 bytes; below 9 means not supported).
    pub lbads: u8,
    /// Relative Performance (bits 1:0).
    pub rp: u8,
}

impl LbaFormat {
    /// LBA data size in bytes, or None when LBADS is not a valid size (< 9 or > 31).
    pub fn data_size(&self) -> Option<u32> {
        (9..32).contains(&self.lbads).then(|| 1u32 << self.lbads)
    }
    /// Relative performance (0 best .. 3 degraded).
    pub fn relative_performance(&self) -> u8 {
        self.rp & 3
    }
}

/// Identify Namespace data structure (CNS 00h); the fields this driver uses.
#[derive(Clone, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct IdentifyNamespace {
    /// Namespace Size in logical blocks.
    pub nsze: U64,
    /// Namespace Capacity in logical blocks.
    pub ncap: U64,
    /// Namespace Utilization in logical blocks.
    pub nuse: U64,
    /// Namespace Features.
    pub nsfeat: u8,
    /// Number of LBA Formats (0-based).
    pub nlbaf: u8,
    /// Formatted LBA Size (3:0 low index, 6:5 high index, 4 extended metadata).
    pub flbas: u8,
    /// Metadata Capabilities.
    pub mc: u8,
    /// End-to-end Data Protection Capabilities.
    pub dpc: u8,
    /// End-to-end Data Protection Type Settings.
    pub dps: u8,
    _rsvd30: [u8; 128 - 30],
    /// LBA Format descriptors 0..63.
    pub lbaf: [LbaFormat; 64],
    _rsvd384: [u8; 4096 - 384],
}

const _: () = assert!(std::mem::size_of::<IdentifyNamespace>() == IDENTIFY_LEN);

impl IdentifyNamespace {
    /// Index of the LBA format in use (FLBAS bits 3:0 plus bits 6:5 as the high bits).
    pub fn lba_format_index(&self) -> usize {
        ((self.flbas & 0xf) | ((self.flbas >> 5) & 0x3) << 4) as usize
    }
    /// Number of LBA formats reported (NLBAF + 1, capped at 64).
    pub fn lba_format_count(&self) -> usize {
        (self.nlbaf as usize + 1).min(64)
    }
    /// The LBA format in use.
    pub fn current_lba_format(&self) -> LbaFormat {
        self.lbaf[self.lba_format_index().min(63)]
    }
}

/// Trim the ASCII space / NUL padding of an identify string field.
pub fn ascii_field(raw: &[u8]) -> String {
    let s: String = raw
        .iter()
        .map(|&b| {
            if b.is_ascii_graphic() || b == b' ' {
                b as char
            } else {
                ' '
            }
        })
        .collect();
    s.trim_end_matches([' ', '\0']).trim_start().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn controller_page() -> Vec<u8> {
        let mut p = vec![0u8; 4096];
        p[0..2].copy_from_slice(&0x1b36u16.to_le_bytes());
        p[2..4].copy_from_slice(&0x1af4u16.to_le_bytes());
        p[4..24].copy_from_slice(b"ubd1                ");
        p[24..64].copy_from_slice(b"QEMU NVMe Ctrl                          ");
        p[64..72].copy_from_slice(b"10.0.2  ");
        p[77] = 2;
        p[78..80].copy_from_slice(&7u16.to_le_bytes());
        p[80..84].copy_from_slice(&0x0001_0400u32.to_le_bytes());
        p[88..92].copy_from_slice(&2_000_000u32.to_le_bytes());
        p[256..258].copy_from_slice(&0x014au16.to_le_bytes());
        p[512] = 0x66;
        p[513] = 0x44;
        p[516..520].copy_from_slice(&256u32.to_le_bytes());
        p[520..522].copy_from_slice(&0x015du16.to_le_bytes());
        p[525] = 7;
        p[536..540].copy_from_slice(&0x0010_0001u32.to_le_bytes());
        p
    }

    #[test]
    fn identify_controller_parses() {
        let page = controller_page();
        let id = IdentifyController::ref_from_bytes(&page[..]).unwrap();
        assert_eq!(id.vid.get(), 0x1b36);
        assert_eq!(id.ssvid.get(), 0x1af4);
        assert_eq!(ascii_field(&id.sn), "ubd1");
        assert_eq!(ascii_field(&id.mn), "QEMU NVMe Ctrl");
        assert_eq!(ascii_field(&id.fr), "10.0.2");
        assert_eq!(id.mdts, 2);
        assert_eq!(id.cntlid.get(), 7);
        assert_eq!(id.ver.get(), 0x0001_0400);
        assert_eq!(id.rtd3e.get(), 2_000_000);
        assert_eq!(
            id.oacs.get() & OACS_DOORBELL_BUFFER_CONFIG,
            OACS_DOORBELL_BUFFER_CONFIG
        );
        assert_eq!((id.sqes, id.cqes), (0x66, 0x44));
        assert_eq!(id.nn.get(), 256);
        assert_ne!(id.oncs.get() & ONCS_WRITE_ZEROES, 0);
        assert_ne!(id.oncs.get() & ONCS_DSM, 0);
        assert_eq!(id.vwc & VWC_PRESENT, 1);
        assert_eq!(id.sgls.get(), 0x0010_0001);
    }

    #[test]
    fn identify_namespace_parses() {
        let mut p = vec![0u8; 4096];
        p[0..8].copy_from_slice(&1000u64.to_le_bytes());
        p[8..16].copy_from_slice(&900u64.to_le_bytes());
        p[16..24].copy_from_slice(&10u64.to_le_bytes());
        p[25] = 1; // two formats
        p[26] = 1; // format 1 in use
        p[128..132].copy_from_slice(&[0, 0, 9, 0]);
        p[132..136].copy_from_slice(&[8, 0, 12, 2]);
        let ns = IdentifyNamespace::ref_from_bytes(&p[..]).unwrap();
        assert_eq!(ns.nsze.get(), 1000);
        assert_eq!(ns.ncap.get(), 900);
        assert_eq!(ns.nuse.get(), 10);
        assert_eq!(ns.lba_format_count(), 2);
        assert_eq!(ns.lba_format_index(), 1);
        let f = ns.current_lba_format();
        assert_eq!(f.data_size(), Some(4096));
        assert_eq!(f.ms.get(), 8);
        assert_eq!(f.relative_performance(), 2);
        assert_eq!(ns.lbaf[0].data_size(), Some(512));
        assert_eq!(ns.lbaf[5].data_size(), None);
    }

    #[test]
    fn flbas_high_bits_select_formats_above_15() {
        let mut p = vec![0u8; 4096];
        p[26] = 0b0010_0011; // low 3, high 1 -> 19
        let ns = IdentifyNamespace::ref_from_bytes(&p[..]).unwrap();
        assert_eq!(ns.lba_format_index(), 19);
    }

    #[test]
    fn short_identify_page_is_rejected() {
        assert!(IdentifyController::ref_from_bytes(&[0u8; 100][..]).is_err());
    }
}
