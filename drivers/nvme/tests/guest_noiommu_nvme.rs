//! Guest tests of NVMe I/O on the no-IOMMU back end: in a guest booted without an
//! IOMMU (`scripts/vm/suite.sh --kernel ubd --no-iommu --filter noiommu`, where the bind step
//! ran `UBD_ALLOW_NOIOMMU=1 scripts/setup.sh config`), nvme0 opens through its vfio no-IOMMU
//! group, pool buffers reach it at their physical addresses, and real data is written and read
//! back; device memory is refused; without the library opt-in nothing opens; `ubdirect perf
//! --allow-noiommu --verify` runs clean and is refused without the flag. On a boot with an
//! IOMMU each test reports a skip (listed in scripts/vm/expected-skips).

mod common;

use std::sync::Arc;

use common::{fill_random, T};
use ubdirect_core::vfio::{noiommu, BackendKind, DomainOptions};
use ubdirect_core::{DmaDomain, PageSize, PoolConfig, UbPool, UbRegistry};
use ubdirect_nvme::{
    Controller, ControllerOptions, IoBuf, IoFlags, IoQueuePair, Lba, QueueOptions,
};
use ubdirect_testbed::cli::{perf_rw_verify_args, perf_verified_clean, ubdirect};
use ubdirect_testbed::{self as testbed, NVME0_NS1};

/// True in the no-IOMMU boot; elsewhere prints the skip line and returns false.
fn no_iommu_boot() -> bool {
    testbed::require();
    if std::env::var("UBD_VM_NO_IOMMU").as_deref() == Ok("1") {
        return true;
    }
    testbed::skip("needs the no-IOMMU boot (scripts/vm/suite.sh --kernel ubd --no-iommu)");
    false
}

/// A registry whose domain allows the no-IOMMU back end, and nvme0 opened in it.
fn open_nvme0() -> (Arc<UbRegistry>, Arc<Controller>) {
    let tb = testbed::require();
    let domain = DmaDomain::with_options(DomainOptions {
        backend: None,
        allow_noiommu: true,
    })
    .expect("a no-IOMMU domain with both opt-ins");
    let registry = UbRegistry::new(domain);
    let ctrl = Controller::open(
        &registry,
        tb.nvme[0].parse().unwrap(),
        ControllerOptions::default(),
    )
    .expect("nvme0 opens through its no-IOMMU group");
    (registry, ctrl)
}

