//! io_uring reads into UB pool blocks registered once as fixed buffers (READ_FIXED) against the
//! same reads with plain READ, where the kernel pins and unpins the pages of every request:
//! the source document's "register once, never per transfer", measured. O_DIRECT on a disk
//! file (falls back to buffered where refused), 32 requests in flight per batch.

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use ubdirect_core::seams::BlockQueue;
use ubdirect_core::{DmaDomain, PoolConfig, UbPool, UbRegistry};
use ubdirect_uring::{UringOptions, UringQueue};

const QD: usize = 32;
const FILE_LEN: usize = 64 << 20;

fn file() -> std::path::PathBuf {
    let p = std::path::PathBuf::from(format!("/var/tmp/ubdirect-bench-{}", std::process::id()));
    let mut f = std::fs::File::create(&p).unwrap();
    let chunk = vec![0x5au8; 1 << 20];
    for _ in 0..FILE_LEN >> 20 {
        f.write_all(&chunk).unwrap();
    }
    f.sync_all().unwrap();
    p
}

fn batch(q: &mut UringQueue, pool: &Arc<UbPool>, bs: usize, round: &mut u64) {
    let blocks = (FILE_LEN / bs) as u64;
    for _ in 0..QD {
        let off = (*round % blocks) * bs as u64;
        *round += 1;
        q.submit_read(pool.get().unwrap(), off, bs, off)
            .map_err(|(_, e)| e)
            .unwrap();
    }
    let mut done = 0;
    while done < QD {
        done += q
            .wait(Duration::from_secs(10), &mut |c| assert!(c.result.is_ok()))
            .unwrap();
    }
}

fn bench(c: &mut Criterion) {
    let path = file();
    let mut g = c.benchmark_group("uring_read_qd32");
    g.warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(20);
    for bs in [4usize << 10, 64 << 10, 1 << 20] {
        let reg = UbRegistry::new(DmaDomain::host_only());
        let region = reg.register_anonymous(bs * QD, None).unwrap();
        let pool = UbPool::new(
            &reg,
            region,
            PoolConfig {
                block_size: bs,
                block_count: QD,
            },
        )
        .unwrap();
        g.throughput(Throughput::Bytes((bs * QD) as u64));
        for fixed in [true, false] {
            let regions = if fixed {
                vec![pool.region().clone()]
            } else {
                vec![]
            };
            let opts = UringOptions {
                depth: QD,
                ..Default::default()
            };
            let mut q = UringQueue::open(&path, &regions, &opts).unwrap();
            let name = format!(
                "{}{}",
                if fixed { "fixed" } else { "plain" },
                if q.is_direct() {
                    "-odirect"
                } else {
                    "-buffered"
                }
            );
            let mut round = 0u64;
            g.bench_with_input(BenchmarkId::new(name, bs), &bs, |b, &bs| {
                b.iter(|| batch(&mut q, &pool, bs, &mut round))
            });
        }
    }
    g.finish();
    let _ = std::fs::remove_file(&path);
}

criterion_group!(benches, bench);
criterion_main!(benches);
