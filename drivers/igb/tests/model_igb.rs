//! Host tests of the real igb driver on the in-process 82576 model
//! (`ubdirect_devmodel::igb`): bring-up, PF-to-PF frames byte-exact through two connected
//! models, ring wrap, statistics, refusals (bad sizes, exhausted pools and rings), and a
//! device that misbehaves, loses its link or disappears.

mod model_support;

use std::time::Duration;

use model_support::*;
use ubdirect_core::seams::{Nic, NicErrorKind, NicFrame};
use ubdirect_devmodel::igb::{connect, IgbHostile, IgbModel, IgbModelConfig, RxTweak};
use ubdirect_igb::{Igb, IgbConfig, IgbError};

const A: [u8; 6] = [2, 0, 0, 0, 0, 0xa];
const B: [u8; 6] = [2, 0, 0, 0, 0, 0xb];

fn cfg(mac: [u8; 6]) -> IgbModelConfig {
    IgbModelConfig {
        mac,
        ..IgbModelConfig::default()
    }
}

fn pair_of_nics(
    reg: &std::sync::Arc<ubdirect_core::UbRegistry>,
    pool: &std::sync::Arc<ubdirect_core::UbPool>,
    ring: u16,
) -> (std::sync::Arc<IgbModel>, Igb, std::sync::Arc<IgbModel>, Igb) {
    let ma = IgbModel::new(reg, cfg(A));
    let mb = IgbModel::new(reg, cfg(B));
    connect(&ma, &mb);
    let a = Igb::from_device(reg, ma.attach(reg), pool.clone(), fast_cfg(ring)).unwrap();
    let b = Igb::from_device(reg, mb.attach(reg), pool.clone(), fast_cfg(ring)).unwrap();
    (ma, a, mb, b)
}

#[test]
fn bring_up_reads_the_mac_masks_interrupts_links_and_fills_the_rx_ring() {
    let reg = registry();
    let pool = pool(&reg, 64);
    let (m, nic) = open_model(&reg, &pool, cfg(A), IgbHostile::default(), fast_cfg(16));
    let mut nic = nic.expect("bring-up on the model");
    assert_eq!(nic.mac(), Some(A));
    assert!(nic.link_up().unwrap());
    assert_eq!(nic.info().rx_buf_len, 4096);
    let q = nic.pair(0).unwrap();
    assert_eq!(
        (q.rx_posted(), q.rx_ring_size()),
        (15, 16),
        "one slot stays empty"
    );
    assert_eq!(m.reg(0x00d0), 0, "IMS: every interrupt masked");
    assert_eq!(m.reg(0xc018), 15, "RDT");
    assert_eq!(
        m.reg(0xc00c) & 0x0e00_007f,
        0x0200_0004,
        "SRRCTL: advanced one-buffer, 4 KiB"
    );
    assert_eq!(
        m.reg(0x0100) & 0x0400_801a,
        0x0400_801a,
        "RCTL: EN, UPE, MPE, BAM, SECRC"
    );
    assert_eq!(m.stats().resets, 1);
    nic.shutdown().expect("shutdown");
    assert_eq!(m.stats().resets, 2, "reset at shutdown");
    assert_eq!(pool.stats().in_use, 0, "every buffer back");
    assert!(m.dma_faults().is_empty(), "{:?}", m.dma_faults());
}

