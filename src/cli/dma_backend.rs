//! Which DMA back end (type1, iommufd, noiommu) a device bound to vfio-pci will use and why,
//! for `devices` and `doctor` (issue 12). The rules are `ubdirect_core::vfio::choose_backend_in`.

use std::path::Path;

use serde::Serialize;
use ubdirect_core::vfio::{choose_backend_in, BackendKind, BACKEND_ENV};
use ubdirect_diag::topology::preflight::{Finding, Severity};
use ubdirect_diag::topology::PciDeviceInfo;

/// The back end of one device, as reported.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DmaBackend {
    /// "type1", "iommufd" or "noiommu".
    pub kind: String,
    /// Why (the files that decided it, or the override).
    pub reason: String,
}

/// The back end `d` will use under `root` with the `UBD_IOMMU_BACKEND` value `env`; None when
/// it is not bound to vfio-pci (nothing to open).
pub fn of_in(
    root: &Path,
    d: &PciDeviceInfo,
    env: Option<&str>,
) -> Option<Result<DmaBackend, String>> {
    if d.driver.as_deref() != Some("vfio-pci") {
        return None;
    }
    let addr = match d.address.parse() {
        Ok(a) => a,
        Err(e) => return Some(Err(format!("{e}"))),
    };
    Some(
        choose_backend_in(root, addr, None, env)
            .map(|c| DmaBackend {
                kind: c.kind.name().into(),
                reason: c.reason,
            })
            .map_err(|e| e.to_string()),
    )
}

/// [`of_in`] with `UBD_IOMMU_BACKEND` from the environment.
pub fn of(root: &Path, d: &PciDeviceInfo) -> Option<Result<DmaBackend, String>> {
    let env = std::env::var(BACKEND_ENV).ok();
    of_in(root, d, env.as_deref())
}

/// `doctor` findings: one per selected device on vfio-pci (no-IOMMU is a warning: its DMA
/// has no isolation and the library opens it only with both opt-ins).
pub fn findings(root: &Path, selected: &[PciDeviceInfo]) -> Vec<Finding> {
    selected
        .iter()
        .filter_map(|d| Some((d, of(root, d)?)))
        .map(|(d, b)| match b {
            Ok(b) => Finding {
                severity: if b.kind == BackendKind::NoIommu.name() {
                    Severity::Warn
                } else {
                    Severity::Ok
                },
                check: "dma-backend",
                device: Some(d.address.clone()),
                action: if b.kind == BackendKind::NoIommu.name() {
                    "no-IOMMU DMA has no isolation (the device can read and write all of memory): turn the IOMMU on (intel_iommu=on / amd_iommu=on); to use it anyway the operator runs `UBD_ALLOW_NOIOMMU=1 scripts/setup.sh config` and the program opts in (DomainOptions::allow_noiommu; `ubdirect perf --allow-noiommu`)".into()
                } else {
                    String::new()
                },
                seen: format!("{}: {}", b.kind, b.reason),
            },
            Err(e) => Finding {
                severity: Severity::Error,
                check: "dma-backend",
                device: Some(d.address.clone()),
                seen: e,
                action: format!("unset {BACKEND_ENV} or set it to type1, iommufd or noiommu"),
            },
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::fake_device;

    #[test]
    fn a_vfio_device_reports_its_back_end_and_why() {
        let root = tempfile::tempdir().unwrap();
        let mut d = fake_device("0000:00:06.0", 0x010802, None);
        assert_eq!(of_in(root.path(), &d, None), None, "not on vfio-pci");
        d.driver = Some("vfio-pci".into());
        let b = of_in(root.path(), &d, None).unwrap().unwrap();
        assert_eq!(b.kind, "type1");
        assert!(b.reason.contains("CONFIG_IOMMUFD"), "{}", b.reason);
        let b = of_in(root.path(), &d, Some("iommufd")).unwrap().unwrap();
        assert_eq!(
            (b.kind.as_str(), b.reason.as_str()),
            ("iommufd", "set by UBD_IOMMU_BACKEND=iommufd")
        );
        let e = of_in(root.path(), &d, Some("bogus")).unwrap().unwrap_err();
        assert!(e.contains("type1, iommufd or noiommu"), "{e}");
    }
}
