//! Where the virtio-pci structures live: the vendor capabilities the model writes into its
//! config space, and the BAR windows they describe.

use crate::config::ConfigSpace;

/// The BAR holding every structure.
pub const BAR: u8 = 4;
/// Its length.
pub const BAR_LEN: u64 = 0x4000;

/// One structure: BAR, offset in it, length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CapSpec {
    /// BAR index.
    pub bar: u8,
    /// Offset in the BAR.
    pub offset: u32,
    /// Length in bytes.
    pub length: u32,
}

impl CapSpec {
    /// The offset of BAR offset `off` inside this structure, if it is inside.
    pub fn inside(&self, off: u64) -> Option<u64> {
        let start = u64::from(self.offset);
        (self.bar == BAR && off >= start && off < start + u64::from(self.length))
            .then(|| off - start)
    }
}

/// The four structures and the doorbell stride.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// Common configuration.
    pub common: CapSpec,
    /// Notification area.
    pub notify: CapSpec,
    /// ISR status.
    pub isr: CapSpec,
    /// Device configuration.
    pub device: CapSpec,
    /// Whether the device-configuration capability is present at all.
    pub device_present: bool,
    /// notify_off_multiplier.
    pub notify_mult: u32,
}

impl Default for Layout {
    fn default() -> Self {
        let c = |offset, length| CapSpec {
            bar: BAR,
            offset,
            length,
        };
        Layout {
            common: c(0, 0x40),
            isr: c(0x1000, 4),
            device: c(0x2000, 0x20),
            device_present: true,
            notify: c(0x3000, 0x1000),
            notify_mult: 4,
        }
    }
}

/// Config-space offsets of the capabilities (common, ISR, device, notify).
pub const CAP_OFFSETS: [u16; 4] = [0x40, 0x50, 0x60, 0x70];

impl Layout {
    /// Writes the capability list (status bit, pointer, four vendor capabilities).
    pub fn write_caps(&self, cs: &ConfigSpace) {
        cs.set_bytes(0x06, &[0x10, 0]);
        cs.set_bytes(0x34, &[CAP_OFFSETS[0] as u8]);
        let mut caps = vec![
            (CAP_OFFSETS[0], 1u8, self.common),
            (CAP_OFFSETS[1], 3, self.isr),
        ];
        if self.device_present {
            caps.push((CAP_OFFSETS[2], 4, self.device));
        }
        caps.push((CAP_OFFSETS[3], 2, self.notify));
        for (i, &(at, kind, spec)) in caps.iter().enumerate() {
            let next = caps.get(i + 1).map(|c| c.0 as u8).unwrap_or(0);
            let cap_len = if kind == 2 { 20 } else { 16 };
            let mut b = vec![0x09, next, cap_len, kind, spec.bar, 0, 0, 0];
            b.extend_from_slice(&spec.offset.to_le_bytes());
            b.extend_from_slice(&spec.length.to_le_bytes());
            if kind == 2 {
                b.extend_from_slice(&self.notify_mult.to_le_bytes());
            }
            cs.set_bytes(at, &b);
        }
    }
}
