//! [`PendingRead`]: a read into CUDA memory whose copies may still run, for the Loader to queue
//! the next item's copies before it waits for this one's.

use std::sync::Mutex;

use pyo3::prelude::*;

use crate::cuda_read::{self, Pending};
use crate::errors::Error;
use crate::gpu_state;
use crate::request::{Io, Request};

/// A started read: `wait()` returns (bytes read, the path taken) once its copies completed.
/// The destination object is kept alive until then.
#[pyclass(module = "ubdirect._native")]
pub struct PendingRead {
    pending: Mutex<Option<Pending>>,
    /// The destination (kept alive while copies into it may run).
    owner: Mutex<Option<Py<PyAny>>>,
}

#[pymethods]
impl PendingRead {
    /// Wait (GIL released) until the read's copies completed; returns (bytes read, "mapped",
    /// "direct" or "buffered"). A second call returns (0, "done").
    fn wait(&self, py: Python<'_>) -> PyResult<(u64, &'static str)> {
        let p = self
            .pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        let Some(p) = p else { return Ok((0, "done")) };
        let len = p.len;
        let r = py.detach(|| p.wait());
        // Copies no longer run (or their windows were leaked): the destination may go.
        self.owner.lock().unwrap_or_else(|p| p.into_inner()).take();
        Ok((len, r?.name()))
    }
}

/// Start reading a file range into CUDA device memory at `ptr` (`nbytes` bytes) owned by
/// `owner`, after the work queued on `stream`; the copies of a mapped read are queued and run
/// after the call returns (until `wait()`).
#[pyfunction]
#[pyo3(signature = (path, owner, ptr, nbytes, offset, length, io, stream=None))]
#[allow(clippy::too_many_arguments)]
pub fn start_cuda(
    py: Python<'_>,
    path: String,
    owner: Py<PyAny>,
    ptr: u64,
    nbytes: u64,
    offset: u64,
    length: Option<u64>,
    io: &str,
    stream: Option<u64>,
) -> PyResult<PendingRead> {
    let io = Io::parse(io)?;
    let p = py.detach(|| {
        let req = Request::open(&path, offset, length, nbytes)?;
        let ordinal = gpu_state::ordinal_of(ptr)?;
        // SAFETY: `owner` owns [ptr, ptr + nbytes) of device memory and the PendingRead keeps
        // it alive until the copies completed; `stream` is its CUDA Array Interface stream.
        unsafe { cuda_read::start(&req, ptr, ordinal, io, stream) }
    });
    let p: Pending = p.map_err(|e: Error| PyErr::from(e))?;
    Ok(PendingRead {
        pending: Mutex::new(Some(p)),
        owner: Mutex::new(Some(owner)),
    })
}
