//! Guest measurement (not a timed test: it asserts nothing about speed): the cost of taking a
//! buffer from the UB pool against registering one per transfer with the real VFIO type1
//! IOMMU (VFIO_IOMMU_MAP_DMA / UNMAP_DMA through the guest's vIOMMU), for 4 KiB to 64 MiB.
//! Prints the table of docs/benchmarks/buffers.md, "The pool in a guest with VFIO type1".
//! Run alone with
//! `scripts/vm/suite.sh --skip shell --filter guest_bench_ub`.

use std::hint::black_box;
use std::time::{Duration, Instant};

use ubdirect_core::{DmaDomain, PageSize, PciDevice, PoolConfig, UbPool, UbRegistry};
use ubdirect_testbed as testbed;

const SIZES: [usize; 5] = [4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20];
const BUDGET: Duration = Duration::from_millis(300);

/// Mean time of `f` over at least 3 runs and about BUDGET of wall time.
fn mean(mut f: impl FnMut()) -> Duration {
    let start = Instant::now();
    let mut n = 0u32;
    while n < 3 || start.elapsed() < BUDGET {
        f();
        n += 1;
    }
    start.elapsed() / n
}

fn fmt(d: Duration) -> String {
    let ns = d.as_nanos();
    if ns < 10_000 {
        format!("{ns} ns")
    } else if ns < 10_000_000 {
        format!("{:.1} us", ns as f64 / 1e3)
    } else {
        format!("{:.1} ms", ns as f64 / 1e6)
    }
}

#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn ub_pool_vs_per_transfer_registration() {
    let tb = testbed::require();
    let d = DmaDomain::new().unwrap();
    let _dev = PciDevice::open(&d, tb.nvme[0].parse().unwrap()).unwrap();
    let reg = UbRegistry::new(d.clone());
    println!("UBD-BENCH ub_pool guest (TCG, vIOMMU type1): mean per operation");
    println!(
        "UBD-BENCH | size | pool get+put | VFIO map+unmap only | per transfer, hugepages | per transfer, 4 KiB pages | ratio (hugepages / pool) |"
    );
    for &size in &SIZES {
        let pool = UbPool::new(
            &reg,
            reg.register_hugepages(size.max(2 << 20) * 2, PageSize::Size2M, None)
                .unwrap(),
            PoolConfig {
                block_size: size,
                block_count: 2,
            },
        )
        .unwrap();
        let n = 20_000u32;
        let t = Instant::now();
        for _ in 0..n {
            black_box(pool.get().unwrap().iova());
        }
        let pool_t = t.elapsed() / n;

        // The IOMMU alone: map and unmap memory that is already allocated.
        let mem = ubdirect_hugepages::HugeMem::alloc(size, PageSize::Size2M, None).unwrap();
        let len = size.div_ceil(4096) * 4096;
        let map_t = mean(|| {
            // SAFETY: mem outlives the mapping, which is removed at once.
            let mut m = unsafe { d.map(mem.as_ptr(), len, 4096) }.unwrap();
            m.unmap().unwrap();
        });
        drop(mem);

        // Per transfer: allocate hugepages, register (VFIO pins and maps), unregister, free.
        let huge_t = mean(|| {
            let r = reg
                .register_hugepages(size, PageSize::Size2M, None)
                .unwrap();
            reg.unregister(r.id).unwrap();
        });
        // Per transfer with ordinary pages: VFIO faults in and pins every 4 KiB page.
        let anon_t = mean(|| {
            let r = reg.register_anonymous(size, None).unwrap();
            reg.unregister(r.id).unwrap();
        });
        println!(
            "UBD-BENCH | {} KiB | {} | {} | {} | {} | {:.0}x |",
            size >> 10,
            fmt(pool_t),
            fmt(map_t),
            fmt(huge_t),
            fmt(anon_t),
            huge_t.as_nanos() as f64 / pool_t.as_nanos().max(1) as f64
        );
        assert_eq!(pool.stats().in_use, 0);
        let id = pool.region().id;
        drop(pool);
        reg.unregister(id).unwrap();
    }
    assert_eq!(d.mapping_count(), 0);
}
