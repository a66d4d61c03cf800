//! [`UbRegistry`]: the regions of one DMA domain, with O(log n) lookups by IOVA and by CPU
//! address.

use std::collections::BTreeMap;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};

use ubdirect_hugepages::{HugeMem, PageSize};

use super::dma_mem::DmaSlabs;
use super::region::{Backing, RegionId, RegionKind, UbRegion};
use crate::error::{CoreError, Result};
use crate::mmio::Mmio;
use crate::pci::PciDevice;
use crate::vfio::DmaDomain;

const MIB2: usize = 2 << 20;

/// Which bytes of which BAR a region registers, and as what.
struct BarSpan {
    bar: u8,
    offset: u64,
    len: usize,
    kind: RegionKind,
}

/// The registry of DMA-able regions of one domain. Each region is mapped once at
/// registration; lookups are O(log n) in the number of regions.
pub struct UbRegistry {
    domain: Arc<DmaDomain>,
    next_id: AtomicU32,
    inner: RwLock<Inner>,
    pub(crate) dma: Mutex<DmaSlabs>,
}

#[derive(Default)]
struct Inner {
    by_id: BTreeMap<RegionId, Arc<UbRegion>>,
    by_iova: BTreeMap<u64, RegionId>,
    by_vaddr: BTreeMap<usize, RegionId>,
}

impl std::fmt::Debug for UbRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UbRegistry")
            .field("regions", &self.read().by_id.len())
            .finish()
    }
}

impl UbRegistry {
    /// An empty registry over `domain`.
    pub fn new(domain: Arc<DmaDomain>) -> Arc<UbRegistry> {
        Arc::new(UbRegistry {
            domain,
            next_id: AtomicU32::new(1),
            inner: RwLock::new(Inner::default()),
            dma: Mutex::new(DmaSlabs::default()),
        })
    }

    /// The domain regions are mapped in.
    pub fn domain(&self) -> &Arc<DmaDomain> {
        &self.domain
    }

