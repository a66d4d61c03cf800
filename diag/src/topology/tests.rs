//! Topology read from a fake sysfs tree.

use super::fake::{FakeDev, FakeSysfs};
use super::*;

const NVME_RES: &str = "0x00000000febf0000 0x00000000febf3fff 0x0000000000140204\n";
const IVSHMEM_RES: &str = "\
0x00000000febf1000 0x00000000febf10ff 0x0000000000040200
0x0000000000000000 0x0000000000000000 0x0000000000000000
0x0000008000000000 0x0000008003ffffff 0x000000000014220c
";

fn nvme<'a>(addr: &'a str, group: u32, driver: Option<&'a str>) -> FakeDev<'a> {
    FakeDev {
        addr,
        parents: &[],
        vendor: "0x1b36",
        device: "0x0010",
        class: "0x010802",
        driver,
        group: Some(group),
        numa: "-1",
        resource: NVME_RES,
        link: None,
    }
}

/// A machine with two NVMe controllers (one behind a root port with a degraded link), an
/// ivshmem device, a NIC sharing a group with a bridge, and a host bridge.
fn machine() -> FakeSysfs {
    let f = FakeSysfs::new();
    f.add(&nvme("0000:00:02.0", 3, Some("nvme")));
    f.add(&FakeDev {
        parents: &["0000:00:1c.0"],
        numa: "1",
        link: Some(("8.0 GT/s PCIe", "16.0 GT/s PCIe", "4", "4")),
        ..nvme("0000:01:00.0", 7, Some("vfio-pci"))
    });
    f.add(&FakeDev {
        addr: "0000:00:1c.0",
        parents: &[],
        vendor: "0x8086",
        device: "0x2922",
        class: "0x060400",
        driver: Some("pcieport"),
        group: Some(7),
        numa: "1",
        resource: "",
        link: Some(("Unknown", "16.0 GT/s PCIe", "0", "16")),
    });
    f.add(&FakeDev {
        addr: "0000:00:04.0",
        parents: &[],
        vendor: "0x1af4",
        device: "0x1110",
        class: "0x050000",
        driver: None,
        group: Some(5),
        numa: "0",
        resource: IVSHMEM_RES,
        link: None,
    });
    f.add(&FakeDev {
        addr: "0000:00:05.0",
        parents: &[],
        vendor: "0x1af4",
        device: "0x1041",
        class: "0x020000",
        driver: Some("virtio-pci"),
        group: Some(6),
        numa: "0",
        resource: NVME_RES,
        link: None,
    });
    f.add(&FakeDev {
        addr: "0000:00:06.0",
        parents: &[],
        vendor: "0x8086",
        device: "0x10d3",
        class: "0x020000",
        driver: Some("e1000e"),
        group: Some(6),
        numa: "0",
        resource: NVME_RES,
        link: None,
    });
    f.add(&FakeDev {
        addr: "0000:00:00.0",
        parents: &[],
        vendor: "0x8086",
        device: "0x29c0",
        class: "0x060000",
        driver: None,
        group: Some(0),
        numa: "-1",
        resource: "",
        link: None,
    });
    for g in [0, 3, 5, 6, 7] {
        f.write(&format!("sys/kernel/iommu_groups/{g}/type"), "DMA\n");
    }
    f
}

#[test]
fn enumerates_every_device_sorted() {
    let f = machine();
    let devs = all_devices(&f.root()).unwrap();
    let addrs: Vec<&str> = devs.iter().map(|d| d.address.as_str()).collect();
    assert_eq!(
        addrs,
        [
            "0000:00:00.0",
            "0000:00:02.0",
            "0000:00:04.0",
            "0000:00:05.0",
            "0000:00:06.0",
            "0000:00:1c.0",
            "0000:01:00.0"
        ]
    );
}

