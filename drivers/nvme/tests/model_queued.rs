//! Queued requests: requests that need more command slots than are free (above
//! MDTS, or more commands than the whole queue holds) wait in the queue pair's pending list and
//! go out as completions free slots, instead of failing with QueueFull / RequestTooLarge.
//! The real driver against the well-behaved NVMe model on the host.

mod model_support;

use std::time::Duration;

use model_support::{anon_pool, fast_opts, model, one, queue, small_mdts};
use ubdirect_nvme::{Controller, NvmeError};
use ubdirect_nvme::{IoBuf, IoFlags, Lba};

const T: Duration = Duration::from_secs(5);

fn byte(i: usize, seed: usize) -> u8 {
    (i.wrapping_mul(31) ^ seed.wrapping_mul(131) ^ (i >> 9)) as u8
}

#[test]
fn a_request_of_more_commands_than_the_queue_holds_is_queued_and_completes() {
    let (reg, m, dev) = model(small_mdts());
    let ctrl = Controller::open_device(&reg, dev, fast_opts()).unwrap();
    assert_eq!(ctrl.max_command_bytes(), 16 << 10);
    let pool = anon_pool(&reg, 256 << 10, 2);
    // Depth 2: a 256 KiB request (+ 8 bytes of buffer offset) is 16 commands.
    let mut qp = queue(&ctrl, 2);
    let len = 240 << 10;
    let mut w = pool.get().unwrap();
    for (i, b) in w.as_mut_slice().iter_mut().enumerate() {
        *b = byte(i, 1);
    }
    let before = qp.stats();
    let w = qp
        .write_blocking(
            &qp.namespace(1).unwrap(),
            Lba(64),
            IoBuf::new(w, 8, len).unwrap(),
            IoFlags::empty(),
            T,
        )
        .unwrap()
        .into_buf();
    let st = qp.stats();
    assert_eq!(st.commands - before.commands, 15, "240 KiB / 16 KiB");
    assert_eq!(st.queued_requests - before.queued_requests, 1);
    assert_eq!((qp.in_flight(), qp.pending_requests()), (0, 0));
    let mut medium = vec![0u8; len];
    m.read_medium(1, 64 * 512, &mut medium);
    assert!(medium[..] == w.as_slice()[8..8 + len], "written data");
    let r = qp
        .read_blocking(
            &qp.namespace(1).unwrap(),
            Lba(64),
            IoBuf::new(pool.get().unwrap(), 4, len).unwrap(),
            T,
        )
        .unwrap()
        .into_buf();
    assert!(r.as_slice()[4..4 + len] == medium[..], "read back");
    assert!(m.dma_faults().is_empty());
}

#[test]
fn requests_beyond_the_free_slots_wait_in_order_and_all_complete() {
    let (reg, m, dev) = model(small_mdts());
    let ctrl = Controller::open_device(&reg, dev, fast_opts()).unwrap();
    let pool = anon_pool(&reg, 64 << 10, 9);
    // Depth 8: eight 64 KiB reads (4 commands each) are 32 commands for 8 slots.
    let mut qp = queue(&ctrl, 8);
    let mut w = pool.get().unwrap();
    for (i, b) in w.as_mut_slice().iter_mut().enumerate() {
        *b = byte(i, 2);
    }
    // 512 KiB of known data: eight 64 KiB writes of the same buffer at LBA 128 k.
    let mut w = Some(w);
    for k in 0..8u64 {
        w = Some(
            qp.write_blocking(
                &qp.namespace(1).unwrap(),
                Lba(k * 128),
                IoBuf::prefix(w.take().unwrap(), 64 << 10).unwrap(),
                IoFlags::empty(),
                T,
            )
            .unwrap()
            .into_buf(),
        );
    }
    drop(w);
    for k in 0..8u64 {
        qp.submit_read(
            &qp.namespace(1).unwrap(),
            Lba(k * 128),
            IoBuf::prefix(pool.get().unwrap(), 64 << 10).unwrap(),
            IoFlags::empty(),
            k,
        )
        .unwrap_or_else(|r| panic!("read {k} refused: {}", r.error));
    }
    assert_eq!(qp.in_flight(), 8);
    assert_eq!(
        qp.pending_requests(),
        6,
        "the first two reads took the 8 slots (4 commands each), the other 6 wait"
    );
    qp.ring();
    let mut tags = Vec::new();
    qp.wait_for(8, T, |c| {
        assert_eq!(c.result.as_ref().ok(), Some(&(64 << 10)), "tag {}", c.tag);
        let b = one(c.bufs).into_buf();
        assert!(
            b.as_slice()
                .iter()
                .enumerate()
                .all(|(i, &v)| v == byte(i, 2)),
            "read {} data",
            c.tag
        );
        tags.push(c.tag);
    })
    .unwrap();
    assert_eq!(
        tags,
        (0..8).collect::<Vec<_>>(),
        "queued requests go out in order"
    );
    assert_eq!((qp.in_flight(), qp.pending_requests()), (0, 0));
    // Request slots are the limit: a ninth request in flight is QueueFull.
    for k in 0..8u64 {
        qp.submit_read(
            &qp.namespace(1).unwrap(),
            Lba(k * 128),
            IoBuf::prefix(pool.get().unwrap(), 4096).unwrap(),
            IoFlags::empty(),
            k,
        )
        .unwrap();
    }
    let r = qp
        .submit_read(
            &qp.namespace(1).unwrap(),
            Lba(0),
            IoBuf::prefix(pool.get().unwrap(), 4096).unwrap(),
            IoFlags::empty(),
            9,
        )
        .unwrap_err();
    assert!(
        matches!(
            r.error,
            NvmeError::QueueFull {
                needed: 1,
                depth: 8,
                ..
            }
        ),
        "{}",
        r.error
    );
    assert!(m.dma_faults().is_empty());
}
