//! Sysfs checks before opening a device through VFIO, so failures name their cause: no such
//! device, no IOMMU group (IOMMU off), bound to another driver, group not viable.

use std::fs;
use std::path::Path;

use crate::error::{CoreError, Result};
use crate::pci::PciAddress;

/// What sysfs says about a device that VFIO can open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DeviceSysfs {
    /// The IOMMU group number.
    pub group: u32,
    /// The NUMA node, if the platform reports one.
    pub numa: Option<u32>,
}

impl DeviceSysfs {
    /// Check `addr` under filesystem root `root` ("/" for the real system).
    pub(crate) fn check_in(root: &Path, addr: PciAddress) -> Result<DeviceSysfs> {
        let dev = root.join(format!("sys/bus/pci/devices/{addr}"));
        if !dev.exists() {
            return Err(CoreError::NoSuchDevice { addr, path: dev });
        }
        let group = match fs::read_link(dev.join("iommu_group")) {
            Ok(p) => p
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.parse::<u32>().ok())
                .ok_or(CoreError::NoIommuGroup { addr })?,
            Err(_) => return Err(CoreError::NoIommuGroup { addr }),
        };
        let driver = driver_of(&dev);
        if driver.as_deref() != Some("vfio-pci") {
            return Err(CoreError::NotBoundToVfio { addr, driver });
        }
        let numa = fs::read_to_string(dev.join("numa_node"))
            .ok()
            .and_then(|s| s.trim().parse::<i64>().ok())
            .and_then(|n| u32::try_from(n).ok());
        Ok(DeviceSysfs { group, numa })
    }
}

/// The driver a device directory is bound to.
fn driver_of(dev: &Path) -> Option<String> {
    fs::read_link(dev.join("driver"))
        .ok()?
        .file_name()?
        .to_str()
        .map(str::to_string)
}

/// The members of IOMMU group `group` other than `except`, as "addr (driver)" text.
pub(crate) fn group_members_in(root: &Path, group: u32, except: PciAddress) -> String {
    let dir = root.join(format!("sys/kernel/iommu_groups/{group}/devices"));
    let mut out: Vec<String> = fs::read_dir(&dir)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().to_str()?.to_string();
            if name.parse::<PciAddress>().ok() == Some(except) {
                return None;
            }
            let drv = driver_of(&root.join(format!("sys/bus/pci/devices/{name}")))
                .unwrap_or_else(|| "no driver".into());
            Some(format!("{name} ({drv})"))
        })
        .collect();
    out.sort();
    if out.is_empty() {
        "none listed".into()
    } else {
        out.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;
    use std::path::PathBuf;

    struct Tree(PathBuf);
    impl Tree {
        fn new(tag: &str) -> Tree {
            let p =
                std::env::temp_dir().join(format!("ubd-preflight-{tag}-{}", std::process::id()));
            let _ = fs::remove_dir_all(&p);
            fs::create_dir_all(p.join("sys/bus/pci/drivers")).unwrap();
            Tree(p)
        }
        fn device(&self, addr: &str, driver: Option<&str>, group: Option<u32>) {
            let d = self.0.join(format!("sys/bus/pci/devices/{addr}"));
            fs::create_dir_all(&d).unwrap();
            fs::write(d.join("numa_node"), "-1\n").unwrap();
            if let Some(drv) = driver {
                let dd = self.0.join(format!("sys/bus/pci/drivers/{drv}"));
                fs::create_dir_all(&dd).unwrap();
                symlink(&dd, d.join("driver")).unwrap();
            }
            if let Some(g) = group {
                let gd = self.0.join(format!("sys/kernel/iommu_groups/{g}"));
                fs::create_dir_all(gd.join("devices")).unwrap();
                symlink(&gd, d.join("iommu_group")).unwrap();
                symlink(&d, gd.join("devices").join(addr)).unwrap();
            }
        }
    }
    impl Drop for Tree {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn a(s: &str) -> PciAddress {
        s.parse().unwrap()
    }

    #[test]
    fn each_failure_names_its_cause() {
        let t = Tree::new("causes");
        t.device("0000:00:04.0", Some("vfio-pci"), Some(5));
        t.device("0000:00:05.0", Some("nvme"), Some(6));
        t.device("0000:00:06.0", None, None);
        let ok = DeviceSysfs::check_in(&t.0, a("00:04.0")).unwrap();
        assert_eq!(
            ok,
            DeviceSysfs {
                group: 5,
                numa: None
            }
        );

        let e = DeviceSysfs::check_in(&t.0, a("00:05.0")).unwrap_err();
        assert!(
            e.to_string().contains(
                "bound to driver nvme, not vfio-pci: bind it to vfio-pci (scripts/setup.sh does)"
            ),
            "{e}"
        );
        let e = DeviceSysfs::check_in(&t.0, a("00:06.0")).unwrap_err();
        assert!(e.to_string().contains("intel_iommu=on"), "{e}");
        let e = DeviceSysfs::check_in(&t.0, a("00:07.0")).unwrap_err();
        assert!(
            e.to_string().starts_with("no PCI device 0000:00:07.0"),
            "{e}"
        );
    }

    #[test]
    fn group_members_list_drivers() {
        let t = Tree::new("group");
        t.device("0000:00:1f.0", Some("lpc_ich"), Some(9));
        t.device("0000:00:1f.2", Some("vfio-pci"), Some(9));
        t.device("0000:00:1f.3", None, Some(9));
        let s = group_members_in(&t.0, 9, a("00:1f.2"));
        assert_eq!(s, "0000:00:1f.0 (lpc_ich), 0000:00:1f.3 (no driver)");
    }
}