    fn read(&self) -> RwLockReadGuard<'_, Inner> {
        self.inner.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, Inner> {
        self.inner.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Allocate `len` bytes (rounded up to the page size) of hugepages of `size` on `numa`,
    /// map them and register them.
    pub fn register_hugepages(
        &self,
        len: usize,
        size: PageSize,
        numa: Option<u32>,
    ) -> Result<Arc<UbRegion>> {
        let mem = HugeMem::alloc(len, size, numa)?;
        let (ptr, len) = (mem.as_ptr(), mem.len());
        let kind = RegionKind::Host {
            page_size: size.bytes(),
        };
        // iommufd: map the memfd by file (IOMMU_IOAS_MAP_FILE pins the hugetlb folios without
        // walking the process's page tables); a kernel that refuses it gets the map by address.
        if self.domain.backend_kind() == Some(crate::vfio::BackendKind::Iommufd) {
            let align = size.bytes() as usize;
            match self
                .domain
                .map_file_at(mem.memfd(), 0, len, align, true, Some(ptr))
            {
                Ok(mapping) => {
                    return Ok(self.insert_mapped(ptr, len, kind, numa, mapping, Backing::Huge(mem)))
                }
                Err(e) => tracing::info!(
                    "hugepage region of {len:#x} bytes: IOMMU_IOAS_MAP_FILE on its memfd refused ({e}); mapping it by address"
                ),
            }
        }
        // SAFETY: `mem` moves into the region, which unmaps the IOVA range before dropping it.
        unsafe {
            self.insert(
                ptr,
                len,
                size.bytes() as usize,
                kind,
                numa,
                Backing::Huge(mem),
            )
        }
    }

    /// Allocate `len` bytes (rounded up to 4 KiB) of ordinary anonymous memory, map and
    /// register it. For machines without hugepages (the kernel path, tests); prefer
    /// [`UbRegistry::register_hugepages`] for devices.
    pub fn register_anonymous(&self, len: usize, numa: Option<u32>) -> Result<Arc<UbRegion>> {
        let len = len
            .checked_add(4095)
            .map(|l| l & !4095)
            .filter(|&l| l > 0)
            .ok_or_else(|| {
                CoreError::InvalidArgument(format!("anonymous region of {len} bytes"))
            })?;
        let m = Mmio::anonymous(len)?;
        let ptr = m.as_ptr();
        let align = if len >= MIB2 { MIB2 } else { 4096 };
        // SAFETY: the mapping moves into the region, which unmaps the IOVA range first.
        unsafe {
            self.insert(
                ptr,
                len,
                align,
                RegionKind::Host { page_size: 4096 },
                numa,
                Backing::Anonymous(m),
            )
        }
    }

    /// Anonymous memory registered at the given bus-address pieces, as no-IOMMU memory whose
    /// hugepages are scattered (host tests of pools and DMA slabs over memory in pieces).
    #[cfg(test)]
    pub(crate) fn register_in_pieces(
        &self,
        pieces: Vec<crate::vfio::DmaSegment>,
    ) -> Result<Arc<UbRegion>> {
        let len = pieces.iter().map(|g| g.len).sum();
        let m = Mmio::anonymous(len)?;
        let ptr = m.as_ptr();
        // SAFETY: the memory moves into the region, which unmaps before dropping it.
        let mapping = unsafe { self.domain.map_in_pieces(ptr, len, pieces)? };
        Ok(self.insert_mapped(
            ptr,
            len,
            RegionKind::Host {
                page_size: MIB2 as u64,
            },
            None,
            mapping,
            Backing::Anonymous(m),
        ))
    }

    /// mmap BAR `bar` of `dev` through VFIO and map it into this domain (peer-to-peer: other
    /// devices in the domain can DMA into the BAR).
    ///
    /// Only prefetchable memory BARs of a device no driver holds are registered, and each BAR
    /// range once: a register BAR ([`CoreError::RegisterBar`]), a device a driver holds
    /// ([`CoreError::DeviceClaimed`]) or a range already registered
    /// ([`CoreError::BarRangeRegistered`]) is refused. While the region lives the device
    /// cannot be claimed by a driver.
    ///
    /// On the iommufd back end the BAR travels as a dma-buf: vfio-pci exports it
    /// (`VFIO_DEVICE_FEATURE_DMA_BUF`) and the IOAS maps it by file (`IOMMU_IOAS_MAP_FILE`);
    /// the CPU still uses the BAR's mmap. On type1 the BAR's mmap is mapped directly.
    pub fn register_bar(&self, dev: &Arc<PciDevice>, bar: u8) -> Result<Arc<UbRegion>> {
        self.refuse_bar_without_iommu(dev, bar)?;
        let access = dev.access()?;
        let m = access.map_bar(bar)?;
        if m.is_model() {
            return Err(CoreError::Unsupported {
                addr: dev.address(),
                what: "registering a BAR of a device model (no memory behind it)",
            });
        }
        if m.len() % 4096 != 0 {
            return Err(CoreError::BadBar {
                addr: dev.address(),
                bar,
                reason: format!(
                    "it is {} bytes: a UB region is made of whole 4 KiB IOMMU pages, so a BAR smaller than 4 KiB (or not a multiple of it) cannot be one",
                    m.len()
                ),
            });
        }
        if !dev.bar_is_prefetchable(bar)? {
            return Err(CoreError::RegisterBar {
                addr: dev.address(),
                bar,
            });
        }
        let len = m.len();
        let span = BarSpan {
            bar,
            offset: 0,
            len,
            kind: RegionKind::DeviceBar {
                device: dev.address(),
                bar,
            },
        };
        self.register_bar_range(dev, access, m, span)
    }

    /// Map `span` of the BAR (`m`: the whole BAR's mmap; the range is checked to lie inside
    /// it) and register it: on iommufd the BAR travels as a dma-buf exported by vfio-pci and
    /// mapped by file (`IOMMU_IOAS_MAP_FILE`), the CPU using the mmap; on type1 the mmap itself
    /// is mapped. The range goes on record in the device first (registered once).
    fn register_bar_range(
        &self,
        dev: &Arc<PciDevice>,
        access: crate::pci::DeviceAccess<'_>,
        m: Mmio,
        span: BarSpan,
    ) -> Result<Arc<UbRegion>> {
        let BarSpan {
            bar,
            offset,
            len,
            kind,
        } = span;
        // Callers check the range; a mistake here must not reach the IOMMU.
        if offset
            .checked_add(len as u64)
            .is_none_or(|e| e > m.len() as u64)
        {
            return Err(CoreError::InvalidArgument(format!(
                "BAR range [{offset:#x}, +{len:#x}) outside BAR{bar} ({:#x} bytes) of {}",
                m.len(),
                dev.address()
            )));
        }
        let record = dev.record_bar_range(bar, offset..offset + len as u64)?;
        let ptr = m.as_ptr().wrapping_add(offset as usize);
        let align = if len >= MIB2 && len % MIB2 == 0 && offset % MIB2 as u64 == 0 {
            MIB2
        } else {
            4096
        };
        if self.domain.backend_kind() == Some(crate::vfio::BackendKind::Iommufd) {
            let fd = access.export_bar_dmabuf(bar)?;
            let mapping =
                self.domain
                    .map_file_at(fd.as_fd(), offset, len, align, true, Some(ptr))?;
            return Ok(self.insert_mapped(
                ptr,
                len,
                kind,
                dev.numa_node(),
                mapping,
                Backing::BarDmaBuf(m, dev.clone(), fd, record),
            ));
        }
        // SAFETY: the BAR mapping (and the device) move into the region; the range lies in it.
        unsafe {
            self.insert(
                ptr,
                len,
                align,
                kind,
                dev.numa_node(),
                Backing::Bar(m, dev.clone(), record),
            )
        }
    }

    /// Device memory has no bus address a peer could safely use without an IOMMU: refused on
    /// the no-IOMMU back end, naming the BAR.
    fn refuse_bar_without_iommu(&self, dev: &PciDevice, bar: u8) -> Result<()> {
        if self.domain.backend_kind() == Some(crate::vfio::BackendKind::NoIommu) {
            return Err(crate::vfio::noiommu::device_memory_refusal(&format!(
                "BAR {bar} of {}",
                dev.address()
            )));
        }
        Ok(())
    }

    /// Import a dma-buf of `len` bytes (GPU memory exported by its driver, a device BAR
    /// exported by vfio-pci elsewhere) into the domain's IOAS and register it as a
    /// [`RegionKind::DmaBuf`] region: devices reach it at `region.iova`; it has no CPU
    /// mapping. Needs the iommufd back end and a kernel whose iommufd imports dma-bufs from
    /// that exporter; a refusal names the requirement and changes nothing.
    pub fn register_dmabuf(
        &self,
        fd: std::os::fd::OwnedFd,
        len: usize,
        numa: Option<u32>,
    ) -> Result<Arc<UbRegion>> {
        let align = if len >= MIB2 && len % MIB2 == 0 {
            MIB2
        } else {
            4096
        };
        let mapping = self.domain.map_file(fd.as_fd(), 0, len, align, true)?;
        Ok(self.insert_mapped(
            std::ptr::null_mut(),
            len,
            RegionKind::DmaBuf,
            numa,
            mapping,
            Backing::DmaBuf(fd),
        ))
    }

    /// mmap BAR `bar` of the device `claim` holds and register only `[offset, offset+len)` of
    /// it (both 4 KiB multiples, inside the BAR, not overlapping a registered range) as a
    /// [`RegionKind::BarWindow`]: device memory such as an NVMe Controller Memory Buffer, a DMA
    /// target for the other devices of the domain. For the driver holding the device. Bad
    /// arguments change nothing.
    pub fn register_bar_window(
        &self,
        claim: &crate::pci::DeviceClaim,
        bar: u8,
        offset: u64,
        len: u64,
    ) -> Result<Arc<UbRegion>> {
        let dev = claim.device();
        self.refuse_bar_without_iommu(dev, bar)?;
        let bar_len = dev.bar_len(bar)?;
        let end = offset.checked_add(len);
        if len == 0 || offset % 4096 != 0 || len % 4096 != 0 || end.is_none_or(|e| e > bar_len) {
            return Err(CoreError::InvalidArgument(format!(
                "BAR window [{offset:#x}, +{len:#x}) of BAR{bar} ({bar_len:#x} bytes) of {}: it must be non-empty, 4 KiB aligned and inside the BAR",
                dev.address()
            )));
        }
        let access = claim.access();
        let m = access.map_bar(bar)?;
        if m.is_model() {
            return Err(CoreError::Unsupported {
                addr: dev.address(),
                what: "registering a BAR window of a device model (no memory behind it)",
            });
        }
        let span = BarSpan {
            bar,
            offset,
            len: len as usize,
            kind: RegionKind::BarWindow {
                device: dev.address(),
                bar,
                offset,
            },
        };
        self.register_bar_range(dev, access, m, span)
    }

    /// Map and register memory the caller allocated.
    ///
    /// # Safety
    /// `[ptr, ptr+len)` must be page aligned, stay allocated and mapped until the region is
    /// unregistered and every `Arc<UbRegion>` of it is dropped, and devices may write it at any
    /// time while it is registered.
    pub unsafe fn register_external(
        &self,
        ptr: *mut u8,
        len: usize,
        numa: Option<u32>,
    ) -> Result<Arc<UbRegion>> {
        let align = if (ptr as usize) % MIB2 == 0 && len % MIB2 == 0 {
            MIB2
        } else {
            4096
        };
        // SAFETY: forwarded from this function's contract.
        unsafe {
            self.insert(
                ptr,
                len,
                align,
                RegionKind::External,
                numa,
                Backing::External,
            )
        }
    }

    /// # Safety
    /// As [`DmaDomain::map`]; `backing` keeps the memory alive. File regions are mapped
    /// read-only for devices.
    pub(super) unsafe fn insert(
        &self,
        ptr: *mut u8,
        len: usize,
        align: usize,
        kind: RegionKind,
        numa: Option<u32>,
        backing: Backing,
    ) -> Result<Arc<UbRegion>> {
        // SAFETY: forwarded from this function's contract.
        let mapping = unsafe {
            if matches!(kind, RegionKind::File { .. }) {
                self.domain.map_readonly(ptr, len, align)?
            } else {
                self.domain.map(ptr, len, align)?
            }
        };
        Ok(self.insert_mapped(ptr, len, kind, numa, mapping, backing))
    }

    /// Register a region whose IOMMU mapping is already made. A null `ptr` (no CPU mapping)
    /// is not indexed by address.
    fn insert_mapped(
        &self,
        ptr: *mut u8,
        len: usize,
        kind: RegionKind,
        numa: Option<u32>,
        mapping: crate::vfio::DmaMapping,
        backing: Backing,
    ) -> Arc<UbRegion> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let r = Arc::new(UbRegion::new(id, ptr, len, kind, numa, mapping, backing));
        let mut w = self.write();
        w.by_id.insert(id, r.clone());
        for piece in r.contiguous_ranges() {
            w.by_iova.insert(r.iova_at(piece.start), id);
        }
        if !ptr.is_null() {
            w.by_vaddr.insert(ptr as usize, id);
        }
        r
    }

