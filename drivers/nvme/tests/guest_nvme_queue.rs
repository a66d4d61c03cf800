//! Guest tests: queue-full, ring wrap-around (many more commands than the depth), several queue
//! pairs on several threads at once, the BlockQueue seam, validation errors (each provoked,
//! its message checked, nothing queued).

mod common;

use common::{one, T};
use ubdirect_core::seams::{BlockErrorKind, BlockQueue};
use ubdirect_core::{PoolConfig, UbPool};
use ubdirect_nvme::{IoBuf, IoFlags, Lba};
use ubdirect_nvme::{IoQueuePair, NvmeError, QueueOptions};
use ubdirect_testbed::{self as testbed, NVME0_NS1};

#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn queue_full_returns_the_buffer() {
    let bed = common::open(0, 64 << 10, 8);
    let mut qp = bed.qp(4, 1);
    assert_eq!(qp.depth(), 4);
    for i in 0..4 {
        qp.submit_read(
            &qp.namespace(1).unwrap(),
            Lba(i * 8),
            IoBuf::prefix(bed.pool.get().unwrap(), 4096).unwrap(),
            IoFlags::empty(),
            i,
        )
        .unwrap();
    }
    let r = qp
        .submit_read(
            &qp.namespace(1).unwrap(),
            Lba(64),
            IoBuf::prefix(bed.pool.get().unwrap(), 4096).unwrap(),
            IoFlags::empty(),
            99,
        )
        .unwrap_err();
    assert!(
        matches!(
            r.error,
            NvmeError::QueueFull {
                depth: 4,
                needed: 1,
                ..
            }
        ),
        "{}",
        r.error
    );
    assert!(r
        .error
        .to_string()
        .contains("poll completions, then resubmit"));
    let back = one(r.bufs).into_buf();
    assert_eq!(qp.in_flight(), 4);
    qp.ring();
    let mut tags = Vec::new();
    qp.wait_for(4, T, |c| {
        c.result.unwrap();
        tags.push(c.tag)
    })
    .unwrap();
    tags.sort();
    assert_eq!(tags, vec![0, 1, 2, 3]);
    // Now the resubmission goes through.
    let buf = qp
        .read_blocking(
            &qp.namespace(1).unwrap(),
            Lba(64),
            IoBuf::prefix(back, 4096).unwrap(),
            T,
        )
        .unwrap()
        .into_buf();
    testbed::check_pattern(NVME0_NS1.id, 64 * 512, &buf.as_slice()[..4096]).unwrap();
}

#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn ring_wraps_many_times() {
    let bed = common::open(0, 4096, 16);
    let mut qp = bed.qp(7, 1); // 8 entries: the ring wraps every 8 commands
    let total = 3000u64;
    let mut next = 0u64;
    let mut done = 0u64;
    let lba_of = |i: u64| (i * 8) % 32768;
    while next < qp.depth() as u64 {
        qp.submit_read(
            &qp.namespace(1).unwrap(),
            Lba(lba_of(next)),
            IoBuf::prefix(bed.pool.get().unwrap(), 4096).unwrap(),
            IoFlags::empty(),
            next,
        )
        .unwrap();
        next += 1;
    }
    qp.ring();
    let mut free = Vec::new();
    while done < total {
        qp.poll(16, |c| {
            c.result.expect("read ok");
            let b = one(c.bufs).into_buf();
            testbed::check_pattern(NVME0_NS1.id, lba_of(c.tag) * 512, &b.as_slice()[..4096])
                .unwrap_or_else(|m| panic!("tag {}: {m:?}", c.tag));
            free.push(b);
            done += 1;
        })
        .unwrap();
        while let Some(b) = free.pop() {
            if next < total {
                qp.submit_read(
                    &qp.namespace(1).unwrap(),
                    Lba(lba_of(next)),
                    IoBuf::prefix(b, 4096).unwrap(),
                    IoFlags::empty(),
                    next,
                )
                .unwrap();
                next += 1;
            }
        }
        qp.ring();
    }
    let st = qp.stats();
    println!("{st:?}");
    assert_eq!(st.completions, total);
    assert_eq!(qp.in_flight(), 0);
}

