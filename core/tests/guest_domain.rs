//! Guest tests of the VFIO DMA domain, PCI device access and the UB registry on real vfio-pci
//! devices (see scripts/vm/README.md, "Writing a guest test"). Run by scripts/test.sh in the
//! QEMU guest; on the host they are listed as ignored.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use ubdirect_core::vfio::BackendKind;
use ubdirect_core::{
    CoreError, DmaDomain, DmaMem, PageSize, PciAddress, PciDevice, PoolConfig, RegionKind, UbPool,
    UbRegistry,
};
use ubdirect_testbed as testbed;

const GUEST: &str = "guest: needs vfio devices, run by scripts/test.sh";

fn nvme(i: usize) -> PciAddress {
    testbed::require().nvme[i].parse().unwrap()
}

fn free_2m() -> u64 {
    ubdirect_hugepages::pools()
        .unwrap()
        .iter()
        .find(|p| p.node.is_none() && p.size == PageSize::Size2M)
        .map(|p| p.free)
        .unwrap()
}

fn open(addr: PciAddress) -> (Arc<DmaDomain>, Arc<PciDevice>) {
    let d = DmaDomain::new().expect("VFIO container");
    let dev = PciDevice::open(&d, addr).expect("open a vfio-pci device");
    (d, dev)
}

fn driver_of(addr: &str) -> Option<String> {
    std::fs::read_link(format!("/sys/bus/pci/devices/{addr}/driver"))
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
}

/// Bind `addr` to `driver` (None: leave it unbound) via driver_override.
fn rebind(addr: &str, driver: Option<&str>) {
    let dev = format!("/sys/bus/pci/devices/{addr}");
    std::fs::write(
        format!("{dev}/driver_override"),
        format!("{}\n", driver.unwrap_or("")),
    )
    .unwrap();
    if Path::new(&format!("{dev}/driver")).exists() {
        std::fs::write(format!("{dev}/driver/unbind"), addr).unwrap();
    }
    if driver.is_some() {
        let _ = std::fs::write("/sys/bus/pci/drivers_probe", addr);
    }
    assert_eq!(driver_of(addr).as_deref(), driver, "rebinding {addr}");
}

/// Devices rebound for a test; put back to no driver when dropped (also when the test fails).
struct Rebound(Vec<&'static str>);

impl Rebound {
    fn bind(&mut self, addr: &'static str, driver: &str) {
        self.0.push(addr);
        rebind(addr, Some(driver));
    }
}

impl Drop for Rebound {
    fn drop(&mut self) {
        for a in self.0.drain(..).rev() {
            rebind(a, None);
        }
    }
}

#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn domain_learns_the_iommu_and_reads_the_device() {
    let _ = GUEST;
    let (d, dev) = open(nvme(0));
    // The guest's vIOMMU: 4K/2M/1G pages (type1 reports them; iommufd reports only the
    // minimum IOVA alignment, 4K), the MSI window excluded.
    let pages = match d.backend_kind() {
        Some(ubdirect_core::vfio::BackendKind::Iommufd) => 0x1000,
        _ => 0x4020_1000,
    };
    assert_eq!(d.page_sizes() & pages, pages, "{:#x}", d.page_sizes());
    let r = d.iova_ranges();
    assert!(r.iter().any(|r| r.start == 0xfef0_0000), "{r:?}");
    assert!(
        r.iter().all(|r| !(r.start..r.end).contains(&0xfee0_0000)),
        "{r:?}"
    );
    assert_eq!((dev.vendor_id(), dev.device_id()), (0x1b36, 0x0010));
    assert_eq!(dev.class_code(), 0x01_08_02);
    assert_eq!(dev.config_read_u16(0).unwrap(), 0x1b36);
    let caps = dev.capabilities().unwrap();
    assert!(caps.iter().any(|c| c.id == 0x11), "MSI-X in {caps:?}");
    assert!(caps.iter().any(|c| c.id == 0x10), "PCIe in {caps:?}");
    dev.access().unwrap().enable_bus_master().unwrap();
    assert_ne!(dev.config_read_u16(4).unwrap() & 0x6, 0);
    // BAR0 through VFIO: NVMe CAP and VS as the test bed documents them.
    let bar = dev.access().unwrap().map_bar(0).unwrap();
    assert_eq!(bar.len() as u64, dev.bar_len(0).unwrap());
    assert_eq!(bar.read64(0) & 0xffff, 0x07ff, "CAP.MQES");
    assert_eq!(bar.read32_checked(8).unwrap(), 0x0001_0400, "VS 1.4");
    // Past the config space and a BAR the device lacks: errors, no panic.
    assert!(matches!(
        dev.config_read_u32(4094),
        Err(CoreError::ConfigAccess { .. })
    ));
    if dev.can_reset() {
        dev.access().unwrap().reset().unwrap();
        assert_eq!(dev.config_read_u16(0).unwrap(), 0x1b36, "alive after reset");
    } else {
        assert!(matches!(
            dev.access().unwrap().reset(),
            Err(CoreError::Unsupported { .. })
        ));
    }
}

