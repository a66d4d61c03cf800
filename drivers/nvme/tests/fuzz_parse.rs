//! Fuzz targets, one per structure the NVMe driver parses from device input:
//! Identify Controller and Identify Namespace pages, Namespace Identification Descriptor lists, completion entries and their status, and
//! the CAP / CSTS / VS registers. Each runs `UBD_FUZZ_CASES` cases (10,000 in CI). A decode
//! must never panic, and what it accepts must hold the invariants the driver relies on.

mod fuzz_support;

use fuzz_support::{config, page};
use proptest::prelude::*;
use ubdirect_devmodel::nvme::{NsConfig, NvmeConfig};
use ubdirect_nvme::spec::identify::{IdentifyController, IdentifyNamespace};
use ubdirect_nvme::spec::regs::{cq_head_doorbell, sq_tail_doorbell, Cap, Csts, Version};
use ubdirect_nvme::spec::Cqe;
use ubdirect_nvme::{
    command_set_from_descriptors, CommandSet, ControllerInfo, NamespaceInfo, NvmeError, NvmeStatus,
};
use zerocopy::FromBytes;

/// A Namespace Identification Descriptor list: an EUI-64, a UUID, then the CSI (zoned).
fn descriptor_template() -> [u8; 4096] {
    let mut p = [0u8; 4096];
    p[0..2].copy_from_slice(&[0x01, 8]);
    p[12..14].copy_from_slice(&[0x03, 16]);
    p[32..34].copy_from_slice(&[0x04, 1]);
    p[36] = 0x02;
    p
}

fn ns_template() -> [u8; 4096] {
    NsConfig {
        nsid: 1,
        blocks: 2048,
        lbads: 12,
    }
    .identify()
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn fuzz_identify_namespace(p in page(ns_template(), 384), nsid in any::<u32>()) {
        fuzz_support::tick("fuzz_identify_namespace");
        let id = IdentifyNamespace::ref_from_bytes(&p[..]).unwrap();
        match NamespaceInfo::from_identify(nsid, id) {
            Ok(ns) => {
                prop_assert!(ns.lba_size.is_power_of_two() && ns.lba_size >= 512);
                prop_assert!(ns.nsze.checked_mul(ns.lba_size as u64).is_some());
                prop_assert_eq!(ns.size_bytes(), ns.nsze * ns.lba_size as u64);
                prop_assert_eq!(ns.lbaf.len(), (p[25] as usize + 1).min(64));
                prop_assert_eq!(ns.lbaf.iter().filter(|f| f.in_use).count(), 1);
                let cur = ns.lbaf.iter().find(|f| f.in_use).unwrap();
                prop_assert_eq!(1u32 << cur.lbads, ns.lba_size);
            }
            Err(NvmeError::DeviceInput { field, .. }) => {
                prop_assert!(["FLBAS", "LBAF.LBADS", "NSZE"].contains(&field));
            }
            Err(e) => prop_assert!(false, "unexpected error {e}"),
        }
    }

    #[test]
    fn fuzz_namespace_descriptor_list(p in page(descriptor_template(), 64)) {
        fuzz_support::tick("fuzz_namespace_descriptor_list");
        let page: &[u8; 4096] = p[..].try_into().unwrap();
        match command_set_from_descriptors(page) {
            Ok(Some(set)) => {
                // The CSI descriptor the walk found lies inside the page, with NIDL 1.
                let mut off = 0;
                while page[off] != 0x04 {
                    prop_assert!(page[off] != 0);
                    off += 4 + page[off + 1] as usize;
                }
                prop_assert_eq!(page[off + 1], 1);
                prop_assert_eq!(set, CommandSet::from_csi(page[off + 4]));
            }
            Ok(None) => {}
            Err(NvmeError::DeviceInput { field, .. }) => prop_assert!(field.contains("NIDL")),
            Err(e) => prop_assert!(false, "unexpected error {e}"),
        }
    }

    #[test]
    fn fuzz_identify_controller(p in page(NvmeConfig::default().identify_controller(), 1024)) {
        fuzz_support::tick("fuzz_identify_controller");
        let id = IdentifyController::ref_from_bytes(&p[..]).unwrap();
        let info = ControllerInfo::from_identify(id);
        for s in [&info.sn, &info.mn, &info.fr, &info.subnqn] {
            prop_assert!(s.bytes().all(|b| b.is_ascii_graphic() || b == b' '));
        }
        prop_assert!(info.sn.len() <= 20 && info.mn.len() <= 40 && info.fr.len() <= 8);
        match info.max_transfer(4096) {
            None => prop_assert_eq!(info.mdts, 0),
            Some(m) => prop_assert!((8192..=4096 << 20).contains(&m) && m.is_power_of_two()),
        }
        prop_assert_eq!(info.nn, u32::from_le_bytes(p[516..520].try_into().unwrap()));
    }

    #[test]
    fn fuzz_completion_entry(raw in any::<[u8; 16]>()) {
        fuzz_support::tick("fuzz_completion_entry");
        let c = Cqe::read_from_bytes(&raw[..]).unwrap();
        let st = NvmeStatus::from_cqe_status(c.status);
        prop_assert_eq!(st.to_cqe_status(c.phase()), c.status);
        prop_assert_eq!(st.is_success(), c.status_field() & 0x7ff == 0);
        prop_assert!(!st.to_string().is_empty() && !st.name().is_empty());
        prop_assert_eq!(c.phase(), raw[14] & 1 == 1);
    }

    #[test]
    fn fuzz_registers(cap in any::<u64>(), csts in any::<u32>(), vs in any::<u32>(), qid in any::<u16>()) {
        fuzz_support::tick("fuzz_registers");
        let cap = Cap(cap);
        prop_assert!(cap.max_queue_entries() >= 1 && cap.max_queue_entries() <= 65536);
        prop_assert!(cap.timeout().as_millis() >= 500 && cap.timeout().as_millis() <= 127_500);
        prop_assert!(cap.min_page_size() >= 4096 && cap.max_page_size() <= 1 << 27);
        prop_assert!(cap.dstrd() <= 15);
        let (sq, cq) = (sq_tail_doorbell(qid, cap.dstrd()), cq_head_doorbell(qid, cap.dstrd()));
        prop_assert!(sq >= 0x1000 && cq == sq + (4usize << cap.dstrd()));
        let csts = Csts(csts);
        let _ = (csts.rdy(), csts.cfs(), csts.shst(), csts.nssro(), csts.is_all_ones());
        let v = Version(vs);
        prop_assert_eq!((v.major() as u32) << 16 | (v.minor() as u32) << 8 | v.tertiary() as u32, vs);
    }
}
