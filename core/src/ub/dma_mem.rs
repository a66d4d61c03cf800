//! [`DmaMem`]: driver-internal DMA memory (queues, PRP list pages, virtqueue rings), carved at
//! 4 KiB granularity from hugepage slabs registered once per registry, on the NUMA node of the
//! device that uses them.

use std::sync::Arc;

use ubdirect_hugepages::PageSize;

use super::region::{RegionOwner, UbRegion};
use super::registry::UbRegistry;
use crate::error::{CoreError, Result};
use crate::iova::IovaAllocator;

const PAGE: usize = 4096;
const SLAB: usize = 2 << 20;

/// The slabs of one registry (kept until the registry goes).
#[derive(Default)]
pub(crate) struct DmaSlabs {
    slabs: Vec<Slab>,
}

struct Slab {
    region: Arc<UbRegion>,
    /// The node the slab was asked for (None: no preference).
    numa: Option<u32>,
    /// Offsets within the region: one allocator per bus-contiguous piece (one for the whole
    /// region unless it is no-IOMMU memory in pieces), so no allocation spans two pieces.
    space: Vec<IovaAllocator>,
}

/// Offsets `[off, off+len)` aligned to `align` from the first piece with room.
fn alloc_in(space: &mut [IovaAllocator], len: u64, align: u64) -> Result<u64> {
    let mut last = None;
    for a in space.iter_mut() {
        match a.alloc(len, align) {
            Ok(off) => return Ok(off),
            Err(e) => last = Some(e),
        }
    }
    Err(CoreError::InvalidArgument(format!(
        "DMA memory of {len:#x} bytes does not fit one bus-contiguous piece of its slab ({last:?}): without an IOMMU a slab's hugepages can be scattered in physical memory; ask for at most 2 MiB at a time, or use 1 GiB hugepages"
    )))
}

impl Slab {
    /// Make `region` (fresh, registered in `registry`) a slab. On error it is unregistered.
    fn new(registry: &UbRegistry, region: Arc<UbRegion>, numa: Option<u32>) -> Result<Slab> {
        // A slab is carved by DmaMem alone, never pooled (the region is fresh: the claim
        // cannot fail, but a refusal must not leave the slab half set up).
        if let Err(e) = region.claim(RegionOwner::DmaSlab) {
            let _ = registry.unregister(region.id);
            return Err(e);
        }
        // The registry's own use: the slab can never be unregistered under us.
        region.add_user();
        // Carved inside the region's bus-contiguous pieces only (no-IOMMU memory in pieces),
        // so every allocation is one bus address range.
        let space = region
            .contiguous_ranges()
            .into_iter()
            .map(|r| IovaAllocator::new(std::slice::from_ref(&(r.start as u64..r.end as u64))))
            .collect();
        Ok(Slab {
            space,
            region,
            numa,
        })
    }
}

/// Zeroed, page-aligned, IOVA-contiguous DMA memory for a driver's own structures. Freed
/// (returned to its slab) on drop; the slab stays mapped for the registry's life.
pub struct DmaMem {
    registry: Arc<UbRegistry>,
    region: Arc<UbRegion>,
    offset: usize,
    len: usize,
}

// SAFETY: DmaMem exclusively owns its range of the slab; the pointer is only an address.
unsafe impl Send for DmaMem {}
// SAFETY: &DmaMem exposes only addresses; accesses through them are the driver's (unsafe) job.
unsafe impl Sync for DmaMem {}

impl std::fmt::Debug for DmaMem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DmaMem")
            .field("iova", &format_args!("{:#x}", self.iova()))
            .field("len", &self.len)
            .finish()
    }
}

impl DmaMem {
    /// `len` bytes (rounded up to 4 KiB), zeroed, from `registry`'s DMA slabs; a new 2 MiB
    /// hugepage slab (larger for large requests) is registered when none has room. Without
    /// free hugepages the slab falls back to 4 KiB anonymous memory (with a warning).
    ///
    /// The memory sits on the NUMA node of the devices open in the registry's domain when they
    /// all report the same one (the usual case: the controller whose rings these are); use
    /// [`DmaMem::alloc_on`] to name the node.
    pub fn alloc(registry: &Arc<UbRegistry>, len: usize) -> Result<DmaMem> {
        let numa = devices_node(registry);
        DmaMem::alloc_on(registry, len, numa)
    }

