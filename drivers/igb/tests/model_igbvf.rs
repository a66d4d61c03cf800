//! Host tests of the igb VF driver on the in-process 82576 VF model
//! (`ubdirect_devmodel::igb::vf`): the reset handshake and the MAC from the PF driver, VF-to-VF
//! frames byte-exact, MAC and VLAN requests, and every way the PF driver fails (absent, silent,
//! acknowledging without answering, refusing, answering garbage, unbound mid-run) as a typed
//! error within a bound.

mod model_support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use model_support::*;
use ubdirect_core::seams::{Nic, NicErrorKind, NicFrame};
use ubdirect_core::{UbPool, UbRegistry};
use ubdirect_devmodel::igb::vf::{connect_vfs, IgbVfConfig, IgbVfModel, PfDriver};
use ubdirect_devmodel::igb::{IgbModel, IgbModelConfig};
use ubdirect_igb::{Igb, IgbError, IgbVf, IgbVfConfig as VfConfig};

const A: [u8; 6] = [2, 0, 0, 0, 0, 0xa];
const B: [u8; 6] = [2, 0, 0, 0, 0, 0xb];
/// How long any failing open may take with the fast deadlines below (generous for a loaded
/// machine; the deadlines themselves are 5 ms).
const BOUND: Duration = Duration::from_secs(2);

/// Small rings and 5 ms deadlines.
fn fast_vf(ring: u16) -> VfConfig {
    VfConfig {
        rx_ring_size: ring,
        tx_ring_size: ring,
        reset_timeout: Duration::from_millis(5),
        mailbox_timeout: Duration::from_millis(5),
        link_timeout: Duration::from_millis(5),
        health_interval: Duration::from_millis(1),
        ..VfConfig::default()
    }
}

fn model(reg: &Arc<UbRegistry>, mac: [u8; 6], pf: PfDriver) -> Arc<IgbVfModel> {
    IgbVfModel::new(
        reg,
        IgbVfConfig {
            mac: Some(mac),
            pf,
            ..IgbVfConfig::default()
        },
    )
}

fn open(
    reg: &Arc<UbRegistry>,
    pool: &Arc<UbPool>,
    m: &Arc<IgbVfModel>,
    cfg: VfConfig,
) -> Result<IgbVf, IgbError> {
    IgbVf::from_device(reg, m.attach(reg), pool.clone(), cfg)
}

/// Opens a VF of `cfg` with `vf`, asserting it fails within [`BOUND`].
fn open_fails(cfg: IgbVfConfig, vf: VfConfig) -> (Arc<IgbVfModel>, IgbError) {
    let reg = registry();
    let pool = pool(&reg, 32);
    let m = IgbVfModel::new(&reg, cfg);
    let t = Instant::now();
    let e = open(&reg, &pool, &m, vf).err().expect("the open must fail");
    assert!(t.elapsed() < BOUND, "failed only after {:?}", t.elapsed());
    assert_eq!(pool.stats().in_use, 0, "every buffer back after {e}");
    (m, e)
}

#[test]
fn bring_up_resets_the_vf_does_the_handshake_and_takes_the_mac_from_the_pf() {
    let reg = registry();
    let pool = pool(&reg, 64);
    let m = model(&reg, A, PfDriver::Answers);
    let mut vf = open(&reg, &pool, &m, fast_vf(16)).expect("bring-up on the VF model");
    assert_eq!(vf.mac(), Some(A), "the MAC of the RESET answer");
    assert!(vf.link_up().unwrap());
    assert_eq!((m.resets(), m.mailbox_requests()), (1, 2), "RESET, SET_LPE");
    assert_eq!(vf.info().rx_buf_len, 4096);
    let q = vf.pair(0).unwrap();
    assert_eq!((q.rx_posted(), q.rx_ring_size()), (15, 16));
    vf.shutdown().expect("shutdown");
    assert_eq!(m.resets(), 2, "VF reset at shutdown");
    assert_eq!(pool.stats().in_use, 0, "every buffer back");
    assert!(m.dma_faults().is_empty(), "{:?}", m.dma_faults());
}

/// Sends frames of `lens` from `from` to `to` and checks each arrives byte-exact.
fn cross(
    pool: &Arc<UbPool>,
    (from, src): (&mut IgbVf, [u8; 6]),
    (to, dst): (&mut IgbVf, [u8; 6]),
    round: u32,
    lens: &[usize],
) {
    let mut frames: Vec<NicFrame> = lens
        .iter()
        .enumerate()
        .map(|(i, &len)| frame(pool, i * 7, len, dst, src, round * 10 + i as u32))
        .collect();
    let sent: Vec<Vec<u8>> = frames.iter().map(|f| f.data().to_vec()).collect();
    let n = lens.len();
    assert_eq!(from.pair(0).unwrap().tx_burst(&mut frames).unwrap(), n);
    let got = recv(&mut to.pair(0).unwrap(), n);
    for (g, s) in got.iter().zip(&sent) {
        assert_eq!(g.data(), &s[..], "round {round}: byte-exact");
    }
}

