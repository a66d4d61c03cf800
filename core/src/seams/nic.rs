//! [`Nic`] and [`NicQueue`]: the network-device seam every NIC poll-mode driver implements
//! (virtio-net, igb), so tools and pipelines drive any of them the same way.
//!
//! Bring-up is per driver (each has its own `open` and options); after that a NIC is a set of
//! queue pairs. Buffers move in and out by value: a frame to send is a pool buffer handed to
//! [`NicQueue::tx_burst`], which takes it off the caller's `Vec` and returns it to its pool once
//! the device is done with it; a received frame is a pool buffer the device wrote, handed out by
//! [`NicQueue::rx_burst`] as a [`NicFrame`] that names where in the buffer the frame lies.
//!
//! Every frame sits at an offset inside its buffer: a driver may need headroom in front of the
//! frame (virtio-net writes its 12-byte header there), so a TX frame must start at
//! [`NicQueue::tx_headroom`] of the queue it is sent on.

use std::fmt;

use crate::ub::UbBuf;

/// Smallest frame a NIC sends: a 14-byte Ethernet header.
pub const MIN_FRAME: usize = 14;

/// A frame in a pool buffer: the bytes `offset..offset + len` of `buf`. Dropping it returns the
/// buffer to its pool.
#[derive(Debug)]
pub struct NicFrame {
    buf: UbBuf,
    offset: usize,
    len: usize,
}

impl NicFrame {
    /// The frame at `offset..offset + len` of `buf`; refused (the buffer comes back) when that
    /// range does not lie inside the buffer.
    pub fn new(buf: UbBuf, offset: usize, len: usize) -> Result<NicFrame, (UbBuf, NicError)> {
        match offset.checked_add(len) {
            Some(end) if end <= buf.len() => Ok(NicFrame { buf, offset, len }),
            _ => {
                let have = buf.len();
                Err((
                    buf,
                    NicError::new(
                        NicErrorKind::InvalidRequest,
                        format!("a {len}-byte frame at offset {offset} does not fit a {have}-byte buffer"),
                    ),
                ))
            }
        }
    }
    /// Frame length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }
    /// True for a zero-length frame.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Where the frame starts in the buffer.
    pub fn offset(&self) -> usize {
        self.offset
    }
    /// The frame bytes, for a buffer of host memory.
    ///
    /// # Panics
    /// On a buffer of a file region or a BAR, as [`UbBuf::as_slice`]: copy those out with
    /// [`UbBuf::read_into`] on [`NicFrame::buf`].
    pub fn data(&self) -> &[u8] {
        &self.buf.as_slice()[self.offset..self.offset + self.len]
    }
    /// The frame bytes, writable, for a buffer of host memory.
    ///
    /// # Panics
    /// On a buffer of a file region or a BAR, as [`UbBuf::as_mut_slice`].
    pub fn data_mut(&mut self) -> &mut [u8] {
        let (o, l) = (self.offset, self.len);
        &mut self.buf.as_mut_slice()[o..o + l]
    }
    /// The underlying pool buffer.
    pub fn buf(&self) -> &UbBuf {
        &self.buf
    }
    /// Gives back the buffer, the offset and the length.
    pub fn into_parts(self) -> (UbBuf, usize, usize) {
        (self.buf, self.offset, self.len)
    }
}

/// What kind of failure a [`NicError`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum NicErrorKind {
    /// The request itself is wrong (frame too long or short, wrong offset, no room in `out`);
    /// nothing changed.
    InvalidRequest,
    /// The link is down: nothing can be sent or received until it comes back.
    LinkDown,
    /// The device is gone (all-ones reads, reset behind the driver's back).
    DeviceGone,
    /// The device reported something the driver could not make sense of (a length beyond the
    /// buffer, a head pointer beyond the ring): the queue is unusable until reopened.
    Protocol,
    /// Any other failure.
    Other,
}

impl NicErrorKind {
    /// True when nothing more can move on the queue (device gone, protocol violation): stop
    /// polling and drop the device.
    pub fn is_fatal(self) -> bool {
        matches!(self, NicErrorKind::DeviceGone | NicErrorKind::Protocol)
    }
}