    /// As [`DmaMem::alloc`], from slabs on NUMA node `numa` (None: no preference), e.g.
    /// `dev.numa_node()` of the controller that reads the rings.
    pub fn alloc_on(registry: &Arc<UbRegistry>, len: usize, numa: Option<u32>) -> Result<DmaMem> {
        let len = len
            .checked_add(PAGE - 1)
            .map(|l| l & !(PAGE - 1))
            .filter(|&l| l > 0)
            .ok_or_else(|| CoreError::InvalidArgument(format!("DmaMem of {len} bytes")))?;
        let mut slabs = registry.dma.lock().unwrap_or_else(|p| p.into_inner());
        let mut found = None;
        for s in slabs
            .slabs
            .iter_mut()
            .filter(|s| numa.is_none() || s.numa == numa)
        {
            if let Ok(off) = alloc_in(&mut s.space, len as u64, PAGE as u64) {
                found = Some((s.region.clone(), off as usize));
                break;
            }
        }
        let (region, offset) = match found {
            Some(f) => f,
            None => {
                let size = len.div_ceil(SLAB) * SLAB;
                let region = match registry.register_hugepages(size, PageSize::Size2M, numa) {
                    Ok(r) => r,
                    Err(CoreError::HugePages(e)) => {
                        tracing::warn!("DmaMem slab falls back to 4 KiB pages: {e}");
                        registry.register_anonymous(size, numa)?
                    }
                    Err(e) => return Err(e),
                };
                let mut slab = Slab::new(registry, region, numa)?;
                let got = alloc_in(&mut slab.space, len as u64, PAGE as u64);
                let region = slab.region.clone();
                // Kept even when the request does not fit: smaller ones will.
                slabs.slabs.push(slab);
                let off = got?;
                (region, off as usize)
            }
        };
        region.add_user();
        drop(slabs);
        // SAFETY: [offset, offset+len) of the slab is ours alone now; nothing else aliases it.
        unsafe { std::ptr::write_bytes(region.vaddr.add(offset), 0, len) };
        Ok(DmaMem {
            registry: registry.clone(),
            region,
            offset,
            len,
        })
    }

    /// The device address of the start.
    pub fn iova(&self) -> u64 {
        self.region.iova_at(self.offset)
    }

    /// Length in bytes (a multiple of 4 KiB).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The CPU address of the start.
    pub fn as_ptr(&self) -> *mut u8 {
        self.region.vaddr.wrapping_add(self.offset)
    }

    /// The slab region this memory was carved from.
    pub fn region(&self) -> &Arc<UbRegion> {
        &self.region
    }
}

/// The NUMA node every device open in `registry`'s domain reports, if they agree.
fn devices_node(registry: &UbRegistry) -> Option<u32> {
    let mut nodes = registry
        .domain()
        .device_addresses()
        .into_iter()
        .map(crate::pci::numa_node);
    let first = nodes.next()??;
    nodes.all(|n| n == Some(first)).then_some(first)
}

