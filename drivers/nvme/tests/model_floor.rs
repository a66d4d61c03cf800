//! The floor loop (`ubdirect_nvme::perf::floor`) against the NVMe model on the host:
//! it keeps the asked depth in flight, completes reads without errors, writes at most one SQ
//! doorbell per batch of reads and one CQ head doorbell per batch (fewer where the CQ has
//! entries to spare), and deletes its queue pair again.

mod model_support;

use std::time::Duration;

use model_support::{fast_opts, model, within};
use ubdirect_core::util::{LatencyHistogram, Tsc};
use ubdirect_devmodel::nvme::NvmeConfig;
use ubdirect_nvme::perf::floor::{FloorJob, FloorQueue};
use ubdirect_nvme::Controller;

/// 4 KiB random reads over the whole namespace for 100 ms (2 s deadline), `pad_ticks` of
/// padding per read.
fn job(nsid: u32, blocks: u64, tsc: &Tsc, pad_ticks: u64) -> FloorJob {
    FloorJob {
        nsid,
        io_size: 4096,
        first_block: 0,
        span_blocks: blocks,
        run_ticks: tsc.ticks(Duration::from_millis(100)),
        wait_ticks: tsc.ticks(Duration::from_secs(2)),
        wait: Duration::from_secs(2),
        pad_ticks,
    }
}

#[test]
fn floor_loop_reads_at_qd1_and_qd32_and_deletes_its_queue() {
    within(Duration::from_secs(30), || {
        let (reg, m, dev) = model(NvmeConfig::default());
        let ctrl = Controller::open_device(&reg, dev, fast_opts()).unwrap();
        let ns = ctrl.namespaces()[0].clone();
        let tsc = Tsc::calibrate(Duration::from_millis(20));
        for depth in [1usize, 32] {
            let mut q = FloorQueue::new(&ctrl, ns.nsid, depth).unwrap();
            assert_eq!(q.depth(), depth);
            assert_eq!(ctrl.io_queues_in_use(), 1);
            let job = job(ns.nsid, ns.nsze, &tsc, 0);
            let mut hist = LatencyHistogram::new();
            let r = q.run(&job, &mut hist).unwrap();
            assert!(r.ios >= depth as u64, "QD{depth}: {r:?}");
            assert_eq!(r.errors, 0, "QD{depth}: {r:?}");
            assert_eq!(hist.count(), r.ios);
            assert!(
                r.sq_doorbell_writes >= 1 && r.sq_doorbell_writes <= r.ios,
                "{r:?}"
            );
            assert!(
                r.cq_doorbell_writes >= 1 && r.cq_doorbell_writes <= r.ios,
                "{r:?}"
            );
            // Reads larger than a page are refused before anything reaches the device.
            let big = FloorJob {
                io_size: 8192,
                ..job
            };
            assert!(q.run(&big, &mut hist).is_err());
            drop(q);
            assert_eq!(
                ctrl.io_queues_in_use(),
                0,
                "QD{depth}: the queue was deleted"
            );
        }
        assert!(m.dma_faults().is_empty());
    });
}

#[test]
fn floor_padding_spends_at_least_the_asked_ticks_per_read() {
    within(Duration::from_secs(30), || {
        let (reg, _m, dev) = model(NvmeConfig::default());
        let ctrl = Controller::open_device(&reg, dev, fast_opts()).unwrap();
        let ns = ctrl.namespaces()[0].clone();
        let tsc = Tsc::calibrate(Duration::from_millis(20));
        let mut q = FloorQueue::new(&ctrl, ns.nsid, 4).unwrap();
        // 1 ms of padding per re-queued read in a 100 ms run: at most ~100 re-queued reads
        // (plus the first batch of 4); an unpadded run on the model does thousands.
        let job = job(ns.nsid, ns.nsze, &tsc, tsc.ticks(Duration::from_millis(1)));
        let mut hist = LatencyHistogram::new();
        let r = q.run(&job, &mut hist).unwrap();
        assert!(r.ios >= 4, "{r:?}");
        assert!(
            r.ios <= 4 + 101,
            "1 ms of padding per read, 100 ms run: {r:?}"
        );
        assert_eq!(r.errors, 0, "{r:?}");
    });
}
