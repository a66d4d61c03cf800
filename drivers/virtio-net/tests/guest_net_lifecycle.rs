//! Guest tests: RX pool exhaustion is counted and recovers when buffers come back; shutdown
//! resets the device, returns every buffer and leaves no IOMMU mapping behind.

mod common;

use std::time::Duration;

use common::*;
use ubdirect_virtio_net::{NetConfig, TxFrame};

#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn rx_pool_exhaustion_is_reported_and_recovers() {
    let bed = bed();
    let tx_pool = host_pool(&bed, 512);
    // B's RX pool holds exactly one ring's worth of buffers.
    let rx_pool = host_pool(&bed, 64);
    let cfg = NetConfig {
        rx_queue_size: Some(64),
        ..NetConfig::default()
    };
    let mut a = open(&bed, &bed.nic_a, &tx_pool, NetConfig::default());
    let mut b = open(&bed, &bed.nic_b, &rx_pool, cfg);
    let (am, bm) = macs(&a, &b);
    assert_eq!(b.pair(0).unwrap().rx_posted(), 64);

    // 64 frames fill every RX buffer; the caller keeps them all: the pool is empty.
    let mut v: Vec<TxFrame> = (0..64).map(|i| frame(&tx_pool, 200, bm, am, i)).collect();
    send_all(&mut a, &mut v);
    let held = recv_n(&mut b, &mut a, 64);
    assert_frames(&held, 200, bm, am, 0);
    let s = b.stats();
    assert!(s.rx_refill_failures > 0, "refill failure is counted: {s:?}");
    assert_eq!(b.pair(0).unwrap().rx_posted(), 0, "nothing left to post");
    assert_eq!(rx_pool.stats().in_use, 64);

    // More frames now have nowhere to land: none is delivered.
    let mut v: Vec<TxFrame> = (64..72).map(|i| frame(&tx_pool, 200, bm, am, i)).collect();
    send_all(&mut a, &mut v);
    let none = recv_for(&mut b, Duration::from_millis(300), 16);
    assert!(
        none.is_empty(),
        "no RX buffers posted, yet {} frames arrived",
        none.len()
    );

    // Buffers come back: the next poll refills the ring and traffic flows again.
    drop(held);
    let mut out = Vec::with_capacity(16);
    b.rx_burst(&mut out).unwrap();
    assert_eq!(
        b.pair(0).unwrap().rx_posted() + out.len(),
        64,
        "ring refilled"
    );
    // Frames 64..72 were either queued by QEMU (delivered now) or dropped by it; either way
    // new frames must arrive byte-exact.
    let mut late = recv_for(&mut b, Duration::from_millis(500), 16);
    late.append(&mut out);
    for f in &late {
        assert_eq!(f.len(), 200);
    }
    let mut v: Vec<TxFrame> = (1000..1032)
        .map(|i| frame(&tx_pool, 300, bm, am, i))
        .collect();
    send_all(&mut a, &mut v);
    let got = recv_n(&mut b, &mut a, 32);
    assert_frames(&got, 300, bm, am, 1000);
    eprintln!(
        "late frames delivered after refill: {}; rx {:?}",
        late.len(),
        b.stats()
    );
}

#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn shutdown_returns_buffers_and_leaves_no_mapping() {
    let bed = bed();
    let before = bed.domain.mapping_count();
    {
        let registry = bed.registry.clone();
        let pool = host_pool(&bed, 1024);
        let mut a = open(&bed, &bed.nic_a, &pool, NetConfig::default());
        let mut b = open(&bed, &bed.nic_b, &pool, NetConfig::default());
        let (am, bm) = macs(&a, &b);
        assert!(
            bed.domain.mapping_count() > before,
            "pool and rings are mapped"
        );
        // Leave TX buffers in flight and RX buffers posted, then shut down.
        let mut v: Vec<TxFrame> = (0..40).map(|i| frame(&pool, 900, bm, am, i)).collect();
        send_all(&mut a, &mut v);
        let got = recv_n(&mut b, &mut a, 10);
        drop(got);
        let posted = a.pair(0).unwrap().rx_posted() + b.pair(0).unwrap().rx_posted();
        assert!(pool.stats().in_use >= posted);
        a.shutdown().expect("clean shutdown A");
        drop(b); // drop path does the same
        assert_eq!(
            pool.stats().in_use,
            0,
            "every RX/TX buffer is back in its pool"
        );
        drop(pool);
        drop(registry);
    }
    // The registry's DMA slabs go with the registry.
    let Bed {
        domain,
        nic_a,
        nic_b,
        registry,
    } = bed;
    drop(registry);
    assert_eq!(
        domain.mapping_count(),
        before,
        "no IOMMU mapping left behind"
    );
    // The devices are usable again after the shutdown (reset left them clean).
    let bed2 = Bed {
        registry: ubdirect_core::ub::UbRegistry::new(domain.clone()),
        domain,
        nic_a,
        nic_b,
    };
    let pool = host_pool(&bed2, 1024);
    let mut a = open(&bed2, &bed2.nic_a, &pool, NetConfig::default());
    let mut b = open(&bed2, &bed2.nic_b, &pool, NetConfig::default());
    let (am, bm) = macs(&a, &b);
    let mut v = vec![frame(&pool, 64, bm, am, 7)];
    send_all(&mut a, &mut v);
    let got = recv_n(&mut b, &mut a, 1);
    assert_frames(&got, 64, bm, am, 7);
}
