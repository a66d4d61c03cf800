//! [`CudaGpu`]: one GPU's primary context, opened only after libcuda is known to load.

use std::sync::Arc;

use cudarc::driver::sys::CUdevice_attribute as Attr;
use cudarc::driver::CudaContext;

use crate::error::{drv, CudaError};
use crate::loader::driver_available;

/// An opened GPU (its primary context).
#[derive(Debug)]
pub struct CudaGpu {
    ctx: Arc<CudaContext>,
}

impl CudaGpu {
    /// Open GPU `ordinal`. A clear error when there is no driver or no such GPU.
    pub fn open(ordinal: usize) -> Result<Arc<CudaGpu>, CudaError> {
        driver_available()?;
        let count = CudaContext::device_count().map_err(drv("cuInit/cuDeviceGetCount"))?;
        let count = usize::try_from(count).unwrap_or(0);
        if ordinal >= count {
            return Err(CudaError::NoDevice { ordinal, count });
        }
        let ctx = CudaContext::new(ordinal).map_err(drv("cuDevicePrimaryCtxRetain"))?;
        Ok(Arc::new(CudaGpu { ctx }))
    }

    /// How many GPUs the driver sees (0 without a driver).
    pub fn count() -> usize {
        if driver_available().is_err() {
            return 0;
        }
        CudaContext::device_count()
            .map(|c| c.max(0) as usize)
            .unwrap_or(0)
    }

    /// The cudarc context.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// Make this GPU's context current on the calling thread.
    pub fn bind(&self) -> Result<(), CudaError> {
        self.ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))
    }

    /// The GPU's name ("NVIDIA H200").
    pub fn name(&self) -> String {
        self.ctx.name().unwrap_or_else(|_| "unknown GPU".into())
    }

    /// Compute capability (major, minor).
    pub fn compute_capability(&self) -> Result<(i32, i32), CudaError> {
        self.ctx
            .compute_capability()
            .map_err(drv("cuDeviceGetAttribute"))
    }

    /// PCI address "dddd:bb:dd.0" of the GPU.
    pub fn pci_address(&self) -> Result<String, CudaError> {
        let a = |at| self.ctx.attribute(at).map_err(drv("cuDeviceGetAttribute"));
        let dom = a(Attr::CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID)?;
        let bus = a(Attr::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID)?;
        let dev = a(Attr::CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID)?;
        Ok(format!("{dom:04x}:{bus:02x}:{dev:02x}.0"))
    }

    /// NUMA node of the GPU from sysfs (None when unknown).
    pub fn numa_node(&self) -> Option<u32> {
        let addr = self.pci_address().ok()?;
        ubdirect_core::pci::numa_node(addr.parse().ok()?)
    }

    /// Whether the driver can export device memory as a dma-buf.
    pub fn dma_buf_supported(&self) -> bool {
        self.ctx
            .attribute(Attr::CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED)
            .map(|v| v != 0)
            .unwrap_or(false)
    }
}
