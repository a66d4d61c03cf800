//! [`UbRegion`]: one DMA-mapped memory region.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use ubdirect_hugepages::HugeMem;

use crate::error::Result;
use crate::mmio::Mmio;
use crate::pci::{PciAddress, PciDevice};
use crate::vfio::DmaDomain;

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
    /// Memory the caller allocated and keeps alive.
    External,
}

/// What keeps a region's memory mapped in this process.
pub(crate) enum Backing {
    Huge(#[allow(dead_code)] HugeMem),
    Bar(#[allow(dead_code)] Mmio, #[allow(dead_code)] Arc<PciDevice>),
    Anonymous(#[allow(dead_code)] Mmio),
    External,
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
    /// NUMA node of the memory, when known.
    pub numa: Option<u32>,
    users: AtomicUsize,
    mapped: AtomicBool,
    domain: Arc<DmaDomain>,
    // Dropped after Drop::drop has unmapped the IOVA range.
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
            .field("users", &self.users())
            .finish()
    }
}

impl UbRegion {
    /// The registry's constructor: every field of the region plus what keeps it alive.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        id: RegionId,
        vaddr: *mut u8,
        iova: u64,
        len: usize,
        kind: RegionKind,
        numa: Option<u32>,
        domain: Arc<DmaDomain>,
        backing: Backing,
    ) -> UbRegion {
        UbRegion {
            id,
            vaddr,
            iova,
            len,
            kind,
            numa,
            users: AtomicUsize::new(0),
            mapped: AtomicBool::new(true),
            domain,
            _backing: backing,
        }
    }

    /// Pools and DMA allocations using the region (unregister is refused while non-zero).
    pub fn users(&self) -> usize {
        self.users.load(Ordering::Acquire)
    }

    /// True while the region is mapped in the IOMMU.
    pub fn is_mapped(&self) -> bool {
        self.mapped.load(Ordering::Acquire)
    }

    /// True when `[iova, iova+len)` lies inside the region.
    pub fn contains_iova(&self, iova: u64, len: usize) -> bool {
        iova >= self.iova
            && iova
                .checked_add(len as u64)
                .is_some_and(|e| e <= self.iova + self.len as u64)
    }

    pub(crate) fn add_user(&self) {
        self.users.fetch_add(1, Ordering::AcqRel);
    }

    pub(crate) fn remove_user(&self) {
        self.users.fetch_sub(1, Ordering::AcqRel);
    }

    /// Remove the IOMMU mapping now (idempotent).
    pub(crate) fn unmap(&self) -> Result<()> {
        if self.mapped.load(Ordering::Acquire) {
            self.domain.unmap(self.iova, self.len)?;
            self.mapped.store(false, Ordering::Release);
        }
        Ok(())
    }
}

impl Drop for UbRegion {
    fn drop(&mut self) {
        if let Err(e) = self.unmap() {
            tracing::error!(region = self.id, "unmapping UB region on drop failed: {e}");
        }
    }
}