#[test]
#[ignore = "guest: needs the no-IOMMU boot, run by scripts/test.sh"]
fn noiommu_nvme_write_read_verifies_real_data_at_physical_addresses() {
    if !no_iommu_boot() {
        return;
    }
    let (registry, ctrl) = open_nvme0();
    let domain = registry.domain();
    assert_eq!(domain.backend_kind(), Some(BackendKind::NoIommu));
    let why = domain.backend_choice().unwrap().reason;
    assert!(why.contains("no-IOMMU group"), "{why}");
    // 2 x 1 MiB blocks: one 2 MiB hugepage, physically contiguous by itself.
    let pool = UbPool::with_hugepages(
        &registry,
        PoolConfig {
            block_size: 1 << 20,
            block_count: 2,
        },
        None,
    )
    .expect("a one-hugepage pool");
    let mut qp = IoQueuePair::new(
        &ctrl,
        QueueOptions {
            depth: 16,
            nsid: Some(1),
            ..Default::default()
        },
    )
    .expect("queue pair");
    let ns = qp.namespace(1).unwrap();
    let mut src = pool.get().unwrap();
    let mut dst = pool.get().unwrap();
    // The bus address the controller is given is the buffer's physical address.
    for b in [&src, &dst] {
        let phys = noiommu::dma_address(b.as_ptr() as usize, 4096).unwrap();
        assert_eq!(b.iova(), phys, "pool buffer at {:p}", b.as_ptr());
    }

    // Real data the host wrote into nvme0's image (LBAs below 32768 keep its pattern).
    let len = 256 * 1024;
    dst.as_mut_slice().fill(0);
    let got = qp
        .read_blocking(&ns, Lba(4096), IoBuf::new(dst, 0, len).unwrap(), T)
        .unwrap_or_else(|r| panic!("pattern read: {}", r.error))
        .into_buf();
    testbed::check_pattern(NVME0_NS1.id, 4096 * 512, &got.as_slice()[..len]).unwrap_or_else(|m| {
        panic!("the controller's read did not land at the physical address: {m:?}")
    });
    let mut dst = got;

    // Write then read back fresh data in nvme0's scratch half, at several sizes and offsets.
    for (i, &(len, off)) in [
        (4096usize, 0usize),
        (64 * 1024, 512),
        (1 << 19, 4096),
        (1 << 20, 0),
    ]
    .iter()
    .enumerate()
    {
        let lba = 70_000 + i as u64 * 4096;
        fill_random(0x5eed + i as u64, &mut src.as_mut_slice()[off..off + len]);
        src = qp
            .write_blocking(
                &ns,
                Lba(lba),
                IoBuf::new(src, off, len).unwrap(),
                IoFlags::FUA,
                T,
            )
            .unwrap_or_else(|r| panic!("write {len} at lba {lba}: {}", r.error))
            .into_buf();
        dst.as_mut_slice().fill(0xa5);
        dst = qp
            .read_blocking(&ns, Lba(lba), IoBuf::new(dst, off, len).unwrap(), T)
            .unwrap_or_else(|r| panic!("read {len} at lba {lba}: {}", r.error))
            .into_buf();
        assert!(
            src.as_slice()[off..off + len] == dst.as_slice()[off..off + len],
            "{len} bytes at lba {lba} (buffer offset {off}) read back differ"
        );
        assert!(
            dst.as_slice()[..off].iter().all(|&b| b == 0xa5),
            "bytes before the transfer were written"
        );
    }
    let st = qp.stats();
    println!("no-IOMMU: {st:?}");
    assert_eq!((st.timeouts, st.failed_back), (0, 0), "{st:?}");
}

/// The physically contiguous runs of `[ptr, ptr+len)` read from pagemap page by page, as
/// (offset, length, physical address): what the region's pieces must be.
fn runs_from_pagemap(ptr: *mut u8, len: usize) -> Vec<(usize, usize, u64)> {
    let mut runs: Vec<(usize, usize, u64)> = Vec::new();
    for off in (0..len).step_by(2 << 20) {
        let p = noiommu::dma_address(ptr as usize + off, 4096).unwrap();
        match runs.last_mut() {
            Some(r) if r.2 + r.1 as u64 == p => r.1 += 2 << 20,
            _ => runs.push((off, 2 << 20, p)),
        }
    }
    runs
}

