//! The embedder's I/O API against the NVMe model on the host: a namespace handle
//! with its limits, requests in LBAs with buffer windows, checked against the namespace before
//! anything reaches the device; the completion hands back the window that was submitted.

mod model_support;

use std::time::Duration;

use model_support::{anon_pool, fast_opts, model, one, queue};
use ubdirect_devmodel::nvme::NvmeConfig;
use ubdirect_nvme::spec::command::io_opcode;
use ubdirect_nvme::{Controller, IoBuf, IoFlags, IoQueuePair, Lba, NvmeError, QueueOptions};

const T: Duration = Duration::from_secs(5);

#[test]
fn the_namespace_handle_carries_the_limits_requests_are_checked_against() {
    // The default model: namespace 1, 2048 blocks of 512 bytes, MDTS 5 (128 KiB).
    let (reg, _m, dev) = model(NvmeConfig::default());
    let ctrl = Controller::open_device(&reg, dev, fast_opts()).unwrap();
    let ns = ctrl.namespace(1).unwrap();
    assert_eq!(
        (ns.nsid(), ns.lba_size(), ns.blocks(), ns.capacity_bytes()),
        (1, 512, 2048, 2048 * 512)
    );
    assert_eq!(ns.max_blocks_per_command(), 256);
    assert_eq!(ctrl.first_namespace().unwrap(), ns);
    assert_eq!(ns.lba_at(4096).unwrap(), Lba(8));
    assert!(matches!(
        ns.lba_at(4097),
        Err(NvmeError::OffsetNotBlockAligned {
            offset: 4097,
            lba_size: 512
        })
    ));
    assert_eq!(ns.last_blocks(8), Some(Lba(2040)));
    assert_eq!(ns.last_blocks(4096), None);
    let e = ctrl.namespace(2).unwrap_err();
    assert!(
        matches!(e, NvmeError::NamespaceMissing { nsid: 2, active: 1 }),
        "{e}"
    );
}

#[test]
fn a_wrong_size_buffer_or_an_out_of_range_lba_is_refused_before_submission() {
    let (reg, m, dev) = model(NvmeConfig::default());
    let ctrl = Controller::open_device(&reg, dev, fast_opts()).unwrap();
    let pool = anon_pool(&reg, 8192, 2);
    let ns = ctrl.namespace(1).unwrap();
    let mut qp = queue(&ctrl, 8);
    let mut before = vec![0u8; 2048 * 512];
    m.read_medium(1, 0, &mut before);
    let stats = qp.stats();

    // A window past the buffer's end: refused when built, the buffer back untouched.
    let e = IoBuf::new(pool.get().unwrap(), 4096, 8192).unwrap_err();
    assert!(
        matches!(
            e.error,
            NvmeError::BufferTooSmall {
                need: 12288,
                have: 8192,
                offset: 4096
            }
        ),
        "{e}"
    );
    let buf = e.buf;

    // A length that is not a whole number of blocks.
    let r = qp
        .submit_write(
            &ns,
            Lba(0),
            IoBuf::prefix(buf, 700).unwrap(),
            IoFlags::FUA,
            1,
        )
        .unwrap_err();
    assert!(
        matches!(
            r.error,
            NvmeError::LengthNotBlockMultiple {
                len: 700,
                lba_size: 512,
                ..
            }
        ),
        "{}",
        r.error
    );
    let back = one(r.bufs);
    assert_eq!(
        (back.offset(), back.len()),
        (0, 700),
        "the same window back"
    );

    // Blocks past the namespace's end (2047 + 2 > 2048), and an LBA that overflows.
    let buf = back.into_buf();
    let r = qp
        .submit_write(
            &ns,
            Lba(2047),
            IoBuf::new(buf, 512, 1024).unwrap(),
            IoFlags::empty(),
            2,
        )
        .unwrap_err();
    assert!(
        matches!(
            r.error,
            NvmeError::LbaOutOfRange {
                nsid: 1,
                slba: 2047,
                nlb: 2,
                nsze: 2048
            }
        ),
        "{}",
        r.error
    );
    let back = one(r.bufs);
    assert_eq!((back.offset(), back.len()), (512, 1024));
    let r = qp
        .submit_read(&ns, Lba(u64::MAX), back, IoFlags::empty(), 3)
        .unwrap_err();
    assert!(
        matches!(r.error, NvmeError::LbaOutOfRange { .. }),
        "{}",
        r.error
    );
    let r = qp.submit_write_zeroes(&ns, Lba(2000), 49, 4).unwrap_err();
    assert!(
        matches!(r.error, NvmeError::LbaOutOfRange { nlb: 49, .. }),
        "{}",
        r.error
    );

    // Nothing was queued, nothing reached the device, the medium is unchanged.
    qp.ring();
    assert_eq!(qp.in_flight(), 0);
    assert_eq!(qp.poll(8, |_| panic!("no request was queued")).unwrap(), 0);
    assert_eq!(qp.stats(), stats);
    let st = m.stats();
    assert_eq!(
        (
            st.io_count(io_opcode::READ),
            st.io_count(io_opcode::WRITE),
            st.io_count(io_opcode::WRITE_ZEROES)
        ),
        (0, 0, 0)
    );
    let mut after = vec![0u8; 2048 * 512];
    m.read_medium(1, 0, &mut after);
    assert!(before == after, "a refused request changed the medium");
}

#[test]
fn a_completion_hands_back_the_window_that_was_submitted() {
    let (reg, m, dev) = model(NvmeConfig::default());
    let ctrl = Controller::open_device(&reg, dev, fast_opts()).unwrap();
    let pool = anon_pool(&reg, 64 << 10, 2);
    let ns = ctrl.first_namespace().unwrap();
    let mut qp = IoQueuePair::new(&ctrl, QueueOptions::default()).unwrap();
    let mut w = IoBuf::new(pool.get().unwrap(), 1024, 4096).unwrap();
    for (i, b) in w.as_mut_slice().iter_mut().enumerate() {
        *b = (i * 13 + 1) as u8;
    }
    // Submit, ring, poll, reap: the window (offset 1024, 4096 bytes) comes back as it went.
    qp.submit_write(&ns, Lba(16), w, IoFlags::FUA, 7).unwrap();
    qp.ring();
    let mut got = None;
    qp.wait_for(1, T, |c| got = Some(c)).unwrap();
    let c = got.unwrap();
    assert_eq!((c.tag, c.result.as_ref().ok()), (7, Some(&4096)));
    let w = one(c.bufs);
    assert_eq!((w.offset(), w.len()), (1024, 4096));
    let mut medium = vec![0u8; 4096];
    m.read_medium(1, 16 * 512, &mut medium);
    assert!(
        medium[..] == w.as_slice()[..],
        "the window's bytes were written"
    );
    // The blocking call returns the window typed, no unpacking.
    let r = qp
        .read_blocking(
            &ns,
            Lba(16),
            IoBuf::new(pool.get().unwrap(), 512, 4096).unwrap(),
            T,
        )
        .unwrap();
    assert_eq!((r.offset(), r.len()), (512, 4096));
    assert!(r.as_slice() == w.as_slice());
}
