//! Checks that libcuda (and libnvrtc) can be loaded before any cudarc call: cudarc's dynamic
//! loading panics when the library is missing, so every entry point goes through here first.

use std::sync::OnceLock;

use crate::error::CudaError;

/// Ok when libcuda.so can be loaded. Cached after the first call.
pub fn driver_available() -> Result<(), CudaError> {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: is_culib_present only tries dlopen on the candidate names and drops the handle.
    let present = *PRESENT.get_or_init(|| unsafe { cudarc::driver::sys::is_culib_present() });
    if present {
        Ok(())
    } else {
        Err(CudaError::NoDriver)
    }
}

/// Ok when libnvrtc.so can be loaded. Cached after the first call.
pub fn nvrtc_available() -> Result<(), CudaError> {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: as above, a dlopen attempt only.
    let present = *PRESENT.get_or_init(|| unsafe { cudarc::nvrtc::sys::is_culib_present() });
    if present {
        Ok(())
    } else {
        Err(CudaError::NoNvrtc)
    }
}
