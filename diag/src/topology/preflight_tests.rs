//! Pre-flight rules on hand-built topology facts.

use std::collections::BTreeMap;

use super::preflight::*;
use super::*;

fn system() -> SystemInfo {
    SystemInfo {
        iommu: IommuState {
            units: vec!["dmar0".into()],
            group_count: 4,
            domain_types: BTreeMap::from([("DMA".to_string(), 4)]),
            mode: IommuMode::Translated,
            cmdline: vec!["intel_iommu=on".into()],
            noiommu_enabled: None,
        },
        vfio: VfioState {
            vfio: true,
            vfio_iommu_type1: true,
            vfio_pci: true,
            container_node: true,
        },
        hugepages: vec![HugepagePool {
            node: Some(0),
            size_kb: 2048,
            total: 512,
            free: 512,
            surplus: 0,
        }],
        memlock: Memlock {
            soft: Some(8 << 20),
            hard: Some(8 << 20),
            cap_ipc_lock: true,
        },
        lockdown: Some("none".into()),
        secure_boot: None,
    }
}

fn dev(addr: &str, class: u32, driver: &str) -> PciDeviceInfo {
    PciDeviceInfo {
        address: addr.into(),
        vendor: 0x1b36,
        device: 0x10,
        class,
        class_name: class_name(class),
        role: DeviceRole::of_class(class),
        driver: Some(driver.into()),
        driver_override: None,
        iommu_group: Some(1),
        group_peers: vec![],
        numa_node: Some(0),
        link: LinkInfo::default(),
        bars: vec![BarInfo {
            index: 2,
            start: 1 << 40,
            size: 1 << 30,
            memory: true,
            prefetchable: true,
            is_64bit: true,
        }],
        root_complex: Some("pci0000:00".into()),
        root_port: Some("0000:00:01.0".into()),
    }
}

fn input<'a>(
    s: &'a SystemInfo,
    sel: &'a [PciDeviceInfo],
    gpu: Option<&'a PciDeviceInfo>,
) -> PreflightInput<'a> {
    PreflightInput {
        system: s,
        selected: sel,
        gpu,
        pool_bytes: 512 << 20,
        small_bar: 256 << 20,
    }
}

fn of<'a>(f: &'a [Finding], check: &str) -> Vec<&'a Finding> {
    f.iter().filter(|x| x.check == check).collect()
}

#[test]
fn healthy_machine_has_no_warnings() {
    let s = system();
    let gpu = dev("0000:01:00.0", 0x030200, "vfio-pci");
    let sel = [dev("0000:01:00.1", 0x010802, "vfio-pci")];
    let f = preflight(&input(&s, &sel, Some(&gpu)));
    assert_eq!(worst(&f), Severity::Ok, "{f:#?}");
    assert!(of(&f, "root-port")[0]
        .seen
        .contains("shares root port 0000:00:01.0"));
}

#[test]
fn mixed_iommu_and_missing_vfio_are_errors() {
    let mut s = system();
    s.iommu.domain_types = BTreeMap::from([("DMA".into(), 2), ("identity".into(), 2)]);
    s.iommu.mode = IommuMode::Mixed;
    s.vfio.vfio_pci = false;
    let f = preflight(&input(&s, &[], None));
    let iommu = of(&f, "iommu");
    assert_eq!(iommu[0].severity, Severity::Error);
    assert!(iommu[0].seen.contains("2 identity"), "{}", iommu[0].seen);
    let vfio = of(&f, "vfio");
    assert_eq!(vfio[0].severity, Severity::Error);
    assert!(vfio[0].seen.contains("vfio-pci"));
    assert!(vfio[0].action.contains("setup.sh"));
}

#[test]
fn iommu_off_is_error_unless_noiommu_opted_in() {
    let mut s = system();
    s.iommu.mode = IommuMode::Off;
    s.iommu.group_count = 0;
    let f = preflight(&input(&s, &[], None));
    assert_eq!(of(&f, "iommu")[0].severity, Severity::Error);
    assert!(of(&f, "iommu")[0].action.contains("intel_iommu=on"));
    s.iommu.noiommu_enabled = Some(true);
    let f = preflight(&input(&s, &[], None));
    assert_eq!(of(&f, "iommu")[0].severity, Severity::Warn);
}

