//! Guest tests: every bad input gets its typed error and changes nothing.

mod common;

use std::time::{Duration, Instant};

use common::*;
use ubdirect_core::ub::UbPool;
use ubdirect_virtio_net::{NetConfig, TxFrame, VirtioNet, VirtioNetError, FRAME_OFFSET};

#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn burst_inputs_are_checked() {
    let bed = bed();
    let pool = host_pool(&bed, 1024);
    let mut a = open(&bed, &bed.nic_a, &pool, NetConfig::default());
    let mut b = open(&bed, &bed.nic_b, &pool, NetConfig::default());
    let (am, bm) = macs(&a, &b);
    let max = a.max_frame();

    // Empty TX burst.
    let mut empty: Vec<TxFrame> = Vec::new();
    assert!(matches!(
        a.tx_burst(&mut empty),
        Err(VirtioNetError::EmptyBurst(_))
    ));
    // RX burst with no room.
    let mut full = Vec::new();
    assert!(matches!(
        b.rx_burst(&mut full),
        Err(VirtioNetError::EmptyBurst(_))
    ));

    // Frame longer than the device allows (fits the 4 KiB buffer): the whole burst refused.
    let big = max + 1;
    let mut v = vec![frame(&pool, 100, bm, am, 0), frame(&pool, big, bm, am, 1)];
    let e = a.tx_burst(&mut v).unwrap_err();
    assert!(
        matches!(e, VirtioNetError::FrameTooLarge { index: 1, len, max: m } if len == big && m == max),
        "{e}"
    );
    assert!(e.to_string().contains("nothing of this burst was sent"));
    assert_eq!(v.len(), 2, "frames stay with the caller");
    assert_eq!(a.stats().tx_packets, 0, "nothing sent");
    assert_eq!(a.pair(0).unwrap().tx_in_flight(), 0);

    // Too short / buffer too small are refused at construction, with the buffer back.
    let (buf, e) = TxFrame::new(pool.get().unwrap(), 10).unwrap_err();
    assert!(matches!(e, VirtioNetError::FrameTooShort { len: 10, .. }));
    let (buf, e) = TxFrame::new(buf, 4096).unwrap_err();
    assert!(
        matches!(e, VirtioNetError::BufferTooSmall { need, have: 4096, .. } if need == 4096 + FRAME_OFFSET)
    );
    drop(buf);

    // The device still works after all that.
    v.truncate(1);
    send_all(&mut a, &mut v);
    let got = recv_n(&mut b, &mut a, 1);
    assert_frames(&got, 100, bm, am, 0);
}

#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn open_refuses_bad_configuration() {
    let bed = bed();
    let pool = host_pool(&bed, 1024);
    let open_err = |pool: &std::sync::Arc<UbPool>, cfg: NetConfig| -> VirtioNetError {
        match VirtioNet::from_device(&bed.registry, bed.nic_a.clone(), pool.clone(), cfg) {
            Ok(_) => panic!("open should have failed"),
            Err(e) => e,
        }
    };
    // Pool too small for the RX ring.
    let small = host_pool(&bed, 16);
    let e = open_err(&small, NetConfig::default());
    assert!(
        matches!(e, VirtioNetError::RxPoolTooSmall { blocks: 16, .. }),
        "{e}"
    );
    assert_eq!(small.stats().in_use, 0, "nothing taken from the pool");
    // Queue size not a power of two, and larger than the device's maximum.
    let e = open_err(
        &pool,
        NetConfig {
            rx_queue_size: Some(100),
            ..NetConfig::default()
        },
    );
    assert!(
        matches!(e, VirtioNetError::InvalidConfig(ref m) if m.contains("power of two")),
        "{e}"
    );
    let e = open_err(
        &pool,
        NetConfig {
            tx_queue_size: Some(32768),
            ..NetConfig::default()
        },
    );
    assert!(
        matches!(e, VirtioNetError::InvalidConfig(ref m) if m.contains("maximum")),
        "{e}"
    );
    // Zero pairs, and more pairs than this driver drives.
    let e = open_err(
        &pool,
        NetConfig {
            queue_pairs: 0,
            ..NetConfig::default()
        },
    );
    assert!(matches!(e, VirtioNetError::InvalidConfig(_)), "{e}");
    let e = open_err(
        &pool,
        NetConfig {
            queue_pairs: 2,
            ..NetConfig::default()
        },
    );
    assert!(
        matches!(e, VirtioNetError::InvalidConfig(ref m) if m.contains("queue pairs")),
        "{e}"
    );
    // A health interval outside 1 ms ..= 1 hour.
    for hi in [Duration::ZERO, Duration::from_secs(7200)] {
        let e = open_err(
            &pool,
            NetConfig {
                health_interval: hi,
                ..NetConfig::default()
            },
        );
        assert!(
            matches!(e, VirtioNetError::InvalidConfig(ref m) if m.contains("health_interval")),
            "{e}"
        );
    }
    // Not a virtio-net device: the ivshmem device.
    let (iv, _region) = gpu_bar_region(&bed);
    let e = VirtioNet::from_device(&bed.registry, iv, pool.clone(), NetConfig::default())
        .err()
        .expect("refused");
    assert!(
        matches!(
            e,
            VirtioNetError::NotVirtioNet {
                vendor: 0x1af4,
                device: 0x1110,
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(pool.stats().in_use, 0);
    // After every refusal the NIC opens and works.
    let mut a = open(&bed, &bed.nic_a, &pool, NetConfig::default());
    let mut b = open(&bed, &bed.nic_b, &pool, NetConfig::default());
    let (am, bm) = macs(&a, &b);
    let mut v = vec![frame(&pool, 1000, bm, am, 3)];
    send_all(&mut a, &mut v);
    let got = recv_n(&mut b, &mut a, 1);
    assert_frames(&got, 1000, bm, am, 3);
}

/// A healthy idle NIC is checked by its own bursts (one device_status read per health
/// interval) and stays `Ok`: the check has no false positives on a quiet link.
#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn idle_bursts_check_a_live_device_and_stay_ok() {
    let bed = bed();
    let pool = host_pool(&bed, 1024);
    let cfg = NetConfig {
        health_interval: Duration::from_millis(20),
        ..NetConfig::default()
    };
    let mut b = open(&bed, &bed.nic_b, &pool, cfg);
    let mut out = Vec::with_capacity(32);
    let t = Instant::now();
    let mut polls = 0u64;
    while t.elapsed() < Duration::from_millis(300) {
        out.clear();
        b.rx_burst(&mut out).expect("a live idle NIC stays Ok");
        b.reclaim_tx().expect("a live idle NIC stays Ok");
        polls += 1;
    }
    let reads = b.stats().status_reads;
    println!("{polls} idle polls in 300 ms, {reads} device_status reads");
    assert!(reads >= 1, "no device_status read in 300 ms of idle polls");
    // One read per interval at most: 300 ms / 20 ms = 15, plus slack for the first one.
    assert!(
        reads <= 16,
        "{reads} device_status reads: more than one per interval"
    );
    b.check_health().expect("healthy");
    b.shutdown().expect("clean shutdown");
}
