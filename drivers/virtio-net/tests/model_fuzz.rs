//! Fuzz targets of the driver's state machines on a hostile device model (proptest on stable;
//! 10,000 cases each by default, `UBD_FUZZ_CASES=1000000` by hand):
//!
//! - `fuzz_bring_up`: any offered features, num_queues, queue sizes, notify offsets,
//!   capability bytes, BAR length, device configuration, config_generation, FEATURES_OK,
//!   MSI-X read-back, all-ones registers, a device that stops answering: `VirtioNet::open`
//!   returns (within a deadline) either a working device or a typed error, never panics,
//!   never aims the device's DMA outside driver memory, and gives every buffer back.
//! - `fuzz_rx_tx_burst`: a device that brings up fine, then answers bursts and control
//!   commands with any used-ring id/len/index, stops answering or reads all-ones: every burst
//!   returns frames within their bounds or a typed error, never a panic or a hang.

mod model_support;

use std::time::Duration;

use model_support::*;
use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed, TestRunner};
use ubdirect_devmodel::virtio_net::{
    feature, CapSpec, Hostile, Layout, NetModelConfig, UsedTweak, BAR,
};
use ubdirect_virtio_net::{NetConfig, VirtioNetError};

const A: [u8; 6] = [2, 0, 0, 0, 0, 0xa];

fn runner() -> TestRunner {
    TestRunner::new(Config {
        cases: fuzz_cases(),
        rng_seed: RngSeed::Fixed(ubdirect_devmodel::fuzz::seed()),
        failure_persistence: None,
        ..Config::default()
    })
}

/// Feature words near what the driver wants, with random bits flipped.
fn features() -> impl Strategy<Value = Option<u64>> {
    let base = feature::VERSION_1
        | feature::ACCESS_PLATFORM
        | feature::MAC
        | feature::STATUS
        | feature::CTRL_VQ
        | feature::CTRL_RX
        | feature::MQ
        | feature::MTU
        | feature::EVENT_IDX;
    prop_oneof![
        6 => Just(None),
        2 => any::<u64>().prop_map(move |flip| Some(base ^ (flip & flip.rotate_left(7) & flip.rotate_left(13)))),
        1 => any::<u64>().prop_map(Some),
    ]
}

fn cap() -> impl Strategy<Value = CapSpec> {
    (prop_oneof![Just(BAR), 0u8..8], 0u32..0x4800, 0u32..0x1800).prop_map(
        |(bar, offset, length)| CapSpec {
            bar,
            offset,
            length,
        },
    )
}

fn layout() -> impl Strategy<Value = Option<Layout>> {
    let tweak = (
        0usize..5,
        cap(),
        any::<bool>(),
        prop_oneof![Just(4u32), Just(0), any::<u32>(), 0u32..9],
    );
    prop_oneof![
        6 => Just(None),
        1 => tweak.prop_map(|(which, c, present, mult)| {
            let mut l = Layout::default();
            match which {
                0 => l.common = c,
                1 => l.notify = c,
                2 => l.isr = c,
                3 => l.device = c,
                _ => l.notify_mult = mult,
            }
            l.device_present = present || which == 3;
            Some(l)
        }),
    ]
}

fn used_tweaks() -> impl Strategy<Value = Vec<UsedTweak>> {
    let one = prop_oneof![
        4 => Just(UsedTweak::default()),
        1 => (proptest::option::of(any::<u32>()), proptest::option::of(any::<u32>()), prop_oneof![Just(0u16), any::<u16>()])
            .prop_map(|(id, len, extra_idx)| UsedTweak { id, len, extra_idx }),
    ];
    proptest::collection::vec(one, 0..24)
}

fn rare<T: std::fmt::Debug + Clone + 'static>(
    s: impl Strategy<Value = T> + 'static,
) -> impl Strategy<Value = Option<T>> {
    prop_oneof![6 => Just(None), 1 => s.prop_map(Some)]
}

