//! One driver per device: [`DeviceClaim`] and [`DeviceAccess`].
//!
//! Config-space writes, BAR mappings, bus mastering and reset program a device: whoever holds
//! them can point its DMA anywhere in the domain. A driver claims the device when it opens it
//! ([`PciDevice::claim`]) and reaches these operations only through its claim; while the claim
//! lives, [`PciDevice::access`] refuses them to everyone else, and so does every operation of an
//! access taken before the claim. A second driver on the same device is refused the same way.
//! The claim is released when it is dropped.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use super::device::PciDevice;
use crate::error::{CoreError, Result};
use crate::mmio::Mmio;

/// The exclusive right of one driver to program one device, released on drop. Made by
/// [`PciDevice::claim`]; the driver keeps it for as long as it drives the device.
#[derive(Debug)]
pub struct DeviceClaim {
    device: Arc<PciDevice>,
}

impl DeviceClaim {
    pub(super) fn new(device: Arc<PciDevice>) -> DeviceClaim {
        DeviceClaim { device }
    }

    /// The claimed device (its read-only queries: ids, BAR sizes, config reads).
    pub fn device(&self) -> &Arc<PciDevice> {
        &self.device
    }

    /// The operations that program the device, for the driver holding the claim.
    pub fn access(&self) -> DeviceAccess<'_> {
        DeviceAccess::new(&self.device, false)
    }
}

impl Drop for DeviceClaim {
    fn drop(&mut self) {
        self.device.release_claim();
    }
}

/// Config-space writes, BAR mappings, bus mastering and reset of one device. From the
/// driver's [`DeviceClaim::access`], or from [`PciDevice::access`] for a device no driver
/// holds (a BAR used as peer memory, a tool). An access of the second kind re-checks the
/// claim on every operation: once a driver claims the device, each one fails with
/// [`CoreError::DeviceClaimed`] and changes nothing, however long ago the access was taken.
/// The driver's own access checks nothing.
#[derive(Debug, Clone, Copy)]
pub struct DeviceAccess<'a> {
    dev: &'a PciDevice,
    /// BARs mapped through this access keep the device from being claimed while they live.
    loose: bool,
}

impl<'a> DeviceAccess<'a> {
    pub(super) fn new(dev: &'a PciDevice, loose: bool) -> DeviceAccess<'a> {
        DeviceAccess { dev, loose }
    }

    /// The device.
    pub fn device(&self) -> &'a PciDevice {
        self.dev
    }

    /// Run `op` on the device: at once for the driver's access; for an access taken outside a
    /// driver, only while no driver holds the device (the claim stays locked meanwhile, so no
    /// driver can claim it half-way through).
    #[inline]
    fn unheld<T>(&self, op: impl FnOnce() -> Result<T>) -> Result<T> {
        if self.loose {
            self.dev.while_unclaimed(op)
        } else {
            op()
        }
    }

    /// Write a config-space byte (checked).
    pub fn config_write_u8(&self, off: u16, v: u8) -> Result<()> {
        self.unheld(|| self.dev.config_write(off, &mut [v]))
    }

    /// Write a little-endian config-space u16 (checked).
    pub fn config_write_u16(&self, off: u16, v: u16) -> Result<()> {
        self.unheld(|| self.dev.config_write(off, &mut v.to_le_bytes()))
    }

    /// Write a little-endian config-space u32 (checked).
    pub fn config_write_u32(&self, off: u16, v: u32) -> Result<()> {
        self.unheld(|| self.dev.config_write(off, &mut v.to_le_bytes()))
    }

    /// mmap the whole BAR through VFIO (a model-backed window for a device model). A mapping
    /// made through [`PciDevice::access`] keeps the device from being claimed until it is
    /// dropped.
    pub fn map_bar(&self, bar: u8) -> Result<Mmio> {
        self.unheld(|| {
            let m = self.dev.map_bar_raw(bar)?;
            Ok(if self.loose {
                m.with_lease(BarLease::new(self.dev.loose_maps()))
            } else {
                m
            })
        })
    }

    /// Set memory-space decoding and bus mastering in the command register (needed before the
    /// device may DMA).
    pub fn enable_bus_master(&self) -> Result<()> {
        self.unheld(|| self.dev.enable_bus_master_raw())
    }

