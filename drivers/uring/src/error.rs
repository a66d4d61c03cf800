//! Typed errors of the io_uring block queue and their conversion into the core seam's error.

use std::io;
use std::path::PathBuf;

/// Everything that can go wrong opening or driving a [`crate::UringQueue`].
#[derive(Debug, thiserror::Error)]
pub enum UringError {
    /// The source file or block device could not be opened.
    #[error("cannot open {path}: {source} (check the path and that you may read it)")]
    Open {
        /// The path given.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// O_DIRECT was required but the filesystem refused it.
    #[error("O_DIRECT refused for {path}: {source} (tmpfs/ramfs do not support it; use buffered mode for page-cache sources)")]
    DirectRefused {
        /// The path given.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// The path is neither a regular file nor a block device.
    #[error("{path} is not a regular file or block device")]
    NotBlockSource {
        /// The path given.
        path: PathBuf,
    },
    /// The kernel refused to set up the ring.
    #[error("io_uring setup failed: {0} (is io_uring disabled by kernel.io_uring_disabled or a seccomp filter?)")]
    Setup(io::Error),
    /// Registering the pool regions as fixed buffers failed.
    #[error("registering {count} pool regions as io_uring fixed buffers failed: {source} (raise RLIMIT_MEMLOCK or run as root)")]
    RegisterBuffers {
        /// How many iovecs were offered.
        count: usize,
        /// The OS error.
        source: io::Error,
    },
    /// A request's range lies outside the source.
    #[error(
        "request [{offset}, {offset}+{len}) is beyond the end of the source ({capacity} bytes)"
    )]
    OutOfRange {
        /// Byte offset asked for.
        offset: u64,
        /// Length asked for.
        len: usize,
        /// Source capacity in bytes.
        capacity: u64,
    },
    /// O_DIRECT needs offsets and lengths aligned to the logical block size.
    #[error("O_DIRECT request offset {offset} / length {len} is not a multiple of the {align}-byte logical block size: align the request or use buffered mode")]
    Unaligned {
        /// Byte offset asked for.
        offset: u64,
        /// Length asked for.
        len: usize,
        /// Required alignment.
        align: u32,
    },
    /// The buffer cannot hold the request.
    #[error("buffer of {buf_len} bytes is too small for a {len}-byte request: use a pool with a larger block size")]
    BufferTooSmall {
        /// Length asked for.
        len: usize,
        /// Buffer length.
        buf_len: usize,
    },
    /// A request longer than one io_uring request carries ([`crate::UringQueue`]'s
    /// `max_transfer`).
    #[error("request of {len} bytes is longer than the {max}-byte maximum transfer of an io_uring request: split it into requests of at most {max} bytes")]
    TooLarge {
        /// Length asked for.
        len: usize,
        /// The maximum transfer.
        max: usize,
    },
    /// A zero-length request.
    #[error("zero-length request: nothing to do")]
    ZeroLength,
    /// More requests than the queue depth.
    #[error("queue full ({depth} requests in flight): poll completions before submitting more")]
    QueueFull {
        /// The queue depth.
        depth: usize,
    },
    /// Writing to a queue opened read-only.
    #[error("the source was opened read-only: open it writable to submit writes")]
    ReadOnly,
    /// io_uring_enter failed.
    #[error("io_uring_enter failed: {0}")]
    Enter(io::Error),
    /// The kernel completed a request with an error.
    #[error("{op} at offset {offset} failed: {source}")]
    Io {
        /// "read" or "write".
        op: &'static str,
        /// Byte offset of the request.
        offset: u64,
        /// The errno the kernel returned.
        source: io::Error,
    },
    /// A completion carried a tag this queue never issued (kernel or memory corruption).
    #[error(
        "completion with unknown user_data {0:#x}: dropped (this is a bug or memory corruption)"
    )]
    UnknownCompletion(u64),
    /// No completion arrived in time.
    #[error("no completion within {0:?}: the device or filesystem is stalled")]
    Timeout(std::time::Duration),
    /// The buffer cannot serve the request: a block of a file region read into, or written
    /// from after its file changed since registration.
    #[error(transparent)]
    Buffer(ubdirect_core::CoreError),
}

/// Convert into the core seam's error, keeping the kind a caller can branch on.
pub fn to_block_error(e: &UringError) -> ubdirect_core::seams::BlockError {
    use ubdirect_core::seams::{BlockError, BlockErrorKind as K};
    let kind = match e {
        UringError::OutOfRange { .. }
        | UringError::Unaligned { .. }
        | UringError::BufferTooSmall { .. }
        | UringError::TooLarge { .. }
        | UringError::ZeroLength
        | UringError::ReadOnly
        | UringError::Buffer(_) => K::InvalidRequest,
        UringError::QueueFull { .. } => K::QueueFull,
        UringError::Io { source, .. } if source.raw_os_error() == Some(libc::EINVAL) => {
            K::InvalidRequest
        }
        UringError::Io { .. } => K::Device,
        UringError::Timeout(_) => K::Timeout,
        UringError::UnknownCompletion(_) => K::Protocol,
        _ => K::Other,
    };
    BlockError::new(kind, e.to_string())
}