#[test]
fn group_with_kernel_driver_peer_is_not_viable_and_names_it() {
    let s = system();
    let mut d = dev("0000:00:05.0", 0x020000, "vfio-pci");
    d.group_peers = vec![
        GroupPeer {
            address: "0000:00:06.0".into(),
            driver: Some("e1000e".into()),
        },
        GroupPeer {
            address: "0000:00:1c.0".into(),
            driver: Some("pcieport".into()),
        },
        GroupPeer {
            address: "0000:00:07.0".into(),
            driver: None,
        },
    ];
    let f = preflight(&input(&s, std::slice::from_ref(&d), None));
    let g = of(&f, "group");
    assert_eq!(g[0].severity, Severity::Error);
    assert!(g[0].seen.contains("0000:00:06.0 (e1000e)"), "{}", g[0].seen);
    assert!(
        !g[0].seen.contains("0000:00:1c.0"),
        "pcieport keeps a group viable"
    );
    d.group_peers.remove(0);
    let f = preflight(&input(&s, std::slice::from_ref(&d), None));
    assert_eq!(of(&f, "group")[0].severity, Severity::Ok);
}

#[test]
fn device_on_kernel_driver_is_a_warning_with_the_setup_command() {
    let s = system();
    let mut nic = dev("0000:00:05.0", 0x020000, "virtio-pci");
    (nic.vendor, nic.device) = (0x1af4, 0x1041);
    let sel = [nic];
    let f = preflight(&input(&s, &sel, None));
    let d = of(&f, "driver");
    assert_eq!(d[0].severity, Severity::Warn);
    assert!(
        d[0].action.contains("PCI_ALLOWED=0000:00:05.0"),
        "{}",
        d[0].action
    );
}

#[test]
fn degraded_link_says_x8_where_x16_is_possible() {
    let s = system();
    let mut d = dev("0000:00:05.0", 0x010802, "vfio-pci");
    d.link = LinkInfo {
        current_speed_gts: Some(8.0),
        max_speed_gts: Some(16.0),
        current_width: Some(8),
        max_width: Some(16),
    };
    let f = preflight(&input(&s, std::slice::from_ref(&d), None));
    let l = of(&f, "link");
    assert_eq!(l.len(), 2);
    assert!(
        l[0].seen.contains("x8 where x16 is possible"),
        "{}",
        l[0].seen
    );
    assert!(l[1].seen.contains("8 GT/s where 16 GT/s"), "{}", l[1].seen);
}

#[test]
fn small_bar_on_bar_target_only() {
    let s = system();
    let mut ivshmem = dev("0000:00:04.0", 0x050000, "vfio-pci");
    ivshmem.bars[0].size = 64 << 20;
    let mut nvme = dev("0000:00:02.0", 0x010802, "vfio-pci");
    nvme.bars[0].size = 16 << 10;
    let f = preflight(&input(&s, &[ivshmem, nvme], None));
    let b = of(&f, "bar");
    assert_eq!(b.len(), 1, "NVMe BARs are not DMA targets");
    assert_eq!(b[0].severity, Severity::Warn);
    assert!(b[0].seen.contains("BAR2 = 64M"), "{}", b[0].seen);
    assert!(b[0].action.contains("Resizable BAR"));
}

#[test]
fn hugepages_short_and_on_wrong_node() {
    let mut s = system();
    s.hugepages[0].free = 16;
    let f = preflight(&input(&s, &[], None));
    let h = of(&f, "hugepages");
    assert_eq!(h[0].severity, Severity::Error);
    assert!(
        h[0].seen.contains("node0 2048kB 16/512 free (32M)"),
        "{}",
        h[0].seen
    );
    assert!(h[0].action.contains("HUGEMEM=512"), "{}", h[0].action);

    s.hugepages[0].free = 512;
    let mut gpu = dev("0000:81:00.0", 0x030200, "vfio-pci");
    gpu.numa_node = Some(1);
    let f = preflight(&input(&s, &[], Some(&gpu)));
    let h = of(&f, "hugepages");
    assert_eq!(h[0].severity, Severity::Warn);
    assert!(h[0].action.contains("HUGENODE=1"));
}

#[test]
fn memlock_below_pool_is_error_without_cap_ipc_lock() {
    let mut s = system();
    s.memlock.cap_ipc_lock = false;
    let f = preflight(&input(&s, &[], None));
    let m = of(&f, "memlock");
    assert_eq!(m[0].severity, Severity::Error);
    assert!(m[0].action.contains("524288"), "{}", m[0].action);
    s.memlock.soft = None;
    let f = preflight(&input(&s, &[], None));
    assert_eq!(of(&f, "memlock")[0].severity, Severity::Ok);
}

#[test]
fn numa_and_root_complex_mismatch() {
    let s = system();
    let mut gpu = dev("0000:81:00.0", 0x030200, "vfio-pci");
    gpu.numa_node = Some(1);
    gpu.root_complex = Some("pci0000:80".into());
    gpu.root_port = Some("0000:80:01.0".into());
    let sel = [dev("0000:01:00.0", 0x010802, "vfio-pci")];
    let f = preflight(&input(&s, &sel, Some(&gpu)));
    assert_eq!(of(&f, "numa")[0].severity, Severity::Warn);
    assert!(of(&f, "numa")[0].seen.contains("node 0"));
    assert_eq!(of(&f, "root-port")[0].severity, Severity::Warn);
    assert!(of(&f, "root-port")[0].seen.contains("pci0000:80"));
}

