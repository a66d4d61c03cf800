//! ubdirect-cuda: where GPU memory and the unified buffer pool meet. Host pool regions are
//! registered with CUDA once (cuMemHostRegister PORTABLE | DEVICEMAP) so the copy engines DMA
//! straight out of them; [`CudaSink`] streams copies host -> device with one event per copy and
//! hands a buffer back only after its event completed; a checksum kernel built with NVRTC proves
//! on the GPU that the data arrived intact; [`GpuDmaBuf`] exports device memory as a dma-buf.
//!
//! libcuda is loaded at run time: without it every entry point returns [`CudaError::NoDriver`]
//! (cudarc itself would panic, so [`driver_available`] is checked first).

mod checksum;
mod dmabuf;
mod error;
mod gpu;
mod host_register;
mod kernel;
mod loader;
mod sink;

pub use checksum::{checksum_at, mix, KERNEL_SRC};
pub use dmabuf::GpuDmaBuf;
pub use error::CudaError;
pub use gpu::CudaGpu;
pub use host_register::HostRegistration;
pub use loader::{driver_available, nvrtc_available};
pub use sink::{CudaSink, CudaSinkConfig};
