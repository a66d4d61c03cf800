//! [`Env`]: one entry point opening the domain, the controllers and the pool in the right
//! order (issue 10), against the NVMe model on the host.

mod model_support;

use std::time::Duration;

use model_support::{fast_opts, model};
use ubdirect_core::PoolConfig;
use ubdirect_devmodel::nvme::NvmeConfig;
use ubdirect_nvme::{Env, EnvError, IoBuf, IoFlags, IoQueuePair, Lba, PoolMemory, QueueOptions};

const T: Duration = Duration::from_secs(5);
const CFG: PoolConfig = PoolConfig {
    block_size: 64 << 10,
    block_count: 4,
};

#[test]
fn env_opens_controllers_then_the_pool_and_does_io() {
    let (reg, m, dev) = model(NvmeConfig::default());
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
    assert_eq!(env.pool().stats().block_count, 4);
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
fn settings_are_checked_before_anything_opens() {
    // No device: refused before the domain opens (no /dev/vfio needed to see it).
    let e = Env::builder().pool(CFG).open().err().unwrap();
    assert!(matches!(e, EnvError::NoDevice), "{e}");
    assert!(e.to_string().contains(".nvme(\"DDDD:BB:DD.F\")"), "{e}");
    // No pool.
    let e = Env::builder().nvme("0000:00:04.0").open().err().unwrap();
    assert!(matches!(e, EnvError::NoPool), "{e}");
    // A bad address, a bad pool: refused before the model's controller is touched.
    let (reg, m, dev) = model(NvmeConfig::default());
    let e = Env::builder()
        .registry(reg.clone())
        .nvme_device(dev.clone())
        .nvme("00:04")
        .pool(CFG)
        .open()
        .err()
        .unwrap();
    assert!(matches!(e, EnvError::Address { .. }), "{e}");
    assert!(e.to_string().contains("e.g. 0000:00:04.0"), "{e}");
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
    assert!(matches!(e, EnvError::Pool(_)), "{e}");
    assert!(e.to_string().contains("power of two"), "{e}");
    let st = m.stats();
    assert_eq!(
        st.admin.values().sum::<u64>(),
        0,
        "no admin command was sent"
    );
    assert!(!m.ready());
}
