//! Shared set-up of the virtio-net model tests: a host-only DMA domain, a registry, pools in
//! ordinary memory, virtio-net models attached as PCI devices, and a bounded runner that turns
//! a hang into a test failure.

#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use ubdirect_core::ub::{PoolConfig, UbPool, UbRegistry};
use ubdirect_core::vfio::DmaDomain;
use ubdirect_devmodel::virtio_net::{Hostile, NetModelConfig, VirtioNetModel};
use ubdirect_virtio_net::{NetConfig, TxFrame, VirtioNet, VirtioNetError, FRAME_OFFSET};

/// A registry over a host-only domain: the model's DMA goes through its IOVAs.
pub fn registry() -> Arc<UbRegistry> {
    UbRegistry::new(DmaDomain::host_only())
}

/// A pool of `count` 4 KiB blocks in ordinary memory.
pub fn pool(reg: &Arc<UbRegistry>, count: usize) -> Arc<UbPool> {
    UbPool::with_anonymous(
        reg,
        PoolConfig {
            block_size: 4096,
            block_count: count,
        },
        None,
    )
    .expect("anonymous pool")
}

/// Small rings and short deadlines, so a misbehaving model fails fast.
pub fn fast_cfg(queue_size: u16) -> NetConfig {
    NetConfig {
        rx_queue_size: Some(queue_size),
        tx_queue_size: Some(queue_size),
        health_interval: Duration::from_millis(1),
        ctrl_timeout: Duration::from_millis(20),
        ..NetConfig::default()
    }
}

/// A model of `cfg` misbehaving per `plan`, opened with `net`: the model and the result.
pub fn open_model(
    reg: &Arc<UbRegistry>,
    pool: &Arc<UbPool>,
    cfg: NetModelConfig,
    plan: Hostile,
    net: NetConfig,
) -> (Arc<VirtioNetModel>, Result<VirtioNet, VirtioNetError>) {
    let m = VirtioNetModel::hostile(reg, cfg, plan);
    let dev = m.attach(reg);
    let r = VirtioNet::from_device(reg, dev, pool.clone(), net);
    (m, r)
}

/// A frame of `len` bytes to `dst` from `src`, body bytes `seq`-derived.
pub fn frame(pool: &Arc<UbPool>, len: usize, dst: [u8; 6], src: [u8; 6], seq: u8) -> TxFrame {
    let mut b = pool.get().expect("tx buffer");
    let d = &mut b.as_mut_slice()[FRAME_OFFSET..FRAME_OFFSET + len];
    d[..6].copy_from_slice(&dst);
    d[6..12].copy_from_slice(&src);
    d[12..14].copy_from_slice(&[0x88, 0xb5]);
    for (i, x) in d[14..].iter_mut().enumerate() {
        *x = seq.wrapping_add(i as u8);
    }
    TxFrame::new(b, len).map_err(|(_, e)| e).expect("tx frame")
}

#[allow(unused_imports)] // not every test binary that includes this module needs it
pub use ubdirect_devmodel::within;

/// Case count of the model fuzz targets: `UBD_FUZZ_CASES` or 10,000.
pub fn fuzz_cases() -> u32 {
    ubdirect_devmodel::fuzz::cases()
}
