//! One RX/TX virtqueue pair: the burst API. Owned by one thread (`Send`, not `Sync`). Nothing
//! here allocates or makes a syscall: buffers come from and go back to `UbPool`s, doorbells are
//! MMIO writes only when the device asked for them (event index).
//!
//! A dead device is noticed by the burst calls themselves: after the pair made no progress for
//! the health interval, the next idle burst reads device_status once and returns
//! [`VirtioNetError::DeviceGone`] / [`VirtioNetError::DeviceNeedsReset`]; from then on every
//! burst call returns that error without touching the rings (see [`crate::health`]).

use std::sync::Arc;

use ubdirect_core::pci::PciAddress;
use ubdirect_core::ub::{DmaMem, UbBuf, UbPool};
use zerocopy::IntoBytes;

use crate::error::{Result, VirtioNetError};
use crate::frame::{check_len, RxFrame, TxFrame, FRAME_OFFSET};
use crate::health::{status_result, IdleClock, StatusProbe};
use crate::net_header::{VirtioNetHdr, NET_HDR_LEN};
use crate::ring::SplitRing;
use crate::stats::NetStats;
use crate::transport::Doorbell;

pub use crate::pair_handle::QueuePair;

/// A ring with its DMA memory, the buffers it holds (by descriptor id) and its doorbell.
pub(crate) struct Queue {
    pub(crate) index: u16,
    pub(crate) ring: SplitRing,
    pub(crate) slots: Box<[Option<UbBuf>]>,
    pub(crate) doorbell: Doorbell,
    /// IOVA of a plain virtio-net header in `_mem`, past the ring: the header a TX chain of a
    /// read-only buffer starts with (the device only reads it; unused on RX queues).
    pub(crate) hdr_iova: u64,
    // Declared last: released after the ring and buffers (and only after a device reset,
    // which VirtioNet::drop does before any queue is dropped).
    pub(crate) _mem: DmaMem,
}

impl Queue {
    /// Rings the doorbell when the device asked for one; returns whether it did.
    #[inline]
    fn publish_and_kick(&mut self) -> bool {
        self.ring.publish();
        if self.ring.kick_needed() {
            self.doorbell.ring();
            true
        } else {
            false
        }
    }

    /// After the device reset: every buffer back to its pool.
    pub(crate) fn drain(&mut self) {
        let slots = &mut self.slots;
        self.ring.drain_after_reset(|id| {
            slots[id as usize] = None;
        });
    }
}

/// The state of one RX queue and one TX queue of a virtio-net device. Owned by the
/// [`crate::VirtioNet`] for its whole life and never handed out by `&mut` (a swap across two
/// devices would move ring memory and posted buffers to the wrong device): callers reach it
/// through the [`QueuePair`] handle.
pub(crate) struct PairState {
    pub(crate) addr: PciAddress,
    pub(crate) rx: Queue,
    pub(crate) tx: Queue,
    pub(crate) rx_pool: Arc<UbPool>,
    /// The device's DMA domain: TX buffers of another domain are refused.
    pub(crate) domain: ubdirect_core::DomainId,
    pub(crate) rx_buf_len: u32,
    pub(crate) max_frame: usize,
    pub(crate) stats: NetStats,
    pub(crate) idle: IdleClock,
    pub(crate) probe: StatusProbe,
    /// The device_status value that showed the device dead: every burst call then fails.
    pub(crate) dead: Option<u8>,
}

impl PairState {
    /// The largest frame (without header) `tx_burst` accepts and RX can deliver.
    pub(crate) fn max_frame(&self) -> usize {
        self.max_frame
    }

    /// This pair's counters.
    pub(crate) fn stats(&self) -> NetStats {
        self.stats
    }

    /// RX buffers currently posted to the device.
    pub(crate) fn rx_posted(&self) -> usize {
        self.rx.ring.in_flight()
    }

    /// TX buffers the device has not finished with yet.
    pub(crate) fn tx_in_flight(&self) -> usize {
        self.tx.ring.in_flight()
    }

    /// RX ring size.
    pub(crate) fn rx_ring_size(&self) -> usize {
        self.rx.ring.size() as usize
    }