#[test]
fn frames_cross_from_pf_to_pf_byte_exact_and_the_rings_wrap() {
    let reg = registry();
    let pool = pool(&reg, 256);
    let (ma, mut a, mb, mut b) = pair_of_nics(&reg, &pool, 8);
    let mut octets = 0;
    for round in 0..30u32 {
        // 5 frames per burst on 8-entry rings (7 usable): both rings wrap many times.
        let lens: Vec<usize> = (0..5)
            .map(|i| 60 + ((round as usize * 97 + i * 331) % 1459))
            .collect();
        let mut v: Vec<NicFrame> = lens
            .iter()
            .enumerate()
            .map(|(i, &l)| frame(&pool, (i * 64) % 512, l, B, A, round * 5 + i as u32))
            .collect();
        let sent: Vec<Vec<u8>> = v.iter().map(|f| f.data().to_vec()).collect();
        let mut qa = a.pair(0).unwrap();
        assert_eq!(qa.tx_burst(&mut v).unwrap(), 5);
        let got = recv(&mut b.pair(0).unwrap(), 5);
        for (i, f) in got.iter().enumerate() {
            assert_eq!(f.offset(), 0);
            assert_eq!(f.data(), &sent[i][..], "frame {i} of round {round}");
            octets += f.len() as u64 + 4;
        }
        qa.reclaim_tx().unwrap();
    }
    assert_eq!(a.stats().tx_packets, 150);
    assert_eq!(b.stats().rx_packets, 150);
    assert_eq!((ma.stats().tx_frames, mb.stats().rx_frames), (150, 150));
    let (ha, hb) = (a.hw_stats().unwrap(), b.hw_stats().unwrap());
    assert_eq!((ha.good_tx_packets, ha.good_tx_octets), (150, octets));
    assert_eq!((hb.good_rx_packets, hb.good_rx_octets), (150, octets));
    assert_eq!(
        b.hw_stats().unwrap().good_rx_packets,
        150,
        "clear-on-read counters accumulate"
    );
    drop((a, b));
    assert_eq!(pool.stats().in_use, 0);
    assert!(ma.dma_faults().is_empty() && mb.dma_faults().is_empty());
}

#[test]
fn a_runt_arrives_padded_to_60_bytes_and_echo_works_without_a_peer() {
    let reg = registry();
    let pool = pool(&reg, 64);
    let (_m, nic) = open_model(&reg, &pool, cfg(A), IgbHostile::default(), fast_cfg(16));
    let mut nic = nic.unwrap();
    let mut q = nic.pair(0).unwrap();
    let mut v = vec![frame(&pool, 0, 20, A, A, 9)];
    let sent = v[0].data().to_vec();
    q.tx_burst(&mut v).unwrap();
    let got = recv(&mut q, 1);
    assert_eq!(got[0].len(), 60);
    assert_eq!(&got[0].data()[..20], &sent[..]);
    assert!(got[0].data()[20..].iter().all(|&b| b == 0));
}

#[test]
fn a_full_tx_ring_keeps_the_unsent_frames_in_order() {
    let reg = registry();
    let pool = pool(&reg, 128);
    let (_ma, mut a, _mb, mut b) = pair_of_nics(&reg, &pool, 8);
    // b's RX ring is not drained, so its device holds frames on the wire; a's TX ring (7 usable)
    // completes at once, so fill it without reclaiming by sending more than 7 in one burst.
    let mut v: Vec<NicFrame> = (0..12).map(|i| frame(&pool, 0, 64, B, A, i)).collect();
    let ids: Vec<u8> = v.iter().map(|f| f.data()[14]).collect();
    let mut qa = a.pair(0).unwrap();
    assert_eq!(qa.tx_burst(&mut v).unwrap(), 7);
    assert_eq!(v.len(), 5);
    assert_eq!(v[0].data()[14], ids[7], "the unsent frames stay in order");
    assert_eq!(qa.stats().tx_ring_full, 1);
    assert_eq!(
        qa.tx_burst(&mut v).unwrap(),
        5,
        "room again once DD is seen"
    );

    assert_eq!(recv(&mut b.pair(0).unwrap(), 12).len(), 12);
}

#[test]
fn bad_frame_sizes_and_empty_bursts_are_refused_with_nothing_sent() {
    let reg = registry();
    let pool = pool(&reg, 64);
    let (m, nic) = open_model(&reg, &pool, cfg(A), IgbHostile::default(), fast_cfg(16));
    let mut nic = nic.unwrap();
    let mut q = nic.pair(0).unwrap();
    let mut v = vec![
        frame(&pool, 0, 100, A, A, 1),
        frame(&pool, 0, 1519, A, A, 2),
    ];
    let e = q.tx_burst(&mut v).unwrap_err();
    assert!(
        matches!(
            e,
            IgbError::FrameTooLarge {
                index: 1,
                len: 1519,
                max: 1518
            }
        ),
        "{e}"
    );
    assert_eq!(v.len(), 2, "nothing taken");
    let mut v = vec![frame(&pool, 0, 13, A, A, 1)];
    let e = q.tx_burst(&mut v).unwrap_err();
    assert!(matches!(e, IgbError::FrameTooShort { len: 13, .. }), "{e}");
    assert!(matches!(
        q.tx_burst(&mut Vec::new()),
        Err(IgbError::EmptyBurst(_))
    ));
    assert!(matches!(
        q.rx_burst(&mut Vec::new()),
        Err(IgbError::EmptyBurst(_))
    ));
    assert_eq!(m.stats().tx_frames, 0);
    assert_eq!(q.tx_in_flight(), 0);
}

