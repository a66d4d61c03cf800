//! Register offsets of `struct virtio_pci_common_cfg` (virtio 1.2 §4.1.4.3) and the device
//! status bits (§2.1).

/// Selects which 32-bit half of the device feature word `DEVICE_FEATURE` shows.
pub const DEVICE_FEATURE_SELECT: usize = 0x00;
/// Device feature bits (the half chosen by `DEVICE_FEATURE_SELECT`), read-only.
pub const DEVICE_FEATURE: usize = 0x04;
/// Selects which 32-bit half of the driver feature word `DRIVER_FEATURE` writes.
pub const DRIVER_FEATURE_SELECT: usize = 0x08;
/// Driver (accepted) feature bits.
pub const DRIVER_FEATURE: usize = 0x0c;
/// MSI-X vector for configuration changes (u16).
pub const CONFIG_MSIX_VECTOR: usize = 0x10;
/// Number of virtqueues the device supports (u16).
pub const NUM_QUEUES: usize = 0x12;
/// Device status (u8); writing 0 resets the device.
pub const DEVICE_STATUS: usize = 0x14;
/// Configuration atomicity generation (u8).
pub const CONFIG_GENERATION: usize = 0x15;
/// Queue selector for the queue_* registers below (u16).
pub const QUEUE_SELECT: usize = 0x16;
/// Queue size: the device's maximum on read, the driver's choice on write (u16).
pub const QUEUE_SIZE: usize = 0x18;
/// MSI-X vector for the selected queue (u16); [`NO_VECTOR`] for none.
pub const QUEUE_MSIX_VECTOR: usize = 0x1a;
/// Queue enable (u16): write 1 once the queue is configured.
pub const QUEUE_ENABLE: usize = 0x1c;
/// Offset multiplier index for this queue's doorbell (u16).
pub const QUEUE_NOTIFY_OFF: usize = 0x1e;
/// Descriptor table IOVA (u64, written as two u32).
pub const QUEUE_DESC: usize = 0x20;
/// Driver (avail) ring IOVA (u64, written as two u32).
pub const QUEUE_DRIVER: usize = 0x28;
/// Device (used) ring IOVA (u64, written as two u32).
pub const QUEUE_DEVICE: usize = 0x30;

/// "No MSI-X vector": the queue raises no interrupt message; the driver polls.
pub const NO_VECTOR: u16 = 0xffff;

/// Device status bits.
pub mod status {
    /// The guest has noticed the device.
    pub const ACKNOWLEDGE: u8 = 1;
    /// The guest knows how to drive the device.
    pub const DRIVER: u8 = 2;
    /// The driver is set up and ready to drive the device.
    pub const DRIVER_OK: u8 = 4;
    /// Feature negotiation is complete.
    pub const FEATURES_OK: u8 = 8;
    /// The device has hit an error it cannot recover from without a reset.
    pub const DEVICE_NEEDS_RESET: u8 = 0x40;
    /// The driver has given up on the device.
    pub const FAILED: u8 = 0x80;
}
