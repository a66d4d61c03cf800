//! [`Mmio`]: the only place volatile device-register access lives.

use std::ptr::NonNull;
use std::sync::Arc;

use crate::error::{CoreError, Result};
use crate::pci::DeviceModel;

/// A mapped MMIO window (a BAR mmapped through VFIO, anonymous memory standing in for one in
/// tests, or a BAR of a [`DeviceModel`]). Accessors are volatile. An access outside the window
/// or not aligned to its size panics (a programming error): offsets that come from the device
/// (a doorbell stride, a capability offset) must pass [`Mmio::check_access`] first, which
/// answers [`CoreError::MmioOutOfRange`] instead. Unmapped on drop when owned.
pub struct Mmio {
    ptr: NonNull<u8>,
    len: usize,
    owned: bool,
    /// Set for a window onto a device model: every access goes to the model (one
    /// well-predicted branch on the real path).
    model: Option<ModelWindow>,
    /// For a BAR mapped outside a driver: keeps the device from being claimed while it lives.
    _lease: Option<crate::pci::BarLease>,
}

/// Where a model-backed window's accesses go.
struct ModelWindow {
    dev: Arc<dyn DeviceModel>,
    bar: u8,
    /// Offset of the window in the BAR.
    base: u64,
}

impl std::fmt::Debug for Mmio {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("Mmio");
        match &self.model {
            None => d.field("ptr", &self.ptr),
            Some(m) => d.field("model_bar", &m.bar).field("base", &m.base),
        };
        d.field("len", &self.len).finish()
    }
}

// SAFETY: Mmio only performs volatile accesses through its pointer (or calls a Send + Sync
// model); device registers are designed for access from any CPU, and the mapping lives as long
// as the Mmio.
unsafe impl Send for Mmio {}
// SAFETY: as above; concurrent volatile accesses to device registers are the driver's protocol
// concern, not a memory-safety one.
unsafe impl Sync for Mmio {}

/// The address a model-backed window pretends to start at: never dereferenced (every access of
/// a model window goes to the model), only used for the alignment check, so BAR offsets keep
/// their alignment.
const MODEL_FAKE_BASE: usize = 1 << 12;

macro_rules! accessors {
    ($($read:ident $write:ident $t:ty;)*) => {$(
        #[doc = concat!("Volatile ", stringify!($t), " read at byte offset `off` (panics when `off` is outside the window or unaligned).")]
        #[inline(always)]
        pub fn $read(&self, off: usize) -> $t {
            const SIZE: usize = std::mem::size_of::<$t>();
            self.check(off, SIZE);
            if let Some(m) = &self.model {
                return model_read(m, off, SIZE) as $t;
            }
            // SAFETY: bounds and alignment checked above; the mapping is live and the offset
            // is in it.
            unsafe { std::ptr::read_volatile(self.ptr.as_ptr().add(off).cast::<$t>()) }
        }

        #[doc = concat!("Volatile ", stringify!($t), " write at byte offset `off` (panics when `off` is outside the window or unaligned).")]
        #[inline(always)]
        pub fn $write(&self, off: usize, v: $t) {
            const SIZE: usize = std::mem::size_of::<$t>();
            self.check(off, SIZE);
            if let Some(m) = &self.model {
                return model_write(m, off, SIZE, v as u64);
            }
            // SAFETY: bounds and alignment checked above; the mapping is live and the offset
            // is in it.
            unsafe { std::ptr::write_volatile(self.ptr.as_ptr().add(off).cast::<$t>(), v) }
        }
    )*};
}

#[cold]
#[inline(never)]
fn model_read(m: &ModelWindow, off: usize, size: usize) -> u64 {
    m.dev.mmio_read(m.bar, m.base + off as u64, size as u8)
}

#[cold]
#[inline(never)]
fn model_write(m: &ModelWindow, off: usize, size: usize, v: u64) {
    m.dev.mmio_write(m.bar, m.base + off as u64, size as u8, v)
}