#[test]
fn nvme_on_root_bus() {
    let f = machine();
    let d = device(&f.root(), "00:02.0").unwrap();
    assert_eq!(d.address, "0000:00:02.0");
    assert_eq!((d.vendor, d.device), (0x1b36, 0x0010));
    assert_eq!(d.class, 0x010802);
    assert_eq!(d.class_name, "NVMe");
    assert_eq!(d.role, DeviceRole::Nvme);
    assert_eq!(d.driver.as_deref(), Some("nvme"));
    assert_eq!(d.iommu_group, Some(3));
    assert!(d.group_peers.is_empty());
    assert_eq!(d.numa_node, None, "-1 means no NUMA information");
    assert!(
        d.link.is_unknown(),
        "no link files on an emulated root-bus device"
    );
    assert_eq!(d.bars.len(), 1);
    assert_eq!(d.bars[0].size, 0x4000);
    assert_eq!(d.root_complex.as_deref(), Some("pci0000:00"));
    assert_eq!(d.root_port, None);
}

#[test]
fn device_behind_root_port_with_degraded_link() {
    let f = machine();
    let d = device(&f.root(), "0000:01:00.0").unwrap();
    assert_eq!(d.root_port.as_deref(), Some("0000:00:1c.0"));
    assert_eq!(d.numa_node, Some(1));
    assert_eq!(d.link.current_speed_gts, Some(8.0));
    assert_eq!(d.link.speed_degraded(), Some((8.0, 16.0)));
    assert_eq!(d.link.width_degraded(), None);
    assert_eq!(
        d.group_peers,
        vec![GroupPeer {
            address: "0000:00:1c.0".into(),
            driver: Some("pcieport".into())
        }]
    );
    let port = device(&f.root(), "0000:00:1c.0").unwrap();
    assert_eq!(port.link.current_speed_gts, None, "Unknown speed");
    assert_eq!(port.link.current_width, None, "width 0 is unknown");
    assert_eq!(port.link.max_width, Some(16));
}

#[test]
fn ivshmem_bar_flags_and_no_driver() {
    let f = machine();
    let d = device(&f.root(), "0000:00:04.0").unwrap();
    assert_eq!(d.role, DeviceRole::Memory);
    assert_eq!(d.driver, None);
    let big = d.largest_memory_bar().unwrap();
    assert_eq!((big.index, big.size), (2, 64 << 20));
    assert!(big.prefetchable && big.is_64bit);
}

#[test]
fn group_membership_lists_peers_with_drivers() {
    let f = machine();
    let d = device(&f.root(), "0000:00:05.0").unwrap();
    assert_eq!(d.iommu_group, Some(6));
    assert_eq!(d.group_peers.len(), 1);
    assert_eq!(d.group_peers[0].address, "0000:00:06.0");
    assert_eq!(d.group_peers[0].driver.as_deref(), Some("e1000e"));
    let members = group_members(&f.root(), 6).unwrap();
    assert_eq!(members.len(), 2);
}

#[test]
fn missing_device_and_bad_address() {
    let f = machine();
    assert!(matches!(
        device(&f.root(), "0000:00:09.0"),
        Err(TopologyError::NoSuchDevice(a)) if a == "0000:00:09.0"
    ));
    for bad in [
        "",
        "00:04",
        "0000:00:04.8",
        "zz:04.0",
        "0000:00:20.0",
        "1:2:3:4.0",
        "00:04.0x",
    ] {
        let e = device(&f.root(), bad).unwrap_err();
        assert!(matches!(e, TopologyError::BadAddress(_)), "{bad}: {e}");
        assert!(e.to_string().contains("0000:00:04.0"), "says the form");
    }
}

#[test]
fn address_normalisation() {
    assert_eq!(normalize_address("00:04.0").unwrap(), "0000:00:04.0");
    assert_eq!(normalize_address("0000:AF:1F.7").unwrap(), "0000:af:1f.7");
    assert_eq!(normalize_address("1:2:3.4").unwrap(), "0001:02:03.4");
}

