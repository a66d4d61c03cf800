//! Guest test: one [`Env`] opens an NVMe controller and two virtio-net NICs of the
//! test bed in one DMA domain with one pool; the controller reads and the NICs pass frames
//! from that pool.

use std::time::{Duration, Instant};

use ubdirect::dma::PoolConfig;
use ubdirect::nvme::{IoBuf, IoQueuePair, Lba, QueueOptions};
use ubdirect::virtio_net::{RxFrame, TxFrame, FRAME_OFFSET};
use ubdirect::Env;
use ubdirect_testbed as testbed;

#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn one_env_opens_nvme0_and_the_nics_and_both_move_data_from_its_pool() {
    let tb = testbed::require();
    assert!(
        tb.nics.len() >= 2,
        "the test bed has two NICs: {:?}",
        tb.nics
    );
    let mut env = Env::builder()
        .nvme(tb.nvme[0].as_str())
        .nic(tb.nics[0].as_str())
        .nic(tb.nics[1].as_str())
        .pool(PoolConfig {
            block_size: 4096,
            block_count: 1024,
        })
        .open()
        .expect("nvme0 and both NICs open through one Env");
    assert_eq!(env.controllers().len(), 1);
    assert_eq!(env.nics_mut().len(), 2);

    // NVMe: a 4 KiB read of LBA 0 into a pool buffer.
    let ctrl = env.controller(0).clone();
    let ns = ctrl.first_namespace().unwrap();
    let mut qp = IoQueuePair::new(&ctrl, QueueOptions::default()).unwrap();
    let buf = IoBuf::prefix(env.pool().get().unwrap(), 4096).unwrap();
    let buf = qp
        .read_blocking(&ns, Lba(0), buf, Duration::from_secs(10))
        .expect("nvme0 reads into the Env's pool");
    assert_eq!(buf.len(), 4096);
    drop(buf);
    drop(qp);

    // virtio-net: 32 frames from NIC 0 to NIC 1 (QEMU's hub joins them), from the same pool.
    let pool = env.pool().clone();
    let mut nics = env.take_nics();
    let mut b = nics.pop().unwrap();
    let mut a = nics.pop().unwrap();
    let (src, dst) = (a.mac().unwrap(), b.mac().unwrap());
    let mut tx: Vec<TxFrame> = (0..32u8)
        .map(|i| {
            let mut buf = pool.get().unwrap();
            let f = &mut buf.as_mut_slice()[FRAME_OFFSET..FRAME_OFFSET + 128];
            f[0..6].copy_from_slice(&dst);
            f[6..12].copy_from_slice(&src);
            f[12..14].copy_from_slice(&0x88b5u16.to_be_bytes());
            f[14..].fill(i);
            TxFrame::new(buf, 128).map_err(|(_, e)| e).unwrap()
        })
        .collect();
    let mut rx: Vec<RxFrame> = Vec::with_capacity(64);
    let mut got = 0usize;
    let deadline = Instant::now() + Duration::from_secs(20);
    while got < 32 {
        assert!(
            Instant::now() < deadline,
            "only {got} of 32 frames arrived in 20 s"
        );
        if tx.is_empty() {
            a.reclaim_tx().unwrap();
        } else {
            a.tx_burst(&mut tx).unwrap();
        }
        b.rx_burst(&mut rx).unwrap();
        for f in rx.drain(..) {
            if f.len() == 128 && f.data()[12..14] == 0x88b5u16.to_be_bytes() {
                assert_eq!(f.data()[14..], [got as u8; 114][..], "frame {got} in order");
                got += 1;
            }
        }
    }
    a.shutdown().unwrap();
    b.shutdown().unwrap();
}
