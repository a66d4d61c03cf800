//! Register reads and writes of the 82576 model: side effects (reset, tails, clear-on-read
//! statistics, MDIC) and the hostile plan's rewrites.

use ubdirect_core::DeviceModel;

use super::regs::*;
use super::{IgbModel, State, BAR0_LEN};

impl IgbModel {
    fn read_reg(&self, s: &mut State, off: usize) -> u32 {
        let r = &mut s.regs;
        match off {
            STATUS => {
                let lu = if self.link(s) { 2 } else { 0 };
                1 | lu | (2 << 6) | (1 << 19)
            }
            IMC => r.get(IMS),
            GPRC | GPTC | TPR | TPT => {
                let v = r.get(off);
                r.set(off, 0);
                v
            }
            GORCH | GOTCH => {
                let v = r.get(off);
                r.set(off, 0);
                r.set(off - 4, 0);
                v
            }
            RAL0 => self.plan.mac_regs.map(|m| m.0).unwrap_or(r.get(off)),
            RAH0 => self.plan.mac_regs.map(|m| m.1).unwrap_or(r.get(off)),
            _ => match queue_reg(off) {
                Some((_, _, 0x10)) if self.plan.head.is_some() => self.plan.head.unwrap_or(0),
                Some((_, _, 0x28)) if self.plan.queue_enable_stuck => r.get(off) & !QUEUE_ENABLE,
                _ => r.get(off),
            },
        }
    }

    fn write_mdic(&self, s: &mut State, v: u32) {
        let phy = (v >> 21) & 0x1f;
        let reg = (v >> 16) & 0x1f;
        let write = v & (1 << 26) != 0;
        if self.plan.mdic_error || phy != 1 {
            s.regs.set(MDIC, v | (1 << 28) | (1 << 30));
            return;
        }
        if write && reg == 0 && v & 0x0200 != 0 && v & 0x1000 != 0 {
            // Auto-negotiation restarted: the model's partner answers at once.
            s.autoneg_done = true;
        }
        s.regs.set(MDIC, (v & !(1 << 30)) | (1 << 28));
    }

    fn write_reg(&self, s: &mut State, off: usize, v: u32) -> Option<usize> {
        match off {
            CTRL if v & CTRL_RST != 0 => {
                if self.plan.reset_stuck {
                    s.regs.set(CTRL, v);
                } else {
                    self.reset(s);
                }
            }
            STATUS | GPRC | GPTC | GORCL | GORCH | GOTCL | GOTCH | TPR | TPT => {}
            IMC => {
                let ims = s.regs.get(IMS);
                s.regs.set(IMS, ims & !v);
            }
            IMS => {
                let ims = s.regs.get(IMS);
                s.regs.set(IMS, ims | v);
            }
            EIMC => {
                let eims = s.regs.get(EIMS);
                s.regs.set(EIMS, eims & !v);
            }
            MDIC => self.write_mdic(s, v),
            _ => match queue_reg(off) {
                Some((_, _, 0x08)) => s
                    .regs
                    .set(off, v & self.plan.ring_len_mask.unwrap_or(0xf_ff80)),
                Some((rx, q, 0x18)) => {
                    s.regs.set(off, v & 0xffff);
                    s.stats.tail_writes += 1;
                    if self
                        .plan
                        .silent_after
                        .is_some_and(|n| s.stats.tail_writes > n)
                    {
                        return None;
                    }
                    return Some(if rx { usize::MAX } else { q });
                }
                _ => s.regs.set(off, v),
            },
        }
        if off == RCTL || off == CTRL {
            return Some(usize::MAX);
        }
        None
    }
}

impl DeviceModel for IgbModel {
    fn config_read(&self, off: u16, buf: &mut [u8]) {
        self.config.read(off, buf)
    }

    fn config_write(&self, off: u16, data: &[u8]) {
        self.config.write(off, data)
    }

    fn bar_len(&self, bar: u8) -> u64 {
        match bar {
            0 => self.plan.bar_len.unwrap_or(BAR0_LEN),
            _ => 0,
        }
    }

    fn mmio_read(&self, bar: u8, off: u64, size: u8) -> u64 {
        let mut s = self.st();
        s.reads += 1;
        let ones = u64::MAX >> (64 - 8 * u32::from(size));
        if s.gone || self.plan.all_ones_after.is_some_and(|n| s.reads > n) {
            return ones;
        }
        if bar != 0 || size != 4 || !s.decoding {
            return 0;
        }
        u64::from(self.read_reg(&mut s, off as usize))
    }

    fn mmio_write(&self, bar: u8, off: u64, size: u8, val: u64) {
        if bar != 0 || size != 4 {
            return;
        }
        let mut s = self.st();
        if s.gone || !s.decoding {
            return;
        }
        // Some(usize::MAX): RX may proceed; Some(q): TX queue q's tail moved.
        match self.write_reg(&mut s, off as usize, val as u32) {
            Some(usize::MAX) => self.deliver(&mut s),
            Some(q) => {
                drop(s);
                self.transmit(q);
            }
            None => {}
        }
    }
}
