//! [`IgbHostile`]: how an 82576 model misbehaves (from generated fuzz input, or written by hand),
//! on top of the well-behaved device.

/// A change to one RX descriptor as the device writes it back.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RxTweak {
    /// Report this length instead.
    pub len: Option<u16>,
    /// Report this status/error word instead (DD is bit 0, EOP bit 1).
    pub status: Option<u32>,
}

/// An 82576's misbehaviour.
#[derive(Debug, Clone, Default)]
pub struct IgbHostile {
    /// From this MMIO read on (1-based count), every read returns all-ones.
    pub all_ones_after: Option<u64>,
    /// CTRL.RST never clears.
    pub reset_stuck: bool,
    /// RDH and TDH read this value instead of the real head.
    pub head: Option<u32>,
    /// Mask applied to RDLEN/TDLEN writes instead of the datasheet's bits 19:7.
    pub ring_len_mask: Option<u32>,
    /// RXDCTL/TXDCTL never show the queue enabled.
    pub queue_enable_stuck: bool,
    /// MDIC answers every PHY access with ERROR.
    pub mdic_error: bool,
    /// RAL0/RAH0 read these values instead of the MAC's.
    pub mac_regs: Option<(u32, u32)>,
    /// BAR 0's length instead of 128 KiB.
    pub bar_len: Option<u64>,
    /// Frames longer than the receiver accepts (1514 bytes, or RLPML - 4 with RCTL.LPE) are
    /// delivered anyway, spread over as many descriptors as they need.
    pub oversized_rx: bool,
    /// TX descriptors are never written back (no DD).
    pub tx_never_done: bool,
    /// After this many tail writes the device ignores them all (stops answering).
    pub silent_after: Option<u64>,
    /// Applied in order to the RX descriptors the device writes back, one each.
    pub rx: Vec<RxTweak>,
}
