//! Guest tests: identify fields match the QEMU command line; admin commands (features, logs);
//! controller reopen after shutdown.

mod common;

use ubdirect_nvme::spec::command::feature;
use ubdirect_nvme::spec::identify::OACS_DOORBELL_BUFFER_CONFIG;
use ubdirect_nvme::{CommandSet, NvmeError};
use ubdirect_nvme::{IoBuf, Lba};

#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn nvme0_identify_matches_qemu_command_line() {
    let bed = common::open(0, 1 << 20, 2);
    let info = bed.ctrl.info();
    assert_eq!(info.vid, 0x1b36, "QEMU's PCI vendor id");
    assert_eq!(info.sn, "ubd0", "serial=ubd0 on the QEMU command line");
    assert_eq!(info.mn, "QEMU NVMe Ctrl");
    assert_eq!(info.mdts, 7, "QEMU's default mdts");
    assert_eq!(bed.ctrl.max_command_bytes(), 512 * 1024);
    assert_eq!(info.sqes & 0xf, 6);
    assert_eq!(info.cqes & 0xf, 4);
    assert!(info.nn >= 1);
    let ns = bed.ctrl.namespaces();
    assert_eq!(ns.len(), 1, "{ns:?}");
    assert_eq!(ns[0].nsid, 1);
    assert_eq!(ns[0].lba_size, 512);
    assert_eq!(ns[0].nsze, (64 << 20) / 512, "nvme0.img is 64 MiB");
    assert_eq!(ns[0].size_bytes(), 64 << 20);
    assert!(ns[0].lbaf.iter().filter(|f| f.in_use).count() == 1);
    // QEMU (NVMe 1.4) answers the Namespace Identification Descriptor list with a CSI of NVM.
    assert_eq!(ns[0].command_set, CommandSet::Nvm);
    assert_eq!((ns[0].metadata_size, ns[0].protection_type), (0, 0));
    assert_eq!(bed.ctrl.cmb_layout().unwrap(), None, "nvme0 has no CMB");
    assert_eq!(bed.ctrl.version().major(), 1);
    assert!(bed.ctrl.cap().max_queue_entries() >= 64);
    assert!(bed.ctrl.io_queues_granted() >= 2);
    // Shadow doorbells `auto`: offered (OACS bit 8) and probed at open; on only
    // when EventIdx saved MMIO writes (never on QEMU's controller).
    let d = bed.ctrl.shadow_decision();
    assert_eq!(bed.ctrl.shadow_doorbells(), d.on, "{d:?}");
    if info.oacs & OACS_DOORBELL_BUFFER_CONFIG == 0 {
        assert!(!d.on, "{d:?}");
    } else {
        assert!(d.probe_updates > 0, "auto probed: {d:?}");
    }
}

#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn nvme1_identify_two_namespaces_and_small_mdts() {
    let bed = common::open(1, 1 << 20, 2);
    let info = bed.ctrl.info();
    assert_eq!(info.sn, "ubd1");
    assert_eq!(info.mdts, 2, "mdts=2 on the QEMU command line");
    assert_eq!(bed.ctrl.max_command_bytes(), 16 * 1024);
    let ns = bed.ctrl.namespaces();
    assert_eq!(ns.len(), 2, "{ns:?}");
    assert_eq!(
        (ns[0].nsid, ns[0].lba_size, ns[0].nsze),
        (1, 512, (64 << 20) / 512)
    );
    assert_eq!(
        (ns[1].nsid, ns[1].lba_size, ns[1].nsze),
        (2, 4096, (64 << 20) / 4096)
    );
    assert_eq!(bed.ctrl.active_namespace_ids().unwrap(), vec![1, 2]);
    assert!(bed.ctrl.namespace_info(3).is_none());
}

