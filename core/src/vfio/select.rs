//! Which DMA back end a device uses, and why: iommufd when `/dev/iommu` and the device's vfio
//! cdev exist, no-IOMMU when the device's group is a vfio no-IOMMU group, else type1.
//! `UBD_IOMMU_BACKEND=type1|iommufd|noiommu` or [`DomainOptions::backend`] override the
//! automatic choice (the library option wins over the environment). Pure sysfs/devfs reads
//! under an injectable root, so the rules are tested on the host.

use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use crate::error::{CoreError, Result};
use crate::pci::PciAddress;

/// The environment variable that overrides the automatic back-end choice.
pub const BACKEND_ENV: &str = "UBD_IOMMU_BACKEND";

/// A DMA back end of [`super::DmaDomain`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    /// The legacy VFIO type1v2 container (`/dev/vfio/vfio` + `/dev/vfio/<group>`).
    Type1,
    /// iommufd (`/dev/iommu`, an IOAS) with the device's vfio cdev (`/dev/vfio/devices/vfioN`).
    Iommufd,
    /// vfio no-IOMMU (`/dev/vfio/noiommu-<group>`): no translation, DMA to physical addresses.
    NoIommu,
}

impl BackendKind {
    /// The name `UBD_IOMMU_BACKEND` takes.
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Type1 => "type1",
            BackendKind::Iommufd => "iommufd",
            BackendKind::NoIommu => "noiommu",
        }
    }
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for BackendKind {
    type Err = CoreError;

    fn from_str(s: &str) -> Result<BackendKind> {
        match s.trim().to_ascii_lowercase().as_str() {
            "type1" => Ok(BackendKind::Type1),
            "iommufd" => Ok(BackendKind::Iommufd),
            "noiommu" | "no-iommu" => Ok(BackendKind::NoIommu),
            other => Err(CoreError::InvalidArgument(format!(
                "{BACKEND_ENV}={other:?} is not a DMA back end: use type1, iommufd or noiommu (or unset it for the automatic choice)"
            ))),
        }
    }
}

/// How a [`super::DmaDomain`] picks its back end.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DomainOptions {
    /// Force a back end (wins over `UBD_IOMMU_BACKEND`); None: the environment, else automatic.
    pub backend: Option<BackendKind>,
    /// Allow the no-IOMMU back end (devices DMA to physical addresses, unprotected). The
    /// operator must also have opted in (`UBD_ALLOW_NOIOMMU=1 scripts/setup.sh`).
    pub allow_noiommu: bool,
}

/// The back end a device will use and why.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct BackendChoice {
    /// The back end.
    pub kind: BackendKind,
    /// Why, in the user's terms (the files that decided it, or the override).
    pub reason: String,
    /// The device's vfio cdev (`/dev/vfio/devices/vfioN`), when it has one.
    #[serde(skip)]
    pub cdev: Option<PathBuf>,
}

/// The vfio cdev of `addr` (`sys/bus/pci/devices/ADDR/vfio-dev/vfioN` ->
/// `dev/vfio/devices/vfioN`) under `root`, if both exist.
pub fn device_cdev(root: &Path, addr: PciAddress) -> Option<PathBuf> {
    let dir = root.join(format!("sys/bus/pci/devices/{addr}/vfio-dev"));
    let name = fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .find(|n| n.starts_with("vfio"))?;
    let dev = root.join("dev/vfio/devices").join(&name);
    dev.exists().then_some(dev)
}

/// The IOMMU group number of `addr` under `root`.
fn group_of(root: &Path, addr: PciAddress) -> Option<u32> {
    fs::read_link(root.join(format!("sys/bus/pci/devices/{addr}/iommu_group")))
        .ok()?
        .file_name()?
        .to_str()?
        .parse()
        .ok()
}

/// Decide the back end of `addr` under filesystem root `root` ("/" for the real system).
/// `option` is the library option, `env` the value of `UBD_IOMMU_BACKEND` (None when unset
/// or empty). A bad `env` value is an error naming the accepted ones.
pub fn choose_in(
    root: &Path,
    addr: PciAddress,
    option: Option<BackendKind>,
    env: Option<&str>,
) -> Result<BackendChoice> {
    let cdev = device_cdev(root, addr);
    if let Some(kind) = option {
        return Ok(BackendChoice {
            kind,
            reason: "set by the library option (DomainOptions::backend)".into(),
            cdev,
        });
    }
    if let Some(v) = env.map(str::trim).filter(|v| !v.is_empty()) {
        let kind = v.parse()?;
        return Ok(BackendChoice {
            kind,
            reason: format!("set by {BACKEND_ENV}={v}"),
            cdev,
        });
    }
    let iommu = root.join("dev/iommu");
    if let Some(g) = group_of(root, addr) {
        if root.join(format!("dev/vfio/noiommu-{g}")).exists() {
            return Ok(BackendChoice {
                kind: BackendKind::NoIommu,
                reason: format!(
                    "IOMMU group {g} is a vfio no-IOMMU group (/dev/vfio/noiommu-{g}): no IOMMU translates this device's DMA"
                ),
                cdev,
            });
        }
    }
    let (kind, reason) = match (iommu.exists(), &cdev) {
        (true, Some(c)) => (
            BackendKind::Iommufd,
            format!("/dev/iommu and the device's vfio cdev {} exist", c.display()),
        ),
        (false, _) => (
            BackendKind::Type1,
            "/dev/iommu is missing (kernel without CONFIG_IOMMUFD, or the iommufd module is not loaded)".to_string(),
        ),
        (true, None) => (
            BackendKind::Type1,
            format!(
                "no vfio cdev for {addr} (sys/bus/pci/devices/{addr}/vfio-dev): kernel without CONFIG_VFIO_DEVICE_CDEV, or the device is not bound to vfio-pci"
            ),
        ),
    };
    Ok(BackendChoice { kind, reason, cdev })
}