#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn two_devices_share_one_domain() {
    let d = DmaDomain::new().unwrap();
    let a = PciDevice::open(&d, nvme(0)).unwrap();
    let b = PciDevice::open(&d, nvme(1)).unwrap();
    assert_ne!(a.address(), b.address());
    let reg = UbRegistry::new(d.clone());
    let r = reg
        .register_hugepages(2 << 20, PageSize::Size2M, None)
        .unwrap();
    assert_eq!(d.mapping_count(), 1, "one mapping serves both devices");
    drop((r, reg));
    assert_eq!(d.mapping_count(), 0);
    // Opening the same device twice is refused with the cause.
    let e = PciDevice::open(&d, nvme(0)).unwrap_err().to_string();
    assert!(e.contains("already open in this DMA domain"), "{e}");
    assert_eq!(d.device_count(), 2);
    // Another domain cannot take a group this one holds.
    let other = DmaDomain::new().unwrap();
    let e = PciDevice::open(&other, nvme(0)).unwrap_err();
    assert!(matches!(e, CoreError::GroupBusy { .. }), "{e}");
    assert!(e.to_string().contains("already in use"), "{e}");
    assert_eq!(other.device_count(), 0);
}

#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn mappings_survive_the_last_device_closing() {
    let (d, dev) = open(nvme(0));
    let reg = UbRegistry::new(d.clone());
    let r = reg
        .register_hugepages(4 << 20, PageSize::Size2M, None)
        .unwrap();
    let iova = r.iova;
    drop(dev); // VFIO drops the IOMMU with the last device
    assert_eq!(d.device_count(), 0);
    let e = reg
        .register_hugepages(2 << 20, PageSize::Size2M, None)
        .unwrap_err();
    assert!(matches!(e, CoreError::NoDevice), "{e}");
    // A device joins again: the region is mapped again at the same IOVA. The kernel's unmap
    // reports the size it removed, so a successful unregister proves the replay happened.
    let dev = PciDevice::open(&d, nvme(1)).unwrap();
    assert_eq!(reg.iova_of(r.vaddr), Some(iova));
    reg.unregister(r.id).unwrap();
    assert_eq!(d.mapping_count(), 0);
    drop(dev);
}

