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

#![deny(missing_docs)]

pub mod common_cfg;
pub mod ctrl_queue;
pub mod device;
pub mod error;
pub mod features;
pub mod frame;
pub mod net_config;
pub mod net_header;
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
