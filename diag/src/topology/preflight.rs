//! The pre-flight check behind `ubdirect doctor`: pure logic over topology facts, so every rule
//! is host-testable. Each finding says what was seen and what to do.

use serde::Serialize;

use super::bar::human_size;
use super::class::DeviceRole;
use super::device::PciDeviceInfo;
use super::drivers::{self, Support};
use super::system::{IommuMode, SystemInfo};

/// How bad a finding is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// As it should be.
    Ok,
    /// Works, but slower or less safe than it could.
    Warn,
    /// ubdirect will fail (or be unsafe) until fixed.
    Error,
}

/// One finding.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    /// How bad.
    pub severity: Severity,
    /// Which check (`iommu`, `vfio`, `group`, `link`, `bar`, `hugepages`, `memlock`, ...).
    pub check: &'static str,
    /// The device concerned, if any.
    pub device: Option<String>,
    /// What was seen.
    pub seen: String,
    /// What to do (empty for `ok`).
    pub action: String,
}

impl Finding {
    fn new(severity: Severity, check: &'static str, device: Option<&str>, seen: String) -> Self {
        Finding {
            severity,
            check,
            device: device.map(str::to_string),
            seen,
            action: String::new(),
        }
    }

    fn ok(check: &'static str, device: Option<&str>, seen: String) -> Self {
        Self::new(Severity::Ok, check, device, seen)
    }

    fn warn(check: &'static str, device: Option<&str>, seen: String, action: String) -> Self {
        Finding {
            action,
            ..Self::new(Severity::Warn, check, device, seen)
        }
    }

    fn error(check: &'static str, device: Option<&str>, seen: String, action: String) -> Self {
        Finding {
            action,
            ..Self::new(Severity::Error, check, device, seen)
        }
    }
}

/// What the check looks at.
#[derive(Debug, Clone)]
pub struct PreflightInput<'a> {
    /// System facts.
    pub system: &'a SystemInfo,
    /// The devices ubdirect will drive (NVMe, NICs, BAR targets).
    pub selected: &'a [PciDeviceInfo],
    /// The GPU (or BAR target) data should land in, if any.
    pub gpu: Option<&'a PciDeviceInfo>,
    /// Bytes of hugepage pool the run will register.
    pub pool_bytes: u64,
    /// A GPU / BAR-target BAR below this is "small".
    pub small_bar: u64,
}

/// Drivers that keep an IOMMU group viable for vfio (besides vfio-pci itself).
pub const VIABLE_DRIVERS: [&str; 3] = ["vfio-pci", "pci-stub", "pcieport"];

/// Run every check.
pub fn preflight(input: &PreflightInput) -> Vec<Finding> {
    let mut f = Vec::new();
    check_iommu(input.system, &mut f);
    check_vfio(input.system, &mut f);
    let mut devices: Vec<&PciDeviceInfo> = input.selected.iter().collect();
    if let Some(g) = input.gpu {
        if !devices.iter().any(|d| d.address == g.address) {
            devices.push(g);
        }
    }
    for d in &devices {
        check_device(d, input, &mut f);
    }
    check_locality(input, &mut f);
    check_hugepages(input, &mut f);
    check_memlock(input, &mut f);
    check_lockdown(input.system, &mut f);
    f
}

