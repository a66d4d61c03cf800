//! Checks of what the controller reports, before the driver uses it: device input
//! must never reach a panic, a loop without bound or an allocation without bound).

use ubdirect_core::Mmio;

use crate::error::{NvmeError, Result};
use crate::spec::regs::{cq_head_doorbell, sq_tail_doorbell, Cap};

/// The registers this driver touches end at ACQ (0x30, 8 bytes).
pub(super) const REGISTERS_END: usize = 0x38;

/// CAP checks that do not need the identify data: MQES (0 is reserved: a queue needs two
/// entries) and a BAR0 that holds the registers and the admin doorbells at CAP.DSTRD.
pub(super) fn check_cap(cap: Cap, mmio: &Mmio) -> Result<()> {
    if cap.mqes() == 0 {
        return Err(NvmeError::DeviceInput {
            field: "CAP.MQES",
            value: 0,
            reason: "a queue needs at least 2 entries (MQES 0 is reserved)",
        });
    }
    mmio.check_access(sq_tail_doorbell(0, cap.dstrd()), 4)?;
    mmio.check_access(cq_head_doorbell(0, cap.dstrd()), 4)?;
    Ok(())
}

/// How many of `granted` I/O queues have both doorbells inside BAR0 (qids 1..=n).
pub(super) fn queues_with_doorbells(mmio: &Mmio, dstrd: u8, granted: u16) -> u16 {
    (1..=granted)
        .take_while(|&q| {
            mmio.check_access(sq_tail_doorbell(q, dstrd), 4).is_ok()
                && mmio.check_access(cq_head_doorbell(q, dstrd), 4).is_ok()
        })
        .count() as u16
}

/// Identify Controller SQES / CQES: the driver uses 64-byte SQ and 16-byte CQ entries, so the
/// required size (bits 3:0) must be at most, and the maximum (bits 7:4) at least, those.
pub(super) fn check_entry_sizes(sqes: u8, cqes: u8) -> Result<()> {
    let fits = |v: u8, want: u8| v & 0xf <= want && v >> 4 >= want;
    if !fits(sqes, 6) || !fits(cqes, 4) {
        return Err(NvmeError::Unsupported {
            what: "64-byte SQ and 16-byte CQ entries (Identify SQES/CQES)",
        });
    }
    Ok(())
}
