//! VFIO_IOMMU_MAP_DMA with READ permission only. vfio-ioctls 0.10 always asks for
//! READ | WRITE, so the read-only variant issues the ioctl itself on the container's fd.

use std::os::fd::AsRawFd;

use vfio_bindings::bindings::vfio::{vfio_iommu_type1_dma_map, VFIO_DMA_MAP_FLAG_READ};
use vfio_ioctls::VfioContainer;

/// `_IO(VFIO_TYPE, VFIO_BASE + 13)`: VFIO_TYPE is ';' (0x3b), VFIO_BASE 100.
const VFIO_IOMMU_MAP_DMA: libc::c_ulong = (0x3b << 8) | (100 + 13);

/// Map `[iova, iova+len)` -> `[vaddr, vaddr+len)` for device reads only. Errors carry the errno.
///
/// # Safety
/// The memory must stay mapped in this process until the range is unmapped from the container.
pub(crate) unsafe fn map_dma_read(
    c: &VfioContainer,
    iova: u64,
    len: usize,
    vaddr: *mut u8,
) -> Result<(), i32> {
    let arg = vfio_iommu_type1_dma_map {
        argsz: std::mem::size_of::<vfio_iommu_type1_dma_map>() as u32,
        flags: VFIO_DMA_MAP_FLAG_READ,
        vaddr: vaddr as u64,
        iova,
        size: len as u64,
    };
    // SAFETY: the ioctl reads `arg` (argsz bytes) and pins the caller's memory, which the
    // caller keeps mapped (this function's contract).
    let r = unsafe { libc::ioctl(c.as_raw_fd(), VFIO_IOMMU_MAP_DMA as _, &arg) };
    if r != 0 {
        return Err(std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ioctl_number_matches_the_kernel_header() {
        // linux/vfio.h: #define VFIO_IOMMU_MAP_DMA _IO(VFIO_TYPE, VFIO_BASE + 13) = 0x3b71.
        assert_eq!(VFIO_IOMMU_MAP_DMA, 0x3b71);
        assert_eq!(std::mem::size_of::<vfio_iommu_type1_dma_map>(), 32);
    }
}
