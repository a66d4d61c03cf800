//! 82576 register offsets (BAR 0) and the bits this driver uses (82576 datasheet, chapter 8;
//! the same names as Linux's `e1000_regs.h` / `e1000_defines.h`).

/// Device control.
pub const CTRL: usize = 0x0000;
/// Device status (read only).
pub const STATUS: usize = 0x0008;
/// EEPROM/flash control.
pub const EECD: usize = 0x0010;
/// Extended device control.
pub const CTRL_EXT: usize = 0x0018;
/// MDI (PHY) control.
pub const MDIC: usize = 0x0020;
/// Interrupt mask clear.
pub const IMC: usize = 0x00d8;
/// Interrupt mask set (reads the current mask).
pub const IMS: usize = 0x00d0;
/// Receive control.
pub const RCTL: usize = 0x0100;
/// Transmit control.
pub const TCTL: usize = 0x0400;
/// Extended interrupt mask clear.
pub const EIMC: usize = 0x1528;
/// Extended interrupt auto clear.
pub const EIAC: usize = 0x152c;
/// Multiple receive queues command (RSS / VMDq).
pub const MRQC: usize = 0x5818;
/// Receive long packet maximum length (bytes, FCS included; used with RCTL.LPE).
pub const RLPML: usize = 0x5004;
/// Receive address low, entry 0 (the MAC's first four bytes).
pub const RAL0: usize = 0x5400;
/// Receive address high, entry 0 (the MAC's last two bytes, AV in bit 31).
pub const RAH0: usize = 0x5404;

/// RX descriptor base low of queue `n`.
pub const fn rdbal(n: usize) -> usize {
    0xc000 + 0x40 * n
}
/// RX descriptor base high of queue `n`.
pub const fn rdbah(n: usize) -> usize {
    0xc004 + 0x40 * n
}
/// RX descriptor ring length (bytes) of queue `n`.
pub const fn rdlen(n: usize) -> usize {
    0xc008 + 0x40 * n
}
/// Split and replication receive control of queue `n`.
pub const fn srrctl(n: usize) -> usize {
    0xc00c + 0x40 * n
}
/// RX descriptor head of queue `n`.
pub const fn rdh(n: usize) -> usize {
    0xc010 + 0x40 * n
}
/// RX descriptor tail of queue `n`.
pub const fn rdt(n: usize) -> usize {
    0xc018 + 0x40 * n
}
/// RX descriptor control of queue `n`.
pub const fn rxdctl(n: usize) -> usize {
    0xc028 + 0x40 * n
}
/// TX descriptor base low of queue `n`.
pub const fn tdbal(n: usize) -> usize {
    0xe000 + 0x40 * n
}
/// TX descriptor base high of queue `n`.
pub const fn tdbah(n: usize) -> usize {
    0xe004 + 0x40 * n
}
/// TX descriptor ring length (bytes) of queue `n`.
pub const fn tdlen(n: usize) -> usize {
    0xe008 + 0x40 * n
}
/// TX descriptor head of queue `n`.
pub const fn tdh(n: usize) -> usize {
    0xe010 + 0x40 * n
}
/// TX descriptor tail of queue `n`.
pub const fn tdt(n: usize) -> usize {
    0xe018 + 0x40 * n
}
/// TX descriptor control of queue `n`.
pub const fn txdctl(n: usize) -> usize {
    0xe028 + 0x40 * n
}
/// TX descriptor completion write-back address low of queue `n` (0: write back DD instead).
pub const fn tdwbal(n: usize) -> usize {
    0xe038 + 0x40 * n
}

/// Statistics registers (clear on read).
pub mod stat {
    /// Good packets received.
    pub const GPRC: usize = 0x4074;
    /// Good packets transmitted.
    pub const GPTC: usize = 0x4080;
    /// Good octets received, low (read before the high half).
    pub const GORCL: usize = 0x4088;
    /// Good octets received, high (reading it clears both halves).
    pub const GORCH: usize = 0x408c;
    /// Good octets transmitted, low.
    pub const GOTCL: usize = 0x4090;
    /// Good octets transmitted, high.
    pub const GOTCH: usize = 0x4094;
    /// Missed packets (no room in the receive FIFO).
    pub const MPC: usize = 0x4010;
    /// Receive no buffers (no RX descriptor posted).
    pub const RNBC: usize = 0x40a0;
    /// Total packets received.
    pub const TPR: usize = 0x40d0;
    /// Total packets transmitted.
    pub const TPT: usize = 0x40d4;
    /// CRC errors.
    pub const CRCERRS: usize = 0x4000;
}

