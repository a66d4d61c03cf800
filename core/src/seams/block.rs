//! [`BlockQueue`]: one submission/completion queue pair of a block device.

use std::fmt;

use crate::ub::UbBuf;

/// What kind of failure a [`BlockError`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum BlockErrorKind {
    /// The request itself is wrong (offset/length not block aligned, past the end, too big).
    InvalidRequest,
    /// The queue has no free slot; poll completions and resubmit.
    QueueFull,
    /// The device completed the command with an error status.
    Device,
    /// The device did not answer within its deadline.
    Timeout,
    /// The device is gone (all-ones reads, controller fatal status).
    DeviceGone,
    /// A completion the driver could not make sense of (bad command id, bad phase).
    Protocol,
    /// Requests neither completed nor could be aborted: the queue is dead until the device is
    /// reset; its buffers may still be written by the device.
    Wedged,
    /// Any other failure (kernel path errors, I/O errors).
    Other,
}

impl BlockErrorKind {
    /// True when nothing more can complete on the queue (device gone, controller fatal, wedged):
    /// callers should stop waiting for completions at once and keep, never reuse, the buffers
    /// still in flight (the device may yet write them).
    pub fn is_fatal(self) -> bool {
        matches!(self, BlockErrorKind::DeviceGone | BlockErrorKind::Wedged)
    }
}

/// A block I/O error: a kind to branch on and a message for people. Built only on the error
/// path, so the String costs nothing on success.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockError {
    /// What went wrong, for code.
    pub kind: BlockErrorKind,
    /// What went wrong and what to do, for people.
    pub message: String,
}

impl BlockError {
    /// A new error of `kind` with `message`.
    pub fn new(kind: BlockErrorKind, message: impl Into<String>) -> BlockError {
        BlockError {
            kind,
            message: message.into(),
        }
    }
}

impl fmt::Display for BlockError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {}", self.kind, self.message)
    }
}

impl std::error::Error for BlockError {}

/// A finished request: the buffer comes back with the caller's tag and the byte count or error.
#[derive(Debug)]
pub struct BlockCompletion {
    /// The buffer that was submitted.
    pub buf: UbBuf,
    /// The tag given at submit.
    pub tag: u64,
    /// Bytes transferred, or why not.
    pub result: std::result::Result<usize, BlockError>,
}

/// One queue pair of a block device (NVMe I/O queue, io_uring ring). Submits do not ring the
/// doorbell; [`BlockQueue::ring`] does, once for everything queued since the last ring.
pub trait BlockQueue: Send {
    /// Logical block size in bytes.
    fn block_size(&self) -> u32;
    /// Capacity in bytes.
    fn capacity(&self) -> u64;
    /// Maximum requests in flight.
    fn depth(&self) -> usize;
    /// Maximum bytes per request.
    fn max_transfer(&self) -> usize;
    /// Read `len` bytes at byte `offset` into the start of `buf`. On error the buffer comes back.
    fn submit_read(
        &mut self,
        buf: UbBuf,
        offset: u64,
        len: usize,
        tag: u64,
    ) -> std::result::Result<(), (UbBuf, BlockError)>;
    /// Write the first `len` bytes of `buf` at byte `offset`. On error the buffer comes back.
    fn submit_write(
        &mut self,
        buf: UbBuf,
        offset: u64,
        len: usize,
        tag: u64,
    ) -> std::result::Result<(), (UbBuf, BlockError)>;
    /// Ring doorbells for everything queued since the last ring (batching). Not a device
    /// cache flush (NVMe Flush is `ubdirect_nvme::IoQueuePair::submit_flush`).
    fn ring(&mut self) -> std::result::Result<(), BlockError>;
    /// Reap up to `max` completions, calling `f` for each. Never allocates.
    fn poll(
        &mut self,
        max: usize,
        f: &mut dyn FnMut(BlockCompletion),
    ) -> std::result::Result<usize, BlockError>;
    /// Requests submitted and not yet reaped.
    fn in_flight(&self) -> usize;
}
