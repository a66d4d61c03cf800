//! Guest test: a UB pool carved from the ivshmem BAR (the GPU-BAR stand-in). The CPU writes a
//! pattern into pool buffers through the VFIO mmap; the host then checks that the bytes landed
//! in the BAR's backing file (`gpubar`) at the buffers' offsets (UBD-HOSTCHECK).

use ubdirect_core::{DmaDomain, PciAddress, PciDevice, PoolConfig, UbPool, UbRegistry};
use ubdirect_testbed as testbed;

#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn cpu_writes_into_bar_pool_buffers_reach_the_backing_file() {
    let tb = testbed::require();
    let addr: PciAddress = tb.ivshmem.expect("ivshmem").parse().unwrap();
    let d = DmaDomain::new().unwrap();
    let dev = PciDevice::open(&d, addr).unwrap();
    let reg = UbRegistry::new(d.clone());
    let region = reg.register_bar(&dev, 2).unwrap();
    let pool = UbPool::new(
        &reg,
        region.clone(),
        PoolConfig {
            block_size: 1 << 20,
            block_count: 64,
        },
    )
    .unwrap();
    // Take three blocks, keep the third: its offset in the BAR is 2 MiB.
    let bufs: Vec<_> = (0..3).map(|_| pool.get().unwrap()).collect();
    let mut buf = bufs.into_iter().nth(2).unwrap();
    let off = buf.iova() - region.iova;
    assert_eq!(off, 2 << 20);
    let len = buf.len();
    for (i, b) in buf.as_mut_slice().iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(7) ^ 0x5a;
    }
    let head = buf.as_slice()[..64].to_vec();
    let tail = buf.as_slice()[len - 64..].to_vec();
    println!(
        "{}",
        testbed::hostcheck_file_bytes("ub-bar-pool-head", testbed::GPUBAR_FILE, off, &head)
    );
    println!(
        "{}",
        testbed::hostcheck_file_bytes(
            "ub-bar-pool-tail",
            testbed::GPUBAR_FILE,
            off + len as u64 - 64,
            &tail
        )
    );
    assert_eq!(pool.stats().in_use, 1);
    drop(buf);
    drop(pool);
    reg.unregister(region.id).unwrap();
    assert_eq!(d.mapping_count(), 0);
}
