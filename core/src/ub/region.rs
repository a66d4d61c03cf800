//! [`UbRegion`]: one DMA-mapped memory region.

use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use ubdirect_hugepages::HugeMem;

use crate::error::{CoreError, Result};
use crate::mmio::Mmio;
use crate::pci::{BarRangeRecord, PciAddress, PciDevice};
use crate::vfio::{DmaMapping, DmaSegment, DomainId};

/// A region's id in its registry.
pub type RegionId = u32;

/// What memory backs a region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RegionKind {
    /// Host memory with pages of `page_size` bytes (2 MiB / 1 GiB hugepages; 4 KiB anonymous).
    Host {
        /// Backing page size in bytes.
        page_size: u64,
    },
    /// A device BAR window mmapped through VFIO (peer-to-peer target, e.g. a GPU BAR).
    DeviceBar {
        /// The device exposing the BAR.
        device: PciAddress,
        /// The BAR index.
        bar: u8,
    },
    /// A window of a device BAR that is the device's own memory for DMA, e.g. an NVMe
    /// Controller Memory Buffer ([`super::UbRegistry::register_bar_window`]).
    BarWindow {
        /// The device exposing the BAR.
        device: PciAddress,
        /// The BAR index.
        bar: u8,
        /// Byte offset of the window in the BAR.
        offset: u64,
    },
    /// Memory the caller allocated and keeps alive.
    External,
    /// A dma-buf from another driver (e.g. GPU memory exported by CUDA), mapped by file on the
    /// iommufd back end ([`super::UbRegistry::register_dmabuf`]). No CPU mapping: `vaddr` is
    /// null, and it cannot be carved into a pool or DMA slab; devices reach it by IOVA.
    DmaBuf,
    /// A file range mapped read-only (MAP_SHARED: the page cache itself) and mapped in the
    /// IOMMU for device reads only ([`super::UbRegistry::register_file`]).
    File {
        /// st_dev of the file.
        dev: u64,
        /// st_ino of the file.
        ino: u64,
        /// File offset of the region's first byte (page aligned).
        offset: u64,
        /// File bytes registered (the region's `len` is this rounded up to a page).
        len: u64,
    },
}

/// What a region is carved into. A region is carved once: by one [`super::UbPool`], or as a
/// driver's [`super::DmaMem`] slab (rings, PRP pages), which is never pooled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RegionOwner {
    /// The blocks of one pool.
    Pool,
    /// A driver DMA slab (`DmaMem`).
    DmaSlab,
}

impl std::fmt::Display for RegionOwner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            RegionOwner::Pool => "a UbPool",
            RegionOwner::DmaSlab => "a driver's DMA slab (DmaMem)",
        })
    }
}

const OWNER_NONE: u8 = 0;

impl RegionOwner {
    fn code(self) -> u8 {
        match self {
            RegionOwner::Pool => 1,
            RegionOwner::DmaSlab => 2,
        }
    }

    fn from_code(c: u8) -> Option<RegionOwner> {
        match c {
            1 => Some(RegionOwner::Pool),
            2 => Some(RegionOwner::DmaSlab),
            _ => None,
        }
    }
}

