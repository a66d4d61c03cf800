//! Guest tests of the pipeline through real (emulated) devices and the real vfio-pci driver:
//! NVMe -> ivshmem BAR (peer-to-peer, zero copy; the host then compares the BAR's backing file
//! with the NVMe image), NVMe -> null with verification (including a small-MDTS controller where
//! one block is many commands), and file -> null through io_uring (a tmpfs file in the guest,
//! read buffered: tmpfs has no O_DIRECT).
//!
//! Each NVMe test first writes its own seeded data to the range it streams (other guest tests
//! write to the namespaces too), verifies, and then writes the image pattern back. The BAR test's
//! host checks compare the BAR's backing file with that seeded data (`file-bytes`), not with the
//! NVMe image, which later tests may change.

use std::sync::Arc;
use std::time::Duration;

use ubdirect::cuda::checksum_at;
use ubdirect::dma::seams::{BlockCompletion, BlockError, BlockErrorKind, BlockQueue};
use ubdirect::dma::{DmaDomain, PciDevice, PoolConfig, UbBuf, UbPool, UbRegistry};
use ubdirect::nvme::{Controller, ControllerOptions, IoQueuePair, QueueOptions};
use ubdirect::nvme::{IoBuf, IoFlags, Lba};
use ubdirect::pipeline::{
    file_checksum, run_direct, BarSink, Limit, NullSink, PipelineConfig, PipelineError,
    PipelineSink,
};
use ubdirect_testbed::{
    self as testbed, BackingImage, GPUBAR_FILE, NVME0_NS1, NVME1_NS1, NVME1_NS2,
};

const T: Duration = Duration::from_secs(30);

struct Nvme {
    registry: Arc<UbRegistry>,
    _ctrl: Arc<Controller>,
    qp: IoQueuePair,
    host: Arc<UbPool>,
}

fn open_nvme(idx: usize, nsid: u32, depth: usize) -> Nvme {
    let tb = testbed::require();
    let registry = UbRegistry::new(DmaDomain::new().expect("DMA domain"));
    let ctrl = Controller::open(
        &registry,
        tb.nvme[idx].parse().unwrap(),
        ControllerOptions::default(),
    )
    .expect("controller");
    let qp = IoQueuePair::new(
        &ctrl,
        QueueOptions {
            depth,
            nsid: Some(nsid),
            ..Default::default()
        },
    )
    .expect("queue pair");
    let host = UbPool::with_hugepages(
        &registry,
        PoolConfig {
            block_size: 1 << 20,
            block_count: 2,
        },
        None,
    )
    .expect("host pool");
    Nvme {
        registry,
        _ctrl: ctrl,
        qp,
        host,
    }
}

/// Seeded bytes for stream offset `off`.
fn seeded(seed: u64, off: u64, buf: &mut [u8]) {
    for (i, c) in buf.chunks_mut(8).enumerate() {
        let w = ubdirect::cuda::mix(off / 8 + i as u64, seed).to_le_bytes();
        c.copy_from_slice(&w[..c.len()]);
    }
}

/// Write seeded data (or the image pattern when `seed` is None) over [base, base+len); returns
/// the checksum of what was written, with offsets relative to `base`.
fn fill(n: &mut Nvme, img: &BackingImage, base: u64, len: u64, seed: Option<u64>) -> u64 {
    let lba_size = u64::from(img.block_size);
    let mut sum = 0u64;
    let mut off = 0;
    let mut buf = n.host.get().unwrap();
    while off < len {
        let l = (len - off).min(1 << 20) as usize;
        match seed {
            Some(s) => seeded(s, off, &mut buf.as_mut_slice()[..l]),
            None => testbed::fill_pattern(img.id, base + off, &mut buf.as_mut_slice()[..l]),
        }
        sum = sum.wrapping_add(checksum_at(&buf.as_slice()[..l], off));
        let ns = n.qp.default_namespace().expect("the queue's namespace");
        let io = IoBuf::prefix(buf, l).expect("a window inside the buffer");
        buf =
            n.qp.write_blocking(&ns, Lba((base + off) / lba_size), io, IoFlags::empty(), T)
                .unwrap_or_else(|r| panic!("write: {}", r.error))
                .into_buf();
        off += l as u64;
    }
    sum
}

