//! Identify data decoded into plain, serialisable structs ([`ControllerInfo`], [`NamespaceInfo`]).

use serde::Serialize;

use crate::command_set::CommandSet;
use crate::error::NvmeError;
use crate::spec::identify::{ascii_field, IdentifyController, IdentifyNamespace};

/// Identify Controller fields, named as nvme-cli names them.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct ControllerInfo {
    /// PCI Vendor ID.
    pub vid: u16,
    /// PCI Subsystem Vendor ID.
    pub ssvid: u16,
    /// Serial number.
    pub sn: String,
    /// Model number.
    pub mn: String,
    /// Firmware revision.
    pub fr: String,
    /// Maximum Data Transfer Size (log2 of minimum pages; 0 = unlimited).
    pub mdts: u8,
    /// Controller ID.
    pub cntlid: u16,
    /// Version (raw).
    pub ver: u32,
    /// RTD3 Entry Latency in microseconds.
    pub rtd3e: u32,
    /// Optional Admin Command Support.
    pub oacs: u16,
    /// Abort Command Limit (0-based).
    pub acl: u8,
    /// Error Log Page Entries (0-based).
    pub elpe: u8,
    /// SQ entry sizes.
    pub sqes: u8,
    /// CQ entry sizes.
    pub cqes: u8,
    /// Maximum outstanding commands (0 = not reported).
    pub maxcmd: u16,
    /// Number of namespaces.
    pub nn: u32,
    /// Optional NVM Command Support.
    pub oncs: u16,
    /// Volatile Write Cache.
    pub vwc: u8,
    /// SGL support.
    pub sgls: u32,
    /// NVM subsystem NQN.
    pub subnqn: String,
}

impl ControllerInfo {
    /// Decode an Identify Controller page.
    pub fn from_identify(id: &IdentifyController) -> ControllerInfo {
        ControllerInfo {
            vid: id.vid.get(),
            ssvid: id.ssvid.get(),
            sn: ascii_field(&id.sn),
            mn: ascii_field(&id.mn),
            fr: ascii_field(&id.fr),
            mdts: id.mdts,
            cntlid: id.cntlid.get(),
            ver: id.ver.get(),
            rtd3e: id.rtd3e.get(),
            oacs: id.oacs.get(),
            acl: id.acl,
            elpe: id.elpe,
            sqes: id.sqes,
            cqes: id.cqes,
            maxcmd: id.maxcmd.get(),
            nn: id.nn.get(),
            oncs: id.oncs.get(),
            vwc: id.vwc,
            sgls: id.sgls.get(),
            subnqn: ascii_field(&id.subnqn),
        }
    }

    /// Maximum bytes per command for memory page size `page_size` (None = unlimited).
    pub fn max_transfer(&self, page_size: usize) -> Option<usize> {
        (self.mdts != 0).then(|| page_size << self.mdts.min(20))
    }
}

/// One LBA format of a namespace.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
pub struct LbaFormatInfo {
    /// Metadata bytes per block.
    pub ms: u16,
    /// log2 of the data size.
    pub lbads: u8,
    /// Relative performance.
    pub rp: u8,
    /// This format is the one in use.
    pub in_use: bool,
}

/// An active namespace as Identify Namespace reports it (I/O uses the
/// [`crate::Namespace`] handle).
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct NamespaceInfo {
    /// Namespace ID.
    pub nsid: u32,
    /// Size in logical blocks.
    pub nsze: u64,
    /// Capacity in logical blocks.
    pub ncap: u64,
    /// Utilization in logical blocks.
    pub nuse: u64,
    /// Formatted LBA size field.
    pub flbas: u8,
    /// Logical block data size in bytes (from FLBAS/LBAF).
    pub lba_size: u32,
    /// Metadata bytes per block of the format in use.
    pub metadata_size: u16,
    /// End-to-end protection information type in use (DPS bits 2:0; 0 = none, 1-3 = Type 1-3).
    pub protection_type: u8,
    /// The I/O command set the namespace is formatted for (from the Namespace Identification
    /// Descriptor list; [`CommandSet::Nvm`] when the controller reports none).
    pub command_set: CommandSet,
    /// All reported LBA formats.
    pub lbaf: Vec<LbaFormatInfo>,
}

