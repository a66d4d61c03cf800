//! [`Sink`]: a consumer of filled buffers (a GPU copy, a BAR, null).

use std::fmt;

use crate::ub::UbBuf;

/// What kind of failure a [`SinkError`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SinkErrorKind {
    /// The request itself is wrong (length beyond the buffer or the destination).
    InvalidRequest,
    /// No free slot; poll and resubmit.
    Full,
    /// The copy engine / device failed.
    Device,
    /// The sink did not finish within its deadline.
    Timeout,
    /// Any other failure.
    Other,
}

/// A sink error: a kind for code and a message for people, built only on the error path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SinkError {
    /// What went wrong, for code.
    pub kind: SinkErrorKind,
    /// What went wrong and what to do, for people.
    pub message: String,
}

impl SinkError {
    /// A new error of `kind` with `message`.
    pub fn new(kind: SinkErrorKind, message: impl Into<String>) -> SinkError {
        SinkError {
            kind,
            message: message.into(),
        }
    }
}

impl fmt::Display for SinkError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {}", self.kind, self.message)
    }
}

impl std::error::Error for SinkError {}

/// A consumer of filled buffers. Same move-in / come-back shape as [`crate::seams::BlockQueue`].
pub trait Sink: Send {
    /// Consume the first `len` bytes of `buf`. On error the buffer comes back.
    fn submit(&mut self, buf: UbBuf, len: usize, tag: u64) -> Result<(), (UbBuf, SinkError)>;
    /// Reap up to `max` finished submissions, calling `f(buf, tag, result)` for each.
    fn poll(
        &mut self,
        max: usize,
        f: &mut dyn FnMut(UbBuf, u64, Result<(), SinkError>),
    ) -> Result<usize, SinkError>;
    /// Submissions not yet reaped.
    fn in_flight(&self) -> usize;
}