fn cfg(block_size: usize, qd: usize, start: u64, bytes: u64) -> PipelineConfig {
    PipelineConfig {
        block_size,
        qd,
        limit: Limit::Bytes(bytes),
        verify: true,
        progress: false,
        stall_timeout: T,
        start,
        ..PipelineConfig::default()
    }
}

#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn nvme_to_bar_pipeline_lands_in_the_bar_zero_copy() {
    let tb = testbed::require();
    let mut n = open_nvme(0, 1, 128);
    let (base, len, bs) = (40u64 << 20, 16u64 << 20, 1usize << 20);
    let expected = fill(&mut n, &NVME0_NS1, base, len, Some(0xB0B));
    let dev = PciDevice::open(
        n.registry.domain(),
        tb.ivshmem.as_ref().expect("ivshmem").parse().unwrap(),
    )
    .expect("ivshmem");
    let bar = n.registry.register_bar(&dev, 2).expect("BAR2");
    let blocks = bar.len / bs;
    let pool = UbPool::new(
        &n.registry,
        bar.clone(),
        PoolConfig {
            block_size: bs,
            block_count: blocks,
        },
    )
    .expect("BAR pool");
    // Other guest tests use the low part of the BAR: hold it, so the pipeline streams through
    // the top quarter only and the host check below is not overwritten by a later test.
    let all: Vec<_> = (0..blocks).map(|_| pool.get().unwrap()).collect();
    let top = (bar.len - bar.len / 4) as u64;
    let _held: Vec<_> = all
        .into_iter()
        .filter(|b| (b.as_ptr() as u64 - bar.vaddr as u64) < top)
        .collect();
    let mut sink = BarSink::new(bar.clone(), bs, base, NVME0_NS1.len - base, true);
    let r = run_direct(
        &mut n.qp,
        &mut sink,
        &pool,
        &cfg(bs, 4, base, len),
        "nvme->bar",
        "nvme0",
    )
    .expect("pipeline");
    println!("{r}");
    assert_eq!(r.bytes, len);
    assert_eq!(r.blocks, len / bs as u64);
    assert!(r.latency.count > 0 && r.latency.p50_us > 0.0);
    let delivered = sink.delivered_checksum().unwrap().unwrap();
    assert_eq!(
        delivered, expected,
        "the CPU reading the BAR sees the bytes written to the namespace"
    );
    let landed: Vec<_> = sink.landed().copied().collect();
    assert!(!landed.is_empty());
    let mut want = vec![0u8; 64];
    for l in &landed {
        assert!(l.bar_offset >= top, "only the top quarter was free: {l:?}");
        assert!(
            l.source_offset >= base && l.source_offset + l.len <= base + len,
            "{l:?}"
        );
        // What the BAR block holds now, checked by the host in the BAR's backing file: the first
        // and last 64 bytes of the block as written to the namespace (seeded, stream offsets).
        for (at, name) in [(0, "head"), (l.len - 64, "tail")] {
            seeded(0xB0B, l.source_offset - base + at, &mut want);
            println!(
                "{}",
                testbed::hostcheck_file_bytes(
                    &format!("pipeline-nvme0-bar-{:x}-{name}", l.bar_offset),
                    GPUBAR_FILE,
                    l.bar_offset + at,
                    &want
                )
            );
        }
    }
    drop(_held);
    fill(&mut n, &NVME0_NS1, base, len, None);
}

/// A queue pair as the pipeline's source, counting the submissions refused with QueueFull. It
/// reports `extra_depth` more depth than the queue pair has request slots, as a queue pair
/// whose slots another submitter also uses would: the pipeline (which keeps at most `depth()`
/// in flight) then meets QueueFull on a real device and must wait for completions.
struct CountQueueFull<'a> {
    qp: &'a mut IoQueuePair,
    extra_depth: usize,
    queue_full: u64,
}

