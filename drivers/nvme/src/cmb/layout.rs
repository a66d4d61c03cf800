//! CMBLOC / CMBSZ (NVMe base spec 3.1.3.11-12): where the Controller Memory Buffer lies and what
//! it supports, decoded and checked as untrusted device input before anything is mapped.

use crate::error::{NvmeError, Result};

/// Controller Memory Buffer Location register offset.
pub const REG_CMBLOC: usize = 0x38;
/// Controller Memory Buffer Size register offset.
pub const REG_CMBSZ: usize = 0x3c;
/// Controller Memory Buffer Memory Space Control register offset (64 bit, NVMe 1.4).
pub const REG_CMBMSC: usize = 0x50;
/// Controller Memory Buffer Status register offset (NVMe 1.4).
pub const REG_CMBSTS: usize = 0x58;
/// CMBMSC.CRE: Capabilities Registers Enabled (CMBLOC / CMBSZ read non-zero only with it).
pub const CMBMSC_CRE: u64 = 1 << 0;
/// CMBMSC.CMSE: Controller Memory Space Enabled (addresses at CBA refer to the CMB).
pub const CMBMSC_CMSE: u64 = 1 << 1;
/// CMBSTS.CBAI: the CBA written was invalid (the controller did not take it).
pub const CMBSTS_CBAI: u32 = 1 << 0;
/// In BAR0 the CMB may not overlap the registers and the doorbells of the first 512 queues.
pub const BAR0_RESERVED: u64 = 0x2000;

/// A decoded, checked CMB location and size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct CmbLayout {
    /// The BAR holding the CMB (CMBLOC.BIR).
    pub bir: u8,
    /// Byte offset of the CMB in that BAR (CMBLOC.OFST in size units).
    pub offset: u64,
    /// Size in bytes (CMBSZ.SZ in size units).
    pub size: u64,
    /// I/O submission queues may be placed in the CMB (CMBSZ.SQS).
    pub sqs: bool,
    /// I/O completion queues may be placed in the CMB (CMBSZ.CQS).
    pub cqs: bool,
    /// PRP / SGL lists may be placed in the CMB (CMBSZ.LISTS).
    pub lists: bool,
    /// Data the controller reads (writes to the media) may lie in the CMB (CMBSZ.RDS).
    pub rds: bool,
    /// Data the controller writes (reads from the media) may lie in the CMB (CMBSZ.WDS).
    pub wds: bool,
}

fn bad(field: &'static str, value: u32, reason: &'static str) -> NvmeError {
    NvmeError::DeviceInput {
        field,
        value: value as u64,
        reason,
    }
}

