//! Host tests of the real virtio-net driver on the in-process device model
//! (`ubdirect_devmodel::virtio_net`): bring-up, a TX -> RX loop between two model NICs, echo,
//! multiqueue, the control queue, and the issue-9 regressions (pair handles, device input,
//! the control queue after a timeout).

mod model_support;

use std::time::{Duration, Instant};

use model_support::*;
use ubdirect_devmodel::virtio_net::{connect, Hostile, NetModelConfig, VirtioNetModel};
use ubdirect_virtio_net::{NetConfig, RxFrame, TxFrame, VirtioNet, FRAME_OFFSET};

const A: [u8; 6] = [2, 0, 0, 0, 0, 0xa];
const B: [u8; 6] = [2, 0, 0, 0, 0, 0xb];

fn recv(nic: &mut VirtioNet, n: usize) -> Vec<RxFrame> {
    let mut out = Vec::with_capacity(n);
    let start = Instant::now();
    while out.len() < n {
        nic.rx_burst(&mut out).expect("rx_burst");
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "got {} of {n}",
            out.len()
        );
    }
    out
}

#[test]
fn bring_up_reads_mac_mtu_and_fills_the_rx_ring() {
    let reg = registry();
    let pool = pool(&reg, 64);
    let cfg = NetModelConfig {
        mac: A,
        mtu: Some(1500),
        ..NetModelConfig::default()
    };
    let (m, nic) = open_model(&reg, &pool, cfg, Hostile::default(), fast_cfg(16));
    let mut nic = nic.expect("bring-up on the model");
    assert_eq!(nic.mac(), Some(A));
    assert_eq!(nic.info().mtu, Some(1500));
    assert_eq!(nic.max_frame(), 1514);
    assert_eq!(nic.link_up().unwrap(), Some(true));
    assert_eq!(nic.pair(0).unwrap().rx_posted(), 16);
    assert_eq!(m.avail_pending(0), 16, "the device sees 16 RX buffers");
    assert_eq!(
        m.device_status() & 0x0f,
        0x0f,
        "ACK|DRIVER|FEATURES_OK|DRIVER_OK"
    );
    nic.shutdown().expect("shutdown");
    assert_eq!(m.device_status(), 0, "reset at shutdown");
    assert_eq!(pool.stats().in_use, 0, "every buffer back");
    assert!(m.dma_faults().is_empty(), "{:?}", m.dma_faults());
}

#[test]
fn tx_to_rx_between_two_model_nics() {
    let reg = registry();
    let pool = pool(&reg, 256);
    let ma = VirtioNetModel::new(
        &reg,
        NetModelConfig {
            mac: A,
            ..Default::default()
        },
    );
    let mb = VirtioNetModel::new(
        &reg,
        NetModelConfig {
            mac: B,
            ..Default::default()
        },
    );
    connect(&ma, &mb);
    let mut a = VirtioNet::from_device(&reg, ma.attach(&reg), pool.clone(), fast_cfg(32)).unwrap();
    let mut b = VirtioNet::from_device(&reg, mb.attach(&reg), pool.clone(), fast_cfg(32)).unwrap();
    for round in 0..5u8 {
        let mut v: Vec<_> = (0..20)
            .map(|i| frame(&pool, 60 + i, B, A, round + i as u8))
            .collect();
        assert_eq!(a.tx_burst(&mut v).unwrap(), 20);
        let got = recv(&mut b, 20);
        for (i, f) in got.iter().enumerate() {
            let d = f.data();
            assert_eq!(d.len(), 60 + i, "frame {i} of round {round}");
            assert_eq!((&d[..6], &d[6..12]), (&B[..], &A[..]));
            assert_eq!(d[14], round.wrapping_add(i as u8));
        }
        a.reclaim_tx().unwrap();
    }
    assert_eq!(a.stats().tx_packets, 100);
    assert_eq!(b.stats().rx_packets, 100);
    assert_eq!(mb.stats().rx_frames, 100);
    drop((a, b));
    assert_eq!(pool.stats().in_use, 0);
}