/// [`choose_in`] on the real system with `UBD_IOMMU_BACKEND` from the environment.
pub fn choose(addr: PciAddress, option: Option<BackendKind>) -> Result<BackendChoice> {
    let env = std::env::var(BACKEND_ENV).ok();
    choose_in(Path::new("/"), addr, option, env.as_deref())
}

#[cfg(test)]
mod tests {
    use super::*;

    const ADDR: &str = "0000:00:04.0";

    /// A fake root with the device in IOMMU group 7.
    fn root() -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        let dev = d.path().join(format!("sys/bus/pci/devices/{ADDR}"));
        fs::create_dir_all(&dev).unwrap();
        fs::create_dir_all(d.path().join("sys/kernel/iommu_groups/7")).unwrap();
        std::os::unix::fs::symlink("../../../../kernel/iommu_groups/7", dev.join("iommu_group"))
            .unwrap();
        fs::create_dir_all(d.path().join("dev/vfio/devices")).unwrap();
        d
    }

    fn add_cdev(root: &Path) {
        let dev = root.join(format!("sys/bus/pci/devices/{ADDR}/vfio-dev/vfio3"));
        fs::create_dir_all(dev).unwrap();
        fs::write(root.join("dev/vfio/devices/vfio3"), "").unwrap();
    }

    fn pick(root: &Path, option: Option<BackendKind>, env: Option<&str>) -> BackendChoice {
        choose_in(root, ADDR.parse().unwrap(), option, env).unwrap()
    }

    #[test]
    fn iommufd_when_dev_iommu_and_the_cdev_exist() {
        let r = root();
        add_cdev(r.path());
        fs::write(r.path().join("dev/iommu"), "").unwrap();
        let c = pick(r.path(), None, None);
        assert_eq!(c.kind, BackendKind::Iommufd, "{}", c.reason);
        assert!(c.reason.contains("/dev/vfio/devices/vfio3"), "{}", c.reason);
        assert_eq!(c.cdev, Some(r.path().join("dev/vfio/devices/vfio3")));
    }

    #[test]
    fn type1_without_dev_iommu_names_the_kernel_option() {
        let r = root();
        add_cdev(r.path());
        let c = pick(r.path(), None, None);
        assert_eq!(c.kind, BackendKind::Type1);
        assert!(c.reason.contains("CONFIG_IOMMUFD"), "{}", c.reason);
    }

    #[test]
    fn type1_without_the_cdev_names_the_kernel_option() {
        let r = root();
        fs::write(r.path().join("dev/iommu"), "").unwrap();
        let c = pick(r.path(), None, None);
        assert_eq!(c.kind, BackendKind::Type1);
        assert!(c.reason.contains("CONFIG_VFIO_DEVICE_CDEV"), "{}", c.reason);
        // The sysfs entry alone (no /dev node) is not a cdev either.
        fs::create_dir_all(
            r.path()
                .join(format!("sys/bus/pci/devices/{ADDR}/vfio-dev/vfio3")),
        )
        .unwrap();
        assert_eq!(pick(r.path(), None, None).kind, BackendKind::Type1);
    }

    #[test]
    fn a_noiommu_group_is_reported_as_such() {
        let r = root();
        fs::write(r.path().join("dev/vfio/noiommu-7"), "").unwrap();
        let c = pick(r.path(), None, None);
        assert_eq!(c.kind, BackendKind::NoIommu);
        assert!(c.reason.contains("/dev/vfio/noiommu-7"), "{}", c.reason);
    }

    #[test]
    fn env_overrides_auto_and_the_option_overrides_env() {
        let r = root();
        add_cdev(r.path());
        fs::write(r.path().join("dev/iommu"), "").unwrap();
        let c = pick(r.path(), None, Some("type1"));
        assert_eq!(c.kind, BackendKind::Type1);
        assert_eq!(c.reason, "set by UBD_IOMMU_BACKEND=type1");
        let c = pick(r.path(), Some(BackendKind::NoIommu), Some("type1"));
        assert_eq!(c.kind, BackendKind::NoIommu);
        assert!(c.reason.contains("library option"), "{}", c.reason);
        // Empty means unset.
        assert_eq!(pick(r.path(), None, Some(" ")).kind, BackendKind::Iommufd);
    }

    #[test]
    fn a_bad_env_value_is_refused_with_the_accepted_names() {
        let r = root();
        let e = choose_in(r.path(), ADDR.parse().unwrap(), None, Some("vfio")).unwrap_err();
        let m = e.to_string();
        assert!(m.contains("UBD_IOMMU_BACKEND=\"vfio\""), "{m}");
        assert!(m.contains("type1, iommufd or noiommu"), "{m}");
    }

    #[test]
    fn names_round_trip() {
        for k in [
            BackendKind::Type1,
            BackendKind::Iommufd,
            BackendKind::NoIommu,
        ] {
            assert_eq!(k.name().parse::<BackendKind>().unwrap(), k);
        }
    }
}
