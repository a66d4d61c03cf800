//! Fuzz targets of the igb driver on a hostile 82576 model (proptest on stable; 10,000 cases
//! each by default, `UBD_FUZZ_CASES=1000000` by hand):
//!
//! - `fuzz_bring_up`: any MAC registers, ring-length mask, BAR length, stuck reset, mute PHY,
//!   queues that never enable, all-ones from any read on, a cable that is out: `Igb::open`
//!   returns a working device or a typed error, never panics or hangs, never aims the device's
//!   DMA outside driver memory, and gives every buffer back after a confirmed reset.
//! - `fuzz_rx_tx_burst`: a device that brings up fine, then writes back any RX length and
//!   status word, reports any head pointer, never writes TX DD, stops answering or reads
//!   all-ones: every burst returns frames within their bounds or a typed error.
//! - `fuzz_vf_mailbox`: a VF whose PF driver answers any words (of any type, with any of ACK,
//!   NACK and CTS, with or without PFACK and PFSTS, maybe after a control message), is absent, silent, acknowledges without
//!   answering, refuses everything, or is unbound or goes down mid-run, under any MAC and VLAN
//!   requests: `IgbVf::open`, `set_mac`, `set_vlan`, the bursts and the health probe return
//!   within a bound with a result or a typed error, a MAC taken from the mailbox is always
//!   unicast, and every buffer comes back.

mod model_support;

use std::time::Duration;

use model_support::*;
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use proptest::test_runner::{Config, RngSeed, TestRunner};
use ubdirect_devmodel::igb::vf::{IgbVfConfig, IgbVfModel, PfDriver};
use ubdirect_devmodel::igb::{IgbHostile, IgbModelConfig, RxTweak};
use ubdirect_igb::{IgbConfig, IgbError, IgbVf, IgbVfConfig as VfConfig};

const A: [u8; 6] = [2, 0, 0, 0, 0, 0xa];

fn runner() -> TestRunner {
    TestRunner::new(Config {
        cases: fuzz_cases(),
        rng_seed: RngSeed::Fixed(ubdirect_devmodel::fuzz::seed()),
        failure_persistence: None,
        ..Config::default()
    })
}

fn rare<T: std::fmt::Debug + Clone + 'static>(
    s: impl Strategy<Value = T> + 'static,
) -> impl Strategy<Value = Option<T>> {
    prop_oneof![8 => Just(None), 1 => s.prop_map(Some)]
}

/// 1 ms deadlines: a stuck reset or a missing link costs a millisecond per case.
fn igb_cfg(ring: u16) -> IgbConfig {
    IgbConfig {
        reset_timeout: Duration::from_millis(1),
        link_timeout: Duration::from_millis(1),
        ..fast_cfg(ring)
    }
}

fn bring_up_plan() -> impl Strategy<Value = (IgbHostile, bool, u16)> {
    (
        (
            rare(0u64..80),
            rare((any::<u32>(), any::<u32>())),
            rare(prop_oneof![Just(0xffff0u32), any::<u32>()]),
            rare(prop_oneof![Just(0u64), 0u64..0x40000]),
        ),
        (0u8..40, prop_oneof![8 => Just(true), 1 => Just(false)]),
        prop_oneof![Just(8u16), Just(16), (1u16..17).prop_map(|n| n * 8)],
    )
        .prop_map(
            |((all_ones_after, mac_regs, ring_len_mask, bar_len), (odd, cable), ring)| {
                let plan = IgbHostile {
                    all_ones_after,
                    mac_regs,
                    ring_len_mask,
                    bar_len,
                    reset_stuck: odd == 0,
                    mdic_error: odd == 1,
                    queue_enable_stuck: odd == 2,
                    ..IgbHostile::default()
                };
                (plan, cable, ring)
            },
        )
}