#[test]
fn echo_on_one_nic_and_the_control_queue_sets_filters() {
    let reg = registry();
    let pool = pool(&reg, 64);
    let (m, nic) = open_model(
        &reg,
        &pool,
        NetModelConfig::default(),
        Hostile::default(),
        fast_cfg(8),
    );
    let mut nic = nic.unwrap();
    let mut v = vec![frame(&pool, 100, A, A, 7)];
    nic.tx_burst(&mut v).unwrap();
    let got = recv(&mut nic, 1);
    assert_eq!(got[0].data()[14], 7);
    nic.set_promiscuous(false).unwrap();
    nic.set_all_multicast(true).unwrap();
    assert_eq!(m.rx_filters(), (false, true));
}

#[test]
fn two_queue_pairs_on_a_multiqueue_model() {
    let reg = registry();
    let pool = pool(&reg, 128);
    let cfg = NetModelConfig {
        max_pairs: 4,
        ..Default::default()
    };
    let net = NetConfig {
        queue_pairs: 2,
        ..fast_cfg(16)
    };
    let (m, nic) = open_model(&reg, &pool, cfg, Hostile::default(), net);
    let mut nic = nic.expect("2 pairs");
    assert_eq!(nic.info().max_queue_pairs, 4);
    assert_eq!(
        m.active_pairs(),
        2,
        "MQ_VQ_PAIRS_SET through the control queue (queue 8)"
    );
    let mut pairs = nic.pairs_mut();
    assert_eq!(pairs.len(), 2);
    let mut v = vec![frame(&pool, 64, A, A, 1)];
    pairs[1].tx_burst(&mut v).unwrap();
    let mut out = Vec::with_capacity(4);
    pairs[1].rx_burst(&mut out).unwrap();
    assert_eq!(out.len(), 1, "echoed onto the same pair");
}

/// QEMU's virtio-net shows the MQ pairs only after VIRTIO_NET_F_MQ is negotiated: the driver
/// must read `num_queues` again after FEATURES_OK (reading it once at open refused the second
/// pair of the test bed's multiqueue NIC with QueueUnavailable).
#[test]
fn queues_that_appear_with_mq_are_used() {
    let reg = registry();
    let pool = pool(&reg, 128);
    let cfg = NetModelConfig {
        max_pairs: 2,
        queues_grow_with_mq: true,
        ..Default::default()
    };
    let net = NetConfig {
        queue_pairs: 2,
        ..fast_cfg(16)
    };
    let (m, nic) = open_model(&reg, &pool, cfg, Hostile::default(), net);
    let mut nic = nic.expect("2 pairs once MQ is negotiated");
    assert_eq!(m.active_pairs(), 2);
    let mut pairs = nic.pairs_mut();
    let mut v = vec![frame(&pool, 64, A, A, 1)];
    pairs[1].tx_burst(&mut v).unwrap();
    let mut out = Vec::with_capacity(4);
    pairs[1].rx_burst(&mut out).unwrap();
    assert_eq!(out.len(), 1, "echoed onto pair 1");
}

/// Swapping the handles of two devices swaps only the borrows; each handle
/// still drives its own device, and dropping one device leaves the other's rings intact.
#[test]
fn swapped_pair_handles_still_drive_their_own_device() {
    let reg = registry();
    let pool = pool(&reg, 128);
    let (ma, a) = open_model(
        &reg,
        &pool,
        NetModelConfig::default(),
        Hostile::default(),
        fast_cfg(16),
    );
    let (mb, b) = open_model(
        &reg,
        &pool,
        NetModelConfig::default(),
        Hostile::default(),
        fast_cfg(16),
    );
    let (mut a, mut b) = (a.unwrap(), b.unwrap());
    {
        let mut pa = a.pair(0).unwrap();
        let mut pb = b.pair(0).unwrap();
        std::mem::swap(&mut pa, &mut pb);
        // `pa` now borrows b: a frame sent through it leaves through b's model.
        let mut v = vec![frame(&pool, 64, A, A, 3)];
        pa.tx_burst(&mut v).unwrap();
    }
    assert_eq!((ma.stats().tx_frames, mb.stats().tx_frames), (0, 1));
    let in_use = pool.stats().in_use;
    drop(a);
    assert_eq!(ma.device_status(), 0, "a was reset");
    assert_eq!(
        pool.stats().in_use,
        in_use - 16,
        "only a's 16 RX buffers went back"
    );
    // b's RX ring and its echoed frame are untouched by a's drop.
    let got = recv(&mut b, 1);
    assert_eq!(got[0].data()[14], 3);
    assert_eq!(mb.avail_pending(0), 16, "b's RX ring is full again");
    assert!(mb.dma_faults().is_empty(), "{:?}", mb.dma_faults());
}

