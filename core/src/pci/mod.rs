//! PCI devices opened through VFIO: addresses, checked config-space access, capabilities,
//! BARs, bus mastering and reset; or the same API over an in-process [`DeviceModel`].

mod address;
mod capability;
mod claim;
mod device;
mod model;
mod numa;
mod removal;

pub use address::PciAddress;
pub use capability::PciCapability;
pub(crate) use claim::{BarLease, BarRangeRecord};
pub use claim::{DeviceAccess, DeviceClaim};
pub use device::PciDevice;
pub use model::DeviceModel;
pub use numa::{numa_node, numa_node_below};
