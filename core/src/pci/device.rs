//! [`PciDevice`]: a PCI function opened through VFIO in a [`DmaDomain`].

use std::mem::ManuallyDrop;
use std::os::fd::AsRawFd;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use vfio_bindings::bindings::vfio::{
    vfio_device_info, VFIO_DEVICE_FLAGS_RESET, VFIO_PCI_CONFIG_REGION_INDEX,
    VFIO_REGION_INFO_FLAG_MMAP, VFIO_REGION_INFO_FLAG_READ, VFIO_REGION_INFO_FLAG_WRITE,
};
use vfio_ioctls::VfioDevice;

use super::capability::{walk, PciCapability};
use super::claim::{ClaimState, DeviceAccess, DeviceClaim};
use super::model::DeviceModel;
use super::removal::RemovalNotice;
use super::PciAddress;
use crate::error::{CoreError, Result};
use crate::mmio::Mmio;
use crate::vfio::noiommu_group::NoIommuDevice;
use crate::vfio::{DmaDomain, OpenedDevice};

/// `_IO(VFIO_TYPE, VFIO_BASE + 7)`: vfio-ioctls keeps the device flags private.
const VFIO_DEVICE_GET_INFO: libc::c_ulong = (59 << 8) | (100 + 7);
/// `_IO(VFIO_TYPE, VFIO_BASE + 11)`: vfio-ioctls' reset() drops the result.
const VFIO_DEVICE_RESET: libc::c_ulong = (59 << 8) | (100 + 11);
/// Config-space command register and its bits.
const COMMAND: u16 = 0x04;
const CMD_MEMORY: u16 = 1 << 1;
const CMD_BUS_MASTER: u16 = 1 << 2;

/// A PCI function opened through VFIO (or an in-process [`DeviceModel`], see
/// [`PciDevice::from_model`]). Shares its domain's IOMMU mappings; holds an `Arc<DmaDomain>` so
/// the domain outlives it. Closed (the group released) on drop.
pub struct PciDevice {
    addr: PciAddress,
    /// The VFIO device, or the model standing in for one.
    access: Access,
    flags: u32,
    config_off: u64,
    config_len: u64,
    vendor: u16,
    device: u16,
    class: u32,
    numa: Option<u32>,
    domain: Arc<DmaDomain>,
    /// The VFIO request channel, once [`PciDevice::enable_removal_notice`] registered it.
    removal: Mutex<Option<RemovalNotice>>,
    /// Times this handle revoked the device's exported dma-bufs ([`PciDevice::dmabuf_revocations`]).
    dmabuf_revocations: AtomicU64,
    /// The driver holding the device, and BAR mappings made outside one.
    claim: ClaimState,
}

/// What config space, BARs and reset go to.
enum Access {
    /// Dropped by hand in Drop, before the domain hears the device closed.
    Vfio(ManuallyDrop<VfioDevice>),
    /// Opened through a vfio no-IOMMU group (closed by hand in Drop, like `Vfio`).
    NoIommu(NoIommuDevice),
    /// An in-process model (host tests, fuzzing).
    Model(Arc<dyn DeviceModel>),
}

impl std::fmt::Debug for PciDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "PciDevice({} {:04x}:{:04x} class {:06x})",
            self.addr, self.vendor, self.device, self.class
        )
    }
}

impl PciDevice {
    /// Open `addr` (bound to vfio-pci) in `domain`; its IOMMU group joins the domain's container
    /// on first use. Errors name the cause: no such device, IOMMU off, other driver, group not
    /// viable, permissions.
    pub fn open(domain: &Arc<DmaDomain>, addr: PciAddress) -> Result<Arc<PciDevice>> {
        let (dev, sys) = domain.open_device(addr)?;
        let dev = match dev {
            OpenedDevice::Vfio(d) => d,
            OpenedDevice::NoIommu(d) => return PciDevice::open_noiommu(domain, addr, d, sys.numa),
        };
        let dev = ManuallyDrop::new(dev);
        let flags = match device_flags(&dev) {
            Ok(f) => f,
            Err(source) => {
                close(dev, domain, addr);
                return Err(CoreError::Io {
                    op: format!("VFIO_DEVICE_GET_INFO on {addr}"),
                    source,
                });
            }
        };
        let cfg = VFIO_PCI_CONFIG_REGION_INDEX;
        // From here on PciDevice's Drop closes the device on every error path.
        let mut d = PciDevice {
            addr,
            config_off: dev.get_region_offset(cfg),
            config_len: dev.get_region_size(cfg),
            access: Access::Vfio(dev),
            flags,
            vendor: 0,
            device: 0,
            class: 0,
            numa: sys.numa,
            domain: domain.clone(),
            removal: Mutex::new(None),
            dmabuf_revocations: AtomicU64::new(0),
            claim: ClaimState::default(),
        };
        d.read_ids()?;
        Ok(Arc::new(d).with_removal_notice())
    }

