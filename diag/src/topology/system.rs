//! System-wide facts for the pre-flight check: IOMMU state, vfio modules, hugepages, memlock,
//! kernel lockdown and secure boot.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Serialize;

use super::sysfs::{dir_names, read_opt, SysfsRoot};
use super::TopologyError;

/// How the IOMMU treats DMA, from the groups' default domain types.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum IommuMode {
    /// DMA is translated (`DMA`, `DMA-FQ` default domains).
    Translated,
    /// DMA passes through untranslated (`identity`, `iommu=pt`).
    Passthrough,
    /// Some groups translate and some pass through: the source document's "never mixed".
    Mixed,
    /// No IOMMU groups at all: the IOMMU is off or absent.
    Off,
}

/// IOMMU facts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct IommuState {
    /// Entries of `/sys/class/iommu` (`dmar0`, `ivhd0`, a virtio-iommu name).
    pub units: Vec<String>,
    /// Number of IOMMU groups.
    pub group_count: usize,
    /// How many groups have each default domain type (`DMA`, `DMA-FQ`, `identity`, ...).
    pub domain_types: BTreeMap<String, usize>,
    /// The overall mode.
    pub mode: IommuMode,
    /// IOMMU switches on the kernel command line (`intel_iommu=on`, `iommu=pt`, `amd_iommu=...`).
    pub cmdline: Vec<String>,
    /// vfio's `enable_unsafe_noiommu_mode`, `None` when the kernel has no CONFIG_VFIO_NOIOMMU
    /// (or vfio is not loaded).
    pub noiommu_enabled: Option<bool>,
}

/// One hugepage pool: a page size on a NUMA node (or system-wide when `node` is `None`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HugepagePool {
    /// NUMA node, `None` on a machine without per-node pools.
    pub node: Option<u32>,
    /// Page size in kB (2048, 1048576).
    pub size_kb: u64,
    /// Pages reserved.
    pub total: u64,
    /// Pages free.
    pub free: u64,
    /// Surplus pages.
    pub surplus: u64,
}

impl HugepagePool {
    /// Free bytes in this pool.
    pub fn free_bytes(&self) -> u64 {
        self.free.saturating_mul(self.size_kb).saturating_mul(1024)
    }
}

/// The locked-memory limit of this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Memlock {
    /// Soft limit in bytes, `None` for unlimited.
    pub soft: Option<u64>,
    /// Hard limit in bytes, `None` for unlimited.
    pub hard: Option<u64>,
    /// The process has CAP_IPC_LOCK (root): the limit is not enforced on it.
    pub cap_ipc_lock: bool,
}

/// vfio kernel pieces.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VfioState {
    /// `/sys/module/vfio` exists.
    pub vfio: bool,
    /// `/sys/module/vfio_iommu_type1` exists.
    pub vfio_iommu_type1: bool,
    /// The `vfio-pci` PCI driver is registered.
    pub vfio_pci: bool,
    /// `/dev/vfio/vfio` (the container node) exists.
    pub container_node: bool,
}

impl VfioState {
    /// The modules missing, by modprobe name.
    pub fn missing(&self) -> Vec<&'static str> {
        let mut m = Vec::new();
        if !self.vfio {
            m.push("vfio");
        }
        if !self.vfio_iommu_type1 {
            m.push("vfio_iommu_type1");
        }
        if !self.vfio_pci {
            m.push("vfio-pci");
        }
        m
    }
}

/// System facts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SystemInfo {
    /// IOMMU state.
    pub iommu: IommuState,
    /// vfio modules.
    pub vfio: VfioState,
    /// Hugepage pools per node and size.
    pub hugepages: Vec<HugepagePool>,
    /// Memlock limit.
    pub memlock: Memlock,
    /// Kernel lockdown mode (`none`, `integrity`, `confidentiality`), when visible.
    pub lockdown: Option<String>,
    /// UEFI secure boot state, when the efivar is visible.
    pub secure_boot: Option<bool>,
}

/// Kernel command-line words that steer the IOMMU.
pub fn iommu_cmdline(cmdline: &str) -> Vec<String> {
    cmdline
        .split_whitespace()
        .filter(|w| {
            w.starts_with("intel_iommu=")
                || w.starts_with("amd_iommu=")
                || w.starts_with("iommu=")
                || w.starts_with("iommu.")
                || w.starts_with("vfio")
        })
        .map(str::to_string)
        .collect()
}

/// The mode from per-type group counts.
pub fn iommu_mode(domain_types: &BTreeMap<String, usize>, group_count: usize) -> IommuMode {
    if group_count == 0 {
        return IommuMode::Off;
    }
    let translated = domain_types
        .keys()
        .any(|t| t.starts_with("DMA") || t == "unmanaged");
    let passthrough = domain_types.contains_key("identity");
    match (translated, passthrough) {
        (true, true) => IommuMode::Mixed,
        (false, true) => IommuMode::Passthrough,
        // Groups without a readable type (old kernels) translate by default.
        _ => IommuMode::Translated,
    }
}

