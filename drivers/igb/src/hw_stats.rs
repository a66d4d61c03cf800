//! [`HwStats`]: the device's own statistics registers, which clear on read, accumulated.

use ubdirect_core::Mmio;

use crate::regs::stat;

/// Counters kept by the 82576 itself, summed since bring-up (the registers clear on read; the
/// driver adds each read to these).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HwStats {
    /// Good packets received (GPRC).
    pub good_rx_packets: u64,
    /// Good packets transmitted (GPTC).
    pub good_tx_packets: u64,
    /// Good octets received, FCS included (GORC).
    pub good_rx_octets: u64,
    /// Good octets transmitted, FCS included (GOTC).
    pub good_tx_octets: u64,
    /// Total packets received (TPR).
    pub total_rx_packets: u64,
    /// Total packets transmitted (TPT).
    pub total_tx_packets: u64,
    /// Packets missed for want of FIFO room (MPC).
    pub missed: u64,
    /// Packets that found no RX descriptor posted (RNBC).
    pub no_buffers: u64,
    /// Frames received with a bad CRC (CRCERRS).
    pub crc_errors: u64,
}

impl HwStats {
    /// Reads every counter once and adds it in. 64-bit octet counters are read low half first
    /// (reading the high half clears both).
    pub(crate) fn accumulate(&mut self, r: &Mmio) {
        let rd = |off| u64::from(r.read32(off));
        let rd64 = |lo, hi| {
            let l = rd(lo);
            l | (rd(hi) << 32)
        };
        self.good_rx_packets += rd(stat::GPRC);
        self.good_tx_packets += rd(stat::GPTC);
        self.good_rx_octets += rd64(stat::GORCL, stat::GORCH);
        self.good_tx_octets += rd64(stat::GOTCL, stat::GOTCH);
        self.total_rx_packets += rd(stat::TPR);
        self.total_tx_packets += rd(stat::TPT);
        self.missed += rd(stat::MPC);
        self.no_buffers += rd(stat::RNBC);
        self.crc_errors += rd(stat::CRCERRS);
    }
}
