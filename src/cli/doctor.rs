//! `ubdirect doctor`: the pre-flight check (rules in `ubdirect_core::topology::preflight`).

use serde::Serialize;
use ubdirect_core::topology::preflight::{preflight, worst, Finding, PreflightInput, Severity};
use ubdirect_core::topology::{self, DeviceRole, PciDeviceInfo};

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
    let findings = preflight(&PreflightInput {
        system: &system,
        selected: &selected,
        gpu,
        pool_bytes: args.pool_mib.saturating_mul(1 << 20),
        small_bar: args.small_bar_mib.saturating_mul(1 << 20),
    });
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
        println!("{}", serde_json::to_string_pretty(&doc)?);
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
