//! Guest test: the burst I/O path allocates nothing. A counting global allocator watches this
//! thread while frames are built from the pool, sent, received, verified and dropped back.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

use common::*;
use ubdirect_virtio_net::pattern::{self, Check};
use ubdirect_virtio_net::{NetConfig, RxFrame, TxFrame, FRAME_OFFSET};

struct Counting;
static ALLOCS: AtomicU64 = AtomicU64::new(0);
thread_local! {
    static WATCH: Cell<bool> = const { Cell::new(false) };
}

// SAFETY: forwards every call to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        if WATCH.with(|w| w.get()) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: same contract as ours.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        if WATCH.with(|w| w.get()) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: same contract as ours.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

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
    WATCH.with(|w| w.set(true));
    // The counter itself works: one Box is one allocation.
    drop(std::hint::black_box(Box::new(7u64)));
    assert_eq!(
        ALLOCS.swap(0, Ordering::Relaxed),
        1,
        "counting allocator is active"
    );
    run(4000, &mut sent, &mut got);
    WATCH.with(|w| w.set(false));
    let allocs = ALLOCS.load(Ordering::Relaxed);
    assert_eq!(got, 4300, "every frame came back");
    assert_eq!(bad, 0);
    assert_eq!(
        allocs, 0,
        "the burst path allocated {allocs} times in 4000 frames"
    );
}