    /// Unmap region `id` from the IOMMU and forget it. Refused while pools or DMA allocations
    /// use it. The memory itself is freed when the last `Arc<UbRegion>` goes.
    pub fn unregister(&self, id: RegionId) -> Result<()> {
        let mut w = self.write();
        let r = w
            .by_id
            .get(&id)
            .ok_or(CoreError::NoSuchRegion { id })?
            .clone();
        let users = r.users();
        if users > 0 {
            return Err(CoreError::RegionBusy { id, users });
        }
        r.unmap()?;
        w.by_id.remove(&id);
        for piece in r.contiguous_ranges() {
            w.by_iova.remove(&r.iova_at(piece.start));
        }
        if !r.vaddr.is_null() {
            w.by_vaddr.remove(&(r.vaddr as usize));
        }
        Ok(())
    }

    /// Register a use of `region` (a pool), failing if it is not (or no longer) registered here.
    pub(crate) fn add_user(&self, region: &Arc<UbRegion>) -> Result<()> {
        let r = self.read();
        match r.by_id.get(&region.id) {
            Some(x) if Arc::ptr_eq(x, region) => {
                region.add_user();
                Ok(())
            }
            _ => Err(CoreError::NoSuchRegion { id: region.id }),
        }
    }

    /// The region `id`.
    pub fn get(&self, id: RegionId) -> Option<Arc<UbRegion>> {
        self.read().by_id.get(&id).cloned()
    }