/// CTRL: full-duplex.
pub const CTRL_FD: u32 = 1 << 0;
/// CTRL: set link up.
pub const CTRL_SLU: u32 = 1 << 6;
/// CTRL: device reset (self-clearing).
pub const CTRL_RST: u32 = 1 << 26;
/// STATUS: link up.
pub const STATUS_LU: u32 = 1 << 1;
/// EECD: EEPROM present.
pub const EECD_PRES: u32 = 1 << 8;
/// EECD: EEPROM auto-read done.
pub const EECD_AUTO_RD: u32 = 1 << 9;
/// CTRL_EXT: driver loaded (tells firmware the host driver owns the device).
pub const CTRL_EXT_DRV_LOAD: u32 = 1 << 28;
/// RAH: address valid.
pub const RAH_AV: u32 = 1 << 31;

/// RCTL: receiver enable.
pub const RCTL_EN: u32 = 1 << 1;
/// RCTL: unicast promiscuous.
pub const RCTL_UPE: u32 = 1 << 3;
/// RCTL: multicast promiscuous.
pub const RCTL_MPE: u32 = 1 << 4;
/// RCTL: long packet enable (frames up to RLPML instead of 1518 bytes with FCS, 1522 tagged).
pub const RCTL_LPE: u32 = 1 << 5;
/// RCTL: accept broadcast.
pub const RCTL_BAM: u32 = 1 << 15;
/// RCTL: strip the Ethernet CRC from received frames.
pub const RCTL_SECRC: u32 = 1 << 26;
/// TCTL: transmitter enable.
pub const TCTL_EN: u32 = 1 << 1;
/// TCTL: pad short packets.
pub const TCTL_PSP: u32 = 1 << 3;
/// TCTL: collision threshold 15 (bits 11:4), collision distance 63 (bits 21:12).
pub const TCTL_CT_COLD: u32 = (0x0f << 4) | (0x3f << 12);

/// SRRCTL: packet buffer size in 1 KiB units (bits 6:0).
pub const SRRCTL_BSIZEPKT_MASK: u32 = 0x7f;
/// SRRCTL: advanced descriptors, one buffer.
pub const SRRCTL_DESCTYPE_ADV_ONEBUF: u32 = 1 << 25;
/// SRRCTL: drop frames when no descriptor is posted (instead of stalling the FIFO).
pub const SRRCTL_DROP_EN: u32 = 1 << 31;
/// RXDCTL / TXDCTL: queue enable.
pub const QUEUE_ENABLE: u32 = 1 << 25;

/// MDIC: data (bits 15:0), PHY register (20:16), PHY address (25:21).
pub const MDIC_REG_SHIFT: u32 = 16;
/// MDIC: PHY address shift.
pub const MDIC_PHY_SHIFT: u32 = 21;
/// MDIC: write operation.
pub const MDIC_OP_WRITE: u32 = 1 << 26;
/// MDIC: operation done.
pub const MDIC_READY: u32 = 1 << 28;
/// MDIC: operation failed.
pub const MDIC_ERROR: u32 = 1 << 30;
/// PHY control register (BMCR): 1000 Mb/s, full duplex, auto-negotiation on, restarted.
pub const PHY_BMCR_AUTONEG_RESTART: u16 = 0x0040 | 0x0100 | 0x1000 | 0x0200;

/// Length of BAR 0 (the register file).
pub const BAR0_LEN: u64 = 128 * 1024;
/// Intel's PCI vendor id.
pub const INTEL_VENDOR: u16 = 0x8086;
/// 82576 device ids of the physical function (copper, fiber, serdes, quad copper, ET2, NS).
pub const PF_DEVICE_IDS: [u16; 8] = [
    0x10c9, 0x10e6, 0x10e7, 0x10e8, 0x1526, 0x150a, 0x1518, 0x150d,
];
/// 82576 virtual function device id.
pub const VF_DEVICE_ID: u16 = 0x10ca;

