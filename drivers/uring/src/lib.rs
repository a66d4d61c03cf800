//! ubdirect-uring: the kernel block path. An io_uring ring over a file or block device with
//! O_DIRECT (falling back to buffered I/O, with a warning, where the filesystem refuses it),
//! the unified-buffer pool regions registered once as fixed buffers (READ_FIXED/WRITE_FIXED),
//! batched submission (one `io_uring_enter` per flush), allocation-free completion reaping and
//! optional SQPOLL. It implements the same `BlockQueue` seam as an NVMe queue pair, so the
//! pipeline runs unchanged on machines without vfio and as the A/B baseline.

#![deny(missing_docs)]

mod error;
mod fixed;
mod options;
mod queue;
mod slots;
mod source;

pub use error::{to_block_error, UringError};
pub use fixed::MAX_FIXED_LEN;
pub use options::{DirectMode, UringOptions};
pub use queue::UringQueue;
pub use source::on_page_cache_fs;