    /// Register the device's removal notice (every opened device answers the kernel's request
    /// to release it, see [`PciDevice::removal_requested`]); a device whose VFIO driver offers
    /// no request channel is opened without one.
    fn with_removal_notice(self: Arc<Self>) -> Arc<Self> {
        if let Err(e) = self.enable_removal_notice() {
            tracing::debug!(addr = %self.addr, "no removal notice for this device: {e}");
        }
        self
    }

    /// The rest of [`PciDevice::open`] for a device opened through its no-IOMMU group.
    fn open_noiommu(
        domain: &Arc<DmaDomain>,
        addr: PciAddress,
        dev: NoIommuDevice,
        numa: Option<u32>,
    ) -> Result<Arc<PciDevice>> {
        let cfg = VFIO_PCI_CONFIG_REGION_INDEX;
        // From here on PciDevice's Drop closes the device on every error path.
        let mut d = PciDevice {
            addr,
            config_off: dev.get_region_offset(cfg),
            config_len: dev.get_region_size(cfg),
            flags: dev.flags(),
            access: Access::NoIommu(dev),
            vendor: 0,
            device: 0,
            class: 0,
            numa,
            domain: domain.clone(),
            removal: Mutex::new(None),
            dmabuf_revocations: AtomicU64::new(0),
            claim: ClaimState::default(),
        };
        d.read_ids()?;
        Ok(Arc::new(d).with_removal_notice())
    }

    /// A device whose config space, BARs, reset and removal requests are `model`'s, at the
    /// made-up address `addr`, with DMA in `domain` (normally [`DmaDomain::host_only`]: the
    /// model reads and writes driver memory through the domain's IOVAs). Drivers run on it
    /// unchanged: [`DeviceAccess::map_bar`] returns model-backed [`Mmio`] windows.
    pub fn from_model(
        domain: &Arc<DmaDomain>,
        addr: PciAddress,
        model: Arc<dyn DeviceModel>,
    ) -> Result<Arc<PciDevice>> {
        let mut d = PciDevice {
            addr,
            config_off: 0,
            config_len: u64::from(model.config_len()),
            flags: if model.can_reset() {
                VFIO_DEVICE_FLAGS_RESET
            } else {
                0
            },
            numa: model.numa_node(),
            access: Access::Model(model),
            vendor: 0,
            device: 0,
            class: 0,
            domain: domain.clone(),
            removal: Mutex::new(None),
            dmabuf_revocations: AtomicU64::new(0),
            claim: ClaimState::default(),
        };
        d.read_ids()?;
        Ok(Arc::new(d))
    }

    /// Check the config space size and read vendor, device and class.
    fn read_ids(&mut self) -> Result<()> {
        let addr = self.addr;
        let d = self;
        if d.config_len < 64 {
            return Err(CoreError::ConfigAccess {
                addr,
                what: "read",
                off: 0,
                len: 64,
                reason: format!("VFIO reports a {}-byte config region", d.config_len),
            });
        }
        let id = d.config_read_u32(0)?;
        if id == u32::MAX {
            return Err(CoreError::ConfigAccess {
                addr,
                what: "read",
                off: 0,
                len: 4,
                reason: "vendor/device id reads all-ones: the device is gone or in reset".into(),
            });
        }
        d.vendor = id as u16;
        d.device = (id >> 16) as u16;
        d.class = d.config_read_u32(8)? >> 8;
        Ok(())
    }

