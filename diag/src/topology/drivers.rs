//! Which devices a ubdirect driver can drive: the one table `doctor` reads to tell a device on
//! vfio-pci that ubdirect can use from one it cannot (an Intel NIC no driver supports). A new
//! driver adds its ids here.

use super::device::PciDeviceInfo;

/// How a driver recognises its devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdMatch {
    /// Every device of this 24-bit class code (base class, subclass, programming interface):
    /// a standard interface such as NVMe (`0x010802`), whatever the vendor.
    Class(u32),
    /// One vendor:device id pair.
    Id {
        /// PCI vendor id.
        vendor: u16,
        /// PCI device id.
        device: u16,
    },
}

impl IdMatch {
    /// True when `d` is one of the devices this entry names.
    pub fn matches(&self, d: &PciDeviceInfo) -> bool {
        match *self {
            IdMatch::Class(c) => d.class == c,
            IdMatch::Id { vendor, device } => d.vendor == vendor && d.device == device,
        }
    }
}

impl std::fmt::Display for IdMatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            IdMatch::Class(c) => write!(f, "class {c:06x}"),
            IdMatch::Id { vendor, device } => write!(f, "{vendor:04x}:{device:04x}"),
        }
    }
}

/// One device (or class of devices) a ubdirect driver takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DriverMatch {
    /// The ubdirect driver (`nvme`, `virtio-net`).
    pub driver: &'static str,
    /// The devices it takes.
    pub ids: IdMatch,
}

/// Every device a ubdirect driver supports (ubdirect-nvme: any NVMe controller by class;
/// ubdirect-virtio-net: modern and transitional virtio-net).
pub const SUPPORTED: &[DriverMatch] = &[
    DriverMatch {
        driver: "nvme",
        ids: IdMatch::Class(0x010802),
    },
    DriverMatch {
        driver: "virtio-net",
        ids: IdMatch::Id {
            vendor: 0x1af4,
            device: 0x1041,
        },
    },
    DriverMatch {
        driver: "virtio-net",
        ids: IdMatch::Id {
            vendor: 0x1af4,
            device: 0x1000,
        },
    },
    igb(0x10c9),
    igb(0x10e6),
    igb(0x10e7),
    igb(0x10e8),
    igb(0x1526),
    igb(0x150a),
    igb(0x1518),
    igb(0x150d),
    DriverMatch {
        driver: "igb-vf",
        ids: IdMatch::Id {
            vendor: 0x8086,
            device: 0x10ca,
        },
    },
];

/// An Intel 82576 physical function (`ubdirect-igb`; the same ids as its `regs::PF_DEVICE_IDS`,
/// which `tests/doctor_driver_ids.rs` compares).
const fn igb(device: u16) -> DriverMatch {
    DriverMatch {
        driver: "igb",
        ids: IdMatch::Id {
            vendor: 0x8086,
            device,
        },
    }
}

/// What ubdirect can do with a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Support {
    /// A ubdirect driver in [`SUPPORTED`] takes it.
    Driver(&'static str),
    /// No driver needed: its BAR is a DMA target (a GPU, or ivshmem standing in for one).
    BarTarget,
    /// Nothing in ubdirect can use it.
    None,
}

/// What ubdirect can do with `d`, from [`SUPPORTED`] and the device's role.
pub fn support(d: &PciDeviceInfo) -> Support {
    if let Some(m) = SUPPORTED.iter().find(|m| m.ids.matches(d)) {
        return Support::Driver(m.driver);
    }
    if d.role.has_target_bar() {
        return Support::BarTarget;
    }
    Support::None
}

/// The drivers and the ids they take, for messages: "nvme (class 010802), virtio-net (1af4:1041,
/// 1af4:1000)".
pub fn supported_list() -> String {
    let mut out: Vec<String> = Vec::new();
    let mut drivers: Vec<&str> = Vec::new();
    for m in SUPPORTED {
        if !drivers.contains(&m.driver) {
            drivers.push(m.driver);
        }
    }
    for drv in drivers {
        let ids: Vec<String> = SUPPORTED
            .iter()
            .filter(|m| m.driver == drv)
            .map(|m| m.ids.to_string())
            .collect();
        out.push(format!("{drv} ({})", ids.join(", ")));
    }
    out.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::{class_name, DeviceRole, LinkInfo};

    fn dev(vendor: u16, device: u16, class: u32) -> PciDeviceInfo {
        PciDeviceInfo {
            address: "0000:00:05.0".into(),
            vendor,
            device,
            class,
            class_name: class_name(class),
            role: DeviceRole::of_class(class),
            driver: None,
            driver_override: None,
            iommu_group: None,
            group_peers: vec![],
            numa_node: None,
            link: LinkInfo::default(),
            bars: vec![],
            root_complex: None,
            root_port: None,
        }
    }

    #[test]
    fn support_by_class_by_id_and_bar_targets() {
        assert_eq!(
            support(&dev(0x144d, 0xa808, 0x010802)),
            Support::Driver("nvme")
        );
        // An NVMe-class device with another interface (an admin-only controller) is not NVMe I/O.
        assert_eq!(support(&dev(0x144d, 0xa808, 0x010803)), Support::None);
        assert_eq!(
            support(&dev(0x1af4, 0x1041, 0x020000)),
            Support::Driver("virtio-net")
        );
        assert_eq!(
            support(&dev(0x1af4, 0x1000, 0x020000)),
            Support::Driver("virtio-net")
        );
        assert_eq!(
            support(&dev(0x1af4, 0x1042, 0x010000)),
            Support::None,
            "virtio-blk"
        );
        assert_eq!(
            support(&dev(0x8086, 0x10c9, 0x020000)),
            Support::Driver("igb"),
            "82576 PF"
        );
        assert_eq!(
            support(&dev(0x8086, 0x10ca, 0x020000)),
            Support::Driver("igb-vf"),
            "82576 VF"
        );
        assert_eq!(
            support(&dev(0x8086, 0x10d3, 0x020000)),
            Support::None,
            "e1000e"
        );
        assert_eq!(support(&dev(0x1af4, 0x1110, 0x050000)), Support::BarTarget);
        assert_eq!(support(&dev(0x10de, 0x2330, 0x030200)), Support::BarTarget);
    }

    #[test]
    fn list_names_each_driver_once_with_its_ids() {
        let l = supported_list();
        assert!(l.starts_with("nvme (class 010802), "), "{l}");
        assert!(l.contains("virtio-net (1af4:1041, 1af4:1000)"), "{l}");
        for m in SUPPORTED {
            assert_eq!(l.matches(&format!("{} (", m.driver)).count(), 1, "{l}");
        }
    }
}
