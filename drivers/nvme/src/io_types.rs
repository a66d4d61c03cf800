//! Buffers moved into I/O requests and handed back with completions, plus queue options/stats.

use std::time::Duration;

use ubdirect_core::UbBuf;

use crate::error::NvmeError;

/// Most segments in one scatter list.
pub const MAX_SEGMENTS: usize = 8;

/// One piece of a scatter list: `len` bytes at `offset` within `buf`.
#[derive(Debug)]
pub struct Segment {
    /// The buffer.
    pub buf: UbBuf,
    /// Byte offset within the buffer.
    pub offset: usize,
    /// Bytes used.
    pub len: usize,
}

/// A fixed-capacity scatter list of up to [`MAX_SEGMENTS`] buffers (no heap allocation).
#[derive(Debug, Default)]
pub struct SgList {
    segs: [Option<Segment>; MAX_SEGMENTS],
    n: usize,
}

impl SgList {
    /// An empty list.
    pub fn new() -> SgList {
        SgList::default()
    }
    /// Append a segment; gives it back when the list is full.
    pub fn push(&mut self, seg: Segment) -> Result<(), Segment> {
        if self.n == MAX_SEGMENTS {
            return Err(seg);
        }
        self.segs[self.n] = Some(seg);
        self.n += 1;
        Ok(())
    }
    /// Number of segments.
    pub fn len(&self) -> usize {
        self.n
    }
    /// True when there are no segments.
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }
    /// The segments in order.
    pub fn iter(&self) -> impl Iterator<Item = &Segment> {
        self.segs[..self.n].iter().flatten()
    }
    /// Total bytes described.
    pub fn total_len(&self) -> usize {
        self.iter().map(|s| s.len).sum()
    }
    /// Take the buffers back out, in order.
    pub fn into_segments(self) -> impl Iterator<Item = Segment> {
        self.segs.into_iter().flatten()
    }
}

/// A window of a [`UbBuf`]: `len` bytes at `offset`. The buffer moves into a request with its
/// window and comes back the same at completion. Built checked: the window lies inside the
/// buffer.
#[derive(Debug)]
pub struct IoBuf {
    buf: UbBuf,
    offset: usize,
    len: usize,
}

/// An [`IoBuf`] window that does not fit its buffer: the buffer comes back with the reason.
#[derive(Debug)]
pub struct IoBufError {
    /// The buffer, unchanged.
    pub buf: UbBuf,
    /// [`NvmeError::BufferTooSmall`] with the figures.
    pub error: NvmeError,
}

impl std::fmt::Display for IoBufError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.error.fmt(f)
    }
}

impl std::error::Error for IoBufError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

impl IoBuf {
    /// The `len` bytes of `buf` at `offset`; refused (buffer back) when they pass its end.
    pub fn new(buf: UbBuf, offset: usize, len: usize) -> Result<IoBuf, IoBufError> {
        match offset.checked_add(len) {
            Some(end) if end <= buf.len() => Ok(IoBuf { buf, offset, len }),
            _ => Err(IoBufError {
                error: NvmeError::BufferTooSmall {
                    need: offset.saturating_add(len),
                    have: buf.len(),
                    offset,
                },
                buf,
            }),
        }
    }
    /// The first `len` bytes of `buf` (`IoBuf::new(buf, 0, len)`).
    pub fn prefix(buf: UbBuf, len: usize) -> Result<IoBuf, IoBufError> {
        IoBuf::new(buf, 0, len)
    }
    /// Byte offset of the window in the buffer.
    pub fn offset(&self) -> usize {
        self.offset
    }
    /// Bytes in the window (the transfer length).
    pub fn len(&self) -> usize {
        self.len
    }
    /// True for an empty window (refused by every request).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// IOVA of the window's first byte.
    pub fn iova(&self) -> u64 {
        self.buf.iova() + self.offset as u64
    }
    /// The window's bytes, for a buffer of host memory.
    ///
    /// # Panics
    /// On a buffer of a file region or a BAR, as [`UbBuf::as_slice`]: copy those out with
    /// [`UbBuf::read_into`] on [`IoBuf::buf`].
    pub fn as_slice(&self) -> &[u8] {
        &self.buf.as_slice()[self.offset..self.offset + self.len]
    }
    /// The window's bytes, writable, for a buffer of host memory.
    ///
    /// # Panics
    /// On a buffer of a file region or a BAR, as [`UbBuf::as_mut_slice`].
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.buf.as_mut_slice()[self.offset..self.offset + self.len]
    }
    /// The whole buffer.
    pub fn buf(&self) -> &UbBuf {
        &self.buf
    }
    /// Give the buffer back.
    pub fn into_buf(self) -> UbBuf {
        self.buf
    }
}

