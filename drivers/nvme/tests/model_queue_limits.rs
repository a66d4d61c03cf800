//! I/O queue creation on a PCIe controller (the device model) runs the controller logic it
//! shares with NVMe/TCP (`controller::transport::create_io_queue`): the same ids, entries and
//! limits as the TCP test `ctrl_tests::io_queues_take_the_granted_ids_and_entries_within_cap_mqes_as_on_pcie`.

mod model_support;

use model_support::{fast_opts, model, queue};
use ubdirect_devmodel::nvme::{regs, NvmeConfig};
use ubdirect_nvme::{Controller, IoQueuePair, NvmeError, QueueOptions};

fn try_queue(
    ctrl: &std::sync::Arc<Controller>,
    depth: usize,
) -> ubdirect_nvme::Result<IoQueuePair> {
    IoQueuePair::new(
        ctrl,
        QueueOptions {
            depth,
            ..QueueOptions::default()
        },
    )
}

#[test]
fn io_queues_take_the_granted_ids_and_entries_within_cap_mqes() {
    // MQES 127 (128 entries), 2 I/O queues granted: the fake NVMe/TCP target's figures.
    let (reg, _m, dev) = model(NvmeConfig {
        cap: regs::cap(127, 0, 2),
        max_io_queues: 2,
        ..NvmeConfig::default()
    });
    let ctrl = Controller::open_device(&reg, dev, fast_opts()).unwrap();
    assert_eq!(ctrl.io_queues_granted(), 2);
    let a = queue(&ctrl, 32);
    let b = queue(&ctrl, 1000);
    assert_eq!((a.qid(), a.depth()), (1, 32));
    // CAP.MQES 127: 128 entries, one kept free.
    assert_eq!((b.qid(), b.depth()), (2, 127));
    assert_eq!(ctrl.io_queues_in_use(), 2);
    let e = try_queue(&ctrl, 8).err().expect("a third queue is refused");
    assert!(matches!(e, NvmeError::NoQueuesLeft { granted: 2 }), "{e:?}");
    assert!(e.to_string().contains("drop one first"), "{e}");
    let e = try_queue(&ctrl, 0).err().expect("depth 0 is refused");
    assert!(matches!(e, NvmeError::InvalidArgument(_)), "{e:?}");
    drop(a);
    assert_eq!(ctrl.io_queues_in_use(), 1);
    let again = queue(&ctrl, 8);
    assert_eq!((again.qid(), again.depth()), (1, 8));
}
