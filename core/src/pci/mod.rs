//! PCI devices opened through VFIO: addresses, checked config-space access, capabilities,
//! BARs, bus mastering and reset.

mod address;
mod capability;
mod device;
mod removal;

pub use address::PciAddress;
pub use capability::PciCapability;
pub use device::PciDevice;