    /// The device's PCI address.
    pub fn address(&self) -> PciAddress {
        self.addr
    }

    /// The domain the device was opened in.
    pub fn domain(&self) -> &Arc<DmaDomain> {
        &self.domain
    }

    /// PCI vendor id.
    pub fn vendor_id(&self) -> u16 {
        self.vendor
    }

    /// PCI device id.
    pub fn device_id(&self) -> u16 {
        self.device
    }

    /// 24-bit class code (class, subclass, prog-if), e.g. 0x010802 for NVMe.
    pub fn class_code(&self) -> u32 {
        self.class
    }

    /// The NUMA node the device sits on, if the platform says.
    pub fn numa_node(&self) -> Option<u32> {
        self.numa
    }

    fn config_rw(&self, what: &'static str, off: u16, buf: *mut u8, len: usize) -> Result<()> {
        let err = |reason: String| CoreError::ConfigAccess {
            addr: self.addr,
            what,
            off,
            len,
            reason,
        };
        if u64::from(off) + len as u64 > self.config_len {
            return Err(err(format!(
                "past the {}-byte config space",
                self.config_len
            )));
        }
        let fd = match &self.access {
            Access::Vfio(dev) => dev.as_raw_fd(),
            Access::NoIommu(dev) => dev.as_raw_fd(),
            Access::Model(m) => {
                // SAFETY: buf points to len bytes owned by the caller (see the callers).
                let b = unsafe { std::slice::from_raw_parts_mut(buf, len) };
                if what == "read" {
                    m.config_read(off, b);
                } else {
                    self.note_command_write(off, b);
                    m.config_write(off, b);
                }
                return Ok(());
            }
        };
        if what == "write" {
            // SAFETY: buf points to len bytes owned by the caller (see the callers).
            let b = unsafe { std::slice::from_raw_parts(buf, len) };
            self.note_command_write(off, b);
        }
        let pos = (self.config_off + u64::from(off)) as libc::off_t;
        // SAFETY: buf points to len bytes owned by the caller; pread/pwrite touch only those.
        let n = unsafe {
            if what == "read" {
                libc::pread(fd, buf.cast(), len, pos)
            } else {
                libc::pwrite(fd, buf.cast(), len, pos)
            }
        };
        if n < 0 {
            return Err(err(std::io::Error::last_os_error().to_string()));
        }
        if n as usize != len {
            return Err(err(format!("short {what}: {n} of {len} bytes")));
        }
        Ok(())
    }

    /// Read a config-space byte (checked: a failed or short read is an error).
    pub fn config_read_u8(&self, off: u16) -> Result<u8> {
        let mut b = [0u8; 1];
        self.config_rw("read", off, b.as_mut_ptr(), 1)?;
        Ok(b[0])
    }

    /// Read a little-endian config-space u16 (checked).
    pub fn config_read_u16(&self, off: u16) -> Result<u16> {
        let mut b = [0u8; 2];
        self.config_rw("read", off, b.as_mut_ptr(), 2)?;
        Ok(u16::from_le_bytes(b))
    }

    /// Read a little-endian config-space u32 (checked).
    pub fn config_read_u32(&self, off: u16) -> Result<u32> {
        let mut b = [0u8; 4];
        self.config_rw("read", off, b.as_mut_ptr(), 4)?;
        Ok(u32::from_le_bytes(b))
    }

    /// Write `bytes` (1, 2 or 4, little-endian) at config-space offset `off` (checked).
    pub(super) fn config_write(&self, off: u16, bytes: &mut [u8]) -> Result<()> {
        self.config_rw("write", off, bytes.as_mut_ptr(), bytes.len())
    }

    /// The standard capability list.
    pub fn capabilities(&self) -> Result<Vec<PciCapability>> {
        walk(|o| self.config_read_u8(o), |o| self.config_read_u16(o))
    }

