//! One driver per device, and buffers of the device's own DMA domain only: a second controller
//! on a device a controller holds is refused (so it cannot reset the device and re-create the
//! first one's queues), safe code cannot program a held device, and a buffer mapped in another
//! domain never reaches the device.
mod model_support;

use std::time::Duration;

use model_support::{fast_opts, model};
use ubdirect_core::{CoreError, DmaDomain, UbRegistry};
use ubdirect_devmodel::nvme::NvmeConfig;
use ubdirect_nvme::{Controller, IoBuf, IoFlags, Lba, NvmeError};

const T: Duration = Duration::from_secs(5);

#[test]
fn a_device_is_driven_by_one_controller_at_a_time() {
    let (reg, _m, dev) = model(NvmeConfig::default());
    let first = Controller::open_device(&reg, dev.clone(), fast_opts()).unwrap();
    let _q = model_support::queue(&first, 8);
    let second = Controller::open_device(&reg, dev.clone(), fast_opts());
    match second {
        Err(NvmeError::Core(CoreError::DeviceClaimed { addr, driver })) => {
            assert_eq!(addr, dev.address());
            assert_eq!(driver, "nvme");
        }
        Err(e) => panic!("refused for the wrong reason: {e}"),
        Ok(_) => {
            panic!("a second Controller took over the device under the first one's live queue pair")
        }
    }
    assert_eq!(dev.claimed_by(), Some("nvme"));
}

#[test]
fn the_claim_is_released_when_the_controller_goes() {
    let (reg, _m, dev) = model(NvmeConfig::default());
    let first = Controller::open_device(&reg, dev.clone(), fast_opts()).unwrap();
    drop(first);
    assert_eq!(dev.claimed_by(), None);
    let again = Controller::open_device(&reg, dev.clone(), fast_opts())
        .expect("the device opens again once its controller is gone");
    assert_eq!(again.namespaces().len(), 1);
}

#[test]
fn a_refused_second_controller_leaves_the_first_ones_io_and_buffers_intact() {
    let (reg, _m, dev) = model(NvmeConfig::default());
    let pool = model_support::anon_pool(&reg, 4096, 8);
    let first = Controller::open_device(&reg, dev.clone(), fast_opts()).unwrap();
    let ns = first.namespace(1).unwrap();
    let mut q1 = model_support::queue(&first, 8);
    let mut w = pool.get().unwrap();
    w.as_mut_slice().fill(0x5a);
    let w = q1
        .write_blocking(
            &ns,
            Lba(0),
            IoBuf::prefix(w, 4096).unwrap(),
            IoFlags::empty(),
            T,
        )
        .unwrap();
    drop(w);
    // The second owner is refused before it touches the device: no reset, no queue re-created.
    assert!(Controller::open_device(&reg, dev.clone(), fast_opts()).is_err());
    // A block owned by safe code keeps its bytes while the first owner goes on reading.
    let mut z = pool.get().unwrap();
    z.as_mut_slice().fill(0xee);
    let y = pool.get().unwrap();
    let y = q1
        .read_blocking(&ns, Lba(0), IoBuf::prefix(y, 4096).unwrap(), T)
        .expect("the first owner's queue pair still works");
    assert!(y.buf().as_slice()[..4096].iter().all(|&b| b == 0x5a));
    assert!(
        z.as_slice()[..4096].iter().all(|&b| b == 0xee),
        "the device wrote into a block safe code owns (first byte now {:#x})",
        z.as_slice()[0]
    );
}

#[test]
fn safe_code_cannot_program_a_device_a_controller_holds() {
    let (reg, _m, dev) = model(NvmeConfig::default());
    let ctrl = Controller::open_device(&reg, dev.clone(), fast_opts()).unwrap();
    let e = ctrl
        .device()
        .access()
        .expect_err("raw access to a held device");
    assert!(
        matches!(e, CoreError::DeviceClaimed { driver: "nvme", .. }),
        "{e}"
    );
    assert!(
        e.to_string().contains("already driven by the nvme driver"),
        "{e}"
    );
    // Its register BAR cannot become a UB region (and so a pool of MMIO) either.
    let e = reg
        .register_bar(ctrl.device(), 0)
        .expect_err("BAR0 of a held controller registered as memory");
    assert!(matches!(e, CoreError::DeviceClaimed { .. }), "{e}");
    drop(ctrl);
    assert!(dev.access().is_ok(), "released with the controller");
}

