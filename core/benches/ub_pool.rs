//! The source document's claim: taking a DMA buffer from a pre-registered pool is far cheaper
//! than registering (allocating, pinning, mapping) a buffer per transfer.
//!
//! On the host there is no VFIO, so "register per transfer" is: allocate hugepage memory
//! (memfd-hugetlb, MAP_POPULATE) when enough 2 MiB pages are free, else anonymous memory with
//! MAP_POPULATE; mlock it (the pinning VFIO would do); record it in a host-only registry (the
//! IOVA bookkeeping); then unregister and unmap. The guest variant adds the real
//! VFIO_IOMMU_MAP_DMA/UNMAP_DMA (core/tests/guest_bench_ub.rs).
//!
//! Run: `cargo bench -p ubdirect-core --bench ub_pool`

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use ubdirect_core::{DmaDomain, PageSize, PoolConfig, UbPool, UbRegistry};

const SIZES: [usize; 5] = [4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20];

fn free_2m() -> u64 {
    ubdirect_hugepages::pools()
        .ok()
        .and_then(|ps| {
            ps.into_iter()
                .find(|p| p.node.is_none() && p.size == PageSize::Size2M)
        })
        .map(|p| p.free)
        .unwrap_or(0)
}

fn pool(reg: &Arc<UbRegistry>, size: usize) -> Arc<UbPool> {
    let cfg = PoolConfig {
        block_size: size,
        block_count: 8,
    };
    let r = reg.register_anonymous(size * 8, None).unwrap();
    UbPool::new(reg, r, cfg).unwrap()
}

/// One per-transfer registration: allocate + populate, pin (mlock), map (bookkeeping), then
/// unmap and free. Returns a byte of the buffer so nothing is optimised away.
fn register_per_transfer(reg: &Arc<UbRegistry>, size: usize, huge: bool) -> u8 {
    let r = if huge {
        reg.register_hugepages(size, PageSize::Size2M, None)
            .unwrap()
    } else {
        let r = reg.register_anonymous(size, None).unwrap();
        // SAFETY: the region's memory is ours; MADV_POPULATE_WRITE faults it in.
        unsafe { libc::madvise(r.vaddr.cast(), r.len, 23) };
        r
    };
    // SAFETY: mlock/munlock of the region's own mapping.
    unsafe {
        libc::mlock(r.vaddr.cast(), r.len);
    }
    // SAFETY: the first byte of the populated mapping.
    let b = unsafe { r.vaddr.read_volatile() };
    // SAFETY: as above.
    unsafe {
        libc::munlock(r.vaddr.cast(), r.len);
    }
    reg.unregister(r.id).unwrap();
    b
}

fn bench(c: &mut Criterion) {
    let reg = UbRegistry::new(DmaDomain::host_only());
    let huge = free_2m() >= (64 << 20) / (2 << 20);
    eprintln!(
        "per-transfer registration uses {} memory",
        if huge {
            "2 MiB hugepage"
        } else {
            "4 KiB anonymous (no free hugepages)"
        }
    );
    pool_against_registration(c, &reg, huge);
    thread_cache(c, &reg);
    best_of_rounds(&reg);
    ratio_table(&reg, huge);
}

/// A criterion group with the settings every group here uses.
fn group<'a>(
    c: &'a mut Criterion,
    name: &str,
) -> criterion::BenchmarkGroup<'a, criterion::measurement::WallTime> {
    let mut g = c.benchmark_group(name);
    g.sample_size(20)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(2));
    g
}

/// Pool get+put against a registration per transfer, per buffer size.
fn pool_against_registration(c: &mut Criterion, reg: &Arc<UbRegistry>, huge: bool) {
    let mut g = group(c, "ub_pool");
    for &size in &SIZES {
        let p = pool(reg, size);
        g.bench_with_input(BenchmarkId::new("pool_get_put", size), &size, |b, _| {
            b.iter(|| {
                let buf = p.get().unwrap();
                black_box(buf.iova());
            })
        });
        g.bench_with_input(
            BenchmarkId::new("register_per_transfer", size),
            &size,
            |b, &s| b.iter(|| black_box(register_per_transfer(reg, s, huge))),
        );
    }
    g.finish();
}

