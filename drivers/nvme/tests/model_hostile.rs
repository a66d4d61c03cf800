//! Device input that could panic or run away: one test per NVMe register or identify field a
//! hostile controller can set, on the device model. Unchecked, each would be a panic, a hang or
//! an unbounded allocation; the driver answers a typed error (or leaves the bad namespace out)
//! within a bound.

mod model_support;

use std::time::Duration;

use model_support::{fast_opts, hostile, open_hostile, within};
use ubdirect_core::CoreError;
use ubdirect_devmodel::nvme::{regs, Hostile, NsConfig, NvmeConfig, NvmeModel, Tamper};
use ubdirect_nvme::{CommandSet, Controller, ControllerOptions, NvmeError};

/// Bring-up on the model takes ~10 ms (debug build); anything past this is a hang.
const LIMIT: Duration = Duration::from_secs(5);

const IDENTIFY: u8 = 0x06;

#[test]
fn cap_mqes_zero_is_a_typed_error() {
    let (m, r) = within(LIMIT, || {
        let (m, r) = open_hostile(
            NvmeConfig {
                cap: regs::cap(0, 0, 2),
                ..NvmeConfig::default()
            },
            Hostile::default(),
        );
        (m, r.map(|_| ()))
    });
    match r {
        Err(NvmeError::DeviceInput {
            field: "CAP.MQES",
            value: 0,
            ..
        }) => {}
        other => panic!("{other:?}"),
    }
    assert!(!m.ready(), "nothing was enabled");
}

#[test]
fn doorbell_stride_beyond_bar0_is_a_typed_error() {
    // DSTRD 15: the admin CQ doorbell sits at 0x1000 + (4 << 15) = 0x21000, BAR0 is 0x4000.
    let r = within(LIMIT, || {
        let (_m, r) = open_hostile(
            NvmeConfig {
                cap: regs::cap(1023, 15, 2),
                ..NvmeConfig::default()
            },
            Hostile::default(),
        );
        r.map(|_| ())
    });
    match r {
        Err(NvmeError::Core(CoreError::MmioOutOfRange {
            offset: 0x21000,
            window: 0x4000,
            ..
        })) => {}
        other => panic!("{other:?}"),
    }
}

#[test]
fn io_queues_are_limited_to_doorbells_inside_bar0() {
    // DSTRD 6 (256-byte stride) in a 16 KiB BAR0: the CQ doorbell of queue q is at
    // 0x1000 + (2q + 1) * 256, inside the BAR for q <= 23 only; the model grants 32.
    let (reg, _m, dev) = hostile(
        NvmeConfig {
            cap: regs::cap(1023, 6, 2),
            max_io_queues: 32,
            ..NvmeConfig::default()
        },
        Hostile::default(),
    );
    let ctrl = Controller::open_device(
        &reg,
        dev,
        ControllerOptions {
            io_queues: 32,
            ..fast_opts()
        },
    )
    .unwrap();
    assert_eq!(ctrl.io_queues_granted(), 23);
}

#[test]
fn bar0_smaller_than_the_registers_is_a_typed_error() {
    let r = within(LIMIT, || {
        let (_m, r) = open_hostile(
            NvmeConfig {
                bar0_len: 0x20,
                ..NvmeConfig::default()
            },
            Hostile::default(),
        );
        r.map(|_| ())
    });
    match r {
        Err(NvmeError::Core(CoreError::MmioOutOfRange { window: 0x20, .. })) => {}
        other => panic!("{other:?}"),
    }
}

/// An active namespace list that never ends: every page is full of the next 1024 NSIDs.
struct EndlessList;

impl Tamper for EndlessList {
    fn identify(&mut self, cns: u8, nsid: u32, page: &mut [u8; 4096]) {
        if cns == 2 {
            for i in 0..1024u32 {
                let id = nsid.saturating_add(i + 1);
                page[i as usize * 4..i as usize * 4 + 4].copy_from_slice(&id.to_le_bytes());
            }
        }
    }
}