    /// TX ring size.
    pub(crate) fn tx_ring_size(&self) -> usize {
        self.tx.ring.size() as usize
    }

    /// The sticky error once the device was seen dead.
    #[inline(always)]
    fn alive(&self) -> Result<()> {
        match self.dead {
            None => Ok(()),
            Some(s) => status_result(self.addr, s),
        }
    }

    /// A poll that moved nothing: after the health interval without progress, read
    /// device_status once.
    #[inline(always)]
    fn idle_poll(&mut self) -> Result<()> {
        if self.idle.idle_poll() {
            return self.check_device();
        }
        Ok(())
    }

    #[cold]
    fn check_device(&mut self) -> Result<()> {
        self.stats.status_reads += 1;
        let s = self.probe.read();
        let r = status_result(self.addr, s);
        if r.is_err() {
            self.dead = Some(s);
        }
        r
    }

    fn ring_err(&self, queue: u16, source: crate::ring::RingError) -> VirtioNetError {
        VirtioNetError::Ring {
            addr: self.addr,
            queue,
            source,
        }
    }

    /// Posts pool buffers into every free RX slot; counts a refill failure when the pool is
    /// empty (the ring keeps running with what it has and refills on the next call). Returns
    /// the number posted.
    pub(crate) fn refill_rx(&mut self) -> usize {
        let mut n = 0;
        while self.rx.ring.free_count() > 0 {
            let buf = match self.rx_pool.get() {
                Ok(b) => b,
                Err(_) => {
                    self.stats.rx_refill_failures += 1;
                    break;
                }
            };
            let Some(id) = self.rx.ring.push(buf.iova(), self.rx_buf_len, true) else {
                break;
            };
            self.rx.slots[id as usize] = Some(buf);
            n += 1;
        }
        if n > 0 && self.rx.publish_and_kick() {
            self.stats.rx_kicks += 1;
        }
        n
    }

    /// Receives up to the spare capacity of `out` (`out.capacity() - out.len()`): appends
    /// frames without ever growing `out`, so with `Vec::with_capacity(batch)` made once this
    /// allocates nothing. Then refills the RX ring from the pool. Returns frames appended.
    ///
    /// Errors: [`VirtioNetError::EmptyBurst`] when `out` has no spare capacity (nothing
    /// changed); [`VirtioNetError::Ring`] when the device reports a malformed completion;
    /// [`VirtioNetError::DeviceGone`] / [`VirtioNetError::DeviceNeedsReset`] when the pair made
    /// no progress for the health interval and device_status shows the device dead (then on
    /// every later call).
    pub(crate) fn rx_burst(&mut self, out: &mut Vec<RxFrame>) -> Result<usize> {
        self.alive()?;
        let room = out.capacity() - out.len();
        if room == 0 {
            return Err(VirtioNetError::EmptyBurst(
                "rx_burst needs spare capacity in `out`: create it with Vec::with_capacity(batch) and drain it between calls",
            ));
        }
        let mut got = 0;
        while got < room {
            let (id, len) = match self.rx.ring.pop_used_within(self.rx_buf_len) {
                Ok(Some(x)) => x,
                Ok(None) => break,
                Err(e) => return Err(self.ring_err(self.rx.index, e)),
            };
            let Some(buf) = self.rx.slots[id as usize].take() else {
                // Unreachable: the ring only returns ids it handed out with a buffer.
                self.stats.rx_drops += 1;
                continue;
            };
            let len = len as usize;
            if len < NET_HDR_LEN {
                // A runt (shorter than the header): counted and dropped. Longer than the
                // buffer never gets here (RingError::BadLen above).
                self.stats.rx_drops += 1;
                drop(buf);
                continue;
            }
            let frame_len = len - NET_HDR_LEN;
            self.stats.rx_packets += 1;
            self.stats.rx_bytes += frame_len as u64;
            out.push(RxFrame::new(buf, frame_len));
            got += 1;
        }
        self.rx.ring.suppress_interrupts();
        self.refill_rx();
        if got > 0 {
            self.idle.progress();
        } else {
            self.idle_poll()?;
        }
        Ok(got)
    }

