//! One PCI device as sysfs describes it: ids, class, driver, IOMMU group, NUMA node, link, BARs
//! and where it hangs in the tree.

use std::fs;
use std::path::Path;

use serde::Serialize;

use super::bar::{parse_resource, BarInfo};
use super::class::{class_name, DeviceRole};
use super::link::LinkInfo;
use super::sysfs::{dir_names, link_name, read_hex, read_opt, SysfsRoot};
use super::TopologyError;
use ubdirect_core::PciAddress;

/// Another device in the same IOMMU group, with its driver.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GroupPeer {
    /// PCI address.
    pub address: String,
    /// Bound driver, `None` when unbound.
    pub driver: Option<String>,
}

/// A PCI device's topology facts.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PciDeviceInfo {
    /// Canonical address, `0000:00:04.0`.
    pub address: String,
    /// Vendor id.
    pub vendor: u16,
    /// Device id.
    pub device: u16,
    /// 24-bit class code (`0x010802`).
    pub class: u32,
    /// Short class name ("NVMe", "Ethernet", "RAM", ...).
    pub class_name: &'static str,
    /// What ubdirect would use it for.
    pub role: DeviceRole,
    /// Bound driver (`nvme`, `vfio-pci`), `None` when unbound.
    pub driver: Option<String>,
    /// `driver_override` when set.
    pub driver_override: Option<String>,
    /// IOMMU group number, `None` without an IOMMU.
    pub iommu_group: Option<u32>,
    /// The other devices in the same IOMMU group.
    pub group_peers: Vec<GroupPeer>,
    /// NUMA node, `None` when the platform reports -1.
    pub numa_node: Option<u32>,
    /// PCIe link state.
    pub link: LinkInfo,
    /// Populated BARs.
    pub bars: Vec<BarInfo>,
    /// The host bridge the device hangs off (`pci0000:00`), when the sysfs path shows it.
    pub root_complex: Option<String>,
    /// The root port above the device (`0000:00:01.0`); `None` for a device on the root bus.
    pub root_port: Option<String>,
}

/// Normalise a PCI address: `00:04.0` and `0000:00:04.0` (any case) become `0000:00:04.0`.
pub fn normalize_address(s: &str) -> Result<String, TopologyError> {
    // One parser for PCI addresses (`PciAddress`); only hex digits and separators pass here
    // (`from_str_radix` alone would take a leading '+').
    if !s
        .bytes()
        .all(|c| c.is_ascii_hexdigit() || c == b':' || c == b'.')
    {
        return Err(TopologyError::BadAddress(s.to_string()));
    }
    s.parse::<PciAddress>()
        .map(|a| a.to_string())
        .map_err(|_| TopologyError::BadAddress(s.to_string()))
}

/// True when `s` is already a canonical `dddd:bb:dd.f` address.
fn is_canonical_address(s: &str) -> bool {
    normalize_address(s).is_ok_and(|n| n == s)
}

/// The NUMA node sysfs gives the device at `addr`: `None` when the file is missing or says -1
/// (no NUMA information).
pub fn numa_node_of(root: &SysfsRoot, addr: &str) -> Result<Option<u32>, TopologyError> {
    Ok(read_opt(&root.pci_device_dir(addr).join("numa_node"))?
        .and_then(|s| s.parse::<i64>().ok())
        .and_then(|n| u32::try_from(n).ok()))
}

/// The driver bound to `addr`, or `None`.
pub fn driver_of(root: &SysfsRoot, addr: &str) -> Result<Option<String>, TopologyError> {
    link_name(&root.pci_device_dir(addr).join("driver"))
}