/// Read the IOMMU state.
pub fn iommu_state(root: &SysfsRoot) -> Result<IommuState, TopologyError> {
    let groups_dir = root.path("/sys/kernel/iommu_groups");
    let groups = dir_names(&groups_dir)?;
    let mut domain_types = BTreeMap::new();
    for g in &groups {
        if let Some(t) = read_opt(&groups_dir.join(g).join("type"))? {
            *domain_types.entry(t).or_insert(0) += 1;
        }
    }
    let cmdline = read_opt(&root.path("/proc/cmdline"))?.unwrap_or_default();
    let noiommu = read_opt(&root.path("/sys/module/vfio/parameters/enable_unsafe_noiommu_mode"))?
        .map(|v| v == "Y" || v == "1");
    Ok(IommuState {
        units: dir_names(&root.path("/sys/class/iommu"))?,
        group_count: groups.len(),
        mode: iommu_mode(&domain_types, groups.len()),
        domain_types,
        cmdline: iommu_cmdline(&cmdline),
        noiommu_enabled: noiommu,
    })
}

fn exists(p: &Path) -> bool {
    std::fs::symlink_metadata(p).is_ok()
}

/// Read the vfio module state.
pub fn vfio_state(root: &SysfsRoot) -> VfioState {
    VfioState {
        vfio: exists(&root.path("/sys/module/vfio")),
        vfio_iommu_type1: exists(&root.path("/sys/module/vfio_iommu_type1")),
        vfio_pci: exists(&root.path("/sys/bus/pci/drivers/vfio-pci")),
        container_node: exists(&root.path("/dev/vfio/vfio")),
    }
}

/// Hugepage pools per node (`/sys/devices/system/node/node*/hugepages`), or the system-wide
/// pools (`/sys/kernel/mm/hugepages`) when the kernel has no per-node view; sorted by node, then
/// page size. Read through `ubdirect_hugepages::pools_in`.
pub fn hugepage_pools(root: &SysfsRoot) -> Result<Vec<HugepagePool>, TopologyError> {
    let all = ubdirect_hugepages::pools_in(root.root()).map_err(TopologyError::Hugepages)?;
    let per_node = all.iter().any(|p| p.node.is_some());
    let mut pools: Vec<HugepagePool> = all
        .into_iter()
        .filter(|p| p.node.is_some() == per_node)
        .map(|p| HugepagePool {
            node: p.node,
            size_kb: p.size.bytes() / 1024,
            total: p.total,
            free: p.free,
            surplus: p.surplus,
        })
        .collect();
    pools.sort_by_key(|p| (p.node, p.size_kb));
    Ok(pools)
}

/// The memlock limit of this process and whether it holds CAP_IPC_LOCK (from
/// `/proc/self/status` below `root`, so tests can fake it).
pub fn memlock(root: &SysfsRoot) -> Result<Memlock, TopologyError> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit only writes the rlimit struct we pass, which lives on this stack frame.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) };
    if rc != 0 {
        return Err(TopologyError::io(
            Path::new("getrlimit(RLIMIT_MEMLOCK)"),
            std::io::Error::last_os_error(),
        ));
    }
    let conv = |v: libc::rlim_t| (v != libc::RLIM_INFINITY).then_some(v);
    let status = read_opt(&root.path("/proc/self/status"))?.unwrap_or_default();
    Ok(Memlock {
        soft: conv(lim.rlim_cur),
        hard: conv(lim.rlim_max),
        cap_ipc_lock: has_cap_ipc_lock(&status),
    })
}

/// CAP_IPC_LOCK (bit 14) in the `CapEff:` line of a `/proc/<pid>/status` text.
pub fn has_cap_ipc_lock(status: &str) -> bool {
    const CAP_IPC_LOCK: u32 = 14;
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << CAP_IPC_LOCK) != 0)
}

/// The bracketed word of `/sys/kernel/security/lockdown` (`none [integrity] confidentiality`).
pub fn parse_lockdown(s: &str) -> Option<String> {
    let start = s.find('[')?;
    let end = s[start..].find(']')? + start;
    Some(s[start + 1..end].to_string())
}

/// Secure boot from the `SecureBoot-8be4df61-...` efivar (4 attribute bytes, then the value).
fn secure_boot(root: &SysfsRoot) -> Option<bool> {
    let p = root.path("/sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c");
    let bytes = std::fs::read(p).ok()?;
    bytes.get(4).map(|b| *b == 1)
}

/// Read all system facts.
pub fn system(root: &SysfsRoot) -> Result<SystemInfo, TopologyError> {
    Ok(SystemInfo {
        iommu: iommu_state(root)?,
        vfio: vfio_state(root),
        hugepages: hugepage_pools(root)?,
        memlock: memlock(root)?,
        lockdown: read_opt(&root.path("/sys/kernel/security/lockdown"))?
            .and_then(|s| parse_lockdown(&s)),
        secure_boot: secure_boot(root),
    })
}