#[test]
fn endless_active_namespace_list_is_bounded() {
    // NN = 2^32 - 1 and a list that always has 1024 more: a driver without a bound would
    // send ~4 million Identify commands and collect a multi-GB Vec.
    let (m, r) = within(LIMIT, || {
        let reg = model_support::registry();
        let cfg = NvmeConfig {
            nn: Some(u32::MAX),
            ..NvmeConfig::default()
        };
        let m = NvmeModel::hostile(&reg, cfg, Box::new(EndlessList));
        let dev = m.attach(&reg);
        let r = Controller::open_device(&reg, dev, fast_opts());
        (
            m,
            r.map(|c| c.namespaces().iter().map(|n| n.nsid).collect::<Vec<_>>()),
        )
    });
    assert_eq!(
        r.unwrap(),
        vec![1],
        "only the namespace with data is loaded"
    );
    let default_cap = ControllerOptions::default().max_namespaces as u64;
    assert_eq!(default_cap, 1024);
    // One active-list page of 1024 NSIDs, then one Identify Namespace per NSID, plus
    // Identify Controller and the descriptor list of the one namespace that decoded.
    assert_eq!(m.stats().admin_count(IDENTIFY), 1 + 1 + default_cap + 1);
}

#[test]
fn nsids_above_nn_are_left_out() {
    let (reg, _m, dev) = hostile(
        NvmeConfig {
            nn: Some(2),
            namespaces: vec![
                NsConfig {
                    nsid: 1,
                    blocks: 64,
                    lbads: 9,
                },
                NsConfig {
                    nsid: 5,
                    blocks: 64,
                    lbads: 9,
                },
            ],
            ..NvmeConfig::default()
        },
        Hostile::default(),
    );
    let ctrl = Controller::open_device(&reg, dev, fast_opts()).unwrap();
    let ids: Vec<u32> = ctrl.namespaces().iter().map(|n| n.nsid).collect();
    assert_eq!(ids, vec![1]);
}

/// Identify Namespace patches on top of the model's 2048-block, 512-byte namespace 1.
fn open_with_ns_patches(patches: &[(u16, u8)]) -> Vec<u32> {
    let plan = Hostile {
        identify_patches: patches.iter().map(|&(o, v)| (0, o, v)).collect(),
        ..Hostile::default()
    };
    let (reg, _m, dev) = hostile(NvmeConfig::default(), plan);
    let ctrl = Controller::open_device(&reg, dev, fast_opts()).unwrap();
    ctrl.namespaces().iter().map(|n| n.nsid).collect()
}

#[test]
fn namespace_byte_size_overflow_is_refused() {
    // NSZE = 2^64 - 1 blocks of 4 KiB: nsze * lba_size overflowed (a panic in size_bytes).
    let mut p: Vec<(u16, u8)> = (0..8).map(|i| (i, 0xff)).collect();
    p.push((130, 12));
    assert_eq!(open_with_ns_patches(&p), Vec::<u32>::new());
}

#[test]
fn lba_format_index_beyond_nlbaf_is_refused() {
    // NLBAF 0 (one format), FLBAS selects format 3, which holds a plausible 4 KiB format.
    let p = [(25, 0), (26, 3), (128 + 3 * 4 + 2, 12)];
    assert_eq!(open_with_ns_patches(&p), Vec::<u32>::new());
}

#[test]
fn lba_size_beyond_the_largest_command_is_refused() {
    // LBADS 24: 16 MiB blocks, larger than any command this driver builds (MDTS 128 KiB).
    assert_eq!(open_with_ns_patches(&[(130, 24)]), Vec::<u32>::new());
}

#[test]
fn entry_sizes_the_driver_cannot_use_are_refused() {
    // SQES 0x00: the controller's largest SQ entry is 1 byte, not 64.
    let plan = Hostile {
        identify_patches: vec![(1, 512, 0x00)],
        ..Hostile::default()
    };
    let r = within(LIMIT, move || {
        let (_m, r) = open_hostile(NvmeConfig::default(), plan);
        r.map(|_| ())
    });
    assert!(matches!(r, Err(NvmeError::Unsupported { .. })), "{r:?}");
}

