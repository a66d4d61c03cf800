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
    // BAR memory is written and read with volatile accesses, never through a Rust slice.
    let pattern: Vec<u8> = (0..len).map(|i| (i as u8).wrapping_mul(7) ^ 0x5a).collect();
    buf.write_from(0, &pattern).expect("write the BAR");
    let (mut head, mut tail) = (vec![0u8; 64], vec![0u8; 64]);
    buf.read_into(0, &mut head).expect("read the BAR");
    buf.read_into(len - 64, &mut tail).expect("read the BAR");
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

#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn a_bar_range_is_registered_once_and_a_registered_bar_keeps_drivers_off_the_device() {
    use ubdirect_core::CoreError;
    let tb = testbed::require();
    let addr: PciAddress = tb.ivshmem.expect("ivshmem").parse().unwrap();
    let d = DmaDomain::new().unwrap();
    let dev = PciDevice::open(&d, addr).unwrap();
    let reg = UbRegistry::new(d.clone());
    let region = reg.register_bar(&dev, 2).unwrap();
    let maps = d.mapping_count();
    // The same BAR again (in this registry or another one of the domain) would alias it.
    let e = reg
        .register_bar(&dev, 2)
        .expect_err("BAR2 registered twice");
    assert!(
        matches!(e, CoreError::BarRangeRegistered { bar: 2, .. }),
        "{e}"
    );
    let other = UbRegistry::new(d.clone());
    let e = other
        .register_bar(&dev, 2)
        .expect_err("BAR2 registered twice");
    assert!(
        matches!(e, CoreError::BarRangeRegistered { bar: 2, .. }),
        "{e}"
    );
    assert_eq!(d.mapping_count(), maps, "a refusal maps nothing");
    // While the BAR is a UB region, no driver can take the device.
    let e = dev
        .claim("test")
        .expect_err("claimed while its BAR is pooled memory");
    assert!(
        matches!(e, CoreError::DeviceMappedOutsideDriver { .. }),
        "{e}"
    );
    reg.unregister(region.id).unwrap();
    drop(region);
    let region = reg
        .register_bar(&dev, 2)
        .expect("registered again once the first is gone");
    reg.unregister(region.id).unwrap();
    drop(region);
    let claim = dev.claim("test").expect("no BAR mapping left");
    assert_eq!(dev.claimed_by(), Some("test"));
    drop(claim);
}

#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn an_nvme_register_bar_is_never_registered_as_memory() {
    use ubdirect_core::CoreError;
    let tb = testbed::require();
    let addr: PciAddress = tb.nvme.first().expect("nvme0").parse().unwrap();
    let d = DmaDomain::new().unwrap();
    let dev = PciDevice::open(&d, addr).unwrap();
    let reg = UbRegistry::new(d.clone());
    let e = reg
        .register_bar(&dev, 0)
        .expect_err("NVMe BAR0 (registers) registered as memory");
    assert!(matches!(e, CoreError::RegisterBar { bar: 0, .. }), "{e}");
    assert!(e.to_string().contains("not prefetchable memory"), "{e}");
    assert_eq!(d.mapping_count(), 0);
    // Nothing was left mapped: a driver can still take the device.
    drop(dev.claim("nvme").expect("claim after the refusal"));
}