    fn check_bar(&self, bar: u8) -> Result<u64> {
        let bad = |reason: String| CoreError::BadBar {
            addr: self.addr,
            bar,
            reason,
        };
        if bar > 5 {
            return Err(bad("BAR index must be 0..=5".into()));
        }
        let len = match &self.access {
            Access::Vfio(dev) => dev.get_region_size(u32::from(bar)),
            Access::NoIommu(dev) => dev.get_region_size(u32::from(bar)),
            Access::Model(m) => m.bar_len(bar),
        };
        if len == 0 {
            return Err(bad("the device does not implement this BAR (size 0)".into()));
        }
        Ok(len)
    }

    /// Length of BAR `bar` in bytes.
    pub fn bar_len(&self, bar: u8) -> Result<u64> {
        self.check_bar(bar)
    }

    /// How many times ubdirect revoked this device's exported BAR dma-bufs through this handle:
    /// a config write that turns memory decoding off (COMMAND bit 1 clear) or a reset (vfio-pci
    /// revokes its dma-bufs for both, drivers/vfio/pci/vfio_pci_config.c and vfio_pci_core.c).
    /// iommufd drops a revoked dma-buf's translation for good (drivers/iommu/iommufd/pages.c,
    /// `iopt_revoke_notify`), and tells userspace nothing: a region exported before the count
    /// moved takes no more DMA ([`crate::UbRegion::check_dma`]).
    pub fn dmabuf_revocations(&self) -> u64 {
        self.dmabuf_revocations.load(Ordering::Acquire)
    }

