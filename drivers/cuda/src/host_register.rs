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
