//! One generic I/O function for every NVMe transport: write, read back byte-exact, flush,
//! write zeroes, deallocate, and a refused request handing its buffer back. The host tests
//! (qpair_roundtrip.rs: the device model, a fake NVMe/TCP target) and the guest tests
//! (guest_qpair_roundtrip.rs: QEMU's NVMe through vfio-pci, the kernel's nvmet over TCP) run it
//! unchanged.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use ubdirect_core::UbPool;
use ubdirect_nvme::qpair::{Deallocate, Flush, QueuePair, Read, Write, WriteZeroes};
use ubdirect_nvme::{IoBuf, IoBufs, IoCompletion, IoFlags, Lba, NvmeError};

/// The one completion the queue pair owes, within 5 s.
pub fn next<Q: QueuePair<Payload = IoBufs>>(q: &mut Q) -> IoCompletion<IoBufs> {
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut got = None;
    while got.is_none() {
        assert!(Instant::now() < deadline, "no completion within 5 s");
        q.poll(1, |c| got = Some(c)).expect("poll");
    }
    got.unwrap()
}

pub fn window(c: IoCompletion<IoBufs>) -> IoBuf {
    match c.bufs {
        IoBufs::One(b) => b,
        other => panic!("a data command came back with {other:?}"),
    }
}

/// The same I/O on any transport, on namespace 1 at blocks `at` and `at + 1` (the block after
/// them must exist): `pool` blocks hold at least two of the namespace's blocks.
pub fn io_roundtrip<Q: QueuePair<Payload = IoBufs>>(q: &mut Q, pool: &Arc<UbPool>, at: Lba) {
    let ns = q.namespace(1).expect("namespace 1");
    let len = 2 * ns.lba_size() as usize;
    let mut b = pool.get().unwrap();
    for (i, x) in b.as_mut_slice()[..len].iter_mut().enumerate() {
        *x = (i % 251) as u8 ^ 0xa5;
    }
    let want = b.as_slice()[..len].to_vec();
    let w = Write::new(&ns, at, IoBuf::prefix(b, len).unwrap())
        .flags(IoFlags::FUA)
        .tag(1);
    q.submit(w).expect("write queued");
    q.ring();
    let c = next(q);
    assert_eq!((c.tag, c.result.as_ref().ok()), (1, Some(&len)));
    let mut b = window(c);
    b.as_mut_slice().fill(0);
    q.submit(Read::new(&ns, at, b).tag(2)).expect("read queued");
    q.ring();
    let c = next(q);
    assert_eq!(c.tag, 2);
    assert_eq!(c.result.as_ref().ok(), Some(&len), "{:?}", c.result);
    let b = window(c);
    assert!(
        b.as_slice() == &want[..],
        "read back differs from what was written"
    );

    q.submit(Flush::new(&ns).tag(3)).expect("flush queued");
    q.ring();
    let c = next(q);
    assert!(c.result.is_ok() && c.tag == 3, "{:?}", c.result);

    q.submit(WriteZeroes::new(&ns, at, 1).tag(4))
        .expect("write zeroes queued");
    q.ring();
    let c = next(q);
    assert!(c.result.is_ok(), "write zeroes: {:?}", c.result);
    q.submit(Read::new(&ns, at, b).tag(5)).expect("read queued");
    q.ring();
    let b = window(next(q));
    let half = len / 2;
    assert!(b.as_slice()[..half].iter().all(|&x| x == 0), "zeroed block");
    assert_eq!(
        &b.as_slice()[half..],
        &want[half..],
        "the next block kept its data"
    );

    q.submit(Deallocate::new(&ns, Lba(at.0 + 1), 1).tag(6))
        .expect("deallocate queued");
    q.ring();
    let c = next(q);
    assert!(c.result.is_ok() && c.tag == 6, "{:?}", c.result);

    // A read past the namespace's end is refused before anything is queued; the window comes
    // back untouched.
    let iova = b.iova();
    let end = Lba(ns.blocks() - 1);
    let r = q.submit(Read::new(&ns, end, b).tag(7));
    let rej = r.expect_err("a read past the end was queued");
    assert!(
        matches!(rej.error, NvmeError::LbaOutOfRange { .. }),
        "{}",
        rej.error
    );
    match rej.bufs {
        IoBufs::One(b) => assert_eq!(b.iova(), iova),
        other => panic!("the buffer did not come back: {other:?}"),
    }
    assert_eq!(q.in_flight(), 0);
    assert!(matches!(
        q.namespace(99),
        Err(NvmeError::NamespaceMissing { nsid: 99, .. })
    ));
}
