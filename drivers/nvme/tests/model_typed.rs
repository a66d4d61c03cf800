//! Completions typed by what was submitted: a queue pair's payload type `P` comes
//! back in its completion as it went in, so an embedder neither matches nor unwraps.
//! `IoQueuePair::<IoBuf>` hands back the window itself, `IoQueuePair::<(IoBuf, T)>` the window
//! and the caller's own context; the default (`IoBufs`) keeps every request kind.

mod model_support;

use std::time::{Duration, Instant};

use model_support::{fast_opts, model};
use ubdirect_core::{PoolConfig, UbPool};
use ubdirect_devmodel::nvme::NvmeConfig;
use ubdirect_nvme::spec::command::io_opcode;
use ubdirect_nvme::{
    Controller, IoBuf, IoCompletion, IoFlags, IoPayload, IoQueuePair, Lba, NvmeError, QueueOptions,
};

const T: Duration = Duration::from_secs(5);

/// Ring, then poll until `n` completions came back (at most `T`).
fn reap<P: IoPayload>(qp: &mut IoQueuePair<P>, n: usize) -> Vec<IoCompletion<P>> {
    qp.ring();
    let mut out = Vec::with_capacity(n);
    let deadline = Instant::now() + T;
    while out.len() < n {
        assert!(
            Instant::now() < deadline,
            "{} of {n} completions",
            out.len()
        );
        qp.poll(16, |c| out.push(c)).unwrap();
    }
    out
}

#[test]
fn a_queue_pair_of_windows_hands_back_each_window_itself() {
    let (reg, m, dev) = model(NvmeConfig::default());
    let ctrl = Controller::open_device(&reg, dev, fast_opts()).unwrap();
    let pool = UbPool::with_anonymous(
        &reg,
        PoolConfig {
            block_size: 64 << 10,
            block_count: 4,
        },
        None,
    )
    .unwrap();
    let ns = ctrl.first_namespace().unwrap();
    let mut qp = IoQueuePair::<IoBuf>::with_payload(&ctrl, QueueOptions::default()).unwrap();
    let mut w = IoBuf::new(pool.get().unwrap(), 512, 4096).unwrap();
    w.as_mut_slice().fill(0x3c);
    qp.submit_write(&ns, Lba(32), w, IoFlags::FUA, 1).unwrap();
    let done = reap(&mut qp, 1);
    // `bufs` is an IoBuf: no enum to match.
    let w: &IoBuf = &done[0].bufs;
    assert_eq!((done[0].tag, w.offset(), w.len()), (1, 512, 4096));
    assert_eq!(done[0].result.as_ref().ok(), Some(&4096));
    let mut medium = vec![0u8; 4096];
    m.read_medium(1, 32 * 512, &mut medium);
    assert!(medium.iter().all(|&b| b == 0x3c), "written");

    qp.submit_read(
        &ns,
        Lba(32),
        IoBuf::prefix(pool.get().unwrap(), 4096).unwrap(),
        IoFlags::empty(),
        2,
    )
    .unwrap();
    let done = reap(&mut qp, 1);
    assert_eq!(done[0].tag, 2);
    assert!(
        done[0].bufs.as_slice().iter().all(|&b| b == 0x3c),
        "read back"
    );

    // A refused request hands back the same type too.
    let bad = IoBuf::prefix(pool.get().unwrap(), 4096).unwrap();
    let r = qp
        .submit_read(&ns, Lba(ns.blocks()), bad, IoFlags::empty(), 3)
        .unwrap_err();
    let back: IoBuf = r.bufs;
    assert_eq!(back.len(), 4096);
    assert!(
        matches!(r.error, NvmeError::LbaOutOfRange { .. }),
        "{}",
        r.error
    );

    // A Flush on a queue pair of windows carries a window through (not transferred) and hands
    // it back as it went.
    let flushes = m.stats().io.get(&io_opcode::FLUSH).copied().unwrap_or(0);
    let w = IoBuf::new(back.into_buf(), 1024, 512).unwrap();
    qp.submit_flush_with(&ns, w, 4).unwrap();
    let done = reap(&mut qp, 1);
    assert_eq!(done[0].tag, 4);
    assert_eq!(done[0].result.as_ref().ok(), Some(&0));
    assert_eq!((done[0].bufs.offset(), done[0].bufs.len()), (1024, 512));
    assert_eq!(
        m.stats().io.get(&io_opcode::FLUSH).copied().unwrap_or(0),
        flushes + 1,
        "the model saw the Flush"
    );
}

/// The caller's own per-request context, carried with the window.
#[derive(Debug, PartialEq)]
struct Ctx {
    file_block: u64,
    kind: &'static str,
}

#[test]
fn a_window_with_the_caller_s_context_comes_back_with_both() {
    let (reg, _m, dev) = model(NvmeConfig::default());
    let ctrl = Controller::open_device(&reg, dev, fast_opts()).unwrap();
    let pool = UbPool::with_anonymous(
        &reg,
        PoolConfig {
            block_size: 64 << 10,
            block_count: 8,
        },
        None,
    )
    .unwrap();
    let ns = ctrl.first_namespace().unwrap();
    let mut qp = IoQueuePair::<(IoBuf, Ctx)>::with_payload(&ctrl, QueueOptions::default()).unwrap();
    for i in 0..4u64 {
        let w = IoBuf::prefix(pool.get().unwrap(), 4096).unwrap();
        let ctx = Ctx {
            file_block: 100 + i,
            kind: "readahead",
        };
        qp.submit_read(&ns, Lba(i * 8), (w, ctx), IoFlags::empty(), i)
            .unwrap();
    }
    let mut done = reap(&mut qp, 4);
    done.sort_by_key(|c| c.tag);
    for (i, c) in done.iter().enumerate() {
        let (w, ctx) = &c.bufs;
        assert_eq!(w.len(), 4096);
        assert_eq!(
            ctx,
            &Ctx {
                file_block: 100 + i as u64,
                kind: "readahead"
            }
        );
        assert_eq!(c.result.as_ref().ok(), Some(&4096));
    }
}
