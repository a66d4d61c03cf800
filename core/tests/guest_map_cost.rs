//! Guest test and measurement: map + unmap of one region in a real DMA domain on the
//! back end this boot gives (`UBD_IOMMU_BACKEND` picks type1 or iommufd on the ubd kernel;
//! the no-IOMMU boot gives noiommu): 4 KiB anonymous memory (not on noiommu) and one 2 MiB
//! hugepage. Every map and unmap runs under a deadline, so a stall is a failure that names the
//! step and the iteration instead of a run that never ends. Prints `UBD-BENCH` lines (mean,
//! min, max per map+unmap) for BENCHMARKS.md, "DMA back ends" (method: docs/benchmarks/dma.md,
//! "Map and unmap cost"); it asserts nothing about speed.
//! Run: `scripts/vm/suite.sh --kernel ubd --skip shell --filter guest_map_cost`.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use ubdirect_core::vfio::{BackendKind, DomainOptions};
use ubdirect_core::{DmaDomain, Mmio, PageSize, PciDevice};
use ubdirect_hugepages::HugeMem;
use ubdirect_testbed as testbed;

/// One map or unmap taking longer than this is a stall (type1 measured 125 us for 2 MiB).
const STEP_DEADLINE: Duration = Duration::from_secs(30);
/// Rounds per size; `UBD_MAP_ROUNDS` overrides (the 4 KiB case runs 10x as many: criterion's
/// run of it, tens of thousands of rounds, came before the 2 MiB case that never finished).
fn rounds_wanted() -> u32 {
    std::env::var("UBD_MAP_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200)
}

/// Mean, min and max of `times`.
fn summary(times: &[Duration]) -> (Duration, Duration, Duration) {
    let sum: Duration = times.iter().sum();
    (
        sum / times.len() as u32,
        *times.iter().min().unwrap(),
        *times.iter().max().unwrap(),
    )
}

/// Map + unmap `[ptr, +len)` `n` times on a worker thread; the step in progress is in
/// `step` (2*i: map i, 2*i+1: unmap i). Fails naming the step if one takes STEP_DEADLINE.
fn rounds(d: &Arc<DmaDomain>, ptr: usize, len: usize, n: u32, what: &str) -> Vec<Duration> {
    let step = Arc::new(AtomicU32::new(0));
    let (tx, rx) = mpsc::channel();
    let (d2, s2) = (d.clone(), step.clone());
    std::thread::spawn(move || {
        let mut times = Vec::new();
        for i in 0..n {
            let t = Instant::now();
            s2.store(2 * i, Ordering::SeqCst);
            // SAFETY: the memory outlives the mapping, which is unmapped right away.
            let mut m = unsafe { d2.map(ptr as *mut u8, len, len.min(2 << 20)) }.unwrap();
            s2.store(2 * i + 1, Ordering::SeqCst);
            m.unmap().unwrap();
            let dt = t.elapsed();
            times.push(dt);
            let _ = tx.send(Some(dt));
        }
        let _ = tx.send(None);
        times
    });
    let mut times = Vec::new();
    loop {
        match rx.recv_timeout(STEP_DEADLINE) {
            Ok(Some(dt)) => times.push(dt),
            Ok(None) => return times,
            Err(_) => {
                let s = step.load(Ordering::SeqCst);
                panic!(
                    "{what}: {} of round {} did not return within {STEP_DEADLINE:?} ({} rounds done)",
                    if s % 2 == 0 { "map" } else { "unmap" },
                    s / 2,
                    times.len()
                );
            }
        }
    }
}

#[test]
#[ignore = "guest: needs vfio devices and hugepages, run by scripts/test.sh"]
fn map_and_unmap_of_a_2m_hugepage_and_4k_return_within_a_deadline() {
    let tb = testbed::require();
    let noiommu = std::env::var("UBD_VM_NO_IOMMU").as_deref() == Ok("1");
    let d = DmaDomain::with_options(DomainOptions {
        backend: None,
        allow_noiommu: noiommu,
    })
    .unwrap();
    let _dev = PciDevice::open(&d, tb.nvme[0].parse().unwrap()).expect("open nvme0");
    let kind = d.backend_kind().expect("a device is open");
    if noiommu {
        assert_eq!(kind, BackendKind::NoIommu);
    }
    let n = rounds_wanted();
    let mut lines = Vec::new();
    if kind != BackendKind::NoIommu {
        let anon = Mmio::anonymous(4096).unwrap();
        let t = rounds(&d, anon.as_ptr() as usize, 4096, 10 * n, "4 KiB anonymous");
        lines.push(("4 KiB anonymous", t.len(), summary(&t)));
    }
    let huge = HugeMem::alloc(2 << 20, PageSize::Size2M, None).expect("one free 2 MiB hugepage");
    // SAFETY: the page is ours; touching it populates it (no-IOMMU needs its frame number).
    unsafe { huge.as_ptr().write_volatile(1) };
    let t = rounds(&d, huge.as_ptr() as usize, 2 << 20, n, "2 MiB hugepage");
    lines.push(("2 MiB hugepage", t.len(), summary(&t)));
    assert_eq!(d.mapping_count(), 0, "every mapping removed");
    for (what, rounds, (mean, min, max)) in lines {
        println!(
            "UBD-BENCH map+unmap {kind} {what}: {} rounds, mean {:.1} us, min {:.1} us, max {:.1} us",
            rounds,
            mean.as_secs_f64() * 1e6,
            min.as_secs_f64() * 1e6,
            max.as_secs_f64() * 1e6
        );
    }
}
