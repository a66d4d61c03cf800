//! Per-command deadlines, recovery and malformed completions on the host, against the NVMe
//! device model: a model that swallows exactly one command while it completes every
//! other one, or that rewrites one completion's command id. No VFIO, no QEMU.

mod model_support;

use std::time::{Duration, Instant};

use model_support::{anon_pool, fast_opts, model, one, within};
use ubdirect_core::{UbBuf, UbPool};
use ubdirect_devmodel::nvme::{NvmeConfig, Tamper};
use ubdirect_nvme::spec::command::{admin_opcode, io_opcode};
use ubdirect_nvme::{Controller, IoCompletion, IoQueuePair, NvmeError, QueueOptions, Recovery};
use ubdirect_nvme::{IoBuf, IoFlags, Lba};

const IO_TIMEOUT: Duration = Duration::from_millis(200);
const LOST: u64 = 1 << 40;

/// Swallows the first command of `opcode` fetched from I/O queue `qid` (never completes it);
/// answers everything else.
struct SwallowOne {
    qid: u16,
    opcode: u8,
    done: bool,
}

impl Tamper for SwallowOne {
    fn answer(&mut self, qid: u16, opcode: u8) -> bool {
        if !self.done && qid == self.qid && opcode == self.opcode {
            self.done = true;
            return false;
        }
        true
    }
}

/// Rewrites the command id of the `nth` completion posted to CQ `cqid` (0-based).
struct BadCid {
    cqid: u16,
    nth: usize,
    seen: usize,
    cid: u16,
}

impl Tamper for BadCid {
    fn completion(&mut self, cqid: u16, cqe: &mut [u8; 16]) {
        if cqid != self.cqid {
            return;
        }
        if self.seen == self.nth {
            cqe[12..14].copy_from_slice(&self.cid.to_le_bytes());
        }
        self.seen += 1;
    }
}

struct Bed {
    model: std::sync::Arc<ubdirect_devmodel::nvme::NvmeModel>,
    ctrl: std::sync::Arc<Controller>,
    pool: std::sync::Arc<UbPool>,
}

fn bed() -> Bed {
    let (reg, model, dev) = model(NvmeConfig::default());
    let ctrl = Controller::open_device(&reg, dev, fast_opts()).unwrap();
    let pool = anon_pool(&reg, 4096, 16);
    Bed { model, ctrl, pool }
}

fn queue(b: &Bed, recovery: Recovery) -> IoQueuePair {
    IoQueuePair::new(
        &b.ctrl,
        QueueOptions {
            depth: 8,
            io_timeout: IO_TIMEOUT,
            recovery,
            ..QueueOptions::default()
        },
    )
    .unwrap()
}

/// Queue the read the model will swallow (tag LOST), then 4 ordinary ones; ring.
fn start(b: &Bed, qp: &mut IoQueuePair) {
    b.model.set_tamper(Some(Box::new(SwallowOne {
        qid: qp.qid(),
        opcode: io_opcode::READ,
        done: false,
    })));
    qp.submit_read(
        &qp.namespace(1).unwrap(),
        Lba(100),
        IoBuf::prefix(b.pool.get().unwrap(), 4096).unwrap(),
        IoFlags::empty(),
        LOST,
    )
    .unwrap();
    submit_ordinary_reads(b, qp);
}

/// Queue 4 ordinary reads (tags 0-3, LBAs 0, 8, 16, 24) and ring.
fn submit_ordinary_reads(b: &Bed, qp: &mut IoQueuePair) {
    for t in 0..4 {
        qp.submit_read(
            &qp.namespace(1).unwrap(),
            Lba(t * 8),
            IoBuf::prefix(b.pool.get().unwrap(), 4096).unwrap(),
            IoFlags::empty(),
            t,
        )
        .unwrap();
    }
    qp.ring();
}

