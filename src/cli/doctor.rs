//! `ubdirect doctor`: the pre-flight check (rules in `ubdirect::diag::topology::preflight`).

use serde::Serialize;
use ubdirect::diag::topology::preflight::{preflight, worst, Finding, PreflightInput, Severity};
use ubdirect::diag::topology::{self, DeviceRole, PciDeviceInfo};

use super::{parse_bdf, sysfs_root, CliResult, Outcome};

/// Check the machine before a run: IOMMU mode, vfio, group viability, hugepages, memlock,
/// GPU locality, links, BAR sizes, lockdown. Exit status 1 when any check is an error.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The GPU (or BAR target) data lands in; default: the only display controller, else the
    /// only memory controller (ivshmem).
    #[arg(long, value_name = "BDF", value_parser = parse_bdf)]
    gpu: Option<String>,

    /// Size of the hugepage pool the run will register, in MiB (the starter pool: 8 x 64 MiB).
    #[arg(long, value_name = "MIB", default_value_t = 512)]
    pool_mib: u64,

    /// A GPU / BAR-target BAR smaller than this (MiB) is flagged.
    #[arg(long, value_name = "MIB", default_value_t = 256)]
    small_bar_mib: u64,

    /// JSON on stdout instead of text.
    #[arg(long)]
    json: bool,

    /// Devices to check (default: those bound to vfio-pci, else the NVMe controllers and BAR targets).
    #[arg(value_name = "BDF", value_parser = parse_bdf)]
    addresses: Vec<String>,
}

/// The JSON document.
#[derive(Serialize)]
struct DoctorJson<'a> {
    gpu: Option<&'a str>,
    devices: Vec<&'a str>,
    findings: &'a [Finding],
    ok: usize,
    warnings: usize,
    errors: usize,
}

/// The devices to check: the named ones, else what ubdirect would drive.
fn select(
    all: &[PciDeviceInfo],
    addrs: &[String],
) -> Result<Vec<PciDeviceInfo>, topology::TopologyError> {
    if !addrs.is_empty() {
        return addrs
            .iter()
            .map(|a| {
                all.iter()
                    .find(|d| &d.address == a)
                    .cloned()
                    .ok_or_else(|| topology::TopologyError::NoSuchDevice(a.clone()))
            })
            .collect();
    }
    let bound: Vec<PciDeviceInfo> = all
        .iter()
        .filter(|d| d.role.is_relevant() && d.driver.as_deref() == Some("vfio-pci"))
        .cloned()
        .collect();
    if !bound.is_empty() {
        return Ok(bound);
    }
    Ok(all
        .iter()
        .filter(|d| d.role == DeviceRole::Nvme || d.role.has_target_bar())
        .cloned()
        .collect())
}

/// The GPU: `--gpu`, else the only GPU, else the only memory controller.
fn pick_gpu<'a>(
    all: &'a [PciDeviceInfo],
    gpu: Option<&String>,
) -> Result<Option<&'a PciDeviceInfo>, topology::TopologyError> {
    if let Some(g) = gpu {
        return all
            .iter()
            .find(|d| &d.address == g)
            .map(Some)
            .ok_or_else(|| topology::TopologyError::NoSuchDevice(g.clone()));
    }
    for role in [DeviceRole::Gpu, DeviceRole::Memory] {
        let mut it = all.iter().filter(|d| d.role == role);
        if let (Some(one), None) = (it.next(), it.next()) {
            return Ok(Some(one));
        }
    }
    Ok(None)
}

fn tag(s: Severity) -> &'static str {
    match s {
        Severity::Ok => "[ ok ]",
        Severity::Warn => "[warn]",
        Severity::Error => "[FAIL]",
    }
}