impl From<UbBuf> for IoBuf {
    /// The whole buffer as the window.
    fn from(buf: UbBuf) -> IoBuf {
        let len = buf.len();
        IoBuf {
            buf,
            offset: 0,
            len,
        }
    }
}

/// The data buffers of a request, moved in at submission and handed back at completion: the
/// same variant that was submitted (the blocking helpers return it typed).
#[derive(Debug, Default)]
pub enum IoBufs {
    /// No data (Flush, Write Zeroes, Dataset Management).
    #[default]
    None,
    /// One buffer window.
    One(IoBuf),
    /// A scatter list (boxed to keep every request small; reuse the box across requests).
    Sg(Box<SgList>),
}

impl From<IoBuf> for IoBufs {
    fn from(b: IoBuf) -> IoBufs {
        IoBufs::One(b)
    }
}

impl From<Box<SgList>> for IoBufs {
    fn from(sg: Box<SgList>) -> IoBufs {
        IoBufs::Sg(sg)
    }
}

/// Where a request's bytes are, as the queue pair sees its payload.
#[derive(Debug, Clone, Copy)]
pub enum IoData<'a> {
    /// No data.
    None,
    /// One buffer window.
    One(&'a IoBuf),
    /// A scatter list.
    Sg(&'a SgList),
}

/// What a request carries into an [`crate::IoQueuePair`] and hands back, unchanged and with its
/// own type, in its [`IoCompletion`] (or [`Rejected`]): the queue pair's payload type `P`.
///
/// [`IoBufs`] (the default) takes every request kind and hands back the enum; a queue pair of
/// [`IoBuf`] (one window per request), `Box<SgList>` (scatter lists) or `(IoBuf, T)` (a window
/// and the caller's own context `T`) hands back exactly that type, so nothing is matched or
/// unwrapped: `IoQueuePair::<IoBuf>::with_payload(&ctrl, opts)`.
///
/// ```no_run
/// # use ubdirect_nvme::{Controller, IoBuf, IoFlags, IoQueuePair, Lba, QueueOptions};
/// # fn f(ctrl: &std::sync::Arc<Controller>, buf: IoBuf) -> Result<(), Box<dyn std::error::Error>> {
/// let ns = ctrl.first_namespace()?;
/// let mut qp = IoQueuePair::<IoBuf>::with_payload(ctrl, QueueOptions::default())?;
/// qp.submit_read(&ns, Lba(0), buf, IoFlags::empty(), 1)?;
/// qp.ring();
/// qp.poll(8, |c| {
///     let buf: IoBuf = c.bufs; // the window that was submitted, typed
///     # let _ = buf;
/// })?;
/// # Ok(()) }
/// ```
///
/// A queue pair of windows takes no scatter list (and no Flush: `IoBuf` has no empty value;
/// [`crate::IoQueuePair::submit_flush_with`] carries a window through a Flush): it does not
/// compile.
///
/// ```compile_fail
/// # use ubdirect_nvme::{IoBuf, IoFlags, IoQueuePair, Lba, Namespace, SgList};
/// fn f(qp: &mut IoQueuePair<IoBuf>, ns: &Namespace, sg: Box<SgList>) {
///     let _ = qp.submit_readv(ns, Lba(0), sg, IoFlags::empty(), 1);
/// }
/// ```
///
/// # Safety
/// The device reads or writes the memory [`IoPayload::data`] describes until the request
/// completes. An implementation must describe memory the payload owns exclusively (nothing
/// else reads or writes it while the payload is in the queue) and return the same windows on
/// every call.
pub unsafe trait IoPayload: Send {
    /// Where the request's bytes are.
    fn data(&self) -> IoData<'_>;
}

// SAFETY: the windows are owned by the enum's buffers, which move into the request.
unsafe impl IoPayload for IoBufs {
    #[inline]
    fn data(&self) -> IoData<'_> {
        match self {
            IoBufs::None => IoData::None,
            IoBufs::One(b) => IoData::One(b),
            IoBufs::Sg(sg) => IoData::Sg(sg),
        }
    }
}

// SAFETY: the window is the IoBuf's own buffer, moved into the request.
unsafe impl IoPayload for IoBuf {
    #[inline]
    fn data(&self) -> IoData<'_> {
        IoData::One(self)
    }
}

// SAFETY: the segments' buffers are owned by the list, moved into the request.
unsafe impl IoPayload for Box<SgList> {
    #[inline]
    fn data(&self) -> IoData<'_> {
        IoData::Sg(self)
    }
}

// SAFETY: the window is the IoBuf's own buffer; `T` is never given to the device.
unsafe impl<T: Send> IoPayload for (IoBuf, T) {
    #[inline]
    fn data(&self) -> IoData<'_> {
        IoData::One(&self.0)
    }
}

