//! The CQ head doorbell is written once per many completions: an I/O CQ has the entries of
//! one page where the controller's MQES allows (more than its SQ), and the head doorbell lags
//! by fewer than the entries beyond the SQ's, so the controller never finds the CQ full. The
//! real driver against the NVMe model, which counts the times commands waited on a full CQ.

mod model_support;

use std::sync::Arc;
use std::time::Duration;

use model_support::{anon_pool, fast_opts, model, queue};
use ubdirect_devmodel::nvme::{regs, NvmeConfig, NvmeModel};
use ubdirect_nvme::{Controller, IoBuf, IoFlags, IoQueuePair, Lba};

const T: Duration = Duration::from_secs(5);

/// `reads` reads of one block, `depth` in flight, each completion's buffer resubmitted; returns
/// the CQ head doorbell MMIO writes they took.
fn reads(ctrl: &Arc<Controller>, qp: &mut IoQueuePair, depth: usize, reads: u64) -> u64 {
    let pool = anon_pool(ctrl.registry(), 4096, depth);
    let ns = qp.namespace(1).unwrap();
    let before = qp.stats().cq_doorbell_writes;
    let mut bufs: Vec<_> = (0..depth).map(|_| pool.get().unwrap()).collect();
    let (mut sent, mut done) = (0u64, 0u64);
    while done < reads {
        while sent < reads && !bufs.is_empty() {
            let buf = IoBuf::prefix(bufs.pop().unwrap(), 4096).unwrap();
            qp.submit_read(&ns, Lba(sent % 64), buf, IoFlags::empty(), sent)
                .map_err(|r| r.error)
                .unwrap();
            sent += 1;
        }
        qp.ring();
        done += qp
            .wait_for(1, T, |c| {
                c.result.unwrap();
                bufs.push(model_support::one(c.bufs).into_buf());
            })
            .unwrap() as u64;
    }
    qp.stats().cq_doorbell_writes - before
}

fn open(cfg: NvmeConfig) -> (Arc<Controller>, Arc<NvmeModel>) {
    let (reg, m, dev) = model(cfg);
    (Controller::open_device(&reg, dev, fast_opts()).unwrap(), m)
}

#[test]
fn at_queue_depth_one_the_head_doorbell_is_written_once_per_many_reads() {
    let (ctrl, m) = open(NvmeConfig::default());
    let mut qp = queue(&ctrl, 1);
    let writes = reads(&ctrl, &mut qp, 1, 1000);
    // 256 CQ entries, 2 SQ entries: at most one write per 254 completions.
    assert!(
        (1..=1000 / 254 + 1).contains(&writes),
        "{writes} head doorbell writes"
    );
    assert_eq!(m.stats().cq_full_waits, 0);
}

#[test]
fn a_deep_queue_never_finds_its_cq_full() {
    let (ctrl, m) = open(NvmeConfig::default());
    for depth in [31, 200, 255] {
        let mut qp = queue(&ctrl, depth);
        let writes = reads(&ctrl, &mut qp, depth, 3000);
        assert!(writes >= 1, "depth {depth}");
        assert_eq!(m.stats().cq_full_waits, 0, "depth {depth}");
    }
}

#[test]
fn a_cq_no_larger_than_its_sq_gets_a_head_doorbell_every_batch() {
    // MQES 7: eight entries for the SQ and the CQ alike.
    let (ctrl, m) = open(NvmeConfig {
        cap: regs::cap(7, 0, 2),
        ..NvmeConfig::default()
    });
    let mut qp = queue(&ctrl, 1);
    let writes = reads(&ctrl, &mut qp, 1, 200);
    // The CQ has 8 entries, the SQ 2: the head doorbell lags by up to 6 completions.
    assert!((200 / 6..=200).contains(&writes), "{writes}");
    let mut qp = queue(&ctrl, 7);
    let before = m.stats().cq_full_waits;
    let writes = reads(&ctrl, &mut qp, 7, 700);
    assert!(writes >= 700 / 7, "{writes}");
    assert_eq!(m.stats().cq_full_waits, before);
}
