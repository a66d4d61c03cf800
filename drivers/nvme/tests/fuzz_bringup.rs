//! Fuzz target: controller bring-up (`Controller::open_device`: CAP checks, disable / enable,
//! admin queue, Identify, queue negotiation, namespaces, shadow doorbells, then shutdown on
//! drop) against a hostile model: any CAP, a short BAR0, register overrides, all-ones from any
//! read on, patched identify pages, a device that goes silent, rewritten completions (cid,
//! phase, status, SQ head, SQ id, result). Never a panic; a bounded time per case; what opens
//! holds the driver's invariants.
//!
//! Reach: a third of the cases are fully hostile (most of them refused early: a random CAP or a
//! short BAR0 stops bring-up at its first checks); the rest are a well-formed controller with
//! mild misbehaviour (a few identify bytes, completion results, a device that goes silent
//! late), so most cases get through bring-up to the namespaces and shutdown. The target
//! asserts that a minimum share of its cases opened a controller, and one with a namespace:
//! a generator change that stops cases at the door fails it.

mod fuzz_support;
mod model_support;

use std::time::{Duration, Instant};

use std::sync::atomic::{AtomicU32, Ordering};

use fuzz_support::{config, hostile, nvme_config};
use proptest::prelude::*;
use proptest::test_runner::{TestCaseError, TestRunner};
use ubdirect_devmodel::nvme::{regs, CqeTweak, Hostile, NsConfig, NvmeConfig, NvmeModel};
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

/// A well-formed controller: the model's CAP, a full BAR0, random queue and transfer limits,
/// one to three namespaces of any LBA size, shadow doorbells or not.
fn sane_config() -> impl Strategy<Value = NvmeConfig> {
    let ns = prop::collection::vec((1u32..6, 1u64..512, 9u8..13), 1..4);
    (
        prop_oneof![
            Just(NvmeConfig::default().cap),
            (16u16..1024).prop_map(|m| regs::cap(m, 0, 20))
        ],
        prop_oneof![Just(0x4000u64), Just(0x10_0000)],
        1u16..40,
        prop_oneof![Just(0u8), 1u8..8],
        ns,
        any::<bool>(),
    )
        .prop_map(|(cap, bar0_len, max_io_queues, mdts, ns, shadow)| {
            let mut namespaces: Vec<NsConfig> = Vec::new();
            for (nsid, blocks, lbads) in ns {
                if !namespaces.iter().any(|n| n.nsid == nsid) {
                    namespaces.push(NsConfig {
                        nsid,
                        blocks,
                        lbads,
                    });
                }
            }
            NvmeConfig {
                cap,
                bar0_len,
                max_io_queues,
                mdts,
                namespaces,
                shadow_doorbells: shadow,
                ..NvmeConfig::default()
            }
        })
}

/// Mild misbehaviour bring-up must survive: a few identify bytes past the fields it checks
/// (vendor strings, reserved areas), completion results changed (Set Features' queue count
/// among them), a device that goes silent only after bring-up's commands.
fn mild_hostile() -> impl Strategy<Value = Hostile> {
    let tweak = prop_oneof![
        4 => Just(CqeTweak::Keep),
        1 => any::<u32>().prop_map(CqeTweak::Result),
    ];
    (
        prop::collection::vec((0u8..3, 3072u16..4096, any::<u8>()), 0..4),
        prop::option::weighted(0.3, 40u64..200),
        prop::collection::vec(tweak, 0..12),
    )
        .prop_map(|(identify_patches, silent_after, cqe_tweaks)| Hostile {
            identify_patches,
            silent_after,
            cqe_tweaks,
            ..Hostile::default()
        })
}

/// One case: a controller, its misbehaviour, the I/O queues asked for.
fn bring_up_case() -> impl Strategy<Value = (NvmeConfig, Hostile, u16)> {
    prop_oneof![
        1 => (nvme_config(), hostile(), 1u16..8),
        2 => (sane_config(), mild_hostile(), 1u16..8),
    ]
}

