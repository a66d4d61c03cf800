//! Guest test: PRP lists that span several list pages (chained by the last entry of a full list
//! page). That needs commands above 2 MiB, i.e. a controller with MDTS 0 (unlimited); the
//! standard test bed's controllers have MDTS 7 and 2, so this test needs an extra controller:
//!
//! ```sh
//! truncate -s 64M /tmp/prp.img
//! cargo test -p ubdirect-nvme --test mdts0_prp_chain --no-run   # note the binary path
//! scripts/vm/run.sh --devices nvme0 \
//!   --extra-qemu "-drive file=/tmp/prp.img,format=raw,if=none,id=prp -device nvme,serial=ubdprp,mdts=0,drive=prp" \
//!   --test-bin target/debug/deps/mdts0_prp_chain-HASH -- \
//!   'bind-vfio $UBD_NVME && tests-bin/mdts0_prp_chain-HASH --ignored --nocapture'
//! ```
//! The file is not named `guest_*.rs`, so the standard suite (which has no such controller) does
//! not run it. Without an MDTS-0 controller it fails, so a missing one never passes silently.

mod common;

use common::{fill_random, T};
use ubdirect_core::testbed;
use ubdirect_nvme::ControllerOptions;

#[test]
#[ignore = "guest-mdts0: needs vfio devices and a controller with mdts=0 (see the file's doc)"]
fn prp_lists_chained_over_several_list_pages() {
    let tb = testbed::require();
    let idx = (0..tb.nvme.len())
        .find(|&i| {
            let b = common::open(i, 4096, 1);
            b.ctrl.info().mdts == 0
        })
        .expect("no NVMe controller with MDTS 0 in this guest: add one with --extra-qemu (see the file's doc)");
    // Up to 4 MiB per command, 514 to 1024 PRP entries: two or three chained list pages. QEMU
    // maps at most 1024 pages per command (IOV_MAX): 4 MiB at an unaligned start (1025 pages)
    // completes with Internal Error there, so the cases stay within 1024 pages.
    let bed = common::open_with(
        idx,
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
            .write_blocking(nsid, 0, src, soff, len, false, T)
            .expect("write");
        assert_eq!(
            qp.stats().commands - before,
            1,
            "one command of {len} bytes"
        );
        dst.as_mut_slice().fill(0xa5);
        dst = qp.read_blocking(nsid, 0, dst, doff, len, T).expect("read");
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
