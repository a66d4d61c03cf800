//! Reading a file range into host memory the caller owns (a numpy array, a bytearray): the
//! page cache (pread) or O_DIRECT where the range and the buffer are aligned.

use crate::errors::{Error, Result};
use crate::request::{pread_exact, Io, Request, AUTO_MAPPED_RESIDENT};

/// Read `req` into `[dst, dst + req.len)`. `io`: buffered reads through the page cache;
/// direct uses O_DIRECT (aligned ranges and buffers only); auto uses O_DIRECT when the range is
/// aligned and mostly not in the page cache (falling back to buffered where the file system
/// refuses it), else buffered. Mapped is for CUDA destinations only.
///
/// # Safety
/// `[dst, dst + req.len)` is writable host memory that nothing else touches during the call.
pub unsafe fn read(req: &Request, dst: *mut u8, io: Io) -> Result<u64> {
    if req.len == 0 {
        return Ok(0);
    }
    // SAFETY: the caller's contract: the range is ours to write for this call.
    let buf = unsafe { std::slice::from_raw_parts_mut(dst, req.len as usize) };
    let aligned = req.direct_aligned(Some(dst as usize));
    let direct = match io {
        Io::Mapped => {
            return Err(Error::invalid(
                "io=\"mapped\" hands the registered page cache to the GPU copy engines: it needs a CUDA destination (use io=\"buffered\", \"direct\" or \"auto\" for host memory)",
            ))
        }
        Io::Buffered => None,
        Io::Direct if !aligned => {
            return Err(Error::invalid(format!(
                "io=\"direct\" needs the offset ({}), the length ({}) and the buffer address ({:#x}) to be multiples of 4096 bytes: use io=\"buffered\" or \"auto\"",
                req.offset, req.len, dst as usize
            )))
        }
        Io::Direct => Some(req.open_direct()?.ok_or_else(|| req.direct_refused())?),
        Io::Auto if aligned && req.resident() < AUTO_MAPPED_RESIDENT => req.open_direct()?,
        Io::Auto => None,
    };
    let file = direct.as_ref().unwrap_or(&req.file);
    pread_exact(file, buf, req.offset, &req.path)?;
    Ok(req.len)
}