    /// Returns TX buffers the device has finished with to their pools. Returns how many.
    /// Errors as [`QueuePair::rx_burst`] for a malformed completion or a dead device.
    pub(crate) fn reclaim_tx(&mut self) -> Result<usize> {
        self.alive()?;
        let mut n = 0;
        loop {
            match self.tx.ring.pop_used() {
                Ok(Some((id, _))) => {
                    self.tx.slots[id as usize] = None;
                    n += 1;
                }
                Ok(None) => break,
                Err(e) => return Err(self.ring_err(self.tx.index, e)),
            }
        }
        self.tx.ring.suppress_interrupts();
        self.stats.tx_reclaimed += n as u64;
        if n > 0 {
            self.idle.progress();
        } else {
            self.idle_poll()?;
        }
        Ok(n)
    }

    /// How many frames from the front of `frames` the TX ring has descriptors for: one per
    /// frame in a writable buffer, two per frame in a read-only one.
    #[inline]
    fn frames_that_fit(&self, frames: &[TxFrame]) -> usize {
        let mut free = self.tx.ring.free_count();
        let mut k = 0;
        for f in frames {
            let need = if f.buf().region().is_read_only() {
                2
            } else {
                1
            };
            if need > free {
                break;
            }
            free -= need;
            k += 1;
        }
        k
    }

    /// Sends frames from the front of `frames`: as many as the TX ring has room for, after
    /// reclaiming finished buffers. Sent frames are removed from `frames` (their buffers go
    /// back to their pools once the device has used them); unsent ones stay, in order, for the
    /// caller to retry. One doorbell at most per burst, and only if the device asked for it.
    ///
    /// Every frame is checked first; a frame too long or too short, in a buffer mapped in
    /// another DMA domain, or in a file region whose file changed since it was registered,
    /// fails the whole burst with nothing sent. An empty `frames` is
    /// [`VirtioNetError::EmptyBurst`]. A dead device fails the burst as in
    /// [`QueuePair::rx_burst`], with nothing sent.
    ///
    /// A frame in a writable buffer takes one descriptor (the header is written into the
    /// buffer in front of it); a frame in a read-only buffer (a registered file region) takes
    /// two: the queue's own plain header, then the frame, and the buffer is never written.
    pub(crate) fn tx_burst(&mut self, frames: &mut Vec<TxFrame>) -> Result<usize> {
        if frames.is_empty() {
            return Err(VirtioNetError::EmptyBurst(
                "tx_burst got no frames; call reclaim_tx() to only return finished buffers",
            ));
        }
        for (i, f) in frames.iter().enumerate() {
            check_len(i, f.len(), self.max_frame)?;
            let region = f.buf().region();
            region.check_dma(self.domain)?;
            region.check_file()?;
        }
        self.reclaim_tx()?;
        let k = self.frames_that_fit(frames);
        if k < frames.len() {
            self.stats.tx_ring_full += 1;
        }
        if k == 0 {
            return Ok(0);
        }
        for mut f in frames.drain(..k) {
            let (buf, len) = f.parts_mut();
            let pushed = if buf.region().is_read_only() {
                let frame = (buf.iova() + FRAME_OFFSET as u64, len as u32);
                let hdr = (self.tx.hdr_iova, NET_HDR_LEN as u32);
                self.tx.ring.push_chain2(hdr, frame)
            } else {
                // Host memory or a BAR (volatile stores); the block holds FRAME_OFFSET + len
                // bytes (TxFrame::new).
                buf.write_from(0, VirtioNetHdr::PLAIN.as_bytes())
                    .expect("the header fits a writable block");
                self.tx
                    .ring
                    .push(buf.iova(), (FRAME_OFFSET + len) as u32, false)
            };
            let Some(id) = pushed else {
                // Unreachable: frames_that_fit counted the descriptors.
                break;
            };
            self.stats.tx_packets += 1;
            self.stats.tx_bytes += len as u64;
            self.tx.slots[id as usize] = Some(f.into_buf());
        }
        if self.tx.publish_and_kick() {
            self.stats.tx_kicks += 1;
        }
        Ok(k)
    }
}