/// The root complex and root port from a device's sysfs path
/// (`../../../devices/pci0000:00/0000:00:01.0/0000:01:00.0`).
pub fn upstream_of(path: &Path) -> (Option<String>, Option<String>) {
    let comps: Vec<String> = path
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    let Some(rc_idx) = comps
        .iter()
        .position(|c| c.starts_with("pci") && c.contains(':'))
    else {
        return (None, None);
    };
    let chain: Vec<&String> = comps[rc_idx + 1..]
        .iter()
        .filter(|c| is_canonical_address(c))
        .collect();
    let root_port = if chain.len() >= 2 {
        Some(chain[0].clone())
    } else {
        None
    };
    (Some(comps[rc_idx].clone()), root_port)
}

impl PciDeviceInfo {
    /// Read device `addr` (canonical form) below `root`.
    pub fn read(root: &SysfsRoot, addr: &str) -> Result<PciDeviceInfo, TopologyError> {
        let dir = root.pci_device_dir(addr);
        if fs::symlink_metadata(&dir).is_err() {
            return Err(TopologyError::NoSuchDevice(addr.to_string()));
        }
        let vendor = read_hex(&dir.join("vendor"))? as u16;
        let device = read_hex(&dir.join("device"))? as u16;
        let class = read_hex(&dir.join("class"))?;
        let driver = driver_of(root, addr)?;
        let driver_override =
            read_opt(&dir.join("driver_override"))?.filter(|s| !s.is_empty() && s != "(null)");
        let iommu_group = match link_name(&dir.join("iommu_group"))? {
            Some(g) => Some(g.parse::<u32>().map_err(|_| TopologyError::Parse {
                path: dir.join("iommu_group"),
                what: format!("group name {g:?} is not a number"),
            })?),
            None => None,
        };
        let group_peers = match iommu_group {
            Some(g) => group_members(root, g)?
                .into_iter()
                .filter(|p| p.address != addr)
                .collect(),
            None => Vec::new(),
        };
        let numa_node = numa_node_of(root, addr)?;
        let bars = match read_opt(&dir.join("resource"))? {
            Some(text) => parse_resource(&text).map_err(|e| TopologyError::Parse {
                path: dir.join("resource"),
                what: format!("line {}: {}", e.line, e.what),
            })?,
            None => Vec::new(),
        };
        let (root_complex, root_port) = match fs::read_link(&dir) {
            Ok(target) => upstream_of(&target),
            Err(_) => (None, None),
        };
        Ok(PciDeviceInfo {
            address: addr.to_string(),
            vendor,
            device,
            class,
            class_name: class_name(class),
            role: DeviceRole::of_class(class),
            driver,
            driver_override,
            iommu_group,
            group_peers,
            numa_node,
            link: LinkInfo::read(&dir)?,
            bars,
            root_complex,
            root_port,
        })
    }

    /// The largest memory BAR, if any.
    pub fn largest_memory_bar(&self) -> Option<&BarInfo> {
        self.bars.iter().filter(|b| b.memory).max_by_key(|b| b.size)
    }
}

/// Every device in IOMMU group `group`, with its driver.
pub fn group_members(root: &SysfsRoot, group: u32) -> Result<Vec<GroupPeer>, TopologyError> {
    let dir = root
        .path("/sys/kernel/iommu_groups")
        .join(group.to_string())
        .join("devices");
    dir_names(&dir)?
        .into_iter()
        .map(|address| {
            let driver = driver_of(root, &address)?;
            Ok(GroupPeer { address, driver })
        })
        .collect()
}

/// Every PCI device, sorted by address.
pub fn all_devices(root: &SysfsRoot) -> Result<Vec<PciDeviceInfo>, TopologyError> {
    dir_names(&root.path("/sys/bus/pci/devices"))?
        .iter()
        .filter(|a| is_canonical_address(a))
        .map(|a| PciDeviceInfo::read(root, a))
        .collect()
}

/// One device by address in any accepted form (`00:04.0`, `0000:00:04.0`).
pub fn device(root: &SysfsRoot, addr: &str) -> Result<PciDeviceInfo, TopologyError> {
    PciDeviceInfo::read(root, &normalize_address(addr)?)
}