    /// Reset the function (VFIO_DEVICE_RESET: FLR or another method the kernel picks). Fails
    /// with [`CoreError::Unsupported`] when VFIO reports no reset method.
    pub fn reset(&self) -> Result<()> {
        self.unheld(|| self.dev.reset_raw())
    }

    /// Export BAR `bar` as a dma-buf (vfio-pci's `VFIO_DEVICE_FEATURE_DMA_BUF`), for an iommufd
    /// domain to map by file. The dma-buf is revoked when the device is reset or its memory
    /// decoding turns off.
    pub fn export_bar_dmabuf(&self, bar: u8) -> Result<std::os::fd::OwnedFd> {
        self.unheld(|| self.dev.export_bar_dmabuf_raw(bar))
    }
}

/// Counts a BAR mapping made outside a driver for as long as the mapping lives.
#[derive(Debug)]
pub(crate) struct BarLease(Arc<AtomicUsize>);

impl BarLease {
    fn new(count: &Arc<AtomicUsize>) -> BarLease {
        count.fetch_add(1, Ordering::AcqRel);
        BarLease(count.clone())
    }
}

impl Drop for BarLease {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The BAR ranges of one device registered as UB regions: (BAR, byte range).
pub(super) type BarRanges = Arc<std::sync::Mutex<Vec<(u8, std::ops::Range<u64>)>>>;

/// Who holds a device: the claim's state inside [`PciDevice`].
#[derive(Debug, Default)]
pub(super) struct ClaimState {
    /// The driver holding the device, if any.
    pub(super) driver: std::sync::Mutex<Option<&'static str>>,
    /// BAR mappings alive that were made outside a driver.
    pub(super) loose_maps: Arc<AtomicUsize>,
    /// BAR ranges registered as UB regions.
    pub(super) bar_ranges: BarRanges,
}

impl ClaimState {
    /// Record `driver` as the device's one driver, or say why not.
    pub(super) fn take(&self, dev: &PciDevice, driver: &'static str) -> Result<()> {
        let mut held = self.driver.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(by) = *held {
            return Err(CoreError::DeviceClaimed {
                addr: dev.address(),
                driver: by,
            });
        }
        let loose = self.loose_maps.load(Ordering::Acquire);
        if loose > 0 {
            return Err(CoreError::DeviceMappedOutsideDriver {
                addr: dev.address(),
                mappings: loose,
            });
        }
        *held = Some(driver);
        Ok(())
    }

    /// Run `op` while no driver holds the device, keeping it unclaimed until `op` returns;
    /// [`CoreError::DeviceClaimed`] naming the holder, without running `op`, while one does.
    pub(super) fn while_free<T>(
        &self,
        dev: &PciDevice,
        op: impl FnOnce() -> Result<T>,
    ) -> Result<T> {
        let held = self.driver.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(driver) = *held {
            return Err(CoreError::DeviceClaimed {
                addr: dev.address(),
                driver,
            });
        }
        op()
    }

    /// The driver holding the device, if any.
    pub(super) fn holder(&self) -> Option<&'static str> {
        *self.driver.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn release(&self) {
        *self.driver.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }
}

/// A byte range of one BAR registered as a UB region, on record in its device until dropped:
/// a range is registered once, so two regions (and two pools) never alias the same memory.
#[derive(Debug)]
pub(crate) struct BarRangeRecord {
    ranges: BarRanges,
    bar: u8,
    range: std::ops::Range<u64>,
}

impl BarRangeRecord {
    /// Put `[range)` of `bar` on record, or say which registration overlaps it.
    pub(super) fn take(
        ranges: &BarRanges,
        dev: &PciDevice,
        bar: u8,
        range: std::ops::Range<u64>,
    ) -> Result<BarRangeRecord> {
        let mut held = ranges.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, r)) = held
            .iter()
            .find(|(b, r)| *b == bar && r.start < range.end && range.start < r.end)
        {
            return Err(CoreError::BarRangeRegistered {
                addr: dev.address(),
                bar,
                offset: range.start,
                len: range.end - range.start,
                held_offset: r.start,
                held_len: r.end - r.start,
            });
        }
        held.push((bar, range.clone()));
        Ok(BarRangeRecord {
            ranges: ranges.clone(),
            bar,
            range,
        })
    }
}

impl Drop for BarRangeRecord {
    fn drop(&mut self) {
        let mut held = self.ranges.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(i) = held
            .iter()
            .position(|(b, r)| *b == self.bar && *r == self.range)
        {
            held.swap_remove(i);
        }
    }
}