impl CmbLayout {
    /// Decode CMBLOC / CMBSZ. `bar_len(i)` is the length of BAR `i`, None when the device does
    /// not implement it. `Ok(None)`: CMBSZ is 0, the controller has no CMB (or it is not
    /// enabled). Every value is checked: reserved size unit, size 0, a BIR that is not a
    /// memory BAR, offset + size past the BAR's end or past 2^64, a CMB over BAR0's registers.
    pub fn decode(
        cmbloc: u32,
        cmbsz: u32,
        bar_len: impl Fn(u8) -> Option<u64>,
    ) -> Result<Option<CmbLayout>> {
        if cmbloc == u32::MAX {
            return Err(NvmeError::DeviceGone { register: "CMBLOC" });
        }
        if cmbsz == u32::MAX {
            return Err(NvmeError::DeviceGone { register: "CMBSZ" });
        }
        if cmbsz == 0 {
            return Ok(None);
        }
        let szu = (cmbsz >> 8) & 0xf;
        if szu > 6 {
            return Err(bad(
                "CMBSZ.SZU",
                szu,
                "a reserved size unit (0..=6 are defined)",
            ));
        }
        let unit = 4096u64 << (4 * szu);
        let sz = (cmbsz >> 12) as u64;
        if sz == 0 {
            return Err(bad("CMBSZ", cmbsz, "CMBSZ.SZ is 0 although CMBSZ is not"));
        }
        let bir = (cmbloc & 7) as u8;
        if !matches!(bir, 0 | 2..=5) {
            return Err(bad(
                "CMBLOC.BIR",
                bir as u32,
                "not a memory BAR of an NVMe controller (BAR1 is BAR0's upper half; 6 and 7 are reserved)",
            ));
        }
        let blen = bar_len(bir).ok_or_else(|| {
            bad(
                "CMBLOC.BIR",
                bir as u32,
                "names a BAR the device does not implement",
            )
        })?;
        // sz < 2^20 and unit <= 2^36: the product fits; the offset may not.
        let size = sz * unit;
        let offset = ((cmbloc >> 12) as u64).checked_mul(unit);
        let end = offset.and_then(|o| o.checked_add(size));
        let (offset, end) = match (offset, end) {
            (Some(o), Some(e)) => (o, e),
            _ => return Err(bad("CMBLOC.OFST", cmbloc, "offset + size overflow 64 bits")),
        };
        if end > blen {
            return Err(bad(
                "CMBLOC/CMBSZ",
                cmbloc,
                "the CMB (offset + size) extends past the end of its BAR",
            ));
        }
        if bir == 0 && offset < BAR0_RESERVED {
            return Err(bad(
                "CMBLOC.OFST",
                cmbloc,
                "the CMB would overlap BAR0's registers and doorbells",
            ));
        }
        Ok(Some(CmbLayout {
            bir,
            offset,
            size,
            sqs: cmbsz & 1 != 0,
            cqs: cmbsz & 2 != 0,
            lists: cmbsz & 4 != 0,
            rds: cmbsz & 8 != 0,
            wds: cmbsz & 16 != 0,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// QEMU 10's values for `cmb_size_mb=16` once CMBMSC.CRE is set (BIR 2, OFST 0, SQS, LISTS,
    /// RDS, WDS, SZU 1 MiB, SZ 16; CDPCILS/CDPMLS bits in CMBLOC).
    const QEMU_LOC: u32 = 0x2 | 1 << 8 | 1 << 9;
    const QEMU_SZ: u32 = 0b11101 | 2 << 8 | 16 << 12;

    fn bars(bir: u8) -> Option<u64> {
        match bir {
            0 => Some(0x4000),
            2 => Some(16 << 20),
            4 => Some(1 << 40),
            _ => None,
        }
    }

    fn input_err(loc: u32, sz: u32) -> &'static str {
        match CmbLayout::decode(loc, sz, bars) {
            Err(NvmeError::DeviceInput { field, .. }) => field,
            other => panic!("CMBLOC {loc:#x} CMBSZ {sz:#x}: expected DeviceInput, got {other:?}"),
        }
    }

    #[test]
    fn qemu_cmb_decodes() {
        let l = CmbLayout::decode(QEMU_LOC, QEMU_SZ, bars).unwrap().unwrap();
        assert_eq!(
            l,
            CmbLayout {
                bir: 2,
                offset: 0,
                size: 16 << 20,
                sqs: true,
                cqs: false,
                lists: true,
                rds: true,
                wds: true,
            }
        );
        // Offsets count in size units: OFST 3 with 64 KiB units is 192 KiB into the BAR.
        let l = CmbLayout::decode(4 | 3 << 12, 1 << 8 | 2 << 12, bars)
            .unwrap()
            .unwrap();
        assert_eq!(
            (l.bir, l.offset, l.size, l.sqs),
            (4, 3 << 16, 2 << 16, false)
        );
    }

    #[test]
    fn no_cmb_and_gone_device() {
        assert_eq!(CmbLayout::decode(0, 0, bars).unwrap(), None);
        assert!(matches!(
            CmbLayout::decode(u32::MAX, QEMU_SZ, bars),
            Err(NvmeError::DeviceGone { register: "CMBLOC" })
        ));
        assert!(matches!(
            CmbLayout::decode(QEMU_LOC, u32::MAX, bars),
            Err(NvmeError::DeviceGone { register: "CMBSZ" })
        ));
    }

    #[test]
    fn hostile_values_are_refused() {
        // Reserved size units 7..=15.
        assert_eq!(input_err(QEMU_LOC, 7 << 8 | 1 << 12), "CMBSZ.SZU");
        assert_eq!(input_err(QEMU_LOC, 15 << 8 | 1 << 12 | 1), "CMBSZ.SZU");
        // Size 0 with capability bits set.
        assert_eq!(input_err(QEMU_LOC, 0b11111 | 2 << 8), "CMBSZ");
        // BIR 1 (BAR0's upper half), 6, 7, and a BAR the device lacks (3).
        for bir in [1, 3, 6, 7] {
            assert_eq!(input_err(bir, QEMU_SZ), "CMBLOC.BIR", "bir {bir}");
        }
        // One unit past the BAR's end, and a size bigger than the BAR.
        assert_eq!(input_err(2 | 1 << 12, QEMU_SZ), "CMBLOC/CMBSZ");
        assert_eq!(input_err(2, 2 << 8 | 17 << 12), "CMBLOC/CMBSZ");
        // The largest offset and size (about 2^56 bytes each, in 64 GiB units): past the BAR.
        assert_eq!(
            input_err(4 | 0xfffff << 12, 6 << 8 | 0xfffff << 12),
            "CMBLOC/CMBSZ"
        );
        // Over BAR0's registers.
        assert_eq!(input_err(0, 1 << 12), "CMBLOC.OFST");
    }

    #[test]
    fn field_extremes_decode_exactly() {
        // A BAR claiming 2^64 bytes: every extreme of OFST, SZ and SZU decodes to its exact
        // byte value (offset + size stay below 2^57, so nothing wraps).
        let huge = |_: u8| Some(u64::MAX);
        for szu in 0..=6u32 {
            for ofst in [0u32, 1, 0x7ffff, 0xfffff] {
                for sz in [1u32, 0xfffff] {
                    let r = CmbLayout::decode(4 | ofst << 12, szu << 8 | sz << 12, huge);
                    let l = r.unwrap().unwrap();
                    let unit = 4096u64 << (4 * szu);
                    assert_eq!(l.offset, ofst as u64 * unit);
                    assert_eq!(l.size, sz as u64 * unit);
                    assert!(l.offset.checked_add(l.size).is_some());
                }
            }
        }
    }
}