#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn queue_pairs_on_several_threads() {
    let bed = common::open(0, 16 << 10, 64);
    let threads = 3usize;
    std::thread::scope(|s| {
        for t in 0..threads {
            let ctrl = bed.ctrl.clone();
            let pool = bed.pool.clone();
            s.spawn(move || {
                let mut qp = IoQueuePair::new(
                    &ctrl,
                    QueueOptions {
                        depth: 16,
                        ..Default::default()
                    },
                )
                .unwrap();
                let base = 70_000 + t as u64 * 10_000;
                for round in 0..20u64 {
                    let mut bufs = Vec::new();
                    for i in 0..8u64 {
                        let mut b = pool.get().unwrap();
                        common::fill_random(base + round * 8 + i, &mut b.as_mut_slice()[..16384]);
                        qp.submit_write(
                            &qp.namespace(1).unwrap(),
                            Lba(base + (round * 8 + i) * 32),
                            IoBuf::prefix(b, 16384).unwrap(),
                            IoFlags::empty(),
                            i,
                        )
                        .unwrap();
                    }
                    qp.ring();
                    qp.wait_for(8, T, |c| bufs.push(one(c.bufs).into_buf()))
                        .unwrap();
                    for (i, b) in bufs.drain(..).enumerate() {
                        qp.submit_read(
                            &qp.namespace(1).unwrap(),
                            Lba(base + (round * 8 + i as u64) * 32),
                            IoBuf::prefix(b, 16384).unwrap(),
                            IoFlags::empty(),
                            i as u64,
                        )
                        .unwrap();
                    }
                    qp.ring();
                    let mut expect = vec![0u8; 16384];
                    qp.wait_for(8, T, |c| {
                        c.result.unwrap();
                        common::fill_random(base + round * 8 + c.tag, &mut expect);
                        assert!(
                            one(c.bufs).into_buf().as_slice()[..16384] == expect[..],
                            "thread {t} round {round}"
                        );
                    })
                    .unwrap();
                }
                qp.qid()
            });
        }
    });
    assert_eq!(bed.ctrl.io_queues_in_use(), 0);
}

#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn block_queue_seam() {
    let bed = common::open(0, 64 << 10, 4);
    let mut qp = bed.qp(32, 1);
    let q: &mut dyn BlockQueue = &mut qp;
    assert_eq!(q.block_size(), 512);
    assert_eq!(q.capacity(), 64 << 20);
    assert_eq!(q.depth(), 32);
    assert_eq!(q.max_transfer(), 512 * 1024 * 32);
    q.submit_read(bed.pool.get().unwrap(), 4096 * 3, 8192, 5)
        .unwrap();
    let (b, e) = q
        .submit_read(bed.pool.get().unwrap(), 100, 512, 6)
        .unwrap_err();
    assert_eq!(e.kind, BlockErrorKind::InvalidRequest);
    assert!(e.message.contains("byte offset 100"), "{}", e.message);
    let (b, e) = q.submit_read(b, 0, 700, 6).unwrap_err();
    assert_eq!(e.kind, BlockErrorKind::InvalidRequest);
    let (_b, e) = q.submit_read(b, 64 << 20, 512, 6).unwrap_err();
    assert!(e.message.contains("past the end"), "{}", e.message);
    assert_eq!(q.in_flight(), 1);
    q.ring().unwrap();
    let mut n = 0;
    let start = std::time::Instant::now();
    while n == 0 && start.elapsed() < T {
        n += q
            .poll(4, &mut |c| {
                assert_eq!(c.tag, 5);
                assert_eq!(c.result.clone().unwrap(), 8192);
                testbed::check_pattern(NVME0_NS1.id, 4096 * 3, &c.buf.as_slice()[..8192]).unwrap();
            })
            .unwrap();
    }
    assert_eq!(n, 1);
}

/// A submission that should be refused.
type Submit =
    Box<dyn Fn(&mut IoQueuePair, ubdirect_core::UbBuf) -> Result<(), ubdirect_nvme::Rejected>>;

