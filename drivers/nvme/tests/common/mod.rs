//! Shared set-up of the NVMe guest tests: open a test-bed controller with a hugepage pool.
#![allow(dead_code)]

pub mod bar;

use std::sync::Arc;
use std::time::Duration;

use ubdirect_core::{DmaDomain, PoolConfig, UbPool, UbRegistry};
use ubdirect_nvme::{Controller, ControllerOptions, IoQueuePair, QueueOptions};
use ubdirect_testbed as testbed;

/// Deadline of every blocking call in the tests.
pub const T: Duration = Duration::from_secs(30);

/// An open controller with a pool in the same DMA domain.
pub struct Bed {
    pub registry: Arc<UbRegistry>,
    pub ctrl: Arc<Controller>,
    pub pool: Arc<UbPool>,
}

/// Open NVMe controller `idx` of the test bed (0 = nvme0, 1 = nvme1) with a pool of
/// `block_count` blocks of `block_size` bytes.
pub fn open(idx: usize, block_size: usize, block_count: usize) -> Bed {
    open_with(idx, block_size, block_count, ControllerOptions::default())
}

/// [`open`] with explicit controller options.
pub fn open_with(
    idx: usize,
    block_size: usize,
    block_count: usize,
    opts: ControllerOptions,
) -> Bed {
    let tb = testbed::require();
    let addr = tb
        .nvme
        .get(idx)
        .unwrap_or_else(|| panic!("test bed has no nvme{idx}: {:?}", tb.nvme));
    open_at(addr, block_size, block_count, opts)
}

/// [`open_with`] for the controller at PCI address `addr` (e.g. the test bed's MDTS-0 one).
pub fn open_at(addr: &str, block_size: usize, block_count: usize, opts: ControllerOptions) -> Bed {
    let registry = UbRegistry::new(DmaDomain::new().expect("DMA domain"));
    let ctrl = Controller::open(&registry, addr.parse().expect("pci address"), opts)
        .expect("open controller");
    let pool = UbPool::with_hugepages(
        &registry,
        PoolConfig {
            block_size,
            block_count,
        },
        None,
    )
    .expect("hugepage pool");
    Bed {
        registry,
        ctrl,
        pool,
    }
}

impl Bed {
    /// A queue pair of `depth` on namespace `nsid`.
    pub fn qp(&self, depth: usize, nsid: u32) -> IoQueuePair {
        IoQueuePair::new(
            &self.ctrl,
            QueueOptions {
                depth,
                nsid: Some(nsid),
                ..Default::default()
            },
        )
        .expect("queue pair")
    }
}

/// Deterministic pseudo-random bytes (xorshift) for write tests.
pub fn fill_random(seed: u64, buf: &mut [u8]) {
    let mut x = seed | 1;
    for chunk in buf.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let b = x.to_le_bytes();
        chunk.copy_from_slice(&b[..chunk.len()]);
    }
}

/// The one buffer window a single-buffer request hands back (a test fails on anything else).
pub fn one(bufs: ubdirect_nvme::IoBufs) -> ubdirect_nvme::IoBuf {
    match bufs {
        ubdirect_nvme::IoBufs::One(b) => b,
        other => panic!("a single-buffer request came back with {other:?}"),
    }
}
