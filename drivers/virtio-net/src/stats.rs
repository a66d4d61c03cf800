//! Per-queue-pair counters (plain integers: a queue pair is owned by one thread).

use std::ops::AddAssign;

/// Counters of one queue pair, or the sum over all pairs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct NetStats {
    /// Frames received and handed to the caller.
    pub rx_packets: u64,
    /// Bytes of those frames (without the virtio-net header).
    pub rx_bytes: u64,
    /// Received buffers dropped: shorter than the header, or longer than the buffer.
    pub rx_drops: u64,
    /// RX refill attempts that found the pool empty (the ring ran with fewer buffers).
    pub rx_refill_failures: u64,
    /// RX doorbells rung.
    pub rx_kicks: u64,
    /// Frames handed to the device for sending.
    pub tx_packets: u64,
    /// Bytes of those frames.
    pub tx_bytes: u64,
    /// TX bursts that found the ring full before every frame was queued.
    pub tx_ring_full: u64,
    /// TX buffers the device finished with and the driver returned to their pool.
    pub tx_reclaimed: u64,
    /// TX doorbells rung.
    pub tx_kicks: u64,
    /// device_status reads by the burst calls after the pair made no progress for the health
    /// interval (see [`crate::health`]).
    pub status_reads: u64,
}

impl AddAssign for NetStats {
    fn add_assign(&mut self, o: NetStats) {
        self.rx_packets += o.rx_packets;
        self.rx_bytes += o.rx_bytes;
        self.rx_drops += o.rx_drops;
        self.rx_refill_failures += o.rx_refill_failures;
        self.rx_kicks += o.rx_kicks;
        self.tx_packets += o.tx_packets;
        self.tx_bytes += o.tx_bytes;
        self.tx_ring_full += o.tx_ring_full;
        self.tx_reclaimed += o.tx_reclaimed;
        self.tx_kicks += o.tx_kicks;
        self.status_reads += o.status_reads;
    }
}
