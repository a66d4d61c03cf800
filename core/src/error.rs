//! [`CoreError`]: every failure of the core crate, each naming its cause and what to do.

use std::path::PathBuf;

use crate::pci::PciAddress;

/// Result alias of the core crate.
pub type Result<T> = std::result::Result<T, CoreError>;

/// Why a core operation failed. Messages name the cause and the fix.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CoreError {
    /// VFIO is not available at all (no /dev/vfio/vfio, module not loaded, no type1 IOMMU).
    #[error("VFIO is not available: {reason}: load it with `modprobe vfio-pci` (scripts/setup.sh does) and boot with intel_iommu=on / amd_iommu=on")]
    VfioUnavailable {
        /// What was missing.
        reason: String,
    },
    /// No PCI device at this address.
    #[error("no PCI device {addr} (no {path})")]
    NoSuchDevice {
        /// The address asked for.
        addr: PciAddress,
        /// The sysfs path that does not exist.
        path: PathBuf,
    },
    /// The device has no IOMMU group: the IOMMU is off.
    #[error("PCI device {addr} has no IOMMU group: the IOMMU is disabled; boot with intel_iommu=on (Intel) or amd_iommu=on (AMD) and enable VT-d/AMD-Vi in the firmware")]
    NoIommuGroup {
        /// The device.
        addr: PciAddress,
    },
    /// The device is bound to another driver (or none).
    #[error("PCI device {addr} is bound to {}, not vfio-pci: bind it to vfio-pci (scripts/setup.sh does)", driver.as_deref().map(|d| format!("driver {d}")).unwrap_or_else(|| "no driver".into()))]
    NotBoundToVfio {
        /// The device.
        addr: PciAddress,
        /// The driver it is bound to, if any.
        driver: Option<String>,
    },
    /// Another device in the IOMMU group is bound to a host driver.
    #[error("IOMMU group {group} of {addr} is not viable: every device in it must be bound to vfio-pci or to no driver; others in the group: {others}: bind them to vfio-pci too (scripts/setup.sh) or move the device to its own slot")]
    GroupNotViable {
        /// The device opened.
        addr: PciAddress,
        /// The IOMMU group number.
        group: u32,
        /// The other devices of the group and their drivers, "0000:00:1f.0 (lpc_ich), ...".
        others: String,
    },
    /// Opening a VFIO node was refused.
    #[error("permission denied opening {path} as user {user}: run as root or give the group to this user (scripts/setup.sh with TARGET_USER={user})")]
    PermissionDenied {
        /// The node.
        path: PathBuf,
        /// The user name (or uid) of this process.
        user: String,
    },
    /// The IOMMU could not pin the memory: RLIMIT_MEMLOCK is too low.
    #[error("cannot pin {needed} bytes for DMA: RLIMIT_MEMLOCK is {limit} bytes; raise it (`ulimit -l unlimited`, limits.conf memlock, or systemd LimitMEMLOCK) or run as root")]
    MemlockTooLow {
        /// Bytes this domain needs pinned (already mapped + this mapping).
        needed: u64,
        /// The soft RLIMIT_MEMLOCK.
        limit: u64,
    },
    /// No free IOVA range of the size and alignment is left in the domain.
    #[error("IOVA space exhausted: no free range of {len:#x} bytes aligned to {align:#x} in the domain (largest free range {largest_free:#x}); unmap regions first")]
    IovaExhausted {
        /// Bytes asked for.
        len: u64,
        /// Alignment asked for.
        align: u64,
        /// The largest free range.
        largest_free: u64,
    },
    /// The memory overlaps memory this domain already maps.
    #[error("memory [{vaddr:#x}, +{len:#x}) is already mapped in this DMA domain (each region is registered once)")]
    AlreadyMapped {
        /// Start of the memory.
        vaddr: usize,
        /// Length.
        len: usize,
    },
    /// Unmap of something this domain did not map.
    #[error("IOVA [{iova:#x}, +{len:#x}) is not a mapping of this DMA domain")]
    NotMapped {
        /// The IOVA.
        iova: u64,
        /// The length.
        len: usize,
    },
    /// The device's IOMMU group is held by another process or another domain of this one.
    #[error("IOMMU group {group} of {addr} is already in use (by another process, or by another DMA domain of this process)")]
    GroupBusy {
        /// The device.
        addr: PciAddress,
        /// The IOMMU group.
        group: u32,
    },
    /// The kernel kept refusing to open the device because a reset of it was under way
    /// (vfio-pci resets a device on open with `pci_try_reset_function`, which answers EAGAIN
    /// while another reset, e.g. one through sysfs, holds the device lock).
    #[error("PCI device {addr} is being reset by the kernel: opening it was refused (EAGAIN) for {waited:?} while the reset held the device")]
    DeviceResetting {
        /// The device.
        addr: PciAddress,
        /// How long the open was retried.
        waited: std::time::Duration,
    },
    /// The device is already open in this domain.
    #[error("PCI device {addr} is already open in this DMA domain")]
    AlreadyOpen {
        /// The device.
        addr: PciAddress,
    },
    /// The domain has no device yet, so the IOMMU is not set up.
    #[error("the DMA domain has no open device: open a PciDevice in it (PciDevice::open) before mapping memory; VFIO sets up the IOMMU when the first group joins and drops it when the last device closes")]
    NoDevice,
    /// I/O into a region backed by a device BAR's dma-buf after ubdirect revoked that dma-buf
    /// (memory decoding turned off, or the device reset, through its [`crate::PciDevice`]):
    /// iommufd dropped the translation and never restores it, so the transfer cannot land.
    #[error("UB region {id} is BAR{bar} of {device} imported as a dma-buf, which was revoked when the device's memory decoding was turned off or the device was reset: the IOMMU no longer translates it (iommufd never maps a revoked dma-buf again), so I/O into it is refused; unregister the region and register the BAR again once memory decoding is on")]
    DmaBufRevoked {
        /// The region.
        id: u32,
        /// The exporting device.
        device: PciAddress,
        /// The BAR.
        bar: u8,
    },
    /// The DMA back end asked for (or chosen) cannot serve this request; `fix` says what to do.
    #[error("DMA back end {backend}: {reason}; {fix}")]
    Backend {
        /// The back end ("type1", "iommufd", "noiommu").
        backend: &'static str,
        /// What is missing or refused.
        reason: String,
        /// What the user can do about it.
        fix: String,
    },
    /// A VFIO ioctl failed.
    #[error("VFIO {op} failed: {source}")]
    Vfio {
        /// What was being done.
        op: &'static str,
        /// The vfio-ioctls error.
        #[source]
        source: vfio_ioctls::VfioError,
    },
    /// A system call failed.
    #[error("{op} failed: {source}")]
    Io {
        /// What was being done.
        op: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A config-space access failed or was out of range.
    #[error("config space {what} of {addr} at {off:#x} (+{len}) failed: {reason}")]
    ConfigAccess {
        /// The device.
        addr: PciAddress,
        /// "read" or "write".
        what: &'static str,
        /// Offset.
        off: u16,
        /// Bytes.
        len: usize,
        /// Why.
        reason: String,
    },
    /// A BAR index that the device does not have or cannot map.
    #[error("BAR {bar} of {addr}: {reason}")]
    BadBar {
        /// The device.
        addr: PciAddress,
        /// The BAR index.
        bar: u8,
        /// Why.
        reason: String,
    },
    /// The device read back all-ones: it is gone (surprise removal, reset, BAR disabled).
    #[error("device returned all-ones at MMIO offset {offset:#x}: it was removed, reset, or its memory decoding is off; rebind it to vfio-pci (scripts/setup.sh) and reopen")]
    DeviceGone {
        /// The MMIO offset read.
        offset: usize,
    },
    /// An MMIO access outside its window or not aligned to its size (a register offset taken
    /// from the device, e.g. a doorbell stride or a capability offset, that does not fit).
    #[error("MMIO access of {size} bytes at offset {offset:#x} {reason} of a {window:#x}-byte window: the device reported a register layout that does not fit its BAR")]
    MmioOutOfRange {
        /// The offset asked for.
        offset: usize,
        /// Access size in bytes.
        size: usize,
        /// Length of the window.
        window: usize,
        /// "outside" or "unaligned".
        reason: &'static str,
    },
    /// The device does not support the operation.
    #[error("{addr}: {what} is not supported by this device")]
    Unsupported {
        /// The device.
        addr: PciAddress,
        /// The operation.
        what: &'static str,
    },
    /// A bad argument from the caller; nothing was changed.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A registered file changed (size or mtime, or removed) since its region was mapped.
    #[error("the file {file} of UB region {id} changed while registered (size {old_size} -> {new_size} bytes{}{}): devices would read the pages pinned at registration, not the file as it is now; unregister the region once no DMA uses it and register the file again", if *.mtime_changed { ", modified" } else { "" }, if *.removed { ", removed or replaced" } else { "" })]
    FileChanged {
        /// The region.
        id: u32,
        /// The file: its path at registration (or its inode and device).
        file: String,
        /// Size at registration.
        old_size: u64,
        /// Size now.
        new_size: u64,
        /// Whether the modification time moved.
        mtime_changed: bool,
        /// Whether the file lost its last name (removed, or replaced by a rename over it).
        removed: bool,
    },
    /// Every block of the pool is out.
    #[error("UB pool exhausted: all {block_count} blocks of {block_size} bytes are in use{}; return buffers (drop UbBuf) sooner or create the pool with more blocks (PoolConfig::block_count)", waited.map(|w| format!(" after waiting {w:?}")).unwrap_or_default())]
    PoolExhausted {
        /// Blocks in the pool.
        block_count: usize,
        /// Bytes per block.
        block_size: usize,
        /// How long get_timeout waited, if it waited.
        waited: Option<std::time::Duration>,
    },
    /// No region with this id is registered.
    #[error("no UB region {id} is registered")]
    NoSuchRegion {
        /// The id.
        id: u32,
    },
    /// A region cannot be unregistered while something uses it.
    #[error("UB region {id} is still in use by {users} pool(s)/DMA allocation(s): drop them (and every UbBuf) before unregistering")]
    RegionBusy {
        /// The region.
        id: u32,
        /// Pools and DmaMem allocations on it.
        users: usize,
    },
    /// A region is carved once: it already backs a pool or is a driver's DMA slab.
    #[error("UB region {id} is already carved as {owner}: a region backs one pool and driver DMA slabs are never pooled; register another region for this pool (UbRegistry::register_*, or UbPool::with_hugepages)")]
    RegionTaken {
        /// The region.
        id: u32,
        /// What owns it.
        owner: crate::ub::RegionOwner,
    },
    /// Another driver already drives the device.
    #[error("PCI device {addr} is already driven by the {driver} driver in this process: one driver per device; drop it (its controller / NIC handle) before opening the device again")]
    DeviceClaimed {
        /// The device.
        addr: PciAddress,
        /// The driver holding it.
        driver: &'static str,
    },
    /// A driver cannot take a device whose BAR is mapped outside any driver.
    #[error("PCI device {addr} has {mappings} BAR mapping(s) made outside a driver (a BAR registered as a UB region, or a raw mapping): a driver cannot own a device that others can program; drop them before opening a driver on it")]
    DeviceMappedOutsideDriver {
        /// The device.
        addr: PciAddress,
        /// Live mappings.
        mappings: usize,
    },
    /// A BAR range is registered once.
    #[error("bytes [{offset:#x}, +{len:#x}) of BAR{bar} of {addr} overlap [{held_offset:#x}, +{held_len:#x}), already registered as a UB region: a BAR range is registered once (reuse that region, or unregister it first)")]
    BarRangeRegistered {
        /// The device.
        addr: PciAddress,
        /// The BAR.
        bar: u8,
        /// Offset asked for.
        offset: u64,
        /// Length asked for.
        len: u64,
        /// Offset of the registered range.
        held_offset: u64,
        /// Length of the registered range.
        held_len: u64,
    },
    /// A BAR that holds registers cannot be registered as memory.
    #[error("BAR{bar} of {addr} is not prefetchable memory: it holds the device's registers, which must never be pooled or DMA'd into; register a memory BAR (a GPU or ivshmem BAR is prefetchable)")]
    RegisterBar {
        /// The device.
        addr: PciAddress,
        /// The BAR.
        bar: u8,
    },
    /// A buffer's region is mapped in another DMA domain than the device's: its IOVA means
    /// nothing (or another buffer) to that device.
    #[error("UB region {region} is mapped in {region_domain}, not in the device's {device_domain}: its IOVAs mean nothing to this device (or name another buffer); take buffers from a pool of the registry the device was opened with")]
    ForeignDomain {
        /// The buffer's region.
        region: u32,
        /// The region's domain.
        region_domain: crate::vfio::DomainId,
        /// The device's domain.
        device_domain: crate::vfio::DomainId,
    },
    /// Hugepage allocation failed.
    #[error(transparent)]
    HugePages(#[from] ubdirect_hugepages::HugeError),
}

impl CoreError {
    /// An [`CoreError::Io`] from the last OS error.
    pub(crate) fn last_os(op: impl Into<String>) -> CoreError {
        CoreError::Io {
            op: op.into(),
            source: std::io::Error::last_os_error(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Library errors state facts; advice for the command line (subcommands, how to share
    /// handles) is the CLI's (src/cli/errors.rs maps these variants).
    #[test]
    fn device_errors_state_facts_without_cli_or_embedder_advice() {
        let addr: PciAddress = "0000:00:04.0".parse().unwrap();
        let errs = [
            CoreError::NotBoundToVfio {
                addr,
                driver: Some("nvme".into()),
            },
            CoreError::GroupBusy { addr, group: 7 },
            CoreError::AlreadyOpen { addr },
            CoreError::NoSuchDevice {
                addr,
                path: "/sys/bus/pci/devices/0000:00:04.0".into(),
            },
        ];
        let facts = [
            "PCI device 0000:00:04.0 is bound to driver nvme, not vfio-pci",
            "IOMMU group 7 of 0000:00:04.0 is already in use",
            "PCI device 0000:00:04.0 is already open in this DMA domain",
            "no PCI device 0000:00:04.0 (no /sys/bus/pci/devices/0000:00:04.0)",
        ];
        for (e, fact) in errs.iter().zip(facts) {
            let m = e.to_string();
            assert!(m.starts_with(fact), "{m}");
            for advice in [
                "ubdirect ",
                "setup bind",
                "Arc<",
                "instead of",
                "same DmaDomain",
            ] {
                assert!(!m.contains(advice), "{advice:?} in {m:?}");
            }
        }
    }
}