#[test]
#[ignore = "guest: needs the no-IOMMU boot, run by scripts/test.sh"]
fn noiommu_a_pool_over_scattered_hugepages_moves_data_through_every_block() {
    if !no_iommu_boot() {
        return;
    }
    let (registry, ctrl) = open_nvme0();
    // Scatter the free hugepages: take six single pages, give back 1, 3 and 5. hugetlb hands
    // out the most recently freed page first, so the pool's three pages come from between pages
    // still held, in reverse order: not one physical range.
    let mut held: Vec<Option<_>> = (0..6)
        .map(|_| {
            Some(
                registry
                    .register_hugepages(2 << 20, PageSize::Size2M, None)
                    .expect("a free 2 MiB hugepage"),
            )
        })
        .collect();
    for i in [1, 3, 5] {
        let r = held[i].take().unwrap();
        registry.unregister(r.id).unwrap();
        drop(r); // the page goes back to the kernel's free list now
    }
    let pool = UbPool::with_hugepages(
        &registry,
        PoolConfig {
            block_size: 256 << 10,
            block_count: 24,
        },
        None,
    )
    .expect("a 6 MiB pool over three 2 MiB hugepages in no-IOMMU mode");
    let r = pool.region().clone();
    let want = runs_from_pagemap(r.vaddr, r.len);
    let pieces: Vec<(usize, usize, u64)> = if r.segments.is_empty() {
        vec![(0, r.len, r.iova)]
    } else {
        r.segments
            .iter()
            .map(|g| (g.offset, g.len, g.iova))
            .collect()
    };
    println!(
        "no-IOMMU pool region: {} piece(s) {pieces:x?}",
        pieces.len()
    );
    assert_eq!(pieces, want, "the region's pieces are its physical runs");
    assert!(
        want.len() > 1,
        "the pool's hugepages came out physically contiguous ({want:x?}): the scattering step did not work on this kernel"
    );
    let mut qp = IoQueuePair::new(
        &ctrl,
        QueueOptions {
            depth: 16,
            nsid: Some(1),
            ..Default::default()
        },
    )
    .expect("queue pair");
    let ns = qp.namespace(1).unwrap();
    // Every block: its bus address is the physical address of all its bytes (dma_address
    // refuses a range that is not one physical range), and a write from it and a read into
    // it move real data.
    let mut bufs: Vec<Option<_>> = (0..24).map(|_| Some(pool.get().unwrap())).collect();
    for b in bufs.iter().flatten() {
        let phys = noiommu::dma_address(b.as_ptr() as usize, b.len())
            .unwrap_or_else(|e| panic!("buffer {:p} is not one physical range: {e}", b.as_ptr()));
        assert_eq!(b.iova(), phys, "buffer {:p}", b.as_ptr());
    }
    let len = 256 << 10;
    for i in 0..bufs.len() {
        let lba = 90_000 + i as u64 * 512;
        let mut src = bufs[i].take().unwrap();
        fill_random(0xb10c + i as u64, src.as_mut_slice());
        let src = qp
            .write_blocking(
                &ns,
                Lba(lba),
                IoBuf::new(src, 0, len).unwrap(),
                IoFlags::FUA,
                T,
            )
            .unwrap_or_else(|r| panic!("write block {i} at lba {lba}: {}", r.error))
            .into_buf();
        // Read it back into the next block (in another piece for some of them).
        let j = (i + 1) % bufs.len();
        let mut dst = bufs[j].take().unwrap();
        dst.as_mut_slice().fill(0);
        let dst = qp
            .read_blocking(&ns, Lba(lba), IoBuf::new(dst, 0, len).unwrap(), T)
            .unwrap_or_else(|r| panic!("read block {i} at lba {lba}: {}", r.error))
            .into_buf();
        assert!(
            src.as_slice() == dst.as_slice(),
            "block {i}: 256 KiB read back into {:p} (bus {:#x}) differ from {:p} (bus {:#x})",
            dst.as_ptr(),
            dst.iova(),
            src.as_ptr(),
            src.iova()
        );
        bufs[i] = Some(src);
        bufs[j] = Some(dst);
    }
    let st = qp.stats();
    assert_eq!((st.timeouts, st.failed_back), (0, 0), "{st:?}");
    drop(held);
}

