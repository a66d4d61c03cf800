//! Memory layout of a split virtqueue: descriptor table, driver (avail) area and device
//! (used) area, placed in one IOVA-contiguous block.

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// One descriptor (`struct virtq_desc`), little-endian on x86 as stored.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout,
)]
#[repr(C)]
pub struct Descriptor {
    /// Buffer IOVA.
    pub addr: u64,
    /// Buffer length in bytes.
    pub len: u32,
    /// `DESC_F_*` flags.
    pub flags: u16,
    /// Next descriptor in the chain when `DESC_F_NEXT` is set.
    pub next: u16,
}

/// One used-ring element (`struct virtq_used_elem`).
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout,
)]
#[repr(C)]
pub struct UsedElem {
    /// Head descriptor id of the completed chain.
    pub id: u32,
    /// Bytes the device wrote into the chain (0 for device-readable buffers).
    pub len: u32,
}

/// Descriptor flag: the chain continues at `next`.
pub const DESC_F_NEXT: u16 = 1;
/// Descriptor flag: the device writes this buffer (RX); otherwise it reads it (TX).
pub const DESC_F_WRITE: u16 = 2;
/// Avail flag: the driver wants no used-buffer notifications (interrupts).
pub const AVAIL_F_NO_INTERRUPT: u16 = 1;
/// Used flag: the device wants no available-buffer notifications (doorbells).
pub const USED_F_NO_NOTIFY: u16 = 1;

/// Largest split queue size the spec allows.
pub const MAX_QUEUE_SIZE: u16 = 32768;

/// Byte offsets of the three areas of a ring of `size` entries inside one block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingLayout {
    /// Number of entries (a power of two).
    pub size: u16,
    /// Offset of the descriptor table (16-byte aligned).
    pub desc: usize,
    /// Offset of the driver area: flags, idx, `ring[size]`, used_event.
    pub avail: usize,
    /// Offset of the device area: flags, idx, `ring[size]`, avail_event (64-byte aligned so the
    /// device's writes do not share a cache line with the driver's).
    pub used: usize,
    /// Total bytes needed.
    pub total: usize,
}

impl RingLayout {
    /// Layout for `size` entries; `None` unless `size` is a power of two in 1..=32768.
    pub fn new(size: u16) -> Option<RingLayout> {
        if size == 0 || !size.is_power_of_two() || size > MAX_QUEUE_SIZE {
            return None;
        }
        let n = size as usize;
        let desc = 0;
        let avail = desc + 16 * n;
        let avail_len = 4 + 2 * n + 2;
        let used = (avail + avail_len).next_multiple_of(64);
        let used_len = 4 + 8 * n + 2;
        let total = used + used_len;
        Some(RingLayout {
            size,
            desc,
            avail,
            used,
            total,
        })
    }

    /// Offset of the avail ring's `idx` field.
    pub fn avail_idx(&self) -> usize {
        self.avail + 2
    }
    /// Offset of avail ring entry `slot`.
    pub fn avail_entry(&self, slot: u16) -> usize {
        self.avail + 4 + 2 * slot as usize
    }
    /// Offset of `used_event` (at the end of the driver area).
    pub fn used_event(&self) -> usize {
        self.avail + 4 + 2 * self.size as usize
    }
    /// Offset of the used ring's `idx` field.
    pub fn used_idx(&self) -> usize {
        self.used + 2
    }
    /// Offset of used ring entry `slot`.
    pub fn used_entry(&self, slot: u16) -> usize {
        self.used + 4 + 8 * slot as usize
    }
    /// Offset of `avail_event` (at the end of the device area).
    pub fn avail_event(&self) -> usize {
        self.used + 4 + 8 * self.size as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_match_spec_structs() {
        assert_eq!(core::mem::size_of::<Descriptor>(), 16);
        assert_eq!(core::mem::size_of::<UsedElem>(), 8);
    }

    #[test]
    fn layout_256() {
        let l = RingLayout::new(256).unwrap();
        assert_eq!(l.desc, 0);
        assert_eq!(l.avail, 4096);
        assert_eq!(l.used_event(), 4096 + 4 + 512);
        assert_eq!(l.used % 64, 0);
        assert!(l.used >= l.used_event() + 2);
        assert_eq!(l.avail_event(), l.used + 4 + 2048);
        assert_eq!(l.total, l.avail_event() + 2);
    }

    #[test]
    fn rejects_bad_sizes() {
        assert!(RingLayout::new(0).is_none());
        assert!(RingLayout::new(3).is_none());
        assert!(RingLayout::new(65535).is_none());
        assert!(RingLayout::new(32768).is_some());
        assert!(RingLayout::new(1).is_some());
    }
}
