//! Device memory as dma-bufs: vfio-pci exports a BAR with `VFIO_DEVICE_FEATURE_DMA_BUF`
//! (vfio-ioctls' `VfioDevice::export_dma_buf`), which an iommufd IOAS imports with
//! `IOMMU_IOAS_MAP_FILE` ([`super::DmaDomain::map_file`]).

use std::os::fd::OwnedFd;

use vfio_ioctls::{VfioDevice, VfioRegionDmaRange};

use crate::error::{CoreError, Result};
use crate::pci::PciAddress;

/// Export bytes `[0, len)` of BAR `bar` of `dev` as a dma-buf (O_RDWR | O_CLOEXEC). Errors
/// name the kernel requirement when vfio-pci cannot export.
pub(crate) fn export_bar(dev: &VfioDevice, addr: PciAddress, bar: u8, len: u64) -> Result<OwnedFd> {
    let range = [VfioRegionDmaRange {
        offset: 0,
        length: len,
    }];
    let flags = (libc::O_RDWR | libc::O_CLOEXEC) as u32;
    match dev.export_dma_buf(u32::from(bar), &range, flags) {
        Ok(Some(f)) => Ok(OwnedFd::from(f)),
        Ok(None) => Err(CoreError::Backend {
            backend: "iommufd",
            reason: format!("vfio-pci does not export BAR {bar} of {addr} as a dma-buf (VFIO_DEVICE_FEATURE_DMA_BUF not supported)"),
            fix: "boot a kernel with CONFIG_VFIO_PCI_DMABUF (Linux 6.19+, needs CONFIG_PCI_P2PDMA and CONFIG_DMA_SHARED_BUFFER), or use UBD_IOMMU_BACKEND=type1, which maps the BAR's mmap".into(),
        }),
        Err(e) => Err(CoreError::Backend {
            backend: "iommufd",
            reason: format!("exporting BAR {bar} of {addr} ({len:#x} bytes) as a dma-buf failed: {e}"),
            fix: "the BAR must be a memory BAR with memory decoding on (not reset or disabled), and the kernel needs CONFIG_VFIO_PCI_DMABUF with CONFIG_PCI_P2PDMA; or use UBD_IOMMU_BACKEND=type1".into(),
        }),
    }
}
