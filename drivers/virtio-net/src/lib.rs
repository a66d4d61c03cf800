//! ubdirect-virtio-net: a userspace poll-mode driver for virtio-net devices (modern
//! virtio-pci, split virtqueues) over vfio-pci.
//!
//! ```text
//! VirtioNet::open(registry, addr, rx_pool, NetConfig::default())
//!   tx_burst(&mut Vec<TxFrame>)  -> frames sent (removed from the front), the rest stay
//!   rx_burst(&mut Vec<RxFrame>)  -> frames appended up to the Vec's spare capacity
//! ```
//! Zero copy: each frame is one descriptor pointing at a `UbBuf` whose first 12 bytes hold
//! the virtio-net header; the Ethernet frame follows at [`FRAME_OFFSET`]. No checksum, TSO or
//! mergeable-buffer offloads are negotiated, so the largest frame is MTU + 14 (1514 without
//! VIRTIO_NET_F_MTU). Interrupts are off (NO_VECTOR, used_event kept behind); doorbells are
//! rung only when the device asks (VIRTIO_F_EVENT_IDX).
//!
//! A dead NIC is an error, not a quiet link: the burst calls read no register while frames
//! move, but once a queue pair has moved nothing for `NetConfig::health_interval` (default
//! 100 ms; the clock is read once per 256 idle polls) the next idle `rx_burst` / `reclaim_tx` /
//! `tx_burst` reads device_status once and returns `DeviceGone` (all-ones, 0, or DRIVER_OK
//! lost: QEMU reads 0 from a vanished device) or `DeviceNeedsReset`; every later burst call on
//! that pair returns the same error. A poll loop that propagates burst errors with `?` cannot
//! miss it (see `facade/examples/nic_burst.rs`). Then drop the `VirtioNet`: its reset is trusted only
//! if the BAR still decodes, otherwise its rings and buffers are leaked rather than returned
//! to a pool the device may still write (see [`health`] and `VirtioNet::shutdown`).

#![deny(missing_docs)]

pub mod common_cfg;
pub mod ctrl_queue;
pub mod device;
pub mod error;
pub mod features;
pub mod frame;
#[cfg(test)]
mod fuzz_cases;
pub mod health;
pub mod net_config;
pub mod net_header;
pub mod nic;
mod pair_handle;
pub mod pattern;
pub mod pci_cap;
pub mod queue_pair;
pub mod ring;
pub mod stats;
pub mod transport;

pub use device::{NetConfig, NetInfo, VirtioNet};
pub use error::{Result, VirtioNetError};
pub use features::Features;
pub use frame::{RxFrame, TxFrame, FRAME_OFFSET};
pub use queue_pair::QueuePair;
pub use stats::NetStats;
