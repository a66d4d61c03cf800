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
use ubdirect_devmodel::nvme::{Hostile, NvmeConfig, NvmeModel};
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

/// How long the driver may wait for a shutdown to complete: RTD3E (Identify Controller bytes
/// 88..92, after the plan's patches) clamped to 1..60 s, or `default_shutdown_timeout`.
fn shutdown_bound(cfg: &NvmeConfig, plan: &Hostile) -> Duration {
    let mut page = cfg.identify_controller();
    for &(cns, off, v) in &plan.identify_patches {
        if cns == 1 {
            page[off as usize % 4096] = v;
        }
    }
    match u32::from_le_bytes(page[88..92].try_into().unwrap()) {
        0 => opts(1).default_shutdown_timeout,
        us => {
            Duration::from_micros(us as u64).clamp(Duration::from_secs(1), Duration::from_secs(60))
        }
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn fuzz_bring_up(cfg in nvme_config(), plan in hostile(), io_queues in 1u16..8) {
        fuzz_support::tick("fuzz_bring_up");
        // 10 s of slack for a loaded host (1 s was exceeded once: 2.6 s at load 11); a loop
        // that never ends still fails.
        let limit = Duration::from_secs(10) + shutdown_bound(&cfg, &plan);
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
        // Worst case: a few 0.5 ms waits (ready, admin) and the shutdown wait (RTD3E clamped to
        // 1..60 s, when a register override hides CSTS.SHST); the slack above is far beyond the rest.
        prop_assert!(start.elapsed() < limit, "took {:?}, limit {:?}", start.elapsed(), limit);
    }
}
