//! Registering UB host regions with CUDA once (cuMemHostRegister PORTABLE | DEVICEMAP), so the
//! copy engines DMA straight out of the pool with no staging copy.

use std::sync::Arc;

use cudarc::driver::sys;
use ubdirect_core::UbRegion;

use crate::error::{drv, CudaError};
use crate::gpu::CudaGpu;

/// A host region registered with CUDA; unregistered on drop.
#[derive(Debug)]
pub struct HostRegistration {
    gpu: Arc<CudaGpu>,
    region: Arc<UbRegion>,
}

impl HostRegistration {
    /// Pin and register `region` with the GPU's context. Expensive (page-table work): do it
    /// once at start-up, never per transfer.
    pub fn new(gpu: &Arc<CudaGpu>, region: &Arc<UbRegion>) -> Result<HostRegistration, CudaError> {
        gpu.bind()?;
        let flags = sys::CU_MEMHOSTREGISTER_PORTABLE | sys::CU_MEMHOSTREGISTER_DEVICEMAP;
        // SAFETY: the region's [vaddr, vaddr+len) is mapped for as long as the Arc we keep lives;
        // unregistration happens in Drop before that Arc is released.
        unsafe { sys::cuMemHostRegister_v2(region.vaddr.cast(), region.len, flags) }
            .result()
            .map_err(drv("cuMemHostRegister"))?;
        Ok(HostRegistration {
            gpu: gpu.clone(),
            region: region.clone(),
        })
    }

    /// The registered region.
    pub fn region(&self) -> &Arc<UbRegion> {
        &self.region
    }
}

impl Drop for HostRegistration {
    fn drop(&mut self) {
        let _ = self.gpu.bind();
        // SAFETY: the pointer is the base address this object registered; no copy from it is in
        // flight because every sink that uses it drains its streams before dropping.
        let r = unsafe { sys::cuMemHostUnregister(self.region.vaddr.cast()) };
        if r != sys::CUresult::CUDA_SUCCESS {
            tracing::warn!("cuMemHostUnregister failed: {r:?}");
        }
    }
}

/// [`crate::HostPinner`] for file windows: `cuMemHostRegister(PORTABLE | READ_ONLY)`, so every
/// GPU's copy engines read the mapped page cache in place (one registration serves all GPUs).
#[derive(Debug)]
pub struct CudaHostPinner {
    gpu: Arc<CudaGpu>,
}

impl CudaHostPinner {
    /// A pinner registering through `gpu`'s context. Fails when the driver cannot register
    /// read-only memory (CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED = 0).
    pub fn new(gpu: &Arc<CudaGpu>) -> Result<CudaHostPinner, CudaError> {
        let ro = gpu
            .context()
            .attribute(
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED,
            )
            .map_err(drv("cuDeviceGetAttribute"))?;
        if ro == 0 {
            return Err(CudaError::Unsupported(format!(
                "{} cannot register read-only host memory, so file mappings cannot be read in place: read the file into the pool instead (the io_uring source, DirectMode::Off or DirectMode::Require)",
                gpu.name()
            )));
        }
        Ok(CudaHostPinner { gpu: gpu.clone() })
    }
}

impl crate::HostPinner for CudaHostPinner {
    fn pin(&self, ptr: *const u8, len: usize) -> Result<(), String> {
        self.gpu.bind().map_err(|e| e.to_string())?;
        let flags = sys::CU_MEMHOSTREGISTER_PORTABLE | sys::CU_MEMHOSTREGISTER_READ_ONLY;
        // SAFETY: [ptr, ptr+len) is a live read-only mapping owned by the calling FileWindow,
        // which calls `unpin` before unmapping it.
        unsafe { sys::cuMemHostRegister_v2(ptr as *mut _, len, flags) }
            .result()
            .map_err(|e| format!("cuMemHostRegister(READ_ONLY) of {len} bytes: {e:?}"))
    }

    fn unpin(&self, ptr: *const u8, _len: usize) {
        let _ = self.gpu.bind();
        // SAFETY: the base address `pin` registered; the window's holders drained their copies.
        let r = unsafe { sys::cuMemHostUnregister(ptr as *mut _) };
        if r != sys::CUresult::CUDA_SUCCESS {
            tracing::warn!("cuMemHostUnregister (file window) failed: {r:?}");
        }
    }
}