#[test]
fn malformed_sysfs_files_are_errors_naming_the_file() {
    let f = machine();
    f.write("sys/devices/pci0000:00/0000:00:02.0/class", "nonsense\n");
    let e = device(&f.root(), "0000:00:02.0").unwrap_err();
    assert!(e.to_string().contains("class"), "{e}");
    f.write("sys/devices/pci0000:00/0000:00:04.0/resource", "0x1 0x2\n");
    let e = device(&f.root(), "0000:00:04.0").unwrap_err();
    assert!(e.to_string().contains("resource"), "{e}");
}

#[test]
fn missing_optional_files_are_none() {
    let f = machine();
    std::fs::remove_file(
        f.root()
            .path("/sys/devices/pci0000:00/0000:00:02.0/numa_node"),
    )
    .unwrap();
    std::fs::remove_file(
        f.root()
            .path("/sys/devices/pci0000:00/0000:00:02.0/resource"),
    )
    .unwrap();
    let d = device(&f.root(), "0000:00:02.0").unwrap();
    assert_eq!(d.numa_node, None);
    assert!(d.bars.is_empty());
}

#[test]
fn iommu_translated_passthrough_mixed_off() {
    let f = machine();
    f.write(
        "proc/cmdline",
        "console=ttyS0 intel_iommu=on iommu=pt quiet\n",
    );
    f.mkdir("sys/class/iommu/dmar0");
    let s = iommu_state(&f.root()).unwrap();
    assert_eq!(s.mode, IommuMode::Translated);
    assert_eq!(s.group_count, 5);
    assert_eq!(s.domain_types.get("DMA"), Some(&5));
    assert_eq!(s.units, ["dmar0"]);
    assert_eq!(s.cmdline, ["intel_iommu=on", "iommu=pt"]);
    assert_eq!(s.noiommu_enabled, None);

    f.write("sys/kernel/iommu_groups/5/type", "identity\n");
    assert_eq!(iommu_state(&f.root()).unwrap().mode, IommuMode::Mixed);
    for g in [0, 3, 6, 7] {
        f.write(&format!("sys/kernel/iommu_groups/{g}/type"), "identity\n");
    }
    assert_eq!(iommu_state(&f.root()).unwrap().mode, IommuMode::Passthrough);

    let empty = FakeSysfs::new();
    assert_eq!(iommu_state(&empty.root()).unwrap().mode, IommuMode::Off);
    empty.write(
        "sys/module/vfio/parameters/enable_unsafe_noiommu_mode",
        "Y\n",
    );
    assert_eq!(
        iommu_state(&empty.root()).unwrap().noiommu_enabled,
        Some(true)
    );
}

fn pool(f: &FakeSysfs, dir: &str, nr: u64, free: u64) {
    f.write(&format!("{dir}/nr_hugepages"), &format!("{nr}\n"));
    f.write(&format!("{dir}/free_hugepages"), &format!("{free}\n"));
    f.write(&format!("{dir}/surplus_hugepages"), "0\n");
}

#[test]
fn hugepages_per_node_and_fallback() {
    let f = FakeSysfs::new();
    pool(&f, "sys/kernel/mm/hugepages/hugepages-2048kB", 16, 12);
    let p = hugepage_pools(&f.root()).unwrap();
    assert_eq!(p.len(), 1);
    assert_eq!(
        (p[0].node, p[0].size_kb, p[0].total, p[0].free, p[0].surplus),
        (None, 2048, 16, 12, 0)
    );
    assert_eq!(p[0].free_bytes(), 24 << 20);

    let n = "sys/devices/system/node";
    pool(&f, &format!("{n}/node0/hugepages/hugepages-2048kB"), 8, 8);
    pool(
        &f,
        &format!("{n}/node0/hugepages/hugepages-1048576kB"),
        1,
        0,
    );
    pool(&f, &format!("{n}/node1/hugepages/hugepages-2048kB"), 8, 4);
    f.mkdir(&format!("{n}/possible"));
    let p = hugepage_pools(&f.root()).unwrap();
    let got: Vec<_> = p.iter().map(|p| (p.node, p.size_kb, p.free)).collect();
    assert_eq!(
        got,
        [
            (Some(0), 2048, 8),
            (Some(0), 1048576, 0),
            (Some(1), 2048, 4)
        ],
        "per-node pools only (no double counting with the system-wide one), sorted"
    );

    f.write(
        &format!("{n}/node1/hugepages/hugepages-2048kB/free_hugepages"),
        "many\n",
    );
    let e = hugepage_pools(&f.root()).unwrap_err();
    assert!(e.to_string().contains("hugepage"), "{e}");
}