    /// A config write covering the COMMAND register (offset 4) with memory decoding off: the
    /// exporter revokes every dma-buf of the device. Counted before the write reaches it, so
    /// I/O checks see the revocation no later than the device does.
    fn note_command_write(&self, off: u16, bytes: &[u8]) {
        let (off, cmd) = (usize::from(off), usize::from(COMMAND));
        if off <= cmd && cmd < off + bytes.len() && bytes[cmd - off] & CMD_MEMORY as u8 == 0 {
            self.dmabuf_revocations.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// Export BAR `bar` as a dma-buf (vfio-pci's `VFIO_DEVICE_FEATURE_DMA_BUF`), for an iommufd
    /// domain to map by file. The dma-buf is revoked when the device is reset or its memory
    /// decoding turns off.
    pub(super) fn export_bar_dmabuf_raw(&self, bar: u8) -> Result<std::os::fd::OwnedFd> {
        let len = self.check_bar(bar)?;
        match &self.access {
            Access::Vfio(dev) => crate::vfio::dmabuf::export_bar(dev, self.addr, bar, len),
            Access::NoIommu(_) => Err(crate::vfio::noiommu::device_memory_refusal(&format!(
                "BAR {bar} of {} (as a dma-buf)",
                self.addr
            ))),
            Access::Model(_) => Err(CoreError::Unsupported {
                addr: self.addr,
                what: "exporting a BAR of a device model as a dma-buf",
            }),
        }
    }

    /// mmap the whole BAR through VFIO.
    pub(super) fn map_bar_raw(&self, bar: u8) -> Result<Mmio> {
        let len = self.check_bar(bar)?;
        let (flags, off, fd) = match &self.access {
            Access::Vfio(dev) => (
                dev.get_region_flags(u32::from(bar)),
                dev.get_region_offset(u32::from(bar)),
                dev.as_raw_fd(),
            ),
            Access::NoIommu(dev) => (
                dev.get_region_flags(u32::from(bar)),
                dev.get_region_offset(u32::from(bar)),
                dev.as_raw_fd(),
            ),
            Access::Model(m) => {
                let len = usize::try_from(len).map_err(|_| CoreError::BadBar {
                    addr: self.addr,
                    bar,
                    reason: format!("BAR of {len:#x} bytes does not fit the address space"),
                })?;
                return Ok(Mmio::from_model(m.clone(), bar, len));
            }
        };
        if flags & VFIO_REGION_INFO_FLAG_MMAP == 0 {
            return Err(CoreError::BadBar {
                addr: self.addr,
                bar,
                reason: "VFIO does not allow mmap of this BAR (an I/O port BAR?)".into(),
            });
        }
        let mut prot = 0;
        if flags & VFIO_REGION_INFO_FLAG_READ != 0 {
            prot |= libc::PROT_READ;
        }
        if flags & VFIO_REGION_INFO_FLAG_WRITE != 0 {
            prot |= libc::PROT_WRITE;
        }
        let len = usize::try_from(len).map_err(|_| CoreError::BadBar {
            addr: self.addr,
            bar,
            reason: format!("BAR of {len:#x} bytes does not fit the address space"),
        })?;
        // SAFETY: a fresh shared mapping of the device fd at the region offset VFIO gave us.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                prot,
                libc::MAP_SHARED,
                fd,
                off as libc::off_t,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(CoreError::BadBar {
                addr: self.addr,
                bar,
                reason: format!(
                    "mmap of {len:#x} bytes failed: {} (a BAR with a non-mappable MSI-X table?)",
                    std::io::Error::last_os_error()
                ),
            });
        }
        // SAFETY: p is a successful mmap of exactly len bytes, owned by the Mmio from now on.
        Ok(unsafe { Mmio::from_mmap(NonNull::new_unchecked(p.cast()), len) })
    }

    /// Set memory-space decoding and bus mastering in the command register (needed before the
    /// device may DMA).
    pub(super) fn enable_bus_master_raw(&self) -> Result<()> {
        let cmd = self.config_read_u16(COMMAND)?;
        self.config_write(
            COMMAND,
            &mut (cmd | CMD_MEMORY | CMD_BUS_MASTER).to_le_bytes(),
        )?;
        let back = self.config_read_u16(COMMAND)?;
        if back & CMD_BUS_MASTER == 0 {
            return Err(CoreError::ConfigAccess {
                addr: self.addr,
                what: "write",
                off: COMMAND,
                len: 2,
                reason: format!("bus master bit did not stick (command reads {back:#06x})"),
            });
        }
        Ok(())
    }

    /// Reset the function (VFIO_DEVICE_RESET: FLR or another method the kernel picks). Fails
    /// with [`CoreError::Unsupported`] when VFIO reports no reset method.
    pub(super) fn reset_raw(&self) -> Result<()> {
        if self.flags & VFIO_DEVICE_FLAGS_RESET == 0 {
            return Err(CoreError::Unsupported {
                addr: self.addr,
                what: "VFIO_DEVICE_RESET",
            });
        }
        // vfio-pci revokes the device's dma-bufs around the reset, whether it succeeds or not.
        self.dmabuf_revocations.fetch_add(1, Ordering::AcqRel);
        let fd = match &self.access {
            Access::Vfio(dev) => dev.as_raw_fd(),
            Access::NoIommu(dev) => dev.as_raw_fd(),
            Access::Model(m) => {
                m.reset();
                return Ok(());
            }
        };
        // SAFETY: a no-argument ioctl on our device fd.
        let rc = unsafe { libc::ioctl(fd, VFIO_DEVICE_RESET) };
        if rc != 0 {
            return Err(CoreError::last_os(format!(
                "VFIO_DEVICE_RESET on {}",
                self.addr
            )));
        }
        Ok(())
    }

    /// Claim the device for `driver` (a short name, e.g. "nvme"): from now on only the returned
    /// [`DeviceClaim`] reaches the operations that program it, until it is dropped. Refused
    /// with [`CoreError::DeviceClaimed`] while another driver holds it, and with
    /// [`CoreError::DeviceMappedOutsideDriver`] while a BAR mapping made through
    /// [`PciDevice::access`] (e.g. a BAR registered as a UB region) lives.
    pub fn claim(self: &Arc<Self>, driver: &'static str) -> Result<DeviceClaim> {
        self.claim.take(self, driver)?;
        Ok(DeviceClaim::new(self.clone()))
    }

    /// The driver holding the device, if any.
    pub fn claimed_by(&self) -> Option<&'static str> {
        self.claim.holder()
    }