#[test]
fn frames_cross_from_vf_to_vf_byte_exact_and_the_rings_wrap() {
    let reg = registry();
    let pool = pool(&reg, 256);
    let (ma, mb) = (
        model(&reg, A, PfDriver::Answers),
        model(&reg, B, PfDriver::Answers),
    );
    connect_vfs(&ma, &mb);
    let mut a = open(&reg, &pool, &ma, fast_vf(8)).unwrap();
    let mut b = open(&reg, &pool, &mb, fast_vf(8)).unwrap();
    for round in 0..30u32 {
        let lens: Vec<usize> = (0..5)
            .map(|i| [60, 64, 333, 1514, 1518][(i + round as usize) % 5])
            .collect();
        cross(&pool, (&mut a, A), (&mut b, B), round, &lens);
        cross(&pool, (&mut b, B), (&mut a, A), round, &lens);
    }
    assert_eq!(a.stats().rx_packets, 150);
    assert_eq!(b.stats().rx_packets, 150);
    assert_eq!(ma.frames(), (150, 150));
    drop((a, b));
    assert_eq!(pool.stats().in_use, 0);
    assert!(ma.dma_faults().is_empty() && mb.dma_faults().is_empty());
}

#[test]
fn a_vf_works_through_the_nic_seam() {
    let reg = registry();
    let pool = pool(&reg, 64);
    let m = model(&reg, A, PfDriver::Answers);
    let mut vf = open(&reg, &pool, &m, fast_vf(16)).unwrap();
    let nic: &mut dyn Nic = &mut vf;
    assert_eq!(
        (nic.driver(), nic.mac(), nic.pair_count()),
        ("igb-vf", Some(A), 1)
    );
    assert_eq!(nic.link_up().unwrap(), Some(true));
    let mut q = nic.queue(0).unwrap();
    let mut out = vec![frame(&pool, 0, 100, A, B, 9)];
    let want = out[0].data().to_vec();
    assert_eq!(q.tx_burst(&mut out).unwrap(), 1);
    let mut got = Vec::with_capacity(4);
    let t = Instant::now();
    while got.is_empty() && t.elapsed() < BOUND {
        q.rx_burst(&mut got).unwrap();
    }
    assert_eq!(got[0].data(), &want[..], "looped back to itself");
}

#[test]
fn set_mac_and_set_vlan_reach_the_pf_driver_and_the_new_mac_receives() {
    let reg = registry();
    let pool = pool(&reg, 64);
    let m = model(&reg, A, PfDriver::Answers);
    let cfg = VfConfig {
        mac: Some(B),
        vlans: vec![5, 100],
        ..fast_vf(16)
    };
    let mut vf = open(&reg, &pool, &m, cfg).unwrap();
    assert_eq!((vf.mac(), m.mac()), (Some(B), Some(B)));
    assert_eq!(m.vlans(), vec![5, 100]);
    vf.set_vlan(5, false).unwrap();
    assert_eq!(m.vlans(), vec![100]);
    vf.set_mac([2, 0, 0, 0, 0, 0xc]).unwrap();
    assert_eq!(m.mac(), Some([2, 0, 0, 0, 0, 0xc]));
    let mut f = [0u8; 64];
    f[..6].copy_from_slice(&A);
    m.inject(&f);
    f[..6].copy_from_slice(&[2, 0, 0, 0, 0, 0xc]);
    f[20] = 0x77;
    m.inject(&f);
    let got = recv(&mut vf.pair(0).unwrap(), 1);
    assert_eq!(got[0].data()[20], 0x77, "only the frame to the new MAC");
    assert!(matches!(
        vf.set_vlan(4096, true),
        Err(IgbError::InvalidConfig(_))
    ));
    assert!(matches!(
        vf.set_mac([1, 0, 0, 0, 0, 1]),
        Err(IgbError::InvalidConfig(_))
    ));
    assert_eq!(
        m.mailbox_requests(),
        7,
        "RESET, SET_LPE, 2 SET_MAC, 3 SET_VLAN; nothing invalid sent"
    );
}

#[test]
fn a_pf_without_its_driver_is_a_clear_error_within_the_deadline() {
    let cfg = IgbVfConfig {
        pf: PfDriver::Gone,
        ..IgbVfConfig::default()
    };
    let (m, e) = open_fails(cfg, fast_vf(16));
    assert!(matches!(e, IgbError::PfNotReady { .. }), "{e}");
    assert!(
        e.to_string()
            .contains("bind the kernel igb driver to the PF"),
        "{e}"
    );
    assert_eq!(e.nic_kind(), NicErrorKind::DeviceGone);
    assert_eq!(m.mailbox_requests(), 0, "nothing posted to a PF in reset");
}