#[test]
fn lockdown_and_secure_boot_are_reported() {
    let mut s = system();
    s.lockdown = Some("integrity".into());
    s.secure_boot = Some(true);
    let f = preflight(&input(&s, &[], None));
    assert_eq!(of(&f, "lockdown")[0].severity, Severity::Warn);
    assert_eq!(of(&f, "secure-boot")[0].severity, Severity::Warn);
    assert_eq!(worst(&f), Severity::Warn);
}

#[test]
fn nics_on_vfio_pci_that_no_ubdirect_driver_supports_are_named_by_id() {
    let s = system();
    // An 82574 (e1000e: no ubdirect driver), an 82576 VF (igb-vf) and an 82576 PF (igb).
    let mut vf = dev("0000:00:06.0", 0x020000, "vfio-pci");
    (vf.vendor, vf.device) = (0x8086, 0x10ca);
    let mut e1000e = dev("0000:00:07.0", 0x020000, "vfio-pci");
    (e1000e.vendor, e1000e.device) = (0x8086, 0x10d3);
    let mut igb = dev("0000:00:08.0", 0x020000, "vfio-pci");
    (igb.vendor, igb.device) = (0x8086, 0x10c9);
    let f = preflight(&input(&s, &[vf, e1000e, igb], None));
    assert_eq!(worst(&f), Severity::Warn, "{f:#?}");
    let d = of(&f, "driver");
    let warned: Vec<_> = d.iter().filter(|x| x.severity == Severity::Warn).collect();
    assert_eq!(warned.len(), 1, "{d:#?}");
    let x = warned[0];
    assert!(
        x.seen
            .contains("(8086:10d3) is bound to vfio-pci, but no ubdirect driver supports it"),
        "{}",
        x.seen
    );
    assert!(
        x.action
            .contains("nvme (class 010802), virtio-net (1af4:1041, 1af4:1000), igb (8086:10c9")
            && x.action.contains("igb-vf (8086:10ca)")
            && x.action.contains("scripts/setup.sh reset"),
        "{}",
        x.action
    );
    let ok = |addr: &str, driver: &str| {
        d.iter().any(|x| {
            x.severity == Severity::Ok
                && x.device.as_deref() == Some(addr)
                && x.seen.contains(&format!("(ubdirect driver: {driver})"))
        })
    };
    assert!(
        ok("0000:00:06.0", "igb-vf"),
        "the 82576 VF has a driver: {d:#?}"
    );
    assert!(
        ok("0000:00:08.0", "igb"),
        "the 82576 PF has a driver: {d:#?}"
    );
}

#[test]
fn unsupported_device_on_its_kernel_driver_is_not_sent_to_setup_sh() {
    let s = system();
    let mut e1000e = dev("0000:00:07.0", 0x020000, "e1000e");
    (e1000e.vendor, e1000e.device) = (0x8086, 0x10d3);
    let f = preflight(&input(&s, &[e1000e], None));
    let d = of(&f, "driver");
    assert!(
        d[0].seen.contains("no ubdirect driver supports it"),
        "{}",
        d[0].seen
    );
    assert!(
        d[0].action.contains("leave it on its kernel driver")
            && !d[0].action.contains("PCI_ALLOWED"),
        "{}",
        d[0].action
    );
}

#[test]
fn supported_devices_on_vfio_pci_name_their_driver_or_bar_target() {
    let s = system();
    let nvme = dev("0000:00:02.0", 0x010802, "vfio-pci");
    let mut nic = dev("0000:00:05.0", 0x020000, "vfio-pci");
    (nic.vendor, nic.device) = (0x1af4, 0x1000);
    let ivshmem = dev("0000:00:04.0", 0x050000, "vfio-pci");
    let f = preflight(&input(&s, &[nvme, nic, ivshmem], None));
    let d = of(&f, "driver");
    assert!(d.iter().all(|x| x.severity == Severity::Ok), "{d:#?}");
    assert!(
        d[0].seen.contains("(ubdirect driver: nvme)"),
        "{}",
        d[0].seen
    );
    assert!(
        d[1].seen.contains("(ubdirect driver: virtio-net)"),
        "{}",
        d[1].seen
    );
    assert!(
        d[2].seen.contains("a BAR target: no driver needed"),
        "{}",
        d[2].seen
    );
}