/// A file of `blocks` 4 KiB blocks registered read-only in `reg`, and a pool of its blocks:
/// each block holds 12 bytes of 0xa5 (not a plain virtio-net header) and then a 1514-byte
/// frame to `dst`, its body depending on the block. Returns the file's path and bytes too.
fn file_pool(
    reg: &std::sync::Arc<ubdirect_core::UbRegistry>,
    name: &str,
    blocks: usize,
    dst: [u8; 6],
) -> (
    std::path::PathBuf,
    Vec<u8>,
    std::sync::Arc<ubdirect_core::UbPool>,
) {
    let path = std::env::temp_dir().join(format!("ubd-vnet-{name}-{}", std::process::id()));
    let mut bytes = vec![0u8; blocks * 4096];
    for (k, block) in bytes.chunks_mut(4096).enumerate() {
        block[..FRAME_OFFSET].fill(0xa5);
        let f = &mut block[FRAME_OFFSET..FRAME_OFFSET + 1514];
        f[..6].copy_from_slice(&dst);
        f[6..12].copy_from_slice(&A);
        f[12..14].copy_from_slice(&[0x88, 0xb5]);
        for (i, x) in f[14..].iter_mut().enumerate() {
            *x = (i * 31 + k * 7) as u8;
        }
    }
    std::fs::write(&path, &bytes).unwrap();
    let file = std::fs::File::open(&path).unwrap();
    let region = reg.register_file(&file, 0, bytes.len() as u64).unwrap();
    assert!(region.is_read_only());
    let pool = ubdirect_core::UbPool::new(
        reg,
        region,
        ubdirect_core::PoolConfig {
            block_size: 4096,
            block_count: blocks,
        },
    )
    .unwrap();
    (path, bytes, pool)
}

/// The frame of `len` bytes at `FRAME_OFFSET` of the file block `b`.
fn file_frame(b: ubdirect_core::UbBuf, len: usize) -> TxFrame {
    TxFrame::new(b, len)
        .map_err(|(_, e)| e)
        .expect("file frame")
}

/// A frame's bytes from a buffer of any region (a file region's through the file).
fn frame_bytes(f: &TxFrame) -> Vec<u8> {
    let mut v = vec![0u8; f.len()];
    f.buf().read_into(FRAME_OFFSET, &mut v).unwrap();
    v
}

