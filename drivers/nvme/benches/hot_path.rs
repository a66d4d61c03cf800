//! Host benchmarks of the pure pieces of the NVMe I/O path: PRP construction (4 KiB, 128 KiB
//! unaligned, 2 MiB unaligned: a full list page), completion status decoding, latency recording.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use ubdirect_core::util::LatencyHistogram;
use ubdirect_nvme::prp;
use ubdirect_nvme::NvmeStatus;

fn prp_build(c: &mut Criterion) {
    let mut list = vec![0u64; 2 * 512];
    let mut g = c.benchmark_group("prp_build");
    for (name, iova, len) in [
        ("4KiB", 0x1000_0000u64, 4096usize),
        ("128KiB_offset_512", 0x1000_0200, 128 << 10),
        ("2MiB_offset_4_full_list", 0x1000_0004, 2 << 20),
    ] {
        g.bench_function(name, |b| {
            b.iter(|| {
                prp::build(
                    4096,
                    [(black_box(iova), black_box(len))],
                    &mut list,
                    0x7000_0000,
                )
                .unwrap()
            })
        });
    }
    g.finish();
}

fn status_decode(c: &mut Criterion) {
    c.bench_function("status_decode", |b| {
        b.iter(|| NvmeStatus::from_cqe_status(black_box(0x8101)).is_success())
    });
}

fn histogram_record(c: &mut Criterion) {
    let mut h = LatencyHistogram::new();
    let mut v = 12345u64;
    c.bench_function("histogram_record", |b| {
        b.iter(|| {
            v = v.wrapping_mul(6364136223846793005).wrapping_add(1) >> 40;
            h.record(black_box(v));
        })
    });
}

criterion_group!(benches, prp_build, status_decode, histogram_record);
criterion_main!(benches);
