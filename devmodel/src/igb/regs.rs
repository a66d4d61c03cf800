//! The 82576 registers the model implements (datasheet chapter 8), written independently of
//! the driver's table so a wrong offset on either side shows up in the tests.

pub(crate) const CTRL: usize = 0x0000;
pub(crate) const STATUS: usize = 0x0008;
pub(crate) const EECD: usize = 0x0010;
pub(crate) const MDIC: usize = 0x0020;
pub(crate) const IMS: usize = 0x00d0;
pub(crate) const IMC: usize = 0x00d8;
pub(crate) const RCTL: usize = 0x0100;
pub(crate) const TCTL: usize = 0x0400;
pub(crate) const EIMS: usize = 0x1524;
pub(crate) const EIMC: usize = 0x1528;
pub(crate) const RLPML: usize = 0x5004;
pub(crate) const RAL0: usize = 0x5400;
pub(crate) const RAH0: usize = 0x5404;
pub(crate) const GPRC: usize = 0x4074;
pub(crate) const GPTC: usize = 0x4080;
pub(crate) const GORCL: usize = 0x4088;
pub(crate) const GORCH: usize = 0x408c;
pub(crate) const GOTCL: usize = 0x4090;
pub(crate) const GOTCH: usize = 0x4094;
pub(crate) const TPR: usize = 0x40d0;
pub(crate) const TPT: usize = 0x40d4;
pub(crate) const QUEUE_ENABLE: u32 = 1 << 25;
pub(crate) const CTRL_RST: u32 = 1 << 26;
pub(crate) const CTRL_SLU: u32 = 1 << 6;
/// Queues of the 82576.
pub(crate) const QUEUES: usize = 16;

pub(crate) const fn rdbal(n: usize) -> usize {
    0xc000 + 0x40 * n
}
pub(crate) const fn rdbah(n: usize) -> usize {
    0xc004 + 0x40 * n
}
pub(crate) const fn rdlen(n: usize) -> usize {
    0xc008 + 0x40 * n
}
pub(crate) const fn srrctl(n: usize) -> usize {
    0xc00c + 0x40 * n
}
pub(crate) const fn rdh(n: usize) -> usize {
    0xc010 + 0x40 * n
}
pub(crate) const fn rdt(n: usize) -> usize {
    0xc018 + 0x40 * n
}
pub(crate) const fn rxdctl(n: usize) -> usize {
    0xc028 + 0x40 * n
}
pub(crate) const fn tdbal(n: usize) -> usize {
    0xe000 + 0x40 * n
}
pub(crate) const fn tdbah(n: usize) -> usize {
    0xe004 + 0x40 * n
}
pub(crate) const fn tdlen(n: usize) -> usize {
    0xe008 + 0x40 * n
}
pub(crate) const fn tdh(n: usize) -> usize {
    0xe010 + 0x40 * n
}
pub(crate) const fn tdt(n: usize) -> usize {
    0xe018 + 0x40 * n
}
pub(crate) const fn txdctl(n: usize) -> usize {
    0xe028 + 0x40 * n
}

/// Which queue's register `off` is, and its offset within the queue's block, for the RX
/// (0xc000) and TX (0xe000) blocks.
pub(crate) fn queue_reg(off: usize) -> Option<(bool, usize, usize)> {
    for (rx, base) in [(true, 0xc000), (false, 0xe000)] {
        if (base..base + 0x40 * QUEUES).contains(&off) {
            return Some((rx, (off - base) / 0x40, (off - base) % 0x40));
        }
    }
    None
}