#[test]
fn fuzz_bring_up() {
    let reg = registry();
    let tally = Tally::default();
    runner()
        .run(&bring_up_plan(), |(plan, cable, ring)| {
            let ones_after = plan.all_ones_after;
            let pool = pool(&reg, 136);
            let cfg = IgbModelConfig {
                mac: A,
                link_up: cable,
                ..IgbModelConfig::default()
            };
            let (m, r) = open_model(&reg, &pool, cfg, plan, igb_cfg(ring));
            prop_assert!(m.dma_faults().is_empty(), "{:?}", m.dma_faults());
            // A device reading all-ones by the end cannot confirm the last reset: its
            // buffers stay out of the pool on purpose.
            let gone = ones_after.is_some_and(|n| m.reads() > n);
            match r {
                Ok(nic) => {
                    tally.add("Ok");
                    prop_assert!(nic.mac().is_none_or(|m| m != [0; 6] && m != [0xff; 6]));
                    if nic.shutdown().is_ok() {
                        prop_assert!(!gone);
                        prop_assert_eq!(pool.stats().in_use, 0);
                    }
                }
                Err(e) => {
                    tally.add(&kind(&e));
                    prop_assert!(!e.to_string().is_empty());
                    if !gone && !matches!(e, IgbError::ResetTimeout { .. }) {
                        prop_assert_eq!(pool.stats().in_use, 0, "{}", e);
                    }
                }
            }
            Ok(())
        })
        .unwrap();
    tally.print("fuzz_bring_up");
}

#[derive(Debug, Clone)]
enum Op {
    Tx(u8, u16, u16),
    Rx,
    Reclaim,
    Inject(u16),
    Health,
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    let op = prop_oneof![
        3 => (1u8..10, 0u16..1700, 0u16..600).prop_map(|(n, len, off)| Op::Tx(n, len, off)),
        3 => Just(Op::Rx),
        1 => Just(Op::Reclaim),
        2 => (0u16..6000).prop_map(Op::Inject),
        1 => Just(Op::Health),
    ];
    proptest::collection::vec(op, 1..20)
}

fn rx_tweaks() -> impl Strategy<Value = Vec<RxTweak>> {
    let one = prop_oneof![
        4 => Just(RxTweak::default()),
        1 => (
            proptest::option::of(prop_oneof![any::<u16>(), 0u16..64, 4090u16..4200]),
            proptest::option::of(prop_oneof![any::<u32>(), 0u32..4])
        )
            .prop_map(|(len, status)| RxTweak { len, status }),
    ];
    proptest::collection::vec(one, 0..24)
}

fn burst_plan() -> impl Strategy<Value = IgbHostile> {
    (
        rare(0u64..400),
        rare(prop_oneof![0u32..16, any::<u32>()]),
        prop_oneof![8 => Just(false), 1 => Just(true)],
        rare(0u64..20),
        rx_tweaks(),
    )
        .prop_map(
            |(all_ones_after, head, tx_never_done, silent_after, rx)| IgbHostile {
                // Bring-up reads ~40 registers: all-ones mostly strikes during the bursts.
                all_ones_after: all_ones_after.map(|n| n + 60),
                head,
                tx_never_done,
                silent_after: silent_after.map(|n| n + 1),
                rx,
                ..IgbHostile::default()
            },
        )
}

fn run_op(
    nic: &mut ubdirect_igb::Igb,
    m: &ubdirect_devmodel::igb::IgbModel,
    pool: &std::sync::Arc<ubdirect_core::UbPool>,
    op: Op,
    out: &mut Vec<ubdirect_core::seams::NicFrame>,
) -> Result<usize, IgbError> {
    let buf = nic.info().rx_buf_len;
    let mut q = nic.pair(0).expect("pair 0");
    match op {
        Op::Tx(n, len, off) => {
            let mut v: Vec<_> = (0..n)
                .filter_map(|i| {
                    let off = off as usize;
                    let len = (len as usize).min(4096 - off);
                    pool.get().ok().map(|b| {
                        let _ = i;
                        ubdirect_core::seams::NicFrame::new(b, off, len)
                            .map_err(|(_, e)| e)
                            .expect("fits")
                    })
                })
                .collect();
            if v.is_empty() {
                return Ok(0);
            }
            q.tx_burst(&mut v)
        }
        Op::Rx => {
            let r = q.rx_burst(out);
            for f in out.drain(..) {
                assert!(
                    f.len() >= 14 && f.len() <= buf,
                    "frame of {} bytes",
                    f.len()
                );
            }
            r
        }
        Op::Reclaim => q.reclaim_tx(),
        Op::Inject(len) => {
            m.inject(&vec![0x42; len as usize]);
            Ok(0)
        }
        Op::Health => q.check_health().map(|_| 0),
    }
}

