//! Controller register offsets and the CAP / CC / CSTS / AQA / VS bitfields (NVMe base spec 3.1).

/// Controller Capabilities (64 bit).
pub const REG_CAP: usize = 0x00;
/// Version (32 bit).
pub const REG_VS: usize = 0x08;
/// Interrupt Mask Set.
pub const REG_INTMS: usize = 0x0c;
/// Interrupt Mask Clear.
pub const REG_INTMC: usize = 0x10;
/// Controller Configuration.
pub const REG_CC: usize = 0x14;
/// Controller Status.
pub const REG_CSTS: usize = 0x1c;
/// Admin Queue Attributes.
pub const REG_AQA: usize = 0x24;
/// Admin Submission Queue base address (64 bit).
pub const REG_ASQ: usize = 0x28;
/// Admin Completion Queue base address (64 bit).
pub const REG_ACQ: usize = 0x30;
/// First doorbell register.
pub const REG_DOORBELL_BASE: usize = 0x1000;

/// Offset of the submission queue `qid` tail doorbell for a doorbell stride `dstrd` (CAP.DSTRD).
pub const fn sq_tail_doorbell(qid: u16, dstrd: u8) -> usize {
    REG_DOORBELL_BASE + (2 * qid as usize) * (4usize << dstrd)
}

/// Offset of the completion queue `qid` head doorbell for a doorbell stride `dstrd`.
pub const fn cq_head_doorbell(qid: u16, dstrd: u8) -> usize {
    REG_DOORBELL_BASE + (2 * qid as usize + 1) * (4usize << dstrd)
}

/// Decoded Controller Capabilities register.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cap(pub u64);

impl Cap {
    /// Maximum Queue Entries Supported, zero-based (MQES + 1 entries per queue).
    pub fn mqes(self) -> u16 {
        (self.0 & 0xffff) as u16
    }
    /// Largest queue size in entries (MQES + 1).
    pub fn max_queue_entries(self) -> u32 {
        self.mqes() as u32 + 1
    }
    /// Contiguous Queues Required.
    pub fn cqr(self) -> bool {
        self.0 & (1 << 16) != 0
    }
    /// Timeout in 500 ms units (worst-case time to change CSTS.RDY).
    pub fn to(self) -> u8 {
        ((self.0 >> 24) & 0xff) as u8
    }
    /// CAP.TO as a duration.
    pub fn timeout(self) -> std::time::Duration {
        std::time::Duration::from_millis(500 * self.to().max(1) as u64)
    }
    /// Doorbell Stride (2 ^ (2 + DSTRD) bytes).
    pub fn dstrd(self) -> u8 {
        ((self.0 >> 32) & 0xf) as u8
    }
    /// NVM Subsystem Reset Supported.
    pub fn nssrs(self) -> bool {
        self.0 & (1 << 36) != 0
    }
    /// Command Sets Supported (bit 0: NVM command set).
    pub fn css(self) -> u8 {
        ((self.0 >> 37) & 0xff) as u8
    }
    /// Controller Memory Buffer Supported (NVMe 1.4: CMBLOC / CMBSZ need CMBMSC.CRE).
    pub fn cmbs(self) -> bool {
        self.0 & (1 << 57) != 0
    }
    /// Memory Page Size Minimum (2 ^ (12 + MPSMIN) bytes).
    pub fn mpsmin(self) -> u8 {
        ((self.0 >> 48) & 0xf) as u8
    }
    /// Memory Page Size Maximum (2 ^ (12 + MPSMAX) bytes).
    pub fn mpsmax(self) -> u8 {
        ((self.0 >> 52) & 0xf) as u8
    }
    /// Smallest memory page size in bytes.
    pub fn min_page_size(self) -> usize {
        1usize << (12 + self.mpsmin())
    }
    /// Largest memory page size in bytes.
    pub fn max_page_size(self) -> usize {
        1usize << (12 + self.mpsmax())
    }
}

/// Controller Configuration register builder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Cc(pub u32);

impl Cc {
    /// Enable bit.
    pub const EN: u32 = 1;
    /// Shutdown notification: normal.
    pub const SHN_NORMAL: u32 = 0b01 << 14;
    /// Shutdown notification: abrupt.
    pub const SHN_ABRUPT: u32 = 0b10 << 14;
    /// Mask of the SHN field.
    pub const SHN_MASK: u32 = 0b11 << 14;