/// What the cases reached: opened, and opened with at least one namespace.
#[derive(Default)]
struct Reach {
    opened: AtomicU32,
    with_ns: AtomicU32,
}

/// One case; counts what it reached in `reach`.
fn one_case(
    cfg: NvmeConfig,
    plan: Hostile,
    io_queues: u16,
    reach: &Reach,
) -> Result<(), TestCaseError> {
    fuzz_support::tick("fuzz_bring_up");
    // 10 s of slack for a loaded host (1 s was exceeded once: 2.6 s at load 11); a loop
    // that never ends still fails.
    let limit = Duration::from_secs(10) + shutdown_bound(&cfg, &plan);
    let start = Instant::now();
    let reg = model_support::registry();
    let m = NvmeModel::hostile(&reg, cfg, plan.into_tamper());
    let dev = m.attach(&reg);
    if let Ok(ctrl) = Controller::open_device(&reg, dev, opts(io_queues)) {
        reach.opened.fetch_add(1, Ordering::Relaxed);
        let granted = ctrl.io_queues_granted();
        prop_assert!(granted >= 1 && granted <= io_queues);
        prop_assert!(ctrl.max_command_bytes() >= 4096);
        prop_assert!(ctrl.namespaces().len() <= 1024);
        if !ctrl.namespaces().is_empty() {
            reach.with_ns.fetch_add(1, Ordering::Relaxed);
        }
        for ns in ctrl.namespaces() {
            prop_assert!(ns.nsze > 0 && ns.nsid >= 1 && ns.nsid <= ctrl.info().nn);
            prop_assert!(ns.lba_size as usize <= ctrl.max_command_bytes());
            let _ = ns.size_bytes();
        }
        drop(ctrl);
    }
    // Worst case: a few 0.5 ms waits (ready, admin) and the shutdown wait (RTD3E clamped to
    // 1..60 s, when a register override hides CSTS.SHST); the slack above is far beyond the rest.
    prop_assert!(
        start.elapsed() < limit,
        "took {:?}, limit {:?}",
        start.elapsed(),
        limit
    );
    // Bring-up and shutdown make the device DMA only where the driver pointed it.
    prop_assert!(m.dma_faults().is_empty(), "{:?}", m.dma_faults());
    Ok(())
}

/// Shares of the cases that must open a controller, and one with a namespace (percent). Two
/// thirds are well-formed controllers that open unless their mild misbehaviour is refused.
const MIN_OPENED_PCT: u32 = 50;
const MIN_WITH_NS_PCT: u32 = 40;
/// Below this many cases the shares are too noisy to assert (a by-hand run with few cases).
const MIN_CASES_FOR_REACH: u32 = 500;

#[test]
fn fuzz_bring_up() {
    let reach = Reach::default();
    let mut runner = TestRunner::new(config());
    let r = runner.run(&bring_up_case(), |(cfg, plan, io_queues)| {
        one_case(cfg, plan, io_queues, &reach)
    });
    if let Err(e) = r {
        panic!("{e}");
    }
    let cases = fuzz_support::cases();
    let (opened, with_ns) = (
        reach.opened.load(Ordering::Relaxed),
        reach.with_ns.load(Ordering::Relaxed),
    );
    eprintln!("fuzz_bring_up: {cases} cases, {opened} opened, {with_ns} with a namespace");
    if cases >= MIN_CASES_FOR_REACH {
        assert!(
            opened * 100 >= cases * MIN_OPENED_PCT,
            "only {opened} of {cases} cases opened a controller (want {MIN_OPENED_PCT} %)"
        );
        assert!(
            with_ns * 100 >= cases * MIN_WITH_NS_PCT,
            "only {with_ns} of {cases} cases opened one with a namespace (want {MIN_WITH_NS_PCT} %)"
        );
    }
}
