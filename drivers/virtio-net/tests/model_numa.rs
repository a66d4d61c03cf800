//! NUMA placement: the virtio-net rings and the control queue's memory are allocated
//! on the device's NUMA node (`PciDevice::numa_node`), asked for explicitly. The real driver
//! against the virtio-net model on the host.

mod model_support;

use model_support::{fast_cfg, open_model, pool, registry};
use ubdirect_core::DmaMem;
use ubdirect_devmodel::virtio_net::{Hostile, NetModelConfig};

#[test]
fn rings_and_control_page_are_on_the_devices_node() {
    for node in [0u32, 1] {
        let reg = registry();
        let pool = pool(&reg, 64);
        // A slab on another node with room comes first: memory placed without naming the
        // node would be carved from it.
        let _other = DmaMem::alloc_on(&reg, 4096, Some(9)).unwrap();
        let cfg = NetModelConfig {
            numa_node: Some(node),
            ..NetModelConfig::default()
        };
        let (_m, nic) = open_model(&reg, &pool, cfg, Hostile::default(), fast_cfg(16));
        let nic = nic.unwrap();
        // RX and TX rings of the one pair, the control ring and its command page.
        assert_eq!(
            nic.host_memory_numa(),
            vec![Some(node); 4],
            "device on node {node}"
        );
    }
}
