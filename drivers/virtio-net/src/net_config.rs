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

/// The smallest MTU a device may report (virtio 1.2 §5.1.4.1: at least 68).
pub const MIN_MTU: u16 = 68;
/// The largest `max_virtqueue_pairs` the spec allows (§5.1.4.1); the control queue of such a
/// device would be queue 0x10000, which a 16-bit queue_select cannot name.
pub const MAX_VIRTQUEUE_PAIRS_LIMIT: u16 = 0x8000;

/// The fields of `struct virtio_net_config` this driver uses, read and checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NetDeviceConfig {
    /// MAC address (VIRTIO_NET_F_MAC accepted).
    pub mac: Option<[u8; 6]>,
    /// `max_virtqueue_pairs` (1 when the device does not offer MQ or the field is unusable
    /// and MQ was not accepted).
    pub max_pairs: u16,
    /// MTU (VIRTIO_NET_F_MTU accepted).
    pub mtu: Option<u16>,
}

/// Why the device configuration cannot be used: a field the negotiated features promise lies
/// beyond the window the device exposes, or holds a value the spec forbids.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NetConfigError {
    /// The device-configuration window is shorter than a field the driver must read.
    #[error("field `{field}` (bytes {off}..{end}) lies beyond the {len}-byte device configuration window the device exposes")]
    Short {
        /// The field.
        field: &'static str,
        /// Its offset.
        off: usize,
        /// One past its last byte.
        end: usize,
        /// The window's length.
        len: usize,
    },
    /// The device offers MAC/STATUS/MQ/MTU but has no device configuration at all.
    #[error("the device offers {what} but has no device-specific configuration capability")]
    Missing {
        /// The feature whose field is missing.
        what: &'static str,
    },
    /// A field holds a value the spec forbids.
    #[error("field `{field}` reads {value:#x}: {why}")]
    BadValue {
        /// The field.
        field: &'static str,
        /// The value read.
        value: u32,
        /// Which rule it breaks.
        why: &'static str,
    },
}

/// Reads and checks the device configuration. `len` is the window's length (None: the device
/// has no device configuration); `read8`/`read16` read the window and are only called inside
/// `0..len`. `offered` / `accepted` are the device's and the negotiated feature bits.
pub fn parse_net_config(
    offered: crate::Features,
    accepted: crate::Features,
    len: Option<usize>,
    read8: impl Fn(usize) -> u8,
    read16: impl Fn(usize) -> u16,
) -> Result<NetDeviceConfig, NetConfigError> {
    use crate::Features as F;
    let need = |field: &'static str, what: &'static str, off: usize, size: usize| {
        let end = off + size;
        match len {
            None => Err(NetConfigError::Missing { what }),
            Some(len) if end > len => Err(NetConfigError::Short {
                field,
                off,
                end,
                len,
            }),
            Some(_) => Ok(()),
        }
    };
    let mac = if accepted.contains(F::NET_MAC) {
        need("mac", "VIRTIO_NET_F_MAC", MAC, 6)?;
        let mut m = [0u8; 6];
        for (i, b) in m.iter_mut().enumerate() {
            *b = read8(MAC + i);
        }
        Some(m)
    } else {
        None
    };
    if accepted.contains(F::NET_STATUS) {
        // Read later by `link_up`: the window must hold it.
        need("status", "VIRTIO_NET_F_STATUS", STATUS, 2)?;
    }
    let mut max_pairs = 1;
    if accepted.contains(F::NET_MQ) {
        need(
            "max_virtqueue_pairs",
            "VIRTIO_NET_F_MQ",
            MAX_VIRTQUEUE_PAIRS,
            2,
        )?;
        let v = read16(MAX_VIRTQUEUE_PAIRS);
        if v == 0 || v >= MAX_VIRTQUEUE_PAIRS_LIMIT {
            return Err(NetConfigError::BadValue {
                field: "max_virtqueue_pairs",
                value: v.into(),
                why: "must be 1..=0x7fff (the spec allows up to 0x8000, but then the control queue index 2 x 0x8000 does not fit the 16-bit queue_select)",
            });
        }
        max_pairs = v;
    } else if offered.contains(F::NET_MQ) && len.is_some_and(|l| l >= MAX_VIRTQUEUE_PAIRS + 2) {
        // Informational only (MQ not used): an impossible value reads as 1.
        let v = read16(MAX_VIRTQUEUE_PAIRS);
        if (1..MAX_VIRTQUEUE_PAIRS_LIMIT).contains(&v) {
            max_pairs = v;
        }
    }
    let mtu = if accepted.contains(F::NET_MTU) {
        need("mtu", "VIRTIO_NET_F_MTU", MTU, 2)?;
        let v = read16(MTU);
        if v < MIN_MTU {
            return Err(NetConfigError::BadValue {
                field: "mtu",
                value: v.into(),
                why: "below the 68 bytes the spec requires",
            });
        }
        Some(v)
    } else {
        None
    };
    Ok(NetDeviceConfig {
        mac,
        max_pairs,
        mtu,
    })
}

/// The control queue's index: `2 x max_virtqueue_pairs` with MQ accepted, else 2; checked
/// against the queues the device has (`num_queues`) and computed without overflow.
pub fn ctrl_queue_index(
    accepted: crate::Features,
    max_pairs: u16,
    num_queues: u16,
) -> Result<u16, NetConfigError> {
    let mq = accepted.contains(crate::Features::NET_MQ);
    if mq && (max_pairs == 0 || max_pairs >= MAX_VIRTQUEUE_PAIRS_LIMIT) {
        return Err(NetConfigError::BadValue {
            field: "max_virtqueue_pairs",
            value: max_pairs.into(),
            why: "must be 1..=0x7fff (2 x 0x8000 does not fit the 16-bit queue_select)",
        });
    }
    let q: u32 = if mq { 2 * u32::from(max_pairs) } else { 2 };
    if q >= u32::from(num_queues) {
        return Err(NetConfigError::BadValue {
            field: "num_queues",
            value: num_queues.into(),
            why: "the device has fewer queues than its control queue's index needs (2 x max_virtqueue_pairs with MQ, else 2)",
        });
    }
    Ok(q as u16)
}

#[cfg(test)]
#[path = "net_config_tests.rs"]
mod tests;
