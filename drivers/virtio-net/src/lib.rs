//! ubdirect-virtio-net: a userspace poll-mode driver for virtio-net devices (modern
//! virtio-pci, split virtqueues) over vfio-pci.

pub mod common_cfg;
pub mod features;
pub mod net_config;
pub mod net_header;
pub mod pci_cap;
pub mod ring;
