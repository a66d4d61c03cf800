//! Fuzz target: controller bring-up (`Controller::open_device`: CAP checks, disable / enable,
//! admin queue, Identify, queue negotiation, namespaces, shadow doorbells, then shutdown on
//! drop) against a hostile model: any CAP, a short BAR0, register overrides, all-ones from any
//! read on, patched identify pages, a device that goes silent, rewritten completions (cid,
//! phase, status, SQ head, SQ id, result). Never a panic; a bounded time per case; what opens
//! holds the driver's invariants.

mod fuzz_support;
mod model_support;

use std::time::{Duration, Instant};

use fuzz_support::{config, hostile, nvme_config};
use proptest::prelude::*;
use ubdirect_devmodel::nvme::NvmeModel;
use ubdirect_nvme::{Controller, ControllerOptions};

/// Every wait of the driver bounded by half a millisecond: the model answers synchronously, so
/// a command not answered at once never will be.
fn opts(io_queues: u16) -> ControllerOptions {
    ControllerOptions {
        io_queues,
        admin_timeout: Duration::from_micros(500),
        ready_timeout: Some(Duration::from_micros(500)),
        default_shutdown_timeout: Duration::from_micros(500),
        ..ControllerOptions::default()
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn fuzz_bring_up(cfg in nvme_config(), plan in hostile(), io_queues in 1u16..8) {
        fuzz_support::tick("fuzz_bring_up");
        let start = Instant::now();
        let reg = model_support::registry();
        let m = NvmeModel::hostile(&reg, cfg, plan.into_tamper());
        let dev = m.attach(&reg);
        if let Ok(ctrl) = Controller::open_device(&reg, dev, opts(io_queues)) {
            let granted = ctrl.io_queues_granted();
            prop_assert!(granted >= 1 && granted <= io_queues);
            prop_assert!(ctrl.max_command_bytes() >= 4096);
            prop_assert!(ctrl.namespaces().len() <= 1024);
            for ns in ctrl.namespaces() {
                prop_assert!(ns.nsze > 0 && ns.nsid >= 1 && ns.nsid <= ctrl.info().nn);
                prop_assert!(ns.lba_size as usize <= ctrl.max_command_bytes());
                let _ = ns.size_bytes();
            }
            drop(ctrl);
        }
        // Worst case: a few 0.5 ms waits (ready, admin, shutdown); 1 s is far beyond it.
        prop_assert!(start.elapsed() < Duration::from_secs(1), "took {:?}", start.elapsed());
    }
}