    /// The operations that program the device (config writes, BAR mappings, bus mastering,
    /// reset) for a device no driver holds; [`CoreError::DeviceClaimed`] while a driver does
    /// (use the driver's API, or drop it first).
    pub fn access(&self) -> Result<DeviceAccess<'_>> {
        match self.claim.holder() {
            Some(driver) => Err(CoreError::DeviceClaimed {
                addr: self.addr,
                driver,
            }),
            None => Ok(DeviceAccess::new(self, true)),
        }
    }

    /// The operations that program the device, whoever holds it: for fault injection and
    /// tests that act behind a driver's back.
    ///
    /// # Safety
    /// A driver holding the device trusts that nothing else programs it. The caller must
    /// ensure that whatever it does leaves no device DMA aimed at memory the driver no longer
    /// owns (e.g. a reset or a memory-decoding change the driver is built to survive), and
    /// that BARs it maps are not used to re-program DMA addresses.
    pub unsafe fn access_unclaimed(&self) -> DeviceAccess<'_> {
        DeviceAccess::new(self, false)
    }

    /// Put bytes `[range)` of BAR `bar` on record as registered, for as long as the record
    /// lives; [`CoreError::BarRangeRegistered`] when they overlap a registered range.
    pub(crate) fn record_bar_range(
        &self,
        bar: u8,
        range: std::ops::Range<u64>,
    ) -> Result<super::BarRangeRecord> {
        super::BarRangeRecord::take(&self.claim.bar_ranges, self, bar, range)
    }

    /// True when BAR `bar` is prefetchable memory (its config-space BAR register says so):
    /// memory, not registers.
    pub fn bar_is_prefetchable(&self, bar: u8) -> Result<bool> {
        self.check_bar(bar)?;
        let reg = self.config_read_u32(0x10 + 4 * u16::from(bar))?;
        Ok(reg & 1 == 0 && reg & (1 << 3) != 0)
    }

    /// Run `op` while no driver holds the device ([`CoreError::DeviceClaimed`] otherwise).
    pub(super) fn while_unclaimed<T>(&self, op: impl FnOnce() -> Result<T>) -> Result<T> {
        self.claim.while_free(self, op)
    }

    pub(super) fn release_claim(&self) {
        self.claim.release();
    }

    pub(super) fn loose_maps(&self) -> &Arc<std::sync::atomic::AtomicUsize> {
        &self.claim.loose_maps
    }

    /// True for a device made with [`PciDevice::from_model`].
    pub fn is_model(&self) -> bool {
        matches!(self.access, Access::Model(_))
    }

    /// True when VFIO reports a reset method for the device.
    pub fn can_reset(&self) -> bool {
        self.flags & VFIO_DEVICE_FLAGS_RESET != 0
    }

    /// Ask the kernel to tell this process when it wants the device back (sysfs `remove`,
    /// hot-unplug, unbind): registers an eventfd on VFIO's device request IRQ. Without it a
    /// removal blocks in the kernel ("No device request channel registered, blocked until
    /// released by user") until the process exits. Idempotent. After it, check
    /// [`PciDevice::removal_requested`] on slow paths and, when it says so, stop I/O and drop
    /// everything holding the device: the removal completes when the device is closed.
    pub fn enable_removal_notice(&self) -> Result<()> {
        let mut slot = self.removal.lock().unwrap_or_else(|p| p.into_inner());
        if slot.is_none() {
            *slot = Some(match &self.access {
                Access::Vfio(dev) => RemovalNotice::register(dev, self.addr)?,
                Access::NoIommu(dev) => RemovalNotice::register_noiommu(dev, self.addr)?,
                Access::Model(_) => return Ok(()),
            });
        }
        Ok(())
    }

    /// True once the kernel has asked for the device back (it stays true). A non-blocking
    /// read(2) of an eventfd: a syscall, so for slow paths only (idle polls, timeouts, every
    /// ~100 ms between batches), never per I/O. Always false before
    /// [`PciDevice::enable_removal_notice`].
    pub fn removal_requested(&self) -> bool {
        if let Access::Model(m) = &self.access {
            return m.removal_requested();
        }
        let slot = self.removal.lock().unwrap_or_else(|p| p.into_inner());
        slot.as_ref().is_some_and(RemovalNotice::requested)
    }
}