#[test]
fn a_pf_driver_that_never_answers_is_a_mailbox_timeout_naming_the_stage() {
    for (pf, stage) in [(PfDriver::Silent, "PFACK"), (PfDriver::AckOnly, "PFSTS")] {
        let cfg = IgbVfConfig {
            pf,
            ..IgbVfConfig::default()
        };
        let (_, e) = open_fails(cfg, fast_vf(16));
        let IgbError::MailboxTimeout {
            request,
            stage: s,
            waited,
            ..
        } = &e
        else {
            panic!("{e}");
        };
        assert_eq!((*request, *waited), ("RESET", Duration::from_millis(5)));
        assert!(s.contains(stage), "{e}");
        assert!(
            e.to_string()
                .contains("is the igb kernel driver bound to the PF"),
            "{e}"
        );
    }
}

#[test]
fn nacks_name_the_request_refused() {
    let locked = IgbVfConfig {
        mac_locked: true,
        ..IgbVfConfig::default()
    };
    let want_b = VfConfig {
        mac: Some(B),
        ..fast_vf(16)
    };
    let (_, e) = open_fails(locked, want_b);
    assert!(
        matches!(
            e,
            IgbError::MailboxNack {
                request: "SET_MAC_ADDR",
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("ip link set"), "{e}");
    let refused = IgbVfConfig {
        vlan_refused: true,
        ..IgbVfConfig::default()
    };
    let vlan = VfConfig {
        vlans: vec![7],
        ..fast_vf(16)
    };
    let (_, e) = open_fails(refused, vlan);
    assert!(
        matches!(
            e,
            IgbError::MailboxNack {
                request: "SET_VLAN",
                ..
            }
        ),
        "{e}"
    );
    // A RESET NACK means the PF driver has no MAC for the VF: the VF opens without one.
    let reg = registry();
    let pool = pool(&reg, 32);
    let m = model(&reg, A, PfDriver::NackAll);
    let mut vf = open(&reg, &pool, &m, fast_vf(16)).unwrap();
    assert_eq!(vf.mac(), None);
    assert_eq!(
        vf.info().max_frame,
        1514,
        "SET_LPE refused: the pool limit stays"
    );
    let e = vf.set_vlan(3, true).unwrap_err();
    assert!(
        matches!(
            e,
            IgbError::MailboxNack {
                request: "SET_VLAN",
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn pf_control_messages_before_an_answer_are_passed_over() {
    let reg = registry();
    let pool = pool(&reg, 64);
    let cfg = IgbVfConfig {
        mac: Some(A),
        ping_first: true,
        ..IgbVfConfig::default()
    };
    let m = IgbVfModel::new(&reg, cfg);
    let ask = VfConfig {
        vlans: vec![3],
        ..fast_vf(16)
    };
    let vf = open(&reg, &pool, &m, ask).expect("pings are not answers");
    assert_eq!(
        (vf.mac(), vf.info().max_frame, m.vlans()),
        (Some(A), 1518, vec![3])
    );
}

#[test]
fn garbage_answers_are_typed_errors() {
    let cases: [(Vec<u32>, &str); 4] = [
        (vec![0x1234_0005 | 0x8000_0000], "another request"),
        (vec![0x01], "neither ACK nor NACK"),
        (vec![0xc000_0001], "neither ACK nor NACK"),
        (vec![0x8000_0001, 0xffff_ffff, 0xffff], "zero or multicast"),
    ];
    for (reply, what) in cases {
        let cfg = IgbVfConfig {
            pf: PfDriver::Garbage {
                reply,
                pfack: true,
                pfsts: true,
            },
            ..IgbVfConfig::default()
        };
        let (_, e) = open_fails(cfg, fast_vf(16));
        assert!(
            matches!(
                e,
                IgbError::MailboxGarbage {
                    request: "RESET",
                    ..
                }
            ),
            "{e}"
        );
        assert!(e.to_string().contains(what), "{e}");
        assert_eq!(e.nic_kind(), NicErrorKind::Protocol);
    }
}

#[test]
fn the_pf_driver_unbound_mid_run_stops_the_vf_with_a_clear_error() {
    let reg = registry();
    let pool = pool(&reg, 64);
    let m = model(&reg, A, PfDriver::Answers);
    let mut vf = open(&reg, &pool, &m, fast_vf(16)).unwrap();
    let mut f = vec![frame(&pool, 0, 60, A, A, 1)];
    vf.pair(0).unwrap().tx_burst(&mut f).unwrap();
    recv(&mut vf.pair(0).unwrap(), 1);
    m.unbind_pf();
    std::thread::sleep(Duration::from_millis(3));
    let mut out = Vec::with_capacity(4);
    let mut q = vf.pair(0).unwrap();
    let t = Instant::now();
    let e = loop {
        if let Err(e) = q.rx_burst(&mut out) {
            break e;
        }
        assert!(t.elapsed() < BOUND, "an idle burst probes the VF");
    };
    assert!(matches!(e, IgbError::DeviceGone { .. }), "{e}");
    assert!(e.to_string().contains("igb driver unbound"), "{e}");
    let e2 = q.rx_burst(&mut out).unwrap_err();
    assert_eq!(e2.to_string(), e.to_string(), "sticky");
    let t = Instant::now();
    let e = vf.set_vlan(9, true).unwrap_err();
    assert!(t.elapsed() < BOUND);
    assert!(
        matches!(
            e,
            IgbError::MailboxTimeout {
                request: "SET_VLAN",
                ..
            }
        ),
        "{e}"
    );
    vf.shutdown().expect("the VF's queues read stopped");
    assert_eq!(pool.stats().in_use, 0);
}

#[test]
fn a_pf_reset_that_leaves_the_vf_queues_enabled_is_seen_in_the_mailbox() {
    let reg = registry();
    let pool = pool(&reg, 64);
    let m = model(&reg, A, PfDriver::Answers);
    let mut vf = open(&reg, &pool, &m, fast_vf(16)).unwrap();
    m.pf_down();
    let mut out = Vec::with_capacity(4);
    let mut q = vf.pair(0).unwrap();
    let e = q.check_health().unwrap_err();
    assert!(matches!(e, IgbError::DeviceGone { .. }), "{e}");
    assert!(e.to_string().contains("RSTI"), "{e}");
    assert_eq!(
        q.rx_burst(&mut out).unwrap_err().to_string(),
        e.to_string(),
        "sticky"
    );
    drop(vf);
    let t = Instant::now();
    let e = open(&reg, &pool, &m, fast_vf(16)).err().expect("PF down");
    assert!(matches!(e, IgbError::PfNotReady { .. }), "{e}");
    assert!(t.elapsed() < BOUND);
    assert_eq!(pool.stats().in_use, 0);
}

#[test]
fn each_driver_refuses_the_other_function() {
    let reg = registry();
    let pool = pool(&reg, 32);
    let pf = IgbModel::new(&reg, IgbModelConfig::default());
    let e = IgbVf::from_device(&reg, pf.attach(&reg), pool.clone(), fast_vf(16))
        .err()
        .expect("refused");
    assert!(
        matches!(e, IgbError::NotIgbVf { device: 0x10c9, .. }),
        "{e}"
    );
    assert!(e.to_string().contains("open it with Igb::open"), "{e}");
    let vf = model(&reg, A, PfDriver::Answers);
    let e = Igb::from_device(&reg, vf.attach(&reg), pool.clone(), fast_cfg(16))
        .err()
        .expect("refused");
    assert!(matches!(e, IgbError::VirtualFunction { .. }), "{e}");
    let small = IgbVfConfig {
        bar_len: Some(0x1000),
        ..IgbVfConfig::default()
    };
    let (_, e) = open_fails(small, fast_vf(16));
    assert!(matches!(e, IgbError::BarTooSmall { .. }), "{e}");
}

#[test]
fn a_second_driver_on_an_open_vf_is_refused_and_the_first_keeps_running() {
    let reg = registry();
    let pool = pool(&reg, 64);
    let m = model(&reg, A, PfDriver::Answers);
    let dev = m.attach(&reg);
    let mut vf = IgbVf::from_device(&reg, dev.clone(), pool.clone(), fast_vf(16)).unwrap();
    let e = IgbVf::from_device(&reg, dev, pool.clone(), fast_vf(16))
        .err()
        .expect("refused");
    assert!(e.to_string().contains("igb-vf"), "{e}");
    let mut f = vec![frame(&pool, 0, 60, A, A, 1)];
    vf.pair(0).unwrap().tx_burst(&mut f).unwrap();
    recv(&mut vf.pair(0).unwrap(), 1);
}

#[test]
fn bad_vf_options_are_refused_before_the_device_is_touched() {
    for cfg in [
        VfConfig {
            mailbox_timeout: Duration::ZERO,
            ..fast_vf(16)
        },
        VfConfig {
            mac: Some([0; 6]),
            ..fast_vf(16)
        },
        VfConfig {
            vlans: vec![4096],
            ..fast_vf(16)
        },
        VfConfig {
            rx_ring_size: 12,
            ..fast_vf(16)
        },
    ] {
        let reg = registry();
        let pool = pool(&reg, 32);
        let m = model(&reg, A, PfDriver::Answers);
        let e = open(&reg, &pool, &m, cfg).err().expect("refused");
        assert!(matches!(e, IgbError::InvalidConfig(_)), "{e}");
        assert_eq!(m.resets(), 0);
    }
}
