//! The NVMe Controller Memory Buffer at bring-up, on the device model: the driver
//! enables the CMB registers (CMBMSC.CRE) before reading CMBLOC / CMBSZ, a controller without a
//! CMB is named, and every hostile CMBLOC / CMBSZ value is a typed error within a bound, with
//! the controller left disabled. (Mapping the CMB needs real device memory: the guest tests in
//! guest_nvme_cmb.rs do that.)

mod model_support;

use std::time::Duration;

use model_support::{fast_opts, registry, within};
use ubdirect_core::CoreError;
use ubdirect_devmodel::nvme::{CmbConfig, NvmeConfig, NvmeModel, Tamper};
use ubdirect_nvme::{Controller, ControllerOptions, NvmeError};

const LIMIT: Duration = Duration::from_secs(5);

fn cmb_opts() -> ControllerOptions {
    ControllerOptions {
        cmb: true,
        ..fast_opts()
    }
}

/// Open a model with `cmb` (and `tamper`, if any) asking for the CMB.
fn open(
    cmb: Option<CmbConfig>,
    tamper: Option<Box<dyn Tamper>>,
) -> (std::sync::Arc<NvmeModel>, ubdirect_nvme::Result<()>) {
    within(LIMIT, move || {
        let reg = registry();
        let cfg = NvmeConfig {
            cmb,
            ..NvmeConfig::default()
        };
        let m = match tamper {
            Some(t) => NvmeModel::hostile(&reg, cfg, t),
            None => NvmeModel::new(&reg, cfg),
        };
        let dev = m.attach(&reg);
        let r = Controller::open_device(&reg, dev, cmb_opts()).map(|_| ());
        (m, r)
    })
}

/// Replaces what CMBLOC (0x38) and CMBSZ (0x3c) read.
struct CmbRegs(Option<u32>, Option<u32>);

impl Tamper for CmbRegs {
    fn register(&mut self, off: u64, _size: u8, value: u64) -> u64 {
        match (off, self.0, self.1) {
            (0x38, Some(v), _) => v as u64,
            (0x3c, _, Some(v)) => v as u64,
            _ => value,
        }
    }
}

#[test]
fn no_cmb_is_named_and_the_controller_opens_without_the_option() {
    let (m, r) = open(None, None);
    let e = r.unwrap_err();
    assert!(matches!(e, NvmeError::NoCmb { .. }), "{e}");
    assert!(e.to_string().contains("cmb_size_mb"), "{e}");
    assert!(!m.ready(), "the failed open left the controller disabled");
    assert_eq!(m.cmbmsc(), 0, "CAP.CMBS=0: CMBMSC is not written");
    let reg = registry();
    let m = NvmeModel::new(&reg, NvmeConfig::default());
    let c = Controller::open_device(&reg, m.attach(&reg), fast_opts()).unwrap();
    assert!(c.cmb().is_none());
}

#[test]
fn the_cmb_registers_are_enabled_before_they_are_read() {
    // The model reads CMBLOC/CMBSZ as 0 until CMBMSC.CRE (as QEMU does): decoding gets as far
    // as mapping, which a model cannot back with memory.
    let (m, r) = open(Some(CmbConfig::qemu(16)), None);
    match r {
        Err(NvmeError::Core(CoreError::Unsupported { what, .. })) => {
            assert!(what.contains("BAR window of a device model"), "{what}")
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        m.cmbmsc(),
        1,
        "CMBMSC.CRE set, CMSE not (nothing was mapped)"
    );
    assert!(!m.ready());
}

#[test]
fn hostile_cmb_registers_are_typed_errors() {
    let qemu = CmbConfig::qemu(16);
    let sz_unit_1m_16 = qemu.cmbsz;
    let cases: [(Option<u32>, Option<u32>, &str); 6] = [
        // Reserved size unit.
        (None, Some(7 << 8 | 16 << 12), "CMBSZ.SZU"),
        // Size 0 with the capability bits set.
        (None, Some(0b11101 | 2 << 8), "CMBSZ"),
        // BIR 3: a BAR the model does not implement; BIR 7: reserved.
        (Some(3), None, "CMBLOC.BIR"),
        (Some(7), None, "CMBLOC.BIR"),
        // Offset 1 MiB + 16 MiB past a 16 MiB BAR; 17 MiB in a 16 MiB BAR.
        (Some(2 | 1 << 12), None, "CMBLOC/CMBSZ"),
        (None, Some(sz_unit_1m_16 + (1 << 12)), "CMBLOC/CMBSZ"),
    ];
    for (loc, sz, field) in cases {
        let (m, r) = open(Some(qemu), Some(Box::new(CmbRegs(loc, sz))));
        match r {
            Err(NvmeError::DeviceInput { field: f, .. }) if f == field => {}
            other => panic!("CMBLOC {loc:?} CMBSZ {sz:?}: want DeviceInput {field}, got {other:?}"),
        }
        assert!(!m.ready(), "{field}: the controller stays disabled");
        assert!(m.dma_faults().is_empty());
    }
    // A controller that vanished reads all-ones.
    let (_m, r) = open(Some(qemu), Some(Box::new(CmbRegs(None, Some(u32::MAX)))));
    assert!(
        matches!(r, Err(NvmeError::DeviceGone { register: "CMBSZ" })),
        "{r:?}"
    );
}

#[test]
fn the_cmb_layout_is_read_without_opening_the_cmb() {
    let reg = registry();
    let cfg = NvmeConfig {
        cmb: Some(CmbConfig::qemu(16)),
        ..NvmeConfig::default()
    };
    let m = NvmeModel::new(&reg, cfg);
    let c = Controller::open_device(&reg, m.attach(&reg), fast_opts()).unwrap();
    assert!(c.cmb().is_none(), "not opened with ControllerOptions::cmb");
    let l = c.cmb_layout().unwrap().expect("the model has a CMB");
    assert_eq!((l.bir, l.offset, l.size), (2, 0, 16 << 20));
    assert!(l.sqs && !l.cqs && l.lists && l.rds && l.wds, "{l:?}");
    assert_eq!(m.cmbmsc(), 1, "CRE set to read the registers, CMSE not");
    let m = NvmeModel::new(&reg, NvmeConfig::default());
    let c = Controller::open_device(&reg, m.attach(&reg), fast_opts()).unwrap();
    assert_eq!(c.cmb_layout().unwrap(), None);
}
