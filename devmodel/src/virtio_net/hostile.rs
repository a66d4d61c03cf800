//! [`Hostile`]: how a virtio-net model misbehaves (from generated fuzz input, or written by
//! hand), on top of the well-behaved device.

use super::layout::Layout;

/// A change to one used-ring element as the device writes it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UsedTweak {
    /// Report this descriptor id instead.
    pub id: Option<u32>,
    /// Report this length instead.
    pub len: Option<u32>,
    /// Move used->idx forward by this much more than the one element written.
    pub extra_idx: u16,
}

/// A virtio-net device's misbehaviour.
#[derive(Debug, Clone, Default)]
pub struct Hostile {
    /// Offered feature bits instead of the configuration's.
    pub features: Option<u64>,
    /// num_queues (and the queues that exist) instead of 2 x pairs + control.
    pub num_queues: Option<u16>,
    /// Every queue's maximum size.
    pub queue_max: Option<u16>,
    /// Every queue's queue_notify_off.
    pub notify_off: Option<u16>,
    /// Where the structures are (capabilities and routing).
    pub layout: Option<Layout>,
    /// Raw config-space bytes written over the capability list after it is built.
    pub config_pokes: Vec<(u16, u8)>,
    /// BAR 4's length.
    pub bar_len: Option<u64>,
    /// The device-configuration bytes (MAC, status, max_virtqueue_pairs, MTU, ...).
    pub device_cfg: Option<Vec<u8>>,
    /// config_generation changes on every read.
    pub generation_flips: bool,
    /// FEATURES_OK never sticks.
    pub refuse_features_ok: bool,
    /// After the first reset, device_status never reads 0 again.
    pub reset_stuck: bool,
    /// Queue MSI-X vectors read back 0 instead of what was written.
    pub msix_stuck: bool,
    /// From this MMIO read on (1-based count), every read returns all-ones.
    pub all_ones_after: Option<u64>,
    /// After this many doorbells, the device ignores them all (stops answering).
    pub silent_after: Option<u64>,
    /// After this many control commands, the control queue's doorbells are ignored.
    pub ctrl_silent_after: Option<u64>,
    /// Applied in order to the used elements the device writes, one each.
    pub used: Vec<UsedTweak>,
}
