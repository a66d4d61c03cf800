//! [`VirtioNetError`]: every failure of the driver, each naming its cause and what to do.

use std::time::Duration;

use ubdirect_core::pci::PciAddress;
use ubdirect_core::CoreError;

use crate::features::Features;
use crate::net_config::NetConfigError;
use crate::pci_cap::CapError;
use crate::ring::RingError;

/// Result alias of this crate.
pub type Result<T> = std::result::Result<T, VirtioNetError>;

/// Why a virtio-net operation failed. Bad caller input changes nothing.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum VirtioNetError {
    /// An error from the core crate (VFIO, PCI, pools, DMA memory).
    #[error(transparent)]
    Core(#[from] CoreError),
    /// The device is not a virtio network device.
    #[error("{addr} is not a virtio-net device (vendor {vendor:#06x}, device {device:#06x}; expected 0x1af4:0x1041 or 0x1af4:0x1000)")]
    NotVirtioNet {
        /// The device.
        addr: PciAddress,
        /// PCI vendor id read.
        vendor: u16,
        /// PCI device id read.
        device: u16,
    },
    /// The virtio-pci capabilities are missing or malformed.
    #[error("{addr}: {source}")]
    Capabilities {
        /// The device.
        addr: PciAddress,
        /// What is wrong.
        #[source]
        source: CapError,
    },
    /// A capability points outside its BAR.
    #[error("{addr}: virtio-pci {what} structure at BAR {bar} offset {offset:#x} (+{length:#x}) lies outside the {bar_len:#x}-byte BAR: malformed device")]
    CapOutsideBar {
        /// The device.
        addr: PciAddress,
        /// Which structure.
        what: &'static str,
        /// BAR index.
        bar: u8,
        /// Offset in the BAR.
        offset: u64,
        /// Length of the structure.
        length: u64,
        /// Length of the BAR.
        bar_len: u64,
    },
    /// The device configuration (MAC, status, max_virtqueue_pairs, MTU) is too short for the
    /// negotiated features or holds a value the spec forbids.
    #[error("{addr}: virtio-net device configuration: {source}: malformed device (check the device or its emulation); nothing was set up")]
    DeviceConfig {
        /// The device.
        addr: PciAddress,
        /// What is wrong.
        #[source]
        source: NetConfigError,
    },
    /// The device lacks features this driver requires.
    #[error("{addr} does not offer {missing:?}: this driver needs VIRTIO_F_VERSION_1 (a modern device: QEMU `disable-legacy=on`) and VIRTIO_F_ACCESS_PLATFORM (DMA through the IOMMU, so the device takes IOVAs: QEMU `iommu_platform=on`)")]
    MissingFeatures {
        /// The device.
        addr: PciAddress,
        /// Required features not offered.
        missing: Features,
    },
    /// The device cleared FEATURES_OK: it does not accept the feature subset.
    #[error("{addr} refused the negotiated features {accepted:?} (FEATURES_OK did not stick): the device cannot work with this driver's feature set")]
    FeaturesRejected {
        /// The device.
        addr: PciAddress,
        /// What was written.
        accepted: Features,
    },
    /// The device did not finish a reset in time.
    #[error("{addr} did not complete a reset within {waited:?} (device_status still {status:#04x}): the device is hung; rebind it (scripts/setup.sh) or reset the machine")]
    ResetTimeout {
        /// The device.
        addr: PciAddress,
        /// How long we waited.
        waited: Duration,
        /// Last status read.
        status: u8,
    },
    /// The device signalled DEVICE_NEEDS_RESET or FAILED.
    #[error("{addr} reports device_status {status:#04x} (DEVICE_NEEDS_RESET/FAILED): drop the VirtioNet and open the device again")]
    DeviceNeedsReset {
        /// The device.
        addr: PciAddress,
        /// Status read.
        status: u8,
    },
    /// The device is gone: all-ones from its registers, device_status reading 0 or without
    /// DRIVER_OK after bring-up, or a BAR that no longer decodes.
    #[error("{addr} is gone: {cause}. Drop the VirtioNet (it returns its buffers only if a reset is confirmed, else they stay out of the pool since the device may still DMA), rebind the device to vfio-pci (scripts/setup.sh) and reopen")]
    DeviceGone {
        /// The device.
        addr: PciAddress,
        /// What was read.
        cause: &'static str,
    },
    /// A queue the driver needs does not exist.
    #[error("{addr}: virtqueue {queue} is not available (size 0, device has {num_queues} queues): ask for fewer queue pairs")]
    QueueUnavailable {
        /// The device.
        addr: PciAddress,
        /// Queue index.
        queue: u16,
        /// Queues the device reports.
        num_queues: u16,
    },
    /// The device did not accept NO_VECTOR for a queue (queue 0xffff: the config vector).
    #[error("{addr}: queue {queue} MSI-X vector reads back {read:#06x} after writing NO_VECTOR (0xffff; queue 65535 means the config-change vector): the device does not support polling mode")]
    MsixVector {
        /// The device.
        addr: PciAddress,
        /// Queue index.
        queue: u16,
        /// Value read back.
        read: u16,
    },
    /// A queue's doorbell lies outside the notify structure.
    #[error("{addr}: queue {queue} doorbell at notify offset {offset:#x} lies outside the {len:#x}-byte notify structure: malformed device")]
    NotifyOutOfRange {
        /// The device.
        addr: PciAddress,
        /// Queue index.
        queue: u16,
        /// Offset computed from queue_notify_off x multiplier.
        offset: u64,
        /// Length of the notify structure.
        len: u64,
    },
    /// The used ring is malformed: the device reported something never given to it.
    #[error("{addr} queue {queue}: {source}")]
    Ring {
        /// The device.
        addr: PciAddress,
        /// Queue index.
        queue: u16,
        /// What was wrong.
        #[source]
        source: RingError,
    },
    /// A TX frame is longer than the device accepts.
    #[error("frame {index} of the burst is {len} bytes, longer than the device's maximum frame of {max} bytes (MTU + 14); nothing of this burst was sent: split the data or raise the MTU (QEMU host_mtu=...)")]
    FrameTooLarge {
        /// Position in the burst.
        index: usize,
        /// Frame length.
        len: usize,
        /// Maximum frame length.
        max: usize,
    },
    /// A TX frame is shorter than an Ethernet header.
    #[error("frame {index} of the burst is {len} bytes, shorter than an Ethernet header ({min} bytes); nothing of this burst was sent")]
    FrameTooShort {
        /// Position in the burst.
        index: usize,
        /// Frame length.
        len: usize,
        /// Minimum frame length.
        min: usize,
    },
    /// A buffer cannot hold header + frame.
    #[error("a {have}-byte buffer cannot hold the 12-byte virtio-net header plus a {frame}-byte frame ({need} bytes): use a pool with larger blocks")]
    BufferTooSmall {
        /// Bytes needed.
        need: usize,
        /// Frame length.
        frame: usize,
        /// Buffer length.
        have: usize,
    },
    /// The RX pool's blocks are smaller than the largest frame the device can deliver.
    #[error("RX pool blocks are {block_size} bytes but the device can deliver {need} bytes (12-byte header + {max_frame}-byte frame) into one buffer: create the pool with block_size >= {need}")]
    RxBlocksTooSmall {
        /// The pool's block size.
        block_size: usize,
        /// Bytes needed per buffer.
        need: usize,
        /// Maximum frame.
        max_frame: usize,
    },
    /// The RX pool's region is read-only (a registered file): the device cannot write
    /// received frames into it.
    #[error("the RX pool is carved from UB region {region}, which is read-only (a registered file region: its IOMMU mapping lets devices read it only), so the device could not write received frames into it: give an RX pool of writable memory (UbPool::with_hugepages, UbPool::with_anonymous)")]
    RxPoolReadOnly {
        /// The pool's region.
        region: u32,
    },
    /// The RX pool has fewer blocks than the RX rings hold.
    #[error("RX pool has {blocks} blocks but the RX ring(s) need {need} ({pairs} pair(s) x {ring} entries) to stay full: create the pool with block_count >= {need} or ask for a smaller rx_queue_size")]
    RxPoolTooSmall {
        /// Blocks in the pool.
        blocks: usize,
        /// Blocks needed.
        need: usize,
        /// Queue pairs.
        pairs: usize,
        /// RX ring entries per pair.
        ring: usize,
    },
    /// An empty TX burst, or an RX burst with no room to put frames.
    #[error("empty burst: {0}")]
    EmptyBurst(&'static str),
    /// A configuration value is invalid; nothing was changed.
    #[error("invalid virtio-net configuration: {0}")]
    InvalidConfig(String),
    /// A control-queue command got no answer within `NetConfig::ctrl_timeout`; the control
    /// queue is wedged from now on.
    #[error("{addr}: control command {what} got no answer within {waited:?}: the control queue is wedged (no later control command is sent, the device may still own the command buffer); drop the VirtioNet and open the device again")]
    ControlTimeout {
        /// The device.
        addr: PciAddress,
        /// Which command.
        what: &'static str,
        /// How long it waited.
        waited: Duration,
    },
    /// A control command was not sent because an earlier one timed out or was answered
    /// malformed.
    #[error("{addr}: control command {what} not sent: {cause}, so the control queue is wedged; drop the VirtioNet and open the device again")]
    ControlQueueWedged {
        /// The device.
        addr: PciAddress,
        /// Which command.
        what: &'static str,
        /// What wedged it.
        cause: &'static str,
    },
    /// A control-queue command failed.
    #[error("{addr}: control command {what} failed: {reason}")]
    ControlCommand {
        /// The device.
        addr: PciAddress,
        /// Which command.
        what: &'static str,
        /// Why.
        reason: String,
    },
}
