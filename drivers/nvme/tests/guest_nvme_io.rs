//! Guest tests: data integrity through the real device, 512 B to 8 MiB, page-crossing and
//! non-page-aligned buffer offsets (guard bytes around each transfer prove the PRPs cover
//! exactly the range), MDTS splitting, the 4 KiB-LBA namespace, both namespaces on one queue,
//! scatter lists, Write Zeroes / Dataset Management / Flush, shadow doorbells on and off.
//!
//! nvme0: LBAs below 32768 keep the host's pattern (read tests); the rest is scratch.

mod common;

use common::{fill_random, one, T};
use ubdirect_core::UbBuf;
use ubdirect_nvme::{
    ControllerOptions, IoBufs, IoQueuePair, NvmeError, Segment, SgList, ShadowDoorbells,
};
use ubdirect_nvme::{IoBuf, IoFlags, Lba};
use ubdirect_testbed::{self as testbed, NVME0_NS1, NVME1_NS1, NVME1_NS2};

const GUARD: u8 = 0xa5;
const SIZES: &[usize] = &[
    512,
    1024,
    4096,
    4608,
    12 * 1024,
    65536,
    129 * 1024,
    512 * 1024,
    1 << 20,
    4 << 20,
    8 << 20,
];
const OFFSETS: &[usize] = &[0, 4, 512, 4092, 8192 + 8];

fn guard_fill(buf: &mut UbBuf) {
    buf.as_mut_slice().fill(GUARD);
}

fn guard_check(buf: &UbBuf, off: usize, len: usize) {
    let s = buf.as_slice();
    let before = s[..off].iter().position(|&b| b != GUARD);
    assert!(
        before.is_none(),
        "byte {before:?} before the transfer (offset {off}) was written"
    );
    let after = s[off + len..(off + len + 8192).min(s.len())]
        .iter()
        .position(|&b| b != GUARD);
    assert!(
        after.is_none(),
        "byte {after:?} after the transfer (offset {off}, len {len}) was written"
    );
}

#[allow(clippy::too_many_arguments)]
fn read_check(
    qp: &mut IoQueuePair,
    buf: UbBuf,
    nsid: u32,
    lba: u64,
    lba_size: u64,
    id: u8,
    off: usize,
    len: usize,
) -> UbBuf {
    let mut buf = buf;
    guard_fill(&mut buf);
    let buf = qp
        .read_blocking(
            &qp.namespace(nsid).unwrap(),
            Lba(lba),
            IoBuf::new(buf, off, len).unwrap(),
            T,
        )
        .unwrap_or_else(|r| panic!("read ns{nsid} lba {lba} len {len} off {off}: {}", r.error))
        .into_buf();
    if let Err(m) = testbed::check_pattern(id, lba * lba_size, &buf.as_slice()[off..off + len]) {
        panic!("ns{nsid} lba {lba} len {len} buffer offset {off}: {m:?}");
    }
    guard_check(&buf, off, len);
    buf
}

/// Checks that the segments of `sg`, one after another, hold image `id`'s pattern from byte
/// `pos` on.
fn check_segments(id: u8, mut pos: u64, sg: &SgList) {
    for s in sg.iter() {
        testbed::check_pattern(id, pos, &s.buf.as_slice()[s.offset..s.offset + s.len])
            .unwrap_or_else(|m| panic!("segment at byte {pos}: {m:?}"));
        pos += s.len as u64;
    }
}

/// Fills the segments of `sg` with random bytes (seed `seed` + the segment's index) and writes
/// them to namespace 1 at `lba` with one writev; returns the list written.
fn fill_and_writev(qp: &mut IoQueuePair, sg: SgList, seed: u64, lba: u64) -> Box<SgList> {
    let mut w = Box::new(SgList::new());
    for (i, mut s) in sg.into_segments().enumerate() {
        fill_random(
            i as u64 + seed,
            &mut s.buf.as_mut_slice()[s.offset..s.offset + s.len],
        );
        w.push(s).unwrap();
    }
    qp.writev_blocking(&qp.namespace(1).unwrap(), Lba(lba), w, IoFlags::empty(), T)
        .expect("writev")
}

