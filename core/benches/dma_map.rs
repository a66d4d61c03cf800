//! Map + unmap cost of one region in a real DMA domain, per back end: 4 KiB
//! anonymous, 2 MiB hugepage, and (iommufd only) the ivshmem BAR by dma-buf. Runs in the
//! test-bed guest only (it opens the test bed's nvme0 so the IOMMU is live); on the host it
//! says so and measures nothing. The back end is the automatic one, or `UBD_IOMMU_BACKEND`.
//! Run: `cargo bench -p ubdirect-core --bench dma_map --no-run`, then the binary in the
//! guest with `--bench` (scripts/vm/run.sh --test-bin). Plots are off (see `benches` below).

use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use ubdirect_core::vfio::BackendKind;
use ubdirect_core::{DmaDomain, Mmio, PageSize, PciDevice};
use ubdirect_hugepages::HugeMem;
use ubdirect_testbed as testbed;

fn bench(c: &mut Criterion) {
    let Some(tb) = testbed::devices() else {
        eprintln!("dma_map: not in the test-bed guest (UBD_GUEST unset): nothing measured");
        return;
    };
    let d = DmaDomain::new().expect("DMA domain");
    let nvme = PciDevice::open(&d, tb.nvme[0].parse().unwrap()).expect("open nvme0");
    let kind = d.backend_kind().expect("a device is open");
    println!("dma_map: back end {kind}");
    let mut g = c.benchmark_group(format!("dma_map/{kind}"));
    g.sample_size(20)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(2));
    let anon = Mmio::anonymous(4096).unwrap();
    g.bench_function("map_unmap_4k", |b| {
        b.iter(|| {
            // SAFETY: `anon` outlives the mapping, which is dropped (unmapped) right away.
            let m = unsafe { d.map(anon.as_ptr(), 4096, 4096) }.unwrap();
            drop(m);
        })
    });
    if let Ok(huge) = HugeMem::alloc(2 << 20, PageSize::Size2M, None) {
        g.bench_function("map_unmap_2m_hugepage", |b| {
            b.iter(|| {
                // SAFETY: `huge` outlives the mapping, which is dropped right away.
                let m = unsafe { d.map(huge.as_ptr(), 2 << 20, 2 << 20) }.unwrap();
                drop(m);
            })
        });
    }
    if kind == BackendKind::Iommufd {
        if let Some(iv) = &tb.ivshmem {
            let dev = PciDevice::open(&d, iv.parse().unwrap()).expect("open ivshmem");
            let fd = dev
                .access()
                .expect("no driver holds the device")
                .export_bar_dmabuf(2)
                .expect("export BAR2");
            g.bench_function("map_file_unmap_64m_bar_dmabuf", |b| {
                b.iter(|| {
                    let m = d
                        .map_file(std::os::fd::AsFd::as_fd(&fd), 0, 64 << 20, 2 << 20, true)
                        .unwrap();
                    drop(m);
                })
            });
        }
    }
    g.finish();
    drop(nvme);
}

criterion_group! {
    name = benches;
    // No plots: criterion's plotters report after each benchmark did not return within 280 s
    // in the TCG guest (the iommufd 2 MiB case gave no figure); without it the whole
    // run (type1 and iommufd, 5 benchmarks) takes about 3 minutes there.
    config = Criterion::default().without_plots();
    targets = bench
}
criterion_main!(benches);
