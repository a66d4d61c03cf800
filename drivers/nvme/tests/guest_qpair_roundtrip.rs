//! Guest tests: the one generic I/O function of qpair_support runs unchanged against a PCIe
//! queue pair on QEMU's NVMe through vfio-pci and against an NVMe/TCP queue pair on the kernel's
//! own target (nvmet, over loopback in the guest).

mod common;
mod qpair_support;

use std::process::Command;

use ubdirect_core::{DmaDomain, PoolConfig, UbPool, UbRegistry};
use ubdirect_nvme::qpair::TcpQueuePair;
use ubdirect_nvme::transport::tcp::addr::TcpTarget;
use ubdirect_nvme::transport::tcp::ctrl::{TcpController, TcpOptions};
use ubdirect_nvme::transport::tcp::host::HostIdentity;
use ubdirect_nvme::{ControllerOptions, Lba};
use ubdirect_testbed as testbed;

/// The subsystem and port of this binary's nvmet target (apart from the other NVMe/TCP tests').
const NQN: &str = "nqn.2026-12.io.ubdirect:qpair";
const PORT: &str = "4422";

#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn the_same_io_runs_on_a_pcie_queue_pair_of_qemus_nvme() {
    let tb = testbed::require();
    // The CMB controller's namespace is zero-filled scratch; the last blocks are written here.
    let addr = tb
        .nvme_cmb
        .clone()
        .expect("the test bed's CMB NVMe controller (device block nvmecmb)");
    let bed = common::open_at(&addr, 1 << 20, 2, ControllerOptions::default());
    let blocks = bed.ctrl.namespaces()[0].nsze;
    let mut q = bed.qp(8, 1);
    qpair_support::io_roundtrip(&mut q, &bed.pool, Lba(blocks - 16));
}

#[test]
#[ignore = "guest: needs nvmet, run by scripts/test.sh"]
fn the_same_io_runs_on_an_nvme_tcp_queue_pair_of_the_kernels_target() {
    testbed::require();
    let out = Command::new("sh")
        .arg("/ubd/scripts/vm/nvmet.sh")
        .args([
            "127.0.0.1",
            "--file",
            "/tmp/nvmf-qpair.img",
            "--size",
            "64M",
        ])
        .args(["--port", PORT, "--nqn", NQN])
        .output()
        .expect("run nvmet.sh");
    assert!(
        out.status.success(),
        "nvmet.sh: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let target = TcpTarget {
        addr: format!("127.0.0.1:{PORT}"),
        subnqn: NQN.into(),
        nsid: None,
    };
    let ctrl = TcpController::connect(&target, &HostIdentity::generated(), &TcpOptions::default())
        .expect("connect to nvmet");
    // The socket moves the data with the CPU: the pool needs no IOMMU mapping.
    let reg = UbRegistry::new(DmaDomain::host_only());
    let cfg = PoolConfig {
        block_size: 1 << 20,
        block_count: 2,
    };
    let pool = UbPool::with_anonymous(&reg, cfg, None).expect("pool");
    let mut q = TcpQueuePair::open(&ctrl, &[1], 8).expect("an I/O queue");
    qpair_support::io_roundtrip(&mut q, &pool, Lba(4));
}