#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn every_validation_error_is_refused_with_its_message() {
    let bed = common::open(0, 8192, 4);
    let mut qp = bed.qp(8, 1);
    let stats = qp.stats();
    let mut buf = bed.pool.get().unwrap();
    let cases: Vec<(Submit, &str)> = vec![
        (
            Box::new(|q, b| {
                q.submit_read(
                    &q.namespace(1).unwrap(),
                    Lba(131_071),
                    IoBuf::prefix(b, 1024).unwrap(),
                    IoFlags::empty(),
                    0,
                )
            }),
            "LBA range 131071+2 is past the end of namespace 1 (131072 blocks)",
        ),
        (
            Box::new(|q, b| {
                q.submit_read(
                    &q.namespace(1).unwrap(),
                    Lba(u64::MAX),
                    IoBuf::prefix(b, 512).unwrap(),
                    IoFlags::empty(),
                    0,
                )
            }),
            "past the end",
        ),
        (
            Box::new(|q, b| {
                q.submit_read(
                    &q.namespace(1).unwrap(),
                    Lba(0),
                    IoBuf::prefix(b, 700).unwrap(),
                    IoFlags::empty(),
                    0,
                )
            }),
            "transfer length 700 is not a positive multiple",
        ),
        (
            Box::new(|q, b| {
                q.submit_read(
                    &q.namespace(1).unwrap(),
                    Lba(0),
                    IoBuf::prefix(b, 0).unwrap(),
                    IoFlags::empty(),
                    0,
                )
            }),
            "transfer length 0",
        ),
        (
            Box::new(|q, b| {
                q.submit_read(
                    &q.namespace(1).unwrap(),
                    Lba(0),
                    IoBuf::new(b, 2, 512).unwrap(),
                    IoFlags::empty(),
                    0,
                )
            }),
            "is not dword aligned",
        ),
    ];
    for (f, want) in cases {
        let r = f(&mut qp, buf).expect_err(want);
        let msg = r.error.to_string();
        assert!(msg.contains(want), "want {want:?} in {msg:?}");
        assert!(r.error.is_invalid_request(), "{msg}");
        buf = one(r.bufs).into_buf();
        assert_eq!(qp.in_flight(), 0, "{want}: nothing queued");
    }
    // A window past the buffer's end is refused when the IoBuf is built, the buffer back.
    let e = IoBuf::prefix(buf, 16384).unwrap_err();
    assert!(
        e.to_string()
            .contains("buffer of 8192 bytes is too small for a 16384-byte transfer"),
        "{e}"
    );
    let e = IoBuf::new(e.buf, 7680, 1024).unwrap_err();
    assert!(e.to_string().contains("too small"), "{e}");
    buf = e.buf;
    // A namespace that is not active has no handle.
    let e = qp.namespace(9).unwrap_err();
    assert!(
        e.to_string()
            .contains("namespace 9 is not an active namespace"),
        "{e}"
    );
    assert_eq!(qp.stats(), stats, "no command reached the queue");
    assert_eq!(qp.free_slots(), 8);
    // A queue pair on a missing namespace is refused too.
    let e = IoQueuePair::new(
        &bed.ctrl,
        QueueOptions {
            nsid: Some(3),
            ..Default::default()
        },
    )
    .err()
    .unwrap();
    assert!(
        matches!(e, NvmeError::NamespaceMissing { nsid: 3, active: 1 }),
        "{e}"
    );
    // The queue still works after all that.
    let buf = qp
        .read_blocking(
            &qp.namespace(1).unwrap(),
            Lba(0),
            IoBuf::prefix(buf, 512).unwrap(),
            T,
        )
        .unwrap()
        .into_buf();
    testbed::check_pattern(NVME0_NS1.id, 0, &buf.as_slice()[..512]).unwrap();
    // A second pool in the same domain serves the same queue.
    let pool2 = UbPool::with_hugepages(
        &bed.registry,
        PoolConfig {
            block_size: 4096,
            block_count: 2,
        },
        None,
    )
    .unwrap();
    qp.read_blocking(
        &qp.namespace(1).unwrap(),
        Lba(1),
        IoBuf::prefix(pool2.get().unwrap(), 4096).unwrap(),
        T,
    )
    .unwrap()
    .into_buf();
}

