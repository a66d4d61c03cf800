//! The cost of `Mmio`'s checks (bounds, alignment, the device-model branch) against a raw
//! volatile access to the same memory, side by side in one run: the doorbell write and the
//! register read of every I/O.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use ubdirect_core::Mmio;

fn mmio(c: &mut Criterion) {
    let m = Mmio::anonymous(0x4000).unwrap();
    let p = m.as_ptr();
    let len = m.len();
    let mut g = c.benchmark_group("mmio");
    g.bench_function("write32_mmio", |b| {
        let mut v = 0u32;
        b.iter(|| {
            v = v.wrapping_add(1);
            m.write32(black_box(0x1008), v)
        })
    });
    g.bench_function("write32_bounds_only", |b| {
        let mut v = 0u32;
        b.iter(|| {
            v = v.wrapping_add(1);
            let off = black_box(0x1008);
            assert!(off + 4 <= len);
            // SAFETY: checked just above; aligned.
            unsafe { std::ptr::write_volatile(p.add(off).cast::<u32>(), v) }
        })
    });
    g.bench_function("write32_raw_volatile", |b| {
        let mut v = 0u32;
        b.iter(|| {
            v = v.wrapping_add(1);
            // SAFETY: 0x1008 + 4 is inside the 0x4000-byte mapping and 4-byte aligned.
            unsafe { std::ptr::write_volatile(p.add(black_box(0x1008)).cast::<u32>(), v) }
        })
    });
    g.bench_function("read32_mmio", |b| b.iter(|| m.read32(black_box(0x1c))));
    // What the accessor did before the device-model seam and the alignment check: a bounds
    // assert, then the access.
    g.bench_function("read32_bounds_only", |b| {
        b.iter(|| {
            let off = black_box(0x1c);
            assert!(off + 4 <= len);
            // SAFETY: checked just above; aligned.
            unsafe { std::ptr::read_volatile(p.add(off).cast::<u32>()) }
        })
    });
    g.bench_function("read32_raw_volatile", |b| {
        // SAFETY: as above.
        b.iter(|| unsafe { std::ptr::read_volatile(p.add(black_box(0x1c)).cast::<u32>()) })
    });
    g.finish();
}

criterion_group!(benches, mmio);
criterion_main!(benches);
