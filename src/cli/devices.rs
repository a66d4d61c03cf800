//! `ubdirect devices`: the PCI devices ubdirect cares about, as a table or JSON.

use serde::Serialize;
use ubdirect::diag::topology::{self, PciDeviceInfo};

use super::dma_backend::{self, DmaBackend};
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
    devices: Vec<DeviceJson<'a>>,
}

/// One device: its sysfs facts and the DMA back end it will use.
#[derive(Serialize)]
struct DeviceJson<'a> {
    #[serde(flatten)]
    info: &'a PciDeviceInfo,
    /// None unless bound to vfio-pci.
    dma_backend: Option<DmaBackend>,
}

fn with_backends(devs: &[PciDeviceInfo]) -> Vec<DeviceJson<'_>> {
    let root = sysfs_root();
    devs.iter()
        .map(|info| DeviceJson {
            info,
            dma_backend: dma_backend::of(root.root(), info).and_then(Result::ok),
        })
        .collect()
}

/// The DMA column: the back end of a device on vfio-pci, "-" otherwise.
fn dma_cell(d: &PciDeviceInfo) -> String {
    match dma_backend::of(sysfs_root().root(), d) {
        Some(Ok(b)) => b.kind,
        Some(Err(_)) => "invalid".into(),
        None => "-".into(),
    }
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
        dma_cell(d),
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
    tracing::debug!(count = devs.len(), all = args.all, "devices selected");
    if args.json {
        super::json::print(
            "devices",
            DevicesJson {
                devices: with_backends(&devs),
            },
        )?;
        return Ok(Outcome::Success);
    }
    if devs.is_empty() {
        eprintln!("ubdirect: no NVMe, network, display or memory controllers found (try --all)");
        return Ok(Outcome::Success);
    }
    let rows: Vec<Vec<String>> = devs.iter().map(row).collect();
    print_table(
        &[
            "ADDRESS", "ID", "CLASS", "DRIVER", "DMA", "GROUP", "NUMA", "LINK", "BARS",
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::fake_device;
    use ubdirect::diag::topology::GroupPeer;

    #[test]
    fn rows_show_driver_group_peers_and_bars() {
        let mut d = fake_device("0000:00:06.0", 0x050000, None);
        let r = row(&d);
        assert_eq!(r[0], "0000:00:06.0");
        assert_eq!(r[1], "1af4:1110");
        assert_eq!(r[2], "RAM (0500)");
        assert_eq!(r[3], "-");
        assert_eq!(r[4], "-", "not on vfio-pci: no DMA back end");
        assert_eq!(r[5], "3");
        assert_eq!(r[6], "-");
        assert_eq!(r[8], "2:64M(p64)");
        d.group_peers = vec![
            GroupPeer {
                address: "0000:00:1f.0".into(),
                driver: None,
            },
            GroupPeer {
                address: "0000:00:1f.2".into(),
                driver: Some("ahci".into()),
            },
        ];
        d.numa_node = Some(1);
        d.driver = Some("vfio-pci".into());
        let r = row(&d);
        assert_eq!(
            (r[3].as_str(), r[5].as_str(), r[6].as_str()),
            ("vfio-pci", "3(+2)", "1")
        );
    }

    #[test]
    fn json_has_the_device_fields() {
        let d = [fake_device("0000:00:06.0", 0x050000, None)];
        let v = crate::cli::json::document(
            "devices",
            DevicesJson {
                devices: with_backends(&d),
            },
        )
        .unwrap();
        crate::cli::json::validate(&v).unwrap();
        let dev = &v["devices"][0];
        assert_eq!(dev["address"], "0000:00:06.0");
        assert_eq!(dev["role"], "memory");
        assert_eq!(dev["driver"], serde_json::Value::Null);
        assert_eq!(dev["iommu_group"], 3);
        assert_eq!(dev["bars"][0]["size"], 64u64 << 20);
        assert_eq!(dev["bars"][0]["prefetchable"], true);
        assert_eq!(dev["dma_backend"], serde_json::Value::Null);
    }
}
