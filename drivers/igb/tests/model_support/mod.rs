//! Shared set-up of the igb model tests: a host-only DMA domain, a registry, pools in ordinary
//! memory, 82576 models attached as PCI devices, frames.

#![allow(dead_code)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use ubdirect_core::seams::NicFrame;
use ubdirect_core::ub::{PoolConfig, UbPool, UbRegistry};
use ubdirect_core::vfio::DmaDomain;
use ubdirect_devmodel::igb::{IgbHostile, IgbModel, IgbModelConfig};
use ubdirect_igb::{Igb, IgbConfig, IgbError, QueuePair};

/// A registry over a host-only domain: the model's DMA goes through its IOVAs.
pub fn registry() -> Arc<UbRegistry> {
    UbRegistry::new(DmaDomain::host_only())
}

/// A pool of `count` 4 KiB blocks in ordinary memory.
pub fn pool(reg: &Arc<UbRegistry>, count: usize) -> Arc<UbPool> {
    pool_of(reg, 4096, count)
}

/// A pool of `count` blocks of `size` bytes.
pub fn pool_of(reg: &Arc<UbRegistry>, size: usize, count: usize) -> Arc<UbPool> {
    UbPool::with_anonymous(
        reg,
        PoolConfig {
            block_size: size,
            block_count: count,
        },
        None,
    )
    .expect("anonymous pool")
}

/// Small rings and short deadlines, so a misbehaving model fails fast.
pub fn fast_cfg(ring: u16) -> IgbConfig {
    IgbConfig {
        rx_ring_size: ring,
        tx_ring_size: ring,
        reset_timeout: Duration::from_millis(5),
        link_timeout: Duration::from_millis(5),
        health_interval: Duration::from_millis(1),
        ..IgbConfig::default()
    }
}

/// A model of `cfg` misbehaving per `plan`, opened with `igb`: the model and the result.
pub fn open_model(
    reg: &Arc<UbRegistry>,
    pool: &Arc<UbPool>,
    cfg: IgbModelConfig,
    plan: IgbHostile,
    igb: IgbConfig,
) -> (Arc<IgbModel>, Result<Igb, IgbError>) {
    let m = IgbModel::hostile(reg, cfg, plan);
    let dev = m.attach(reg);
    let r = Igb::from_device(reg, dev, pool.clone(), igb);
    (m, r)
}

/// A frame of `len` bytes to `dst` from `src` at `off` of a pool buffer, body from `seq`.
pub fn frame(
    pool: &Arc<UbPool>,
    off: usize,
    len: usize,
    dst: [u8; 6],
    src: [u8; 6],
    seq: u32,
) -> NicFrame {
    let mut b = pool.get().expect("tx buffer");
    let d = &mut b.as_mut_slice()[off..off + len];
    let mut hdr = [0u8; 14];
    hdr[..6].copy_from_slice(&dst);
    hdr[6..12].copy_from_slice(&src);
    hdr[12..14].copy_from_slice(&[0x88, 0xb5]);
    let h = len.min(14);
    d[..h].copy_from_slice(&hdr[..h]);
    let s = seq.to_le_bytes();
    for (i, x) in d.iter_mut().enumerate().skip(14) {
        *x = s[i % 4].wrapping_add((i / 4) as u8);
    }
    NicFrame::new(b, off, len)
        .map_err(|(_, e)| e)
        .expect("tx frame")
}

/// Receives `n` frames on `q` within 2 s.
pub fn recv(q: &mut QueuePair<'_>, n: usize) -> Vec<NicFrame> {
    let mut out = Vec::with_capacity(n);
    let start = Instant::now();
    while out.len() < n {
        q.rx_burst(&mut out).expect("rx_burst");
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "got {} of {n}",
            out.len()
        );
    }
    out
}

#[allow(unused_imports)] // not every test binary that includes this module needs it
pub use ubdirect_devmodel::within;

/// Case count of the model fuzz targets: `UBD_FUZZ_CASES` or 10,000.
pub fn fuzz_cases() -> u32 {
    ubdirect_devmodel::fuzz::cases()
}
