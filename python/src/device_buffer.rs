//! [`DeviceBuffer`]: GPU memory the package allocates itself when torch is not there, exposing
//! `__cuda_array_interface__` (cupy, numba, and torch.as_tensor read it without a copy).

use std::sync::Arc;

use cudarc::driver::sys;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use ubdirect::cuda::CudaGpu;

use crate::errors::Result;
use crate::gpu_state::check;

/// Device memory of one GPU, freed when the object goes.
#[pyclass(module = "ubdirect")]
pub struct DeviceBuffer {
    gpu: Arc<CudaGpu>,
    ptr: u64,
    nbytes: usize,
    device: usize,
}

impl DeviceBuffer {
    fn alloc(device: usize, nbytes: usize) -> Result<DeviceBuffer> {
        let gpu = CudaGpu::open(device)?;
        gpu.bind()?;
        let mut ptr: sys::CUdeviceptr = 0;
        if nbytes > 0 {
            // SAFETY: out-pointer to a local; the context is bound.
            let r = unsafe { sys::cuMemAlloc_v2(&mut ptr, nbytes) };
            check(r, "cuMemAlloc")?;
        }
        Ok(DeviceBuffer {
            gpu,
            ptr,
            nbytes,
            device,
        })
    }
}

#[pymethods]
impl DeviceBuffer {
    /// Allocate `nbytes` bytes on GPU `device`.
    #[new]
    #[pyo3(signature = (nbytes, device = 0))]
    fn new(py: Python<'_>, nbytes: usize, device: usize) -> PyResult<DeviceBuffer> {
        Ok(py.detach(|| DeviceBuffer::alloc(device, nbytes))?)
    }

    /// Size in bytes.
    #[getter]
    fn nbytes(&self) -> usize {
        self.nbytes
    }

    /// The GPU's ordinal.
    #[getter]
    fn device(&self) -> usize {
        self.device
    }

    /// The device address.
    #[getter]
    fn ptr(&self) -> u64 {
        self.ptr
    }

    fn __len__(&self) -> usize {
        self.nbytes
    }

    /// The CUDA Array Interface (version 3): a one-dimensional array of bytes.
    #[getter]
    fn __cuda_array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("shape", (self.nbytes,))?;
        d.set_item("typestr", "|u1")?;
        d.set_item("data", (self.ptr, false))?;
        d.set_item("version", 3)?;
        d.set_item("strides", py.None())?;
        d.set_item("stream", py.None())?;
        Ok(d)
    }

    /// Copy the contents to host memory and return them as bytes (for checks and small data).
    fn to_bytes(&self, py: Python<'_>) -> PyResult<Vec<u8>> {
        let (ptr, n, gpu) = (self.ptr, self.nbytes, self.gpu.clone());
        let v = py.detach(move || -> Result<Vec<u8>> {
            let mut v = vec![0u8; n];
            if n > 0 {
                gpu.bind()?;
                // SAFETY: `v` holds n bytes; [ptr, ptr + n) is this buffer's device memory.
                let r = unsafe { sys::cuMemcpyDtoH_v2(v.as_mut_ptr().cast(), ptr, n) };
                check(r, "cuMemcpyDtoH")?;
            }
            Ok(v)
        })?;
        Ok(v)
    }

    fn __repr__(&self) -> String {
        format!(
            "DeviceBuffer(nbytes={}, device={})",
            self.nbytes, self.device
        )
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        if self.ptr != 0 && self.gpu.bind().is_ok() {
            // SAFETY: the pointer this object allocated; reads into it finished before they
            // returned (each waits for its copies).
            unsafe { sys::cuMemFree_v2(self.ptr) };
        }
    }
}
