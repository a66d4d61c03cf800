//! An injectable filesystem root for sysfs/procfs reads, so host tests can use a fake tree.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use super::TopologyError;

/// The directory that stands for `/`: `sys/` and `proc/` are read below it.
///
/// `SysfsRoot::system()` is the real machine; tests point it at a fake tree in a tempdir.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SysfsRoot {
    root: PathBuf,
}

impl Default for SysfsRoot {
    fn default() -> Self {
        Self::system()
    }
}

impl SysfsRoot {
    /// The running system (`/`).
    pub fn system() -> Self {
        Self::new("/")
    }

    /// A tree rooted at `root` (which holds `sys/` and `proc/`).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `rel` (written as an absolute path like `/sys/bus/pci`) below the root.
    pub fn path(&self, rel: &str) -> PathBuf {
        self.root.join(rel.trim_start_matches('/'))
    }

    /// `/sys/bus/pci/devices/<addr>` below the root.
    pub fn pci_device_dir(&self, addr: &str) -> PathBuf {
        self.path("/sys/bus/pci/devices").join(addr)
    }
}

/// Read a file and trim surrounding whitespace; `Ok(None)` when it does not exist.
pub(crate) fn read_opt(path: &Path) -> Result<Option<String>, TopologyError> {
    match fs::read_to_string(path) {
        Ok(s) => Ok(Some(s.trim().to_string())),
        Err(e) if is_absent(&e) => Ok(None),
        Err(e) => Err(TopologyError::io(path, e)),
    }
}

/// Read a file that must exist, trimmed.
pub(crate) fn read_req(path: &Path) -> Result<String, TopologyError> {
    fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .map_err(|e| TopologyError::io(path, e))
}

/// Parse a sysfs hex number such as `0x8086` or `0x010802`.
pub(crate) fn parse_hex(path: &Path, s: &str) -> Result<u32, TopologyError> {
    let digits = s.strip_prefix("0x").unwrap_or(s);
    u32::from_str_radix(digits, 16).map_err(|_| TopologyError::Parse {
        path: path.to_path_buf(),
        what: format!("expected a hex number, found {s:?}"),
    })
}

/// Read a required hex file.
pub(crate) fn read_hex(path: &Path) -> Result<u32, TopologyError> {
    let s = read_req(path)?;
    parse_hex(path, &s)
}

/// The last component of a symlink's target (`driver` -> `nvme`); `None` when the link is absent.
pub(crate) fn link_name(path: &Path) -> Result<Option<String>, TopologyError> {
    match fs::read_link(path) {
        Ok(target) => Ok(target.file_name().map(|n| n.to_string_lossy().into_owned())),
        Err(e) if is_absent(&e) => Ok(None),
        Err(e) => Err(TopologyError::io(path, e)),
    }
}

/// Names of the entries of a directory, sorted; empty when the directory does not exist.
pub(crate) fn dir_names(path: &Path) -> Result<Vec<String>, TopologyError> {
    let rd = match fs::read_dir(path) {
        Ok(rd) => rd,
        Err(e) if is_absent(&e) => return Ok(Vec::new()),
        Err(e) => return Err(TopologyError::io(path, e)),
    };
    let mut names = Vec::new();
    for entry in rd {
        let entry = entry.map_err(|e| TopologyError::io(path, e))?;
        names.push(entry.file_name().to_string_lossy().into_owned());
    }
    names.sort();
    Ok(names)
}

fn is_absent(e: &io::Error) -> bool {
    // ENODEV/EINVAL: some sysfs attributes exist but cannot be read on a given device.
    matches!(e.kind(), io::ErrorKind::NotFound)
        || matches!(e.raw_os_error(), Some(libc::ENODEV) | Some(libc::EINVAL))
}