#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn timeout_sends_abort_and_the_buffers_still_come_back() {
    let bed = common::open(0, 8 << 20, 2);
    // A zero I/O timeout: the first idle check after submission declares a timeout.
    let mut qp = IoQueuePair::new(
        &bed.ctrl,
        QueueOptions {
            depth: 32,
            io_timeout: std::time::Duration::ZERO,
            ..Default::default()
        },
    )
    .unwrap();
    // The doorbell is rung only after the timeout fired: the controller cannot see the command
    // before then, so the zero timeout fires whatever the host's speed (a rung 8 MiB read on a
    // quiet host can finish within the empty polls that come before the first idle check).
    let mut saw_timeout = None;
    let mut back = None;
    qp.submit_read(
        &qp.namespace(1).unwrap(),
        Lba(0),
        IoBuf::prefix(bed.pool.get().unwrap(), 8 << 20).unwrap(),
        IoFlags::empty(),
        7,
    )
    .unwrap();
    let start = std::time::Instant::now();
    while back.is_none() {
        match qp.poll(1, |c| back = Some(c)) {
            Ok(_) => {}
            Err(e) => match &saw_timeout {
                None => {
                    saw_timeout = Some((e, start.elapsed()));
                    qp.ring();
                }
                // With a zero io_timeout the aborted commands are past their deadline again
                // at the next check: Report escalates to Wedged (row 16) until they complete.
                Some(_) => assert!(matches!(e, NvmeError::Wedged { .. }), "{e}"),
            },
        }
        assert!(start.elapsed() < T, "the read never came back");
    }
    let c = back.unwrap();
    assert_eq!(c.tag, 7);
    let (e, at) = saw_timeout.expect("the zero timeout fired before the doorbell was rung");
    println!("timeout path: {e} after {at:?}");
    // The one documented kind (RELIABILITY.md row 16): Timeout, after the Abort was sent.
    assert!(
        matches!(e, NvmeError::Timeout { command: "Read", qid, .. } if qid == qp.qid()),
        "{e}"
    );
    assert!(e.to_string().contains("an Abort was sent for it"), "{e}");
    // Measured 0.8 ms on a quiet host and 20-40 ms at a load average of ~25 (TCG on the shared
    // 2-core host): the bound is ~3x the slowest.
    assert!(at < std::time::Duration::from_millis(120), "{at:?}");
    let s = qp.stats();
    // One request of 8 MiB is 16 commands of 512 KiB (MDTS): each timed out and got its Abort.
    assert_eq!(s.commands, 16, "{s:?}");
    assert_eq!((s.timeouts, s.aborts_sent, s.resets), (16, 16, 0), "{s:?}");
    // QEMU does not abort a command it had not fetched (the Abort completes with "not
    // aborted"): once rung, the read completes intact.
    let b = one(c.bufs).into_buf();
    c.result
        .expect("QEMU completes the read the Abort did not stop");
    testbed::check_pattern(NVME0_NS1.id, 0, &b.as_slice()[..8 << 20]).unwrap();
    assert_eq!(qp.in_flight(), 0);
}

#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn dropping_a_busy_queue_pair_deletes_it_and_returns_the_buffers() {
    let bed = common::open(0, 1 << 20, 8);
    let mut qp = bed.qp(16, 1);
    for i in 0..8u64 {
        qp.submit_read(
            &qp.namespace(1).unwrap(),
            Lba(i * 2048),
            IoBuf::prefix(bed.pool.get().unwrap(), 1 << 20).unwrap(),
            IoFlags::empty(),
            i,
        )
        .unwrap();
    }
    qp.ring();
    assert_eq!(bed.pool.stats().in_use, 8);
    drop(qp); // Delete I/O SQ/CQ first, then the request buffers go back to the pool.
    assert_eq!(bed.pool.stats().in_use, 0);
    assert_eq!(bed.ctrl.io_queues_in_use(), 0);
    let mut qp = bed.qp(16, 1);
    let b = qp
        .read_blocking(
            &qp.namespace(1).unwrap(),
            Lba(0),
            IoBuf::prefix(bed.pool.get().unwrap(), 4096).unwrap(),
            T,
        )
        .unwrap()
        .into_buf();
    testbed::check_pattern(NVME0_NS1.id, 0, &b.as_slice()[..4096]).unwrap();
}
