//! Opening the file or block device behind a queue: O_DIRECT with a buffered fallback,
//! capacity and logical block size.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::Path;

use crate::error::UringError;
use crate::options::DirectMode;

/// `BLKSSZGET`: logical sector size of a block device.
const BLKSSZGET: libc::c_ulong = 0x1268;

/// An opened source with its geometry.
#[derive(Debug)]
pub struct OpenedSource {
    /// The file.
    pub file: File,
    /// Whether O_DIRECT is in effect.
    pub direct: bool,
    /// Capacity in bytes.
    pub capacity: u64,
    /// Logical block size in bytes (alignment for O_DIRECT).
    pub block_size: u32,
    /// Opened read-write.
    pub writable: bool,
}

/// Open `path` following `mode`; warns (tracing) when falling back to buffered I/O.
pub fn open_source(
    path: &Path,
    mode: DirectMode,
    writable: bool,
) -> Result<OpenedSource, UringError> {
    let open = |flags: i32| {
        OpenOptions::new()
            .read(true)
            .write(writable)
            .custom_flags(flags)
            .open(path)
    };
    let (file, direct) = match mode {
        DirectMode::Off => (open(0).map_err(|source| open_err(path, source))?, false),
        DirectMode::Require => match open(libc::O_DIRECT) {
            Ok(f) => (f, true),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                return Err(UringError::DirectRefused {
                    path: path.into(),
                    source: e,
                })
            }
            Err(e) => return Err(open_err(path, e)),
        },
        DirectMode::Auto if is_regular_file(path) && on_page_cache_fs(path) => {
            tracing::info!(
                "{} is on tmpfs/ramfs: using buffered I/O (the data lives in the page cache)",
                path.display()
            );
            (open(0).map_err(|source| open_err(path, source))?, false)
        }
        DirectMode::Auto => match open(libc::O_DIRECT) {
            Ok(f) => (f, true),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                tracing::warn!(
                    "O_DIRECT refused for {} ({e}; tmpfs/ramfs?): falling back to buffered I/O \
                     through the page cache; pass buffered mode to silence this",
                    path.display()
                );
                (open(0).map_err(|source| open_err(path, source))?, false)
            }
            Err(e) => return Err(open_err(path, e)),
        },
    };
    let meta = file.metadata().map_err(|source| open_err(path, source))?;
    let ft = meta.file_type();
    let (capacity, block_size) = if ft.is_block_device() {
        (
            block_device_size(&file).map_err(|source| open_err(path, source))?,
            logical_block_size(&file)?,
        )
    } else if ft.is_file() {
        // Regular files: 4 KiB is a safe O_DIRECT alignment on every common filesystem.
        (meta.len(), if direct { 4096 } else { 512 })
    } else {
        return Err(UringError::NotBlockSource { path: path.into() });
    };
    Ok(OpenedSource {
        file,
        direct,
        capacity,
        block_size,
        writable,
    })
}

/// True when `path` lives on tmpfs or ramfs, where O_DIRECT means nothing (the page cache is
/// the storage) and recent kernels accept it only to do the same copy inline.
pub fn on_page_cache_fs(path: &Path) -> bool {
    const TMPFS_MAGIC: i64 = 0x0102_1994;
    const RAMFS_MAGIC: i64 = 0x8584_58f6;
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()) else {
        return false;
    };
    // SAFETY: statfs is plain data; `c` is a NUL-terminated path and `st` a valid out pointer.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: see above.
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return false;
    }
    matches!(st.f_type as i64, TMPFS_MAGIC | RAMFS_MAGIC)
}

/// Regular files only: a device node on devtmpfs is not a page-cache source.
fn is_regular_file(path: &Path) -> bool {
    std::fs::metadata(path)
        .map(|m| m.is_file())
        .unwrap_or(false)
}

fn open_err(path: &Path, source: io::Error) -> UringError {
    UringError::Open {
        path: path.into(),
        source,
    }
}

fn block_device_size(file: &File) -> io::Result<u64> {
    use std::io::{Seek, SeekFrom};
    let mut f = file;
    let end = f.seek(SeekFrom::End(0))?;
    f.seek(SeekFrom::Start(0))?;
    Ok(end)
}

fn logical_block_size(file: &File) -> Result<u32, UringError> {
    let mut sz: libc::c_int = 0;
    // SAFETY: BLKSSZGET writes one c_int through the pointer, which points at `sz`.
    let rc = unsafe {
        libc::ioctl(
            file.as_raw_fd(),
            BLKSSZGET as _,
            &mut sz as *mut libc::c_int,
        )
    };
    if rc != 0 || sz <= 0 {
        return Err(UringError::Setup(io::Error::last_os_error()));
    }
    Ok(sz as u32)
}
