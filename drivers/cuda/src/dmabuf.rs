//! GPU memory exported as a dma-buf (cuMemGetHandleForAddressRange), the way GPU memory would
//! become a UB region, and the plain statement of why a type1 VFIO container cannot take it.

use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::Arc;

use cudarc::driver::{result, sys};

use crate::error::{drv, CudaError};
use crate::gpu::CudaGpu;

/// Alignment the export needs (host page granularity; 2 MiB suits the GPU's large pages).
const EXPORT_ALIGN: usize = 2 << 20;

/// Device memory with a dma-buf file descriptor for it.
#[derive(Debug)]
pub struct GpuDmaBuf {
    gpu: Arc<CudaGpu>,
    dptr: sys::CUdeviceptr,
    len: usize,
    fd: OwnedFd,
}

impl GpuDmaBuf {
    /// Allocate `len` bytes (rounded up to 2 MiB) on `gpu` and export them as a dma-buf.
    pub fn export(gpu: &Arc<CudaGpu>, len: usize) -> Result<GpuDmaBuf, CudaError> {
        if !gpu.dma_buf_supported() {
            return Err(CudaError::Unsupported(format!(
                "{} cannot export memory as dma-buf (CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED = 0: needs the open kernel modules and a recent driver)",
                gpu.name()
            )));
        }
        let len = len.max(1).next_multiple_of(EXPORT_ALIGN);
        gpu.bind()?;
        // SAFETY: plain allocation in the bound context; freed in Drop.
        let dptr = unsafe { result::malloc_sync(len) }.map_err(drv("cuMemAlloc"))?;
        let mut fd: i32 = -1;
        // SAFETY: the driver writes one int (the fd) through the handle pointer; the range is
        // the allocation just made.
        let r = unsafe {
            sys::cuMemGetHandleForAddressRange(
                (&mut fd as *mut i32).cast(),
                dptr,
                len,
                sys::CUmemRangeHandleType::CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
                0,
            )
        }
        .result();
        if let Err(e) = r {
            // SAFETY: our allocation, not exported.
            unsafe { result::free_sync(dptr) }.ok();
            return Err(CudaError::Driver {
                call: "cuMemGetHandleForAddressRange(DMA_BUF_FD)",
                err: e,
            });
        }
        // SAFETY: the driver returned a fresh file descriptor that we now own.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(GpuDmaBuf {
            gpu: gpu.clone(),
            dptr,
            len,
            fd,
        })
    }

    /// The dma-buf file descriptor.
    pub fn fd(&self) -> &OwnedFd {
        &self.fd
    }

    /// Device address of the memory.
    pub fn device_ptr(&self) -> u64 {
        self.dptr
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Never empty (at least 2 MiB).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Why this memory cannot become a UB region in the current DMA domain: the answer every
    /// caller gets until the iommufd back end exists.
    pub fn vfio_type1_limitation(&self) -> CudaError {
        CudaError::Unsupported(format!(
            "GPU memory exported as dma-buf (fd, {} bytes) cannot be mapped into a VFIO type1 container: \
             VFIO_IOMMU_MAP_DMA only takes a process virtual address backed by pinnable pages, and a \
             dma-buf is neither (NVIDIA dma-bufs cannot even be mmapped). Importing a dma-buf into an \
             IOMMU domain needs the iommufd back end (UbRegistry::register_dmabuf, IOMMU_IOAS_MAP_FILE), \
             and Linux 7.3's iommufd imports dma-bufs from vfio-pci only, so GPU memory is refused there too. \
             Today: DMA into GPU memory through a GPU BAR window bound to vfio-pci, or copy from the \
             host pool with the CUDA sink (CudaSink).",
            self.len
        ))
    }
}

impl Drop for GpuDmaBuf {
    fn drop(&mut self) {
        let _ = self.gpu.bind();
        // SAFETY: our allocation; the fd is closed after (field drop), which the driver allows.
        unsafe { result::free_sync(self.dptr) }.ok();
    }
}
