//! Guest test: peer-to-peer DMA. An NVMe read lands in a UB block carved from the ivshmem
//! device's BAR2 (the GPU-BAR stand-in); the host then checks that the BAR's backing file holds
//! exactly the image's bytes.

mod common;

use common::T;
use ubdirect_core::{PciDevice, PoolConfig, UbPool};
use ubdirect_nvme::{IoBuf, Lba};
use ubdirect_testbed::{self as testbed, GPUBAR_FILE, NVME0_NS1};

#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn nvme_reads_into_a_bar_region() {
    let tb = testbed::require();
    let ivshmem = tb.ivshmem.clone().expect("test bed has an ivshmem device");
    let bed = common::open(0, 1 << 20, 1);
    let dev =
        PciDevice::open(bed.registry.domain(), ivshmem.parse().unwrap()).expect("open ivshmem");
    let region = bed.registry.register_bar(&dev, 2).expect("register BAR2");
    let bar_pool = UbPool::new(
        &bed.registry,
        region.clone(),
        PoolConfig {
            block_size: 1 << 20,
            block_count: 8,
        },
    )
    .expect("pool on the BAR");
    let mut qp = bed.qp(32, 1);
    for (i, (lba, len, off)) in [
        (2048u64, 1usize << 20, 0usize),
        (5000, 64 * 1024, 4096 + 512),
        (7, 4096, 12),
    ]
    .into_iter()
    .enumerate()
    {
        // Skip the first blocks so that the BAR offsets differ from the image offsets.
        let _hold: Vec<_> = (0..i).map(|_| bar_pool.get().unwrap()).collect();
        let buf = bar_pool.get().unwrap();
        let bar_off = buf.iova() - region.iova + off as u64;
        let buf = qp
            .read_blocking(
                &qp.namespace(1).unwrap(),
                Lba(lba),
                IoBuf::new(buf, off, len).unwrap(),
                T,
            )
            .expect("read into the BAR")
            .into_buf();
        // The CPU sees the bytes through the BAR mapping too.
        testbed::check_pattern(NVME0_NS1.id, lba * 512, &buf.as_slice()[off..off + len])
            .expect("pattern via BAR mmap");
        println!(
            "{}",
            testbed::hostcheck_file_eq(
                &format!("nvme-p2p-bar-{i}"),
                GPUBAR_FILE,
                bar_off,
                NVME0_NS1.file,
                lba * 512,
                len as u64
            )
        );
    }
}
