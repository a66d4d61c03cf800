//! The model's Controller Memory Buffer registers (NVMe 1.4): CAP.CMBS, CMBLOC / CMBSZ that read
//! 0 until CMBMSC.CRE is set (as QEMU's controller does), CMBMSC as written, CMBSTS 0. The BAR
//! named by CMBLOC.BIR exists with the configured length; the model keeps no memory behind it.

use super::State;

/// The CMB the model reports (raw register values, so tests can set any of them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CmbConfig {
    /// The BAR the model implements for the CMB (its length is `bar_len`).
    pub bir: u8,
    /// Length of that BAR in bytes.
    pub bar_len: u64,
    /// CMBLOC once CMBMSC.CRE is set.
    pub cmbloc: u32,
    /// CMBSZ once CMBMSC.CRE is set.
    pub cmbsz: u32,
}

impl CmbConfig {
    /// What QEMU 10 reports for `cmb_size_mb=mb`: BAR2, offset 0, SQS, LISTS, RDS, WDS, 1 MiB
    /// units.
    pub const fn qemu(mb: u32) -> CmbConfig {
        CmbConfig {
            bir: 2,
            bar_len: (mb as u64) << 20,
            cmbloc: 2 | 1 << 8 | 1 << 9,
            cmbsz: 0b11101 | 2 << 8 | mb << 12,
        }
    }
}

/// CAP.CMBS.
pub const CAP_CMBS: u64 = 1 << 57;
const CMBLOC: u64 = 0x38;
const CMBSZ: u64 = 0x3c;
const CMBMSC: u64 = 0x50;
const CMBMSC_HI: u64 = 0x54;
const CMBSTS: u64 = 0x58;

impl State {
    /// A read of a CMB register (None: not one).
    pub(crate) fn read_cmb_reg(&self, off: u64, size: u8) -> Option<u64> {
        let cmb = self.cfg.cmb?;
        let cre = self.cmbmsc & 1 != 0;
        Some(match (off, size) {
            (CMBLOC, 4) if cre => cmb.cmbloc as u64,
            (CMBSZ, 4) if cre => cmb.cmbsz as u64,
            (CMBLOC, 4) | (CMBSZ, 4) | (CMBSTS, 4) => 0,
            (CMBMSC, 8) => self.cmbmsc,
            (CMBMSC, 4) => self.cmbmsc & 0xffff_ffff,
            (CMBMSC_HI, 4) => self.cmbmsc >> 32,
            _ => return None,
        })
    }

    /// A write of CMBMSC (true: it was one).
    pub(crate) fn write_cmb_reg(&mut self, off: u64, size: u8, val: u64) -> bool {
        if self.cfg.cmb.is_none() {
            return false;
        }
        match (off, size) {
            (CMBMSC, 8) => self.cmbmsc = val,
            (CMBMSC, 4) => self.cmbmsc = (self.cmbmsc & !0xffff_ffff) | (val & 0xffff_ffff),
            (CMBMSC_HI, 4) => self.cmbmsc = (self.cmbmsc & 0xffff_ffff) | val << 32,
            _ => return false,
        }
        true
    }
}