#[test]
fn a_controller_that_stops_answering_times_out_within_the_admin_deadline() {
    // The model answers every command until the 1st (Identify Controller is command 0): it is
    // swallowed, as a hung controller would. admin_timeout is 200 ms (fast_opts).
    let start = std::time::Instant::now();
    let r = within(LIMIT, || {
        let (_m, r) = open_hostile(
            NvmeConfig::default(),
            Hostile {
                silent_after: Some(0),
                ..Hostile::default()
            },
        );
        r.map(|_| ())
    });
    let took = start.elapsed();
    match r {
        Err(NvmeError::Timeout {
            command: "Identify Controller",
            qid: 0,
            ..
        }) => {}
        other => panic!("{other:?}"),
    }
    // Measured 0.2 s (the deadline itself); 3x bound.
    assert!(took < Duration::from_millis(600), "{took:?}");
}

/// Open a controller on a model carrying out `plan` (default config) within [`LIMIT`], with the
/// WARN-level log captured: the log, the model and the open's result.
fn open_hostile_logging_warnings(
    plan: Hostile,
) -> (
    ubdirect_testbed::log_capture::LogCapture,
    (
        std::sync::Arc<NvmeModel>,
        ubdirect_nvme::Result<std::sync::Arc<Controller>>,
    ),
) {
    let out = ubdirect_testbed::log_capture::LogCapture::default();
    let writer = out.clone();
    // `within` runs the open on its own thread: the capturing subscriber is set there.
    let r = within(LIMIT, move || {
        let sub = tracing_subscriber::fmt()
            .with_writer(writer)
            .with_ansi(false)
            .with_max_level(tracing::Level::WARN)
            .finish();
        tracing::subscriber::with_default(sub, || open_hostile(NvmeConfig::default(), plan))
    });
    (out, r)
}

#[test]
fn a_lost_admin_doorbell_write_is_written_again_and_the_open_succeeds() {
    // RELIABILITY.md S9-3: "Set Features (command 1, queue 0) did not complete
    // within 10 s" with nothing posted and the controller ready. Here the model loses the SQ
    // tail doorbell write that announces Set Features (the second admin doorbell write, after
    // Identify Controller's): the driver writes the same tail again after admin_timeout / 8
    // (200 ms / 8 in fast_opts), the controller answers, the open succeeds, and a warning says
    // so. Fails on a driver that never writes the tail again (Timeout of Set Features).
    let start = std::time::Instant::now();
    let (out, (m, r)) = open_hostile_logging_warnings(Hostile {
        lost_sq_doorbells: vec![1],
        ..Hostile::default()
    });
    let took = start.elapsed();
    let ctrl = r.unwrap_or_else(|e| panic!("open failed: {e}"));
    assert_eq!(m.stats().lost_doorbells, 1);
    assert_eq!(ctrl.admin_doorbell_kicks(), 1);
    assert!(!ctrl.admin_wedged());
    // One kick interval (25 ms) plus the rest of the open; 3x the measured time at most.
    assert!(took < Duration::from_millis(600), "{took:?}");
    let text = out.text();
    assert!(
        text.lines().any(
            |l| l.contains("answered only after its SQ doorbell was written again")
                && l.contains("Set Features")
        ),
        "no warning in:\n{text}"
    );
}

