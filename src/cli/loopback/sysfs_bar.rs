//! A PCI BAR mapped through sysfs (`/sys/bus/pci/devices/<bdf>/resource<N>`), for the kernel
//! baseline's copy path: the CPU copies frames between socket buffers and "GPU memory" (the
//! ivshmem BAR in the guest), as the classic device -> kernel -> user -> GPU path does.

use std::os::fd::AsRawFd;

use ubdirect::dma::pci::PciAddress;

use super::LoopbackError;

/// A BAR mmapped from sysfs; unmapped on drop.
pub struct SysfsBar {
    ptr: *mut u8,
    len: usize,
}

impl SysfsBar {
    /// Maps BAR `bar` of `addr` (the device must have memory decoding on; ivshmem has no
    /// kernel driver, so it is free to map while its NICs run the kernel path).
    pub fn open(addr: PciAddress, bar: u8) -> Result<SysfsBar, LoopbackError> {
        let path = format!("/sys/bus/pci/devices/{addr}/resource{bar}");
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| {
                LoopbackError::Setup(format!(
                    "open {path}: {e} (is BAR {bar} a memory BAR? run as root)"
                ))
            })?;
        let len = f
            .metadata()
            .map_err(|e| LoopbackError::Setup(format!("stat {path}: {e}")))?
            .len() as usize;
        if len < 1 << 20 {
            return Err(LoopbackError::Setup(format!(
                "{path} is {len} bytes: too small for the copy path (needs 1 MiB)"
            )));
        }
        // SAFETY: a fresh shared mapping of the BAR file; nothing else in this process maps it.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                f.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(LoopbackError::Setup(format!(
                "mmap {path}: {}",
                std::io::Error::last_os_error()
            )));
        }
        Ok(SysfsBar { ptr: p.cast(), len })
    }

    /// Number of `slot`-byte slots in the BAR.
    pub fn slots(&self, slot: usize) -> usize {
        self.len / slot
    }

    /// Slot `i` (modulo the slot count) of `slot` bytes.
    pub fn slot(&mut self, i: usize, slot: usize) -> &mut [u8] {
        let n = self.slots(slot);
        let off = (i % n) * slot;
        // SAFETY: [off, off + slot) lies inside the mapping (n slots fit); &mut self makes
        // the slice exclusive; the BAR is RAM-like (prefetchable) memory.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(off), slot) }
    }
}

impl Drop for SysfsBar {
    fn drop(&mut self) {
        // SAFETY: we own the mapping and no slice of it outlives &mut self borrows.
        unsafe {
            libc::munmap(self.ptr.cast(), self.len);
        }
    }
}
