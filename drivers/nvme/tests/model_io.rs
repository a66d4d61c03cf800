//! The real driver against the well-behaved NVMe model on the host: bring-up, identify,
//! namespaces, queue pairs, write then read back, reset. No VFIO, no QEMU.

mod model_support;

use std::time::{Duration, Instant};

use model_support::{anon_pool, fast_opts, model, queue};
use ubdirect_devmodel::nvme::{NsConfig, NvmeConfig};
use ubdirect_nvme::{Controller, ControllerOptions, IoQueuePair, QueueOptions, ShadowDoorbells};
use ubdirect_nvme::{IoBuf, IoFlags, Lba};

const T: Duration = Duration::from_secs(5);

#[test]
fn bring_up_identifies_the_model() {
    let start = Instant::now();
    let (reg, m, dev) = model(NvmeConfig {
        namespaces: vec![
            NsConfig {
                nsid: 1,
                blocks: 2048,
                lbads: 9,
            },
            NsConfig {
                nsid: 3,
                blocks: 256,
                lbads: 12,
            },
        ],
        ..NvmeConfig::default()
    });
    let ctrl = Controller::open_device(&reg, dev, fast_opts()).unwrap();
    assert!(m.ready());
    assert_eq!(ctrl.info().mn, "ubdirect devmodel NVMe");
    assert_eq!(ctrl.info().nn, 3);
    let ns: Vec<(u32, u64, u32)> = ctrl
        .namespaces()
        .iter()
        .map(|n| (n.nsid, n.nsze, n.lba_size))
        .collect();
    assert_eq!(ns, vec![(1, 2048, 512), (3, 256, 4096)]);
    assert_eq!(ctrl.io_queues_granted(), 4);
    assert_eq!(ctrl.max_command_bytes(), 128 << 10);
    drop(ctrl);
    assert!(!m.ready(), "dropping the controller disables it");
    assert!(m.dma_faults().is_empty());
    // Measured ~10 ms in a debug build; 2 s is generous for a loaded 2-core machine.
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "{:?}",
        start.elapsed()
    );
}

#[test]
fn write_then_read_back_through_a_queue_pair() {
    let (reg, m, dev) = model(NvmeConfig::default());
    let ctrl = Controller::open_device(&reg, dev, fast_opts()).unwrap();
    let pool = anon_pool(&reg, 64 << 10, 4);
    let mut qp = queue(&ctrl, 16);
    assert_eq!(m.io_sq_count(), 1);
    let mut w = pool.get().unwrap();
    for (i, b) in w.as_mut_slice().iter_mut().enumerate() {
        *b = (i * 7 + 3) as u8;
    }
    // 40 KiB at LBA 8: a PRP list (more than two pages).
    let w = qp
        .write_blocking(
            &qp.namespace(1).unwrap(),
            Lba(8),
            IoBuf::prefix(w, 40 << 10).unwrap(),
            IoFlags::empty(),
            T,
        )
        .unwrap()
        .into_buf();
    let mut medium = vec![0u8; 40 << 10];
    m.read_medium(1, 8 * 512, &mut medium);
    assert_eq!(&medium[..], &w.as_slice()[..40 << 10]);
    let r = qp
        .read_blocking(
            &qp.namespace(1).unwrap(),
            Lba(8),
            IoBuf::new(pool.get().unwrap(), 512, 40 << 10).unwrap(),
            T,
        )
        .unwrap()
        .into_buf();
    assert_eq!(
        &r.as_slice()[512..512 + (40 << 10)],
        &w.as_slice()[..40 << 10]
    );
    qp.flush_blocking(&qp.namespace(1).unwrap(), T).unwrap();
    drop(qp);
    assert_eq!(m.io_sq_count(), 0, "dropping the pair deletes its queues");
    assert!(m.dma_faults().is_empty());
}

#[test]
fn reset_brings_queues_back() {
    let (reg, m, dev) = model(NvmeConfig {
        shadow_doorbells: true,
        ..NvmeConfig::default()
    });
    // Forced on: the model saves no MMIO write (like QEMU), so `Auto` would turn them off.
    let opts = ControllerOptions {
        shadow_doorbells: ShadowDoorbells::On,
        ..fast_opts()
    };
    let ctrl = Controller::open_device(&reg, dev, opts).unwrap();
    assert!(ctrl.shadow_doorbells());
    ctrl.reset().unwrap();
    let pool = anon_pool(&reg, 4096, 2);
    let mut qp = IoQueuePair::new(&ctrl, QueueOptions::default()).unwrap();
    assert!(qp.uses_shadow_doorbells());
    let mut b = pool.get().unwrap();
    b.as_mut_slice()[..4].copy_from_slice(b"ubd!");
    let b = qp
        .write_blocking(
            &qp.namespace(1).unwrap(),
            Lba(0),
            IoBuf::prefix(b, 4096).unwrap(),
            IoFlags::FUA,
            T,
        )
        .unwrap()
        .into_buf();
    drop(b);
    let r = qp
        .read_blocking(
            &qp.namespace(1).unwrap(),
            Lba(0),
            IoBuf::prefix(pool.get().unwrap(), 4096).unwrap(),
            T,
        )
        .unwrap()
        .into_buf();
    assert_eq!(&r.as_slice()[..4], b"ubd!");
    assert!(m.dma_faults().is_empty());
}