impl Drop for DmaMem {
    fn drop(&mut self) {
        let mut slabs = self.registry.dma.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = slabs
            .slabs
            .iter_mut()
            .find(|s| Arc::ptr_eq(&s.region, &self.region))
        {
            for a in s.space.iter_mut() {
                if a.free(self.offset as u64, self.len as u64).is_ok() {
                    break;
                }
            }
        }
        self.region.remove_user();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vfio::DmaDomain;

    #[test]
    fn allocations_are_zeroed_aligned_and_disjoint() {
        let reg = UbRegistry::new(DmaDomain::host_only());
        let a = DmaMem::alloc(&reg, 100).unwrap();
        let b = DmaMem::alloc(&reg, 8192).unwrap();
        assert_eq!(a.len(), 4096);
        assert_eq!(a.iova() % 4096, 0);
        assert_eq!(a.as_ptr() as usize % 4096, 0);
        assert!(a.iova() + a.len() as u64 <= b.iova() || b.iova() + b.len() as u64 <= a.iova());
        assert_eq!(reg.iova_of(b.as_ptr()), Some(b.iova()));
        // SAFETY: a is ours, 4096 bytes.
        unsafe { std::ptr::write_bytes(a.as_ptr(), 0xff, 4096) };
        let off = a.iova();
        drop(a);
        let c = DmaMem::alloc(&reg, 4096).unwrap();
        assert_eq!(c.iova(), off, "freed range reused");
        // SAFETY: c is ours.
        let s = unsafe { std::slice::from_raw_parts(c.as_ptr(), 4096) };
        assert!(s.iter().all(|&x| x == 0), "reused memory is zeroed");
        assert_eq!(reg.regions().len(), 1, "one slab");
    }

    #[test]
    fn a_slab_in_pieces_hands_out_memory_inside_one_piece_each() {
        use crate::vfio::DmaSegment;
        let reg = UbRegistry::new(DmaDomain::host_only());
        // Two 2 MiB pieces far apart in bus addresses, as scattered no-IOMMU hugepages.
        let mb2 = 2 << 20;
        let r = reg
            .register_in_pieces(vec![
                DmaSegment {
                    offset: 0,
                    len: mb2,
                    iova: 0x8000_0000,
                },
                DmaSegment {
                    offset: mb2,
                    len: mb2,
                    iova: 0x2000_0000,
                },
            ])
            .unwrap();
        let slab = Slab::new(&reg, r.clone(), None).unwrap();
        reg.dma.lock().unwrap().slabs.push(slab);
        // 1.5 MiB, then 1 MiB: the second cannot follow the first in piece 0 and goes to
        // piece 1 instead of straddling the discontinuity.
        let a = DmaMem::alloc_on(&reg, 3 << 19, None).unwrap();
        let b = DmaMem::alloc_on(&reg, 1 << 20, None).unwrap();
        assert_eq!(a.region().id, r.id);
        assert_eq!(b.region().id, r.id);
        assert_eq!(a.iova(), 0x8000_0000);
        assert_eq!(b.iova(), 0x2000_0000, "in the second piece");
        assert_eq!(reg.iova_of(b.as_ptr()), Some(b.iova()));
        assert_eq!(
            reg.iova_of(b.as_ptr().wrapping_add(4097)),
            Some(0x2000_1001)
        );
        let (x, off) = reg.region_of_iova(0x2000_0010).unwrap();
        assert_eq!((x.id, off), (r.id, mb2 + 0x10));
        assert!(
            reg.region_of_iova(0x8000_0000 + mb2 as u64).is_none(),
            "between pieces"
        );
        drop((a, b));
    }

    #[test]
    fn slabs_follow_the_requested_node() {
        let reg = UbRegistry::new(DmaDomain::host_only());
        let any = DmaMem::alloc(&reg, 4096).unwrap();
        assert_eq!(any.region().numa, None, "no device: no preference");
        let n0 = DmaMem::alloc_on(&reg, 4096, Some(0)).unwrap();
        assert_eq!(n0.region().numa, Some(0));
        assert_ne!(n0.region().id, any.region().id, "a node-0 slab of its own");
        let n0b = DmaMem::alloc_on(&reg, 4096, Some(0)).unwrap();
        assert_eq!(n0b.region().id, n0.region().id, "node-0 slab reused");
        let any2 = DmaMem::alloc_on(&reg, 4096, None).unwrap();
        assert!(any2.region().id == any.region().id || any2.region().id == n0.region().id);
        assert_eq!(reg.regions().len(), 2);
    }

    #[test]
    fn slab_cannot_be_unregistered_and_large_requests_get_their_own() {
        let reg = UbRegistry::new(DmaDomain::host_only());
        let a = DmaMem::alloc(&reg, 4096).unwrap();
        assert!(matches!(
            reg.unregister(a.region().id),
            Err(CoreError::RegionBusy { .. })
        ));
        let big = DmaMem::alloc(&reg, 3 << 20).unwrap();
        assert_eq!(big.len(), 3 << 20);
        assert_eq!(reg.regions().len(), 2);
        assert!(DmaMem::alloc(&reg, 0).is_err());
        drop((a, big));
        let d = reg.domain().clone();
        drop(reg);
        assert_eq!(d.mapping_count(), 0, "slabs unmapped with the registry");
    }
}
