//! One generic I/O function, unchanged, against a PCIe queue pair (the NVMe device model) and an
//! NVMe/TCP queue pair (a fake target on loopback with a real medium): write, read back
//! byte-exact, flush, write zeroes, deallocate, and refused requests handing their buffer back.
mod model_support;
mod tcp_target;

use std::sync::Arc;
use std::time::{Duration, Instant};

use ubdirect_core::{DmaDomain, UbPool, UbRegistry};
use ubdirect_devmodel::nvme::NvmeConfig;
use ubdirect_nvme::qpair::{Deallocate, Flush, QueuePair, Read, TcpQueuePair, Write, WriteZeroes};
use ubdirect_nvme::{Controller, IoBuf, IoBufs, IoCompletion, IoFlags, Lba, NvmeError};

/// The one completion the queue pair owes, within 5 s.
fn next<Q: QueuePair<Payload = IoBufs>>(q: &mut Q) -> IoCompletion<IoBufs> {
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut got = None;
    while got.is_none() {
        assert!(Instant::now() < deadline, "no completion within 5 s");
        q.poll(1, |c| got = Some(c)).expect("poll");
    }
    got.unwrap()
}

fn window(c: IoCompletion<IoBufs>) -> IoBuf {
    match c.bufs {
        IoBufs::One(b) => b,
        other => panic!("a data command came back with {other:?}"),
    }
}

/// The same I/O on any transport: `pool` blocks hold at least two of the namespace's blocks.
fn io_roundtrip<Q: QueuePair<Payload = IoBufs>>(q: &mut Q, pool: &Arc<UbPool>) {
    let ns = q.namespace(1).expect("namespace 1");
    let len = 2 * ns.lba_size() as usize;
    let at = Lba(4);
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
    assert!(next(q).result.is_ok());
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

    q.submit(Deallocate::new(&ns, Lba(5), 1).tag(6))
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

#[test]
fn the_same_io_runs_on_a_pcie_queue_pair() {
    let (reg, _m, dev) = model_support::model(NvmeConfig::default());
    let ctrl = Controller::open_device(&reg, dev, model_support::fast_opts()).unwrap();
    let pool = model_support::anon_pool(&reg, 8192, 4);
    let mut q = model_support::queue(&ctrl, 8);
    io_roundtrip(&mut q, &pool);
}

#[test]
fn the_same_io_runs_on_an_nvme_tcp_queue_pair() {
    let (ctrl, medium) = tcp_target::connect();
    let reg = UbRegistry::new(DmaDomain::host_only());
    let pool = model_support::anon_pool(&reg, 8192, 4);
    let mut q = TcpQueuePair::open(&ctrl, &[1], 8).expect("an I/O queue");
    io_roundtrip(&mut q, &pool);
    // The target's medium holds what the generic function left: block 4 zeroed, block 5
    // deallocated (this target reads it back as zeroes).
    let m = medium.lock().unwrap();
    let lba = tcp_target::LBA;
    assert!(m[4 * lba..6 * lba].iter().all(|&x| x == 0));
    assert!(m[6 * lba..7 * lba].iter().all(|&x| x == 0x11), "untouched");
}