#[test]
#[ignore = "guest: needs the no-IOMMU boot, run by scripts/test.sh"]
fn noiommu_device_memory_and_ordinary_memory_are_refused() {
    if !no_iommu_boot() {
        return;
    }
    let (registry, ctrl) = open_nvme0();
    let before = (
        registry.domain().mapping_count(),
        registry.domain().mapped_bytes(),
    );
    let e = registry
        .register_bar(ctrl.device(), 0)
        .expect_err("a BAR has no safe bus address without an IOMMU");
    let m = e.to_string();
    assert!(m.starts_with("DMA back end noiommu:"), "{m}");
    assert!(
        m.contains(&format!(
            "BAR 0 of {} cannot be registered",
            ctrl.device().address()
        )),
        "{m}"
    );
    assert!(m.contains("turn the IOMMU on"), "{m}");
    // SAFETY: the export is refused (no IOMMU) before anything reaches the device; nothing
    // programs the controller behind its driver.
    let e = unsafe { ctrl.device().access_unclaimed() }
        .export_bar_dmabuf(0)
        .expect_err("no dma-buf export without an IOMMU");
    assert!(e.to_string().contains("cannot be registered"), "{e}");
    // Ordinary pages move: refused with the rule.
    let e = registry
        .register_anonymous(1 << 16, None)
        .expect_err("anonymous memory is not given to a device without an IOMMU");
    assert!(
        e.to_string().contains("ordinary memory of 4 KiB pages"),
        "{e}"
    );
    assert_eq!(
        (
            registry.domain().mapping_count(),
            registry.domain().mapped_bytes()
        ),
        before,
        "refusals changed the domain"
    );

    // The same hugepage under a second virtual address has the same bus address: refused.
    let r = registry
        .register_hugepages(2 << 20, PageSize::Size2M, None)
        .expect("one hugepage");
    let phys = noiommu::dma_address(r.vaddr as usize, r.len).unwrap();
    assert_eq!(
        r.iova, phys,
        "a hugepage region's bus address is its physical address"
    );
    // A second view of the same hugetlb file (root may open /proc/self/map_files).
    let (start, end) = (r.vaddr as usize, r.vaddr as usize + r.len);
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(format!("/proc/self/map_files/{start:x}-{end:x}"))
        .expect("the region's hugetlb file");
    // SAFETY: a fresh shared mapping of that file, unmapped below and never written through.
    let alias = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            r.len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            std::os::fd::AsRawFd::as_raw_fd(&file),
            0,
        )
    };
    assert_ne!(
        alias,
        libc::MAP_FAILED,
        "{}",
        std::io::Error::last_os_error()
    );
    // SAFETY: the alias maps r.len bytes; a read faults the page in (pagemap shows it then).
    let _ = unsafe { alias.cast::<u8>().read_volatile() };
    let n = registry.domain().mapping_count();
    // SAFETY: the alias stays mapped until after the (refused) map returns.
    let e = unsafe { registry.domain().map(alias.cast(), r.len, 2 << 20) }
        .expect_err("the same physical memory mapped twice");
    assert!(
        matches!(e, ubdirect_core::CoreError::AlreadyMapped { .. }),
        "{e}"
    );
    assert_eq!(registry.domain().mapping_count(), n);
    // SAFETY: the alias made above, no longer used.
    unsafe { libc::munmap(alias, r.len) };
}

#[test]
#[ignore = "guest: needs the no-IOMMU boot, run by scripts/test.sh"]
fn noiommu_device_open_is_refused_without_the_library_opt_in() {
    if !no_iommu_boot() {
        return;
    }
    let tb = testbed::require();
    let addr = tb.nvme[0].parse().unwrap();
    // The automatic choice is no-IOMMU here, but the default options do not allow it.
    let registry = UbRegistry::new(DmaDomain::new().expect("domain"));
    let Err(e) = Controller::open(&registry, addr, ControllerOptions::default()) else {
        panic!("nvme0 opened through no-IOMMU without DomainOptions::allow_noiommu");
    };
    let m = e.to_string();
    assert!(m.contains("allow_noiommu"), "{m}");
    assert!(
        m.contains("UBD_ALLOW_NOIOMMU=1 scripts/setup.sh config"),
        "{m}"
    );
    assert_eq!(registry.domain().device_count(), 0);
    assert_eq!(
        registry.domain().backend_kind(),
        None,
        "no back end was set up"
    );
    drop(registry);
    // Nothing was left open: with the opt-in the device opens.
    let (_r, c) = open_nvme0();
    assert_eq!(c.device().address(), addr);
}

#[test]
#[ignore = "guest: needs the no-IOMMU boot, run by scripts/test.sh"]
fn noiommu_perf_verify_runs_clean_with_the_opt_in_only() {
    if !no_iommu_boot() {
        return;
    }
    let tb = testbed::require();
    let opts = [
        "-q",
        "8",
        "-o",
        "4096",
        "--offset-mib",
        "40",
        "--span-mib",
        "4",
    ];
    let args = perf_rw_verify_args(&tb.nvme[0], "1", &opts);
    let (rc, out, err) = ubdirect(&args);
    assert_eq!(rc, 1, "perf without --allow-noiommu: stdout {out}");
    assert!(err.contains("ubdirect perf --allow-noiommu"), "{err}");
    assert!(
        err.contains("UBD_ALLOW_NOIOMMU=1 scripts/setup.sh config"),
        "{err}"
    );
    let mut with = args.clone();
    with.push("--allow-noiommu");
    perf_verified_clean(ubdirect(&with));
}
