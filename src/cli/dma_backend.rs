//! Which DMA back end (type1, iommufd, noiommu) a device bound to vfio-pci will use and why,
//! for `devices` and `doctor`. The rules are `ubdirect::dma::vfio::choose_backend_in`.

use std::path::Path;

use serde::Serialize;
use ubdirect::diag::topology::preflight::{Finding, Severity};
use ubdirect::diag::topology::PciDeviceInfo;
use ubdirect::dma::vfio::{choose_backend_in, noiommu, BackendKind, BACKEND_ENV};

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
                reason: if c.kind == BackendKind::NoIommu {
                    format!("{}; {}", c.reason, noiommu_state(root))
                } else {
                    c.reason
                },
            })
            .map_err(|e| e.to_string()),
    )
}

/// What a no-IOMMU device needs before a program may open it: the operator's opt-in (vfio's
/// unsafe no-IOMMU mode, read under `root`) and the program's; and the warning.
fn noiommu_state(root: &Path) -> String {
    let operator = match noiommu::operator_opt_in(root) {
        Ok(()) => "the operator opted in (vfio's unsafe no-IOMMU mode is on)".to_string(),
        Err(e) => e.to_string(),
    };
    format!("{operator}; a program must opt in too (the domain option allow_noiommu; the --allow-noiommu flag of ubdirect's identify, perf, log, pipeline and loopback); no isolation: the device can read and write all of memory")
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
                    "no-IOMMU DMA has no isolation (the device can read and write all of memory): turn the IOMMU on (intel_iommu=on / amd_iommu=on); to use it anyway the operator runs `UBD_ALLOW_NOIOMMU=1 scripts/setup.sh config` and the program opts in (the domain option allow_noiommu; the --allow-noiommu flag of ubdirect's identify, perf, log, pipeline and loopback)".into()
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

    #[test]
    fn a_noiommu_device_reports_both_opt_ins_and_the_warning() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        let mut d = fake_device("0000:00:04.0", 0x010802, None);
        d.driver = Some("vfio-pci".into());
        let dev = r.join("sys/bus/pci/devices/0000:00:04.0");
        std::fs::create_dir_all(&dev).unwrap();
        std::fs::create_dir_all(r.join("sys/kernel/iommu_groups/3")).unwrap();
        std::os::unix::fs::symlink("../../../kernel/iommu_groups/3", dev.join("iommu_group"))
            .unwrap();
        std::fs::create_dir_all(r.join("dev/vfio")).unwrap();
        std::fs::write(r.join("dev/vfio/noiommu-3"), "").unwrap();
        let param = r.join(noiommu::UNSAFE_MODE_PARAM);
        std::fs::create_dir_all(param.parent().unwrap()).unwrap();
        std::fs::write(&param, "Y\n").unwrap();
        let b = of_in(r, &d, None).unwrap().unwrap();
        assert_eq!(b.kind, "noiommu");
        for want in [
            "/dev/vfio/noiommu-3",
            "the operator opted in",
            "--allow-noiommu",
            "can read and write all of memory",
        ] {
            assert!(b.reason.contains(want), "{want}: {}", b.reason);
        }
        std::fs::write(&param, "N\n").unwrap();
        let b = of_in(r, &d, None).unwrap().unwrap();
        assert!(
            b.reason
                .contains("has not enabled vfio's unsafe no-IOMMU mode"),
            "{}",
            b.reason
        );
    }
}
