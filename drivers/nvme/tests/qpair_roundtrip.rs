//! One generic I/O function, unchanged, against a PCIe queue pair (the NVMe device model) and an
//! NVMe/TCP queue pair (a fake target on loopback with a real medium): write, read back
//! byte-exact, flush, write zeroes, deallocate, and refused requests handing their buffer back.
mod model_support;
mod qpair_support;
mod tcp_target;

use ubdirect_core::{DmaDomain, UbRegistry};
use ubdirect_devmodel::nvme::NvmeConfig;
use ubdirect_nvme::qpair::TcpQueuePair;
use ubdirect_nvme::{Controller, Lba};

#[test]
fn the_same_io_runs_on_a_pcie_queue_pair() {
    let (reg, _m, dev) = model_support::model(NvmeConfig::default());
    let ctrl = Controller::open_device(&reg, dev, model_support::fast_opts()).unwrap();
    let pool = model_support::anon_pool(&reg, 8192, 4);
    let mut q = model_support::queue(&ctrl, 8);
    qpair_support::io_roundtrip(&mut q, &pool, Lba(4));
}

#[test]
fn the_same_io_runs_on_an_nvme_tcp_queue_pair() {
    let (ctrl, medium) = tcp_target::connect();
    let reg = UbRegistry::new(DmaDomain::host_only());
    let pool = model_support::anon_pool(&reg, 8192, 4);
    let mut q = TcpQueuePair::open(&ctrl, &[1], 8).expect("an I/O queue");
    qpair_support::io_roundtrip(&mut q, &pool, Lba(4));
    // The target's medium holds what the generic function left: block 4 zeroed, block 5
    // deallocated (this target reads it back as zeroes).
    let m = medium.lock().unwrap();
    let lba = tcp_target::LBA;
    assert!(m[4 * lba..6 * lba].iter().all(|&x| x == 0));
    assert!(m[6 * lba..7 * lba].iter().all(|&x| x == 0x11), "untouched");
}
