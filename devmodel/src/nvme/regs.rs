//! Register file of the model: CAP / VS / CC / CSTS / AQA / ASQ / ACQ and the doorbells.

use super::{NvmeModel, State};

/// CC offset.
pub const CC: u64 = 0x14;
/// CSTS offset.
pub const CSTS: u64 = 0x1c;
/// AQA offset.
pub const AQA: u64 = 0x24;
/// ASQ offset.
pub const ASQ: u64 = 0x28;
/// ACQ offset.
pub const ACQ: u64 = 0x30;
/// First doorbell.
pub const DOORBELL_BASE: u64 = 0x1000;

/// A CAP value: MQES `mqes` (0-based), CQR, TO `to` (500 ms units), DSTRD `dstrd`, the NVM
/// command set, MPSMIN 4 KiB, MPSMAX 64 KiB.
pub const fn cap(mqes: u16, dstrd: u8, to: u8) -> u64 {
    mqes as u64 | 1 << 16 | (to as u64) << 24 | ((dstrd as u64) & 0xf) << 32 | 1 << 37 | 4 << 52
}

impl State {
    fn u32_at(&self, off: usize) -> u32 {
        u32::from_le_bytes(self.regs[off..off + 4].try_into().expect("4 bytes"))
    }
    fn u64_at(&self, off: usize) -> u64 {
        u64::from_le_bytes(self.regs[off..off + 8].try_into().expect("8 bytes"))
    }
    pub(crate) fn cc(&self) -> u32 {
        self.u32_at(CC as usize)
    }
    pub(crate) fn dstrd(&self) -> u8 {
        ((self.cfg.cap >> 32) & 0xf) as u8
    }

    /// The register file as bytes 0..0x40 (synthesised read-only registers included).
    fn file(&self) -> [u8; 0x40] {
        let mut f = self.regs;
        let cmbs = if self.cfg.cmb.is_some() {
            super::CAP_CMBS
        } else {
            0
        };
        f[0..8].copy_from_slice(&(self.cfg.cap | cmbs).to_le_bytes());
        f[8..12].copy_from_slice(&self.cfg.vs.to_le_bytes());
        let csts = self.rdy as u32 | (self.cfs as u32) << 1 | (self.shst_complete as u32) << 3;
        f[0x1c..0x20].copy_from_slice(&csts.to_le_bytes());
        f
    }

    pub(crate) fn read_reg(&self, off: u64, size: u8) -> u64 {
        if let Some(v) = self.read_cmb_reg(off, size) {
            return v;
        }
        if off + size as u64 > 0x40 {
            return 0;
        }
        let f = self.file();
        let mut b = [0u8; 8];
        b[..size as usize].copy_from_slice(&f[off as usize..off as usize + size as usize]);
        u64::from_le_bytes(b)
    }

    pub(crate) fn write_reg(&mut self, m: &NvmeModel, off: u64, size: u8, val: u64) {
        if off >= DOORBELL_BASE {
            return self.doorbell(m, off, val as u32);
        }
        if self.write_cmb_reg(off, size, val) {
            return;
        }
        let writable = |o: u64| (CC..CC + 4).contains(&o) || (AQA..ACQ + 8).contains(&o);
        let old_cc = self.cc();
        let bytes = val.to_le_bytes();
        let mut any = false;
        for i in 0..size as u64 {
            let o = off + i;
            if o < 0x40 && writable(o) {
                self.regs[o as usize] = bytes[i as usize];
                any = true;
            }
        }
        if !any {
            self.stats.bad_writes += 1;
            return;
        }
        let cc = self.cc();
        if cc != old_cc {
            self.cc_changed(old_cc, cc);
        }
    }

    fn cc_changed(&mut self, old: u32, new: u32) {
        let (was, is) = (old & 1 != 0, new & 1 != 0);
        if !was && is {
            let aqa = self.u32_at(AQA as usize);
            let (asq, acq) = (self.u64_at(ASQ as usize), self.u64_at(ACQ as usize));
            let sqs = (aqa & 0xfff) as u16 + 1;
            let cqs = ((aqa >> 16) & 0xfff) as u16 + 1;
            self.sqs.insert(0, super::Sq::new(asq, sqs, 0));
            self.cqs.insert(0, super::Cq::new(acq, cqs));
            self.rdy = true;
            self.shst_complete = false;
        } else if was && !is {
            self.sqs.clear();
            self.cqs.clear();
            self.shadow = None;
            self.rdy = false;
            self.cfs = false;
            self.shst_complete = false;
        }
        if is && (new >> 14) & 3 != 0 {
            self.shst_complete = true;
        }
    }

    fn doorbell(&mut self, m: &NvmeModel, off: u64, val: u32) {
        let stride = 4u64 << self.dstrd();
        let rel = off - DOORBELL_BASE;
        if rel % stride != 0 || !self.rdy {
            self.stats.bad_doorbells += 1;
            return;
        }
        let idx = rel / stride;
        let Ok(qid) = u16::try_from(idx / 2) else {
            self.stats.bad_doorbells += 1;
            return;
        };
        let value = val as u16;
        if idx % 2 == 0 {
            if let Some(t) = self.tamper.as_mut() {
                if !t.sq_doorbell(qid, value) {
                    self.stats.lost_doorbells += 1;
                    return;
                }
            }
        }
        if let Some((_, ei)) = self.shadow {
            // EventIdx = the value just seen: the driver rings the register on its next update.
            // A lazy CQ asks to hear of its head only half a ring later.
            let lazy = match self.cqs.get(&qid) {
                Some(cq) if self.cfg.shadow_lazy_cq && idx % 2 == 1 => {
                    Some((val + cq.size as u32 / 2) % cq.size as u32)
                }
                _ => None,
            };
            let _ = m.dma.write_u32(ei + rel, lazy.unwrap_or(val));
        }
        if idx % 2 == 0 {
            match self.sqs.get_mut(&qid) {
                Some(sq) if value < sq.size && val <= 0xffff => sq.tail = value,
                _ => {
                    self.stats.bad_doorbells += 1;
                    return;
                }
            }
            self.process_sq(m, qid);
        } else {
            match self.cqs.get_mut(&qid) {
                Some(cq) if value < cq.size && val <= 0xffff => cq.head = value,
                _ => {
                    self.stats.bad_doorbells += 1;
                    return;
                }
            }
            let waiting: Vec<u16> = self
                .sqs
                .iter()
                .filter(|(_, s)| s.cqid == qid)
                .map(|(&q, _)| q)
                .collect();
            for q in waiting {
                self.process_sq(m, q);
            }
        }
    }
}
