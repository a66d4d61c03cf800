//! Frames moving through the burst API: a pool buffer plus the frame's length. The 12-byte
//! virtio-net header sits in the same buffer in front of the frame (zero copy both ways),
//! except for a TX frame in a read-only buffer (a registered file region), which is never
//! written: its header comes from the queue's own DMA memory.

use ubdirect_core::ub::UbBuf;

use crate::error::{Result, VirtioNetError};
use crate::net_config::MIN_FRAME;
use crate::net_header::NET_HDR_LEN;

/// Offset of the Ethernet frame inside a buffer: just past the virtio-net header.
pub const FRAME_OFFSET: usize = NET_HDR_LEN;

/// A received frame: the buffer the device wrote, the frame at `FRAME_OFFSET..+len`.
/// Dropping it returns the buffer to its pool.
#[derive(Debug)]
pub struct RxFrame {
    buf: UbBuf,
    len: usize,
}

impl RxFrame {
    pub(crate) fn new(buf: UbBuf, len: usize) -> RxFrame {
        RxFrame { buf, len }
    }
    /// Frame length in bytes (without the virtio-net header).
    pub fn len(&self) -> usize {
        self.len
    }
    /// True for a zero-length frame (never delivered by the driver).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Byte offset of the frame in the buffer ([`FRAME_OFFSET`]).
    pub fn offset(&self) -> usize {
        FRAME_OFFSET
    }
    /// The frame bytes, for a buffer of host memory.
    ///
    /// # Panics
    /// On a buffer of a file region or a BAR, as [`UbBuf::as_slice`]: copy those out with
    /// [`UbBuf::read_into`].
    pub fn data(&self) -> &[u8] {
        &self.buf.as_slice()[FRAME_OFFSET..FRAME_OFFSET + self.len]
    }
    /// The frame bytes, writable, for a buffer of host memory (e.g. to turn the frame around
    /// for TX in place).
    ///
    /// # Panics
    /// On a buffer of a file region or a BAR, as [`UbBuf::as_mut_slice`].
    pub fn data_mut(&mut self) -> &mut [u8] {
        &mut self.buf.as_mut_slice()[FRAME_OFFSET..FRAME_OFFSET + self.len]
    }
    /// The underlying pool buffer.
    pub fn buf(&self) -> &UbBuf {
        &self.buf
    }
    /// Gives the buffer back (e.g. to forward it as a [`TxFrame`]); the frame is at
    /// [`FRAME_OFFSET`] with the returned length.
    pub fn into_parts(self) -> (UbBuf, usize) {
        (self.buf, self.len)
    }
}

/// A frame to send: the Ethernet frame is at `FRAME_OFFSET..FRAME_OFFSET + len` of `buf`;
/// the driver writes the header in front of it. A buffer of a read-only region (a registered
/// file, [`ubdirect_core::UbRegion::is_read_only`]) is sent as it is: the driver leaves its
/// first `FRAME_OFFSET` bytes alone and sends a header of its own before the frame.
#[derive(Debug)]
pub struct TxFrame {
    buf: UbBuf,
    len: usize,
}

impl TxFrame {
    /// Wraps `buf` whose bytes `FRAME_OFFSET..FRAME_OFFSET + len` hold the frame. Checks that
    /// the buffer is large enough and the frame at least an Ethernet header; the device's
    /// maximum is checked by `tx_burst`.
    pub fn new(buf: UbBuf, len: usize) -> std::result::Result<TxFrame, (UbBuf, VirtioNetError)> {
        if len < MIN_FRAME {
            return Err((
                buf,
                VirtioNetError::FrameTooShort {
                    index: 0,
                    len,
                    min: MIN_FRAME,
                },
            ));
        }
        let need = FRAME_OFFSET + len;
        if need > buf.len() {
            let have = buf.len();
            return Err((
                buf,
                VirtioNetError::BufferTooSmall {
                    need,
                    frame: len,
                    have,
                },
            ));
        }
        Ok(TxFrame { buf, len })
    }
    /// Frame length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Never true: construction refuses frames shorter than an Ethernet header.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The frame bytes, for a buffer of host memory.
    ///
    /// # Panics
    /// On a buffer of a file region or a BAR, as [`UbBuf::as_slice`]: copy those out with
    /// [`UbBuf::read_into`].
    pub fn data(&self) -> &[u8] {
        &self.buf.as_slice()[FRAME_OFFSET..FRAME_OFFSET + self.len]
    }
    /// The frame bytes, writable, for a buffer of host memory.
    ///
    /// # Panics
    /// On a buffer of a file region or a BAR, as [`UbBuf::as_mut_slice`].
    pub fn data_mut(&mut self) -> &mut [u8] {
        &mut self.buf.as_mut_slice()[FRAME_OFFSET..FRAME_OFFSET + self.len]
    }
    /// Takes the buffer back.
    pub fn into_buf(self) -> UbBuf {
        self.buf
    }
    /// The buffer holding the frame (at [`FRAME_OFFSET`]).
    pub fn buf(&self) -> &UbBuf {
        &self.buf
    }
    pub(crate) fn parts_mut(&mut self) -> (&mut UbBuf, usize) {
        (&mut self.buf, self.len)
    }
}

/// Checks a frame length against the device's limit, for a burst position.
pub(crate) fn check_len(index: usize, len: usize, max: usize) -> Result<()> {
    if len > max {
        return Err(VirtioNetError::FrameTooLarge { index, len, max });
    }
    if len < MIN_FRAME {
        return Err(VirtioNetError::FrameTooShort {
            index,
            len,
            min: MIN_FRAME,
        });
    }
    Ok(())
}