/// Checks that `dst` holds the segments of `w`, one after another, from byte `pos` on.
fn check_read_back(w: &SgList, dst: &UbBuf, mut pos: usize) {
    for s in w.iter() {
        assert!(s.buf.as_slice()[s.offset..s.offset + s.len] == dst.as_slice()[pos..pos + s.len]);
        pos += s.len;
    }
}

#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn reads_512b_to_8mib_at_unaligned_buffer_offsets() {
    let bed = common::open(0, 16 << 20, 2);
    let mut qp = bed.qp(64, 1);
    let mut buf = bed.pool.get().unwrap();
    let mut n = 0;
    for (i, &len) in SIZES.iter().enumerate() {
        for (j, &off) in OFFSETS.iter().enumerate() {
            let lba = ((i * 7919 + j * 104_729) as u64 * 8) % (32768 - 16384);
            buf = read_check(&mut qp, buf, 1, lba, 512, NVME0_NS1.id, off, len);
            n += 1;
        }
    }
    let st = qp.stats();
    println!("{n} reads, {st:?}");
    assert!(
        st.commands > st.requests,
        "8 MiB reads were split at MDTS (512 KiB)"
    );
}

#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn writes_read_back_512b_to_8mib_at_unaligned_offsets() {
    let bed = common::open(0, 16 << 20, 2);
    let mut qp = bed.qp(64, 1);
    let mut src = bed.pool.get().unwrap();
    let mut dst = bed.pool.get().unwrap();
    let base = 65536u64; // upper half of nvme0
    for (i, &len) in SIZES.iter().enumerate() {
        for (j, &off) in OFFSETS.iter().enumerate() {
            let lba = base + (i as u64 * 977 + j as u64 * 31) * 8 % 8192;
            fill_random(
                (i * 100 + j) as u64 + 1,
                &mut src.as_mut_slice()[off..off + len],
            );
            src = qp
                .write_blocking(
                    &qp.namespace(1).unwrap(),
                    Lba(lba),
                    IoBuf::new(src, off, len).unwrap(),
                    if j % 2 == 0 {
                        IoFlags::FUA
                    } else {
                        IoFlags::empty()
                    },
                    T,
                )
                .unwrap_or_else(|r| panic!("write lba {lba} len {len} off {off}: {}", r.error))
                .into_buf();
            let doff = OFFSETS[(j + 1) % OFFSETS.len()];
            guard_fill(&mut dst);
            dst = qp
                .read_blocking(
                    &qp.namespace(1).unwrap(),
                    Lba(lba),
                    IoBuf::new(dst, doff, len).unwrap(),
                    T,
                )
                .unwrap_or_else(|r| panic!("read back: {}", r.error))
                .into_buf();
            assert!(
                src.as_slice()[off..off + len] == dst.as_slice()[doff..doff + len],
                "len {len}: data read back at buffer offset {doff} differs from what was written from offset {off}"
            );
            guard_check(&dst, doff, len);
        }
    }
    // One write the host verifies in the backing file after the guest exits.
    let pattern: Vec<u8> = (0..32u8).map(|b| b.wrapping_mul(7) ^ 0x5a).collect();
    src.as_mut_slice()[..512].fill(0);
    src.as_mut_slice()[..32].copy_from_slice(&pattern);
    let lba = 131_000u64; // near the end, outside every other test's range
    src = qp
        .write_blocking(
            &qp.namespace(1).unwrap(),
            Lba(lba),
            IoBuf::prefix(src, 512).unwrap(),
            IoFlags::FUA,
            T,
        )
        .expect("fua write")
        .into_buf();
    qp.flush_blocking(&qp.namespace(1).unwrap(), T)
        .expect("flush");
    drop(src);
    println!(
        "{}",
        testbed::hostcheck_file_bytes(
            "nvme-write-lands-in-nvme0.img",
            NVME0_NS1.file,
            lba * 512,
            &pattern
        )
    );
}

