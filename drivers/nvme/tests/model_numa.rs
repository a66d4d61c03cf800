//! NUMA placement: an I/O queue pair's rings and PRP list pages are allocated on the
//! controller's NUMA node (`PciDevice::numa_node`), asked for explicitly rather than guessed
//! from sysfs (which a modelled device, or a domain of devices on several nodes, does not
//! give). The real driver against the NVMe model on the host.

mod model_support;

use model_support::{fast_opts, model, queue};
use ubdirect_core::DmaMem;
use ubdirect_devmodel::nvme::NvmeConfig;
use ubdirect_nvme::Controller;

#[test]
fn rings_and_prp_pages_are_on_the_controllers_node() {
    for node in [Some(0), Some(1)] {
        let (reg, _m, dev) = model(NvmeConfig {
            numa_node: node,
            ..NvmeConfig::default()
        });
        assert_eq!(dev.numa_node(), node);
        // A slab on another node with room comes first: memory placed without naming the
        // node would be carved from it.
        let _other = DmaMem::alloc_on(&reg, 4096, Some(9)).unwrap();
        let ctrl = Controller::open_device(&reg, dev, fast_opts()).unwrap();
        let qp = queue(&ctrl, 8);
        assert_eq!(
            qp.host_memory_numa(),
            vec![node; 3],
            "controller on {node:?}"
        );
    }
}