#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn maps_hugepages_and_releases_everything() {
    let before = free_2m();
    let (d, _dev) = open(nvme(0));
    let reg = UbRegistry::new(d.clone());
    let a = reg
        .register_hugepages(8 << 20, PageSize::Size2M, None)
        .unwrap();
    assert_eq!(a.kind, RegionKind::Host { page_size: 2 << 20 });
    assert_eq!(a.iova % (2 << 20), 0);
    assert!(d
        .iova_ranges()
        .iter()
        .any(|r| r.start <= a.iova && a.iova + a.len as u64 <= r.end));
    assert_eq!(free_2m(), before - 4);
    // The same memory again (here through register_external) is refused and changes nothing.
    // SAFETY: refused before anything is mapped; a's memory stays owned by a.
    let e =
        unsafe { reg.register_external(a.vaddr.wrapping_add(2 << 20), 2 << 20, None) }.unwrap_err();
    assert!(
        e.to_string()
            .contains("is already mapped in this DMA domain"),
        "{e}"
    );
    assert_eq!(d.mapping_count(), 1);
    let pool = UbPool::with_hugepages(
        &reg,
        PoolConfig {
            block_size: 1 << 20,
            block_count: 8,
        },
        None,
    )
    .unwrap();
    let mut buf = pool.get().unwrap();
    buf.as_mut_slice()[..4].copy_from_slice(b"UBD!");
    assert_eq!(reg.iova_of(buf.as_ptr()), Some(buf.iova()));
    let (r, off) = reg.region_of_iova(buf.iova() + 5).unwrap();
    assert_eq!(
        (r.id, off as u64),
        (pool.region().id, buf.iova() - r.iova + 5)
    );
    let dm = DmaMem::alloc(&reg, 16 << 10).unwrap();
    assert_eq!(reg.iova_of(dm.as_ptr()), Some(dm.iova()));
    assert_eq!(d.mapping_count(), 3, "region, pool region, DMA slab");
    // Unregister is refused while the pool holds its region, and changes nothing.
    let e = reg.unregister(pool.region().id).unwrap_err();
    assert!(matches!(e, CoreError::RegionBusy { .. }), "{e}");
    reg.unregister(a.id).unwrap();
    assert_eq!(d.mapping_count(), 2);
    drop((buf, pool, dm, a, r));
    drop(reg);
    assert_eq!(d.mapping_count(), 0, "every mapping removed");
    assert_eq!(d.mapped_bytes(), 0);
    assert_eq!(free_2m(), before, "every hugepage back");
}

#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn numa_bound_hugepages_come_from_the_node() {
    let node_free = || {
        ubdirect_hugepages::pools()
            .unwrap()
            .iter()
            .find(|p| p.node == Some(0) && p.size == PageSize::Size2M)
            .map(|p| p.free)
            .expect("node 0 hugepage pool in sysfs")
    };
    let (d, dev) = open(nvme(0));
    let reg = UbRegistry::new(d.clone());
    let before = node_free();
    let r = reg
        .register_hugepages(4 << 20, PageSize::Size2M, Some(0))
        .unwrap();
    assert_eq!(r.numa, Some(0));
    assert_eq!(node_free(), before - 2, "pages taken from node 0");
    // A node that does not exist is named.
    let e = reg
        .register_hugepages(2 << 20, PageSize::Size2M, Some(7))
        .unwrap_err()
        .to_string();
    assert!(e.contains("NUMA node 7 does not exist"), "{e}");
    // The device's node is what sysfs says: -1 (none) on the Debian kernels, 0 on ubd, whose
    // NUMA kernel puts the guest's PCI devices on its one node.
    let sysfs: i64 = std::fs::read_to_string(format!("/sys/bus/pci/devices/{}/numa_node", nvme(0)))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_eq!(dev.numa_node(), u32::try_from(sysfs).ok());
    drop(r);
    drop(reg);
    assert_eq!(node_free(), before);
}

#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn maps_a_gigabyte_page() {
    // The test bed reserves exactly one 1 GiB page (scripts/vm/run.sh: hugepagesz=1G
    // hugepages=1 with --mem 3584M): it maps at a 1 GiB-aligned IOVA, and with it taken the
    // next registration is refused by name.
    let free_1g = || {
        ubdirect_hugepages::pools()
            .unwrap()
            .iter()
            .find(|p| p.node.is_none() && p.size == PageSize::Size1G)
            .map(|p| p.free)
            .unwrap_or(0)
    };
    assert_eq!(
        free_1g(),
        1,
        "the test bed reserves one 1 GiB hugepage (UBD_VM_HUGEPAGES, --mem 3584M)"
    );
    let (d, _dev) = open(nvme(0));
    let reg = UbRegistry::new(d.clone());
    let r = reg
        .register_hugepages(1 << 30, PageSize::Size1G, None)
        .expect("register the 1 GiB page");
    assert_eq!(r.iova % (1 << 30), 0, "1 GiB-aligned IOVA");
    let e = reg
        .register_hugepages(1 << 30, PageSize::Size1G, None)
        .unwrap_err();
    assert!(e.to_string().contains("no free 1 GiB hugepages"), "{e}");
    drop(r);
    drop(reg);
    assert_eq!(d.mapping_count(), 0);
    assert_eq!(free_1g(), 1);
}

