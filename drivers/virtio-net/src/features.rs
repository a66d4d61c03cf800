//! Virtio feature bits (virtio 1.2 §6 reserved bits and §5.1.3 virtio-net bits).

use bitflags::bitflags;

bitflags! {
    /// The 64-bit feature word a virtio device offers and a driver accepts.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub struct Features: u64 {
        /// Device handles packets with partial checksum (TX checksum offload).
        const NET_CSUM = 1 << 0;
        /// Driver handles packets with partial checksum (RX checksum offload).
        const NET_GUEST_CSUM = 1 << 1;
        /// Control channel offloads reconfiguration.
        const NET_CTRL_GUEST_OFFLOADS = 1 << 2;
        /// Device reports its maximum MTU in the config space.
        const NET_MTU = 1 << 3;
        /// Device has a MAC address in the config space.
        const NET_MAC = 1 << 5;
        /// Driver can receive TSOv4.
        const NET_GUEST_TSO4 = 1 << 7;
        /// Driver can receive TSOv6.
        const NET_GUEST_TSO6 = 1 << 8;
        /// Driver can receive TSO with ECN.
        const NET_GUEST_ECN = 1 << 9;
        /// Driver can receive UFO.
        const NET_GUEST_UFO = 1 << 10;
        /// Device can receive TSOv4.
        const NET_HOST_TSO4 = 1 << 11;
        /// Device can receive TSOv6.
        const NET_HOST_TSO6 = 1 << 12;
        /// Device can receive TSO with ECN.
        const NET_HOST_ECN = 1 << 13;
        /// Device can receive UFO.
        const NET_HOST_UFO = 1 << 14;
        /// Driver can merge receive buffers.
        const NET_MRG_RXBUF = 1 << 15;
        /// Config status field (link state) is available.
        const NET_STATUS = 1 << 16;
        /// Control virtqueue is available.
        const NET_CTRL_VQ = 1 << 17;
        /// Control channel RX mode support.
        const NET_CTRL_RX = 1 << 18;
        /// Control channel VLAN filtering.
        const NET_CTRL_VLAN = 1 << 19;
        /// Driver can send gratuitous packets.
        const NET_GUEST_ANNOUNCE = 1 << 21;
        /// Device supports multiqueue with automatic receive steering.
        const NET_MQ = 1 << 22;
        /// Set MAC address through the control channel.
        const NET_CTRL_MAC_ADDR = 1 << 23;
        /// Descriptors may be indirect tables.
        const INDIRECT_DESC = 1 << 28;
        /// used_event / avail_event notification suppression.
        const EVENT_IDX = 1 << 29;
        /// Virtio 1.x (modern) device; little-endian everywhere.
        const VERSION_1 = 1 << 32;
        /// Device DMA goes through the platform IOMMU: addresses are IOVAs.
        const ACCESS_PLATFORM = 1 << 33;
        /// Packed virtqueue layout.
        const RING_PACKED = 1 << 34;
        /// Device uses buffers in the order they were made available.
        const IN_ORDER = 1 << 35;
        /// Platform memory ordering is required.
        const ORDER_PLATFORM = 1 << 36;
        /// Device supports single-root I/O virtualisation.
        const SR_IOV = 1 << 37;
        /// Driver passes extra data in notifications.
        const NOTIFICATION_DATA = 1 << 38;
        /// Device reports speed and duplex.
        const NET_SPEED_DUPLEX = 1 << 63;
    }
}

/// Features this driver must get, or it refuses the device.
pub const REQUIRED: Features = Features::VERSION_1.union(Features::ACCESS_PLATFORM);

/// Features this driver takes when offered. No checksum, TSO/UFO or mergeable-RX-buffer
/// features are accepted: every frame is one descriptor carrying header + full frame.
pub const WANTED: Features = Features::VERSION_1
    .union(Features::ACCESS_PLATFORM)
    .union(Features::NET_MAC)
    .union(Features::NET_STATUS)
    .union(Features::NET_MTU)
    .union(Features::EVENT_IDX)
    .union(Features::NET_CTRL_VQ)
    .union(Features::NET_CTRL_RX)
    .union(Features::NET_MQ);

/// The outcome of negotiation: what to write back to the device, or the required features
/// that are missing.
///
/// The control queue (CTRL_VQ, with CTRL_RX for receive-filter modes) is taken when offered.
/// Multiqueue is taken only when `want_pairs > 1` and the control queue is there (the pair
/// count is set through it); with one pair the device stays in its single-pair default.
pub fn negotiate(offered: Features, want_pairs: u16) -> Result<Features, Features> {
    let missing = REQUIRED.difference(offered);
    if !missing.is_empty() {
        return Err(missing);
    }
    let mut accepted = offered.intersection(WANTED);
    if !accepted.contains(Features::NET_CTRL_VQ) {
        // Both depend on the control queue.
        accepted.remove(Features::NET_CTRL_RX | Features::NET_MQ);
    }
    if want_pairs <= 1 {
        accepted.remove(Features::NET_MQ);
    }
    Ok(accepted)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_without_access_platform() {
        let offered = Features::VERSION_1 | Features::NET_MAC;
        assert_eq!(negotiate(offered, 1), Err(Features::ACCESS_PLATFORM));
    }

    #[test]
    fn refuses_legacy_only() {
        let offered = Features::ACCESS_PLATFORM | Features::NET_MAC;
        assert_eq!(negotiate(offered, 1), Err(Features::VERSION_1));
    }

    #[test]
    fn drops_offloads_and_mrg_rxbuf() {
        let offered = Features::all();
        let got = negotiate(offered, 1).unwrap();
        assert!(got.contains(REQUIRED | Features::EVENT_IDX | Features::NET_MAC));
        assert!(!got.intersects(
            Features::NET_CSUM
                | Features::NET_GUEST_CSUM
                | Features::NET_HOST_TSO4
                | Features::NET_GUEST_TSO4
                | Features::NET_MRG_RXBUF
                | Features::RING_PACKED
                | Features::INDIRECT_DESC
        ));
        assert!(got.contains(Features::NET_CTRL_VQ | Features::NET_CTRL_RX));
        assert!(!got.contains(Features::NET_MQ), "one pair: no multiqueue");
    }

    #[test]
    fn mq_only_with_ctrl_vq_and_more_than_one_pair() {
        let base = REQUIRED | Features::NET_MQ | Features::NET_CTRL_RX;
        let no_ctrl = negotiate(base, 4).unwrap();
        assert!(!no_ctrl.intersects(Features::NET_MQ | Features::NET_CTRL_RX));
        let with_ctrl = base | Features::NET_CTRL_VQ;
        assert!(negotiate(with_ctrl, 4)
            .unwrap()
            .contains(Features::NET_MQ | Features::NET_CTRL_VQ));
        assert!(!negotiate(with_ctrl, 1).unwrap().contains(Features::NET_MQ));
    }
}
