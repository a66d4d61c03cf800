//! Guest tests: the one generic I/O function of qpair_support runs unchanged against a PCIe
//! queue pair on QEMU's NVMe through vfio-pci and against an NVMe/TCP queue pair on the kernel's
//! own target (nvmet over loopback in the guest, exporting the same QEMU NVMe namespace through
//! the kernel's nvme driver).

mod common;
mod qpair_support;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

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

/// The CMB controller's namespace on the kernel's nvme driver: its block device (`/dev/nvmeXn1`).
fn on_the_kernel_driver(addr: &str) -> String {
    let st = Command::new("bind-kernel")
        .arg(addr)
        .status()
        .expect("bind-kernel");
    assert!(st.success(), "bind-kernel {addr} failed");
    let dir = format!("/sys/bus/pci/devices/{addr}/nvme");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        // The controller (nvmeX) and its namespace's block device, /dev/nvmeXn1 (as
        // tests/guest/50-nvmet.sh finds it).
        let ns = std::fs::read_dir(&dir).ok().and_then(|ctrls| {
            ctrls.flatten().find_map(|c| {
                let dev = format!("/dev/{}n1", c.file_name().to_string_lossy());
                Path::new(&dev).exists().then_some(dev)
            })
        });
        if let Some(dev) = ns {
            return dev;
        }
        assert!(
            Instant::now() < deadline,
            "{addr}'s namespace did not appear on the kernel driver within 10 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// nvmet exports the CMB controller's namespace (QEMU's NVMe, on the kernel driver: Write
/// Zeroes and Deallocate reach a device that does them; a file on the guest's tmpfs takes no
/// FALLOC_FL_ZERO_RANGE, and nvmet answers Write Zeroes there with Invalid Command Opcode). The
/// controller stays on the kernel driver, exported, when the test ends.
#[test]
#[ignore = "guest: needs nvmet, run by scripts/test.sh"]
fn the_same_io_runs_on_an_nvme_tcp_queue_pair_of_the_kernels_target() {
    let tb = testbed::require();
    let addr = tb
        .nvme_cmb
        .clone()
        .expect("the test bed's CMB NVMe controller (device block nvmecmb)");
    let dev = on_the_kernel_driver(&addr);
    let out = Command::new("sh")
        .arg("/ubd/scripts/vm/nvmet.sh")
        .args(["127.0.0.1", "--dev", &dev, "--port", PORT, "--nqn", NQN])
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
    let blocks = ctrl.namespace(1).expect("namespace 1").nsze;
    // The socket moves the data with the CPU: the pool needs no IOMMU mapping.
    let reg = UbRegistry::new(DmaDomain::host_only());
    let cfg = PoolConfig {
        block_size: 1 << 20,
        block_count: 2,
    };
    let pool = UbPool::with_anonymous(&reg, cfg, None).expect("pool");
    let mut q = TcpQueuePair::open(&ctrl, &[1], 8).expect("an I/O queue");
    qpair_support::io_roundtrip(&mut q, &pool, Lba(blocks - 32));
}