#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn maps_the_ivshmem_bar() {
    let tb = testbed::require();
    let addr: PciAddress = tb.ivshmem.expect("ivshmem").parse().unwrap();
    let (d, dev) = open(addr);
    let reg = UbRegistry::new(d.clone());
    let r = reg.register_bar(&dev, 2).unwrap();
    assert_eq!(r.len, 64 << 20);
    assert_eq!(
        r.kind,
        RegionKind::DeviceBar {
            device: addr,
            bar: 2
        }
    );
    assert_eq!(d.mapping_count(), 1);
    assert_eq!(reg.iova_of(r.vaddr.wrapping_add(4096)), Some(r.iova + 4096));
    let e = reg.register_bar(&dev, 6).unwrap_err().to_string();
    assert!(e.contains("BAR index must be 0..=5"), "{e}");
    let e = reg.register_bar(&dev, 3).unwrap_err().to_string();
    assert!(e.contains("does not implement this BAR"), "{e}");
    assert_eq!(d.mapping_count(), 1, "bad BARs changed nothing");
    reg.unregister(r.id).unwrap();
    assert_eq!(d.mapping_count(), 0);
}

#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn wrong_addresses_and_drivers_are_named() {
    let d = DmaDomain::new().unwrap();
    let e = PciDevice::open(&d, "00:1e.0".parse().unwrap())
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("no PCI device 0000:00:1e.0"), "{e}");
    // The ICH9 SMBus function has no driver in the guest.
    let e = PciDevice::open(&d, "00:1f.3".parse().unwrap())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("bound to no driver, not vfio-pci: bind it to vfio-pci"),
        "{e}"
    );
    // The ICH9 SATA function holds the test bed's SATA disk on the ahci driver.
    let e = PciDevice::open(&d, "00:1f.2".parse().unwrap())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("bound to driver ahci, not vfio-pci: bind it to vfio-pci"),
        "{e}"
    );
    // A device on a host driver: the LPC bridge on the built-in iosf_mbi_pci driver.
    let mut rb = Rebound(Vec::new());
    rb.bind("0000:00:1f.0", "iosf_mbi_pci");
    let e = PciDevice::open(&d, "00:1f.0".parse().unwrap())
        .unwrap_err()
        .to_string();
    drop(rb);
    assert!(
        e.contains("bound to driver iosf_mbi_pci, not vfio-pci"),
        "{e}"
    );
    // A map before any device joined the domain.
    let reg = UbRegistry::new(d.clone());
    let e = reg
        .register_hugepages(2 << 20, PageSize::Size2M, None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("open a PciDevice"), "{e}");
    assert_eq!(d.mapping_count(), 0);
}

#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn non_viable_group_lists_the_other_devices() {
    // 00:1f.x share IOMMU group: put 1f.3 on vfio-pci and 1f.0 on a host driver.
    let mut rb = Rebound(Vec::new());
    rb.bind("0000:00:1f.3", "vfio-pci");
    rb.bind("0000:00:1f.0", "iosf_mbi_pci");
    let d = DmaDomain::new().unwrap();
    let r = PciDevice::open(&d, "00:1f.3".parse().unwrap()).map(|_| ());
    drop(rb);
    let e = r.unwrap_err().to_string();
    assert!(e.contains("is not viable"), "{e}");
    assert!(e.contains("0000:00:1f.0 (iosf_mbi_pci)"), "{e}");
    assert!(e.contains("0000:00:1f.2 (ahci)"), "{e}");
}