#[test]
fn exhausted_and_small_pools_are_refused_or_counted() {
    let reg = registry();
    let small = pool(&reg, 10);
    let (_m, r) = open_model(&reg, &small, cfg(A), IgbHostile::default(), fast_cfg(16));
    assert!(
        matches!(
            r,
            Err(IgbError::RxPoolTooSmall {
                blocks: 10,
                need: 15
            })
        ),
        "{:?}",
        r.err()
    );
    // Exactly the ring's worth: every frame received leaves the pool dry until it is dropped.
    let exact = pool(&reg, 15);
    let tx = pool(&reg, 8);
    let (_m, nic) = open_model(&reg, &exact, cfg(A), IgbHostile::default(), fast_cfg(16));
    let mut nic = nic.unwrap();
    let mut q = nic.pair(0).unwrap();
    let mut v = vec![frame(&tx, 0, 64, A, A, 1)];
    q.tx_burst(&mut v).unwrap();
    let got = recv(&mut q, 1);
    assert_eq!(q.rx_posted(), 14, "the ring runs with one buffer less");
    assert!(q.stats().rx_refill_failures >= 1);
    drop(got);
    let mut out = Vec::with_capacity(4);
    q.rx_burst(&mut out).unwrap();
    assert_eq!(q.rx_posted(), 15, "refilled once the buffer came back");
}

#[test]
fn a_frame_spread_over_two_buffers_is_dropped_whole() {
    let reg = registry();
    let pool = pool(&reg, 64);
    let plan = IgbHostile {
        oversized_rx: true,
        ..Default::default()
    };
    let (m, nic) = open_model(&reg, &pool, cfg(A), plan, fast_cfg(16));
    let mut nic = nic.unwrap();
    m.inject(&vec![0x5a; 5000]);
    m.inject(&[0x11; 100]);
    let mut q = nic.pair(0).unwrap();
    let got = recv(&mut q, 1);
    assert_eq!(got[0].data(), &[0x11; 100][..]);
    assert_eq!(q.stats().rx_drops, 1);
}

#[test]
fn wrong_ids_ring_sizes_and_pair_counts_are_refused() {
    let reg = registry();
    let pool = pool(&reg, 64);
    let vf = IgbModelConfig {
        device_id: 0x10ca,
        ..cfg(A)
    };
    let (_m, r) = open_model(&reg, &pool, vf, IgbHostile::default(), fast_cfg(16));
    assert!(matches!(r, Err(IgbError::VirtualFunction { .. })));
    let other = IgbModelConfig {
        device_id: 0x100e,
        ..cfg(A)
    };
    let (_m, r) = open_model(&reg, &pool, other, IgbHostile::default(), fast_cfg(16));
    assert!(matches!(r, Err(IgbError::NotIgb { device: 0x100e, .. })));
    for ring in [0u16, 4, 12, 4104] {
        let (m, r) = open_model(&reg, &pool, cfg(A), IgbHostile::default(), fast_cfg(ring));
        assert!(matches!(r, Err(IgbError::InvalidConfig(_))), "ring {ring}");
        assert_eq!(m.stats().resets, 0, "nothing touched");
    }
    let two = IgbConfig {
        queue_pairs: 2,
        ..fast_cfg(16)
    };
    let (_m, r) = open_model(&reg, &pool, cfg(A), IgbHostile::default(), two);
    assert!(matches!(r, Err(IgbError::InvalidConfig(_))));
}