/// What keeps a region's memory mapped in this process.
pub(crate) enum Backing {
    Huge(#[allow(dead_code)] HugeMem),
    Bar(
        #[allow(dead_code)] Mmio,
        #[allow(dead_code)] Arc<PciDevice>,
        #[allow(dead_code)] BarRangeRecord,
    ),
    Anonymous(#[allow(dead_code)] Mmio),
    External,
    File(super::file_region::FileMap),
    /// A BAR: its mmap for the CPU, the device, and the dma-buf the IOAS maps (iommufd).
    BarDmaBuf(
        #[allow(dead_code)] Mmio,
        Arc<PciDevice>,
        #[allow(dead_code)] std::os::fd::OwnedFd,
        #[allow(dead_code)] BarRangeRecord,
    ),
    /// An imported dma-buf (kept open while registered).
    DmaBuf(#[allow(dead_code)] std::os::fd::OwnedFd),
}

/// A registered, IOMMU-mapped region: `[vaddr, vaddr+len)` is visible to devices at
/// `[iova, iova+len)`.
pub struct UbRegion {
    /// Id in the registry.
    pub id: RegionId,
    /// CPU address of the start.
    pub vaddr: *mut u8,
    /// Device (IOVA) address of the start.
    pub iova: u64,
    /// Length in bytes.
    pub len: usize,
    /// What backs it.
    pub kind: RegionKind,
    /// The pieces of the region, each one bus address range, when its bus addresses are not
    /// one range (no-IOMMU memory whose hugepages are physically scattered); empty otherwise.
    /// Pools and DMA slabs carve inside the pieces: [`UbRegion::iova_at`] gives the address.
    pub segments: Arc<[DmaSegment]>,
    /// NUMA node of the memory, when known.
    pub numa: Option<u32>,
    /// The DMA domain the region is mapped in: its IOVAs mean something only there.
    domain: DomainId,
    users: AtomicUsize,
    /// [`RegionOwner`] code, or OWNER_NONE.
    owner: AtomicU8,
    /// The region's IOMMU mapping: only the region unmaps it.
    mapping: Mutex<DmaMapping>,
    /// For a BAR imported as a dma-buf: the exporter's [`PciDevice::dmabuf_revocations`] when
    /// the dma-buf was exported (a later count means it was revoked).
    revocation_mark: u64,
    // Dropped after Drop::drop (and the mapping field) unmapped the IOVA range.
    _backing: Backing,
}

// SAFETY: the region only exposes its address; the memory it describes is shared with devices
// by design and every CPU access through it is unsafe or goes through an owning UbBuf/DmaMem.
unsafe impl Send for UbRegion {}
// SAFETY: as above; the counters are atomics.
unsafe impl Sync for UbRegion {}

impl std::fmt::Debug for UbRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UbRegion")
            .field("id", &self.id)
            .field("vaddr", &self.vaddr)
            .field("iova", &format_args!("{:#x}", self.iova))
            .field("len", &self.len)
            .field("kind", &self.kind)
            .field("numa", &self.numa)
            .field("domain", &self.domain)
            .field("users", &self.users())
            .field("owner", &self.owner())
            .finish()
    }
}

impl UbRegion {
    /// The registry's constructor: every field of the region plus what keeps it alive.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        id: RegionId,
        vaddr: *mut u8,
        len: usize,
        kind: RegionKind,
        numa: Option<u32>,
        mapping: DmaMapping,
        backing: Backing,
    ) -> UbRegion {
        let revocation_mark = match &backing {
            Backing::BarDmaBuf(_, dev, _, _) => dev.dmabuf_revocations(),
            _ => 0,
        };
        UbRegion {
            revocation_mark,
            id,
            vaddr,
            domain: mapping.domain().id(),
            iova: mapping.iova(),
            segments: mapping.segments().clone(),
            len,
            kind,
            numa,
            users: AtomicUsize::new(0),
            owner: AtomicU8::new(OWNER_NONE),
            mapping: Mutex::new(mapping),
            _backing: backing,
        }
    }

    fn mapping(&self) -> std::sync::MutexGuard<'_, DmaMapping> {
        // Every update of the mapping is one call that leaves it consistent.
        self.mapping.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// What keeps the memory mapped (the file regions' stamp and file live there).
    pub(crate) fn backing(&self) -> &Backing {
        &self._backing
    }

    /// True for a read-only region ([`RegionKind::File`]): devices may only read it, and the
    /// CPU may not write it (a write through its mapping is a SIGSEGV).
    #[inline]
    pub fn is_read_only(&self) -> bool {
        matches!(self.kind, RegionKind::File { .. })
    }

    /// True when the CPU may hold a Rust slice over the region's memory: host memory
    /// ([`RegionKind::Host`], [`RegionKind::External`]). False for a file region (the page
    /// cache, which another process may rewrite under a shared borrow or truncate, making a
    /// load SIGBUS), a BAR ([`RegionKind::DeviceBar`], [`RegionKind::BarWindow`]: device memory,
    /// reached with volatile accesses only) and a dma-buf (no CPU mapping). Blocks of the others
    /// are read and written with [`super::UbBuf::read_into`] and [`super::UbBuf::write_from`].
    #[inline]
    pub fn is_cpu_sliceable(&self) -> bool {
        matches!(self.kind, RegionKind::Host { .. } | RegionKind::External)
    }

    /// Pools and DMA allocations using the region (unregister is refused while non-zero).
    pub fn users(&self) -> usize {
        self.users.load(Ordering::Acquire)
    }

    /// True while the region holds its IOMMU mapping (its IOVA range is reserved for it).
    pub fn is_mapped(&self) -> bool {
        self.mapping().is_mapped()
    }

    /// What the region is carved into, if anything yet.
    pub fn owner(&self) -> Option<RegionOwner> {
        RegionOwner::from_code(self.owner.load(Ordering::Acquire))
    }