#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn mdts_splitting_on_nvme1_and_page_crossing_offsets() {
    let bed = common::open(1, 4 << 20, 2);
    let mut qp = bed.qp(128, 1);
    let before = qp.stats();
    let buf = bed.pool.get().unwrap();
    // 1 MiB at a 12-byte buffer offset: 64 commands of 16 KiB, each crossing 5 pages (PRP list).
    let buf = read_check(&mut qp, buf, 1, 1000, 512, NVME1_NS1.id, 12, 1 << 20);
    let st = qp.stats();
    assert_eq!(st.requests - before.requests, 1);
    assert_eq!(
        st.commands - before.commands,
        64,
        "1 MiB / 16 KiB MDTS = 64 commands"
    );
    // A request needing more commands than the queue holds is queued: its commands
    // go out as slots free up, and it completes with the right data.
    let mut small = bed.qp(8, 1);
    let before = small.stats();
    let buf = read_check(&mut small, buf, 1, 1000, 512, NVME1_NS1.id, 12, 1 << 20);
    let st = small.stats();
    assert_eq!(st.commands - before.commands, 64);
    assert_eq!(st.queued_requests - before.queued_requests, 1);
    assert_eq!((small.in_flight(), small.pending_requests()), (0, 0));
    let mut buf = buf;
    // Write + read back across MDTS with an odd offset.
    let mut dst = bed.pool.get().unwrap();
    fill_random(77, &mut buf.as_mut_slice()[20..20 + 300 * 512]);
    let buf = qp
        .write_blocking(
            &qp.namespace(1).unwrap(),
            Lba(70_000),
            IoBuf::new(buf, 20, 300 * 512).unwrap(),
            IoFlags::empty(),
            T,
        )
        .expect("write")
        .into_buf();
    dst = qp
        .read_blocking(
            &qp.namespace(1).unwrap(),
            Lba(70_000),
            IoBuf::new(dst, 4, 300 * 512).unwrap(),
            T,
        )
        .expect("read")
        .into_buf();
    assert!(buf.as_slice()[20..20 + 300 * 512] == dst.as_slice()[4..4 + 300 * 512]);
}

#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn four_kib_lba_namespace() {
    let bed = common::open(1, 4 << 20, 2);
    let mut qp = bed.qp(64, 2);
    let buf = bed.pool.get().unwrap();
    let buf = read_check(&mut qp, buf, 2, 3, 4096, NVME1_NS2.id, 0, 65536);
    let mut buf = read_check(&mut qp, buf, 2, 100, 4096, NVME1_NS2.id, 516, 3 * 4096);
    let r = qp
        .submit_read(
            &qp.namespace(2).unwrap(),
            Lba(0),
            IoBuf::prefix(buf, 512).unwrap(),
            IoFlags::empty(),
            1,
        )
        .unwrap_err();
    assert!(
        matches!(
            r.error,
            NvmeError::LengthNotBlockMultiple {
                lba_size: 4096,
                len: 512,
                nsid: 2
            }
        ),
        "{}",
        r.error
    );
    buf = one(r.bufs).into_buf();
    fill_random(5, &mut buf.as_mut_slice()[..1 << 20]);
    let buf = qp
        .write_blocking(
            &qp.namespace(2).unwrap(),
            Lba(12_000),
            IoBuf::prefix(buf, 1 << 20).unwrap(),
            IoFlags::empty(),
            T,
        )
        .expect("write")
        .into_buf();
    let dst = qp
        .read_blocking(
            &qp.namespace(2).unwrap(),
            Lba(12_000),
            IoBuf::new(bed.pool.get().unwrap(), 4096, 1 << 20).unwrap(),
            T,
        )
        .expect("read")
        .into_buf();
    assert!(buf.as_slice()[..1 << 20] == dst.as_slice()[4096..4096 + (1 << 20)]);
}

