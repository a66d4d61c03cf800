//! Shadow doorbells `Auto`: the probe at open keeps them on a controller where
//! EventIdx saves MMIO doorbell writes and turns them off (controller reset without Doorbell
//! Buffer Config) where it saves none, as on QEMU; `On` / `Off` force it. The real driver
//! against the NVMe model on the host.

mod model_support;

use std::sync::Arc;
use std::time::Duration;

use model_support::{anon_pool, fast_opts, model, one, queue};
use ubdirect_core::UbPool;
use ubdirect_devmodel::nvme::NvmeConfig;
use ubdirect_nvme::controller::{ShadowDoorbells, PROBE_DEPTH, PROBE_READS, SAVE_ONE_IN};
use ubdirect_nvme::{Controller, ControllerOptions, IoQueuePair};
use ubdirect_nvme::{IoBuf, IoFlags, Lba};

const T: Duration = Duration::from_secs(5);

fn open(lazy_cq: bool, mode: ShadowDoorbells) -> (Arc<Controller>, IoQueuePair, Arc<UbPool>) {
    let (reg, _m, dev) = model(NvmeConfig {
        shadow_doorbells: true,
        shadow_lazy_cq: lazy_cq,
        ..NvmeConfig::default()
    });
    let ctrl = Controller::open_device(
        &reg,
        dev,
        ControllerOptions {
            shadow_doorbells: mode,
            ..fast_opts()
        },
    )
    .unwrap();
    let qp = queue(&ctrl, 32);
    let pool = anon_pool(&reg, 4096, 32);
    (ctrl, qp, pool)
}

/// 256 reads, 32 in flight; returns the doorbell updates saved by the shadow buffer.
fn run_reads(qp: &mut IoQueuePair, pool: &Arc<UbPool>) -> u64 {
    let before = qp.stats();
    let mut bufs: Vec<_> = (0..32).map(|_| pool.get().unwrap()).collect();
    let mut done = 0;
    let mut sent = 0u64;
    while done < 256 {
        while sent < 256 && !bufs.is_empty() {
            qp.submit_read(
                &qp.namespace(1).unwrap(),
                Lba(sent % 64),
                IoBuf::prefix(bufs.pop().unwrap(), 4096).unwrap(),
                IoFlags::empty(),
                sent,
            )
            .unwrap();
            sent += 1;
        }
        qp.ring();
        done += qp
            .wait_for(1, T, |c| {
                c.result.unwrap();
                bufs.push(one(c.bufs).into_buf());
            })
            .unwrap();
    }
    qp.stats().shadow_only_updates - before.shadow_only_updates
}

#[test]
fn auto_turns_shadow_doorbells_off_where_event_idx_saves_nothing() {
    // The model's default is QEMU's behaviour: EventIdx = the value just written.
    let (ctrl, mut qp, pool) = open(false, ShadowDoorbells::Auto);
    let d = ctrl.shadow_decision().clone();
    assert!(!d.on, "{d:?}");
    assert!(!ctrl.shadow_doorbells());
    assert!(!qp.uses_shadow_doorbells());
    // Batches of PROBE_DEPTH reads: one SQ and one CQ doorbell update per batch at least.
    assert!(
        d.probe_updates >= 2 * (PROBE_READS / PROBE_DEPTH) as u64,
        "{d:?}"
    );
    assert_eq!((d.probe_saved, d.probe_saved_ahead), (0, 0), "{d:?}");
    assert!(d.why.contains("turned off"), "{}", d.why);
    // The controller was reset without the shadow buffer: I/O works, every update is MMIO.
    assert_eq!(run_reads(&mut qp, &pool), 0);
    assert_eq!(
        ctrl.resets(),
        0,
        "the reset that dropped Doorbell Buffer Config is part of opening, not counted"
    );
}

#[test]
fn auto_keeps_shadow_doorbells_where_event_idx_saves_mmio_writes() {
    let (ctrl, mut qp, pool) = open(true, ShadowDoorbells::Auto);
    let d = ctrl.shadow_decision().clone();
    assert!(d.on, "{d:?}");
    assert!(ctrl.shadow_doorbells() && qp.uses_shadow_doorbells());
    assert!(
        d.probe_saved_ahead > 0 && d.probe_saved_ahead * SAVE_ONE_IN >= d.probe_updates,
        "{d:?}"
    );
    assert!(d.why.contains("kept"), "{}", d.why);
    assert!(
        run_reads(&mut qp, &pool) > 0,
        "the shadow buffer keeps saving"
    );
    assert_eq!(ctrl.resets(), 0);
}

#[test]
fn on_and_off_force_it_without_a_probe() {
    let (ctrl, qp, _pool) = open(false, ShadowDoorbells::On);
    let d = ctrl.shadow_decision();
    assert!(d.on && qp.uses_shadow_doorbells(), "{d:?}");
    assert_eq!((d.probe_updates, d.why.as_str()), (0, "on as asked"));
    drop(qp);
    let (ctrl, qp, _pool) = open(true, ShadowDoorbells::Off);
    let d = ctrl.shadow_decision();
    assert!(!d.on && !qp.uses_shadow_doorbells(), "{d:?}");
    assert_eq!((d.probe_updates, d.why.as_str()), (0, "off as asked"));
}