    /// Record `owner` as the region's single owner, or [`CoreError::RegionTaken`] when it
    /// already has one (nothing changes then). A driver that carves a region itself (e.g. NVMe
    /// submission queues in a Controller Memory Buffer) claims it as [`RegionOwner::DmaSlab`].
    pub fn claim(&self, owner: RegionOwner) -> Result<()> {
        if self.vaddr.is_null() {
            return Err(CoreError::InvalidArgument(format!(
                "UB region {} ({:?}) has no CPU mapping: it cannot back a {owner}; use its IOVA (region.iova) as a DMA target directly",
                self.id, self.kind
            )));
        }
        self.owner
            .compare_exchange(
                OWNER_NONE,
                owner.code(),
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .map(|_| ())
            .map_err(|cur| CoreError::RegionTaken {
                id: self.id,
                // cur is a valid code: only claim stores one.
                owner: RegionOwner::from_code(cur).unwrap_or(RegionOwner::Pool),
            })
    }

    /// Release the claim of `owner` (its pool or driver carving is gone).
    pub fn release(&self, owner: RegionOwner) {
        let _ = self.owner.compare_exchange(
            owner.code(),
            OWNER_NONE,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
    }

    /// Cut every device of the domain off this region's memory while the region keeps its
    /// IOVA range reserved (see [`DmaMapping::revoke`]): device DMA into it faults from now
    /// on; the IOVAs are freed only when the region goes. For fault injection and fencing.
    pub fn revoke_dma(&self) -> Result<()> {
        self.mapping().revoke()
    }

    /// The DMA domain the region is mapped in.
    #[inline]
    pub fn domain(&self) -> DomainId {
        self.domain
    }

    /// Whether a device of `device_domain` can reach the region, checked before I/O is queued
    /// into it: [`CoreError::ForeignDomain`] for a region mapped in another domain (its IOVAs
    /// mean nothing to the device, or name another buffer); [`CoreError::DmaBufRevoked`] for a
    /// BAR imported as a dma-buf after ubdirect revoked it (the exporter's memory decoding
    /// turned off or the device reset through its [`PciDevice`]); the kernel tells userspace
    /// nothing of a revocation, and iommufd never maps the dma-buf again. No syscall, no
    /// allocation: a few loads.
    #[inline]
    pub fn check_dma(&self, device_domain: DomainId) -> Result<()> {
        if self.domain != device_domain {
            return Err(CoreError::ForeignDomain {
                region: self.id,
                region_domain: self.domain,
                device_domain,
            });
        }
        match &self._backing {
            Backing::BarDmaBuf(_, dev, _, _)
                if dev.dmabuf_revocations() != self.revocation_mark =>
            {
                let bar = match self.kind {
                    RegionKind::DeviceBar { bar, .. } | RegionKind::BarWindow { bar, .. } => bar,
                    _ => 0,
                };
                Err(CoreError::DmaBufRevoked {
                    id: self.id,
                    device: dev.address(),
                    bar,
                })
            }
            _ => Ok(()),
        }
    }

    /// Whether a device reading the region reads the file as it is now, checked before a
    /// device is given a buffer to read (an NVMe write, a NIC transmit): for a file region, one
    /// fstat of its file compared with the registration (size, mtime, and whether the file
    /// still has a name), [`CoreError::FileChanged`] naming the file and what changed; the
    /// region's pinned pages are the file as it was. Any other region: Ok, no syscall.
    #[inline]
    pub fn check_file(&self) -> Result<()> {
        match &self._backing {
            Backing::File(m) => m.check(self.id),
            _ => Ok(()),
        }
    }

    /// True when `[iova, iova+len)` lies inside the region (inside one of its pieces, for a
    /// region in pieces).
    pub fn contains_iova(&self, iova: u64, len: usize) -> bool {
        self.offset_of_iova(iova, len).is_some()
    }

    /// The offset in the region of device addresses `[iova, iova+len)`, when they lie inside
    /// it (inside one piece, for a region in pieces).
    pub fn offset_of_iova(&self, iova: u64, len: usize) -> Option<usize> {
        crate::vfio::segments_offset_of(&self.segments, self.iova, self.len, iova, len)
    }

    /// The device address of byte `offset` of the region.
    #[inline]
    pub fn iova_at(&self, offset: usize) -> u64 {
        crate::vfio::segments_iova_at(&self.segments, self.iova, offset)
    }

    /// The bus-contiguous byte ranges of the region, in order (one range `[0, len)` unless
    /// the region is in pieces).
    pub fn contiguous_ranges(&self) -> Vec<std::ops::Range<usize>> {
        if self.segments.is_empty() {
            std::iter::once(0..self.len).collect()
        } else {
            self.segments
                .iter()
                .map(|g| g.offset..g.offset + g.len)
                .collect()
        }
    }

    pub(crate) fn add_user(&self) {
        self.users.fetch_add(1, Ordering::AcqRel);
    }

    pub(crate) fn remove_user(&self) {
        self.users.fetch_sub(1, Ordering::AcqRel);
    }

    /// Remove the IOMMU mapping now (idempotent).
    pub(crate) fn unmap(&self) -> Result<()> {
        self.mapping().unmap()
    }
}

impl Drop for UbRegion {
    fn drop(&mut self) {
        if let Err(e) = self.unmap() {
            tracing::error!(region = self.id, "unmapping UB region on drop failed: {e}");
        }
    }
}
