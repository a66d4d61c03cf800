//! [`Mmio`]: the only place volatile device-register access lives.

use std::ptr::NonNull;

use crate::error::{CoreError, Result};

/// A mapped MMIO window (a BAR mmapped through VFIO, or anonymous memory standing in for one in
/// tests). Accessors are volatile; offsets past the end panic (a programming error, never
/// device input). Unmapped on drop when owned.
#[derive(Debug)]
pub struct Mmio {
    ptr: NonNull<u8>,
    len: usize,
    owned: bool,
}

// SAFETY: Mmio only performs volatile accesses through its pointer; device registers are
// designed for access from any CPU, and the mapping lives as long as the Mmio.
unsafe impl Send for Mmio {}
// SAFETY: as above; concurrent volatile accesses to device registers are the driver's protocol
// concern, not a memory-safety one.
unsafe impl Sync for Mmio {}

macro_rules! accessors {
    ($($read:ident $write:ident $t:ty;)*) => {$(
        #[doc = concat!("Volatile ", stringify!($t), " read at byte offset `off`.")]
        #[inline(always)]
        pub fn $read(&self, off: usize) -> $t {
            self.check(off, std::mem::size_of::<$t>());
            // SAFETY: bounds checked above; the mapping is live and the offset is in it.
            unsafe { std::ptr::read_volatile(self.ptr.as_ptr().add(off).cast::<$t>()) }
        }

        #[doc = concat!("Volatile ", stringify!($t), " write at byte offset `off`.")]
        #[inline(always)]
        pub fn $write(&self, off: usize, v: $t) {
            self.check(off, std::mem::size_of::<$t>());
            // SAFETY: bounds checked above; the mapping is live and the offset is in it.
            unsafe { std::ptr::write_volatile(self.ptr.as_ptr().add(off).cast::<$t>(), v) }
        }
    )*};
}

impl Mmio {
    /// Take ownership of an mmapped window of `len` bytes; it is munmapped on drop.
    ///
    /// # Safety
    /// `ptr` must come from a successful `mmap` of exactly `len` bytes that nothing else
    /// unmaps.
    pub unsafe fn from_mmap(ptr: NonNull<u8>, len: usize) -> Mmio {
        Mmio {
            ptr,
            len,
            owned: true,
        }
    }

    /// Borrow a window that someone else keeps mapped (not unmapped on drop).
    ///
    /// # Safety
    /// `[ptr, ptr+len)` must stay mapped and valid for volatile access while the Mmio lives.
    pub unsafe fn from_raw(ptr: NonNull<u8>, len: usize) -> Mmio {
        Mmio {
            ptr,
            len,
            owned: false,
        }
    }

    /// Zeroed anonymous memory behaving as an MMIO window: for driver unit tests and
    /// simulated devices.
    pub fn anonymous(len: usize) -> Result<Mmio> {
        if len == 0 {
            return Err(CoreError::InvalidArgument(
                "Mmio::anonymous of 0 bytes".into(),
            ));
        }
        // SAFETY: a fresh private anonymous mapping affects no existing memory.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(CoreError::last_os(format!("mmap of {len} anonymous bytes")));
        }
        // SAFETY: mmap succeeded with exactly len bytes; the Mmio owns it.
        Ok(unsafe { Mmio::from_mmap(NonNull::new_unchecked(p.cast()), len) })
    }

    /// Length of the window in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a zero-length window (never for a mapped BAR).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The start of the window.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    #[inline(always)]
    fn check(&self, off: usize, size: usize) {
        assert!(
            off.checked_add(size).is_some_and(|end| end <= self.len),
            "MMIO access of {size} bytes at {off:#x} outside a {:#x}-byte window",
            self.len
        );
    }

    accessors! {
        read8 write8 u8;
        read16 write16 u16;
        read32 write32 u32;
        read64 write64 u64;
    }

    /// A 32-bit read that turns all-ones (what a removed or reset device returns) into
    /// [`CoreError::DeviceGone`].
    #[inline]
    pub fn read32_checked(&self, off: usize) -> Result<u32> {
        match self.read32(off) {
            u32::MAX => Err(CoreError::DeviceGone { offset: off }),
            v => Ok(v),
        }
    }
}

impl Drop for Mmio {
    fn drop(&mut self) {
        if self.owned {
            // SAFETY: we own the mapping (from_mmap contract) and nothing refers to it any more.
            unsafe {
                libc::munmap(self.ptr.as_ptr().cast(), self.len);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_what_was_written_at_every_width() {
        let m = Mmio::anonymous(4096).unwrap();
        m.write64(8, 0x1122_3344_5566_7788);
        assert_eq!(m.read64(8), 0x1122_3344_5566_7788);
        assert_eq!(m.read32(8), 0x5566_7788);
        assert_eq!(m.read16(12), 0x3344);
        assert_eq!(m.read8(15), 0x11);
        m.write8(0, 0xab);
        m.write16(2, 0xbeef);
        m.write32(4, 0xdead_0000);
        assert_eq!(m.read64(0), 0xdead_0000_beef_00ab);
    }

    #[test]
    fn all_ones_is_device_gone() {
        let m = Mmio::anonymous(4096).unwrap();
        m.write32(0x1c, u32::MAX);
        assert!(matches!(
            m.read32_checked(0x1c),
            Err(CoreError::DeviceGone { offset: 0x1c })
        ));
        m.write32(0x1c, 7);
        assert_eq!(m.read32_checked(0x1c).unwrap(), 7);
    }

    #[test]
    #[should_panic(expected = "outside")]
    fn out_of_bounds_panics() {
        let m = Mmio::anonymous(4096).unwrap();
        m.read32(4094);
    }

    #[test]
    fn zero_len_is_refused() {
        assert!(matches!(
            Mmio::anonymous(0),
            Err(CoreError::InvalidArgument(_))
        ));
    }
}