impl NamespaceInfo {
    /// Decode an Identify Namespace page. [`NvmeError::DeviceInput`] when FLBAS selects a
    /// format beyond NLBAF, the format's LBADS is not a size in 512 B..=2 GiB, or NSZE blocks
    /// of that size do not fit in 64 bits of bytes.
    pub fn from_identify(nsid: u32, id: &IdentifyNamespace) -> Result<NamespaceInfo, NvmeError> {
        let idx = id.lba_format_index();
        if idx >= id.lba_format_count() || idx > id.nlbaf as usize {
            return Err(NvmeError::DeviceInput {
                field: "FLBAS",
                value: id.flbas as u64,
                reason: "selects an LBA format beyond the NLBAF + 1 formats reported",
            });
        }
        let cur = id.current_lba_format();
        let lba_size = cur.data_size().ok_or(NvmeError::DeviceInput {
            field: "LBAF.LBADS",
            value: cur.lbads as u64,
            reason: "not a block size of 512 B to 2 GiB (LBADS 9..=31)",
        })?;
        if id.nsze.get().checked_mul(lba_size as u64).is_none() {
            return Err(NvmeError::DeviceInput {
                field: "NSZE",
                value: id.nsze.get(),
                reason: "blocks of the LBA size in use do not fit in a 64-bit byte count",
            });
        }
        let lbaf = (0..id.lba_format_count())
            .map(|i| LbaFormatInfo {
                ms: id.lbaf[i].ms.get(),
                lbads: id.lbaf[i].lbads,
                rp: id.lbaf[i].relative_performance(),
                in_use: i == idx,
            })
            .collect();
        Ok(NamespaceInfo {
            nsid,
            nsze: id.nsze.get(),
            ncap: id.ncap.get(),
            nuse: id.nuse.get(),
            flbas: id.flbas,
            lba_size,
            metadata_size: cur.ms.get(),
            protection_type: id.dps & 0x7,
            command_set: CommandSet::Nvm,
            lbaf,
        })
    }

    /// Size in bytes (checked to fit when decoded; saturating for hand-made values).
    pub fn size_bytes(&self) -> u64 {
        self.nsze.saturating_mul(self.lba_size as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use zerocopy::FromBytes;

    #[test]
    fn namespace_from_identify() {
        let mut p = vec![0u8; 4096];
        p[0..8].copy_from_slice(&2048u64.to_le_bytes());
        p[8..16].copy_from_slice(&2048u64.to_le_bytes());
        p[25] = 1;
        p[26] = 1;
        p[128..132].copy_from_slice(&[0, 0, 9, 0]);
        p[132..136].copy_from_slice(&[0, 0, 12, 0]);
        let id = IdentifyNamespace::ref_from_bytes(&p[..]).unwrap();
        let ns = NamespaceInfo::from_identify(2, id).unwrap();
        assert_eq!(ns.lba_size, 4096);
        assert_eq!(ns.size_bytes(), 8 << 20);
        assert_eq!(ns.lbaf.len(), 2);
        assert!(ns.lbaf[1].in_use && !ns.lbaf[0].in_use);
        // A format with LBADS 0 is refused rather than dividing by a zero block size.
        p[132..136].copy_from_slice(&[0, 0, 0, 0]);
        let id = IdentifyNamespace::ref_from_bytes(&p[..]).unwrap();
        assert!(matches!(
            NamespaceInfo::from_identify(2, id),
            Err(NvmeError::DeviceInput {
                field: "LBAF.LBADS",
                value: 0,
                ..
            })
        ));
    }

    #[test]
    fn mdts_to_bytes() {
        let mut p = vec![0u8; 4096];
        p[77] = 2;
        let id = IdentifyController::ref_from_bytes(&p[..]).unwrap();
        let info = ControllerInfo::from_identify(id);
        assert_eq!(info.max_transfer(4096), Some(16384));
        p[77] = 0;
        let id = IdentifyController::ref_from_bytes(&p[..]).unwrap();
        assert_eq!(ControllerInfo::from_identify(id).max_transfer(4096), None);
    }
}