#[test]
fn a_ring_length_the_device_does_not_take_is_refused() {
    let reg = registry();
    let pool = pool(&reg, 600);
    let plan = IgbHostile {
        ring_len_mask: Some(0x1f80),
        ..Default::default()
    };
    let (m, r) = open_model(&reg, &pool, cfg(A), plan, fast_cfg(512));
    let e = r.err().expect("refused");
    assert!(
        matches!(
            e,
            IgbError::RingRejected {
                what: "RDLEN",
                wrote: 8192,
                read: 0,
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(m.stats().resets, 2, "reset again by drop");
    assert_eq!(pool.stats().in_use, 0);
}

#[test]
fn a_device_that_vanishes_is_gone_for_every_later_burst() {
    let reg = registry();
    let pool = pool(&reg, 64);
    let (m, nic) = open_model(&reg, &pool, cfg(A), IgbHostile::default(), fast_cfg(16));
    let mut nic = nic.unwrap();
    m.vanish();
    let e = within(Duration::from_secs(5), move || {
        let mut q = nic.pair(0).unwrap();
        let mut out = Vec::with_capacity(8);
        let e = loop {
            if let Err(e) = q.rx_burst(&mut out) {
                break e;
            }
        };
        let again = q.rx_burst(&mut out).unwrap_err();
        assert_eq!(again.to_string(), e.to_string(), "sticky");

        assert!(nic.link_up().is_err());
        let sd = nic.shutdown().unwrap_err();
        (e, sd)
    });
    assert!(matches!(e.0, IgbError::DeviceGone { .. }), "{}", e.0);
    assert!(e.0.to_string().contains("all-ones"), "{}", e.0);
    assert!(matches!(e.1, IgbError::DeviceGone { .. }));
    assert_eq!(
        pool.stats().in_use,
        15,
        "the posted buffers stay out of the pool"
    );
}

/// A BAR that stops decoding reads 0 (QEMU), which would also pass for a finished reset: the
/// burst calls report the device gone and the shutdown keeps the posted buffers out of the pool.
#[test]
fn a_bar_that_stops_decoding_is_gone_and_its_buffers_stay_out() {
    let reg = registry();
    let pool = pool(&reg, 64);
    let (m, nic) = open_model(&reg, &pool, cfg(A), IgbHostile::default(), fast_cfg(16));
    let mut nic = nic.unwrap();
    m.stop_decoding();
    let mut q = nic.pair(0).unwrap();
    let mut out = Vec::with_capacity(8);
    let e = within_loop(&mut q, &mut out);
    assert!(matches!(e, IgbError::DeviceGone { .. }), "{e}");
    assert!(e.to_string().contains("STATUS reads 0"), "{e}");
    let sd = nic.shutdown().unwrap_err();
    assert!(matches!(sd, IgbError::DeviceGone { .. }), "{sd}");
    assert_eq!(
        pool.stats().in_use,
        15,
        "the posted buffers stay out of the pool"
    );
}

#[test]
fn link_down_is_a_clear_error_at_open_and_while_polling() {
    let reg = registry();
    let pool = pool(&reg, 64);
    let unplugged = IgbModelConfig {
        link_up: false,
        ..cfg(A)
    };
    let (_m, r) = open_model(&reg, &pool, unplugged, IgbHostile::default(), fast_cfg(16));
    let e = r.err().expect("link down");
    assert!(
        matches!(
            e,
            IgbError::LinkDown {
                waited: Some(_),
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("link is down"), "{e}");
    let (m, nic) = open_model(&reg, &pool, cfg(A), IgbHostile::default(), fast_cfg(16));
    let mut nic = nic.unwrap();
    m.set_cable(false);
    assert!(!nic.link_up().unwrap());
    assert_eq!(Nic::link_up(&nic).unwrap(), Some(false));
    let mut q = nic.pair(0).unwrap();
    let mut out = Vec::with_capacity(8);
    let e = within_loop(&mut q, &mut out);
    assert!(matches!(e, IgbError::LinkDown { waited: None, .. }), "{e}");
    m.set_cable(true);
    q.check_health().expect("back up: not sticky");
}

fn within_loop(q: &mut ubdirect_igb::QueuePair<'_>, out: &mut Vec<NicFrame>) -> IgbError {
    let start = std::time::Instant::now();
    loop {
        if let Err(e) = q.rx_burst(out) {
            return e;
        }
        assert!(start.elapsed() < Duration::from_secs(2), "no error");
    }
}

#[test]
fn a_stuck_reset_a_mute_phy_and_a_queue_that_will_not_enable_are_refused() {
    let reg = registry();
    let pool = pool(&reg, 64);
    for (plan, want) in [
        (
            IgbHostile {
                reset_stuck: true,
                ..Default::default()
            },
            "ResetTimeout",
        ),
        (
            IgbHostile {
                mdic_error: true,
                ..Default::default()
            },
            "PhyAccess",
        ),
        (
            IgbHostile {
                queue_enable_stuck: true,
                ..Default::default()
            },
            "RingRejected",
        ),
        (
            IgbHostile {
                all_ones_after: Some(0),
                ..Default::default()
            },
            "DeviceGone",
        ),
        (
            IgbHostile {
                bar_len: Some(0x4000),
                ..Default::default()
            },
            "BarTooSmall",
        ),
    ] {
        let (reg2, pool2) = (reg.clone(), pool.clone());
        let r = within(Duration::from_secs(5), move || {
            let (_m, r) = open_model(&reg2, &pool2, cfg(A), plan, fast_cfg(16));
            r.err().map(|e| format!("{e:?}"))
        });
        let e = r.expect("refused");
        assert!(e.starts_with(want), "{want}: {e}");
    }
}

#[test]
fn a_length_beyond_the_buffer_and_a_head_beyond_the_ring_are_protocol_errors() {
    let reg = registry();
    let pool = pool(&reg, 64);
    let plan = IgbHostile {
        rx: vec![RxTweak {
            len: Some(5000),
            status: None,
        }],
        ..Default::default()
    };
    let (m, nic) = open_model(&reg, &pool, cfg(A), plan, fast_cfg(16));
    let mut nic = nic.unwrap();
    m.inject(&[7; 64]);
    let mut q = nic.pair(0).unwrap();
    let mut out = Vec::with_capacity(4);
    let e = q.rx_burst(&mut out).unwrap_err();
    assert!(
        matches!(
            e,
            IgbError::BadRxLength {
                len: 5000,
                buf: 4096,
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(
        ubdirect_core::seams::NicError::from(e).kind,
        NicErrorKind::Protocol
    );
    assert!(
        matches!(q.rx_burst(&mut out), Err(IgbError::BadRxLength { .. })),
        "sticky"
    );
    let plan = IgbHostile {
        head: Some(999),
        ..Default::default()
    };
    let (_m, nic) = open_model(&reg, &pool, cfg(B), plan, fast_cfg(16));
    let mut nic = nic.unwrap();
    let mut q = nic.pair(0).unwrap();
    let e = within_loop(&mut q, &mut out);
    assert!(
        matches!(
            e,
            IgbError::HeadOutOfRange {
                head: 999,
                size: 16,
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn the_nic_seam_drives_igb_like_any_nic() {
    let reg = registry();
    let pool = pool(&reg, 128);
    let (_ma, mut a, _mb, mut b) = pair_of_nics(&reg, &pool, 32);
    let (na, nb): (&mut dyn Nic, &mut dyn Nic) = (&mut a, &mut b);
    assert_eq!(
        (na.driver(), na.mac(), na.max_frame()),
        ("igb", Some(A), 1518)
    );
    let mut qa = na.queue(0).unwrap();
    let mut qb = nb.queue(0).unwrap();
    assert_eq!(qa.tx_headroom(), 0);
    let mut v = vec![frame(&pool, 0, 1518, B, A, 77)];
    let sent = v[0].data().to_vec();
    assert_eq!(qa.tx_burst(&mut v).unwrap(), 1);
    let mut out = Vec::with_capacity(4);
    let start = std::time::Instant::now();
    while out.is_empty() {
        qb.rx_burst(&mut out).unwrap();
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "the 1518-byte frame never arrived"
        );
    }
    assert_eq!(out[0].data(), &sent[..]);
    let mut bad = vec![frame(&pool, 0, 2000, B, A, 1)];
    assert_eq!(
        qa.tx_burst(&mut bad).unwrap_err().kind,
        NicErrorKind::InvalidRequest
    );
}

#[test]
fn a_frame_from_a_file_changed_since_registration_is_refused_with_nothing_sent() {
    let path = std::env::temp_dir().join(format!("ubd-igb-file-frame-{}", std::process::id()));
    let mut bytes = vec![0u8; 2 * 4096];
    for (i, b) in bytes.iter_mut().enumerate() {
        *b = (i * 7) as u8;
    }
    for half in bytes.chunks_mut(4096) {
        half[..6].copy_from_slice(&A);
        half[6..12].copy_from_slice(&A);
        half[12..14].copy_from_slice(&[0x88, 0xb5]);
    }
    std::fs::write(&path, &bytes).unwrap();
    let reg = registry();
    let pool = pool(&reg, 64);
    let file = std::fs::File::open(&path).unwrap();
    let region = reg.register_file(&file, 0, bytes.len() as u64).unwrap();
    let file_pool = ubdirect_core::UbPool::new(
        &reg,
        region,
        ubdirect_core::PoolConfig {
            block_size: 4096,
            block_count: 2,
        },
    )
    .unwrap();
    let (m, nic) = open_model(&reg, &pool, cfg(A), IgbHostile::default(), fast_cfg(16));
    let mut nic = nic.unwrap();
    let mut q = nic.pair(0).unwrap();
    let from_file = |b| NicFrame::new(b, 0, 100).map_err(|(_, e)| e).expect("frame");
    // The file as registered: the frame goes out and comes back (the model echoes it).
    let mut v = vec![from_file(file_pool.get().unwrap())];
    assert_eq!(q.tx_burst(&mut v).unwrap(), 1);
    let got = recv(&mut q, 1);
    assert_eq!(got[0].data(), &bytes[..100]);
    // Rewritten since: refused, the frame stays with the caller, the device sends nothing.
    let second = file_pool.get().unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .and_then(|f| f.set_len(4096))
        .unwrap();
    let mut v = vec![from_file(second)];
    let e = q.tx_burst(&mut v).unwrap_err();
    assert!(
        matches!(
            e,
            IgbError::Core(ubdirect_core::CoreError::FileChanged {
                old_size: 8192,
                new_size: 4096,
                ..
            })
        ),
        "{e}"
    );
    assert_eq!(v.len(), 1, "the frame stays with the caller");
    assert_eq!(m.stats().tx_frames, 1, "only the first frame was sent");
    let _ = std::fs::remove_file(&path);
}

/// Sends one frame from `pool` on `nic` and receives it back (the model echoes what it sends
/// when it has no peer): the NIC's rings still work.
fn echo_one(nic: &mut Igb, pool: &std::sync::Arc<ubdirect_core::UbPool>, seq: u32) {
    let mut q = nic.pair(0).unwrap();
    let mut v = vec![frame(pool, 0, 200, A, A, seq)];
    let sent = v[0].data().to_vec();
    assert_eq!(q.tx_burst(&mut v).expect("tx_burst"), 1);
    let got = recv(&mut q, 1);
    assert_eq!(got[0].data(), &sent[..], "the echoed frame's bytes");
}

#[test]
fn a_tx_buffer_of_another_domain_fails_the_burst_with_nothing_sent() {
    let reg = registry();
    let pool = pool(&reg, 64);
    let other = registry();
    let foreign = model_support::pool(&other, 8);
    let (m, nic) = open_model(&reg, &pool, cfg(A), IgbHostile::default(), fast_cfg(16));
    let mut nic = nic.unwrap();
    let mut q = nic.pair(0).unwrap();
    // An own frame first: the whole burst fails, not only the foreign frame.
    let mut v = vec![
        frame(&pool, 0, 100, A, A, 1),
        frame(&foreign, 64, 100, A, A, 2),
    ];
    let sent: Vec<Vec<u8>> = v.iter().map(|f| f.data().to_vec()).collect();
    let tail_writes = m.stats().tail_writes;
    let e = q.tx_burst(&mut v).unwrap_err();
    match &e {
        IgbError::Core(ubdirect_core::CoreError::ForeignDomain {
            region,
            region_domain,
            device_domain,
        }) => {
            assert_eq!(*region, foreign.region().id);
            assert_eq!(*region_domain, other.domain().id());
            assert_eq!(*device_domain, reg.domain().id());
        }
        e => panic!("refused for the wrong reason: {e}"),
    }
    assert_eq!(v.len(), 2, "the frames stay with the caller");
    assert_eq!(v[0].data(), &sent[0][..]);
    assert_eq!(v[1].data(), &sent[1][..]);
    assert_eq!(m.stats().tx_frames, 0, "the device took no frame");
    assert_eq!(m.stats().tail_writes, tail_writes, "no tail moved");
    assert_eq!(q.tx_in_flight(), 0, "nothing queued");
    assert_eq!(q.stats().tx_packets, 0);
    // Without the foreign frame the same burst goes out.
    v.pop();
    assert_eq!(q.tx_burst(&mut v).unwrap(), 1);
    assert_eq!(recv(&mut q, 1)[0].data(), &sent[0][..]);
    assert_eq!(m.stats().tx_frames, 1);
    assert!(m.dma_faults().is_empty(), "{:?}", m.dma_faults());
}

#[test]
fn an_rx_pool_of_another_domain_is_refused_at_open_before_the_device_is_touched() {
    let reg = registry();
    let other = registry();
    let foreign = model_support::pool(&other, 64);
    let m = IgbModel::new(&reg, cfg(A));
    let dev = m.attach(&reg);
    match Igb::from_device(&reg, dev.clone(), foreign.clone(), fast_cfg(16)) {
        Err(IgbError::Core(ubdirect_core::CoreError::ForeignDomain {
            region,
            region_domain,
            device_domain,
        })) => {
            assert_eq!(region, foreign.region().id);
            assert_eq!(region_domain, other.domain().id());
            assert_eq!(device_domain, reg.domain().id());
        }
        Err(e) => panic!("refused for the wrong reason: {e}"),
        Ok(_) => panic!("a NIC opened with RX buffers the device cannot reach"),
    }
    assert_eq!(m.stats().resets, 0, "the device was never reset");
    assert_eq!(m.stats().tail_writes, 0, "no ring programmed");
    assert_eq!(dev.claimed_by(), None, "no claim left behind");
    assert_eq!(foreign.stats().in_use, 0, "no buffer posted");
    // The same device opens with a pool of its own domain.
    let pool = pool(&reg, 64);
    let mut nic = Igb::from_device(&reg, dev, pool.clone(), fast_cfg(16)).unwrap();
    echo_one(&mut nic, &pool, 3);
}

#[test]
fn a_second_igb_on_a_held_device_is_refused_and_the_first_keeps_working() {
    let reg = registry();
    let pool = pool(&reg, 64);
    let m = IgbModel::new(&reg, cfg(A));
    let dev = m.attach(&reg);
    let mut first = Igb::from_device(&reg, dev.clone(), pool.clone(), fast_cfg(16)).unwrap();
    let (resets, rdt) = (m.stats().resets, m.reg(0xc018));
    let posted = first.pair(0).unwrap().rx_posted();
    match Igb::from_device(&reg, dev.clone(), pool.clone(), fast_cfg(16)) {
        Err(IgbError::Core(ubdirect_core::CoreError::DeviceClaimed { addr, driver })) => {
            assert_eq!(addr, dev.address());
            assert_eq!(driver, "igb");
        }
        Err(e) => panic!("refused for the wrong reason: {e}"),
        Ok(_) => panic!("a second Igb took over the device under the first one's rings"),
    }
    assert_eq!(m.stats().resets, resets, "the refused driver reset nothing");
    assert_eq!(m.reg(0xc018), rdt, "RDT untouched");
    assert_eq!(dev.claimed_by(), Some("igb"));
    assert_eq!(first.pair(0).unwrap().rx_posted(), posted);
    echo_one(&mut first, &pool, 4);
    assert!(m.dma_faults().is_empty(), "{:?}", m.dma_faults());
}

#[test]
fn the_claim_is_released_when_the_igb_is_dropped() {
    let reg = registry();
    let pool = pool(&reg, 64);
    let m = IgbModel::new(&reg, cfg(A));
    let dev = m.attach(&reg);
    let first = Igb::from_device(&reg, dev.clone(), pool.clone(), fast_cfg(16)).unwrap();
    assert_eq!(dev.claimed_by(), Some("igb"));
    drop(first);
    assert_eq!(dev.claimed_by(), None);
    assert_eq!(pool.stats().in_use, 0, "every RX buffer back");
    let mut again = Igb::from_device(&reg, dev.clone(), pool.clone(), fast_cfg(16))
        .expect("the device opens again once its NIC is gone");
    assert_eq!(dev.claimed_by(), Some("igb"));
    echo_one(&mut again, &pool, 5);
    assert!(m.dma_faults().is_empty(), "{:?}", m.dma_faults());
}

#[test]
fn a_frame_from_an_unchanged_file_region_arrives_byte_for_byte() {
    let path = std::env::temp_dir().join(format!("ubd-igb-file-tx-{}", std::process::id()));
    // Two blocks; in each a 1518-byte frame to B at offset 64, other bytes 0xa5.
    let mut bytes = vec![0xa5u8; 2 * 4096];
    for (k, block) in bytes.chunks_mut(4096).enumerate() {
        let f = &mut block[64..64 + 1518];
        f[..6].copy_from_slice(&B);
        f[6..12].copy_from_slice(&A);
        f[12..14].copy_from_slice(&[0x88, 0xb5]);
        for (i, x) in f[14..].iter_mut().enumerate() {
            *x = (i * 13 + k * 5) as u8;
        }
    }
    std::fs::write(&path, &bytes).unwrap();
    let reg = registry();
    let pool = pool(&reg, 128);
    let file = std::fs::File::open(&path).unwrap();
    let region = reg.register_file(&file, 0, bytes.len() as u64).unwrap();
    assert!(region.is_read_only());
    let files = ubdirect_core::UbPool::new(
        &reg,
        region,
        ubdirect_core::PoolConfig {
            block_size: 4096,
            block_count: 2,
        },
    )
    .unwrap();
    let (ma, mut a, mb, mut b) = pair_of_nics(&reg, &pool, 8);
    for round in 0..10usize {
        let lens = [1518 - round, 60 + round];
        let mut v: Vec<NicFrame> = lens
            .iter()
            .map(|&l| NicFrame::new(files.get().unwrap(), 64, l).map_err(|(_, e)| e))
            .collect::<Result<_, _>>()
            .unwrap();
        // Which file block each frame is in, from its address in the region.
        let base = files.region().iova;
        let want: Vec<Vec<u8>> = v
            .iter()
            .zip(lens)
            .map(|(f, l)| {
                let at = (f.buf().iova() - base) as usize + 64;
                bytes[at..at + l].to_vec()
            })
            .collect();
        let mut qa = a.pair(0).unwrap();
        assert_eq!(qa.tx_burst(&mut v).unwrap(), 2, "round {round}");
        let got = recv(&mut b.pair(0).unwrap(), 2);
        for (i, f) in got.iter().enumerate() {
            assert_eq!(f.data(), &want[i][..], "frame {i} of round {round}");
        }
        drop(got);
        let start = std::time::Instant::now();
        while files.stats().in_use > 0 {
            qa.reclaim_tx().unwrap();
            assert!(
                start.elapsed() < Duration::from_secs(2),
                "file blocks never came back"
            );
        }
    }
    assert_eq!((ma.stats().tx_frames, mb.stats().rx_frames), (20, 20));
    assert_eq!(
        std::fs::read(&path).unwrap(),
        bytes,
        "the file is unchanged"
    );
    assert!(ma.dma_faults().is_empty(), "{:?}", ma.dma_faults());
    let _ = std::fs::remove_file(&path);
}

#[test]
fn a_read_only_rx_pool_is_refused_at_open_before_the_device_is_touched() {
    let path = std::env::temp_dir().join(format!("ubd-igb-file-rx-{}", std::process::id()));
    std::fs::write(&path, vec![0u8; 16 * 4096]).unwrap();
    let reg = registry();
    let file = std::fs::File::open(&path).unwrap();
    let region = reg.register_file(&file, 0, 16 * 4096).unwrap();
    let files = ubdirect_core::UbPool::new(
        &reg,
        region,
        ubdirect_core::PoolConfig {
            block_size: 4096,
            block_count: 16,
        },
    )
    .unwrap();
    let m = IgbModel::new(&reg, cfg(A));
    let dev = m.attach(&reg);
    match Igb::from_device(&reg, dev.clone(), files.clone(), fast_cfg(16)) {
        Err(IgbError::RxPoolReadOnly { region }) => assert_eq!(region, files.region().id),
        Err(e) => panic!("refused for the wrong reason: {e}"),
        Ok(_) => panic!("a NIC opened with RX buffers the device cannot write"),
    }
    assert_eq!(m.stats().resets, 0, "the device was never reset");
    assert_eq!(m.stats().tail_writes, 0, "no ring programmed");
    assert_eq!(dev.claimed_by(), None, "no claim left behind");
    assert_eq!(files.stats().in_use, 0, "no buffer posted");
    let _ = std::fs::remove_file(&path);
}