#[cold]
#[inline(never)]
fn bad_access(off: usize, size: usize, len: usize) -> ! {
    panic!("MMIO access of {size} bytes at {off:#x} outside a {len:#x}-byte window or unaligned (offsets from the device must pass Mmio::check_access first)")
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
            model: None,
            _lease: None,
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
            model: None,
            _lease: None,
        }
    }

    /// A window of `len` bytes onto BAR `bar` of a device model: every access calls
    /// [`DeviceModel::mmio_read`] / [`DeviceModel::mmio_write`]. What
    /// [`crate::pci::DeviceAccess::map_bar`] returns for a device made with
    /// [`crate::PciDevice::from_model`].
    pub fn from_model(dev: Arc<dyn DeviceModel>, bar: u8, len: usize) -> Mmio {
        Mmio {
            // Never dereferenced: see MODEL_FAKE_BASE.
            ptr: NonNull::new(std::ptr::without_provenance_mut(MODEL_FAKE_BASE)).expect("non-zero"),
            len,
            owned: false,
            model: Some(ModelWindow { dev, bar, base: 0 }),
            _lease: None,
        }
    }

    /// This window, counted as a BAR mapping made outside a driver for as long as it lives.
    pub(crate) fn with_lease(mut self, lease: crate::pci::BarLease) -> Mmio {
        self._lease = Some(lease);
        self
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

    /// The `len` bytes at `off` of this window as a window of their own (a virtio capability's
    /// structure inside a BAR), checked: `[off, off+len)` must lie inside this window and be
    /// non-empty, else [`CoreError::MmioOutOfRange`]. Accesses through the sub-window are
    /// checked against its own length and aligned to their size in the BAR.
    ///
    /// # Safety
    /// For a real mapping the sub-window borrows it: `self` must outlive the returned Mmio
    /// (keep both in one struct, or the parent behind an `Arc` the child's owner holds).
    pub unsafe fn sub_window(&self, off: usize, len: usize) -> Result<Mmio> {
        let end = off.checked_add(len).filter(|&e| e <= self.len && len > 0);
        if end.is_none() {
            return Err(CoreError::MmioOutOfRange {
                offset: off,
                size: len,
                window: self.len,
                reason: "outside",
            });
        }
        Ok(Mmio {
            ptr: NonNull::new(self.ptr.as_ptr().wrapping_add(off)).expect("inside a mapping"),
            len,
            owned: false,
            model: self.model.as_ref().map(|m| ModelWindow {
                dev: m.dev.clone(),
                bar: m.bar,
                base: m.base + off as u64,
            }),
            _lease: None,
        })
    }

    /// Length of the window in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a zero-length window (never for a mapped BAR).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// True for a window onto a [`DeviceModel`] (no memory behind [`Mmio::as_ptr`]).
    pub fn is_model(&self) -> bool {
        self.model.is_some()
    }

    /// The start of the window. For a model-backed window ([`Mmio::is_model`]) an address
    /// with no memory behind it, never to be dereferenced.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Whether an access of `size` bytes at `off` is inside the window and aligned to `size`
    /// (a power of two): the fallible check for offsets derived from device input, before
    /// they reach an accessor (which panics on them).
    pub fn check_access(&self, off: usize, size: usize) -> Result<()> {
        let err = |reason| {
            Err(CoreError::MmioOutOfRange {
                offset: off,
                size,
                window: self.len,
                reason,
            })
        };
        if off.checked_add(size).is_none_or(|end| end > self.len) {
            return err("outside");
        }
        if size == 0 || !size.is_power_of_two() || (self.addr() + off) % size != 0 {
            return err("unaligned");
        }
        Ok(())
    }

    /// The address used for the alignment check.
    #[inline(always)]
    fn addr(&self) -> usize {
        self.ptr.as_ptr() as usize
    }

    #[inline(always)]
    fn check(&self, off: usize, size: usize) {
        let inside = off.checked_add(size).is_some_and(|end| end <= self.len);
        let aligned = self.addr().wrapping_add(off) & (size - 1) == 0;
        if !(inside && aligned) {
            bad_access(off, size, self.len);
        }
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
        m.read32(4096);
    }

    /// An unaligned offset would be a misaligned volatile access (undefined behaviour): it is
    /// refused before any access.
    #[test]
    #[should_panic(expected = "unaligned")]
    fn unaligned_access_panics_instead_of_ub() {
        let m = Mmio::anonymous(4096).unwrap();
        m.read32(2);
    }

    #[test]
    fn check_access_refuses_outside_and_unaligned() {
        let m = Mmio::anonymous(0x2000).unwrap();
        assert!(m.check_access(0x1ffc, 4).is_ok());
        assert!(m.check_access(0x1ff8, 8).is_ok());
        for (off, size, why) in [
            (0x2000, 4, "outside"),
            (0x1ffe, 4, "outside"),
            (usize::MAX - 1, 4, "outside"),
            (0x1002, 4, "unaligned"),
            (0x1004, 8, "unaligned"),
            (0x1000, 3, "unaligned"),
        ] {
            match m.check_access(off, size) {
                Err(CoreError::MmioOutOfRange { reason, window, .. }) => {
                    assert_eq!((reason, window), (why, 0x2000), "{off:#x}+{size}")
                }
                other => panic!("{off:#x}+{size}: {other:?}"),
            }
        }
    }

    #[test]
    fn sub_window_is_bounded_and_aligned_in_the_parent() {
        let m = Mmio::anonymous(0x1000).unwrap();
        m.write32(0x104, 0xabcd);
        // SAFETY: `m` outlives `w`.
        let w = unsafe { m.sub_window(0x100, 0x10) }.unwrap();
        assert_eq!(w.read32(4), 0xabcd);
        assert!(w.check_access(0x10, 1).is_err());
        // SAFETY: as above.
        let odd = unsafe { m.sub_window(0x102, 8) }.unwrap();
        assert!(matches!(
            odd.check_access(0, 4),
            Err(CoreError::MmioOutOfRange {
                reason: "unaligned",
                ..
            })
        ));
        assert!(odd.check_access(2, 4).is_ok());
        // SAFETY: as above.
        assert!(unsafe { m.sub_window(0xff0, 0x20) }.is_err());
        // SAFETY: as above.
        assert!(unsafe { m.sub_window(0x10, 0) }.is_err());
    }

    #[test]
    fn zero_len_is_refused() {
        assert!(matches!(
            Mmio::anonymous(0),
            Err(CoreError::InvalidArgument(_))
        ));
    }
}