#[test]
fn a_frame_from_an_unchanged_file_region_is_sent_byte_for_byte() {
    let reg = registry();
    let pool = pool(&reg, 128);
    let (path, bytes, files) = file_pool(&reg, "file-tx", 3, B);
    let ma = VirtioNetModel::new(&reg, NetModelConfig::default());
    let mb = VirtioNetModel::new(
        &reg,
        NetModelConfig {
            mac: B,
            ..NetModelConfig::default()
        },
    );
    connect(&ma, &mb);
    let mut a = VirtioNet::from_device(&reg, ma.attach(&reg), pool.clone(), fast_cfg(8)).unwrap();
    let mut b = VirtioNet::from_device(&reg, mb.attach(&reg), pool.clone(), fast_cfg(8)).unwrap();
    // 20 rounds of two file frames and one pool frame on an 8-entry TX ring: the chains'
    // descriptors come back or the ring runs dry.
    for round in 0..20usize {
        let lens = [1514 - round, 60 + round];
        let mut v = vec![
            file_frame(files.get().unwrap(), lens[0]),
            frame(&pool, 100 + round, B, A, round as u8),
            file_frame(files.get().unwrap(), lens[1]),
        ];
        let sent: Vec<Vec<u8>> = v.iter().map(frame_bytes).collect();
        assert_eq!(a.tx_burst(&mut v).unwrap(), 3, "round {round}");
        let got = recv(&mut b, 3);
        for (i, f) in got.iter().enumerate() {
            assert_eq!(f.data(), &sent[i][..], "frame {i} of round {round}");
        }
        // The file blocks handed out this round: 0 and 1, or 1 and 2, ... (a stack pool):
        // check against the file itself, not only against what the CPU read before sending.
        assert!(bytes
            .chunks(4096)
            .any(|blk| blk[FRAME_OFFSET..FRAME_OFFSET + lens[0]] == got[0].data()[..]));
        a.reclaim_tx().unwrap();
        assert_eq!(
            files.stats().in_use,
            0,
            "the file blocks are back after reclaim"
        );
    }
    assert_eq!(ma.stats().tx_frames, 60);
    assert_eq!(
        ma.stats().tx_headers_not_plain,
        0,
        "the file's bytes in front of the frame were never sent as the header"
    );
    assert_eq!(
        std::fs::read(&path).unwrap(),
        bytes,
        "the file is unchanged"
    );
    assert!(ma.dma_faults().is_empty(), "{:?}", ma.dma_faults());
    let _ = std::fs::remove_file(&path);
}

#[test]
fn file_frames_take_two_descriptors_and_a_full_ring_keeps_the_rest_in_order() {
    let reg = registry();
    let pool = pool(&reg, 64);
    let (path, _bytes, files) = file_pool(&reg, "file-ring", 5, A);
    let m = VirtioNetModel::new(&reg, NetModelConfig::default());
    let mut nic = VirtioNet::from_device(&reg, m.attach(&reg), pool.clone(), fast_cfg(8)).unwrap();
    let mut v: Vec<TxFrame> = (0..5)
        .map(|_| file_frame(files.get().unwrap(), 1000))
        .collect();
    let last = frame_bytes(&v[4]);
    // Eight descriptors hold four two-descriptor frames.
    assert_eq!(nic.tx_burst(&mut v).unwrap(), 4);
    assert_eq!(v.len(), 1, "the fifth frame stays with the caller");
    assert_eq!(frame_bytes(&v[0]), last);
    assert_eq!(nic.stats().tx_ring_full, 1);
    assert_eq!(m.stats().tx_frames, 4);
    let mut q = nic.pair(0).unwrap();
    assert_eq!(q.tx_in_flight(), 4, "frames in flight, not descriptors");
    assert_eq!(q.reclaim_tx().unwrap(), 4);
    assert_eq!(q.tx_in_flight(), 0);
    assert_eq!(
        files.stats().in_use,
        1,
        "only the unsent frame's block is out"
    );
    assert_eq!(q.tx_burst(&mut v).unwrap(), 1);
    assert_eq!(m.stats().tx_frames, 5);
    let _ = std::fs::remove_file(&path);
}

#[test]
fn a_read_only_rx_pool_is_refused_at_open_before_the_device_is_touched() {
    let reg = registry();
    let (path, _bytes, files) = file_pool(&reg, "file-rx", 16, A);
    let m = VirtioNetModel::new(&reg, NetModelConfig::default());
    let dev = m.attach(&reg);
    match VirtioNet::from_device(&reg, dev.clone(), files.clone(), fast_cfg(8)) {
        Err(ubdirect_virtio_net::VirtioNetError::RxPoolReadOnly { region }) => {
            assert_eq!(region, files.region().id);
        }
        Err(e) => panic!("refused for the wrong reason: {e}"),
        Ok(_) => panic!("a NIC opened with RX buffers the device cannot write"),
    }
    assert_eq!(m.stats().resets, 0, "the device was never reset");
    assert_eq!(dev.claimed_by(), None, "no claim left behind");
    assert_eq!(files.stats().in_use, 0, "no buffer posted");
    assert!(m.dma_faults().is_empty(), "{:?}", m.dma_faults());
    let _ = std::fs::remove_file(&path);
}
