//! [`ConfigSpace`]: a PCI configuration space for models: ids and class code, a writable
//! command register, and whatever else a model writes in by hand (capabilities).

use std::sync::Mutex;

/// Offset of the command register.
pub const COMMAND: u16 = 0x04;

/// 4 KiB of config space. Reads see the bytes; writes change only the command register (and
/// any range opened with [`ConfigSpace::set_writable`]).
#[derive(Debug)]
pub struct ConfigSpace {
    bytes: Mutex<Vec<u8>>,
    writable: Mutex<Vec<std::ops::Range<u16>>>,
}

impl ConfigSpace {
    /// A type-0 header with `vendor`, `device` and 24-bit `class` (class, subclass, prog-if).
    pub fn new(vendor: u16, device: u16, class: u32) -> ConfigSpace {
        let mut b = vec![0u8; 4096];
        b[0..2].copy_from_slice(&vendor.to_le_bytes());
        b[2..4].copy_from_slice(&device.to_le_bytes());
        b[8..12].copy_from_slice(&(class << 8).to_le_bytes());
        ConfigSpace {
            bytes: Mutex::new(b),
            writable: Mutex::new(std::iter::once(COMMAND..COMMAND + 2).collect()),
        }
    }

    /// Overwrite bytes at `off` (a capability list, BAR values, ...).
    pub fn set_bytes(&self, off: u16, data: &[u8]) {
        let mut b = self.bytes.lock().unwrap_or_else(|p| p.into_inner());
        let o = off as usize;
        let end = (o + data.len()).min(b.len());
        b[o..end].copy_from_slice(&data[..end - o]);
    }

    /// Let the driver write `range`.
    pub fn set_writable(&self, range: std::ops::Range<u16>) {
        self.writable
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(range);
    }

    /// Read `buf.len()` bytes at `off` (past the end reads all-ones).
    pub fn read(&self, off: u16, buf: &mut [u8]) {
        let b = self.bytes.lock().unwrap_or_else(|p| p.into_inner());
        for (i, v) in buf.iter_mut().enumerate() {
            *v = b.get(off as usize + i).copied().unwrap_or(0xff);
        }
    }

    /// Write `data` at `off`; bytes outside writable ranges are ignored.
    pub fn write(&self, off: u16, data: &[u8]) {
        let w = self.writable.lock().unwrap_or_else(|p| p.into_inner());
        let mut b = self.bytes.lock().unwrap_or_else(|p| p.into_inner());
        for (i, v) in data.iter().enumerate() {
            let a = off as usize + i;
            if a < b.len() && w.iter().any(|r| r.contains(&(a as u16))) {
                b[a] = *v;
            }
        }
    }

    /// The command register.
    pub fn command(&self) -> u16 {
        let mut c = [0u8; 2];
        self.read(COMMAND, &mut c);
        u16::from_le_bytes(c)
    }

    /// Bus mastering enabled (command bit 2): a device may DMA only then.
    pub fn bus_master(&self) -> bool {
        self.command() & (1 << 2) != 0
    }
}