fn check_iommu(s: &SystemInfo, f: &mut Vec<Finding>) {
    let i = &s.iommu;
    let cmdline = if i.cmdline.is_empty() {
        "no IOMMU switches on the kernel command line".to_string()
    } else {
        format!("cmdline {}", i.cmdline.join(" "))
    };
    let types: Vec<String> = i
        .domain_types
        .iter()
        .map(|(t, n)| format!("{n} {t}"))
        .collect();
    match i.mode {
        IommuMode::Off => match i.noiommu_enabled {
            Some(true) => f.push(Finding::warn(
                "iommu",
                None,
                format!("no IOMMU; vfio no-IOMMU mode is ON ({cmdline}): devices can DMA anywhere in memory"),
                "for isolation enable VT-d/AMD-Vi in firmware and boot with intel_iommu=on or amd_iommu=on".into(),
            )),
            _ => f.push(Finding::error(
                "iommu",
                None,
                format!("no IOMMU groups: the IOMMU is off or absent ({cmdline})"),
                "enable VT-d/AMD-Vi in firmware and boot with intel_iommu=on (Intel) or amd_iommu=on (AMD); \
                 without an IOMMU only vfio no-IOMMU mode works (UBD_ALLOW_NOIOMMU=1 scripts/setup.sh config, \
                 needs CONFIG_VFIO_NOIOMMU)"
                    .into(),
            )),
        },
        IommuMode::Mixed => f.push(Finding::error(
            "iommu",
            None,
            format!("mixed IOMMU domains: {} ({cmdline})", types.join(", ")),
            "use one policy for all devices: either iommu=pt for all or translation for all; \
             check per-group overrides in /sys/kernel/iommu_groups/*/type"
                .into(),
        )),
        IommuMode::Translated | IommuMode::Passthrough => {
            let mode = if i.mode == IommuMode::Translated {
                "translated (DMA remapped)"
            } else {
                "passthrough (identity) for kernel drivers; vfio groups get their own translated domain"
            };
            let units = if i.units.is_empty() {
                "no unit in /sys/class/iommu".to_string()
            } else {
                i.units.join(",")
            };
            f.push(Finding::ok(
                "iommu",
                None,
                format!("{mode}: {} groups ({}), units {units}, {cmdline}", i.group_count, types.join(", ")),
            ));
            if i.noiommu_enabled == Some(true) {
                f.push(Finding::warn(
                    "iommu",
                    None,
                    "vfio no-IOMMU mode is ON although an IOMMU is present".into(),
                    "turn it off: echo N > /sys/module/vfio/parameters/enable_unsafe_noiommu_mode".into(),
                ));
            }
        }
    }
}

fn check_vfio(s: &SystemInfo, f: &mut Vec<Finding>) {
    let missing = s.vfio.missing();
    if missing.is_empty() {
        f.push(Finding::ok(
            "vfio",
            None,
            "vfio, vfio_iommu_type1 and vfio-pci are loaded".into(),
        ));
    } else {
        f.push(Finding::error(
            "vfio",
            None,
            format!("not loaded: {}", missing.join(", ")),
            "run scripts/setup.sh (or modprobe vfio-pci vfio_iommu_type1)".into(),
        ));
    }
}

/// The `driver` finding: is the device on vfio-pci, and can a ubdirect driver use it.
fn check_driver(d: &PciDeviceInfo, f: &mut Vec<Finding>) {
    let a = Some(d.address.as_str());
    let drv = d
        .driver
        .as_deref()
        .map_or("has no driver".to_string(), |x| format!("is bound to {x}"));
    if let Support::None = drivers::support(d) {
        let give_back = if d.driver.as_deref() == Some("vfio-pci") {
            "give it back to its kernel driver (scripts/setup.sh reset, if setup.sh bound it)"
        } else {
            "leave it on its kernel driver"
        };
        f.push(Finding::warn(
            "driver",
            a,
            format!(
                "{} {} ({:04x}:{:04x}) {drv}, but no ubdirect driver supports it",
                d.class_name, d.address, d.vendor, d.device
            ),
            format!(
                "ubdirect drives {}; GPUs and ivshmem need none (BAR targets). Use a supported device; {give_back}",
                drivers::supported_list()
            ),
        ));
    } else if d.driver.as_deref() != Some("vfio-pci") {
        let hint = if d.role == DeviceRole::Nic {
            format!("PCI_ALLOWED={} scripts/setup.sh", d.address)
        } else {
            "scripts/setup.sh".to_string()
        };
        f.push(Finding::warn(
            "driver",
            a,
            format!("{} {} {drv}, not vfio-pci", d.class_name, d.address),
            format!("bind it with {hint}"),
        ));
    } else {
        let what = match drivers::support(d) {
            Support::Driver(name) => format!("ubdirect driver: {name}"),
            _ => "a BAR target: no driver needed".to_string(),
        };
        f.push(Finding::ok(
            "driver",
            a,
            format!("{} bound to vfio-pci ({what})", d.class_name),
        ));
    }
}