#[test]
fn vfio_modules_and_lockdown() {
    let f = FakeSysfs::new();
    assert_eq!(
        vfio_state(&f.root()).missing(),
        ["vfio", "vfio_iommu_type1", "vfio-pci"]
    );
    f.mkdir("sys/module/vfio");
    f.mkdir("sys/module/vfio_iommu_type1");
    f.mkdir("sys/bus/pci/drivers/vfio-pci");
    assert!(vfio_state(&f.root()).missing().is_empty());
    f.write(
        "sys/kernel/security/lockdown",
        "none [integrity] confidentiality\n",
    );
    f.write("proc/self/status", "Name:\tx\nCapEff:\t000001ffffffffff\n");
    let s = system(&f.root()).unwrap();
    assert_eq!(s.lockdown.as_deref(), Some("integrity"));
    assert!(s.memlock.cap_ipc_lock);
    assert_eq!(s.secure_boot, None);
}

#[test]
fn capability_and_lockdown_parsing() {
    assert!(has_cap_ipc_lock("CapEff:\t0000000000004000\n"));
    assert!(!has_cap_ipc_lock("CapEff:\t0000000000000000\n"));
    assert!(!has_cap_ipc_lock("CapEff:\tzz\n"));
    assert!(!has_cap_ipc_lock(""));
    assert_eq!(
        parse_lockdown("[none] integrity confidentiality").as_deref(),
        Some("none")
    );
    assert_eq!(parse_lockdown("none integrity"), None);
}

#[test]
fn upstream_from_sysfs_paths() {
    use std::path::Path;
    let (rc, rp) = upstream_of(Path::new(
        "../../../devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0",
    ));
    assert_eq!(rc.as_deref(), Some("pci0000:00"));
    assert_eq!(rp.as_deref(), Some("0000:00:01.0"));
    let (rc, rp) = upstream_of(Path::new("/sys/devices/pci0000:80/0000:80:03.1"));
    assert_eq!(rc.as_deref(), Some("pci0000:80"));
    assert_eq!(rp, None);
    assert_eq!(upstream_of(Path::new("/tmp/x")), (None, None));
}

mod address_props {
    use super::super::normalize_address;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn canonical_addresses_round_trip(dom in 0u32..0x10000, bus in 0u32..0x100, dev in 0u32..32, func in 0u32..8) {
            let canon = format!("{dom:04x}:{bus:02x}:{dev:02x}.{func:x}");
            prop_assert_eq!(normalize_address(&canon).unwrap(), canon.clone());
            prop_assert_eq!(normalize_address(&canon.to_uppercase()).unwrap(), canon.clone());
            if dom == 0 {
                prop_assert_eq!(normalize_address(&canon[5..]).unwrap(), canon);
            }
        }

        #[test]
        fn anything_else_is_an_error_not_a_panic(s in "[0-9a-fA-F:.x ]{0,16}") {
            if let Ok(n) = normalize_address(&s) {
                prop_assert_eq!(n.len(), 12);
                prop_assert_eq!(normalize_address(&n).unwrap(), n);
            }
        }
    }
}

#[test]
fn numa_node_of_reads_the_device_file() {
    let f = machine();
    let root = f.root();
    assert_eq!(numa_node_of(&root, "0000:01:00.0").unwrap(), Some(1));
    assert_eq!(numa_node_of(&root, "0000:00:02.0").unwrap(), None, "-1");
    assert_eq!(
        numa_node_of(&root, "0000:00:1e.7").unwrap(),
        None,
        "no device"
    );
}
