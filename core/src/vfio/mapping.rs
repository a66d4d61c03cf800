//! [`DmaMapping`]: the one owner of an IOMMU mapping of a [`DmaDomain`].

use std::sync::Arc;

use super::domain::DmaDomain;
use super::segments::DmaSegment;
use crate::error::Result;

/// Ownership of one IOMMU mapping (from [`DmaDomain::map`]). Only its holder can remove it
/// ([`DmaMapping::unmap`], or dropping it), so an IOVA range is never freed, and handed to
/// other memory, while the memory it translates to still counts on it.
///
/// There is no way to unmap a range by address: the domain's unmap is private.
///
/// ```compile_fail,E0624
/// use ubdirect_core::{vfio::DmaDomain, UbRegistry};
/// let d = DmaDomain::host_only();
/// let reg = UbRegistry::new(d.clone());
/// let r = reg.register_anonymous(4096, None).unwrap();
/// d.unmap(r.iova, r.len).unwrap(); // private: only the region's mapping can unmap it
/// ```
#[must_use = "dropping a DmaMapping unmaps it at once"]
pub struct DmaMapping {
    domain: Arc<DmaDomain>,
    iova: u64,
    len: usize,
    /// False once unmapped.
    live: bool,
    /// The physically contiguous pieces of no-IOMMU memory whose pages are scattered (empty:
    /// one range at `iova`).
    segments: Arc<[DmaSegment]>,
}

impl std::fmt::Debug for DmaMapping {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DmaMapping")
            .field("iova", &format_args!("{:#x}", self.iova))
            .field("len", &self.len)
            .field("live", &self.live)
            .finish()
    }
}

impl DmaMapping {
    pub(super) fn new(
        domain: Arc<DmaDomain>,
        iova: u64,
        len: usize,
        segments: Arc<[DmaSegment]>,
    ) -> DmaMapping {
        DmaMapping {
            domain,
            iova,
            len,
            live: true,
            segments,
        }
    }

    /// The device address of the start.
    pub fn iova(&self) -> u64 {
        self.iova
    }

    /// The pieces of the mapping, each one bus address range, when it is not one range: memory
    /// mapped on the no-IOMMU back end whose hugepages are physically scattered. Empty for
    /// every other mapping (bytes `[0, len)` are at `[iova, iova+len)`).
    pub fn segments(&self) -> &Arc<[DmaSegment]> {
        &self.segments
    }

    /// The device address of byte `offset` of the mapping (its piece's address plus the
    /// offset in it).
    pub fn iova_at(&self, offset: usize) -> u64 {
        super::segments::iova_at(&self.segments, self.iova, offset)
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false (a mapping is at least one IOMMU page).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// True until [`DmaMapping::unmap`] succeeded.
    pub fn is_mapped(&self) -> bool {
        self.live
    }

    /// The domain the mapping lives in.
    pub fn domain(&self) -> &Arc<DmaDomain> {
        &self.domain
    }

    /// Remove the mapping and free its IOVA range (idempotent). Quiesce every device that
    /// could still touch it first. On error the mapping stays in place (and owned).
    pub fn unmap(&mut self) -> Result<()> {
        if self.live {
            self.domain.unmap(self.iova, self.len)?;
            self.live = false;
        }
        Ok(())
    }

    /// Cut devices off the memory while keeping the IOVA range reserved: the IOMMU
    /// translation goes (a device DMA into the range faults from now on, also after the
    /// domain's devices reopen), but no other mapping can get these IOVAs until this one is
    /// unmapped or dropped. For fault injection, and for fencing off memory a misbehaving
    /// device may still target. Idempotent.
    pub fn revoke(&self) -> Result<()> {
        if self.live {
            self.domain.revoke(self.iova, self.len)?;
        }
        Ok(())
    }
}

impl Drop for DmaMapping {
    fn drop(&mut self) {
        if let Err(e) = self.unmap() {
            tracing::error!(
                iova = self.iova,
                len = self.len,
                "IOMMU unmap on drop failed: {e}"
            );
        }
    }
}
