//! A controller reset with [`Recovery::FailBack`] while queued requests wait in the pending list:
//! the model swallows every I/O command, so one request has commands in flight and
//! commands not sent yet, and a second request has sent nothing. After the timeout the queue
//! resets the controller; each request completes exactly once with `FailedByReset` and its
//! buffer, none of the unsent commands ever reaches the device, every slot is free again and
//! the queue works afterwards. The real driver against the NVMe model on the host.

mod model_support;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use model_support::{anon_pool, fast_opts, model, one, small_mdts, within};
use ubdirect_devmodel::nvme::Tamper;
use ubdirect_nvme::spec::command::io_opcode;
use ubdirect_nvme::{Controller, IoBuf, IoFlags, IoQueuePair, Lba, NvmeError, QueueOptions};
use ubdirect_nvme::{IoCompletion, Recovery};

const IO_TIMEOUT: Duration = Duration::from_millis(200);

/// Swallows (never completes) every I/O command while `on`; answers admin commands.
struct SwallowIo {
    on: Arc<AtomicBool>,
}

impl Tamper for SwallowIo {
    fn answer(&mut self, qid: u16, _opcode: u8) -> bool {
        qid == 0 || !self.on.load(Ordering::SeqCst)
    }
}

#[test]
fn a_reset_fails_back_requests_waiting_in_the_pending_list_once_each() {
    within(Duration::from_secs(30), || {
        // MDTS 2: 16 KiB per command.
        let (reg, m, dev) = model(small_mdts());
        let ctrl = Controller::open_device(&reg, dev, fast_opts()).unwrap();
        let pool = anon_pool(&reg, 64 << 10, 3);
        let mut qp = IoQueuePair::new(
            &ctrl,
            QueueOptions {
                depth: 2,
                io_timeout: IO_TIMEOUT,
                recovery: Recovery::FailBack,
                ..QueueOptions::default()
            },
        )
        .unwrap();
        let swallow = Arc::new(AtomicBool::new(true));
        m.set_tamper(Some(Box::new(SwallowIo {
            on: swallow.clone(),
        })));
        let reads_before = m.stats().io_count(io_opcode::READ);
        let ns = qp.namespace(1).unwrap();
        // Request 1: 64 KiB = 4 commands; 2 fit the 2 slots, 2 wait.
        qp.submit_read(
            &ns,
            Lba(0),
            IoBuf::prefix(pool.get().unwrap(), 64 << 10).unwrap(),
            IoFlags::empty(),
            1,
        )
        .unwrap();
        // Request 2: 4 KiB, all of it waits behind request 1.
        qp.submit_read(
            &ns,
            Lba(512),
            IoBuf::prefix(pool.get().unwrap(), 4096).unwrap(),
            IoFlags::empty(),
            2,
        )
        .unwrap();
        qp.ring();
        assert_eq!(
            (qp.in_flight(), qp.pending_requests(), qp.free_slots()),
            (2, 2, 0)
        );
        let t0 = Instant::now();
        let mut done: BTreeMap<u64, IoCompletion> = BTreeMap::new();
        while done.len() < 2 {
            qp.poll(8, |c| {
                let tag = c.tag;
                assert!(
                    done.insert(tag, c).is_none(),
                    "request {tag} completed twice"
                );
            })
            .expect("FailBack: poll reports no error");
            assert!(
                t0.elapsed() < 20 * IO_TIMEOUT,
                "no fail-back after {:?}: {} completed",
                t0.elapsed(),
                done.len()
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(done.keys().copied().collect::<Vec<_>>(), vec![1, 2]);
        for (tag, c) in done {
            assert!(
                matches!(
                    c.result,
                    Err(NvmeError::FailedByReset {
                        command: "Read",
                        ..
                    })
                ),
                "request {tag}: {:?}",
                c.result
            );
            let b = one(c.bufs);
            assert_eq!(b.len(), if tag == 1 { 64 << 10 } else { 4096 });
        }
        let s = qp.stats();
        assert_eq!((s.resets, s.failed_back), (1, 2), "{s:?}");
        assert_eq!(
            (qp.in_flight(), qp.pending_requests(), qp.free_slots()),
            (0, 0, 2),
            "every request and command slot is free again"
        );
        assert_eq!(
            m.stats().io_count(io_opcode::READ) - reads_before,
            2,
            "only the 2 commands sent before the reset reached the device"
        );
        assert_eq!(pool.stats().in_use, 0, "both buffers came back");
        // The queue works after the reset: a 64 KiB read (queued again over 2 slots).
        swallow.store(false, Ordering::SeqCst);
        let r = qp
            .read_blocking(
                &ns,
                Lba(0),
                IoBuf::prefix(pool.get().unwrap(), 64 << 10).unwrap(),
                Duration::from_secs(5),
            )
            .expect("a read after the reset");
        assert_eq!(r.len(), 64 << 10);
        drop(r);
        assert!(m.dma_faults().is_empty());
    });
}