/// A hostile device for bring-up.
fn hostile() -> impl Strategy<Value = (NetModelConfig, Hostile, u16)> {
    let cfg = (
        1u16..5,
        prop_oneof![6 => Just(8u16), 1 => 0u16..64, 1 => any::<u16>()],
        rare(0u16..200),
        prop_oneof![4 => Just(true), 1 => Just(false)],
        any::<bool>(),
    )
        .prop_map(
            |(max_pairs, queue_max, mtu, ctrl_vq, event_idx)| NetModelConfig {
                mac: A,
                max_pairs,
                queue_max,
                mtu,
                ctrl_vq,
                event_idx,
                link_up: true,
                // Both shapes: QEMU's (MQ pairs appear with the feature) and a fixed count.
                queues_grow_with_mq: max_pairs % 2 == 0,
                numa_node: None,
            },
        );
    let regs = (
        features(),
        rare(any::<u16>()),
        rare(any::<u16>()),
        rare(prop_oneof![0u16..16, any::<u16>()]),
        layout(),
        prop_oneof![6 => Just(vec![]), 1 => proptest::collection::vec((0x34u16..0x88, any::<u8>()), 1..3)],
        rare(prop_oneof![Just(0u64), 0u64..0x8000, any::<u64>()]),
    );
    let behaviour = (
        rare(proptest::collection::vec(any::<u8>(), 0..16)),
        0u8..24,
        prop_oneof![12 => Just(None), 1 => (0u64..200).prop_map(Some)],
        rare(0u64..40),
        rare(0u64..3),
        used_tweaks(),
    );
    (
        cfg,
        regs,
        behaviour,
        prop_oneof![3 => Just(1u16), 1 => 2u16..4],
    )
        .prop_map(
            |(
                cfg,
                (features, num_queues, queue_max, notify_off, layout, config_pokes, bar_len),
                (device_cfg, odd, all_ones_after, silent_after, ctrl_silent_after, used),
                pairs,
            )| {
                let plan = Hostile {
                    features,
                    num_queues,
                    queue_max,
                    notify_off,
                    layout,
                    config_pokes,
                    bar_len,
                    device_cfg,
                    generation_flips: odd == 0,
                    refuse_features_ok: odd == 1,
                    reset_stuck: false, // 2 s per case (RESET_TIMEOUT): model_input covers it
                    msix_stuck: odd == 2,
                    all_ones_after,
                    silent_after,
                    ctrl_silent_after,
                    used,
                };
                (cfg, plan, pairs)
            },
        )
}

fn net(pairs: u16) -> NetConfig {
    NetConfig {
        queue_pairs: pairs,
        ctrl_timeout: Duration::from_millis(2),
        ..fast_cfg(8)
    }
}

#[test]
fn fuzz_bring_up() {
    let reg = registry();
    let tally = Tally::default();
    runner()
        .run(&hostile(), |(cfg, plan, pairs)| {
            let pool = pool(&reg, 24);
            let (m, r) = open_model(&reg, &pool, cfg, plan, net(pairs));
            prop_assert!(m.dma_faults().is_empty(), "{:?}", m.dma_faults());
            match r {
                Ok(nic) => {
                    tally.add("Ok");
                    let info = *nic.info();
                    prop_assert!(info.max_queue_pairs >= 1 && info.max_queue_pairs < 0x8000);
                    prop_assert!(info.mtu.is_none_or(|m| m >= 68));
                    prop_assert_eq!(nic.pair_count(), pairs as usize);
                    let gone = nic.shutdown().is_err();
                    if !gone {
                        prop_assert_eq!(
                            pool.stats().in_use,
                            0,
                            "a confirmed reset gives every buffer back"
                        );
                    }
                }
                Err(e) => {
                    tally.add(&kind(&e));
                    // Typed and explained; a failed bring-up after a confirmed reset keeps no buffer.
                    prop_assert!(!e.to_string().is_empty());
                    if !matches!(
                        e,
                        VirtioNetError::DeviceGone { .. } | VirtioNetError::ResetTimeout { .. }
                    ) {
                        prop_assert_eq!(pool.stats().in_use, 0, "{}", e);
                    }
                }
            }
            Ok(())
        })
        .unwrap();
    // Reach: a share of the cases brings a device up, and the refusals are of many kinds
    // (the hostile input reaches every stage of bring-up, not one early check).
    tally.check("fuzz_bring_up", &[("Ok", 25)], 8);
}

#[derive(Debug, Clone)]
enum Op {
    Tx(u8, u16),
    Rx,
    Reclaim,
    Ctrl(bool),
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    let op = prop_oneof![
        3 => (1u8..10, 14u16..1600).prop_map(|(n, len)| Op::Tx(n, len)),
        3 => Just(Op::Rx),
        1 => Just(Op::Reclaim),
        1 => any::<bool>().prop_map(Op::Ctrl),
    ];
    proptest::collection::vec(op, 1..16)
}

fn burst_plan() -> impl Strategy<Value = Hostile> {
    (
        rare(20u64..400),
        rare(0u64..40),
        rare(0u64..3),
        used_tweaks(),
    )
        .prop_map(
            |(all_ones_after, silent_after, ctrl_silent_after, used)| Hostile {
                // Bring-up reads ~60 registers: all-ones mostly strikes during the bursts.
                all_ones_after: all_ones_after.map(|n| n + 60),
                silent_after: silent_after.map(|n| n + 1),
                ctrl_silent_after,
                used,
                ..Hostile::default()
            },
        )
}