    /// Every registered region, by id.
    pub fn regions(&self) -> Vec<Arc<UbRegion>> {
        self.read().by_id.values().cloned().collect()
    }

    /// How many regions are registered (each one IOVA mapping in the domain): a leak check
    /// compares it with the count taken before a run.
    pub fn region_count(&self) -> usize {
        self.read().by_id.len()
    }

    /// The region holding `iova` and the offset of `iova` in it.
    pub fn region_of_iova(&self, iova: u64) -> Option<(Arc<UbRegion>, usize)> {
        let r = self.read();
        let (_, id) = r.by_iova.range(..=iova).next_back()?;
        let reg = r.by_id.get(id)?;
        reg.offset_of_iova(iova, 1).map(|off| (reg.clone(), off))
    }

    /// The IOVA devices use for CPU address `vaddr`, if it lies in a registered region.
    pub fn iova_of(&self, vaddr: *const u8) -> Option<u64> {
        let va = vaddr as usize;
        let r = self.read();
        let (&start, id) = r.by_vaddr.range(..=va).next_back()?;
        let reg = r.by_id.get(id)?;
        (va - start < reg.len).then(|| reg.iova_at(va - start))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn region_count_counts_registered_regions_until_unregistered() {
        let reg = UbRegistry::new(DmaDomain::host_only());
        assert_eq!(reg.region_count(), 0);
        let r = reg.register_anonymous(1 << 16, None).unwrap();
        assert_eq!(reg.region_count(), 1);
        reg.unregister(r.id).unwrap();
        assert_eq!(reg.region_count(), 0);
    }

    #[test]
    fn a_dmabuf_needs_iommufd_and_a_refusal_changes_nothing() {
        let reg = UbRegistry::new(DmaDomain::host_only());
        let f = std::fs::File::open("/proc/self/exe").unwrap();
        let e = reg
            .register_dmabuf(std::os::fd::OwnedFd::from(f), 1 << 21, None)
            .unwrap_err();
        let m = e.to_string();
        assert!(m.contains("needs the iommufd back end"), "{m}");
        assert!(reg.regions().is_empty());
        assert_eq!(reg.domain().mapping_count(), 0);
    }

    #[test]
    fn a_region_without_cpu_mapping_is_found_by_iova_and_never_carved() {
        let reg = UbRegistry::new(DmaDomain::host_only());
        let mem = Mmio::anonymous(1 << 16).unwrap();
        // SAFETY: mem outlives the mapping (the region is dropped first, below).
        let mapping = unsafe { reg.domain().map(mem.as_ptr(), 1 << 16, 4096) }.unwrap();
        let r = reg.insert_mapped(
            std::ptr::null_mut(),
            1 << 16,
            RegionKind::DmaBuf,
            None,
            mapping,
            Backing::External,
        );
        assert_eq!(
            reg.region_of_iova(r.iova + 5).map(|(x, o)| (x.id, o)),
            Some((r.id, 5))
        );
        assert_eq!(reg.iova_of(std::ptr::null()), None);
        let e = r
            .claim(super::super::region::RegionOwner::Pool)
            .unwrap_err();
        assert!(e.to_string().contains("has no CPU mapping"), "{e}");
        assert_eq!(r.owner(), None);
        reg.unregister(r.id).unwrap();
        drop(r);
        assert_eq!(reg.domain().mapping_count(), 0);
    }

    #[test]
    fn lookups_find_regions_and_offsets() {
        let reg = UbRegistry::new(DmaDomain::host_only());
        let a = reg.register_anonymous(3 * 4096, None).unwrap();
        let b = reg.register_anonymous(5 * 4096, Some(0)).unwrap();
        assert_eq!(reg.domain().mapping_count(), 2);
        assert_eq!(reg.iova_of(a.vaddr), Some(a.iova));
        assert_eq!(reg.iova_of(b.vaddr.wrapping_add(4097)), Some(b.iova + 4097));
        // One past b's end is outside b: nothing, or a when mmap placed a right after b.
        let past = b.vaddr.wrapping_add(5 * 4096);
        let expect = (past == a.vaddr).then_some(a.iova);
        assert_eq!(reg.iova_of(past), expect);
        let (r, off) = reg.region_of_iova(a.iova + 8191).unwrap();
        assert_eq!((r.id, off), (a.id, 8191));
        assert!(reg.region_of_iova(a.iova + 3 * 4096).map(|(r, _)| r.id) != Some(a.id));
        assert!(reg.region_of_iova(0).is_none());
        assert_eq!(b.numa, Some(0));
        assert_eq!(b.kind, RegionKind::Host { page_size: 4096 });
    }

    #[test]
    fn unregister_unmaps_and_refuses_busy_or_unknown() {
        let reg = UbRegistry::new(DmaDomain::host_only());
        let a = reg.register_anonymous(4096, None).unwrap();
        reg.add_user(&a).unwrap();
        let e = reg.unregister(a.id).unwrap_err();
        assert!(matches!(e, CoreError::RegionBusy { users: 1, .. }), "{e}");
        assert_eq!(reg.domain().mapping_count(), 1, "refusal changed nothing");
        a.remove_user();
        reg.unregister(a.id).unwrap();
        assert!(!a.is_mapped());
        assert_eq!(reg.domain().mapping_count(), 0);
        assert!(matches!(
            reg.unregister(a.id),
            Err(CoreError::NoSuchRegion { .. })
        ));
        assert!(reg.add_user(&a).is_err(), "no new users after unregister");
        assert_eq!(reg.iova_of(a.vaddr), None);
    }

    #[test]
    fn a_mapped_regions_iovas_are_never_handed_to_another() {
        let d = DmaDomain::host_only();
        let reg = UbRegistry::new(d.clone());
        let a = reg.register_anonymous(8192, None).unwrap();
        // The only ways to take a region's IOMMU translation away leave its IOVAs reserved.
        a.revoke_dma().unwrap();
        assert!(a.is_mapped());
        let b = reg.register_anonymous(8192, None).unwrap();
        assert!(
            b.iova >= a.iova + a.len as u64 || b.iova + b.len as u64 <= a.iova,
            "b {:#x} overlaps a {:#x}",
            b.iova,
            a.iova
        );
        reg.unregister(a.id).unwrap();
        drop(a);
        assert!(b.is_mapped());
        assert_eq!(d.mapping_count(), 1, "a's drop left b's mapping alone");
        assert_eq!(reg.region_of_iova(b.iova).map(|(r, _)| r.id), Some(b.id));
        let c = reg.register_anonymous(8192, None).unwrap();
        assert!(c.iova + c.len as u64 <= b.iova || c.iova >= b.iova + b.len as u64);
        assert_eq!(d.mapping_count(), 2);
    }

    #[test]
    fn dropping_the_registry_unmaps_everything() {
        let d = DmaDomain::host_only();
        let reg = UbRegistry::new(d.clone());
        reg.register_anonymous(4096, None).unwrap();
        reg.register_anonymous(8192, None).unwrap();
        assert_eq!(d.mapping_count(), 2);
        drop(reg);
        assert_eq!(d.mapping_count(), 0);
    }

    #[test]
    fn external_memory_registers_once() {
        let reg = UbRegistry::new(DmaDomain::host_only());
        let m = Mmio::anonymous(1 << 16).unwrap();
        // SAFETY: m outlives the registry's use (the region is unregistered before m drops).
        let r = unsafe { reg.register_external(m.as_ptr(), 1 << 16, None) }.unwrap();
        assert_eq!(r.kind, RegionKind::External);
        // SAFETY: as above; refused anyway.
        let again = unsafe { reg.register_external(m.as_ptr().wrapping_add(4096), 4096, None) };
        assert!(matches!(again, Err(CoreError::AlreadyMapped { .. })));
        reg.unregister(r.id).unwrap();
        drop(r);
    }

    proptest! {
        #[test]
        fn every_byte_maps_back(sizes in proptest::collection::vec(1usize..8, 1..12), probes in proptest::collection::vec(any::<prop::sample::Index>(), 1..64)) {
            let reg = UbRegistry::new(DmaDomain::host_only());
            let regions: Vec<_> = sizes.iter().map(|&p| reg.register_anonymous(p * 4096, None).unwrap()).collect();
            for p in probes {
                let r = &regions[p.index(regions.len())];
                let off = p.index(r.len);
                let iova = reg.iova_of(r.vaddr.wrapping_add(off)).unwrap();
                prop_assert_eq!(iova, r.iova + off as u64);
                let (back, o) = reg.region_of_iova(iova).unwrap();
                prop_assert_eq!(back.id, r.id);
                prop_assert_eq!(o, off);
            }
        }
    }
}
