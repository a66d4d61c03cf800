//! Guest tests of the NVMe Controller Memory Buffer: the test bed's CMB controller
//! (`UBD_NVME_CMB`, scripts/vm/run.sh's device block nvmecmb: QEMU `cmb_size_mb=1`, serial
//! ubdcmb, a zero-filled 64 MiB namespace). Its CMB is registered as a UB region, nvme0 reads
//! into it peer to peer and the CPU checks the bytes through the BAR mapping; I/O submission
//! queues placed in the CMB carry verified writes and reads; the errors name the fix. Without
//! the controller the tests fail, so a missing device never passes silently.

mod common;

use std::sync::Arc;

use common::{fill_random, T};
use ubdirect_core::{DmaDomain, PoolConfig, RegionKind, UbPool, UbRegistry};
use ubdirect_nvme::{Controller, ControllerOptions, IoQueuePair, NvmeError, QueueOptions};
use ubdirect_nvme::{IoBuf, IoFlags, Lba};
use ubdirect_testbed::cli::{perf_rw_verify_args, perf_verified_clean, ubdirect};
use ubdirect_testbed::{self as testbed, NVME0_NS1};

fn cmb_addr() -> String {
    testbed::require();
    std::env::var("UBD_NVME_CMB")
        .ok()
        .filter(|s| !s.is_empty())
        .expect("no CMB NVMe controller in this guest (UBD_NVME_CMB is empty): scripts/vm/run.sh's device block nvmecmb adds it")
}

fn open_cmb(registry: &Arc<UbRegistry>) -> Arc<Controller> {
    Controller::open(
        registry,
        cmb_addr().parse().unwrap(),
        ControllerOptions {
            cmb: true,
            ..Default::default()
        },
    )
    .expect("open the CMB controller with ControllerOptions::cmb")
}

fn cmb_qp(ctrl: &Arc<Controller>, depth: usize) -> Result<IoQueuePair, NvmeError> {
    IoQueuePair::new(
        ctrl,
        QueueOptions {
            depth,
            nsid: Some(1),
            sq_in_cmb: true,
            ..Default::default()
        },
    )
}

#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn cmb_region_receives_a_peer_read_from_nvme0() {
    let tb = testbed::require();
    let bed = common::open(0, 1 << 20, 1);
    let ctrl = open_cmb(&bed.registry);
    let cmb = ctrl.cmb().expect("CMB opened");
    let l = *cmb.layout();
    // QEMU 10, cmb_size_mb=1: BAR2, offset 0, 1 MiB, SQs, lists and data allowed.
    assert_eq!(
        (l.bir, l.offset, l.size, l.sqs, l.rds, l.wds),
        (2, 0, 1 << 20, true, true, true)
    );
    assert_eq!(
        ctrl.cmb_layout().unwrap(),
        Some(l),
        "identify's view of the same CMB"
    );
    let region = cmb.region().clone();
    assert_eq!(region.len, 1 << 20);
    assert_eq!(
        region.kind,
        RegionKind::BarWindow {
            device: cmb_addr().parse().unwrap(),
            bar: 2,
            offset: 0
        }
    );
    assert_eq!(cmb.controller_base(), Some(region.iova));
    assert_eq!(
        bed.registry
            .region_of_iova(region.iova + 4096)
            .map(|(r, o)| (r.id, o)),
        Some((region.id, 4096))
    );
    let pool = UbPool::new(
        &bed.registry,
        region.clone(),
        PoolConfig {
            block_size: 256 << 10,
            block_count: 4,
        },
    )
    .expect("a pool carved from the CMB");
    let mut qp = bed.qp(8, 1);
    for (i, (lba, len, off)) in [(2048u64, 256usize << 10, 0usize), (9000, 8192, 4096 + 512)]
        .into_iter()
        .enumerate()
    {
        let _hold: Vec<_> = (0..i).map(|_| pool.get().unwrap()).collect();
        let mut buf = pool.get().unwrap();
        assert!(region.contains_iova(buf.iova(), buf.len()));
        buf.write_from(0, &vec![0xee; buf.len()])
            .expect("fill the CMB block");
        let buf = qp
            .read_blocking(
                &qp.namespace(1).unwrap(),
                Lba(lba),
                IoBuf::new(buf, off, len).unwrap(),
                T,
            )
            .expect("nvme0 reads into the CMB")
            .into_buf();
        // The CPU reads the CMB through the BAR mapping (volatile loads): the image's bytes,
        // and the bytes before the read's offset untouched.
        let mut s = vec![0u8; off + len];
        buf.read_into(0, &mut s).expect("read the CMB block");
        testbed::check_pattern(NVME0_NS1.id, lba * 512, &s[off..off + len])
            .expect("pattern read back through the CMB mapping");
        assert!(s[..off].iter().all(|&b| b == 0xee));
    }
    drop(tb);
}