/// One poll: the ordinary reads are resubmitted at once (the queue stays busy); the lost one
/// goes to `lost`. Returns the poll's result and how many ordinary reads completed.
fn busy_poll(
    qp: &mut IoQueuePair,
    lost: &mut Option<IoCompletion>,
) -> (Result<usize, NvmeError>, u64) {
    let mut again: Vec<(u64, UbBuf)> = Vec::new();
    let r = qp.poll(16, |c| {
        if c.tag == LOST {
            *lost = Some(c);
        } else {
            c.result.as_ref().expect("ordinary reads succeed");
            again.push((c.tag, one(c.bufs).into_buf()));
        }
    });
    let n = again.len() as u64;
    for (t, b) in again {
        qp.submit_read(
            &qp.namespace(1).unwrap(),
            Lba(t * 8),
            IoBuf::prefix(b, 4096).unwrap(),
            IoFlags::empty(),
            t,
        )
        .unwrap();
    }
    qp.ring();
    (r, n)
}

#[test]
fn a_lost_command_times_out_on_a_busy_queue() {
    within(Duration::from_secs(20), || {
        let b = bed();
        let mut qp = queue(&b, Recovery::Report);
        let t0 = Instant::now();
        start(&b, &mut qp);
        let mut lost = None;
        let mut others = 0;
        let (e, at) = loop {
            let (r, n) = busy_poll(&mut qp, &mut lost);
            others += n;
            if let Err(e) = r {
                break (e, t0.elapsed());
            }
            assert!(
                t0.elapsed() < 10 * IO_TIMEOUT,
                "never noticed ({others} others done)"
            );
        };
        assert!(
            matches!(
                e,
                NvmeError::Timeout {
                    command: "Read",
                    qid: 1,
                    ..
                }
            ),
            "{e}"
        );
        assert!(at >= IO_TIMEOUT && at < 3 * IO_TIMEOUT, "{at:?}");
        assert!(others > 100, "the queue was busy: {others}");
        // The Abort reached the device (the model counts it), and the queue counts it too.
        assert_eq!(b.model.stats().admin_count(admin_opcode::ABORT), 1);
        let s = qp.stats();
        assert_eq!((s.timeouts, s.aborts_sent), (1, 1), "{s:?}");
        let (e, at2) = loop {
            if let (Err(e), _) = busy_poll(&mut qp, &mut lost) {
                break (e, t0.elapsed() - at);
            }
            assert!(t0.elapsed() - at < 10 * IO_TIMEOUT);
        };
        assert!(matches!(e, NvmeError::Wedged { qid: 1, .. }), "{e}");
        assert!(at2 >= IO_TIMEOUT && at2 < 3 * IO_TIMEOUT, "{at2:?}");
        assert!(lost.is_none());
    });
}

#[test]
fn a_lost_command_is_requeued_after_a_reset() {
    within(Duration::from_secs(20), || {
        let b = bed();
        let mut qp = queue(&b, Recovery::Requeue);
        let t0 = Instant::now();
        start(&b, &mut qp);
        let mut lost = None;
        let mut after = 0;
        while lost.is_none() || after < 100 {
            let (r, n) = busy_poll(&mut qp, &mut lost);
            r.expect("Requeue: no poll error");
            if lost.is_some() {
                after += n;
            }
            assert!(
                t0.elapsed() < 10 * IO_TIMEOUT,
                "the lost read never came back"
            );
        }
        let c = lost.unwrap();
        assert_eq!(c.result.unwrap(), 4096);
        let s = qp.stats();
        assert_eq!((s.timeouts, s.aborts_sent, s.resets), (1, 1, 1), "{s:?}");
        // The model completes a command when its doorbell is written: at the reset only the
        // lost read is in flight.
        assert_eq!(s.requeued, 1, "{s:?}");
        assert_eq!(b.ctrl.resets(), 1);
        assert_eq!(b.model.stats().admin_count(admin_opcode::ABORT), 1);
        assert_eq!(
            b.model.io_sq_count(),
            1,
            "the queue exists again on the device"
        );
        assert!(b.model.dma_faults().is_empty());
    });
}