#[test]
fn fuzz_rx_tx_burst() {
    let reg = registry();
    let tally = Tally::default();
    runner()
        .run(&(burst_plan(), ops()), |(plan, ops)| {
            let pool = pool(&reg, 40);
            let cfg = IgbModelConfig {
                mac: A,
                ..IgbModelConfig::default()
            };
            let (m, r) = open_model(&reg, &pool, cfg, plan, igb_cfg(16));
            let Ok(mut nic) = r else {
                return Ok(()); // all-ones during bring-up: fuzz_bring_up's ground
            };
            let mut out = Vec::with_capacity(8);
            for op in ops {
                let r = run_op(&mut nic, &m, &pool, op, &mut out);
                match &r {
                    Ok(_) => tally.add("Ok"),
                    Err(e) => tally.add(&kind(e)),
                }
                if let Err(e) = r {
                    prop_assert!(
                        matches!(
                            e,
                            IgbError::BadRxLength { .. }
                                | IgbError::HeadOutOfRange { .. }
                                | IgbError::DeviceGone { .. }
                                | IgbError::LinkDown { .. }
                                | IgbError::FrameTooLarge { .. }
                                | IgbError::FrameTooShort { .. }
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
    tally.print("fuzz_rx_tx_burst");
}

/// Outcome counts of a fuzz run (printed with `--nocapture`: shows the input reaches past
/// bring-up).
#[derive(Default)]
struct Tally(std::sync::Mutex<std::collections::BTreeMap<String, u64>>);

impl Tally {
    fn add(&self, what: &str) {
        *self.0.lock().unwrap().entry(what.to_string()).or_default() += 1;
    }
    fn print(&self, target: &str) {
        eprintln!("{target}: {:?}", self.0.lock().unwrap());
    }
}

fn kind(e: &IgbError) -> String {
    format!("{e:?}")
        .split([' ', '(', '{'])
        .next()
        .unwrap_or("?")
        .to_string()
}

fn mailbox_word() -> impl Strategy<Value = u32> {
    let ty = prop_oneof![
        Just(1u32),
        Just(2),
        Just(4),
        Just(3),
        Just(0),
        any::<u16>().prop_map(u32::from)
    ];
    let flags = prop_oneof![
        Just(0u32),
        Just(0x8000_0000),
        Just(0x4000_0000),
        Just(0xc000_0000),
        Just(0xa000_0000),
        Just(0x6000_0000),
    ];
    prop_oneof![
        2 => any::<u32>(),
        3 => (ty, flags, 0u32..3).prop_map(|(t, f, info)| t | f | (info << 16)),
    ]
}

fn pf_driver() -> impl Strategy<Value = PfDriver> {
    let garbage = (
        proptest::collection::vec(mailbox_word(), 0..5),
        prop_oneof![4 => Just(true), 1 => Just(false)],
        prop_oneof![4 => Just(true), 1 => Just(false)],
    )
        .prop_map(|(reply, pfack, pfsts)| PfDriver::Garbage {
            reply,
            pfack,
            pfsts,
        });
    prop_oneof![
        4 => Just(PfDriver::Answers),
        1 => Just(PfDriver::Gone),
        1 => Just(PfDriver::Silent),
        1 => Just(PfDriver::AckOnly),
        1 => Just(PfDriver::NackAll),
        4 => garbage,
    ]
}

#[derive(Debug, Clone)]
enum VfOp {
    SetMac([u8; 6]),
    SetVlan(u16, bool),
    Unbind,
    PfDown,
    Health,
    Loop(u16),
}

fn vf_plan() -> impl Strategy<Value = (IgbVfConfig, VfConfigAsk, Vec<VfOp>)> {
    let mac = prop_oneof![
        3 => Just([2u8, 0, 0, 0, 0, 0xa]),
        1 => any::<[u8; 6]>(),
        1 => Just([0u8; 6]),
    ];
    let model = (
        pf_driver(),
        proptest::option::of(mac.clone()),
        any::<[bool; 3]>(),
    )
        .prop_map(
            |(pf, mac, [mac_locked, vlan_refused, ping_first])| IgbVfConfig {
                pf,
                mac,
                mac_locked,
                vlan_refused,
                ping_first,
                ..IgbVfConfig::default()
            },
        );
    let ask = (
        rare(mac.clone()),
        proptest::collection::vec(prop_oneof![0u16..10, 4090u16..4097], 0..3),
    );
    let op = prop_oneof![
        2 => mac.prop_map(VfOp::SetMac),
        2 => (prop_oneof![0u16..10, 4090u16..4097], any::<bool>()).prop_map(|(v, on)| VfOp::SetVlan(v, on)),
        1 => Just(VfOp::Unbind),
        1 => Just(VfOp::PfDown),
        1 => Just(VfOp::Health),
        3 => (14u16..1600).prop_map(VfOp::Loop),
    ];
    (model, ask, proptest::collection::vec(op, 0..6))
}

/// What the driver is asked for at open: a MAC and VLANs.
type VfConfigAsk = (Option<[u8; 6]>, Vec<u16>);

fn vf_error_ok(e: &IgbError) -> bool {
    matches!(
        e,
        IgbError::PfNotReady { .. }
            | IgbError::MailboxTimeout { .. }
            | IgbError::MailboxNack { .. }
            | IgbError::MailboxGarbage { .. }
            | IgbError::InvalidConfig(_)
            | IgbError::DeviceGone { .. }
            | IgbError::FrameTooLarge { .. }
    )
}

fn run_vf_op(
    vf: &mut IgbVf,
    m: &IgbVfModel,
    pool: &std::sync::Arc<ubdirect_core::UbPool>,
    op: VfOp,
) -> Result<(), IgbError> {
    match op {
        VfOp::SetMac(mac) => vf.set_mac(mac),
        VfOp::SetVlan(v, on) => vf.set_vlan(v, on),
        VfOp::Unbind => {
            m.unbind_pf();
            Ok(())
        }
        VfOp::PfDown => {
            m.pf_down();
            Ok(())
        }
        VfOp::Health => vf.pair(0).expect("pair 0").check_health(),
        VfOp::Loop(len) => {
            let dst = vf.mac().unwrap_or([0xff; 6]);
            let mut f = vec![frame(pool, 0, len as usize, dst, dst, 1)];
            let mut q = vf.pair(0).expect("pair 0");
            q.tx_burst(&mut f)?;
            let mut out = Vec::with_capacity(4);
            q.rx_burst(&mut out)?;
            for f in &out {
                assert!(f.len() >= 14 && f.len() <= 4096, "frame of {}", f.len());
            }
            Ok(())
        }
    }
}

#[test]
fn fuzz_vf_mailbox() {
    let reg = registry();
    let tally = Tally::default();
    let vf_cfg = |(mac, vlans): VfConfigAsk| VfConfig {
        mac,
        vlans,
        rx_ring_size: 16,
        tx_ring_size: 16,
        reset_timeout: Duration::from_millis(1),
        mailbox_timeout: Duration::from_millis(1),
        link_timeout: Duration::from_millis(1),
        health_interval: Duration::from_millis(1),
    };
    runner()
        .run(&vf_plan(), |(model, ask, ops)| {
            let pool = pool(&reg, 40);
            let m = IgbVfModel::new(&reg, model);
            let t = std::time::Instant::now();
            let r = IgbVf::from_device(&reg, m.attach(&reg), pool.clone(), vf_cfg(ask));
            prop_assert!(
                t.elapsed() < Duration::from_secs(2),
                "open took {:?}",
                t.elapsed()
            );
            let mut vf = match r {
                Ok(vf) => vf,
                Err(e) => {
                    tally.add(&kind(&e));
                    prop_assert!(vf_error_ok(&e), "unexpected error: {}", e);
                    prop_assert_eq!(pool.stats().in_use, 0, "{}", e);
                    return Ok(());
                }
            };
            tally.add("Ok");
            prop_assert!(vf.mac().is_none_or(|m| m != [0; 6] && m[0] & 1 == 0));
            for op in ops {
                let t = std::time::Instant::now();
                if let Err(e) = run_vf_op(&mut vf, &m, &pool, op) {
                    tally.add(&kind(&e));
                    prop_assert!(vf_error_ok(&e), "unexpected error: {}", e);
                }
                prop_assert!(t.elapsed() < Duration::from_secs(2));
            }
            prop_assert!(m.dma_faults().is_empty(), "{:?}", m.dma_faults());
            vf.shutdown()
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(pool.stats().in_use, 0);
            Ok(())
        })
        .unwrap();
    tally.print("fuzz_vf_mailbox");
}
