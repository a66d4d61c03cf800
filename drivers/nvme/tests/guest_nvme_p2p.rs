//! Guest test: peer-to-peer DMA. An NVMe read lands in a UB block carved from the ivshmem
//! device's BAR2 (the GPU-BAR stand-in); the host then checks that the BAR's backing file holds
//! exactly the image's bytes.

mod common;

use common::bar::BarTarget;

#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn nvme_reads_into_a_bar_region() {
    let bed = common::open(0, 1 << 20, 1);
    let bar = BarTarget::register(&bed);
    let mut qp = bed.qp(32, 1);
    for (i, read) in [
        (2048u64, 1usize << 20, 0usize),
        (5000, 64 * 1024, 4096 + 512),
        (7, 4096, 12),
    ]
    .into_iter()
    .enumerate()
    {
        // Skip the first blocks so that the BAR offsets differ from the image offsets.
        bar.read_and_check(&mut qp, &format!("nvme-p2p-bar-{i}"), i, read);
    }
}