#[test]
fn a_lost_command_fails_back_with_its_buffer() {
    within(Duration::from_secs(20), || {
        let b = bed();
        let mut qp = queue(&b, Recovery::FailBack);
        start(&b, &mut qp);
        let t0 = Instant::now();
        let mut done = Vec::new();
        while !done.iter().any(|c: &IoCompletion| c.tag == LOST) {
            // Nothing is resubmitted here: after the reset every request in flight comes back.
            qp.poll(16, |c| done.push(c))
                .expect("FailBack: no poll error");
            assert!(t0.elapsed() < 10 * IO_TIMEOUT);
        }
        let failed: Vec<_> = done.iter().filter(|c| c.result.is_err()).collect();
        assert_eq!(
            failed.len(),
            1,
            "only the lost read was in flight at the reset"
        );
        let c = failed[0];
        assert_eq!(c.tag, LOST);
        assert!(
            matches!(
                c.result,
                Err(NvmeError::FailedByReset {
                    command: "Read",
                    qid: 1
                })
            ),
            "{:?}",
            c.result
        );
        assert!(matches!(c.bufs, ubdirect_nvme::IoBufs::One(_)));
        assert_eq!(qp.in_flight(), 0);
        assert_eq!(qp.stats().failed_back, 1);
        drop(done);
        let r = qp
            .read_blocking(
                &qp.namespace(1).unwrap(),
                Lba(0),
                IoBuf::prefix(b.pool.get().unwrap(), 4096).unwrap(),
                Duration::from_secs(5),
            )
            .unwrap()
            .into_buf();
        drop(r);
        assert_eq!(b.pool.stats().in_use, 0);
    });
}

#[test]
fn wait_for_keeps_a_completion_that_came_with_a_malformed_one() {
    within(Duration::from_secs(20), || {
        let b = bed();
        let mut qp = queue(&b, Recovery::Report);
        b.model.set_tamper(Some(Box::new(BadCid {
            cqid: qp.qid(),
            nth: 0,
            seen: 0,
            cid: 0x7fff,
        })));
        qp.submit_read(
            &qp.namespace(1).unwrap(),
            Lba(0),
            IoBuf::prefix(b.pool.get().unwrap(), 4096).unwrap(),
            IoFlags::empty(),
            1,
        )
        .unwrap();
        qp.submit_read(
            &qp.namespace(1).unwrap(),
            Lba(8),
            IoBuf::prefix(b.pool.get().unwrap(), 4096).unwrap(),
            IoFlags::empty(),
            2,
        )
        .unwrap();
        qp.ring();
        // The first completion's id is out of range (skipped, malformed), the second is good:
        // both arrive in one poll. Before the fix wait_for returned the error and lost tag 2.
        let mut tags = Vec::new();
        let n = qp
            .wait_for(1, Duration::from_secs(2), |c| tags.push(c.tag))
            .unwrap();
        assert_eq!((n, tags), (1, vec![2]));
        assert_eq!(qp.stats().malformed_completions, 1);
    });
}

#[test]
fn an_admin_completion_with_a_wrong_id_times_out_and_wedges_every_admin_path() {
    within(Duration::from_secs(20), || {
        let b = bed();
        b.model.set_tamper(Some(Box::new(BadCid {
            cqid: 0,
            nth: 0,
            seen: 0,
            cid: 0xbeef,
        })));
        let t0 = Instant::now();
        let e = b.ctrl.get_features(7, 0).unwrap_err();
        let at = t0.elapsed();
        // fast_opts: admin_timeout 200 ms.
        assert!(matches!(e, NvmeError::Timeout { qid: 0, .. }), "{e}");
        assert!(
            at >= Duration::from_millis(200) && at < Duration::from_millis(600),
            "{at:?}"
        );
        b.model.set_tamper(None);
        let t1 = Instant::now();
        for e in [
            b.ctrl.identify_controller().map(|_| ()).unwrap_err(),
            b.ctrl.identify_namespace(1).map(|_| ()).unwrap_err(),
            b.ctrl.smart_log().map(|_| ()).unwrap_err(),
        ] {
            assert!(matches!(e, NvmeError::Wedged { qid: 0, .. }), "{e}");
        }
        assert!(t1.elapsed() < Duration::from_millis(50));
        b.ctrl.reset().unwrap();
        assert!(!b.ctrl.admin_wedged());
        b.ctrl.identify_controller().unwrap();
    });
}

