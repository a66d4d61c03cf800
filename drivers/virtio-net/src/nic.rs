//! The framework's NIC seam ([`ubdirect_core::seams::Nic`], [`NicQueue`]) over a
//! [`VirtioNet`]: a thin adapter, the driver's own API is unchanged.
//!
//! Frames cross as [`NicFrame`]s: a TX frame must start at [`FRAME_OFFSET`] (the driver writes
//! the virtio-net header in front of it, or sends a header of its own before a frame in a
//! read-only buffer), an RX frame comes out at that offset. The adapter
//! keeps two fixed-size staging `Vec`s made when the handle is made, so bursts allocate nothing.

use ubdirect_core::seams::{Nic, NicError, NicErrorKind, NicFrame, NicQueue, NicStats};

use crate::error::VirtioNetError;
use crate::frame::{check_len, RxFrame, TxFrame, FRAME_OFFSET};
use crate::queue_pair::QueuePair;
use crate::stats::NetStats;
use crate::VirtioNet;

/// Frames staged per burst by the adapter.
pub const NIC_BATCH: usize = 64;

/// The seam's error for a driver error: its kind, and the driver's text.
pub fn nic_error(e: VirtioNetError) -> NicError {
    let kind = match &e {
        VirtioNetError::FrameTooLarge { .. }
        | VirtioNetError::FrameTooShort { .. }
        | VirtioNetError::BufferTooSmall { .. }
        | VirtioNetError::EmptyBurst(_)
        | VirtioNetError::InvalidConfig(_) => NicErrorKind::InvalidRequest,
        VirtioNetError::DeviceGone { .. } | VirtioNetError::DeviceNeedsReset { .. } => {
            NicErrorKind::DeviceGone
        }
        VirtioNetError::Ring { .. } => NicErrorKind::Protocol,
        _ => NicErrorKind::Other,
    };
    NicError::new(kind, e.to_string())
}

fn to_nic_stats(s: NetStats) -> NicStats {
    NicStats {
        rx_packets: s.rx_packets,
        rx_bytes: s.rx_bytes,
        rx_drops: s.rx_drops,
        rx_refill_failures: s.rx_refill_failures,
        tx_packets: s.tx_packets,
        tx_bytes: s.tx_bytes,
        tx_ring_full: s.tx_ring_full,
    }
}

/// One virtio-net queue pair as a [`NicQueue`].
pub struct VirtioNicQueue<'a> {
    pair: QueuePair<'a>,
    /// Frames the pair delivered that did not fit the caller's `out` yet (handed out first).
    rx_stash: Vec<RxFrame>,
    tx_stage: Vec<TxFrame>,
}

impl<'a> VirtioNicQueue<'a> {
    /// Wraps `pair`; allocates the staging `Vec`s once.
    pub fn new(pair: QueuePair<'a>) -> VirtioNicQueue<'a> {
        VirtioNicQueue {
            pair,
            rx_stash: Vec::with_capacity(NIC_BATCH),
            tx_stage: Vec::with_capacity(NIC_BATCH),
        }
    }

    fn hand_out(&mut self, out: &mut Vec<NicFrame>) -> usize {
        let k = self.rx_stash.len().min(out.capacity() - out.len());
        for f in self.rx_stash.drain(..k) {
            let (buf, len) = f.into_parts();
            // The driver delivered it within the buffer: NicFrame::new cannot refuse it.
            if let Ok(nf) = NicFrame::new(buf, FRAME_OFFSET, len) {
                out.push(nf);
            }
        }
        k
    }
}

impl NicQueue for VirtioNicQueue<'_> {
    fn max_frame(&self) -> usize {
        self.pair.max_frame()
    }

    fn tx_headroom(&self) -> usize {
        FRAME_OFFSET
    }

    fn rx_burst(&mut self, out: &mut Vec<NicFrame>) -> Result<usize, NicError> {
        if out.capacity() == out.len() {
            return Err(nic_error(VirtioNetError::EmptyBurst(
                "rx_burst needs spare capacity in `out`: create it with Vec::with_capacity(batch) and drain it between calls",
            )));
        }
        let mut n = self.hand_out(out);
        if self.rx_stash.is_empty() && out.len() < out.capacity() {
            self.pair.rx_burst(&mut self.rx_stash).map_err(nic_error)?;
            n += self.hand_out(out);
        }
        Ok(n)
    }

    fn tx_burst(&mut self, frames: &mut Vec<NicFrame>) -> Result<usize, NicError> {
        if frames.is_empty() {
            return Err(nic_error(VirtioNetError::EmptyBurst(
                "tx_burst got no frames; call reclaim_tx() to only return finished buffers",
            )));
        }
        let max = self.pair.max_frame();
        for (i, f) in frames.iter().enumerate() {
            if f.offset() != FRAME_OFFSET {
                return Err(NicError::new(
                    NicErrorKind::InvalidRequest,
                    format!("frame {i} of the burst starts at offset {} of its buffer; virtio-net frames start at {FRAME_OFFSET} (tx_headroom), after the virtio-net header; nothing of this burst was sent", f.offset()),
                ));
            }
            check_len(i, f.len(), max).map_err(nic_error)?;
        }
        let k = frames.len().min(self.tx_stage.capacity());
        for f in frames.drain(..k) {
            let (buf, _, len) = f.into_parts();
            match TxFrame::new(buf, len) {
                Ok(t) => self.tx_stage.push(t),
                // Checked above: offset + len fits the buffer and len >= MIN_FRAME.
                Err((buf, _)) => drop(buf),
            }
        }
        let r = self.pair.tx_burst(&mut self.tx_stage);
        // Unsent frames go back to the front of the caller's Vec, in order (pushed into the
        // room the drain left, then rotated: no allocation).
        let mut unsent = 0;
        for t in self.tx_stage.drain(..) {
            let len = t.len();
            if let Ok(nf) = NicFrame::new(t.into_buf(), FRAME_OFFSET, len) {
                frames.push(nf);
                unsent += 1;
            }
        }
        frames.rotate_right(unsent);
        r.map_err(nic_error)
    }

    fn reclaim_tx(&mut self) -> Result<usize, NicError> {
        self.pair.reclaim_tx().map_err(nic_error)
    }

    fn stats(&self) -> NicStats {
        to_nic_stats(self.pair.stats())
    }
}

impl Nic for VirtioNet {
    fn driver(&self) -> &'static str {
        "virtio-net"
    }

    fn mac(&self) -> Option<[u8; 6]> {
        VirtioNet::mac(self)
    }

    fn link_up(&self) -> Result<Option<bool>, NicError> {
        VirtioNet::link_up(self).map_err(nic_error)
    }

    fn max_frame(&self) -> usize {
        VirtioNet::max_frame(self)
    }

    fn pair_count(&self) -> usize {
        VirtioNet::pair_count(self)
    }

    fn stats(&self) -> NicStats {
        to_nic_stats(VirtioNet::stats(self))
    }

    fn queue(&mut self, i: usize) -> Option<Box<dyn NicQueue + '_>> {
        self.pair(i)
            .map(|p| Box::new(VirtioNicQueue::new(p)) as Box<dyn NicQueue + '_>)
    }
}