impl BlockQueue for CountQueueFull<'_> {
    fn block_size(&self) -> u32 {
        self.qp.block_size()
    }
    fn capacity(&self) -> u64 {
        self.qp.capacity()
    }
    fn depth(&self) -> usize {
        BlockQueue::depth(&*self.qp) + self.extra_depth
    }
    fn max_transfer(&self) -> usize {
        self.qp.max_transfer()
    }
    fn submit_read(
        &mut self,
        buf: UbBuf,
        offset: u64,
        len: usize,
        tag: u64,
    ) -> Result<(), (UbBuf, BlockError)> {
        let r = BlockQueue::submit_read(&mut *self.qp, buf, offset, len, tag);
        if matches!(&r, Err((_, e)) if e.kind == BlockErrorKind::QueueFull) {
            self.queue_full += 1;
        }
        r
    }
    fn submit_write(
        &mut self,
        buf: UbBuf,
        offset: u64,
        len: usize,
        tag: u64,
    ) -> Result<(), (UbBuf, BlockError)> {
        BlockQueue::submit_write(&mut *self.qp, buf, offset, len, tag)
    }
    fn ring(&mut self) -> Result<(), BlockError> {
        BlockQueue::ring(&mut *self.qp)
    }
    fn poll(
        &mut self,
        max: usize,
        f: &mut dyn FnMut(BlockCompletion),
    ) -> Result<usize, BlockError> {
        BlockQueue::poll(&mut *self.qp, max, f)
    }
    fn in_flight(&self) -> usize {
        BlockQueue::in_flight(&*self.qp)
    }
}

#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn nvme_to_null_small_mdts_many_commands_per_block() {
    // nvme1 ns1: MDTS 16 KiB, so a 256 KiB block is 16 commands. A queue of depth 16 holds
    // 16 requests (256 KiB each at most) and 16 commands: the commands of the blocks in flight
    // wait in the queue pair's pending list. The source reports 8 more depth than that, so with
    // qd 24 the pipeline's 17th block gets QueueFull with 16 in flight, which it must treat as
    // back-pressure. Both are counted and asserted below.
    let mut n = open_nvme(1, 1, 16);
    let (base, len, bs) = (8u64 << 20, 8u64 << 20, 256usize << 10);
    let expected = fill(&mut n, &NVME1_NS1, base, len, Some(0x5EED));
    let pool = UbPool::with_hugepages(
        &n.registry,
        PoolConfig {
            block_size: bs,
            block_count: 32,
        },
        None,
    )
    .unwrap();
    let mut sink = NullSink::new(32, true);
    let mut src = CountQueueFull {
        qp: &mut n.qp,
        extra_depth: 8,
        queue_full: 0,
    };
    let r = run_direct(
        &mut src,
        &mut sink,
        &pool,
        &cfg(bs, 24, base, len),
        "nvme1->null",
        "nvme1",
    )
    .expect("pipeline");
    let queue_full = src.queue_full;
    println!("{r}; QueueFull {queue_full} times; {:?}", n.qp.stats());
    assert_eq!(r.bytes, len);
    assert_eq!(sink.delivered_checksum().unwrap().unwrap(), expected);
    assert!(r.cycles_per_completion.is_some());
    assert!(queue_full > 0, "the pipeline never met QueueFull");
    assert!(
        n.qp.stats().queued_requests > 0,
        "no request waited for command slots: {:?}",
        n.qp.stats()
    );
    let restored = fill(&mut n, &NVME1_NS1, base, len, None);
    assert_ne!(restored, expected);
}