#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn both_namespaces_through_one_queue() {
    let bed = common::open(1, 1 << 20, 4);
    let mut qp = bed.qp(64, 1);
    let a = bed.pool.get().unwrap();
    let b = bed.pool.get().unwrap();
    qp.submit_read(
        &qp.namespace(1).unwrap(),
        Lba(64),
        IoBuf::prefix(a, 8192).unwrap(),
        IoFlags::empty(),
        1,
    )
    .unwrap();
    qp.submit_read(
        &qp.namespace(2).unwrap(),
        Lba(8),
        IoBuf::prefix(b, 8192).unwrap(),
        IoFlags::empty(),
        2,
    )
    .unwrap();
    qp.ring();
    let mut got = Vec::new();
    qp.wait_for(2, T, |c| got.push(c)).unwrap();
    got.sort_by_key(|c| c.tag);
    for c in got {
        let (id, off) = if c.tag == 1 {
            (NVME1_NS1.id, 64 * 512)
        } else {
            (NVME1_NS2.id, 8 * 4096)
        };
        assert_eq!(c.result.as_ref().unwrap(), &8192);
        let buf = one(c.bufs).into_buf();
        testbed::check_pattern(id, off, &buf.as_slice()[..8192]).unwrap();
    }
}

#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn scatter_list_of_three_buffers() {
    let bed = common::open(0, 64 << 10, 8);
    let mut qp = bed.qp(32, 1);
    let mut sg = Box::new(SgList::new());
    // First segment from a dword offset to its page end, a whole middle page run, a short tail.
    for (off, len) in [(1024usize, 3072usize), (0, 8192), (0, 1536)] {
        sg.push(Segment {
            buf: bed.pool.get().unwrap(),
            offset: off,
            len,
        })
        .unwrap();
    }
    let total = sg.total_len();
    assert_eq!(total, 12_800);
    let lba = 4000u64;
    let sg = qp
        .readv_blocking(&qp.namespace(1).unwrap(), Lba(lba), sg, T)
        .expect("readv");
    check_segments(NVME0_NS1.id, lba * 512, &sg);
    // A middle segment that does not start on a page is refused before submission.
    let mut bad = Box::new(SgList::new());
    bad.push(Segment {
        buf: bed.pool.get().unwrap(),
        offset: 0,
        len: 4096,
    })
    .unwrap();
    bad.push(Segment {
        buf: bed.pool.get().unwrap(),
        offset: 512,
        len: 512,
    })
    .unwrap();
    let r = qp
        .submit_readv(&qp.namespace(1).unwrap(), Lba(0), bad, IoFlags::empty(), 9)
        .unwrap_err();
    assert!(
        r.error.to_string().contains("breaks page alignment"),
        "{}",
        r.error
    );
    assert!(matches!(r.bufs, IoBufs::Sg(ref s) if s.len() == 2));
    // writev + readv round trip in the scratch half.
    let mut sg = sg;
    drop(r);
    let w = fill_and_writev(&mut qp, std::mem::take(&mut *sg), 9, 90_000);
    let dst = qp
        .read_blocking(
            &qp.namespace(1).unwrap(),
            Lba(90_000),
            IoBuf::prefix(bed.pool.get().unwrap(), total).unwrap(),
            T,
        )
        .expect("read")
        .into_buf();
    check_read_back(&w, &dst, 0);
}