/// Whether a per-thread magazine pays off: one thread, and two threads on one pool.
fn thread_cache(c: &mut Criterion, reg: &Arc<UbRegistry>) {
    let mut g = group(c, "ub_pool_cache");
    for cache in [0usize, 8] {
        let r = reg.register_anonymous(64 * 4096, None).unwrap();
        let p = UbPool::new(
            reg,
            r,
            PoolConfig {
                block_size: 4096,
                block_count: 64,
            },
        )
        .unwrap();
        p.set_thread_cache(cache).unwrap();
        g.bench_with_input(
            BenchmarkId::new("get_put_1thread", cache),
            &cache,
            |b, _| b.iter(|| black_box(p.get().unwrap().iova())),
        );
        g.bench_with_input(
            BenchmarkId::new("get_put_2threads", cache),
            &cache,
            |b, _| {
                b.iter_custom(|iters| {
                    let start = Instant::now();
                    std::thread::scope(|sc| {
                        for _ in 0..2 {
                            sc.spawn(|| {
                                for _ in 0..iters {
                                    black_box(p.get().unwrap().iova());
                                }
                            });
                        }
                    });
                    // Time per get+put of one thread while the other hammers the same pool.
                    start.elapsed()
                })
            },
        );
    }
    g.finish();
}

/// The ratio, from a plain timing loop over the same two operations.
fn ratio_table(reg: &Arc<UbRegistry>, huge: bool) {
    println!("\nsize        pool get+put   register per transfer   ratio");
    for &size in &SIZES {
        let p = pool(reg, size);
        let n = 1_000_000;
        let t = Instant::now();
        for _ in 0..n {
            black_box(p.get().unwrap().iova());
        }
        let pool_ns = t.elapsed().as_nanos() as f64 / n as f64;
        let m = if size >= 16 << 20 { 20 } else { 500 };
        let t = Instant::now();
        for _ in 0..m {
            black_box(register_per_transfer(reg, size, huge));
        }
        let reg_ns = t.elapsed().as_nanos() as f64 / m as f64;
        println!(
            "{:>8} KiB {:>10.1} ns {:>20.1} us {:>10.0}x",
            size >> 10,
            pool_ns,
            reg_ns / 1000.0,
            reg_ns / pool_ns
        );
    }
}

/// Get+put cost per operation on a shared, busy host: each thread runs 200 rounds of 20,000
/// get+put and the best round counts (a round that a preemption hit is slower, never faster),
/// for 1 and 2 threads on one pool, thread cache off (0) and on (8). Threads start once.
fn best_of_rounds(reg: &Arc<UbRegistry>) {
    const ROUNDS: usize = 200;
    const OPS: u32 = 20_000;
    println!("\nbest-of-{ROUNDS}-rounds get+put (ns per op, per thread)");
    println!("cache  threads  best   median");
    for cache in [0usize, 8] {
        for threads in [1usize, 2] {
            let p = UbPool::with_anonymous(
                reg,
                PoolConfig {
                    block_size: 4096,
                    block_count: 64,
                },
                None,
            )
            .unwrap();
            p.set_thread_cache(cache).unwrap();
            let go = std::sync::Barrier::new(threads);
            let per_thread: Vec<Vec<f64>> = std::thread::scope(|sc| {
                let hs: Vec<_> = (0..threads)
                    .map(|_| {
                        let (p, go) = (&p, &go);
                        sc.spawn(move || {
                            go.wait();
                            let mut v = Vec::with_capacity(ROUNDS);
                            for _ in 0..ROUNDS {
                                let t = Instant::now();
                                for _ in 0..OPS {
                                    black_box(p.get().unwrap().iova());
                                }
                                v.push(t.elapsed().as_nanos() as f64 / f64::from(OPS));
                            }
                            p.flush_thread_cache();
                            v
                        })
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().unwrap()).collect()
            });
            let mut all: Vec<f64> = per_thread.into_iter().flatten().collect();
            all.sort_by(f64::total_cmp);
            println!(
                "{cache:>5}  {threads:>7}  {:>5.1}  {:>6.1}",
                all[0],
                all[all.len() / 2]
            );
        }
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