#[test]
fn admin_command_refuses_commands_that_may_carry_addresses() {
    use ubdirect_nvme::spec::Sqe;
    let b = bed();
    let before = b.model.stats().admin_count(admin_opcode::IDENTIFY);
    let mut abort_with_data = Sqe::new(admin_opcode::ABORT);
    abort_with_data.prp1 = 0x1000;
    for sqe in [
        Sqe::new(admin_opcode::IDENTIFY),
        Sqe::new(admin_opcode::CREATE_IO_CQ),
        Sqe::new(admin_opcode::SET_FEATURES),
        abort_with_data,
    ] {
        let e = b.ctrl.admin_command(sqe, "refused").unwrap_err();
        assert!(matches!(e, NvmeError::InvalidArgument(_)), "{e}");
    }
    // Nothing reached the device; an Abort without data does.
    assert_eq!(b.model.stats().admin_count(admin_opcode::IDENTIFY), before);
    assert_eq!(b.model.stats().admin_count(admin_opcode::CREATE_IO_CQ), 0);
    let mut abort = Sqe::new(admin_opcode::ABORT);
    abort.cdw10 = 1 << 16 | 1;
    b.ctrl.admin_command(abort, "Abort").unwrap();
    assert_eq!(b.model.stats().admin_count(admin_opcode::ABORT), 1);
}

/// Loses the first SQ tail doorbell write of queue `qid` (the MMIO write never reaches the
/// controller); passes every other write.
struct LoseOneSqDoorbell {
    qid: u16,
    lost: bool,
}

impl Tamper for LoseOneSqDoorbell {
    fn sq_doorbell(&mut self, qid: u16, _value: u16) -> bool {
        if !self.lost && qid == self.qid {
            self.lost = true;
            return false;
        }
        true
    }
}

#[test]
fn a_lost_sq_doorbell_write_is_written_again_and_the_reads_complete_without_a_timeout() {
    // RELIABILITY.md S9-3: a controller that lost the doorbell write announcing
    // commands would leave them to time out, be aborted and the controller reset. The queue
    // writes the same tail again once a command has waited io_timeout / 4 with the controller
    // ready, and the reads complete. Fails on a driver that never writes the tail again (the
    // reads time out: Timeout after io_timeout).
    within(Duration::from_secs(20), || {
        let b = bed();
        let mut qp = queue(&b, Recovery::Report);
        b.model.set_tamper(Some(Box::new(LoseOneSqDoorbell {
            qid: qp.qid(),
            lost: false,
        })));
        submit_ordinary_reads(&b, &mut qp);
        let t0 = Instant::now();
        let mut done = 0;
        while done < 4 {
            done += qp
                .poll(16, |c| {
                    c.result.as_ref().expect("the reads succeed");
                })
                .unwrap_or_else(|e| panic!("after {:?}: {e}", t0.elapsed()));
            assert!(t0.elapsed() < 3 * IO_TIMEOUT, "never completed");
        }
        let took = t0.elapsed();
        assert_eq!(b.model.stats().lost_doorbells, 1);
        let s = qp.stats();
        assert_eq!((s.timeouts, s.aborts_sent), (0, 0), "{s:?}");
        assert!(s.doorbell_kicks >= 1, "{s:?}");
        // The first kick comes at io_timeout / 4 (+ one check interval, io_timeout / 16).
        assert!(
            took >= IO_TIMEOUT / 4 && took < IO_TIMEOUT,
            "{took:?} (io_timeout {IO_TIMEOUT:?})"
        );
        assert_eq!(b.model.stats().admin_count(admin_opcode::ABORT), 0);
    });
}