    /// CC for an enabled controller with NVM command set, round-robin arbitration,
    /// memory page size `2^(12+mps)`, and entry sizes `2^iosqes`, `2^iocqes`.
    pub fn enabled(mps: u8, iosqes: u8, iocqes: u8) -> Cc {
        // CSS (6:4) = 0: NVM command set; AMS (13:11) = 0: round robin.
        Cc(Self::EN
            | ((mps as u32 & 0xf) << 7)
            | ((iosqes as u32 & 0xf) << 16)
            | ((iocqes as u32 & 0xf) << 20))
    }
    /// Enable bit set.
    pub fn en(self) -> bool {
        self.0 & Self::EN != 0
    }
    /// MPS field.
    pub fn mps(self) -> u8 {
        ((self.0 >> 7) & 0xf) as u8
    }
    /// I/O SQ entry size (log2).
    pub fn iosqes(self) -> u8 {
        ((self.0 >> 16) & 0xf) as u8
    }
    /// I/O CQ entry size (log2).
    pub fn iocqes(self) -> u8 {
        ((self.0 >> 20) & 0xf) as u8
    }
    /// Shutdown notification field.
    pub fn shn(self) -> u8 {
        ((self.0 >> 14) & 0x3) as u8
    }
}

/// Shutdown status reported in CSTS.SHST.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShutdownStatus {
    /// Normal operation.
    Normal,
    /// Shutdown processing in progress.
    Occurring,
    /// Shutdown processing complete.
    Complete,
    /// Reserved encoding.
    Reserved,
}

/// Decoded Controller Status register.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Csts(pub u32);

impl Csts {
    /// Ready.
    pub fn rdy(self) -> bool {
        self.0 & 1 != 0
    }
    /// Controller Fatal Status.
    pub fn cfs(self) -> bool {
        self.0 & 2 != 0
    }
    /// Shutdown status.
    pub fn shst(self) -> ShutdownStatus {
        match (self.0 >> 2) & 3 {
            0 => ShutdownStatus::Normal,
            1 => ShutdownStatus::Occurring,
            2 => ShutdownStatus::Complete,
            _ => ShutdownStatus::Reserved,
        }
    }
    /// NVM Subsystem Reset Occurred.
    pub fn nssro(self) -> bool {
        self.0 & (1 << 4) != 0
    }
    /// All bits set: the device is gone (surprise removal or a dead link).
    pub fn is_all_ones(self) -> bool {
        self.0 == u32::MAX
    }
}

/// Admin Queue Attributes for admin SQ / CQ sizes given in entries (1-based).
pub fn aqa(sq_entries: u16, cq_entries: u16) -> u32 {
    ((cq_entries as u32 - 1) & 0xfff) << 16 | ((sq_entries as u32 - 1) & 0xfff)
}

/// Decoded Version register.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Version(pub u32);

impl Version {
    /// Major version.
    pub fn major(self) -> u16 {
        (self.0 >> 16) as u16
    }
    /// Minor version.
    pub fn minor(self) -> u8 {
        (self.0 >> 8) as u8
    }
    /// Tertiary version.
    pub fn tertiary(self) -> u8 {
        self.0 as u8
    }
    /// True from NVMe `major`.`minor` on.
    pub fn at_least(self, major: u16, minor: u8) -> bool {
        (self.major(), self.minor()) >= (major, minor)
    }
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.major(), self.minor(), self.tertiary())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qemu_cap_decodes() {
        // CAP value read from QEMU 10's emulated controller (docs/TESTBED.md).
        let cap = Cap(0x0040_0820_0f01_07ff);
        assert_eq!(cap.mqes(), 0x7ff);
        assert_eq!(cap.max_queue_entries(), 2048);
        assert!(cap.cqr());
        assert_eq!(cap.to(), 0x0f);
        assert_eq!(cap.timeout(), std::time::Duration::from_millis(7500));
        assert_eq!(cap.dstrd(), 0);
        assert_eq!(cap.css() & 1, 1);
        assert_eq!(cap.mpsmin(), 0);
        assert_eq!(cap.min_page_size(), 4096);
        assert_eq!(cap.mpsmax(), 4);
        assert_eq!(cap.max_page_size(), 64 * 1024);
    }

    #[test]
    fn doorbell_offsets_follow_stride() {
        assert_eq!(sq_tail_doorbell(0, 0), 0x1000);
        assert_eq!(cq_head_doorbell(0, 0), 0x1004);
        assert_eq!(sq_tail_doorbell(3, 0), 0x1018);
        assert_eq!(cq_head_doorbell(3, 0), 0x101c);
        assert_eq!(sq_tail_doorbell(1, 2), 0x1000 + 2 * 16);
        assert_eq!(cq_head_doorbell(1, 2), 0x1000 + 3 * 16);
    }

    #[test]
    fn cc_and_csts_fields() {
        let cc = Cc::enabled(0, 6, 4);
        assert_eq!(cc.0, 0x0046_0001);
        assert!(cc.en());
        assert_eq!((cc.iosqes(), cc.iocqes(), cc.mps()), (6, 4, 0));
        assert_eq!(Cc(cc.0 | Cc::SHN_NORMAL).shn(), 1);
        assert_eq!(Csts(0b1001).shst(), ShutdownStatus::Complete);
        assert!(Csts(0b11).cfs());
        assert!(Csts(u32::MAX).is_all_ones());
        assert_eq!(aqa(32, 32), 0x001f_001f);
        assert_eq!(Version(0x0001_0400).to_string(), "1.4.0");
    }
}