#[test]
fn an_admin_timeout_logs_the_completion_queue_as_the_driver_saw_it() {
    // An open that fails with "Set Features (command 1, queue 0) did not complete within 10 s"
    // after Identify Controller (command 0) completed: the error alone cannot
    // tell a completion the controller never posted from one posted where the driver does not
    // look; the warning logged with it shows the admin ring. Here the model swallows command 1:
    // slot 0 holds Identify's completion (cid 0, SQ head 1, phase 1), slot 1 nothing, and the
    // driver waits at head 1 for phase 1.
    let (out, (_m, r)) = open_hostile_logging_warnings(Hostile {
        silent_after: Some(1),
        ..Hostile::default()
    });
    let r = r.map(|_| ());
    match r {
        Err(NvmeError::Timeout {
            command: "Set Features",
            cid: 1,
            qid: 0,
            ..
        }) => {}
        other => panic!("{other:?}"),
    }
    let text = out.text();
    let line = text
        .lines()
        .find(|l| l.contains("NVMe admin command timed out"))
        .unwrap_or_else(|| panic!("no admin-timeout warning in:\n{text}"));
    assert!(line.contains("command=\"Set Features\""), "{line}");
    assert!(line.contains("sq_tail=2"), "{line}");
    assert!(line.contains("cq=head 1 phase 1 0:0/0/1/0x1"), "{line}");
    assert!(
        !line.contains(" 1:"),
        "nothing was posted in slot 1: {line}"
    );
}

#[test]
fn a_controller_reading_all_ones_is_device_gone() {
    let r = within(LIMIT, || {
        let (_m, r) = open_hostile(
            NvmeConfig::default(),
            Hostile {
                all_ones_after: Some(0),
                ..Hostile::default()
            },
        );
        r.map(|_| ())
    });
    assert!(
        matches!(r, Err(NvmeError::DeviceGone { register: "CAP" })),
        "{r:?}"
    );
}

#[test]
fn a_controller_that_never_reports_shutdown_complete_is_dropped_within_the_rtd3e_bound() {
    let (reg, m, dev) = hostile(NvmeConfig::default(), Hostile::default());
    let ctrl = Controller::open_device(
        &reg,
        dev,
        ControllerOptions {
            ready_timeout: Some(Duration::from_millis(1)),
            ..fast_opts()
        },
    )
    .unwrap();
    assert_eq!(ctrl.info().rtd3e, 100_000);
    // From now on CSTS always reads RDY=1, SHST=0: the shutdown on drop never completes and
    // the disable after it never sees RDY=0. The model's RTD3E is 100 ms, which the driver
    // clamps to its 1 s minimum; then ready_timeout (1 ms) for the disable.
    m.set_tamper(Some(
        Hostile {
            registers: vec![(0x1c, 1)],
            ..Hostile::default()
        }
        .into_tamper(),
    ));
    let start = std::time::Instant::now();
    within(LIMIT, move || drop(ctrl));
    let took = start.elapsed();
    // Measured 1.00 s; the bound is 1 s plus the 1 ms ready wait, 3x is 3 s.
    assert!(
        took >= Duration::from_secs(1) && took < Duration::from_secs(3),
        "{took:?}"
    );
}

/// DMA allocations (rings, PRP lists, shadow pages) the registry's regions still carry.
fn dma_users(reg: &std::sync::Arc<ubdirect_core::UbRegistry>) -> usize {
    reg.regions().iter().map(|r| r.users()).sum()
}

/// The users left by a controller opened and shut down normally (the DMA slab the registry
/// keeps for later allocations).
fn settled_users(
    reg: &std::sync::Arc<ubdirect_core::UbRegistry>,
    dev: &std::sync::Arc<ubdirect_core::PciDevice>,
) -> usize {
    drop(Controller::open_device(reg, dev.clone(), fast_opts()).unwrap());
    dma_users(reg)
}

#[test]
fn registers_reading_all_ones_with_bus_mastering_on_keep_the_rings_out_of_reuse() {
    let (reg, m, dev) = hostile(NvmeConfig::default(), Hostile::default());
    let before = settled_users(&reg, &dev);
    let ctrl = Controller::open_device(&reg, dev.clone(), fast_opts()).unwrap();
    assert!(dma_users(&reg) > before);
    // The registers stop answering (as with memory decoding off) while config space still
    // answers and bus mastering stays on: the device may still DMA into its rings.
    m.set_tamper(Some(
        Hostile {
            all_ones_after: Some(0),
            ..Hostile::default()
        }
        .into_tamper(),
    ));
    drop(ctrl);
    assert!(
        dma_users(&reg) > before,
        "the rings of a device that may still DMA went back for reuse"
    );
}

