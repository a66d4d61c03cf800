//! ubdirect-cuda: where GPU memory and the unified buffer pool meet. Host pool regions are
//! registered with CUDA once (cuMemHostRegister PORTABLE | DEVICEMAP) so the copy engines DMA
//! straight out of them; [`CudaSink`] streams copies host -> device with one event per copy and
//! hands a buffer back only after its event completed; a checksum kernel built with NVRTC proves
//! on the GPU that the data arrived intact; [`GpuDmaBuf`] exports device memory as a dma-buf;
//! [`FileWindowRegistry`] keeps file ranges mapped and registered once, so the copy engines read
//! the page cache in place.
//!
//! libcuda is loaded at run time: without it every entry point returns [`CudaError::NoDriver`]
//! (cudarc itself would panic, so [`driver_available`] is checked first).

#![deny(missing_docs)]

mod checksum;
mod dmabuf;
mod error;
mod file_window;
mod gpu;
mod host_register;
mod kernel;
mod loader;
mod sink;
mod slots;

pub use checksum::{checksum_at, mix, KERNEL_SRC};
pub use dmabuf::GpuDmaBuf;
pub use error::CudaError;
pub use file_window::{
    resident_fraction, Acquired, FileIdentity, FileStamp, FileWindow, FileWindowRegistry,
    HostPinner, RegistryStats, WindowError, WindowKey,
};
pub use gpu::CudaGpu;
pub use host_register::{CudaHostPinner, HostRegistration};
pub use loader::{driver_available, nvrtc_available};
pub use sink::{CudaSink, CudaSinkConfig, DEFAULT_STREAMS};
