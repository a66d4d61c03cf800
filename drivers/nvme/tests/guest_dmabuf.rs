//! Guest tests on the built kernel (iommufd, vfio cdev, vfio-pci dma-buf export):
//! the ivshmem BAR (the GPU-BAR stand-in) is exported by vfio-pci as a dma-buf and imported
//! into the NVMe's IOAS by file; an NVMe read lands in it peer to peer and the host checks
//! the BAR's backing file byte for byte. On a kernel without iommufd (the Debian one) each
//! test reports a skip (listed in scripts/vm/expected-skips).

mod common;

use common::bar::{open_ivshmem, BarTarget};
use common::T;
use ubdirect_core::vfio::BackendKind;
use ubdirect_core::{PoolConfig, RegionKind, UbPool};
use ubdirect_nvme::{IoBuf, Lba};
use ubdirect_testbed as testbed;

/// The NVMe test bed, or None (after a skip line) when its domain is not on iommufd.
fn iommufd_bed() -> Option<common::Bed> {
    let bed = common::open(0, 1 << 20, 1);
    match bed.registry.domain().backend_kind() {
        Some(BackendKind::Iommufd) => Some(bed),
        other => {
            testbed::skip(&format!(
                "needs the iommufd back end (this kernel gave {other:?}: boot --kernel ubd)"
            ));
            None
        }
    }
}

#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn the_domain_reports_iommufd_and_its_ioas_ranges() {
    let Some(bed) = iommufd_bed() else { return };
    let d = bed.registry.domain();
    let c = d
        .backend_choice()
        .expect("a device opened: a choice is recorded");
    println!("back end: {} ({})", c.kind, c.reason);
    assert!(
        c.reason.contains("/dev/vfio/devices/vfio") || c.reason.contains("UBD_IOMMU_BACKEND"),
        "{}",
        c.reason
    );
    let ranges = d.iova_ranges();
    println!("IOAS ranges: {ranges:x?}");
    assert!(!ranges.is_empty(), "IOMMU_IOAS_IOVA_RANGES gave no range");
    // intel-iommu reserves the MSI window 0xfee00000..=0xfeefffff: it is outside every range.
    assert!(
        ranges.iter().all(|r| !r.contains(&0xfee0_0000)),
        "{ranges:x?}"
    );
    // Hugepage regions are mapped by file (their memfd) on iommufd.
    let before = d.file_mapping_count();
    let r = bed
        .registry
        .register_hugepages(2 << 20, ubdirect_core::PageSize::Size2M, None)
        .expect("a 2 MiB hugepage region");
    assert_eq!(
        d.file_mapping_count(),
        before + 1,
        "mapped by IOMMU_IOAS_MAP_FILE"
    );
    bed.registry.unregister(r.id).expect("unregister");
    assert_eq!(d.file_mapping_count(), before);
}

#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn nvme_reads_into_a_bar_imported_as_a_dmabuf() {
    let Some(bed) = iommufd_bed() else { return };
    let mapped_before = bed.registry.domain().mapping_count();
    let bar = BarTarget::register(&bed);
    assert!(matches!(
        bar.region.kind,
        RegionKind::DeviceBar { bar: 2, .. }
    ));
    assert_eq!(bed.registry.domain().mapping_count(), mapped_before + 1);
    let mut qp = bed.qp(32, 1);
    for (i, read) in [
        (4096u64, 1usize << 20, 0usize),
        (9000, 64 * 1024, 4096 + 512),
    ]
    .into_iter()
    .enumerate()
    {
        bar.read_and_check(&mut qp, &format!("nvme-dmabuf-bar-{i}"), i + 1, read);
    }
    let BarTarget { region, pool, .. } = bar;
    drop(pool);
    bed.registry.unregister(region.id).expect("unregister");
    assert_eq!(bed.registry.domain().mapping_count(), mapped_before);
}

