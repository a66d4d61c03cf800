//! [`Env`]: one entry point checking the hugepages and opening the domain, the NVMe controllers,
//! the NICs and the pool in the right order, against the device models on the host.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use ubdirect::dma::vfio::{BackendKind, DomainOptions};
use ubdirect::dma::{CoreError, DmaDomain, PciDevice, PoolConfig, RegionOwner, UbRegistry};
use ubdirect::nvme::{ControllerOptions, IoBuf, IoFlags, IoQueuePair, Lba, QueueOptions};
use ubdirect::virtio_net::{TxFrame, FRAME_OFFSET};
use ubdirect::{Env, EnvError, Hugepages, PoolMemory};
use ubdirect_devmodel::nvme::{NvmeConfig, NvmeModel};
use ubdirect_devmodel::virtio_net::{connect, NetModelConfig, VirtioNetModel};

const T: Duration = Duration::from_secs(5);
const CFG: PoolConfig = PoolConfig {
    block_size: 64 << 10,
    block_count: 8,
};

fn fast_opts() -> ControllerOptions {
    ControllerOptions {
        admin_timeout: Duration::from_millis(200),
        default_shutdown_timeout: Duration::from_millis(200),
        ..ControllerOptions::default()
    }
}

fn registry() -> Arc<UbRegistry> {
    UbRegistry::new(DmaDomain::host_only())
}

fn nvme_model(reg: &Arc<UbRegistry>) -> (Arc<NvmeModel>, Arc<PciDevice>) {
    let m = NvmeModel::new(reg, NvmeConfig::default());
    let dev = m.attach(reg);
    (m, dev)
}

/// A fake sysfs tree with a system-wide 2 MiB hugepage pool of `nr` pages, `free` of them free.
struct FakeSysfs(PathBuf);

