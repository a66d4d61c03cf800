//! The IOMMU back ends behind a [`super::DmaDomain`]: a VFIO type1v2 container, an iommufd
//! IOAS (devices through their vfio cdev), or none (host-only: IOVAs are bookkeeping for the
//! kernel io_uring path, tests and benchmarks).

use std::path::Path;
use std::sync::Arc;

use std::os::fd::BorrowedFd;

use vfio_ioctls::{VfioContainer, VfioDevice, VfioError, VfioIommufd, VfioOps};

use super::iommufd;
use super::noiommu_group::NoIommuContainer;
use super::select::BackendKind;

/// An IOMMU back end.
pub(crate) enum Backend {
    /// A VFIO type1v2 container (the IOMMU is set up when the first group joins).
    Type1(Arc<VfioContainer>),
    /// An iommufd IOAS; it outlives its devices (mappings stay when the last one closes).
    Iommufd(Arc<VfioIommufd>),
    /// No IOMMU: maps only allocate IOVAs; no device can be opened.
    HostOnly,
    /// vfio's unsafe no-IOMMU mode: nothing to program; a mapping's IOVA is the memory's
    /// physical address (chosen by the domain, see `super::noiommu_group`).
    NoIommu(Arc<NoIommuContainer>),
}

impl Backend {
    /// The back end's kind (None: host-only).
    pub(crate) fn kind(&self) -> Option<BackendKind> {
        match self {
            Backend::Type1(_) => Some(BackendKind::Type1),
            Backend::Iommufd(_) => Some(BackendKind::Iommufd),
            Backend::NoIommu(_) => Some(BackendKind::NoIommu),
            Backend::HostOnly => None,
        }
    }

    /// Program `[iova, iova+len)` -> `[vaddr, vaddr+len)`. Errors carry the errno.
    ///
    /// # Safety
    /// The memory must stay mapped until [`Backend::unmap`] of the same range succeeds.
    pub(crate) unsafe fn map(&self, iova: u64, len: usize, vaddr: *mut u8) -> Result<(), i32> {
        match self {
            // SAFETY: forwarded from the caller's contract.
            Backend::Type1(c) => unsafe { c.vfio_dma_map(iova, len, vaddr) }.map_err(errno),
            Backend::Iommufd(i) => {
                // SAFETY: forwarded from the caller's contract.
                unsafe { i.vfio_dma_map(iova, len, vaddr) }.map_err(iommufd::vfio_errno)
            }
            Backend::HostOnly | Backend::NoIommu(_) => Ok(()),
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
            // SAFETY: forwarded from the caller's contract.
            Backend::Iommufd(i) => unsafe { iommufd::map_readonly(i, iova, len, vaddr) },
            Backend::HostOnly | Backend::NoIommu(_) => Ok(()),
        }
    }

    /// Remove the translation of `[iova, iova+len)`.
    pub(crate) fn unmap(&self, iova: u64, len: usize) -> Result<(), i32> {
        match self {
            Backend::Type1(c) => c.vfio_dma_unmap(iova, len).map_err(errno),
            Backend::Iommufd(i) => i.vfio_dma_unmap(iova, len).map_err(iommufd::vfio_errno),
            Backend::HostOnly | Backend::NoIommu(_) => Ok(()),
        }
    }

    /// Program `[iova, iova+len)` -> bytes `[offset, offset+len)` of the file `fd` (a memfd or
    /// a dma-buf) with `IOMMU_IOAS_MAP_FILE`; the IOAS holds its own reference to the file.
    /// Only iommufd can: None elsewhere.
    pub(crate) fn map_file(
        &self,
        iova: u64,
        len: usize,
        fd: BorrowedFd<'_>,
        offset: u64,
        writeable: bool,
    ) -> Option<Result<(), i32>> {
        use std::os::fd::AsRawFd;
        match self {
            Backend::Iommufd(i) => Some(
                i.ioas()
                    .map_file(fd.as_raw_fd(), offset, len as u64, iova, writeable)
                    .map_err(iommufd::errno),
            ),
            Backend::Type1(_) | Backend::HostOnly | Backend::NoIommu(_) => None,
        }
    }

    /// Open a device through this back end (adds its group on first use); None for the
    /// host-only and no-IOMMU back ends (the latter opens its own device type).
    pub(crate) fn open_device(&self, sysfs: &Path) -> Option<Result<VfioDevice, VfioError>> {
        match self {
            Backend::Type1(c) => {
                let ops: Arc<dyn VfioOps> = c.clone();
                Some(VfioDevice::new(sysfs, ops, false))
            }
            Backend::Iommufd(i) => {
                let ops: Arc<dyn VfioOps> = i.clone();
                Some(VfioDevice::new(sysfs, ops, true))
            }
            Backend::HostOnly | Backend::NoIommu(_) => None,
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

/// A device opened through a back end: vfio-ioctls' device (type1, iommufd), or the no-IOMMU
/// back end's own.
pub(crate) enum OpenedDevice {
    /// Opened through a type1 container or an iommufd IOAS.
    Vfio(VfioDevice),
    /// Opened through its vfio no-IOMMU group.
    NoIommu(super::noiommu_group::NoIommuDevice),
}