#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn iova_exhaustion_is_named_and_changes_nothing() {
    let (d, _dev) = open(nvme(0));
    d.restrict_iova(0x40_0000..0xa0_0000).unwrap(); // 6 MiB of IOVA space
    let reg = UbRegistry::new(d.clone());
    let before = free_2m();
    let a = reg
        .register_hugepages(4 << 20, PageSize::Size2M, None)
        .unwrap();
    let e = reg
        .register_hugepages(4 << 20, PageSize::Size2M, None)
        .unwrap_err();
    assert!(matches!(e, CoreError::IovaExhausted { .. }), "{e}");
    assert!(e.to_string().contains("largest free range 0x200000"), "{e}");
    assert_eq!(d.mapping_count(), 1);
    assert_eq!(
        free_2m(),
        before - 2,
        "the refused region's pages were returned"
    );
    reg.unregister(a.id).unwrap();
    drop(a);
    // Freeing gives the whole space back.
    let r = reg
        .register_hugepages(6 << 20, PageSize::Size2M, None)
        .unwrap();
    assert_eq!(r.iova, 0x40_0000);
}

/// Run this test again in a child process with `mode`; returns the child's output.
fn in_child(test: &str, mode: &str) -> String {
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            test,
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("UBD_CORE_CHILD", mode)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "child {mode} failed:\n{text}");
    text
}

fn child_mode() -> Option<String> {
    std::env::var("UBD_CORE_CHILD").ok()
}

/// linux/capability.h
const CAP_IPC_LOCK: u32 = 14;

/// Drop CAP_IPC_LOCK from this process's effective and permitted sets.
fn drop_ipc_lock() {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Default, Clone, Copy)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    let mut h = Header {
        version: 0x2008_0522,
        pid: 0,
    };
    let mut data = [Data::default(); 2];
    assert_eq!(
        // SAFETY: capget fills two Data structs for version 3.
        unsafe { libc::syscall(libc::SYS_capget, &mut h, data.as_mut_ptr()) },
        0
    );
    data[0].effective &= !(1 << CAP_IPC_LOCK);
    data[0].permitted &= !(1 << CAP_IPC_LOCK);
    assert_eq!(
        // SAFETY: capset reads the header and two Data structs.
        unsafe { libc::syscall(libc::SYS_capset, &mut h, data.as_ptr()) },
        0
    );
}

#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn memlock_limit_is_named() {
    if child_mode().as_deref() == Some("memlock") {
        let lim = libc::rlimit {
            rlim_cur: 1 << 20,
            rlim_max: 1 << 20,
        };
        // SAFETY: setrlimit reads the struct.
        assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &lim) }, 0);
        drop_ipc_lock();
        let (d, _dev) = open(nvme(0));
        let reg = UbRegistry::new(d.clone());
        let e = reg
            .register_hugepages(8 << 20, PageSize::Size2M, None)
            .unwrap_err();
        println!("UBD-CHILD-SAW: {e}");
        assert!(
            matches!(e, CoreError::MemlockTooLow { needed, limit: 1048576 } if needed >= 8 << 20),
            "{e}"
        );
        assert_eq!(d.mapping_count(), 0);
        return;
    }
    let out = in_child("memlock_limit_is_named", "memlock");
    assert!(
        out.contains(
            "UBD-CHILD-SAW: cannot pin 8388608 bytes for DMA: RLIMIT_MEMLOCK is 1048576 bytes"
        ),
        "{out}"
    );
}

#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn permission_denied_names_node_and_user() {
    if child_mode().as_deref() == Some("nobody") {
        // SAFETY: plain id changes of this (child) process.
        unsafe {
            assert_eq!(libc::setgid(65534), 0);
            assert_eq!(libc::setuid(65534), 0);
        }
        let d = DmaDomain::new().unwrap();
        let e = PciDevice::open(&d, nvme(0)).unwrap_err();
        println!("UBD-CHILD-SAW: {e}");
        assert!(matches!(e, CoreError::PermissionDenied { .. }), "{e}");
        return;
    }
    // The node refused first: the group (type1) or /dev/iommu (iommufd, chosen where the
    // kernel has it: the ubd kernel).
    let (d, _dev) = open(nvme(0));
    let node = match d.backend_kind() {
        Some(BackendKind::Iommufd) => "/dev/iommu",
        _ => "/dev/vfio/",
    };
    drop((d, _dev));
    let out = in_child("permission_denied_names_node_and_user", "nobody");
    assert!(
        out.contains(&format!("UBD-CHILD-SAW: permission denied opening {node}")),
        "{out}"
    );
    assert!(out.contains("uid 65534"), "{out}");
}