/// The `group` finding: is the device's IOMMU group viable for vfio.
fn check_group(d: &PciDeviceInfo, input: &PreflightInput, f: &mut Vec<Finding>) {
    let a = Some(d.address.as_str());
    match d.iommu_group {
        None => {
            if input.system.iommu.mode != IommuMode::Off {
                f.push(Finding::warn(
                    "group",
                    a,
                    "no IOMMU group although the IOMMU is on".into(),
                    "check dmesg for DMAR/AMD-Vi messages about this device".into(),
                ));
            }
        }
        Some(g) => {
            let offenders: Vec<String> = d
                .group_peers
                .iter()
                .filter(|p| {
                    p.driver
                        .as_deref()
                        .is_some_and(|dr| !VIABLE_DRIVERS.contains(&dr))
                })
                .map(|p| format!("{} ({})", p.address, p.driver.as_deref().unwrap_or("")))
                .collect();
            let peers: Vec<&str> = d.group_peers.iter().map(|p| p.address.as_str()).collect();
            if !offenders.is_empty() {
                f.push(Finding::error(
                    "group",
                    a,
                    format!("IOMMU group {g} is not viable: {} bound to a kernel driver", offenders.join(", ")),
                    format!(
                        "bind every device of group {g} to vfio-pci (PCI_ALLOWED=\"{}\" scripts/setup.sh) or unbind them, \
                         or move the card to a slot with its own group",
                        peers.join(" ")
                    ),
                ));
            } else if peers.is_empty() {
                f.push(Finding::ok("group", a, format!("alone in IOMMU group {g}")));
            } else {
                f.push(Finding::ok(
                    "group",
                    a,
                    format!(
                        "IOMMU group {g} shared with {} (all vfio-pci, pcieport or unbound)",
                        peers.join(", ")
                    ),
                ));
            }
        }
    }
}

fn check_device(d: &PciDeviceInfo, input: &PreflightInput, f: &mut Vec<Finding>) {
    check_driver(d, f);
    check_group(d, input, f);
    let a = Some(d.address.as_str());
    if let Some((c, m)) = d.link.width_degraded() {
        f.push(Finding::warn(
            "link",
            a,
            format!("link x{c} where x{m} is possible: about {}% of the bandwidth", c * 100 / m),
            "reseat the card in a full-width slot; check the slot's lane sharing in the board manual".into(),
        ));
    }
    if let Some((c, m)) = d.link.speed_degraded() {
        f.push(Finding::warn(
            "link",
            a,
            format!("link at {c} GT/s where {m} GT/s is possible"),
            "check the slot generation and BIOS PCIe speed setting (an idle device may also train down: re-check under load)".into(),
        ));
    }
    if d.role.has_target_bar() {
        match d.largest_memory_bar() {
            Some(b) if b.size < input.small_bar => f.push(Finding::warn(
                "bar",
                a,
                format!(
                    "largest BAR is BAR{} = {} (below {}): only that much device memory is reachable by peers",
                    b.index,
                    human_size(b.size),
                    human_size(input.small_bar)
                ),
                "enable Resizable BAR and above-4G decoding in firmware (for ivshmem: give it a larger memdev)".into(),
            )),
            Some(b) => f.push(Finding::ok(
                "bar",
                a,
                format!("BAR{} = {}{}", b.index, human_size(b.size), if b.is_64bit { " (64-bit)" } else { "" }),
            )),
            None => f.push(Finding::warn(
                "bar",
                a,
                "no memory BAR".into(),
                "this device cannot be a DMA target".into(),
            )),
        }
    }
}

fn check_locality(input: &PreflightInput, f: &mut Vec<Finding>) {
    let Some(gpu) = input.gpu else {
        f.push(Finding::ok(
            "locality",
            None,
            "no GPU selected (PreflightInput::gpu): NUMA / root-port locality not checked".into(),
        ));
        return;
    };
    for d in input.selected.iter().filter(|d| d.address != gpu.address) {
        let a = Some(d.address.as_str());
        match (d.numa_node, gpu.numa_node) {
            (Some(n), Some(g)) if n != g => f.push(Finding::warn(
                "numa",
                a,
                format!("{} on NUMA node {n}, GPU {} on node {g}: traffic crosses the inter-socket link", d.class_name, gpu.address),
                format!("use a {} on node {g}, or pin the polling thread and the pool to one node", d.class_name),
            )),
            (Some(n), Some(_)) => f.push(Finding::ok("numa", a, format!("same NUMA node {n} as the GPU"))),
            _ => f.push(Finding::ok("numa", a, "NUMA node not reported (single-node machine)".into())),
        }
        let same_port = d.root_port.is_some() && d.root_port == gpu.root_port;
        if same_port {
            f.push(Finding::ok(
                "root-port",
                a,
                format!(
                    "shares root port {} with the GPU",
                    d.root_port.as_deref().unwrap_or("")
                ),
            ));
        } else if d.root_complex.is_some() && d.root_complex != gpu.root_complex {
            f.push(Finding::warn(
                "root-port",
                a,
                format!(
                    "under {} while the GPU is under {}: peer-to-peer crosses root complexes",
                    d.root_complex.as_deref().unwrap_or("?"),
                    gpu.root_complex.as_deref().unwrap_or("?")
                ),
                "put the device and the GPU under one root complex (ideally one PCIe switch)"
                    .into(),
            ));
        } else {
            f.push(Finding::ok(
                "root-port",
                a,
                format!(
                    "same root complex {} as the GPU",
                    d.root_complex.as_deref().unwrap_or("?")
                ),
            ));
        }
    }
}

