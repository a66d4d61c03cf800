//! Guest tests of the no-IOMMU back end's rules on a real kernel: the DMA address
//! of hugepage memory is its physical address (read back from `/proc/self/smaps`,
//! `/proc/self/pagemap` and cross-checked in `/proc/kpageflags`), ordinary memory is refused,
//! and a no-IOMMU domain is refused without both opt-ins; and in every boot of the suite (this
//! binary runs whole in the no-IOMMU boot too: its name holds "noiommu") nvme0 opens on the back
//! end that boot must use. Run by scripts/test.sh in the QEMU guest (as root); on the host they
//! are listed as ignored.

use ubdirect_core::vfio::{noiommu, BackendKind, DomainOptions};
use ubdirect_core::{DmaDomain, PageSize};
use ubdirect_hugepages::HugeMem;
use ubdirect_testbed as testbed;

/// `KPF_HUGE` in /proc/kpageflags (include/uapi/linux/kernel-page-flags.h).
const KPF_HUGE: u64 = 1 << 17;

fn kpageflags(pfn: u64) -> u64 {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::open("/proc/kpageflags").unwrap();
    let mut b = [0u8; 8];
    f.read_exact_at(&mut b, pfn * 8).unwrap();
    u64::from_ne_bytes(b)
}

#[test]
#[ignore = "guest: needs root and hugepages, run by scripts/test.sh"]
fn noiommu_dma_address_of_a_hugepage_is_its_physical_address() {
    testbed::require();
    let mem = HugeMem::alloc(2 << 20, PageSize::Size2M, None).expect("one 2 MiB hugepage");
    let p = mem.as_ptr();
    // SAFETY: p is the start of a live 2 MiB mapping we own; touching it populates the page.
    unsafe { p.write_volatile(0x5a) };
    let a = noiommu::dma_address(p as usize + 0x1234, 4096).expect("hugepage memory");
    let phys = ubdirect_hugepages::virt_to_phys(p).unwrap();
    assert_eq!(a, phys + 0x1234);
    assert_eq!(
        phys % (2 << 20),
        0,
        "a 2 MiB hugepage is 2 MiB aligned: {phys:#x}"
    );
    // The frame really is (the head of) a hugepage.
    let flags = kpageflags(phys / 4096);
    assert_ne!(
        flags & KPF_HUGE,
        0,
        "pfn {:#x} flags {flags:#x}",
        phys / 4096
    );
}

#[test]
#[ignore = "guest: needs root and hugepages, run by scripts/test.sh"]
fn noiommu_ordinary_memory_is_refused() {
    testbed::require();
    let v = vec![7u8; 1 << 16];
    let e = noiommu::dma_address(v.as_ptr() as usize, 4096).unwrap_err();
    let m = e.to_string();
    assert!(m.starts_with("DMA back end noiommu:"), "{m}");
    assert!(m.contains("ordinary memory of 4 KiB pages"), "{m}");
}

#[test]
#[ignore = "guest: needs root and hugepages, run by scripts/test.sh"]
fn noiommu_domain_is_refused_without_both_opt_ins() {
    testbed::require();
    let e = DmaDomain::with_options(DomainOptions {
        backend: Some(BackendKind::NoIommu),
        allow_noiommu: false,
    })
    .unwrap_err();
    assert!(e.to_string().contains("allow_noiommu"), "{e}");
    let both = DmaDomain::with_options(DomainOptions {
        backend: Some(BackendKind::NoIommu),
        allow_noiommu: true,
    });
    if std::env::var("UBD_VM_NO_IOMMU").as_deref() == Ok("1") {
        // The no-IOMMU boot turned the mode on (vfio.enable_unsafe_noiommu_mode=1): with both
        // opt-ins the domain is made; the back end is set up when the first device opens.
        let d = both.expect("both opt-ins");
        assert_eq!(d.backend_kind(), None);
        return;
    }
    let m = both.unwrap_err().to_string();
    if std::path::Path::new("/sys/module/vfio/parameters/enable_unsafe_noiommu_mode").exists() {
        assert!(
            m.contains("has not enabled vfio's unsafe no-IOMMU mode"),
            "{m}"
        );
    } else {
        // The Debian kernels: no CONFIG_VFIO_NOIOMMU.
        assert!(m.contains("CONFIG_VFIO_NOIOMMU"), "{m}");
    }
}

/// The DMA back end each boot of the suite must open its devices on: type1 on the Debian
/// kernels, iommufd on the built one, no-IOMMU in its no-IOMMU boot (UBD_VM_KERNEL and
/// UBD_VM_NO_IOMMU, exported by scripts/vm/run.sh). A boot that fell back to another back end
/// fails here rather than turning the tests of its own back end into allowed skips.
fn expected_backend() -> BackendKind {
    let kernel = std::env::var("UBD_VM_KERNEL").unwrap_or_default();
    let no_iommu = std::env::var("UBD_VM_NO_IOMMU").as_deref() == Ok("1");
    match (kernel.as_str(), no_iommu) {
        (_, true) => BackendKind::NoIommu,
        ("ubd", false) => BackendKind::Iommufd,
        ("6.12" | "6.1", false) => BackendKind::Type1,
        other => panic!("unknown test-bed boot {other:?} (UBD_VM_KERNEL, UBD_VM_NO_IOMMU)"),
    }
}

#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh in every boot"]
fn each_boot_opens_nvme0_on_its_expected_dma_back_end() {
    let tb = testbed::require();
    assert!(
        std::env::var_os("UBD_IOMMU_BACKEND").is_none(),
        "UBD_IOMMU_BACKEND overrides the automatic choice this test checks"
    );
    let want = expected_backend();
    // Automatic choice; the no-IOMMU boot gives the library's opt-in (as its tests do).
    let domain = DmaDomain::with_options(DomainOptions {
        backend: None,
        allow_noiommu: want == BackendKind::NoIommu,
    })
    .expect("a DMA domain");
    let addr = tb.nvme[0].parse().unwrap();
    let _dev = ubdirect_core::PciDevice::open(&domain, addr).expect("nvme0 opens on vfio-pci");
    let choice = domain
        .backend_choice()
        .expect("a device opened: a choice is recorded");
    println!("boot back end: {} ({})", choice.kind, choice.reason);
    assert_eq!(
        choice.kind, want,
        "this boot must use {want:?}, the library chose {:?}: {}",
        choice.kind, choice.reason
    );
}
