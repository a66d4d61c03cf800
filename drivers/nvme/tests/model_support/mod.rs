//! Shared set-up of the model tests: a host-only domain, a registry, an NVMe model attached as a
//! PCI device, and a bounded runner that turns a hang into a test failure.

#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use ubdirect_core::{DmaDomain, PciDevice, PoolConfig, UbPool, UbRegistry};
use ubdirect_devmodel::nvme::{Hostile, NsConfig, NvmeConfig, NvmeModel};
use ubdirect_nvme::{Controller, ControllerOptions, IoQueuePair, QueueOptions};

/// A registry over a host-only domain: the model's DMA goes through its IOVAs.
pub fn registry() -> Arc<UbRegistry> {
    UbRegistry::new(DmaDomain::host_only())
}

/// Controller options with short deadlines, so a misbehaving model fails fast.
pub fn fast_opts() -> ControllerOptions {
    ControllerOptions {
        admin_timeout: Duration::from_millis(200),
        default_shutdown_timeout: Duration::from_millis(200),
        ..ControllerOptions::default()
    }
}

/// MDTS 2: 16 KiB per command; one namespace of 8192 blocks of 512 B (4 MiB).
pub fn small_mdts() -> NvmeConfig {
    NvmeConfig {
        mdts: 2,
        namespaces: vec![NsConfig {
            nsid: 1,
            blocks: 8192,
            lbads: 9,
        }],
        ..NvmeConfig::default()
    }
}

/// A well-behaved model of `cfg` and its device.
pub fn model(cfg: NvmeConfig) -> (Arc<UbRegistry>, Arc<NvmeModel>, Arc<PciDevice>) {
    let reg = registry();
    let m = NvmeModel::new(&reg, cfg);
    let dev = m.attach(&reg);
    (reg, m, dev)
}

/// A hostile model of `cfg` following `plan`, and its device.
pub fn hostile(
    cfg: NvmeConfig,
    plan: Hostile,
) -> (Arc<UbRegistry>, Arc<NvmeModel>, Arc<PciDevice>) {
    let reg = registry();
    let m = NvmeModel::hostile(&reg, cfg, plan.into_tamper());
    let dev = m.attach(&reg);
    (reg, m, dev)
}

/// Open a controller on a fresh model of `cfg` following `plan`.
pub fn open_hostile(
    cfg: NvmeConfig,
    plan: Hostile,
) -> (Arc<NvmeModel>, ubdirect_nvme::Result<Arc<Controller>>) {
    let (reg, m, dev) = hostile(cfg, plan);
    let r = Controller::open_device(&reg, dev, fast_opts());
    (m, r)
}

#[allow(unused_imports)] // not every test binary that includes this module needs it
pub use ubdirect_devmodel::within;

/// The one buffer window a single-buffer request hands back (a test fails on anything else).
pub fn one(bufs: ubdirect_nvme::IoBufs) -> ubdirect_nvme::IoBuf {
    match bufs {
        ubdirect_nvme::IoBufs::One(b) => b,
        other => panic!("a single-buffer request came back with {other:?}"),
    }
}

/// A pool of `block_count` blocks of `block_size` bytes in anonymous memory of `reg`'s domain.
pub fn anon_pool(reg: &Arc<UbRegistry>, block_size: usize, block_count: usize) -> Arc<UbPool> {
    UbPool::with_anonymous(
        reg,
        PoolConfig {
            block_size,
            block_count,
        },
        None,
    )
    .unwrap()
}

/// An I/O queue pair of `depth` on `ctrl`, the other options their defaults.
pub fn queue(ctrl: &Arc<Controller>, depth: usize) -> IoQueuePair {
    IoQueuePair::new(
        ctrl,
        QueueOptions {
            depth,
            ..QueueOptions::default()
        },
    )
    .unwrap()
}