#[test]
fn a_buffer_of_another_domain_is_refused_and_comes_back() {
    let (reg, _m, dev) = model(NvmeConfig::default());
    let ctrl = Controller::open_device(&reg, dev, fast_opts()).unwrap();
    let _own = model_support::anon_pool(&reg, 4096, 8);
    let other = UbRegistry::new(DmaDomain::host_only());
    let foreign = model_support::anon_pool(&other, 4096, 8);
    let ns = ctrl.namespace(1).unwrap();
    let mut q = model_support::queue(&ctrl, 8);
    let b = foreign.get().unwrap();
    let iova = b.iova();
    // The foreign block's IOVA names memory of the controller's own domain: the aliasing the
    // domain check exists for.
    assert!(reg.region_of_iova(iova).is_some());
    let r = q.submit_read(
        &ns,
        Lba(0),
        IoBuf::prefix(b, 4096).unwrap(),
        IoFlags::empty(),
        7,
    );
    let rej = r.expect_err("a read into a buffer mapped in another DMA domain was accepted");
    match &rej.error {
        NvmeError::Core(CoreError::ForeignDomain {
            region_domain,
            device_domain,
            ..
        }) => {
            assert_eq!(*region_domain, other.domain().id());
            assert_eq!(*device_domain, reg.domain().id());
        }
        e => panic!("refused for the wrong reason: {e}"),
    }
    assert_eq!(q.in_flight(), 0, "nothing was queued");
    match rej.bufs {
        ubdirect_nvme::IoBufs::One(b) => assert_eq!(b.iova(), iova),
        _ => panic!("the buffer did not come back"),
    }
}

#[test]
fn an_access_taken_before_the_controller_opened_is_refused_afterwards() {
    let (reg, _m, dev) = model(NvmeConfig::default());
    let pool = model_support::anon_pool(&reg, 4096, 8);
    let early = dev.access().expect("nobody holds the device yet");
    let ctrl = Controller::open_device(&reg, dev.clone(), fast_opts()).unwrap();
    let ns = ctrl.namespace(1).unwrap();
    let mut q = model_support::queue(&ctrl, 8);
    let command = dev.config_read_u16(0x04).unwrap();
    let refused = |what: &str, r: Result<(), CoreError>| match r {
        Err(CoreError::DeviceClaimed { addr, driver }) => {
            assert_eq!(addr, dev.address(), "{what}");
            assert_eq!(driver, "nvme", "{what}");
        }
        Err(e) => panic!("{what} refused for the wrong reason: {e}"),
        Ok(()) => panic!("{what} through an access taken before the claim went to the device"),
    };
    refused("reset", early.reset());
    refused("map_bar(0)", early.map_bar(0).map(drop));
    refused("config_write_u16", early.config_write_u16(0x04, 0));
    refused("config_write_u8", early.config_write_u8(0x04, 0));
    refused("config_write_u32", early.config_write_u32(0x04, 0));
    refused("enable_bus_master", early.enable_bus_master());
    refused("export_bar_dmabuf", early.export_bar_dmabuf(0).map(drop));
    assert_eq!(
        dev.config_read_u16(0x04).unwrap(),
        command,
        "the command register is as the controller left it"
    );
    // The controller's queue pair still works: nothing reset or re-programmed the device.
    let mut w = pool.get().unwrap();
    w.as_mut_slice()[..4096].fill(0x3c);
    let w = q
        .write_blocking(
            &ns,
            Lba(8),
            IoBuf::prefix(w, 4096).unwrap(),
            IoFlags::empty(),
            T,
        )
        .expect("the controller's write after the refused operations");
    drop(w);
    let r = pool.get().unwrap();
    let r = q
        .read_blocking(&ns, Lba(8), IoBuf::prefix(r, 4096).unwrap(), T)
        .expect("the controller's read after the refused operations");
    assert!(r.buf().as_slice()[..4096].iter().all(|&b| b == 0x3c));
    drop(q);
    drop(ctrl);
    early
        .config_write_u16(0x04, command)
        .expect("the early access works again once the controller is gone");
}