#[test]
fn registers_reading_all_ones_with_bus_mastering_off_give_the_rings_back() {
    let (reg, m, dev) = hostile(NvmeConfig::default(), Hostile::default());
    let before = settled_users(&reg, &dev);
    let ctrl = Controller::open_device(&reg, dev.clone(), fast_opts()).unwrap();
    m.set_tamper(Some(
        Hostile {
            all_ones_after: Some(0),
            ..Hostile::default()
        }
        .into_tamper(),
    ));
    // SAFETY: bus mastering off stops the device's DMA, which is what this test is about.
    let access = unsafe { dev.access_unclaimed() };
    let cmd = dev.config_read_u16(4).unwrap();
    access.config_write_u16(4, cmd & !(1 << 2)).unwrap();
    drop(ctrl);
    assert_eq!(
        dma_users(&reg),
        before,
        "a device that cannot DMA leaks nothing"
    );
}

#[test]
fn a_namespace_with_metadata_is_refused_as_ubdirects_limit_not_the_controllers() {
    // LBA format 0 with 8 bytes of metadata per block (byte 128: LBAF0.MS, low byte).
    let (reg, _m, dev) = hostile(
        NvmeConfig::default(),
        Hostile {
            identify_patches: vec![(0, 128, 8)],
            ..Hostile::default()
        },
    );
    let ctrl = Controller::open_device(&reg, dev, fast_opts()).unwrap();
    let e = ctrl.namespace(1).unwrap_err();
    assert!(
        matches!(e, NvmeError::MetadataNotSupported { nsid: 1 }),
        "{e}"
    );
    let m = e.to_string();
    assert!(m.contains("ubdirect does not transfer metadata"), "{m}");
    assert!(!m.contains("controller does not support"), "{m}");
}

#[test]
fn a_zoned_namespace_is_known_by_its_command_set_identifier() {
    // Byte 4 of the Namespace Identification Descriptor list is the CSI descriptor's value.
    let (_m, r) = open_hostile(
        NvmeConfig::default(),
        Hostile {
            identify_patches: vec![(3, 4, 0x02), (0, 29, 0x01)],
            ..Hostile::default()
        },
    );
    let ctrl = r.unwrap();
    let ns = &ctrl.namespaces()[0];
    assert_eq!(ns.command_set, CommandSet::Zoned);
    assert!(!ns.command_set.takes_random_writes());
    assert_eq!(ns.protection_type, 1, "DPS bits 2:0");
    let (_m, r) = open_hostile(NvmeConfig::default(), Hostile::default());
    let ctrl = r.unwrap();
    assert_eq!(ctrl.namespaces()[0].command_set, CommandSet::Nvm);
    assert_eq!(ctrl.namespaces()[0].protection_type, 0);
}

#[test]
fn a_controller_without_descriptor_lists_has_nvm_namespaces() {
    // NVMe 1.2: the driver does not ask; NVMe 1.4 refusing CNS 03h: the NVM command set.
    let (_m, r) = open_hostile(
        NvmeConfig {
            vs: 0x0001_0200,
            ..NvmeConfig::default()
        },
        Hostile {
            identify_patches: vec![(3, 4, 0x02)],
            ..Hostile::default()
        },
    );
    assert_eq!(r.unwrap().namespaces()[0].command_set, CommandSet::Nvm);
}

#[test]
fn a_descriptor_list_running_past_its_page_leaves_the_namespace_out() {
    // NIDL 255 of descriptors chained to the end of the page: the last runs past it.
    let mut patches = Vec::new();
    for off in (0..4096 - 256).step_by(256) {
        patches.push((3, off as u16, 0x05));
        patches.push((3, off as u16 + 1, 252));
    }
    patches.push((3, 3840, 0x05));
    patches.push((3, 3841, 255));
    let (_m, r) = within(LIMIT, || {
        open_hostile(
            NvmeConfig::default(),
            Hostile {
                identify_patches: patches,
                ..Hostile::default()
            },
        )
    });
    assert!(r.unwrap().namespaces().is_empty());
}
