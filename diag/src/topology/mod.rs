//! PCI topology from sysfs: devices, drivers, IOMMU groups, NUMA nodes, links and BARs, plus the
//! system facts a pre-flight check needs (IOMMU mode, vfio modules, hugepages, memlock,
//! lockdown). Everything reads below an injectable [`SysfsRoot`], so host tests use a fake tree.
//!
//! ```no_run
//! use ubdirect_diag::topology::{self, SysfsRoot};
//! let root = SysfsRoot::system();
//! for dev in topology::all_devices(&root)? {
//!     println!("{} {:?} group {:?}", dev.address, dev.driver, dev.iommu_group);
//! }
//! # Ok::<(), topology::TopologyError>(())
//! ```

mod bar;
mod class;
mod device;
pub mod drivers;
mod link;
pub mod preflight;
mod sysfs;
mod system;

#[cfg(test)]
mod fake;
#[cfg(test)]
mod preflight_tests;
#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};

pub use bar::{human_size, parse_resource, BarInfo, BarParseError};
pub use class::{class_name, class_subclass, DeviceRole, CLASS_ETHERNET, CLASS_NVME};
pub use device::{
    all_devices, device, driver_of, group_members, normalize_address, numa_node_of, upstream_of,
    GroupPeer, PciDeviceInfo,
};
pub use link::{parse_link_speed, parse_link_width, pcie_generation, LinkInfo};
pub use sysfs::SysfsRoot;
pub use system::{
    has_cap_ipc_lock, hugepage_pools, iommu_cmdline, iommu_mode, iommu_state, memlock,
    parse_lockdown, system, vfio_state, HugepagePool, IommuMode, IommuState, Memlock, SystemInfo,
    VfioState,
};

/// Why topology could not be read.
#[derive(Debug, thiserror::Error)]
pub enum TopologyError {
    /// A malformed PCI address.
    #[error("malformed PCI address {0:?}: write it as 0000:00:04.0 or 00:04.0")]
    BadAddress(String),
    /// No such device in sysfs.
    #[error("no PCI device {0} in /sys/bus/pci/devices")]
    NoSuchDevice(String),
    /// A sysfs file could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The hugepage pools could not be read.
    #[error("cannot read the hugepage pools: {0}")]
    Hugepages(#[source] ubdirect_hugepages::HugeError),
    /// A sysfs file held something unexpected.
    #[error("unexpected contents in {path}: {what}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What was wrong.
        what: String,
    },
}

impl TopologyError {
    pub(crate) fn io(path: &Path, source: std::io::Error) -> Self {
        TopologyError::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}
