//! CUDA sink tests. Without a driver (this build host) the entry points must fail with a clear
//! typed error instead of cudarc's panic. With a GPU (`--ignored`, on the H200) the sink must
//! deliver data intact: the GPU-side checksum equals the CPU checksum of the bytes sent.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ubdirect_core::seams::{Sink, SinkErrorKind};
use ubdirect_core::{DmaDomain, PoolConfig, UbPool, UbRegistry};
use ubdirect_cuda::{
    checksum_at, driver_available, CudaError, CudaGpu, CudaSink, CudaSinkConfig, GpuDmaBuf,
};

const BS: usize = 1 << 20;

fn pool(blocks: usize) -> Arc<UbPool> {
    let cfg = PoolConfig {
        block_size: BS,
        block_count: blocks,
    };
    UbPool::with_anonymous(&UbRegistry::new(DmaDomain::host_only()), cfg, None).unwrap()
}

fn cfg(verify: bool) -> CudaSinkConfig {
    CudaSinkConfig {
        ordinal: 0,
        streams: 4,
        depth: 8,
        block_size: BS,
        verify,
    }
}

#[test]
fn no_driver_is_a_typed_error_not_a_panic() {
    if driver_available().is_ok() {
        eprintln!("libcuda present: the no-driver path cannot be exercised here");
        assert!(CudaGpu::count() > 0 || CudaGpu::open(0).is_err());
        return;
    }
    let e = CudaGpu::open(0).unwrap_err();
    assert!(matches!(e, CudaError::NoDriver), "{e}");
    assert!(e.to_string().contains("libcuda"), "{e}");
    let e = CudaSink::new(&cfg(false), &[]).unwrap_err();
    assert!(matches!(e, CudaError::NoDriver));
    assert_eq!(CudaGpu::count(), 0);
}

#[test]
fn zero_sizes_are_refused_before_touching_the_driver() {
    let c = CudaSinkConfig {
        depth: 0,
        ..cfg(false)
    };
    let e = CudaSink::new(&c, &[]).unwrap_err();
    assert!(matches!(e, CudaError::Invalid(_)), "{e}");
}

fn drain(sink: &mut CudaSink, want: usize) -> Vec<(ubdirect_core::UbBuf, u64)> {
    let mut out = Vec::new();
    let t = Instant::now();
    while out.len() < want {
        sink.poll(usize::MAX, &mut |b, tag, r| {
            r.expect("copy ok");
            out.push((b, tag));
        })
        .unwrap();
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "copies did not complete"
        );
    }
    out
}

#[test]
#[ignore = "gpu: needs an NVIDIA GPU and driver (run with --ignored on a GPU machine)"]
fn gpu_checksum_matches_cpu_checksum() {
    let pool = pool(8);
    let mut sink = CudaSink::new(&cfg(true), &[pool.region().clone()]).expect("GPU sink");
    let mut expected = 0u64;
    let mut sent = 0;
    for round in 0..4u64 {
        let mut bufs = Vec::new();
        for i in 0..8u64 {
            let mut b = pool.get().unwrap();
            let seq = round * 8 + i;
            for (k, x) in b.as_mut_slice().iter_mut().enumerate() {
                *x = (k as u64 ^ seq.wrapping_mul(0x9E37)) as u8;
            }
            // an odd length on the last block exercises the tail word
            let len = if i == 7 { BS - 3 } else { BS };
            expected = expected.wrapping_add(checksum_at(&b.as_slice()[..len], seq * BS as u64));
            bufs.push((b, len, seq * BS as u64));
        }
        for (b, len, tag) in bufs {
            sink.submit(b, len, tag).map_err(|(_, e)| e).unwrap();
            sent += 1;
        }
        let back = drain(&mut sink, 8);
        assert_eq!(back.len(), 8);
    }
    assert_eq!(sent, 32);
    assert_eq!(sink.in_flight(), 0);
    assert_eq!(
        sink.checksum().unwrap(),
        expected,
        "GPU saw different bytes than the CPU sent"
    );
    // a changed byte changes the GPU's answer
    sink.reset_checksum().unwrap();
    let mut b = pool.get().unwrap();
    b.as_mut_slice().fill(0);
    b.as_mut_slice()[12345] = 1;
    let want = checksum_at(&b.as_slice()[..BS], 0);
    sink.submit(b, BS, 0).map_err(|(_, e)| e).unwrap();
    drain(&mut sink, 1);
    assert_eq!(sink.checksum().unwrap(), want);
    assert_ne!(want, checksum_at(&vec![0u8; BS], 0));
}

#[test]
#[ignore = "gpu: needs an NVIDIA GPU and driver (run with --ignored on a GPU machine)"]
fn gpu_sink_refuses_bad_requests_and_full() {
    let pool = pool(8);
    let c = CudaSinkConfig {
        depth: 2,
        ..cfg(false)
    };
    let mut sink = CudaSink::new(&c, &[pool.region().clone()]).expect("GPU sink");
    let (b, e) = sink.submit(pool.get().unwrap(), BS + 1, 0).unwrap_err();
    assert_eq!(e.kind, SinkErrorKind::InvalidRequest);
    sink.submit(b, BS, 0).map_err(|(_, e)| e).unwrap();
    sink.submit(pool.get().unwrap(), BS, 0)
        .map_err(|(_, e)| e)
        .unwrap();
    let (_b, e) = sink.submit(pool.get().unwrap(), BS, 0).unwrap_err();
    assert_eq!(e.kind, SinkErrorKind::Full);
    drain(&mut sink, 2);
}

#[test]
#[ignore = "gpu: needs an NVIDIA GPU and driver (run with --ignored on a GPU machine)"]
fn dmabuf_export_and_the_type1_limitation() {
    let gpu = CudaGpu::open(0).expect("GPU");
    eprintln!(
        "{} at {:?}, numa {:?}",
        gpu.name(),
        gpu.pci_address(),
        gpu.numa_node()
    );
    match GpuDmaBuf::export(&gpu, 4 << 20) {
        Ok(d) => {
            assert!(d.len() >= 4 << 20);
            let msg = d.vfio_type1_limitation().to_string();
            assert!(msg.contains("iommufd"), "{msg}");
            eprintln!("dma-buf export ok: {} bytes", d.len());
        }
        Err(e) => {
            eprintln!("dma-buf export refused: {e}");
            assert!(!gpu.dma_buf_supported() || matches!(e, CudaError::Driver { .. }));
        }
    }
}
