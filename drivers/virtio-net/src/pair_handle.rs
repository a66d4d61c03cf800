//! [`QueuePair`]: the handle through which callers use one RX/TX queue pair of a
//! [`VirtioNet`](crate::VirtioNet).
//!
//! The pair's state (its rings, their DMA memory, the buffers posted to the device) stays inside
//! the `VirtioNet` that set it up: the handle borrows the device and exposes only methods, never
//! a `&mut` to the state. So safe code cannot `mem::swap` (or `mem::replace`) the queue pairs of
//! two devices, which would let dropping one device reset it and then free ring memory and RX
//! buffers that the other NIC was still writing into. Swapping two handles only swaps the
//! borrows: each still drives its own device's rings.
//!
//! What does not compile:
//! ```compile_fail
//! fn swap(a: &mut ubdirect_virtio_net::VirtioNet, b: &mut ubdirect_virtio_net::VirtioNet) {
//!     std::mem::swap(a.pair(0).unwrap(), b.pair(0).unwrap());
//! }
//! ```
//! ```compile_fail
//! fn swap(a: &mut ubdirect_virtio_net::VirtioNet, b: &mut ubdirect_virtio_net::VirtioNet) {
//!     std::mem::swap(&mut *a.pair(0).unwrap(), &mut *b.pair(0).unwrap());
//! }
//! ```
//! ```compile_fail
//! fn swap(a: &mut ubdirect_virtio_net::VirtioNet, b: &mut ubdirect_virtio_net::VirtioNet) {
//!     let pa: &mut [ubdirect_virtio_net::QueuePair] = a.pairs_mut();
//!     let pb: &mut [ubdirect_virtio_net::QueuePair] = b.pairs_mut();
//!     std::mem::swap(&mut pa[0], &mut pb[0]);
//! }
//! ```
//! The same shapes with the handles themselves compile and are harmless (the control for the
//! three cases above: they fail for the swap, not for the surrounding code):
//! ```no_run
//! fn swap(a: &mut ubdirect_virtio_net::VirtioNet, b: &mut ubdirect_virtio_net::VirtioNet) {
//!     std::mem::swap(&mut a.pair(0).unwrap(), &mut b.pair(0).unwrap());
//!     let (mut pa, mut pb) = (a.pairs_mut(), b.pairs_mut());
//!     std::mem::swap(&mut pa[0], &mut pb[0]);
//! }
//! ```

use crate::error::Result;
use crate::frame::{RxFrame, TxFrame};
use crate::queue_pair::PairState;
use crate::stats::NetStats;

/// One RX queue and one TX queue of a virtio-net device, borrowed from its
/// [`VirtioNet`](crate::VirtioNet) ([`VirtioNet::pair`](crate::VirtioNet::pair),
/// [`VirtioNet::pairs_mut`](crate::VirtioNet::pairs_mut)). `Send`: hand one to each thread of
/// a `std::thread::scope`. Nothing here allocates or makes a syscall.
pub struct QueuePair<'a> {
    st: &'a mut PairState,
}

impl<'a> QueuePair<'a> {
    pub(crate) fn new(st: &'a mut PairState) -> QueuePair<'a> {
        QueuePair { st }
    }

    /// The largest frame (without header) `tx_burst` accepts and RX can deliver.
    pub fn max_frame(&self) -> usize {
        self.st.max_frame()
    }

    /// This pair's counters.
    pub fn stats(&self) -> NetStats {
        self.st.stats()
    }

    /// RX buffers currently posted to the device.
    pub fn rx_posted(&self) -> usize {
        self.st.rx_posted()
    }

    /// TX buffers the device has not finished with yet.
    pub fn tx_in_flight(&self) -> usize {
        self.st.tx_in_flight()
    }

    /// RX ring size.
    pub fn rx_ring_size(&self) -> usize {
        self.st.rx_ring_size()
    }

    /// TX ring size.
    pub fn tx_ring_size(&self) -> usize {
        self.st.tx_ring_size()
    }

    /// Posts pool buffers into every free RX slot; counts a refill failure when the pool is
    /// empty (the ring keeps running with what it has and refills on the next call). Returns
    /// the number posted.
    pub fn refill_rx(&mut self) -> usize {
        self.st.refill_rx()
    }

    /// Receives up to the spare capacity of `out` (`out.capacity() - out.len()`): appends
    /// frames without ever growing `out`, so with `Vec::with_capacity(batch)` made once this
    /// allocates nothing. Then refills the RX ring from the pool. Returns frames appended.
    ///
    /// Errors: [`VirtioNetError::EmptyBurst`](crate::VirtioNetError::EmptyBurst) when `out`
    /// has no spare capacity (nothing changed); [`VirtioNetError::Ring`](crate::VirtioNetError::Ring)
    /// when the device reports a malformed completion (an id it was never given, a length
    /// beyond the buffer, a used index running ahead): frames appended before it stay in
    /// `out`, and every later burst on this pair returns the same error;
    /// [`VirtioNetError::DeviceGone`](crate::VirtioNetError::DeviceGone) /
    /// [`VirtioNetError::DeviceNeedsReset`](crate::VirtioNetError::DeviceNeedsReset) when the
    /// pair made no progress for the health interval and device_status shows the device dead
    /// (then on every later call).
    #[inline]
    pub fn rx_burst(&mut self, out: &mut Vec<RxFrame>) -> Result<usize> {
        self.st.rx_burst(out)
    }

    /// Returns TX buffers the device has finished with to their pools. Returns how many.
    /// Errors as [`QueuePair::rx_burst`] for a malformed completion or a dead device.
    #[inline]
    pub fn reclaim_tx(&mut self) -> Result<usize> {
        self.st.reclaim_tx()
    }

    /// Sends frames from the front of `frames`: as many as the TX ring has room for, after
    /// reclaiming finished buffers. Sent frames are removed from `frames` (their buffers go
    /// back to their pools once the device has used them); unsent ones stay, in order, for the
    /// caller to retry. One doorbell at most per burst, and only if the device asked for it.
    ///
    /// Every frame is checked first; a frame too long or too short, in a buffer of another DMA
    /// domain, or in a file region (FileChanged when its file changed since it was registered;
    /// else refused: the header is written in front of the frame) fails the whole burst with
    /// nothing sent. An empty `frames` is
    /// [`VirtioNetError::EmptyBurst`](crate::VirtioNetError::EmptyBurst). A dead device fails
    /// the burst as in [`QueuePair::rx_burst`], with nothing sent.
    #[inline]
    pub fn tx_burst(&mut self, frames: &mut Vec<TxFrame>) -> Result<usize> {
        self.st.tx_burst(frames)
    }
}