/// Run `ubdirect doctor`.
pub fn run(args: &Args) -> CliResult {
    let root = sysfs_root();
    let all = topology::all_devices(&root)?;
    let system = topology::system(&root)?;
    let selected = select(&all, &args.addresses)?;
    let gpu = pick_gpu(&all, args.gpu.as_ref())?;
    tracing::info!(
        devices = ?selected.iter().map(|d| d.address.as_str()).collect::<Vec<_>>(),
        gpu = ?gpu.map(|g| g.address.as_str()),
        "doctor: selection"
    );
    let mut findings = preflight(&PreflightInput {
        system: &system,
        selected: &selected,
        gpu,
        pool_bytes: args.pool_mib.saturating_mul(1 << 20),
        small_bar: args.small_bar_mib.saturating_mul(1 << 20),
    });
    findings.extend(super::dma_backend::findings(root.root(), &selected));
    for f in &mut findings {
        f.seen = super::errors::scrub(&f.seen);
        f.action = super::errors::scrub(&f.action);
    }
    let count = |s: Severity| findings.iter().filter(|f| f.severity == s).count();
    let (ok, warnings, errors) = (
        count(Severity::Ok),
        count(Severity::Warn),
        count(Severity::Error),
    );
    if args.json {
        let doc = DoctorJson {
            gpu: gpu.map(|g| g.address.as_str()),
            devices: selected.iter().map(|d| d.address.as_str()).collect(),
            findings: &findings,
            ok,
            warnings,
            errors,
        };
        super::json::print("doctor", doc)?;
    } else {
        let names: Vec<&str> = selected.iter().map(|d| d.address.as_str()).collect();
        println!(
            "devices: {}",
            if names.is_empty() {
                "none".to_string()
            } else {
                names.join(" ")
            }
        );
        match (gpu, &args.gpu) {
            (Some(g), Some(_)) => println!("gpu: {}", g.address),
            (Some(g), None) => println!(
                "gpu: {} ({}, picked automatically; --gpu to choose)",
                g.address, g.class_name
            ),
            (None, _) => println!("gpu: none"),
        }
        for f in &findings {
            let dev = f
                .device
                .as_deref()
                .map(|d| format!(" {d}"))
                .unwrap_or_default();
            println!("{} {}{dev}: {}", tag(f.severity), f.check, f.seen);
            if !f.action.is_empty() {
                println!("       -> {}", f.action);
            }
        }
        println!("summary: {ok} ok, {warnings} warnings, {errors} errors");
    }
    Ok(if worst(&findings) == Severity::Error {
        Outcome::Findings
    } else {
        Outcome::Success
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::fake_device;

    fn machine() -> Vec<PciDeviceInfo> {
        vec![
            fake_device("0000:00:04.0", 0x010802, Some("nvme")),
            fake_device("0000:00:06.0", 0x050000, None),
            fake_device("0000:00:07.0", 0x020000, Some("virtio-pci")),
            fake_device("0000:00:1f.0", 0x060100, None),
        ]
    }

    fn addrs(v: &[PciDeviceInfo]) -> Vec<&str> {
        v.iter().map(|d| d.address.as_str()).collect()
    }

    #[test]
    fn default_selection_is_nvme_and_bar_targets_until_something_is_on_vfio() {
        let mut all = machine();
        assert_eq!(
            addrs(&select(&all, &[]).unwrap()),
            ["0000:00:04.0", "0000:00:06.0"]
        );
        all[2].driver = Some("vfio-pci".into());
        assert_eq!(addrs(&select(&all, &[]).unwrap()), ["0000:00:07.0"]);
    }

    #[test]
    fn named_devices_must_exist() {
        let all = machine();
        let sel = select(&all, &["0000:00:1f.0".into()]).unwrap();
        assert_eq!(addrs(&sel), ["0000:00:1f.0"]);
        let e = select(&all, &["0000:00:09.0".into()]).unwrap_err();
        assert!(e.to_string().contains("no PCI device 0000:00:09.0"), "{e}");
    }

    #[test]
    fn gpu_is_explicit_or_the_only_gpu_or_the_only_bar_target() {
        let mut all = machine();
        assert_eq!(
            pick_gpu(&all, None).unwrap().unwrap().address,
            "0000:00:06.0"
        );
        all.push(fake_device("0000:01:00.0", 0x030200, Some("nvidia")));
        assert_eq!(
            pick_gpu(&all, None).unwrap().unwrap().address,
            "0000:01:00.0"
        );
        let g = "0000:00:06.0".to_string();
        assert_eq!(pick_gpu(&all, Some(&g)).unwrap().unwrap().address, g);
        assert!(pick_gpu(&all, Some(&"0000:00:09.0".to_string())).is_err());
        all.push(fake_device("0000:02:00.0", 0x030200, None));
        all.retain(|d| d.role != DeviceRole::Memory);
        assert!(
            pick_gpu(&all, None).unwrap().is_none(),
            "two GPUs: the user must choose"
        );
    }
}
