//! Guest test: PRP lists that span several list pages (chained by the last entry of a full list
//! page). That needs commands above 2 MiB, i.e. a controller with MDTS 0 (unlimited): the test
//! bed's third controller (`UBD_NVME_MDTS0`, scripts/vm/run.sh's device block nvmemdts0, serial
//! ubdprp, a zero-filled 64 MiB namespace). Without it the test fails, so a missing controller
//! never passes silently.

mod common;

use common::{fill_random, T};
use ubdirect_nvme::ControllerOptions;
use ubdirect_nvme::{IoBuf, IoFlags, Lba};
use ubdirect_testbed as testbed;

#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn prp_lists_chained_over_several_list_pages() {
    let tb = testbed::require();
    let addr = tb.nvme_mdts0.expect(
        "no MDTS-0 NVMe controller in this guest (UBD_NVME_MDTS0 is empty): scripts/vm/run.sh's device block nvmemdts0 adds it",
    );
    assert_eq!(
        common::open_at(&addr, 4096, 1, ControllerOptions::default())
            .ctrl
            .info()
            .mdts,
        0,
        "the controller at UBD_NVME_MDTS0 ({addr}) reports a transfer limit"
    );
    // Up to 4 MiB per command, 514 to 1024 PRP entries: two or three chained list pages. QEMU
    // maps at most 1024 pages per command (IOV_MAX): 4 MiB at an unaligned start (1025 pages)
    // completes with Internal Error there, so the cases stay within 1024 pages.
    let bed = common::open_at(
        &addr,
        16 << 20,
        2,
        ControllerOptions {
            max_command_bytes: 4 << 20,
            ..Default::default()
        },
    );
    assert_eq!(bed.ctrl.max_command_bytes(), 4 << 20);
    let lba_size = bed.ctrl.namespaces()[0].lba_size as usize;
    let mut qp = bed.qp(8, bed.ctrl.namespaces()[0].nsid);
    let nsid = qp.default_nsid();
    let mut src = bed.pool.get().unwrap();
    let mut dst = bed.pool.get().unwrap();
    for (len, soff, doff) in [
        ((2 << 20) + lba_size, 4092usize, 0usize),
        ((2 << 20) + 8192, 0, 12),
        (3 << 20, 4, 2048),
        (4 << 20, 0, 0),
    ] {
        fill_random(
            len as u64 + soff as u64,
            &mut src.as_mut_slice()[soff..soff + len],
        );
        let before = qp.stats().commands;
        src = qp
            .write_blocking(
                &qp.namespace(nsid).unwrap(),
                Lba(0),
                IoBuf::new(src, soff, len).unwrap(),
                IoFlags::empty(),
                T,
            )
            .expect("write")
            .into_buf();
        assert_eq!(
            qp.stats().commands - before,
            1,
            "one command of {len} bytes"
        );
        dst.as_mut_slice().fill(0xa5);
        dst = qp
            .read_blocking(
                &qp.namespace(nsid).unwrap(),
                Lba(0),
                IoBuf::new(dst, doff, len).unwrap(),
                T,
            )
            .expect("read")
            .into_buf();
        assert!(
            src.as_slice()[soff..soff + len] == dst.as_slice()[doff..doff + len],
            "len {len}: data differs"
        );
        assert!(
            dst.as_slice()[..doff].iter().all(|&b| b == 0xa5),
            "bytes before the transfer written"
        );
        assert!(
            dst.as_slice()[doff + len..doff + len + 4096]
                .iter()
                .all(|&b| b == 0xa5),
            "bytes after written"
        );
    }
}
