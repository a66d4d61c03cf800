//! The in-flight request of an io_uring queue; the table holding them, indexed by io_uring
//! `user_data`, is the core seam's [`ubdirect_core::seams::InFlight`] (shared with the
//! NVMe/TCP queue).

/// One in-flight request.
#[derive(Debug)]
pub struct Slot<B> {
    /// The buffer the kernel is reading into / writing from.
    pub buf: B,
    /// The caller's tag.
    pub tag: u64,
    /// Byte offset of the request (for error messages).
    pub offset: u64,
    /// True for writes.
    pub write: bool,
}

/// The in-flight table of an io_uring queue.
pub type Slots<B> = ubdirect_core::seams::InFlight<Slot<B>>;
