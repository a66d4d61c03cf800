//! Guest test: the burst I/O path allocates nothing. A counting global allocator watches this
//! thread while frames are built from the pool, sent, received, verified and dropped back.

mod common;

use common::*;
use ubdirect_testbed::alloc_count::CountingAlloc;
use ubdirect_virtio_net::pattern::{self, Check};
use ubdirect_virtio_net::{NetConfig, RxFrame, TxFrame, FRAME_OFFSET};

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc::new();

#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn burst_path_allocates_nothing() {
    let bed = bed();
    let pool = host_pool(&bed, 2048);
    let mut a = open(&bed, &bed.nic_a, &pool, NetConfig::default());
    let mut b = open(&bed, &bed.nic_b, &pool, NetConfig::default());
    let (am, bm) = macs(&a, &b);
    let mut txv: Vec<TxFrame> = Vec::with_capacity(32);
    let mut rxv: Vec<RxFrame> = Vec::with_capacity(32);
    // Warm up (the pattern table, first-use paths), then watch 4000 frames.
    let mut sent = 0u64;
    let mut got = 0u64;
    let mut bad = 0u64;
    let mut run = |n: u64, sent: &mut u64, got: &mut u64| {
        let start = std::time::Instant::now();
        let target = *sent + n;
        while *got < target {
            while *sent < target && txv.len() < 32 && *sent - *got < 128 {
                let mut buf = pool.get().expect("pool");
                pattern::fill(
                    &mut buf.as_mut_slice()[FRAME_OFFSET..FRAME_OFFSET + 700],
                    bm,
                    am,
                    *sent,
                );
                txv.push(TxFrame::new(buf, 700).map_err(|(_, e)| e).expect("frame"));
                *sent += 1;
            }
            if !txv.is_empty() {
                a.tx_burst(&mut txv).expect("tx");
            }
            b.rx_burst(&mut rxv).expect("rx");
            for f in rxv.drain(..) {
                match pattern::verify(f.data(), bm, am, 700) {
                    Check::Good(_) => *got += 1,
                    _ => bad += 1,
                }
            }
            if start.elapsed() > DEADLINE {
                break;
            }
        }
    };
    run(300, &mut sent, &mut got);
    // The counter itself works: one Box is one allocation.
    let ((), one) = GLOBAL.count_on_this_thread(|| drop(std::hint::black_box(Box::new(7u64))));
    assert_eq!(one, 1, "counting allocator is active");
    let ((), allocs) = GLOBAL.count_on_this_thread(|| run(4000, &mut sent, &mut got));
    assert_eq!(got, 4300, "every frame came back");
    assert_eq!(bad, 0);
    assert_eq!(
        allocs, 0,
        "the burst path allocated {allocs} times in 4000 frames"
    );
}
