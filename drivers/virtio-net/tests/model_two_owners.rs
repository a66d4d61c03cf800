//! One driver per device, and buffers of the device's own DMA domain only, on the virtio-net
//! model: a TX buffer or an RX pool mapped in another DMA domain never reaches the device, and
//! a second `VirtioNet` on a device a `VirtioNet` holds is refused before it touches the device.

mod model_support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use model_support::*;
use ubdirect_core::{CoreError, PciDevice, UbPool, UbRegistry};
use ubdirect_devmodel::virtio_net::{NetModelConfig, VirtioNetModel};
use ubdirect_virtio_net::{RxFrame, VirtioNet, VirtioNetError};

const A: [u8; 6] = [2, 0, 0, 0, 0, 0xa];

/// A model with the default configuration, attached in `reg`'s domain.
fn model(reg: &Arc<UbRegistry>) -> (Arc<VirtioNetModel>, Arc<PciDevice>) {
    let m = VirtioNetModel::new(reg, NetModelConfig::default());
    let dev = m.attach(reg);
    (m, dev)
}

/// Sends one frame from `pool` and receives it back (the model echoes what it sends when it
/// has no peer) within 2 s: the NIC's rings still work.
fn echo_one(nic: &mut VirtioNet, pool: &Arc<UbPool>, seq: u8) {
    let mut v = vec![frame(pool, 200, A, A, seq)];
    let sent = v[0].data().to_vec();
    assert_eq!(nic.tx_burst(&mut v).expect("tx_burst"), 1);
    let mut out: Vec<RxFrame> = Vec::with_capacity(4);
    let start = Instant::now();
    while out.is_empty() {
        nic.rx_burst(&mut out).expect("rx_burst");
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "the echoed frame never arrived"
        );
    }
    assert_eq!(out[0].data(), &sent[..], "the echoed frame's bytes");
}

#[test]
fn a_tx_buffer_of_another_domain_fails_the_burst_with_nothing_sent() {
    let reg = registry();
    let pool = pool(&reg, 64);
    let other = registry();
    let foreign = model_support::pool(&other, 8);
    let (m, dev) = model(&reg);
    let mut nic = VirtioNet::from_device(&reg, dev, pool.clone(), fast_cfg(8)).unwrap();
    // An own frame first: the whole burst fails, not only the foreign frame.
    let mut v = vec![frame(&pool, 100, A, A, 1), frame(&foreign, 100, A, A, 2)];
    let sent: Vec<Vec<u8>> = v.iter().map(|f| f.data().to_vec()).collect();
    let notifies = m.stats().notifies;
    let e = nic.tx_burst(&mut v).unwrap_err();
    match &e {
        VirtioNetError::Core(CoreError::ForeignDomain {
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
    assert_eq!(m.stats().notifies, notifies, "no doorbell");
    assert_eq!(nic.pair(0).unwrap().tx_in_flight(), 0, "nothing queued");
    assert_eq!(nic.stats().tx_packets, 0);
    // Without the foreign frame the same burst goes out.
    let foreign_frame = v.pop().unwrap().into_buf();
    assert_eq!(foreign_frame.region().id, foreign.region().id);
    assert_eq!(nic.tx_burst(&mut v).unwrap(), 1);
    assert_eq!(m.stats().tx_frames, 1);
    assert!(m.dma_faults().is_empty(), "{:?}", m.dma_faults());
}

#[test]
fn an_rx_pool_of_another_domain_is_refused_at_open_before_the_device_is_touched() {
    let reg = registry();
    let other = registry();
    let foreign = model_support::pool(&other, 64);
    let (m, dev) = model(&reg);
    let r = VirtioNet::from_device(&reg, dev.clone(), foreign.clone(), fast_cfg(8));
    match r {
        Err(VirtioNetError::Core(CoreError::ForeignDomain {
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
    assert_eq!(m.device_status(), 0, "the device was never acknowledged");
    assert_eq!(dev.claimed_by(), None, "no claim left behind");
    assert_eq!(foreign.stats().in_use, 0, "no buffer posted");
    // The same device opens with a pool of its own domain.
    let pool = pool(&reg, 64);
    let mut nic = VirtioNet::from_device(&reg, dev, pool.clone(), fast_cfg(8)).unwrap();
    echo_one(&mut nic, &pool, 3);
}

#[test]
fn a_second_virtio_net_on_a_held_device_is_refused_and_the_first_keeps_working() {
    let reg = registry();
    let pool = pool(&reg, 64);
    let (m, dev) = model(&reg);
    let mut first = VirtioNet::from_device(&reg, dev.clone(), pool.clone(), fast_cfg(8)).unwrap();
    let (resets, status) = (m.stats().resets, m.device_status());
    let posted = first.pair(0).unwrap().rx_posted();
    match VirtioNet::from_device(&reg, dev.clone(), pool.clone(), fast_cfg(8)) {
        Err(VirtioNetError::Core(CoreError::DeviceClaimed { addr, driver })) => {
            assert_eq!(addr, dev.address());
            assert_eq!(driver, "virtio-net");
        }
        Err(e) => panic!("refused for the wrong reason: {e}"),
        Ok(_) => panic!("a second VirtioNet took over the device under the first one's rings"),
    }
    assert_eq!(m.stats().resets, resets, "the refused driver reset nothing");
    assert_eq!(m.device_status(), status, "device_status untouched");
    assert_eq!(dev.claimed_by(), Some("virtio-net"));
    assert_eq!(first.pair(0).unwrap().rx_posted(), posted);
    echo_one(&mut first, &pool, 4);
    assert!(m.dma_faults().is_empty(), "{:?}", m.dma_faults());
}

#[test]
fn the_claim_is_released_when_the_virtio_net_is_dropped() {
    let reg = registry();
    let pool = pool(&reg, 64);
    let (m, dev) = model(&reg);
    let first = VirtioNet::from_device(&reg, dev.clone(), pool.clone(), fast_cfg(8)).unwrap();
    assert_eq!(dev.claimed_by(), Some("virtio-net"));
    drop(first);
    assert_eq!(dev.claimed_by(), None);
    assert_eq!(pool.stats().in_use, 0, "every RX buffer back");
    let mut again = VirtioNet::from_device(&reg, dev.clone(), pool.clone(), fast_cfg(8))
        .expect("the device opens again once its NIC is gone");
    assert_eq!(dev.claimed_by(), Some("virtio-net"));
    echo_one(&mut again, &pool, 5);
    assert!(m.dma_faults().is_empty(), "{:?}", m.dma_faults());
}