#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn an_exported_bar_dmabuf_registers_as_an_external_dmabuf_region() {
    let Some(bed) = iommufd_bed() else { return };
    let dev = open_ivshmem(&bed);
    let fd = dev
        .access()
        .unwrap()
        .export_bar_dmabuf(2)
        .expect("vfio-pci exports BAR2");
    let len = 64 << 20;
    let r = bed
        .registry
        .register_dmabuf(fd, len, None)
        .expect("import the dma-buf");
    assert_eq!(r.kind, RegionKind::DmaBuf);
    assert!(r.vaddr.is_null());
    assert_eq!(
        bed.registry
            .region_of_iova(r.iova + 4096)
            .map(|(x, o)| (x.id, o)),
        Some((r.id, 4096))
    );
    let e = UbPool::new(
        &bed.registry,
        r.clone(),
        PoolConfig {
            block_size: 1 << 20,
            block_count: 4,
        },
    )
    .expect_err("a region without CPU mapping cannot be pooled");
    assert!(e.to_string().contains("no CPU mapping"), "{e}");
    // Bad input changes nothing: a length beyond the dma-buf is refused by the kernel.
    let count = bed.registry.domain().mapping_count();
    let fd2 = dev
        .access()
        .unwrap()
        .export_bar_dmabuf(2)
        .expect("export again");
    let e = bed
        .registry
        .register_dmabuf(fd2, len * 2, None)
        .expect_err("longer than the dma-buf");
    println!("refused as expected: {e}");
    assert_eq!(bed.registry.domain().mapping_count(), count);
    bed.registry.unregister(r.id).expect("unregister");
}

#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn io_into_a_revoked_bar_dmabuf_is_refused_until_it_is_registered_again() {
    let Some(bed) = iommufd_bed() else { return };
    let bar = BarTarget::register(&bed);
    let mut qp = bed.qp(32, 1);
    let (lba_before, lba_after, len) = (12_000u64, 20_000u64, 64 * 1024usize);
    // The read before the revocation; its host check ("nvme-dmabuf-revoked") runs after the
    // guest exits: the backing file still holds these bytes (nothing reaches the BAR later).
    let buf = bar.read_and_check(&mut qp, "nvme-dmabuf-revoked", 5, (lba_before, len, 0));
    assert!(bar.region.check_dma(bed.registry.domain().id()).is_ok());
    let dev = bar.dev.clone();
    // The exporter revokes: memory decoding of the ivshmem device off (vfio-pci moves its
    // dma-bufs to revoked; iommufd drops the IOAS's translation of them and never restores
    // it, and the kernel tells userspace nothing). The write went through ubdirect's
    // PciDevice, so the library knows: I/O into the region is refused before it is queued.
    let cmd = dev.config_read_u16(0x04).expect("command register");
    dev.access()
        .unwrap()
        .config_write_u16(0x04, cmd & !0x2)
        .expect("memory decoding off");
    let revoked = |r: Result<IoBuf, ubdirect_nvme::Rejected>, what: &str| -> IoBuf {
        let rej = match r {
            Ok(_) => panic!("{what}: a read into a revoked dma-buf completed"),
            Err(rej) => rej,
        };
        let m = rej.error.to_string();
        assert!(
            matches!(
                rej.error,
                ubdirect_nvme::NvmeError::Core(ubdirect_core::CoreError::DmaBufRevoked {
                    bar: 2,
                    ..
                })
            ),
            "{what}: {m}"
        );
        assert!(m.contains("register the BAR again"), "{m}");
        match rej.bufs {
            ubdirect_nvme::IoBufs::One(b) => b,
            _ => panic!("{what}: the buffer did not come back"),
        }
    };
    let ns = qp.namespace(1).unwrap();
    let buf = revoked(
        qp.read_blocking(&ns, Lba(lba_after), IoBuf::prefix(buf, len).unwrap(), T),
        "decoding off",
    );
    // Memory decoding back on: iommufd does not map a revoked dma-buf again, so the region
    // stays refused.
    dev.access()
        .unwrap()
        .config_write_u16(0x04, cmd)
        .expect("memory decoding back on");
    let buf = revoked(
        qp.read_blocking(&ns, Lba(lba_after), buf, T),
        "decoding back on",
    );
    drop(buf);
    let BarTarget { region, pool, .. } = bar;
    drop(pool);
    bed.registry
        .unregister(region.id)
        .expect("a revoked region unregisters");
    // A BAR range is registered once: the old region goes first.
    drop(region);
    // Registered again (a fresh dma-buf), the BAR takes DMA again.
    let BarTarget { region, pool, .. } = BarTarget::register_of(&bed, dev);
    let buf = qp
        .read_blocking(
            &ns,
            Lba(lba_after),
            IoBuf::prefix(pool.get().unwrap(), len).unwrap(),
            T,
        )
        .expect("read into the BAR registered again")
        .into_buf();
    let mut landed = vec![0u8; len];
    buf.read_into(0, &mut landed).expect("read the BAR");
    testbed::check_pattern(testbed::NVME0_NS1.id, lba_after * 512, &landed)
        .expect("pattern via the BAR mapping");
    drop(buf);
    drop(pool);
    bed.registry.unregister(region.id).expect("unregister");
}
