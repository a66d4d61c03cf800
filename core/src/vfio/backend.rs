//! The IOMMU back ends behind a [`super::DmaDomain`]: a VFIO type1v2 container, or none
//! (host-only: IOVAs are bookkeeping for the kernel io_uring path, tests and benchmarks).
//! An iommufd IOAS back end slots in here as a third variant.

use std::path::Path;
use std::sync::Arc;

use vfio_ioctls::{VfioContainer, VfioDevice, VfioError, VfioOps};

/// An IOMMU back end.
pub(crate) enum Backend {
    /// A VFIO type1v2 container (the IOMMU is set up when the first group joins).
    Type1(Arc<VfioContainer>),
    /// No IOMMU: maps only allocate IOVAs; no device can be opened.
    HostOnly,
}

impl Backend {
    /// Program `[iova, iova+len)` -> `[vaddr, vaddr+len)`. Errors carry the errno.
    ///
    /// # Safety
    /// The memory must stay mapped until [`Backend::unmap`] of the same range succeeds.
    pub(crate) unsafe fn map(&self, iova: u64, len: usize, vaddr: *mut u8) -> Result<(), i32> {
        match self {
            // SAFETY: forwarded from the caller's contract.
            Backend::Type1(c) => unsafe { c.vfio_dma_map(iova, len, vaddr) }.map_err(errno),
            Backend::HostOnly => Ok(()),
        }
    }

    /// Program `[iova, iova+len)` -> `[vaddr, vaddr+len)` with READ permission only: devices
    /// may read the memory; a device write into the range faults in the IOMMU. The memory
    /// need not be writable by the process (VFIO pins it without FOLL_WRITE).
    ///
    /// # Safety
    /// As [`Backend::map`].
    pub(crate) unsafe fn map_readonly(
        &self,
        iova: u64,
        len: usize,
        vaddr: *mut u8,
    ) -> Result<(), i32> {
        match self {
            // SAFETY: forwarded from the caller's contract.
            Backend::Type1(c) => unsafe {
                super::readonly_map::map_dma_read(c.as_ref(), iova, len, vaddr)
            },
            Backend::HostOnly => Ok(()),
        }
    }

    /// Remove the translation of `[iova, iova+len)`.
    pub(crate) fn unmap(&self, iova: u64, len: usize) -> Result<(), i32> {
        match self {
            Backend::Type1(c) => c.vfio_dma_unmap(iova, len).map_err(errno),
            Backend::HostOnly => Ok(()),
        }
    }

    /// Open a device through this back end (adds its group on first use).
    pub(crate) fn open_device(&self, sysfs: &Path) -> Option<Result<VfioDevice, VfioError>> {
        match self {
            Backend::Type1(c) => {
                let ops: Arc<dyn VfioOps> = c.clone();
                Some(VfioDevice::new(sysfs, ops, false))
            }
            Backend::HostOnly => None,
        }
    }
}

/// The errno inside a vfio-ioctls map/unmap error (EIO when it carries none).
fn errno(e: VfioError) -> i32 {
    match e {
        VfioError::IommuDmaMap(s) | VfioError::IommuDmaUnmap(s) => s.errno(),
        VfioError::InvalidDmaUnmapSize => libc::EINVAL,
        _ => libc::EIO,
    }
}
