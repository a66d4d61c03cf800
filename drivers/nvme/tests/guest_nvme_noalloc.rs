//! Guest test: the I/O path (submit, ring, poll, resubmit) performs no heap allocation. A
//! counting global allocator wraps the system one for this test binary.

mod common;

use common::{one, T};
use ubdirect_core::UbBuf;
use ubdirect_nvme::{IoBuf, IoFlags, Lba};
use ubdirect_testbed::alloc_count::CountingAlloc;

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc::new();

#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn submit_and_poll_allocate_nothing() {
    let bed = common::open(1, 64 << 10, 16);
    // 16 requests of 2 commands each (32 KiB at nvme1's 16 KiB MDTS) fill 32 command slots.
    let mut qp = bed.qp(32, 1);
    let mut free: Vec<UbBuf> = Vec::with_capacity(16);
    for _ in 0..16 {
        free.push(bed.pool.get().unwrap());
    }
    // Warm up once (first-use paths in std), then count over many rounds, with reads split at
    // MDTS (32 KiB on nvme1 = 2 commands) and writes, and a rejected submission.
    let round = |qp: &mut ubdirect_nvme::IoQueuePair, free: &mut Vec<UbBuf>, n: u64| {
        let mut tag = 0;
        while let Some(b) = free.pop() {
            let r = if tag % 3 == 0 {
                qp.submit_write(
                    &qp.namespace(1).unwrap(),
                    Lba(100_000 + tag * 64),
                    IoBuf::prefix(b, 32 << 10).unwrap(),
                    IoFlags::empty(),
                    tag,
                )
            } else {
                qp.submit_read(
                    &qp.namespace(1).unwrap(),
                    Lba(tag * 64 + n % 7),
                    IoBuf::prefix(b, 32 << 10).unwrap(),
                    IoFlags::empty(),
                    tag,
                )
            };
            r.unwrap();
            tag += 1;
        }
        qp.ring();
        let start = std::time::Instant::now();
        while free.len() < 16 {
            qp.poll(16, |c| {
                assert!(c.result.is_ok());
                free.push(one(c.bufs).into_buf());
            })
            .unwrap();
            assert!(start.elapsed() < T);
        }
        // A refused submission (LBA out of range) gives the buffer back without allocating.
        let b = free.pop().unwrap();
        let r = qp
            .submit_read(
                &qp.namespace(1).unwrap(),
                Lba(u64::MAX - 1),
                IoBuf::prefix(b, 512).unwrap(),
                IoFlags::empty(),
                0,
            )
            .unwrap_err();
        free.push(one(r.bufs).into_buf());
    };
    round(&mut qp, &mut free, 0);
    let before = GLOBAL.count();
    for n in 1..50 {
        round(&mut qp, &mut free, n);
    }
    let allocs = GLOBAL.count() - before;
    let st = qp.stats();
    println!(
        "{allocs} allocations over {} requests / {} commands",
        st.requests, st.commands
    );
    assert!(st.commands > st.requests, "the reads were split at MDTS");
    assert_eq!(allocs, 0, "the I/O path allocated");
}
