//! Offsets inside `struct virtio_net_config` (virtio 1.2 §5.1.4), the device-specific
//! configuration structure of a network device.

/// MAC address, 6 bytes (valid with VIRTIO_NET_F_MAC).
pub const MAC: usize = 0;
/// Link status (u16, valid with VIRTIO_NET_F_STATUS).
pub const STATUS: usize = 6;
/// Maximum number of RX/TX queue pairs (u16, valid with VIRTIO_NET_F_MQ).
pub const MAX_VIRTQUEUE_PAIRS: usize = 8;
/// Maximum MTU the driver should use (u16, valid with VIRTIO_NET_F_MTU).
pub const MTU: usize = 10;

/// `STATUS` bit: link is up.
pub const STATUS_LINK_UP: u16 = 1;
/// `STATUS` bit: the driver should send a gratuitous announcement.
pub const STATUS_ANNOUNCE: u16 = 2;

/// Ethernet header length (destination, source, ethertype).
pub const ETH_HLEN: usize = 14;
/// The largest frame (without FCS) when no MTU feature is offered: 1500 + 14.
pub const DEFAULT_MAX_FRAME: usize = 1514;
/// Shortest frame a driver hands over (a device pads to 60 on the wire; we require 14+).
pub const MIN_FRAME: usize = ETH_HLEN;