#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn nvme_to_null_4k_namespace_and_a_partial_last_block() {
    let mut n = open_nvme(1, 2, 64);
    // 3 MiB + 8 KiB: the last block is short.
    let (base, len, bs) = (16u64 << 20, (3u64 << 20) + 8192, 1usize << 20);
    let expected = fill(&mut n, &NVME1_NS2, base, len, Some(0xF00D));
    let pool = UbPool::with_hugepages(
        &n.registry,
        PoolConfig {
            block_size: bs,
            block_count: 4,
        },
        None,
    )
    .unwrap();
    let mut sink = NullSink::new(4, true);
    let r = run_direct(
        &mut n.qp,
        &mut sink,
        &pool,
        &cfg(bs, 2, base, len),
        "nvme1n2->null",
        "nvme1n2",
    )
    .expect("pipeline");
    assert_eq!(r.bytes, len);
    assert_eq!(r.blocks, 4);
    assert_eq!(sink.delivered_checksum().unwrap().unwrap(), expected);
    fill(&mut n, &NVME1_NS2, base, len, None);
}

#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn nvme_pipeline_refuses_bad_settings() {
    let mut n = open_nvme(0, 1, 32);
    let pool = UbPool::with_hugepages(
        &n.registry,
        PoolConfig {
            block_size: 1 << 20,
            block_count: 2,
        },
        None,
    )
    .unwrap();
    let mut sink = NullSink::new(2, false);
    // Each bad setting is a Config error naming the setting and the reason, and nothing is
    // submitted (the queue stays empty, no pool block is taken).
    for (c, want) in [
        (
            cfg(1 << 20, 2, 100, 1 << 20),
            "start offset 100 must be a multiple of the 512-byte logical block",
        ),
        (
            cfg(1000, 2, 0, 1 << 20),
            "PipelineConfig::block_size 1000 must be a positive multiple of the source's 512-byte logical block",
        ),
        (
            cfg(1 << 20, 2, 0, NVME0_NS1.len + 1),
            "PipelineConfig::verify checks one pass over the source: Limit::Bytes 67108865 exceeds its 67108864 bytes",
        ),
    ] {
        let e = run_direct(&mut n.qp, &mut sink, &pool, &c, "bad", "nvme0").unwrap_err();
        println!("refused: {e}");
        assert!(
            matches!(&e, PipelineError::Config(m) if m.contains(want)),
            "want a Config error containing {want:?}, got {e:?}"
        );
        assert_eq!(n.qp.in_flight(), 0, "nothing submitted for {want:?}");
        assert_eq!(n.qp.stats().commands, 0, "no command sent for {want:?}");
    }
    assert_eq!(pool.stats().in_use, 0, "no buffer leaked by refused runs");
    assert_eq!(n.qp.in_flight(), 0);
}

#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn file_to_null_through_io_uring_in_the_guest() {
    // /tmp in the guest is tmpfs: O_DIRECT means nothing there, reads go buffered via io-wq.
    let path = std::path::PathBuf::from(format!("/tmp/ubd-pipeline-{}.bin", std::process::id()));
    let len = 6 << 20;
    let mut data = vec![0u8; len];
    seeded(0xF11E, 0, &mut data);
    std::fs::write(&path, &data).unwrap();
    let registry = UbRegistry::new(DmaDomain::host_only());
    let pool = UbPool::with_hugepages(
        &registry,
        PoolConfig {
            block_size: 1 << 20,
            block_count: 4,
        },
        None,
    )
    .unwrap();
    let opts = ubdirect::uring::UringOptions {
        depth: 4,
        ..Default::default()
    };
    let mut q = ubdirect::uring::UringQueue::open(&path, &[pool.region().clone()], &opts)
        .expect("io_uring");
    assert!(!q.is_direct(), "tmpfs is read buffered");
    let mut sink = NullSink::new(4, true);
    let r = run_direct(
        &mut q,
        &mut sink,
        &pool,
        &cfg(1 << 20, 4, 0, len as u64),
        "file->null",
        "tmpfs file",
    )
    .expect("pipeline");
    println!("{r}");
    assert_eq!(r.bytes, len as u64);
    let expected = file_checksum(&path, 0, len as u64).unwrap();
    assert_eq!(expected, checksum_at(&data, 0));
    assert_eq!(sink.delivered_checksum().unwrap().unwrap(), expected);
    let _ = std::fs::remove_file(&path);
}
