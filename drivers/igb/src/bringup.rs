//! Bring-up steps on the register file: reset with a deadline, interrupts masked, the MAC from
//! the receive-address registers, link up through the PHY, and ring programming with every
//! value read back.

use std::time::{Duration, Instant};

use ubdirect_core::pci::PciAddress;
use ubdirect_core::Mmio;

use crate::error::{IgbError, Result};
use crate::regs;
use crate::ring::Ring;

/// The 82576's internal PHY address.
const PHY_ADDR: u32 = 1;

/// Polls `f` until it returns `Some`, or `None` once `deadline` passed (one last try after it).
pub(crate) fn poll_until<T>(deadline: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if start.elapsed() >= deadline {
            return f();
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// The cause of `DeviceGone` when STATUS reads 0.
pub(crate) const STATUS_ZERO: &str =
    "STATUS reads 0: the BAR no longer decodes (memory decoding off, or the device was removed)";

fn gone(addr: PciAddress, cause: &'static str) -> IgbError {
    IgbError::DeviceGone { addr, cause }
}

/// Masks every interrupt cause (legacy and extended): the driver polls.
pub(crate) fn mask_interrupts(r: &Mmio) {
    r.write32(regs::IMC, u32::MAX);
    r.write32(regs::EIMC, u32::MAX);
    r.write32(regs::EIAC, 0);
}

/// Resets the device (CTRL.RST) and waits, up to `deadline`, for RST to clear. All-ones reads
/// are `DeviceGone`, before or after.
pub(crate) fn reset(r: &Mmio, addr: PciAddress, deadline: Duration) -> Result<()> {
    let ctrl = r.read32(regs::CTRL);
    if ctrl == u32::MAX || r.read32(regs::STATUS) == u32::MAX {
        return Err(gone(addr, "CTRL/STATUS read all-ones before the reset"));
    }
    mask_interrupts(r);
    r.write32(regs::RCTL, 0);
    r.write32(regs::TCTL, 0);
    r.write32(regs::CTRL, ctrl | regs::CTRL_RST);
    // The datasheet asks for a few microseconds before the next access after a reset.
    let t = Instant::now();
    while t.elapsed() < Duration::from_micros(5) {
        std::hint::spin_loop();
    }
    let mut last = 0;
    let done = poll_until(deadline, || {
        last = r.read32(regs::CTRL);
        (last != u32::MAX && last & regs::CTRL_RST == 0).then_some(())
    });
    if last == u32::MAX {
        return Err(gone(addr, "CTRL reads all-ones after the reset"));
    }
    if done.is_none() {
        return Err(IgbError::ResetTimeout {
            addr,
            waited: deadline,
            ctrl: last,
        });
    }
    // A BAR that stopped decoding reads 0 in QEMU, which also passes for a finished reset:
    // STATUS always has bits set (duplex, speed) on a live device.
    if r.read32(regs::STATUS) == 0 {
        return Err(gone(addr, STATUS_ZERO));
    }
    mask_interrupts(r);
    Ok(())
}

/// The MAC address in receive-address entry 0, when it is valid (AV) and not all zeros.
pub(crate) fn read_mac(r: &Mmio) -> Option<[u8; 6]> {
    let lo = r.read32(regs::RAL0).to_le_bytes();
    let hi = r.read32(regs::RAH0);
    if hi & regs::RAH_AV == 0 {
        return None;
    }
    let hi = hi.to_le_bytes();
    let mac = [lo[0], lo[1], lo[2], lo[3], hi[0], hi[1]];
    (mac != [0; 6] && mac != [0xff; 6]).then_some(mac)
}

/// Sets link up (CTRL.SLU) and restarts auto-negotiation in the PHY through MDIC.
/// Waits up to `deadline` for MDIC to finish.
pub(crate) fn link_up(r: &Mmio, addr: PciAddress, deadline: Duration) -> Result<()> {
    let ctrl = r.read32(regs::CTRL);
    r.write32(regs::CTRL, ctrl | regs::CTRL_SLU | regs::CTRL_FD);
    let ext = r.read32(regs::CTRL_EXT);
    r.write32(regs::CTRL_EXT, ext | regs::CTRL_EXT_DRV_LOAD);
    r.write32(
        regs::MDIC,
        u32::from(regs::PHY_BMCR_AUTONEG_RESTART)
            | (PHY_ADDR << regs::MDIC_PHY_SHIFT)
            | regs::MDIC_OP_WRITE,
    );
    let mut mdic = 0;
    let done = poll_until(deadline, || {
        mdic = r.read32(regs::MDIC);
        (mdic & regs::MDIC_READY != 0).then_some(())
    });
    if mdic == u32::MAX {
        return Err(gone(addr, "MDIC reads all-ones"));
    }
    if done.is_none() || mdic & regs::MDIC_ERROR != 0 {
        return Err(IgbError::PhyAccess { addr, mdic });
    }
    Ok(())
}

/// Waits up to `deadline` for STATUS.LU.
pub(crate) fn wait_link(r: &Mmio, addr: PciAddress, deadline: Duration) -> Result<()> {
    let mut status = 0;
    let up = poll_until(deadline, || {
        status = r.read32(regs::STATUS);
        (status != u32::MAX && status & regs::STATUS_LU != 0).then_some(())
    });
    if status == u32::MAX {
        return Err(gone(
            addr,
            "STATUS reads all-ones while waiting for the link",
        ));
    }
    if up.is_none() {
        return Err(IgbError::LinkDown {
            addr,
            waited: Some(deadline),
        });
    }
    Ok(())
}

/// Writes `v` to `off` and checks it reads back (`mask`ed).
fn write_checked(
    r: &Mmio,
    addr: PciAddress,
    queue: usize,
    what: &'static str,
    (off, v, mask): (usize, u32, u32),
) -> Result<()> {
    r.write32(off, v);
    let read = r.read32(off);
    if read == u32::MAX && v != u32::MAX {
        return Err(gone(addr, "a ring register reads all-ones"));
    }
    if read & mask != v & mask {
        return Err(IgbError::RingRejected {
            addr,
            queue,
            what,
            wrote: v,
            read,
        });
    }
    Ok(())
}

fn enable_queue(
    r: &Mmio,
    (addr, queue): (PciAddress, usize),
    what: &'static str,
    off: usize,
    deadline: Duration,
) -> Result<()> {
    let v = r.read32(off);
    if v == u32::MAX {
        return Err(gone(addr, "a queue control register reads all-ones"));
    }
    r.write32(off, v | regs::QUEUE_ENABLE);
    let mut read = 0;
    let on = poll_until(deadline, || {
        read = r.read32(off);
        (read != u32::MAX && read & regs::QUEUE_ENABLE != 0).then_some(())
    });
    if on.is_none() {
        return Err(IgbError::RingRejected {
            addr,
            queue,
            what,
            wrote: v | regs::QUEUE_ENABLE,
            read,
        });
    }
    Ok(())
}

/// Programs RX queue `q` with `ring` (advanced one-buffer descriptors of `buf_len` bytes,
/// dropping frames when no descriptor is posted) and enables it; the tail stays 0.
pub(crate) fn setup_rx(
    r: &Mmio,
    (addr, q, l): (PciAddress, usize, regs::QueueRegs),
    ring: &Ring,
    buf_len: usize,
    deadline: Duration,
) -> Result<()> {
    let iova = ring.mem.iova();
    let len = u32::from(ring.size()) * 16;
    write_checked(r, addr, q, "RDBAL", (l.rdbal(q), iova as u32, u32::MAX))?;
    write_checked(
        r,
        addr,
        q,
        "RDBAH",
        (l.rdbah(q), (iova >> 32) as u32, u32::MAX),
    )?;
    write_checked(r, addr, q, "RDLEN", (l.rdlen(q), len, u32::MAX))?;
    let kb = (buf_len / 1024) as u32 & regs::SRRCTL_BSIZEPKT_MASK;
    let srrctl = kb | regs::SRRCTL_DESCTYPE_ADV_ONEBUF | regs::SRRCTL_DROP_EN;
    write_checked(
        r,
        addr,
        q,
        "SRRCTL",
        (l.srrctl(q), srrctl, regs::SRRCTL_BSIZEPKT_MASK),
    )?;
    r.write32(l.rdh(q), 0);
    r.write32(l.rdt(q), 0);
    enable_queue(r, (addr, q), "RXDCTL", l.rxdctl(q), deadline)
}

/// Programs TX queue `q` with `ring` (DD written back into the descriptors) and enables it.
pub(crate) fn setup_tx(
    r: &Mmio,
    (addr, q, l): (PciAddress, usize, regs::QueueRegs),
    ring: &Ring,
    deadline: Duration,
) -> Result<()> {
    let iova = ring.mem.iova();
    let len = u32::from(ring.size()) * 16;
    write_checked(r, addr, q, "TDBAL", (l.tdbal(q), iova as u32, u32::MAX))?;
    write_checked(
        r,
        addr,
        q,
        "TDBAH",
        (l.tdbah(q), (iova >> 32) as u32, u32::MAX),
    )?;
    write_checked(r, addr, q, "TDLEN", (l.tdlen(q), len, u32::MAX))?;
    r.write32(l.tdwbal(q), 0);
    r.write32(l.tdh(q), 0);
    r.write32(l.tdt(q), 0);
    enable_queue(r, (addr, q), "TXDCTL", l.txdctl(q), deadline)
}

/// Turns the receiver and transmitter on: CRC stripped, broadcast accepted, frames up to
/// `max_frame` bytes (without FCS) accepted whether VLAN-tagged or not (LPE with RLPML: without
/// it an untagged frame over 1514 bytes is dropped as oversized), and unicast / multicast
/// promiscuous when `promiscuous`.
pub(crate) fn enable_rx_tx(r: &Mmio, promiscuous: bool, max_frame: usize) {
    r.write32(regs::RLPML, max_frame as u32 + 4);
    let mut rctl = regs::RCTL_EN | regs::RCTL_BAM | regs::RCTL_SECRC | regs::RCTL_LPE;
    if promiscuous {
        rctl |= regs::RCTL_UPE | regs::RCTL_MPE;
    }
    r.write32(regs::RCTL, rctl);
    r.write32(
        regs::TCTL,
        regs::TCTL_EN | regs::TCTL_PSP | regs::TCTL_CT_COLD,
    );
}
