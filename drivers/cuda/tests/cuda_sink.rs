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
fn pageable_copies_beside_async_copies_keep_to_free_slots_and_deliver_intact() {
    let pool = pool(8);
    let mut sink = CudaSink::new(&cfg(true), &[pool.region().clone()]).expect("GPU sink");
    let mut expected = 0u64;
    // Six asynchronous copies hold six of the eight slots...
    for i in 0..6u64 {
        let mut b = pool.get().unwrap();
        b.as_mut_slice().fill(0x10 + i as u8);
        expected = expected.wrapping_add(checksum_at(b.as_slice(), i * BS as u64));
        sink.submit(b, BS, i * BS as u64)
            .map_err(|(_, e)| e)
            .unwrap();
    }
    // ...while twelve pageable copies (and their checksum kernels) take turns in the other two.
    let mut page = vec![0u8; BS];
    for i in 6..18u64 {
        page.fill(0x80 + i as u8);
        expected = expected.wrapping_add(checksum_at(&page, i * BS as u64));
        sink.copy_pageable(&page, i * BS as u64).unwrap();
    }
    drain(&mut sink, 6);
    assert_eq!(
        sink.checksum().unwrap(),
        expected,
        "a pageable copy overwrote a slot an async copy or kernel was using"
    );
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

/// Copy every 1 MiB block of `win` to the GPU with `submit_host` and wait for all of them.
fn copy_window(sink: &mut CudaSink, win: &ubdirect_cuda::FileWindow) {
    let blocks = win.len() / BS;
    let (mut sent, mut done) = (0usize, 0usize);
    let t = Instant::now();
    while done < blocks {
        while sent < blocks {
            // SAFETY: the window stays registered and mapped (we hold it) until every copy is
            // reaped below.
            let r =
                unsafe { sink.submit_host(win.as_ptr().add(sent * BS), BS, (sent * BS) as u64) };
            match r {
                Ok(()) => sent += 1,
                Err(e) if e.kind == SinkErrorKind::Full => break,
                Err(e) => panic!("{e}"),
            }
        }
        done += sink
            .poll_host(usize::MAX, &mut |_tag, r| r.expect("copy ok"))
            .unwrap();
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "copies did not complete"
        );
    }
}

#[test]
#[ignore = "gpu: needs an NVIDIA GPU and driver (run with --ignored on a GPU machine)"]
fn gpu_reads_a_registered_file_window_in_place_even_after_truncation() {
    use std::io::Write;
    use ubdirect_cuda::{CudaHostPinner, FileWindowRegistry, WindowError};
    let dir = if std::path::Path::new("/dev/shm").is_dir() {
        "/dev/shm"
    } else {
        "/tmp"
    };
    let path = std::path::PathBuf::from(format!("{dir}/ubd-gpu-window-{}", std::process::id()));
    let data: Vec<u8> = (0..8 * BS)
        .map(|i| ((i as u64).wrapping_mul(0x9E37_79B9) >> 13) as u8)
        .collect();
    std::fs::File::create(&path)
        .unwrap()
        .write_all(&data)
        .unwrap();
    let file = std::fs::File::open(&path).unwrap();
    let gpu = CudaGpu::open(0).expect("GPU");
    let reg = FileWindowRegistry::new(Arc::new(CudaHostPinner::new(&gpu).unwrap()), 1 << 30);
    let win = reg.acquire(&file, 0, (8 * BS) as u64).unwrap();
    let mut sink = CudaSink::new(&cfg(true), &[]).expect("GPU sink");
    copy_window(&mut sink, &win);
    let expected = checksum_at(&data, 0);
    assert_eq!(
        sink.checksum().unwrap(),
        expected,
        "the GPU read the file's bytes"
    );
    // Second pass: the same registration, reused.
    assert!(Arc::ptr_eq(
        &win,
        &reg.acquire(&file, 0, (8 * BS) as u64).unwrap()
    ));
    // Truncate to half while registered: the registry reports it, and copies from the window
    // still held read the pinned pages, i.e. the old contents (no fault, no SIGBUS).
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len((4 * BS) as u64)
        .unwrap();
    let e = reg.check(&file).unwrap_err();
    assert!(matches!(e, WindowError::FileChanged { .. }), "{e}");
    sink.reset_checksum().unwrap();
    copy_window(&mut sink, &win);
    let after = sink.checksum().unwrap();
    eprintln!(
        "after truncation the GPU read {} (old contents {expected:#x}, first half only {:#x})",
        if after == expected {
            "the old contents"
        } else {
            "something else"
        },
        checksum_at(&data[..4 * BS], 0)
    );
    assert_eq!(after, expected, "pinned pages keep the old contents");
    drop(win);
    assert_eq!(reg.len(), 0);
    std::fs::remove_file(&path).unwrap();
}

#[test]
#[ignore = "gpu: needs an NVIDIA GPU and driver (run with --ignored on a GPU machine)"]
fn a_block_of_a_file_changed_since_registration_is_refused_before_the_copy() {
    let path = std::env::temp_dir().join(format!("ubd-cuda-file-{}", std::process::id()));
    let bytes: Vec<u8> = (0..2 * BS).map(|i| (i % 251) as u8).collect();
    std::fs::write(&path, &bytes).unwrap();
    let reg = UbRegistry::new(DmaDomain::host_only());
    let file = std::fs::File::open(&path).unwrap();
    let region = reg.register_file(&file, 0, 2 * BS as u64).unwrap();
    let cfg_pool = PoolConfig {
        block_size: BS,
        block_count: 2,
    };
    let files = UbPool::new(&reg, region, cfg_pool).unwrap();
    let mut sink = CudaSink::new(&cfg(true), &[]).expect("GPU sink");
    // The file as registered: the GPU sees its bytes.
    let b = files.get().unwrap();
    let at = (b.index() as usize) * BS;
    let want = checksum_at(&bytes[at..at + BS], 0);
    sink.submit(b, BS, 0).map_err(|(_, e)| e).unwrap();
    drain(&mut sink, 1);
    assert_eq!(sink.checksum().unwrap(), want);
    // Truncated: refused at submit, the buffer comes back, nothing is copied.
    sink.reset_checksum().unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(BS as u64 / 2)
        .unwrap();
    let (b, e) = sink.submit(files.get().unwrap(), BS, 0).unwrap_err();
    assert_eq!(e.kind, SinkErrorKind::InvalidRequest, "{e:?}");
    assert!(format!("{e:?}").contains("changed"), "{e:?}");
    assert_eq!(sink.in_flight(), 0, "nothing went to the GPU");
    assert_eq!(sink.checksum().unwrap(), 0, "no bytes were copied");
    drop(b);
    let _ = std::fs::remove_file(&path);
}
