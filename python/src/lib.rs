//! The `ubdirect._native` extension module: the Rust half of the `ubdirect` Python package
//! (python/ubdirect holds the Python half: destinations, the Loader, the exception classes).
//! Every call that waits on a file or a device releases the GIL.

mod cuda_read;
mod device_buffer;
mod errors;
mod gpu_state;
mod host_read;
mod pending_read;
mod request;
mod storage;

use pyo3::prelude::*;

use crate::request::{Io, Request};

/// Read a file range into host memory at `addr` (`nbytes` writable bytes); returns the bytes
/// read. The Python caller holds a writable buffer export of the range during the call.
#[pyfunction]
#[pyo3(signature = (path, addr, nbytes, offset, length, io))]
fn read_host(
    py: Python<'_>,
    path: String,
    addr: usize,
    nbytes: u64,
    offset: u64,
    length: Option<u64>,
    io: &str,
) -> PyResult<u64> {
    let io = Io::parse(io)?;
    let n = py.detach(|| {
        let req = Request::open(&path, offset, length, nbytes)?;
        // SAFETY: the caller's buffer export covers [addr, addr + nbytes) >= req.len.
        unsafe { host_read::read(&req, addr as *mut u8, io) }
    })?;
    Ok(n)
}

/// Read a file range into CUDA device memory at `ptr` (`nbytes` bytes), after the work queued
/// on `stream` (the destination's CUDA Array Interface stream, if any); returns (bytes read,
/// the path taken: "mapped", "direct" or "buffered").
#[pyfunction]
#[pyo3(signature = (path, ptr, nbytes, offset, length, io, stream=None))]
#[allow(clippy::too_many_arguments)]
fn read_cuda(
    py: Python<'_>,
    path: String,
    ptr: u64,
    nbytes: u64,
    offset: u64,
    length: Option<u64>,
    io: &str,
    stream: Option<u64>,
) -> PyResult<(u64, &'static str)> {
    let io = Io::parse(io)?;
    let r = py.detach(|| {
        let req = Request::open(&path, offset, length, nbytes)?;
        let ordinal = gpu_state::ordinal_of(ptr)?;
        // SAFETY: the caller's object owns [ptr, ptr + nbytes) of device memory and keeps it
        // alive during the call; `stream` is its CUDA Array Interface stream.
        let done = unsafe { cuda_read::read(&req, ptr, ordinal, io, stream) }?;
        Ok::<_, errors::Error>((req.len, done.name()))
    })?;
    Ok(r)
}

/// GPUs the CUDA driver sees (0 without a driver).
#[pyfunction]
fn cuda_device_count(py: Python<'_>) -> usize {
    py.detach(ubdirect::cuda::CudaGpu::count)
}

/// Bytes of file page cache registered with CUDA now (mapped reads keep windows for reuse).
#[pyfunction]
fn registered_bytes() -> u64 {
    gpu_state::registered_bytes()
}

/// Let go of every registered file window no read is using.
#[pyfunction]
fn release_windows(py: Python<'_>) {
    py.detach(gpu_state::release_windows)
}

/// The module.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(read_host, m)?)?;
    m.add_function(wrap_pyfunction!(read_cuda, m)?)?;
    m.add_function(wrap_pyfunction!(pending_read::start_cuda, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_device_count, m)?)?;
    m.add_function(wrap_pyfunction!(registered_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(release_windows, m)?)?;
    m.add_class::<device_buffer::DeviceBuffer>()?;
    m.add_class::<pending_read::PendingRead>()?;
    m.add_class::<storage::Env>()?;
    m.add("WINDOW", cuda_read::WINDOW)?;
    Ok(())
}
