//! Shared set-up of the virtio-net guest tests: the two NICs of the test bed (one QEMU hub:
//! what one sends the other receives), pools in hugepages or in the ivshmem BAR, and
//! send/receive helpers with deadlines.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use ubdirect_core::pci::{PciAddress, PciDevice};
use ubdirect_core::ub::{PoolConfig, UbPool, UbRegion, UbRegistry};
use ubdirect_core::vfio::DmaDomain;
use ubdirect_testbed as testbed;
use ubdirect_virtio_net::pattern::{self, Check};
use ubdirect_virtio_net::{NetConfig, RxFrame, TxFrame, VirtioNet, FRAME_OFFSET};

/// How long the test functions here wait for frames before failing the test.
pub const DEADLINE: Duration = Duration::from_secs(10);

/// The devices and the DMA domain they share.
/// Fields drop in order: the registry (and its IOMMU mappings) before the devices, whose
/// groups hold the IOMMU container.
pub struct Bed {
    pub registry: Arc<UbRegistry>,
    pub nic_a: Arc<PciDevice>,
    pub nic_b: Arc<PciDevice>,
    pub domain: Arc<DmaDomain>,
}

pub fn addr(s: &str) -> PciAddress {
    s.parse().expect("test-bed address parses")
}

/// Opens the domain and both NICs (before the registry, as core asks).
pub fn bed() -> Bed {
    let tb = testbed::require();
    assert!(
        tb.nics.len() >= 2,
        "the test bed needs two NICs in UBD_NICS, got {:?}",
        tb.nics
    );
    let domain = DmaDomain::new().expect("vfio container");
    let nic_a = PciDevice::open(&domain, addr(&tb.nics[0])).expect("open NIC A");
    let nic_b = PciDevice::open(&domain, addr(&tb.nics[1])).expect("open NIC B");
    let registry = UbRegistry::new(domain.clone());
    Bed {
        domain,
        nic_a,
        nic_b,
        registry,
    }
}

/// A hugepage pool of `count` 4 KiB blocks.
pub fn host_pool(bed: &Bed, count: usize) -> Arc<UbPool> {
    UbPool::with_hugepages(
        &bed.registry,
        PoolConfig {
            block_size: 4096,
            block_count: count,
        },
        None,
    )
    .expect("hugepage pool")
}

/// The ivshmem device's BAR 2 (the GPU-BAR stand-in) registered as a region.
pub fn gpu_bar_region(bed: &Bed) -> (Arc<PciDevice>, Arc<UbRegion>) {
    let tb = testbed::require();
    let iv = tb
        .ivshmem
        .expect("the test bed has an ivshmem device (UBD_IVSHMEM)");
    let dev = PciDevice::open(&bed.domain, addr(&iv)).expect("open ivshmem");
    let region = bed
        .registry
        .register_bar(&dev, 2)
        .expect("register ivshmem BAR2");
    (dev, region)
}

pub fn open(bed: &Bed, dev: &Arc<PciDevice>, pool: &Arc<UbPool>, cfg: NetConfig) -> VirtioNet {
    VirtioNet::from_device(&bed.registry, dev.clone(), pool.clone(), cfg).expect("virtio-net up")
}

/// Builds pattern frame `seq` of `len` bytes in a buffer of `pool`.
pub fn frame(pool: &Arc<UbPool>, len: usize, dst: [u8; 6], src: [u8; 6], seq: u64) -> TxFrame {
    let mut b = pool.get().expect("tx buffer");
    // Through a copy: the pool may be a BAR region, never borrowed as a Rust slice.
    let mut bytes = vec![0u8; len];
    pattern::fill(&mut bytes, dst, src, seq);
    b.write_from(FRAME_OFFSET, &bytes)
        .expect("the frame fits the buffer");
    TxFrame::new(b, len).map_err(|(_, e)| e).expect("tx frame")
}

/// A received frame's bytes, copied out of its buffer (host memory or a BAR).
pub fn rx_bytes(f: &RxFrame) -> Vec<u8> {
    let mut v = vec![0u8; f.len()];
    f.buf().read_into(f.offset(), &mut v).expect("frame bytes");
    v
}

/// Sends `frames` completely (retrying while the ring is full), with a deadline.
pub fn send_all(nic: &mut VirtioNet, frames: &mut Vec<TxFrame>) {
    let start = Instant::now();
    while !frames.is_empty() {
        nic.tx_burst(frames).expect("tx_burst");
        assert!(
            start.elapsed() < DEADLINE,
            "TX ring never drained: {} frames left",
            frames.len()
        );
    }
}

/// Receives exactly `n` frames (or fails at the deadline), reclaiming TX on `tx` meanwhile.
pub fn recv_n(rx: &mut VirtioNet, tx: &mut VirtioNet, n: usize) -> Vec<RxFrame> {
    let mut out = Vec::with_capacity(n);
    let start = Instant::now();
    while out.len() < n {
        if out.len() == out.capacity() {
            break;
        }
        rx.rx_burst(&mut out).expect("rx_burst");
        tx.reclaim_tx().expect("reclaim");
        assert!(
            start.elapsed() < DEADLINE,
            "received {} of {n} frames before the deadline (rx stats {:?}, tx stats {:?})",
            out.len(),
            rx.stats(),
            tx.stats()
        );
    }
    out
}

/// Polls `rx` for `d` and returns what arrived (for "nothing/some arrives" checks).
pub fn recv_for(rx: &mut VirtioNet, d: Duration, cap: usize) -> Vec<RxFrame> {
    let mut out = Vec::with_capacity(cap);
    let start = Instant::now();
    while start.elapsed() < d && out.len() < cap {
        rx.rx_burst(&mut out).expect("rx_burst");
        std::thread::sleep(Duration::from_millis(1));
    }
    out
}

/// Asserts each received frame is pattern frame `first + i` of `len` bytes, byte-exact.
pub fn assert_frames(got: &[RxFrame], len: usize, dst: [u8; 6], src: [u8; 6], first: u64) {
    for (i, f) in got.iter().enumerate() {
        assert_eq!(f.offset(), FRAME_OFFSET);
        match pattern::verify(&rx_bytes(f), dst, src, len) {
            Check::Good(seq) => assert_eq!(seq, first + i as u64, "frame {i} out of order"),
            other => panic!("frame {i} (len {}) is not byte-exact: {other:?}", f.len()),
        }
    }
}

pub fn macs(a: &VirtioNet, b: &VirtioNet) -> ([u8; 6], [u8; 6]) {
    (
        a.mac().expect("NIC A has a MAC"),
        b.mac().expect("NIC B has a MAC"),
    )
}