/// Where one function's queue registers sit: the PF's RX block at 0xc000 and TX block at
/// 0xe000 with queues 0x40 apart, a VF's at 0x2800 and 0x3800 with queues 0x100 apart. Within a
/// queue's block both use the same offsets (base low/high, length, SRRCTL, head, tail, control).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueRegs {
    rx: usize,
    tx: usize,
    stride: usize,
}

impl QueueRegs {
    /// The physical function's queue registers.
    pub const PF: QueueRegs = QueueRegs {
        rx: 0xc000,
        tx: 0xe000,
        stride: 0x40,
    };
    /// A virtual function's queue registers (in its own BAR 0).
    pub const VF: QueueRegs = QueueRegs {
        rx: 0x2800,
        tx: 0x3800,
        stride: 0x100,
    };

    /// RX descriptor base low of queue `n`.
    pub const fn rdbal(&self, n: usize) -> usize {
        self.rx + self.stride * n
    }
    /// RX descriptor base high of queue `n`.
    pub const fn rdbah(&self, n: usize) -> usize {
        self.rdbal(n) + 0x04
    }
    /// RX descriptor ring length of queue `n`.
    pub const fn rdlen(&self, n: usize) -> usize {
        self.rdbal(n) + 0x08
    }
    /// Split and replication receive control of queue `n`.
    pub const fn srrctl(&self, n: usize) -> usize {
        self.rdbal(n) + 0x0c
    }
    /// RX descriptor head of queue `n`.
    pub const fn rdh(&self, n: usize) -> usize {
        self.rdbal(n) + 0x10
    }
    /// RX descriptor tail of queue `n`.
    pub const fn rdt(&self, n: usize) -> usize {
        self.rdbal(n) + 0x18
    }
    /// RX descriptor control of queue `n`.
    pub const fn rxdctl(&self, n: usize) -> usize {
        self.rdbal(n) + 0x28
    }
    /// TX descriptor base low of queue `n`.
    pub const fn tdbal(&self, n: usize) -> usize {
        self.tx + self.stride * n
    }
    /// TX descriptor base high of queue `n`.
    pub const fn tdbah(&self, n: usize) -> usize {
        self.tdbal(n) + 0x04
    }
    /// TX descriptor ring length of queue `n`.
    pub const fn tdlen(&self, n: usize) -> usize {
        self.tdbal(n) + 0x08
    }
    /// TX descriptor head of queue `n`.
    pub const fn tdh(&self, n: usize) -> usize {
        self.tdbal(n) + 0x10
    }
    /// TX descriptor tail of queue `n`.
    pub const fn tdt(&self, n: usize) -> usize {
        self.tdbal(n) + 0x18
    }
    /// TX descriptor control of queue `n`.
    pub const fn txdctl(&self, n: usize) -> usize {
        self.tdbal(n) + 0x28
    }
    /// TX descriptor completion write-back address low of queue `n`.
    pub const fn tdwbal(&self, n: usize) -> usize {
        self.tdbal(n) + 0x38
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pf_layout_matches_the_register_table() {
        let p = QueueRegs::PF;
        for n in [0, 1, 5] {
            assert_eq!(
                [
                    p.rdbal(n),
                    p.rdbah(n),
                    p.rdlen(n),
                    p.srrctl(n),
                    p.rdh(n),
                    p.rdt(n)
                ],
                [rdbal(n), rdbah(n), rdlen(n), srrctl(n), rdh(n), rdt(n)]
            );
            assert_eq!(
                [
                    p.rxdctl(n),
                    p.tdbal(n),
                    p.tdbah(n),
                    p.tdlen(n),
                    p.tdh(n),
                    p.tdt(n)
                ],
                [rxdctl(n), tdbal(n), tdbah(n), tdlen(n), tdh(n), tdt(n)]
            );
            assert_eq!([p.txdctl(n), p.tdwbal(n)], [txdctl(n), tdwbal(n)]);
        }
    }

    #[test]
    fn the_vf_layout_is_linux_igbvf_s() {
        let v = QueueRegs::VF;
        assert_eq!(
            [v.rdbal(0), v.srrctl(0), v.rdt(0), v.rxdctl(0)],
            [0x2800, 0x280c, 0x2818, 0x2828]
        );
        assert_eq!(
            [v.tdbal(1), v.tdh(1), v.tdt(1), v.txdctl(1)],
            [0x3900, 0x3910, 0x3918, 0x3928]
        );
        assert_eq!(v.tdwbal(0), 0x3838);
    }
}
