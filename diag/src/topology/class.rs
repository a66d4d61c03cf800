//! PCI class codes ubdirect cares about, and their names.

/// Mass storage / Non-Volatile memory controller (NVMe), base class and subclass.
pub const CLASS_NVME: u32 = 0x0108;
/// Network / Ethernet controller.
pub const CLASS_ETHERNET: u32 = 0x0200;
/// Base class of display controllers (VGA 0300, XGA 0301, 3D 0302, other 0380).
pub const BASE_DISPLAY: u32 = 0x03;
/// Base class of network controllers.
pub const BASE_NETWORK: u32 = 0x02;
/// Base class of memory controllers (RAM 0500, flash 0501, other 0580: ivshmem is 0500).
pub const BASE_MEMORY: u32 = 0x05;

/// Base class and subclass (`0x0108`) from a 24-bit class code (`0x010802`).
pub fn class_subclass(class: u32) -> u32 {
    (class >> 8) & 0xffff
}

/// What ubdirect does with devices of a class.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceRole {
    /// An NVMe controller (a storage source).
    Nvme,
    /// A network controller (a NIC).
    Nic,
    /// A display / 3D controller (a GPU).
    Gpu,
    /// A memory controller (ivshmem, a BAR stand-in for GPU memory).
    Memory,
    /// Anything else.
    Other,
}

impl DeviceRole {
    /// The role of a 24-bit class code.
    pub fn of_class(class: u32) -> DeviceRole {
        match (class_subclass(class), class >> 16) {
            (CLASS_NVME, _) => DeviceRole::Nvme,
            (_, BASE_NETWORK) => DeviceRole::Nic,
            (_, BASE_DISPLAY) => DeviceRole::Gpu,
            (_, BASE_MEMORY) => DeviceRole::Memory,
            _ => DeviceRole::Other,
        }
    }

    /// Devices `ubdirect devices` lists by default.
    pub fn is_relevant(self) -> bool {
        self != DeviceRole::Other
    }

    /// True for devices whose BAR is a DMA target (GPU memory or its ivshmem stand-in).
    pub fn has_target_bar(self) -> bool {
        matches!(self, DeviceRole::Gpu | DeviceRole::Memory)
    }
}

/// A short name for a 24-bit class code (`0x010802` -> "NVMe").
pub fn class_name(class: u32) -> &'static str {
    match class_subclass(class) {
        0x0100 => "SCSI",
        0x0101 => "IDE",
        0x0106 => "SATA",
        0x0107 => "SAS",
        CLASS_NVME => "NVMe",
        0x0180 => "storage",
        CLASS_ETHERNET => "Ethernet",
        0x0207 => "InfiniBand",
        0x0280 => "network",
        0x0300 => "VGA",
        0x0302 => "3D",
        0x0380 => "display",
        0x0500 => "RAM",
        0x0580 => "memory",
        0x0600 => "host bridge",
        0x0601 => "ISA bridge",
        0x0604 => "PCI bridge",
        0x0c03 => "USB",
        0x0c05 => "SMBus",
        0x1200 => "accelerator",
        _ => match class >> 16 {
            0x01 => "storage",
            0x02 => "network",
            0x03 => "display",
            0x04 => "multimedia",
            0x05 => "memory",
            0x06 => "bridge",
            0x07 => "comms",
            0x08 => "system",
            0x0c => "serial bus",
            0x12 => "accelerator",
            _ => "other",
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles() {
        assert_eq!(DeviceRole::of_class(0x010802), DeviceRole::Nvme);
        assert_eq!(DeviceRole::of_class(0x020000), DeviceRole::Nic);
        assert_eq!(DeviceRole::of_class(0x030200), DeviceRole::Gpu);
        assert_eq!(DeviceRole::of_class(0x050000), DeviceRole::Memory);
        assert_eq!(DeviceRole::of_class(0x060400), DeviceRole::Other);
        assert_eq!(DeviceRole::of_class(0x010601), DeviceRole::Other);
        assert!(DeviceRole::Memory.has_target_bar());
        assert!(!DeviceRole::Nvme.has_target_bar());
    }

    #[test]
    fn names() {
        assert_eq!(class_name(0x010802), "NVMe");
        assert_eq!(class_name(0x020000), "Ethernet");
        assert_eq!(class_name(0x050000), "RAM");
        assert_eq!(class_name(0x0c0330), "USB");
        assert_eq!(class_name(0x0d1100), "other");
    }
}
