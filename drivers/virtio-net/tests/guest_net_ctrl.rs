//! Guest test: the control virtqueue works: promiscuous mode off makes the device drop frames
//! for other MACs (QEMU's receive filter) and on lets them through again.

mod common;

use std::time::Duration;

use common::*;
use ubdirect_virtio_net::{Features, NetConfig, TxFrame};

const OTHER: [u8; 6] = [0x02, 0, 0, 0, 0, 0x99];

#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn promiscuous_mode_through_the_control_queue() {
    let bed = bed();
    let pool = host_pool(&bed, 1024);
    let mut a = open(&bed, &bed.nic_a, &pool, NetConfig::default());
    let mut b = open(&bed, &bed.nic_b, &pool, NetConfig::default());
    let (am, bm) = macs(&a, &b);
    assert!(
        b.info()
            .features
            .contains(Features::NET_CTRL_VQ | Features::NET_CTRL_RX),
        "QEMU's virtio-net offers the control queue and RX filter control: {:?}",
        b.info().features
    );
    let send = |a: &mut ubdirect_virtio_net::VirtioNet, dst: [u8; 6], seq: u64| {
        let mut v: Vec<TxFrame> = vec![frame(&pool, 100, dst, am, seq)];
        send_all(a, &mut v);
    };
    // Default after reset: promiscuous, a frame for another MAC arrives.
    send(&mut a, OTHER, 1);
    let got = recv_n(&mut b, &mut a, 1);
    assert_frames(&got, 100, OTHER, am, 1);

    b.set_promiscuous(false).expect("RX_PROMISC off");
    send(&mut a, OTHER, 2);
    let none = recv_for(&mut b, Duration::from_millis(300), 4);
    assert!(
        none.is_empty(),
        "promiscuous off: a frame for {OTHER:02x?} still arrived"
    );
    send(&mut a, bm, 3);
    let got = recv_n(&mut b, &mut a, 1);
    assert_frames(&got, 100, bm, am, 3);

    b.set_promiscuous(true).expect("RX_PROMISC on");
    send(&mut a, OTHER, 4);
    let got = recv_n(&mut b, &mut a, 1);
    assert_frames(&got, 100, OTHER, am, 4);
    b.set_all_multicast(true).expect("RX_ALLMULTI on");
}