fn check_hugepages(input: &PreflightInput, f: &mut Vec<Finding>) {
    let pools = &input.system.hugepages;
    let listing: Vec<String> = pools
        .iter()
        .map(|p| {
            let node = p.node.map_or("all".to_string(), |n| format!("node{n}"));
            format!(
                "{node} {}kB {}/{} free ({})",
                p.size_kb,
                p.free,
                p.total,
                human_size(p.free_bytes())
            )
        })
        .collect();
    let listing = if listing.is_empty() {
        "no hugepage pools".to_string()
    } else {
        listing.join("; ")
    };
    let free: u64 = pools.iter().map(|p| p.free_bytes()).sum();
    let need = input.pool_bytes;
    let mib = need.div_ceil(1 << 20);
    if free < need {
        f.push(Finding::error(
            "hugepages",
            None,
            format!("{listing}: the pool needs {}", human_size(need)),
            format!("reserve them: HUGEMEM={mib} scripts/setup.sh (or check a smaller PreflightInput::pool_bytes)"),
        ));
        return;
    }
    let gpu_node = input.gpu.and_then(|g| g.numa_node);
    if let Some(node) = gpu_node {
        let on_node: u64 = pools
            .iter()
            .filter(|p| p.node == Some(node))
            .map(|p| p.free_bytes())
            .sum();
        if on_node < need {
            f.push(Finding::warn(
                "hugepages",
                None,
                format!(
                    "{listing}: only {} free on the GPU's node {node}",
                    human_size(on_node)
                ),
                format!("HUGENODE={node} HUGEMEM={mib} scripts/setup.sh"),
            ));
            return;
        }
    }
    f.push(Finding::ok(
        "hugepages",
        None,
        format!("{listing}: enough for a {} pool", human_size(need)),
    ));
}

fn check_memlock(input: &PreflightInput, f: &mut Vec<Finding>) {
    let m = &input.system.memlock;
    let need = input.pool_bytes;
    if m.cap_ipc_lock {
        f.push(Finding::ok(
            "memlock",
            None,
            "CAP_IPC_LOCK held (root): the memlock limit is not enforced".into(),
        ));
        return;
    }
    match m.soft {
        None => f.push(Finding::ok("memlock", None, "memlock unlimited".into())),
        Some(s) if s >= need => f.push(Finding::ok(
            "memlock",
            None,
            format!("memlock {} covers the {} pool", human_size(s), human_size(need)),
        )),
        Some(s) => f.push(Finding::error(
            "memlock",
            None,
            format!("memlock limit {} is below the {} the pool pins", human_size(s), human_size(need)),
            format!(
                "raise it to at least {} KiB: `ulimit -l {}` or a memlock line in /etc/security/limits.conf",
                need.div_ceil(1024),
                need.div_ceil(1024)
            ),
        )),
    }
}

fn check_lockdown(s: &SystemInfo, f: &mut Vec<Finding>) {
    match s.lockdown.as_deref() {
        None => f.push(Finding::ok("lockdown", None, "kernel lockdown not visible (no securityfs)".into())),
        Some("none") => f.push(Finding::ok("lockdown", None, "kernel lockdown: none".into())),
        Some(mode) => f.push(Finding::warn(
            "lockdown",
            None,
            format!("kernel lockdown: {mode}"),
            "lockdown forbids vfio no-IOMMU mode and raw /dev/mem or sysfs BAR access; vfio with an IOMMU still works".into(),
        )),
    }
    match s.secure_boot {
        Some(true) => f.push(Finding::warn(
            "secure-boot",
            None,
            "UEFI secure boot is on".into(),
            "unsigned modules (GPU peer-memory drivers) will not load and lockdown may be enforced: sign them or use DKMS with a MOK".into(),
        )),
        Some(false) => f.push(Finding::ok("secure-boot", None, "UEFI secure boot is off".into())),
        None => {}
    }
}

/// The worst severity in `findings` (`Ok` when empty).
pub fn worst(findings: &[Finding]) -> Severity {
    findings
        .iter()
        .map(|f| f.severity)
        .max()
        .unwrap_or(Severity::Ok)
}