#[test]
fn fuzz_rx_tx_burst() {
    let reg = registry();
    let tally = Tally::default();
    runner()
        .run(&(burst_plan(), ops()), |(plan, ops)| {
            let pool = pool(&reg, 40);
            let (m, r) = open_model(
                &reg,
                &pool,
                NetModelConfig {
                    mac: A,
                    ..Default::default()
                },
                plan,
                net(1),
            );
            let Ok(mut nic) = r else {
                tally.add("NoBringUp");
                return Ok(()); // all-ones during bring-up: fuzz_bring_up's ground
            };
            tally.add("BroughtUp");
            let max = nic.max_frame();
            let mut out = Vec::with_capacity(8);
            for op in ops {
                let r = match op {
                    Op::Tx(n, len) => {
                        let len = (len as usize).min(max);
                        let mut v: Vec<_> = (0..n)
                            .filter_map(|i| {
                                pool.get().ok().map(|mut b| {
                                    b.as_mut_slice()[12..24].copy_from_slice(&[A, A].concat());
                                    let _ = i;
                                    ubdirect_virtio_net::TxFrame::new(b, len)
                                        .map_err(|(_, e)| e)
                                        .unwrap()
                                })
                            })
                            .collect();
                        if v.is_empty() {
                            continue;
                        }
                        nic.tx_burst(&mut v)
                    }
                    Op::Rx => {
                        let r = nic.rx_burst(&mut out);
                        for f in out.drain(..) {
                            prop_assert!(
                                f.data().len() <= max,
                                "frame of {} > {}",
                                f.data().len(),
                                max
                            );
                        }
                        r
                    }
                    Op::Reclaim => nic.reclaim_tx(),
                    Op::Ctrl(on) => nic.set_promiscuous(on).map(|_| 0),
                };
                match &r {
                    Ok(_) => tally.add("Ok"),
                    Err(e) => tally.add(&kind(e)),
                }
                if let Err(e) = r {
                    prop_assert!(
                        matches!(
                            e,
                            VirtioNetError::Ring { .. }
                                | VirtioNetError::DeviceGone { .. }
                                | VirtioNetError::DeviceNeedsReset { .. }
                                | VirtioNetError::ControlTimeout { .. }
                                | VirtioNetError::ControlQueueWedged { .. }
                                | VirtioNetError::ControlCommand { .. }
                        ),
                        "unexpected error kind: {}",
                        e
                    );
                }
            }
            prop_assert!(m.dma_faults().is_empty(), "{:?}", m.dma_faults());
            if nic.shutdown().is_ok() {
                prop_assert_eq!(
                    pool.stats().in_use,
                    0,
                    "a confirmed reset gives every buffer back"
                );
            }
            Ok(())
        })
        .unwrap();
    // Reach: almost every case gets past bring-up, most operations succeed, and the device's
    // lies reach the ring and control-queue checks.
    tally.check(
        "fuzz_rx_tx_burst",
        &[
            ("BroughtUp", 90),
            ("Ok", 300),
            ("Ring", 50),
            ("ControlTimeout", 1),
            ("ControlQueueWedged", 1),
        ],
        0,
    );
}

/// Outcome counts of a fuzz run, printed (with `--nocapture`) and checked against minimums.
#[derive(Default)]
struct Tally(std::sync::Mutex<std::collections::BTreeMap<String, u64>>);

/// Below this many cases the shares are too noisy to assert (a by-hand run with few cases).
const MIN_CASES_FOR_REACH: u64 = 500;

impl Tally {
    fn add(&self, what: &str) {
        *self.0.lock().unwrap().entry(what.to_string()).or_default() += 1;
    }
    /// Print the counts; then (with enough cases) each `(outcome, percent)` must have been
    /// counted at least `percent` % of the case count, and at least `min_error_kinds` distinct
    /// error kinds seen.
    fn check(&self, target: &str, mins: &[(&str, u64)], min_error_kinds: usize) {
        let t = self.0.lock().unwrap();
        eprintln!("{target}: {t:?}");
        let cases = u64::from(fuzz_cases());
        if cases < MIN_CASES_FOR_REACH {
            return;
        }
        for &(what, pct) in mins {
            let n = t.get(what).copied().unwrap_or(0);
            assert!(
                n * 100 >= cases * pct,
                "{target}: {what} counted {n} times in {cases} cases, want at least {pct} % ({t:?})"
            );
        }
        let kinds = t
            .keys()
            .filter(|k| !matches!(k.as_str(), "Ok" | "BroughtUp" | "NoBringUp"))
            .count();
        assert!(
            kinds >= min_error_kinds,
            "{target}: {kinds} error kinds seen, want at least {min_error_kinds} ({t:?})"
        );
    }
}

fn kind(e: &VirtioNetError) -> String {
    format!("{e:?}")
        .split([' ', '(', '{'])
        .next()
        .unwrap_or("?")
        .to_string()
}