impl FakeSysfs {
    fn new(tag: &str, nr: u64, free: u64) -> FakeSysfs {
        let root = std::env::temp_dir().join(format!("ubd-env-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        let d = root.join("sys/kernel/mm/hugepages/hugepages-2048kB");
        fs::create_dir_all(&d).unwrap();
        fs::write(d.join("nr_hugepages"), format!("{nr}\n")).unwrap();
        fs::write(d.join("free_hugepages"), format!("{free}\n")).unwrap();
        fs::write(d.join("surplus_hugepages"), "0\n").unwrap();
        FakeSysfs(root)
    }
    fn path(&self) -> &Path {
        &self.0
    }
    fn nr(&self) -> String {
        fs::read_to_string(
            self.0
                .join("sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages"),
        )
        .unwrap()
    }
}

impl Drop for FakeSysfs {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

#[test]
fn env_opens_controllers_then_the_pool_and_does_io() {
    let reg = registry();
    let (m, dev) = nvme_model(&reg);
    let env = Env::builder()
        .registry(reg)
        .nvme_device(dev)
        .controller_options(fast_opts())
        .pool(CFG)
        .pool_memory(PoolMemory::Anonymous)
        .open()
        .expect("the environment opens");
    assert_eq!(env.controllers().len(), 1);
    assert!(m.ready(), "the controller is enabled");
    assert_eq!(env.pool().stats().block_count, 8);
    let ctrl = env.controller(0);
    let ns = ctrl.first_namespace().unwrap();
    let mut qp = IoQueuePair::new(ctrl, QueueOptions::default()).unwrap();
    let mut w = IoBuf::prefix(env.pool().get().unwrap(), 4096).unwrap();
    w.as_mut_slice().fill(0xa5);
    qp.write_blocking(&ns, Lba(4), w, IoFlags::empty(), T)
        .unwrap();
    let mut medium = vec![0u8; 4096];
    m.read_medium(1, 4 * 512, &mut medium);
    assert!(medium.iter().all(|&b| b == 0xa5));
    drop(qp);
    drop(env);
    assert!(!m.ready(), "dropping the environment closes the controller");
}

#[test]
fn one_env_opens_an_nvme_controller_and_two_nics_that_pass_frames() {
    let reg = registry();
    let (m, dev) = nvme_model(&reg);
    let a = VirtioNetModel::new(&reg, NetModelConfig::default());
    let b = VirtioNetModel::new(
        &reg,
        NetModelConfig {
            mac: [0x52, 0x54, 0, 0x12, 0x34, 0x57],
            ..NetModelConfig::default()
        },
    );
    connect(&a, &b);
    let (da, db) = (a.attach(&reg), b.attach(&reg));
    let mut env = Env::builder()
        .registry(reg)
        .nvme_device(dev)
        .controller_options(fast_opts())
        .nic_device(da)
        .nic_device(db)
        .pool(PoolConfig {
            block_size: 4096,
            block_count: 1024,
        })
        .pool_memory(PoolMemory::Anonymous)
        .open()
        .expect("the environment opens");
    assert!(m.ready(), "the NVMe controller is enabled");
    assert_eq!(env.nics_mut().len(), 2);
    assert_eq!(
        env.nic_mut(1).mac(),
        Some([0x52, 0x54, 0, 0x12, 0x34, 0x57])
    );
    // One frame from NIC 0 to NIC 1, from the same pool.
    let mut buf = env.pool().get().unwrap();
    let frame = &mut buf.as_mut_slice()[FRAME_OFFSET..FRAME_OFFSET + 60];
    frame.fill(0x5a);
    let mut tx = vec![TxFrame::new(buf, 60).map_err(|(_, e)| e).unwrap()];
    let mut nics = env.take_nics();
    let (n0, n1) = nics.split_at_mut(1);
    let deadline = std::time::Instant::now() + T;
    while !tx.is_empty() {
        n0[0].tx_burst(&mut tx).unwrap();
        assert!(std::time::Instant::now() < deadline, "the frame never left");
    }
    let mut rx = Vec::with_capacity(8);
    while rx.is_empty() {
        n0[0].reclaim_tx().unwrap();
        n1[0].rx_burst(&mut rx).unwrap();
        assert!(std::time::Instant::now() < deadline, "the frame never came");
    }
    assert_eq!(rx[0].data(), &[0x5a; 60][..]);
}

#[test]
fn settings_are_checked_before_anything_opens() {
    // No device: refused before the domain opens (no /dev/vfio needed to see it).
    let e = Env::builder().pool(CFG).open().err().unwrap();
    assert!(matches!(e, EnvError::NoDevice), "{e}");
    assert!(e.to_string().contains(".nvme(\"DDDD:BB:DD.F\")"), "{e}");
    assert!(e.to_string().contains(".nic(\"DDDD:BB:DD.F\")"), "{e}");
    // No pool.
    let e = Env::builder().nvme("0000:00:04.0").open().err().unwrap();
    assert!(matches!(e, EnvError::NoPool), "{e}");
    // The same device twice.
    let e = Env::builder()
        .nvme("0000:00:04.0")
        .nic("0000:00:04.0")
        .pool(CFG)
        .open()
        .err()
        .unwrap();
    assert!(matches!(e, EnvError::Duplicate { .. }), "{e}");
    assert!(e.to_string().contains("0000:00:04.0 is named twice"), "{e}");
    // A bad address (NVMe or NIC), a bad pool: refused before the model's controller is
    // touched.
    let reg = registry();
    let (m, dev) = nvme_model(&reg);
    for b in [
        Env::builder().nvme("00:04"),
        Env::builder().nic("0000:00:07"),
    ] {
        let e = b
            .registry(reg.clone())
            .nvme_device(dev.clone())
            .pool(CFG)
            .open()
            .err()
            .unwrap();
        assert!(matches!(e, EnvError::Address { .. }), "{e}");
        assert!(e.to_string().contains("e.g. 0000:00:04.0"), "{e}");
    }
    let e = Env::builder()
        .registry(reg)
        .nvme_device(dev)
        .pool(PoolConfig {
            block_size: 1000,
            block_count: 4,
        })
        .open()
        .err()
        .unwrap();
    assert!(matches!(e, EnvError::PoolConfig(_)), "{e}");
    assert!(e.to_string().contains("power of two"), "{e}");
    let st = m.stats();
    assert_eq!(
        st.admin.values().sum::<u64>(),
        0,
        "no admin command was sent"
    );
    assert!(!m.ready());
}

#[test]
fn too_few_free_hugepages_are_refused_before_any_device_opens() {
    // 8 blocks of 1 MiB = 4 pages of 2 MiB; the tree has 3 free.
    let sys = FakeSysfs::new("few", 3, 3);
    let reg = registry();
    let (m, dev) = nvme_model(&reg);
    let e = Env::builder()
        .registry(reg)
        .nvme_device(dev)
        .hugepages(Hugepages::verify().sysfs_root(sys.path()))
        .pool(PoolConfig {
            block_size: 1 << 20,
            block_count: 8,
        })
        .open()
        .err()
        .unwrap();
    assert!(matches!(e, EnvError::Hugepages(_)), "{e}");
    let msg = e.to_string();
    assert!(msg.contains("need 4, free 3"), "{msg}");
    assert!(msg.contains("scripts/setup.sh"), "{msg}");
    assert_eq!(m.stats().admin.values().sum::<u64>(), 0, "nothing opened");
    assert!(!m.ready());
    // No hugepages at all: the same error, with 0 free.
    let none = FakeSysfs::new("none", 0, 0);
    let e = Env::builder()
        .nvme("0000:00:04.0")
        .hugepages(Hugepages::verify().sysfs_root(none.path()))
        .pool(CFG)
        .open()
        .err()
        .unwrap();
    assert!(e.to_string().contains("need 1, free 0"), "{e}");
}

#[test]
fn the_reserve_step_raises_nr_hugepages_and_never_lowers_it() {
    // A fake tree: the kernel's nr_hugepages write is a plain file write, so the "reserved"
    // pages do not turn free: the verify that follows still refuses, after the write.
    let sys = FakeSysfs::new("reserve", 2, 2);
    let e = Env::builder()
        .nvme("0000:00:04.0")
        .hugepages(Hugepages::reserve(64).sysfs_root(sys.path()))
        .pool(PoolConfig {
            block_size: 2 << 20,
            block_count: 4,
        })
        .open()
        .err()
        .unwrap();
    assert_eq!(sys.nr(), "64\n", "nr_hugepages raised to 64");
    assert!(e.to_string().contains("need 4, free 2"), "{e}");
    let big = FakeSysfs::new("keep", 128, 0);
    let _ = Env::builder()
        .nvme("0000:00:04.0")
        .hugepages(Hugepages::reserve(64).sysfs_root(big.path()))
        .pool(CFG)
        .open();
    assert_eq!(big.nr(), "128\n", "never lowered");
}

#[test]
fn without_pool_opens_the_controllers_and_skips_the_hugepages_and_the_pool() {
    // No free hugepage at all: the step is skipped, as no pool is made.
    let sys = FakeSysfs::new("nopool", 0, 0);
    let reg = registry();
    let (m, dev) = nvme_model(&reg);
    let env = Env::builder()
        .registry(reg.clone())
        .nvme_device(dev)
        .controller_options(fast_opts())
        .hugepages(Hugepages::verify().sysfs_root(sys.path()))
        .without_pool()
        .open()
        .expect("the environment opens without a pool");
    assert!(m.ready(), "the NVMe controller is enabled");
    assert_eq!(env.controllers().len(), 1);
    assert!(!env.controller(0).namespaces().is_empty());
    let pools = |reg: &UbRegistry| {
        reg.regions()
            .iter()
            .filter(|r| r.owner() == Some(RegionOwner::Pool))
            .count()
    };
    assert_eq!(pools(&reg), 0, "no pool memory was registered");
    let asked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        env.pool();
    }));
    assert!(
        asked.is_err(),
        "pool() on an environment without one panics"
    );
    // A pool named after without_pool wins.
    drop(env);
    let (_m, dev) = nvme_model(&reg);
    let env = Env::builder()
        .registry(reg.clone())
        .nvme_device(dev)
        .controller_options(fast_opts())
        .without_pool()
        .pool(CFG)
        .pool_memory(PoolMemory::Anonymous)
        .open()
        .expect("the environment opens with its pool");
    assert_eq!(env.pool().block_count(), CFG.block_count);
    assert_eq!(pools(&reg), 1, "the pool's region");
}

#[test]
fn without_pool_refuses_a_nic() {
    let reg = registry();
    let nic = VirtioNetModel::new(&reg, NetModelConfig::default());
    let e = Env::builder()
        .registry(reg.clone())
        .nic_device(nic.attach(&reg))
        .without_pool()
        .open()
        .err()
        .unwrap();
    assert!(matches!(e, EnvError::NoPool), "{e}");
}

#[test]
fn domain_options_reach_the_domain_before_any_device_opens() {
    // The no-IOMMU back end forced without the program's opt-in: refused when the domain
    // opens, whatever the host has.
    let e = Env::builder()
        .domain_options(DomainOptions {
            backend: Some(BackendKind::NoIommu),
            allow_noiommu: false,
        })
        .nvme("0000:00:04.0")
        .without_pool()
        .open()
        .err()
        .unwrap();
    assert!(
        matches!(
            e,
            EnvError::Domain(CoreError::Backend {
                backend: "noiommu",
                ..
            })
        ),
        "{e}"
    );
}