/// A finished request: the payload that was submitted, with its type (`P`, see
/// [`IoPayload`]).
#[derive(Debug)]
pub struct IoCompletion<P = IoBufs> {
    /// The caller's tag.
    pub tag: u64,
    /// The payload, back to the caller as it was submitted.
    pub bufs: P,
    /// Bytes transferred (0 for commands without data), or the first error of its commands.
    pub result: Result<usize, NvmeError>,
}

/// A request refused before it reached the device: the buffers come back with the reason.
/// Nothing was queued.
#[derive(Debug)]
pub struct Rejected<P = IoBufs> {
    /// The payload given to the submission.
    pub bufs: P,
    /// Why (validation error, or [`NvmeError::QueueFull`]: poll, then resubmit).
    pub error: NvmeError,
}

impl<P> std::fmt::Display for Rejected<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.error.fmt(f)
    }
}

impl<P: std::fmt::Debug> std::error::Error for Rejected<P> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

/// Options for [`crate::IoQueuePair::new`].
#[derive(Debug, Clone)]
pub struct QueueOptions {
    /// Commands in flight (queue entries - 1), capped by CAP.MQES.
    pub depth: usize,
    /// Namespace used by the [`ubdirect_core::seams::BlockQueue`] impl (default: the first).
    pub nsid: Option<u32>,
    /// Use shadow doorbells when the controller has them on.
    pub shadow_doorbells: bool,
    /// Ring the SQ doorbell on every submission instead of on `ring()`.
    pub auto_ring: bool,
    /// A command with no completion this long after its own submission times out: Abort is
    /// sent for it; if it is still not back `io_timeout` after the Abort, [`Self::recovery`]
    /// decides what happens.
    pub io_timeout: Duration,
    /// What to do when an aborted command times out again, an Abort is not answered, or the
    /// controller reports a fatal status or stops being ready.
    pub recovery: Recovery,
    /// Place the I/O submission queue in the controller's Controller Memory Buffer (the
    /// controller then fetches commands from its own memory). Needs a controller opened with
    /// [`crate::ControllerOptions::cmb`] whose CMB supports SQs (CMBSZ.SQS) and has room.
    pub sq_in_cmb: bool,
}

/// What an I/O queue pair does when a command still does not complete after its Abort, an
/// Abort is not answered, or the controller is found fatal (CSTS.CFS) or not ready (reset
/// under the driver). The same happens when another queue pair of the controller reset it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Recovery {
    /// Report it: `poll` returns [`NvmeError::Timeout`] when the Abort is sent, then
    /// [`NvmeError::Wedged`] / `ControllerNotReady` / `ControllerFatal`; the embedder drops the
    /// queue pair and calls [`crate::Controller::reset`].
    #[default]
    Report,
    /// Reset the controller (queues re-created, shadow doorbells set again, namespaces read
    /// again and checked), then submit every request that was in flight again; their buffers
    /// stay with the queue and complete normally. `poll` reports no error; the counters do.
    Requeue,
    /// Reset the controller as for `Requeue`, then complete every request that was in flight
    /// with [`NvmeError::FailedByReset`] and its buffers, through `poll`'s callback.
    FailBack,
}

impl Default for QueueOptions {
    fn default() -> Self {
        QueueOptions {
            depth: 128,
            nsid: None,
            shadow_doorbells: true,
            auto_ring: false,
            io_timeout: Duration::from_secs(10),
            recovery: Recovery::Report,
            sq_in_cmb: false,
        }
    }
}

/// Counters of one queue pair.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct QueueStats {
    /// Requests submitted.
    pub requests: u64,
    /// NVMe commands submitted (a request above MDTS is several).
    pub commands: u64,
    /// Completion entries reaped.
    pub completions: u64,
    /// SQ tail doorbell MMIO writes.
    pub sq_doorbell_writes: u64,
    /// CQ head doorbell MMIO writes.
    pub cq_doorbell_writes: u64,
    /// Doorbell updates that only touched the shadow buffer.
    pub shadow_only_updates: u64,
    /// Commands that passed `io_timeout` after their own submission.
    pub timeouts: u64,
    /// Abort commands sent for them.
    pub aborts_sent: u64,
    /// Controller resets this queue pair went through (its own recovery or another queue's).
    pub resets: u64,
    /// Commands submitted again after a reset ([`Recovery::Requeue`]).
    pub requeued: u64,
    /// Requests completed with [`NvmeError::FailedByReset`] ([`Recovery::FailBack`]).
    pub failed_back: u64,
    /// Completion entries skipped as malformed (bad command id or SQ id).
    pub malformed_completions: u64,
    /// Requests that did not fit in the free command slots and waited in the queue pair's
    /// pending list (queued requests: above MDTS, or deeper than the queue).
    pub queued_requests: u64,
    /// SQ tail doorbell written again with the same value because a command had waited a
    /// quarter of `io_timeout` with the controller ready (a doorbell write the controller may
    /// have lost; at most one per deadline check).
    pub doorbell_kicks: u64,
}