#[test]
fn a_queue_answers_the_kernels_request_for_the_device_within_its_deadline_check() {
    use ubdirect_devmodel::nvme::Hostile;
    let (reg, m, dev) = model_support::hostile(NvmeConfig::default(), Hostile::default());
    let ctrl = Controller::open_device(&reg, dev, model_support::fast_opts()).unwrap();
    let pool = model_support::anon_pool(&reg, 4096, 4);
    let ns = ctrl.namespace(1).unwrap();
    let mut q = model_support::queue(&ctrl, 4);
    // The device stops answering: reads stay in flight, so the queue keeps checking.
    m.set_tamper(Some(
        Hostile {
            silent_after: Some(0),
            ..Hostile::default()
        }
        .into_tamper(),
    ));
    let b = IoBuf::prefix(pool.get().unwrap(), 4096).unwrap();
    q.submit_read(&ns, Lba(0), b, IoFlags::empty(), 1).unwrap();
    q.ring();
    m.request_removal();
    let t0 = std::time::Instant::now();
    let e = loop {
        // The read in flight gets the removal's drain (2 s), which a silent device runs out.
        assert!(
            t0.elapsed() < Duration::from_secs(4),
            "the removal request went unanswered"
        );
        if let Err(e) = q.poll(4, |_| {}) {
            break e;
        }
    };
    let took = t0.elapsed();
    assert!(took >= Duration::from_millis(1900), "{took:?}");
    assert!(matches!(e, NvmeError::RemovalRequested { .. }), "{e}");
    assert!(e.to_string().contains("asked for"), "{e}");
    // Every later call says the same.
    assert!(matches!(
        q.poll(4, |_| {}),
        Err(NvmeError::RemovalRequested { .. })
    ));
    let b = IoBuf::prefix(pool.get().unwrap(), 4096).unwrap();
    let r = q
        .submit_read(&ns, Lba(0), b, IoFlags::empty(), 2)
        .unwrap_err();
    assert!(
        matches!(r.error, NvmeError::RemovalRequested { .. }),
        "{}",
        r.error
    );
}

#[test]
fn after_a_removal_request_the_reads_in_flight_complete_and_new_ones_are_refused() {
    use ubdirect_devmodel::nvme::Hostile;
    let (reg, m, dev) = model_support::hostile(NvmeConfig::default(), Hostile::default());
    let ctrl = Controller::open_device(&reg, dev, model_support::fast_opts()).unwrap();
    let pool = model_support::anon_pool(&reg, 4096, 4);
    let ns = ctrl.namespace(1).unwrap();
    let mut q = IoQueuePair::new(
        &ctrl,
        QueueOptions {
            depth: 4,
            io_timeout: Duration::from_millis(400),
            ..QueueOptions::default()
        },
    )
    .unwrap();
    // The read's doorbell is lost: it stays in flight until the queue's kick (io_timeout / 4),
    // after the removal request is seen.
    m.set_tamper(Some(
        Hostile {
            lost_sq_doorbells: vec![0],
            ..Hostile::default()
        }
        .into_tamper(),
    ));
    let b = IoBuf::prefix(pool.get().unwrap(), 4096).unwrap();
    q.submit_read(&ns, Lba(0), b, IoFlags::empty(), 7).unwrap();
    q.ring();
    m.request_removal();
    let t0 = std::time::Instant::now();
    let mut done = Vec::new();
    let e = loop {
        assert!(t0.elapsed() < Duration::from_secs(3), "no end: {done:?}");
        match q.poll(4, |c| done.push((c.tag, c.result.is_ok()))) {
            Ok(_) => {}
            Err(e) => break e,
        }
        if done.is_empty() {
            continue;
        }
        // Drained: nothing new goes to a device the kernel wants back.
        let b = IoBuf::prefix(pool.get().unwrap(), 4096).unwrap();
        let r = q
            .submit_read(&ns, Lba(1), b, IoFlags::empty(), 8)
            .unwrap_err();
        assert!(
            matches!(r.error, NvmeError::RemovalRequested { .. }),
            "{}",
            r.error
        );
    };
    assert_eq!(done, vec![(7, true)], "the read in flight completed");
    assert!(matches!(e, NvmeError::RemovalRequested { .. }), "{e}");
    assert!(
        t0.elapsed() < Duration::from_millis(1500),
        "{:?}",
        t0.elapsed()
    );
    assert_eq!(q.in_flight(), 0);
}
