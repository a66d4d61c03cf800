//! `ubdirect devices`: the PCI devices ubdirect cares about, as a table or JSON.

use serde::Serialize;
use ubdirect_core::topology::{self, PciDeviceInfo};

use super::{parse_bdf, print_table, sysfs_root, CliResult, Outcome};

/// List PCI devices (default: NVMe, NICs, GPUs, memory controllers such as ivshmem).
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Every PCI device, not only those ubdirect can use.
    #[arg(long)]
    all: bool,

    /// JSON on stdout instead of a table.
    #[arg(long)]
    json: bool,

    /// Only these devices (0000:00:04.0 or 00:04.0).
    #[arg(value_name = "BDF", value_parser = parse_bdf)]
    addresses: Vec<String>,
}

/// The JSON document.
#[derive(Serialize)]
struct DevicesJson<'a> {
    devices: &'a [PciDeviceInfo],
}

/// The devices `args` selects, in address order.
fn select(args: &Args) -> Result<Vec<PciDeviceInfo>, topology::TopologyError> {
    let root = sysfs_root();
    if !args.addresses.is_empty() {
        return args
            .addresses
            .iter()
            .map(|a| topology::device(&root, a))
            .collect();
    }
    let mut devs = topology::all_devices(&root)?;
    if !args.all {
        devs.retain(|d| d.role.is_relevant());
    }
    Ok(devs)
}

fn row(d: &PciDeviceInfo) -> Vec<String> {
    let group = match d.iommu_group {
        Some(g) if d.group_peers.is_empty() => g.to_string(),
        Some(g) => format!("{g}(+{})", d.group_peers.len()),
        None => "-".into(),
    };
    let bars: Vec<String> = d.bars.iter().map(|b| b.summary()).collect();
    vec![
        d.address.clone(),
        format!("{:04x}:{:04x}", d.vendor, d.device),
        format!(
            "{} ({:04x})",
            d.class_name,
            topology::class_subclass(d.class)
        ),
        d.driver.clone().unwrap_or_else(|| "-".into()),
        group,
        d.numa_node.map_or("-".into(), |n| n.to_string()),
        d.link.summary(),
        if bars.is_empty() {
            "-".into()
        } else {
            bars.join(" ")
        },
    ]
}

/// Run `ubdirect devices`.
pub fn run(args: &Args) -> CliResult {
    let devs = select(args)?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&DevicesJson { devices: &devs })?
        );
        return Ok(Outcome::Success);
    }
    if devs.is_empty() {
        eprintln!("ubdirect: no NVMe, network, display or memory controllers found (try --all)");
        return Ok(Outcome::Success);
    }
    let rows: Vec<Vec<String>> = devs.iter().map(row).collect();
    print_table(
        &[
            "ADDRESS", "ID", "CLASS", "DRIVER", "GROUP", "NUMA", "LINK", "BARS",
        ],
        &rows,
    );
    let shared: Vec<String> = devs
        .iter()
        .filter(|d| !d.group_peers.is_empty())
        .map(|d| {
            let peers: Vec<String> = d
                .group_peers
                .iter()
                .map(|p| {
                    format!(
                        "{} ({})",
                        p.address,
                        p.driver.as_deref().unwrap_or("no driver")
                    )
                })
                .collect();
            format!(
                "  {} shares IOMMU group with {}",
                d.address,
                peers.join(", ")
            )
        })
        .collect();
    if !shared.is_empty() {
        println!("\nshared IOMMU groups (all members must be bound to vfio-pci or unbound):");
        for s in shared {
            println!("{s}");
        }
    }
    Ok(Outcome::Success)
}