#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn features_logs_and_device_errors() {
    let bed = common::open(0, 1 << 20, 2);
    let nq = bed.ctrl.get_features(feature::NUMBER_OF_QUEUES, 0).unwrap();
    assert!((nq & 0xffff) + 1 >= bed.ctrl.io_queues_granted() as u32);
    let smart = bed.ctrl.smart_log().unwrap();
    assert!(
        smart.temperature_k > 200 && smart.temperature_k < 400,
        "{smart:?}"
    );
    let _errors = bed.ctrl.error_log().unwrap();
    // A device-side error: Identify Namespace of an id above the controller's namespace limit
    // (QEMU's is 256) fails with Invalid Namespace or Format (SCT 0, SC 0x0B) and DNR set.
    match bed.ctrl.identify_namespace(0x1234) {
        Err(NvmeError::Command { command, status }) => {
            assert_eq!(command, "Identify Namespace");
            assert_eq!((status.sct, status.sc), (0, 0x0b), "{status}");
            assert!(status.dnr, "{status}");
            println!("identify nsid 0x1234: {status}");
        }
        Ok(_) => panic!("Identify Namespace 0x1234 succeeded: want Invalid Namespace or Format"),
        Err(e) => panic!("want an Invalid Namespace or Format status, got {e}"),
    }
    // An id within the limit that is not active: the spec's answer is a zeroed page.
    let inactive = bed
        .ctrl
        .identify_namespace(3)
        .expect("Identify Namespace of an inactive id answers a zeroed page");
    assert_eq!(
        (
            inactive.nsze.get(),
            inactive.ncap.get(),
            inactive.nuse.get()
        ),
        (0, 0, 0)
    );
    // Get Log Page with a reserved log id: the controller refuses it with a decoded status.
    let e = bed.ctrl.get_log_page(0x7f, 0xffff_ffff, 512).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("Get Log Page failed") && msg.contains("SC 0x"),
        "{msg}"
    );
    // Invalid arguments are refused before anything is sent.
    assert!(matches!(
        bed.ctrl.get_log_page(2, 0, 3),
        Err(NvmeError::InvalidArgument(_))
    ));
}

#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn reopen_after_orderly_shutdown_and_queue_ids_are_reused() {
    for round in 0..3 {
        let bed = common::open(0, 1 << 20, 2);
        let q1 = bed.qp(16, 1);
        let q2 = bed.qp(16, 1);
        assert_ne!(q1.qid(), q2.qid());
        assert_eq!(bed.ctrl.io_queues_in_use(), 2, "round {round}");
        drop(q1);
        assert_eq!(bed.ctrl.io_queues_in_use(), 1);
        let q3 = bed.qp(16, 1);
        assert_eq!(bed.ctrl.io_queues_in_use(), 2);
        drop((q2, q3));
    }
}

#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn controller_reset_brings_admin_and_io_back() {
    use ubdirect_testbed::{self as testbed, NVME0_NS1};
    let bed = common::open(0, 1 << 20, 2);
    let mut qp = bed.qp(16, 1);
    let buf = qp
        .read_blocking(
            &qp.namespace(1).unwrap(),
            Lba(8),
            IoBuf::prefix(bed.pool.get().unwrap(), 4096).unwrap(),
            common::T,
        )
        .unwrap()
        .into_buf();
    let e = bed.ctrl.reset().unwrap_err();
    assert!(e.to_string().contains("drop every IoQueuePair"), "{e}");
    drop(qp);
    for round in 0..2 {
        bed.ctrl
            .reset()
            .unwrap_or_else(|e| panic!("reset {round}: {e}"));
        let id = bed.ctrl.identify_controller().unwrap();
        assert_eq!(ubdirect_nvme::spec::identify::ascii_field(&id.sn), "ubd0");
        let mut qp = bed.qp(16, 1);
        assert_eq!(qp.uses_shadow_doorbells(), bed.ctrl.shadow_doorbells());
        let b = qp
            .read_blocking(
                &qp.namespace(1).unwrap(),
                Lba(8 + round),
                IoBuf::prefix(bed.pool.get().unwrap(), 4096).unwrap(),
                common::T,
            )
            .unwrap()
            .into_buf();
        testbed::check_pattern(NVME0_NS1.id, (8 + round) * 512, &b.as_slice()[..4096]).unwrap();
    }
    drop(buf);
}
