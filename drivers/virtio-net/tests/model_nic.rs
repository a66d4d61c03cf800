//! Host tests of the NIC seam (`ubdirect_core::seams::Nic`) over virtio-net on the device
//! model: frames through `dyn Nic` / `dyn NicQueue` byte-exact, refusals, unsent frames kept in
//! order.

mod model_support;

use std::time::{Duration, Instant};

use model_support::*;
use ubdirect_core::seams::{Nic, NicErrorKind, NicFrame, NicQueue};
use ubdirect_devmodel::virtio_net::{connect, NetModelConfig, VirtioNetModel};
use ubdirect_virtio_net::{VirtioNet, FRAME_OFFSET};

const A: [u8; 6] = [2, 0, 0, 0, 0, 0xa];
const B: [u8; 6] = [2, 0, 0, 0, 0, 0xb];

fn nic_frame(
    pool: &std::sync::Arc<ubdirect_core::UbPool>,
    off: usize,
    len: usize,
    seq: u8,
) -> NicFrame {
    let mut b = pool.get().unwrap();
    let mut hdr = [0u8; 14];
    hdr[..6].copy_from_slice(&B);
    hdr[6..12].copy_from_slice(&A);
    hdr[12..14].copy_from_slice(&[0x88, 0xb5]);
    let d = &mut b.as_mut_slice()[off..off + len];
    let h = len.min(14);
    d[..h].copy_from_slice(&hdr[..h]);
    if len < 14 {
        return NicFrame::new(b, off, len).map_err(|(_, e)| e).unwrap();
    }
    d[..6].copy_from_slice(&B);
    d[6..12].copy_from_slice(&A);
    d[12..14].copy_from_slice(&[0x88, 0xb5]);
    for (i, x) in d[14..].iter_mut().enumerate() {
        *x = seq.wrapping_mul(7).wrapping_add(i as u8);
    }
    NicFrame::new(b, off, len).map_err(|(_, e)| e).unwrap()
}

fn recv(q: &mut dyn NicQueue, n: usize) -> Vec<NicFrame> {
    let mut out = Vec::with_capacity(n);
    let start = Instant::now();
    while out.len() < n {
        q.rx_burst(&mut out).expect("rx_burst");
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "got {} of {n}",
            out.len()
        );
    }
    out
}

#[test]
fn frames_cross_two_nics_through_the_seam_byte_exact() {
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
    let (na, nb): (&mut dyn Nic, &mut dyn Nic) = (&mut a, &mut b);
    assert_eq!(
        (na.driver(), na.mac(), na.pair_count()),
        ("virtio-net", Some(A), 1)
    );
    assert_eq!(nb.link_up().unwrap(), Some(true));
    let mut qa = na.queue(0).unwrap();
    let mut qb = nb.queue(0).unwrap();
    assert_eq!(qa.tx_headroom(), FRAME_OFFSET);
    let mut sent = Vec::new();
    let mut v: Vec<NicFrame> = (0..40)
        .map(|i| nic_frame(&pool, FRAME_OFFSET, 60 + i, i as u8))
        .collect();
    for f in &v {
        sent.push(f.data().to_vec());
    }
    // 32-entry TX ring, 64-frame staging: the ring takes 32, 8 stay in order.
    assert_eq!(qa.tx_burst(&mut v).unwrap(), 32);
    assert_eq!(v.len(), 8);
    assert_eq!(
        v[0].data(),
        &sent[32][..],
        "the unsent frames stay in order"
    );
    let mut got = recv(qb.as_mut(), 32);
    qa.reclaim_tx().unwrap();
    assert_eq!(qa.tx_burst(&mut v).unwrap(), 8);
    got.extend(recv(qb.as_mut(), 8));
    for (i, f) in got.iter().enumerate() {
        assert_eq!(f.offset(), FRAME_OFFSET);
        assert_eq!(f.data(), &sent[i][..], "frame {i}");
    }
    assert_eq!(qb.stats().rx_packets, 40);
    drop((qa, qb, got));
    assert_eq!(na.stats().tx_packets, 40);
}

#[test]
fn wrong_offset_and_bad_sizes_are_refused_with_nothing_sent() {
    let reg = registry();
    let pool = pool(&reg, 64);
    let m = VirtioNetModel::new(&reg, NetModelConfig::default());
    let mut nic = VirtioNet::from_device(&reg, m.attach(&reg), pool.clone(), fast_cfg(8)).unwrap();
    let mut q = Nic::queue(&mut nic, 0).unwrap();
    let mut v = vec![
        nic_frame(&pool, FRAME_OFFSET, 60, 1),
        nic_frame(&pool, 0, 60, 2),
    ];
    let e = q.tx_burst(&mut v).unwrap_err();
    assert_eq!(e.kind, NicErrorKind::InvalidRequest);
    assert!(e.message.contains("offset 0"), "{e}");
    assert_eq!(v.len(), 2);
    let mut v = vec![nic_frame(&pool, FRAME_OFFSET, 2000, 1)];
    let e = q.tx_burst(&mut v).unwrap_err();
    assert_eq!(e.kind, NicErrorKind::InvalidRequest);
    assert!(e.message.contains("longer than"), "{e}");
    let mut v = vec![nic_frame(&pool, FRAME_OFFSET, 10, 1)];
    assert_eq!(
        q.tx_burst(&mut v).unwrap_err().kind,
        NicErrorKind::InvalidRequest
    );
    let mut full: Vec<NicFrame> = Vec::new();
    assert_eq!(
        q.rx_burst(&mut full).unwrap_err().kind,
        NicErrorKind::InvalidRequest
    );
    assert_eq!(m.stats().tx_frames, 0);
}