/// A NIC error: a kind to branch on and a message (the driver's own error text) for people.
/// Built only on the error path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NicError {
    /// What went wrong, for code.
    pub kind: NicErrorKind,
    /// What went wrong and what to do, for people.
    pub message: String,
}

impl NicError {
    /// A new error of `kind` with `message`.
    pub fn new(kind: NicErrorKind, message: impl Into<String>) -> NicError {
        NicError {
            kind,
            message: message.into(),
        }
    }
}

impl fmt::Display for NicError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {}", self.kind, self.message)
    }
}

impl std::error::Error for NicError {}

/// Counters of a queue pair (or their sum over a NIC), kept by the driver.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NicStats {
    /// Frames received and handed to the caller.
    pub rx_packets: u64,
    /// Bytes of those frames.
    pub rx_bytes: u64,
    /// Received frames dropped by the driver (runts, frames spread over several buffers).
    pub rx_drops: u64,
    /// RX refills that found the pool empty (the ring ran with fewer buffers).
    pub rx_refill_failures: u64,
    /// Frames handed to the device for sending.
    pub tx_packets: u64,
    /// Bytes of those frames.
    pub tx_bytes: u64,
    /// TX bursts that found the ring full before every frame was queued.
    pub tx_ring_full: u64,
}

impl std::ops::AddAssign for NicStats {
    fn add_assign(&mut self, o: NicStats) {
        self.rx_packets += o.rx_packets;
        self.rx_bytes += o.rx_bytes;
        self.rx_drops += o.rx_drops;
        self.rx_refill_failures += o.rx_refill_failures;
        self.tx_packets += o.tx_packets;
        self.tx_bytes += o.tx_bytes;
        self.tx_ring_full += o.tx_ring_full;
    }
}

/// One RX/TX queue pair of a NIC, polled by one thread. Nothing here allocates.
pub trait NicQueue: Send {
    /// The largest frame (Ethernet header and payload, no FCS) sent or received.
    fn max_frame(&self) -> usize;
    /// Where a TX frame must start in its buffer (the driver's headroom).
    fn tx_headroom(&self) -> usize;
    /// Appends received frames to `out`, up to its spare capacity (it never grows `out`), and
    /// refills the RX ring. Returns the number appended. No spare capacity is
    /// [`NicErrorKind::InvalidRequest`].
    fn rx_burst(&mut self, out: &mut Vec<NicFrame>) -> Result<usize, NicError>;
    /// Sends frames from the front of `frames` as far as the TX ring has room; sent frames
    /// leave the `Vec` (their buffers return to their pools once the device is done), unsent
    /// ones stay in order. Every frame is checked first (length, offset): one bad frame fails
    /// the burst with nothing sent. Returns the number sent.
    fn tx_burst(&mut self, frames: &mut Vec<NicFrame>) -> Result<usize, NicError>;
    /// Returns the buffers of finished TX frames to their pools; returns how many.
    fn reclaim_tx(&mut self) -> Result<usize, NicError>;
    /// This pair's counters.
    fn stats(&self) -> NicStats;
}

/// An opened, running NIC: its facts and its queue pairs.
pub trait Nic: Send {
    /// The driver family ("virtio-net", "igb").
    fn driver(&self) -> &'static str;
    /// The MAC address, when the device has one.
    fn mac(&self) -> Option<[u8; 6]>;
    /// Link state: `Some(up)`, or `None` when the device does not report it. Reads a register:
    /// not for the I/O path.
    fn link_up(&self) -> Result<Option<bool>, NicError>;
    /// The largest frame sent or received.
    fn max_frame(&self) -> usize;
    /// Number of queue pairs in use.
    fn pair_count(&self) -> usize;
    /// Counters summed over all pairs.
    fn stats(&self) -> NicStats;
    /// Queue pair `i` as a [`NicQueue`] borrowing the NIC (allocates the handle: call it once,
    /// not per burst).
    fn queue(&mut self, i: usize) -> Option<Box<dyn NicQueue + '_>>;
}
