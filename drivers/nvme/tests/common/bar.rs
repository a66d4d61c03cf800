//! The GPU-BAR stand-in (the test bed's ivshmem BAR2) as the target of NVMe reads (peer to
//! peer): the BAR registered in a bed's DMA domain with a pool of 1 MiB blocks on it.

use std::sync::Arc;

use ubdirect_core::{PciDevice, PoolConfig, UbBuf, UbPool, UbRegion};
use ubdirect_nvme::{IoBuf, IoQueuePair, Lba};
use ubdirect_testbed::{self as testbed, NVME0_NS1};

use super::{Bed, T};

/// The test bed's ivshmem device, opened in `bed`'s DMA domain.
pub fn open_ivshmem(bed: &Bed) -> Arc<PciDevice> {
    let tb = testbed::require();
    let ivshmem = tb.ivshmem.expect("test bed has an ivshmem device");
    PciDevice::open(bed.registry.domain(), ivshmem.parse().unwrap()).expect("open ivshmem")
}

/// BAR2 of the ivshmem device registered in a bed's domain, with a pool of 8 blocks of 1 MiB.
pub struct BarTarget {
    /// The ivshmem device.
    pub dev: Arc<PciDevice>,
    /// The registered BAR2.
    pub region: Arc<UbRegion>,
    /// Eight 1 MiB blocks carved from the BAR.
    pub pool: Arc<UbPool>,
}

impl BarTarget {
    /// Registers BAR2 of the test bed's ivshmem device in `bed`'s domain (however its back end
    /// maps a BAR: by dma-buf on iommufd) and carves the pool.
    pub fn register(bed: &Bed) -> BarTarget {
        BarTarget::register_of(bed, open_ivshmem(bed))
    }

    /// [`BarTarget::register`] for the ivshmem device `dev`, already open in `bed`'s domain (to
    /// register its BAR again once the first region is gone).
    pub fn register_of(bed: &Bed, dev: Arc<PciDevice>) -> BarTarget {
        let region = bed.registry.register_bar(&dev, 2).expect("register BAR2");
        let pool = UbPool::new(
            &bed.registry,
            region.clone(),
            PoolConfig {
                block_size: 1 << 20,
                block_count: 8,
            },
        )
        .expect("pool on the BAR");
        BarTarget { dev, region, pool }
    }

    /// Reads `len` bytes at `lba` of nvme0's namespace 1 into a BAR block at byte `off`, the
    /// `skip` blocks before it held (so that the BAR offsets differ from the image's); checks
    /// the bytes through the BAR mapping and prints the host check `name` of the BAR's backing
    /// file against the image. Returns the block.
    pub fn read_and_check(
        &self,
        qp: &mut IoQueuePair,
        name: &str,
        skip: usize,
        (lba, len, off): (u64, usize, usize),
    ) -> UbBuf {
        let _hold: Vec<_> = (0..skip).map(|_| self.pool.get().unwrap()).collect();
        let buf = self.pool.get().unwrap();
        let bar_off = buf.iova() - self.region.iova + off as u64;
        let buf = qp
            .read_blocking(
                &qp.namespace(1).unwrap(),
                Lba(lba),
                IoBuf::new(buf, off, len).unwrap(),
                T,
            )
            .expect("read into the BAR")
            .into_buf();
        let mut landed = vec![0u8; len];
        buf.read_into(off, &mut landed).expect("read the BAR");
        let line = testbed::check_bar_copy(name, &landed, bar_off, NVME0_NS1, lba * 512)
            .expect("pattern via the BAR mapping");
        println!("{line}");
        buf
    }
}
