//! One read request: the file, the byte range and the I/O mode, checked against the file and
//! the destination before anything is read.

use std::fs::File;
use std::os::unix::fs::OpenOptionsExt;

use crate::errors::{Error, Result};

/// Page-cache residency above which `io="auto"` maps the file for a CUDA destination (the
/// CLI's `--io auto` threshold).
pub const AUTO_MAPPED_RESIDENT: f64 = 0.9;

/// Alignment O_DIRECT needs of offsets, lengths and host addresses.
pub const DIRECT_ALIGN: u64 = 4096;

/// How the file's bytes are read (the CLI's `--io`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Io {
    /// Choose per request: mapped for a CUDA destination when the range is in the page cache,
    /// else direct where aligned and allowed, else buffered.
    Auto,
    /// The page cache mapped read-only and registered with CUDA; the copy engines read it.
    Mapped,
    /// O_DIRECT reads (no page cache).
    Direct,
    /// Reads through the page cache.
    Buffered,
}

impl Io {
    /// Parse `auto`, `mapped`, `direct` or `buffered`.
    pub fn parse(s: &str) -> Result<Io> {
        match s {
            "auto" => Ok(Io::Auto),
            "mapped" => Ok(Io::Mapped),
            "direct" => Ok(Io::Direct),
            "buffered" => Ok(Io::Buffered),
            other => Err(Error::invalid(format!(
                "io={other:?}: use \"auto\", \"mapped\", \"direct\" or \"buffered\""
            ))),
        }
    }
}

/// A checked request: `len` bytes of `path` from `offset` into a destination of `dst_len` bytes.
#[derive(Debug)]
pub struct Request {
    /// The file (opened buffered).
    pub file: File,
    /// Its path for messages.
    pub path: String,
    /// Its size.
    pub size: u64,
    /// First byte.
    pub offset: u64,
    /// Bytes to read (0 when `offset` is the end of the file).
    pub len: u64,
}

impl Request {
    /// Open `path` and resolve the range: `length` bytes from `offset`, or (`None`) as many as
    /// the destination holds, stopping at the end of the file. A range past the end of the
    /// file, or longer than the destination, is refused.
    pub fn open(path: &str, offset: u64, length: Option<u64>, dst_len: u64) -> Result<Request> {
        let file = File::open(path).map_err(|e| Error::file(format!("cannot open {path}"), e))?;
        let size = file
            .metadata()
            .map_err(|e| Error::file(format!("stat {path}"), e))?
            .len();
        if offset > size {
            return Err(Error::invalid(format!(
                "offset {offset} is past the end of {path} ({size} bytes)"
            )));
        }
        let len = match length {
            Some(l) => {
                let end = offset.saturating_add(l);
                if end > size {
                    return Err(Error::invalid(format!(
                        "bytes {offset}..{end} are not inside {path} ({size} bytes): pick a range within it"
                    )));
                }
                if l > dst_len {
                    return Err(Error::invalid(format!(
                        "the destination holds {dst_len} bytes, less than the {l} bytes asked for"
                    )));
                }
                l
            }
            None => dst_len.min(size - offset),
        };
        Ok(Request {
            file,
            path: path.to_string(),
            size,
            offset,
            len,
        })
    }

    /// Fraction of the range in the page cache (0 when it cannot be told).
    pub fn resident(&self) -> f64 {
        if self.len == 0 {
            return 1.0;
        }
        ubdirect::cuda::resident_fraction(&self.file, self.offset, self.len).unwrap_or(0.0)
    }

    /// True when the range (and `addr`, a host address) meets O_DIRECT's alignment.
    pub fn direct_aligned(&self, addr: Option<usize>) -> bool {
        self.offset % DIRECT_ALIGN == 0
            && self.len % DIRECT_ALIGN == 0
            && addr.is_none_or(|a| a as u64 % DIRECT_ALIGN == 0)
    }

    /// The file opened again with O_DIRECT. `None` when the file system refuses O_DIRECT
    /// (tmpfs, some network file systems): the caller falls back or says so.
    pub fn open_direct(&self) -> Result<Option<File>> {
        match std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(&self.path)
        {
            Ok(f) => Ok(Some(f)),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(None),
            Err(e) => Err(Error::file(
                format!("cannot open {} with O_DIRECT", self.path),
                e,
            )),
        }
    }

    /// The error for `io="direct"` on a file system that refuses O_DIRECT.
    pub fn direct_refused(&self) -> Error {
        Error::invalid(format!(
            "io=\"direct\": the file system of {} refuses O_DIRECT (tmpfs?): use io=\"buffered\" or \"auto\"",
            self.path
        ))
    }
}

/// Read exactly `buf.len()` bytes of `file` at `offset` (pread, retried on EINTR and short
/// reads). A read that ends early (the file shrank) is an error naming the offset.
pub fn pread_exact(file: &File, buf: &mut [u8], offset: u64, path: &str) -> Result<()> {
    use std::os::unix::fs::FileExt;
    let mut done = 0usize;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => {
                return Err(Error::file(
                    format!("{path}: short read at offset {}", offset + done as u64),
                    std::io::Error::from(std::io::ErrorKind::UnexpectedEof),
                ))
            }
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => {
                return Err(Error::file(
                    format!("{path}: read at offset {}", offset + done as u64),
                    e,
                ))
            }
        }
    }
    Ok(())
}