#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn write_zeroes_deallocate_and_flush() {
    let bed = common::open(0, 1 << 20, 2);
    let mut qp = bed.qp(32, 1);
    let info = bed.ctrl.info().clone();
    let lba = 110_000u64;
    let mut buf = bed.pool.get().unwrap();
    buf.as_mut_slice()[..65536].fill(0xee);
    let buf = qp
        .write_blocking(
            &qp.namespace(1).unwrap(),
            Lba(lba),
            IoBuf::prefix(buf, 65536).unwrap(),
            IoFlags::empty(),
            T,
        )
        .expect("write")
        .into_buf();
    assert_ne!(
        info.oncs & ubdirect_nvme::spec::identify::ONCS_WRITE_ZEROES,
        0
    );
    qp.write_zeroes_blocking(&qp.namespace(1).unwrap(), Lba(lba + 8), 64, T)
        .expect("write zeroes");
    let buf = qp
        .read_blocking(
            &qp.namespace(1).unwrap(),
            Lba(lba),
            IoBuf::prefix(buf, 65536).unwrap(),
            T,
        )
        .expect("read")
        .into_buf();
    let s = buf.as_slice();
    assert!(
        s[..4096].iter().all(|&b| b == 0xee),
        "before the zeroed range"
    );
    assert!(
        s[4096..4096 + 64 * 512].iter().all(|&b| b == 0),
        "zeroed range"
    );
    assert!(
        s[4096 + 64 * 512..65536].iter().all(|&b| b == 0xee),
        "after the zeroed range"
    );
    // Write Zeroes above the 16-bit NLB limit is split into several commands.
    let before = qp.stats().commands;
    qp.write_zeroes_blocking(&qp.namespace(1).unwrap(), Lba(65_000), 65536 + 100, T)
        .expect("large write zeroes");
    assert_eq!(qp.stats().commands - before, 2);
    assert_ne!(info.oncs & ubdirect_nvme::spec::identify::ONCS_DSM, 0);
    qp.deallocate_blocking(&qp.namespace(1).unwrap(), Lba(lba), 128, T)
        .expect("deallocate");
    qp.flush_blocking(&qp.namespace(1).unwrap(), T)
        .expect("flush");
    let e = qp
        .write_zeroes_blocking(&qp.namespace(1).unwrap(), Lba(131_000), 100, T)
        .unwrap_err();
    assert!(
        matches!(e, NvmeError::LbaOutOfRange { nsze: 131_072, .. }),
        "{e}"
    );
    // A namespace that is not active has no handle: nothing to submit against.
    let e = qp.namespace(7).unwrap_err();
    assert!(
        matches!(e, NvmeError::NamespaceMissing { nsid: 7, active: 1 }),
        "{e}"
    );
}

fn roundtrip_many(qp: &mut IoQueuePair, bufs: &mut Vec<UbBuf>, base: u64) {
    for i in 0..64u64 {
        let mut b = bufs.pop().unwrap();
        fill_random(i + base, &mut b.as_mut_slice()[..4096]);
        qp.submit_write(
            &qp.namespace(1).unwrap(),
            Lba(base + i * 8),
            IoBuf::prefix(b, 4096).unwrap(),
            IoFlags::empty(),
            i,
        )
        .unwrap();
    }
    qp.ring();
    qp.wait_for(64, T, |c| {
        c.result.unwrap();
        bufs.push(one(c.bufs).into_buf());
    })
    .unwrap();
    for i in 0..64u64 {
        let b = bufs.pop().unwrap();
        qp.submit_read(
            &qp.namespace(1).unwrap(),
            Lba(base + i * 8),
            IoBuf::prefix(b, 4096).unwrap(),
            IoFlags::empty(),
            i,
        )
        .unwrap();
    }
    qp.ring();
    let mut expect = vec![0u8; 4096];
    qp.wait_for(64, T, |c| {
        c.result.unwrap();
        let b = one(c.bufs).into_buf();
        fill_random(c.tag + base, &mut expect);
        assert!(
            b.as_slice()[..4096] == expect[..],
            "tag {} read back differs",
            c.tag
        );
        bufs.push(b);
    })
    .unwrap();
}

