//! Reference checksums of the source, computed independently of the pipeline's data path.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;
use std::sync::Arc;

use ubdirect_core::seams::BlockQueue;
use ubdirect_core::util::checksum::{checksum_at, checksum_buf};
use ubdirect_core::UbPool;

use super::error::PipelineError;
use super::report::VerifyResult;

/// Checksum of `len` bytes of the file at `path` from byte `start` (checksum offsets relative
/// to `start`, as the pipeline's stream offsets are), read with plain read() calls.
pub fn file_checksum(path: &Path, start: u64, len: u64) -> Result<u64, PipelineError> {
    let io = |what: &str| {
        let what = format!("{what} {}", path.display());
        move |source| PipelineError::Io { what, source }
    };
    let mut f = File::open(path).map_err(io("open"))?;
    f.seek(SeekFrom::Start(start)).map_err(io("seek"))?;
    let mut buf = vec![0u8; 4 << 20];
    let (mut off, mut sum) = (0u64, 0u64);
    while off < len {
        let want = (len - off).min(buf.len() as u64) as usize;
        f.read_exact(&mut buf[..want]).map_err(io("read"))?;
        sum = sum.wrapping_add(checksum_at(&buf[..want], off));
        off += want as u64;
    }
    Ok(sum)
}

/// Checksum of `len` bytes of a block source from byte `start`, read again one block at a time
/// at queue depth 1 into one pool buffer (a second pass through the driver, separate from the
/// pipeline). Checksum offsets are relative to `start`.
pub fn queue_checksum<Q: BlockQueue + ?Sized>(
    src: &mut Q,
    pool: &Arc<UbPool>,
    start: u64,
    len: u64,
) -> Result<u64, PipelineError> {
    let lbs = u64::from(src.block_size().max(1));
    let chunk = (pool.block_size().min(src.max_transfer()) as u64 / lbs * lbs).max(lbs);
    let (mut off, mut sum) = (0u64, 0u64);
    let mut buf = Some(pool.get().map_err(|e| PipelineError::Pool(e.to_string()))?);
    while off < len {
        let want = (len - off).min(chunk);
        let b = buf
            .take()
            .ok_or_else(|| PipelineError::Verify("buffer lost".into()))?;
        src.submit_read(b, start + off, want.next_multiple_of(lbs) as usize, off)
            .map_err(|(_, e)| PipelineError::Source(e))?;
        src.ring().map_err(PipelineError::Source)?;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let mut err = None;
        while buf.is_none() {
            src.poll(1, &mut |c| {
                match c.result {
                    Ok(n) if n as u64 >= want => match checksum_buf(&c.buf, want as usize, off) {
                        Ok(s) => sum = sum.wrapping_add(s),
                        Err(e) => err = Some(PipelineError::Verify(e.to_string())),
                    },
                    Ok(n) => {
                        err = Some(PipelineError::Verify(format!(
                            "short read of {n} bytes at {off} in the reference pass"
                        )))
                    }
                    Err(e) => err = Some(PipelineError::Source(e)),
                }
                buf = Some(c.buf);
            })
            .map_err(PipelineError::Source)?;
            if std::time::Instant::now() > deadline {
                return Err(PipelineError::Stalled {
                    secs: 30,
                    in_flight: src.in_flight(),
                });
            }
        }
        if let Some(e) = err {
            return Err(e);
        }
        off += want;
    }
    Ok(sum)
}

/// Compare and describe.
pub fn compare(method: &str, delivered: u64, expected: u64) -> VerifyResult {
    VerifyResult {
        method: method.into(),
        delivered: format!("{delivered:016x}"),
        expected: format!("{expected:016x}"),
        ok: delivered == expected,
    }
}
