//! Guest tests: frames of several sizes round-trip byte-exact from NIC A to NIC B, the rings
//! wrap many times, and a frame received into the GPU-BAR region (ivshmem BAR2) is seen by
//! the host in the backing file.

mod common;

use common::*;
use ubdirect_core::ub::{PoolConfig, UbPool};
use ubdirect_testbed as testbed;
use ubdirect_virtio_net::{NetConfig, TxFrame, FRAME_OFFSET};

#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn device_facts_are_read() {
    let bed = bed();
    let pool = host_pool(&bed, 1024);
    let a = open(&bed, &bed.nic_a, &pool, NetConfig::default());
    let b = open(&bed, &bed.nic_b, &pool, NetConfig::default());
    assert_eq!(a.mac(), Some([0x52, 0x54, 0, 0, 0, 1]));
    assert_eq!(b.mac(), Some([0x52, 0x54, 0, 0, 0, 2]));
    assert_eq!(
        a.link_up().unwrap(),
        Some(true),
        "QEMU offers STATUS and the hub link is up"
    );
    // No MTU feature on the test bed's NICs: 1500 + 14.
    assert_eq!(
        a.max_frame(),
        a.info().mtu.map(|m| m as usize + 14).unwrap_or(1514)
    );
    let f = a.info().features;
    use ubdirect_virtio_net::Features as F;
    assert!(f.contains(F::VERSION_1 | F::ACCESS_PLATFORM | F::EVENT_IDX));
    assert!(!f.intersects(F::NET_CSUM | F::NET_MRG_RXBUF | F::NET_GUEST_TSO4));
    eprintln!("NIC A: {:?}", a.info());
}

#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn sizes_round_trip_byte_exact() {
    let bed = bed();
    let pool = host_pool(&bed, 2048);
    let mut a = open(&bed, &bed.nic_a, &pool, NetConfig::default());
    let mut b = open(&bed, &bed.nic_b, &pool, NetConfig::default());
    let (am, bm) = macs(&a, &b);
    let max = a.max_frame().min(b.max_frame());
    let mut seq = 0;
    for len in [60, 512, 1514.min(max), max] {
        let n = 64;
        let mut v: Vec<TxFrame> = (0..n).map(|i| frame(&pool, len, bm, am, seq + i)).collect();
        send_all(&mut a, &mut v);
        let got = recv_n(&mut b, &mut a, n as usize);
        assert_eq!(got.len(), n as usize);
        for f in &got {
            assert_eq!(f.len(), len);
        }
        assert_frames(&got, len, bm, am, seq);
        seq += n;
    }
    let (sa, sb) = (a.stats(), b.stats());
    assert_eq!(sa.tx_packets, seq);
    assert_eq!(sb.rx_packets, seq);
    assert_eq!(sb.rx_drops, 0);
    eprintln!("tx {sa:?}\nrx {sb:?}");
}

#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn rings_wrap_many_times() {
    let bed = bed();
    let pool = host_pool(&bed, 2048);
    let cfg = NetConfig {
        rx_queue_size: Some(64),
        tx_queue_size: Some(64),
        ..NetConfig::default()
    };
    let mut a = open(&bed, &bed.nic_a, &pool, cfg.clone());
    let mut b = open(&bed, &bed.nic_b, &pool, cfg);
    let (am, bm) = macs(&a, &b);
    let ring = b.pair(0).unwrap().rx_ring_size();
    assert_eq!(ring, 64);
    let total = 12 * ring as u64; // > 10x the ring size, both rings
    let mut next = 0u64;
    let mut expect = 0u64;
    let mut out = Vec::with_capacity(32);
    let mut txv: Vec<TxFrame> = Vec::with_capacity(32);
    let start = std::time::Instant::now();
    while expect < total {
        while next < total && txv.len() < 16 && next - expect < 48 {
            txv.push(frame(&pool, 128, bm, am, next));
            next += 1;
        }
        if !txv.is_empty() {
            a.tx_burst(&mut txv).unwrap();
        }
        b.rx_burst(&mut out).unwrap();
        assert_frames(&out, 128, bm, am, expect);
        expect += out.len() as u64;
        out.clear();
        assert!(
            start.elapsed() < 6 * DEADLINE,
            "stuck at {expect} of {total}"
        );
    }
    a.reclaim_tx().unwrap();
    let (sa, sb) = (a.stats(), b.stats());
    assert_eq!(sa.tx_packets, total);
    assert_eq!(sb.rx_packets, total);
    assert!(
        sa.tx_kicks <= sa.tx_packets,
        "event index: at most one kick per frame, {sa:?}"
    );
    eprintln!("wrap: tx {sa:?}\nrx {sb:?}");
}

#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn frame_received_into_gpu_bar_reaches_the_host_file() {
    let bed = bed();
    let (_iv, region) = gpu_bar_region(&bed);
    // TX and RX buffers all in the BAR region (the GPU-memory stand-in). The pool covers the
    // whole BAR; its low 56 MiB are held back so that these buffers land in the top 8 MiB of
    // `gpubar`, away from the NVMe tests' peer-to-peer targets near the start.
    let blocks = region.len / 4096;
    let pool = UbPool::new(
        &bed.registry,
        region.clone(),
        PoolConfig {
            block_size: 4096,
            block_count: blocks,
        },
    )
    .expect("pool in BAR2");
    let held: Vec<_> = (0..blocks - 2048)
        .map(|_| pool.get().expect("hold low block"))
        .collect();
    let mut a = open(&bed, &bed.nic_a, &pool, NetConfig::default());
    let mut b = open(&bed, &bed.nic_b, &pool, NetConfig::default());
    let (am, bm) = macs(&a, &b);
    let len = 1514.min(a.max_frame());
    let seq = 0x00c0_ffee_u64;
    let mut v = vec![frame(&pool, len, bm, am, seq)];
    let tx_off = (v[0].buf().iova() - region.iova) as usize + FRAME_OFFSET;
    send_all(&mut a, &mut v);
    let got = recv_n(&mut b, &mut a, 1);
    assert_frames(&got, len, bm, am, seq);
    let f = &got[0];
    assert_eq!(
        f.buf().region().id,
        region.id,
        "received into the BAR region"
    );
    let off = (f.buf().iova() - region.iova) as usize + FRAME_OFFSET;
    assert_ne!(off, tx_off, "RX landed in its own block, not the TX block");
    assert!(
        off >= held.len() * 4096,
        "RX buffer in the top 8 MiB of the BAR"
    );
    // The host reads the backing file after the guest exits: 64 bytes from the frame start.
    let data = common::rx_bytes(f);
    let bytes = &data[..64];
    println!(
        "{}",
        testbed::hostcheck_file_bytes(
            "virtio_net_rx_into_gpu_bar",
            testbed::GPUBAR_FILE,
            off as u64,
            bytes
        )
    );
    // And the tail of the frame too (the pattern, not the header).
    let tail_off = off + len - 32;
    println!(
        "{}",
        testbed::hostcheck_file_bytes(
            "virtio_net_rx_into_gpu_bar_tail",
            testbed::GPUBAR_FILE,
            tail_off as u64,
            &data[len - 32..]
        )
    );
}