#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn io_through_submission_queues_in_the_cmb_is_verified() {
    let registry = UbRegistry::new(DmaDomain::new().unwrap());
    let ctrl = open_cmb(&registry);
    let pool = UbPool::with_hugepages(
        &registry,
        PoolConfig {
            block_size: 64 << 10,
            block_count: 4,
        },
        None,
    )
    .unwrap();
    // Two queue pairs with their SQs in the CMB; depth 7: 40 commands wrap each ring 5 times.
    let mut qa = cmb_qp(&ctrl, 7).expect("SQ in the CMB");
    let mut qb = cmb_qp(&ctrl, 7).expect("a second SQ in the CMB");
    assert!(qa.sq_in_cmb() && qb.sq_in_cmb());
    assert!(cmb_qp(&ctrl, 7).is_ok_and(|q| q.sq_in_cmb()));
    for i in 0..20u64 {
        let (q, lba) = if i % 2 == 0 {
            (&mut qa, i * 64)
        } else {
            (&mut qb, 8192 + i * 64)
        };
        let len = 4096 * (1 + i as usize % 4);
        let mut w = pool.get().unwrap();
        fill_random(i + 1, &mut w.as_mut_slice()[..len]);
        let w = q
            .write_blocking(
                &q.namespace(1).unwrap(),
                Lba(lba),
                IoBuf::prefix(w, len).unwrap(),
                IoFlags::empty(),
                T,
            )
            .expect("write")
            .into_buf();
        let r = pool.get().unwrap();
        let r = q
            .read_blocking(
                &q.namespace(1).unwrap(),
                Lba(lba),
                IoBuf::prefix(r, len).unwrap(),
                T,
            )
            .expect("read back")
            .into_buf();
        assert!(
            r.as_slice()[..len] == w.as_slice()[..len],
            "command {i}: the bytes read back through a CMB SQ differ from those written"
        );
    }
    assert_eq!(qa.stats().commands, 20);
    assert_eq!(qb.stats().commands, 20);
}

#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn cmb_errors_name_the_fix() {
    let registry = UbRegistry::new(DmaDomain::new().unwrap());
    // nvme0 has no CMB.
    let nvme0 = testbed::require().nvme[0].clone();
    let e = Controller::open(
        &registry,
        nvme0.parse().unwrap(),
        ControllerOptions {
            cmb: true,
            ..Default::default()
        },
    )
    .err()
    .expect("nvme0 has no CMB");
    assert!(matches!(e, NvmeError::NoCmb { .. }), "{e}");
    assert!(e.to_string().contains("cmb_size_mb"), "{e}");
    // A controller opened without ControllerOptions::cmb: the SQ option says what is missing.
    let plain = Controller::open(
        &registry,
        cmb_addr().parse().unwrap(),
        ControllerOptions::default(),
    )
    .unwrap();
    assert!(plain.cmb().is_none());
    let e = cmb_qp(&plain, 8).err().unwrap();
    assert!(e.to_string().contains("ControllerOptions::cmb"), "{e}");
    assert_eq!(plain.io_queues_in_use(), 0, "refusal keeps no queue id");
    drop(plain);
    // 1 MiB of CMB holds 8 SQs of 2048 entries (128 KiB each); the ninth is refused.
    let ctrl = open_cmb(&registry);
    let full: Vec<_> = (0..8)
        .map(|i| cmb_qp(&ctrl, 2047).unwrap_or_else(|e| panic!("SQ {i}: {e}")))
        .collect();
    let e = cmb_qp(&ctrl, 2047).err().expect("the CMB is full");
    assert!(
        matches!(
            e,
            NvmeError::CmbTooSmall {
                need: 131072,
                free: 0,
                size: 1048576,
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("smaller queue depth"), "{e}");
    assert_eq!(ctrl.io_queues_in_use(), 8, "the refused queue holds no id");
    drop(full);
    // All freed: a pool may now carve the region, and then no SQ fits in it.
    let pool = UbPool::new(
        &registry,
        ctrl.cmb().unwrap().region().clone(),
        PoolConfig {
            block_size: 4096,
            block_count: 16,
        },
    )
    .expect("the CMB is free for a pool once its SQs are gone");
    let e = cmb_qp(&ctrl, 8).err().unwrap();
    assert!(e.to_string().contains("already carved"), "{e}");
    drop(pool);
}

#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn perf_sq_in_cmb_verifies_and_a_controller_without_cmb_is_named() {
    let addr = cmb_addr();
    let opts = ["--sq-in-cmb", "-q", "32", "-o", "8192", "--span", "4M"];
    let v = perf_verified_clean(ubdirect(&perf_rw_verify_args(&addr, "1", &opts)));
    assert_eq!(v["sq_in_cmb"], true);
    // nvme0 has no CMB: exit 1 and the message names the fix.
    let nvme0 = testbed::require().nvme[0].clone();
    let (rc, _, err) = ubdirect(&["perf", &nvme0, "--sq-in-cmb", "-t", "0.1"]);
    assert_eq!(rc, 1, "{err}");
    assert!(
        err.contains("no Controller Memory Buffer") && err.contains("drop --sq-in-cmb"),
        "{err}"
    );
}