impl Drop for PciDevice {
    fn drop(&mut self) {
        if let Access::Vfio(dev) = &mut self.access {
            // vfio-ioctls looks the device's IOMMU group up in sysfs after closing the device
            // fd, and panics when the kernel finished removing the device in between (a
            // removal waits for exactly that close): the group file is then left to the
            // container, and the process goes on.
            let closed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                // SAFETY: dropped exactly once, here; the field is not used afterwards.
                unsafe { ManuallyDrop::drop(dev) }
            }));
            if closed.is_err() {
                tracing::warn!(addr = %self.addr, "the device was removed while it closed; its VFIO group stays open until the domain goes");
            }
            self.domain.device_closed(self.addr);
        }
        if let Access::NoIommu(dev) = &mut self.access {
            dev.close();
            self.domain.device_closed(self.addr);
        }
    }
}

/// Close a device that never became a PciDevice.
fn close(mut dev: ManuallyDrop<VfioDevice>, domain: &Arc<DmaDomain>, addr: PciAddress) {
    // SAFETY: dropped exactly once, here.
    unsafe { ManuallyDrop::drop(&mut dev) };
    domain.device_closed(addr);
}

/// VFIO_DEVICE_GET_INFO flags.
fn device_flags(dev: &VfioDevice) -> std::io::Result<u32> {
    let mut info = vfio_device_info {
        argsz: std::mem::size_of::<vfio_device_info>() as u32,
        flags: 0,
        num_regions: 0,
        num_irqs: 0,
        cap_offset: 0,
        pad: 0,
    };
    // SAFETY: the kernel writes at most argsz bytes into info.
    let rc = unsafe { libc::ioctl(dev.as_raw_fd(), VFIO_DEVICE_GET_INFO, &mut info) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(info.flags)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 256 bytes of config space, nothing else.
    struct Cfg(Mutex<[u8; 256]>);

    impl DeviceModel for Cfg {
        fn config_len(&self) -> u16 {
            256
        }
        fn config_read(&self, off: u16, buf: &mut [u8]) {
            let c = self.0.lock().unwrap();
            buf.copy_from_slice(&c[usize::from(off)..usize::from(off) + buf.len()]);
        }
        fn config_write(&self, off: u16, data: &[u8]) {
            let mut c = self.0.lock().unwrap();
            c[usize::from(off)..usize::from(off) + data.len()].copy_from_slice(data);
        }
        fn bar_len(&self, _: u8) -> u64 {
            0
        }
        fn mmio_read(&self, _: u8, _: u64, _: u8) -> u64 {
            0
        }
        fn mmio_write(&self, _: u8, _: u64, _: u8, _: u64) {}
        fn can_reset(&self) -> bool {
            true
        }
    }

    #[test]
    fn turning_memory_decoding_off_counts_as_a_dmabuf_revocation() {
        let mut cfg = [0u8; 256];
        cfg[..4].copy_from_slice(&[0xf4, 0x1a, 0x10, 0x11]);
        cfg[4] = 0x06; // memory + bus master
        let d = DmaDomain::host_only();
        let dev = PciDevice::from_model(
            &d,
            "0000:00:09.0".parse().unwrap(),
            Arc::new(Cfg(Mutex::new(cfg))),
        )
        .unwrap();
        assert_eq!(dev.dmabuf_revocations(), 0);
        let dev = dev.access().unwrap();
        // Memory decoding stays on: no revocation (bus master off, other registers).
        dev.config_write_u16(COMMAND, 0x02).unwrap();
        dev.config_write_u8(5, 0).unwrap();
        dev.config_write_u32(0x10, 0).unwrap();
        assert_eq!(dev.device().dmabuf_revocations(), 0);
        // Off, through a u16, a u8 and a u32 write covering the COMMAND register.
        dev.config_write_u16(COMMAND, 0x04).unwrap();
        assert_eq!(dev.device().dmabuf_revocations(), 1);
        dev.config_write_u8(4, 0).unwrap();
        dev.config_write_u32(4, 0x0010_0000).unwrap();
        assert_eq!(dev.device().dmabuf_revocations(), 3);
        // Turning it back on does not undo a revocation; a reset is one more.
        dev.config_write_u16(COMMAND, 0x06).unwrap();
        assert_eq!(dev.device().dmabuf_revocations(), 3);
        dev.reset().unwrap();
        assert_eq!(dev.device().dmabuf_revocations(), 4);
    }
}