#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn shadow_doorbells_on_and_off() {
    for shadow in [true, false] {
        let bed = common::open_with(
            0,
            1 << 20,
            64,
            ControllerOptions {
                shadow_doorbells: if shadow {
                    ShadowDoorbells::On
                } else {
                    ShadowDoorbells::Off
                },
                ..Default::default()
            },
        );
        assert_eq!(bed.ctrl.shadow_doorbells(), shadow);
        let mut qp = bed.qp(64, 1);
        assert_eq!(qp.uses_shadow_doorbells(), shadow);
        let mut bufs: Vec<UbBuf> = (0..64).map(|_| bed.pool.get().unwrap()).collect();
        roundtrip_many(&mut qp, &mut bufs, 100_000);
        let st = qp.stats();
        println!("shadow={shadow}: {st:?}");
        if shadow {
            assert!(st.sq_doorbell_writes + st.cq_doorbell_writes + st.shadow_only_updates >= 2);
        } else {
            assert_eq!(st.shadow_only_updates, 0);
            assert_eq!(
                st.sq_doorbell_writes, 2,
                "two rings, one doorbell write each"
            );
        }
    }
    // Auto (the default): QEMU's controller sets EventIdx to the value it has just seen, so it
    // never asks to hear of an update later; the writes it lets go only race its own
    // processing, and how many depends on the emulator's timing (0 of 66, 2 of 96, 5 of 70 and
    // 28 of 121 were seen: the old rule, which counted those, kept shadow doorbells on in the
    // last case, where they cost 15-26 % of the IOPS at QD32). The decision counts only the
    // updates the controller asked to hear of later: none on QEMU, so it is off every time.
    let bed = common::open_with(0, 1 << 20, 64, ControllerOptions::default());
    let d = bed.ctrl.shadow_decision().clone();
    println!("auto: {d:?}");
    assert!(d.probe_updates > 0, "{d:?}");
    // Ring indices wrap at the queue size, not at 2^16: an EventIdx just before the wrap can
    // look "past" a value just after it, so QEMU shows a few (1 or 2 of 79 probe
    // updates); the decision needs 1 in 8 and stays off.
    assert!(
        d.probe_saved_ahead * 8 < d.probe_updates,
        "QEMU asked to hear of updates later: {d:?}"
    );
    assert!(!d.on && !bed.ctrl.shadow_doorbells(), "{d:?}");
    assert!(d.why.contains("turned off"), "{}", d.why);
    let mut qp = bed.qp(64, 1);
    assert!(!qp.uses_shadow_doorbells());
    let mut bufs: Vec<UbBuf> = (0..64).map(|_| bed.pool.get().unwrap()).collect();
    roundtrip_many(&mut qp, &mut bufs, 100_000);
}

#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn auto_ring_submits_without_explicit_ring() {
    let bed = common::open(0, 1 << 20, 4);
    let mut qp = bed.qp(16, 1);
    qp.set_auto_ring(true);
    qp.submit_read(
        &qp.namespace(1).unwrap(),
        Lba(16),
        IoBuf::prefix(bed.pool.get().unwrap(), 4096).unwrap(),
        IoFlags::empty(),
        3,
    )
    .unwrap();
    let mut got = None;
    qp.wait_for(1, T, |c| got = Some(c))
        .expect("completes without ring()");
    let c = got.unwrap();
    assert_eq!(c.tag, 3);
    testbed::check_pattern(
        NVME0_NS1.id,
        16 * 512,
        &one(c.bufs).into_buf().as_slice()[..4096],
    )
    .unwrap();
}

#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn scatter_list_split_at_mdts_on_nvme1() {
    let bed = common::open(1, 64 << 10, 12);
    let mut qp = bed.qp(32, 1);
    // 3584 + 12288 + 20480 + 4608 = 40 KiB: three 16 KiB-MDTS commands whose boundaries fall
    // inside segments (at byte 16384, 512 bytes into the third, and at 32768).
    let layout = [(512usize, 3584usize), (0, 12288), (0, 20480), (0, 4608)];
    let mut sg = Box::new(SgList::new());
    for (off, len) in layout {
        sg.push(Segment {
            buf: bed.pool.get().unwrap(),
            offset: off,
            len,
        })
        .unwrap();
    }
    let before = qp.stats().commands;
    let lba = 2000u64;
    let sg = qp
        .readv_blocking(&qp.namespace(1).unwrap(), Lba(lba), sg, T)
        .expect("readv");
    assert_eq!(qp.stats().commands - before, 3);
    check_segments(NVME1_NS1.id, lba * 512, &sg);
    let w = fill_and_writev(&mut qp, *sg, 40, 110_000);
    let dst = qp
        .read_blocking(
            &qp.namespace(1).unwrap(),
            Lba(110_000),
            IoBuf::new(bed.pool.get().unwrap(), 4, 40960).unwrap(),
            T,
        )
        .expect("read")
        .into_buf();
    check_read_back(&w, &dst, 4);
}
