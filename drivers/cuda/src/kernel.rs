//! Building the checksum kernel with NVRTC for the GPU's own architecture.

use std::sync::Arc;

use cudarc::driver::CudaFunction;
use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions};

use crate::checksum::KERNEL_SRC;
use crate::error::{drv, CudaError};
use crate::gpu::CudaGpu;
use crate::loader::nvrtc_available;

/// NVRTC virtual architectures by compute capability.
fn arch_for(cc: (i32, i32)) -> Option<&'static str> {
    Some(match cc {
        (7, 5) => "compute_75",
        (8, 0) => "compute_80",
        (8, 6) => "compute_86",
        (8, 7) => "compute_87",
        (8, 9) => "compute_89",
        (9, 0) => "compute_90",
        (10, 0) => "compute_100",
        (10, 3) => "compute_103",
        (11, 0) => "compute_110",
        (12, 0) => "compute_120",
        (12, 1) => "compute_121",
        _ => return None,
    })
}

/// Compile and load `ub_checksum` for `gpu`.
pub fn load_checksum_kernel(gpu: &Arc<CudaGpu>) -> Result<CudaFunction, CudaError> {
    nvrtc_available()?;
    let opts = CompileOptions {
        arch: gpu.compute_capability().ok().and_then(arch_for),
        ..Default::default()
    };
    let ptx = compile_ptx_with_opts(KERNEL_SRC, opts)
        .map_err(|e| CudaError::Compile(format!("{e:?}")))?;
    let module = gpu
        .context()
        .load_module(ptx)
        .map_err(drv("cuModuleLoadData"))?;
    module
        .load_function("ub_checksum")
        .map_err(drv("cuModuleGetFunction"))
}
