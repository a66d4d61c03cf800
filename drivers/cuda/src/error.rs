//! Typed errors of the CUDA sink.

use cudarc::driver::DriverError;

/// Everything that can go wrong talking to CUDA.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    /// libcuda.so could not be loaded (no NVIDIA driver on this machine).
    #[error("libcuda.so not found: no NVIDIA driver is installed here (install the driver, or use a sink that needs no GPU)")]
    NoDriver,
    /// libnvrtc.so could not be loaded (needed to build the verification kernel).
    #[error("libnvrtc.so not found: the CUDA toolkit's NVRTC is needed for GPU-side verification (add its lib64 directory to LD_LIBRARY_PATH, or run without GPU-side verification)")]
    NoNvrtc,
    /// The driver is there but there is no such GPU.
    #[error("GPU {ordinal} not present: the driver sees {count} GPU(s) (pick cuda:<n> with n < {count})")]
    NoDevice {
        /// Ordinal asked for.
        ordinal: usize,
        /// GPUs present.
        count: usize,
    },
    /// A driver call failed.
    #[error("{call} failed: {err:?}")]
    Driver {
        /// The CUDA driver API call.
        call: &'static str,
        /// The driver's error.
        err: DriverError,
    },
    /// NVRTC could not compile the verification kernel.
    #[error("NVRTC could not compile the checksum kernel: {0}")]
    Compile(String),
    /// A bad argument.
    #[error("{0}")]
    Invalid(String),
    /// The platform cannot put GPU memory into the DMA domain.
    #[error("{0}")]
    Unsupported(String),
}

/// Attach the failing call's name to a driver error.
pub(crate) fn drv(call: &'static str) -> impl FnOnce(DriverError) -> CudaError {
    move |err| CudaError::Driver { call, err }
}
