//! Registry lookups and IOVA allocation as the number of regions grows (they should grow like
//! log n, not n). Run: `cargo bench -p ubdirect-core --bench ub_lookup`

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use ubdirect_core::iova::IovaAllocator;
use ubdirect_core::{DmaDomain, UbRegistry};

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("ub_lookup");
    g.sample_size(20)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1));
    for n in [16usize, 256, 4096] {
        let reg = UbRegistry::new(DmaDomain::host_only());
        let regions: Vec<_> = (0..n)
            .map(|_| reg.register_anonymous(4096, None).unwrap())
            .collect();
        let mid = &regions[n / 2];
        g.bench_with_input(BenchmarkId::new("region_of_iova", n), &n, |b, _| {
            b.iter(|| black_box(reg.region_of_iova(black_box(mid.iova + 100)).unwrap().1))
        });
        g.bench_with_input(BenchmarkId::new("iova_of", n), &n, |b, _| {
            b.iter(|| black_box(reg.iova_of(black_box(mid.vaddr.wrapping_add(100)))))
        });
        // Allocate and free one range among n live ones (fragmented: every other one freed).
        let mut a = IovaAllocator::new(std::slice::from_ref(&(1u64 << 20..1u64 << 40)));
        let live: Vec<u64> = (0..2 * n).map(|_| a.alloc(4096, 4096).unwrap()).collect();
        for s in live.iter().step_by(2) {
            a.free(*s, 4096).unwrap();
        }
        g.bench_with_input(BenchmarkId::new("iova_alloc_free_4k", n), &n, |b, _| {
            b.iter(|| {
                let s = a.alloc(4096, 4096).unwrap();
                a.free(black_box(s), 4096).unwrap();
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
