//! [`Association`]: what a [`super::ctrl::TcpController`] and its queues (each a connection of
//! its own) share: the I/O queue ids (the controller logic shared with PCIe,
//! [`crate::controller::transport::QueueIds`]) and when a Keep Alive was last answered, so an
//! I/O queue whose connection the target closed can tell that the controller's keep-alive
//! timeout expired (the target drops every queue of the controller then, not only the admin
//! queue).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::controller::transport::{QidUse, QueueIds};

/// The state one controller's queues share.
#[derive(Debug)]
pub(crate) struct Association {
    /// I/O queue ids 1..=granted (Set Features, Number of Queues).
    pub(crate) ids: QueueIds,
    /// The keep-alive timeout given in the admin Connect (zero: none).
    kato: Duration,
    /// The clock's zero.
    base: Instant,
    /// Microseconds from `base` to the last Keep Alive answered (or the association's start).
    answered_us: AtomicU64,
}

impl Association {
    /// An association granted `granted` I/O queues, with keep-alive timeout `kato`.
    pub(crate) fn new(granted: u16, kato: Duration) -> Arc<Association> {
        Arc::new(Association {
            ids: QueueIds::new(granted),
            kato,
            base: Instant::now(),
            answered_us: AtomicU64::new(0),
        })
    }

    /// A Keep Alive was answered now.
    pub(crate) fn keep_alive_answered(&self) {
        let us = self.base.elapsed().as_micros().min(u64::MAX as u128) as u64;
        self.answered_us.fetch_max(us, Ordering::Relaxed);
    }

    /// Time since the last Keep Alive was answered, and the KATO; None without keep-alive.
    pub(crate) fn keep_alive_idle(&self) -> Option<(Duration, Duration)> {
        if self.kato.is_zero() {
            return None;
        }
        let at = Duration::from_micros(self.answered_us.load(Ordering::Relaxed));
        Some((self.base.elapsed().saturating_sub(at), self.kato))
    }
}

/// A queue's place in its controller's association: an I/O queue's id goes back when the
/// queue is dropped (the admin queue, id 0, has none to give back).
#[derive(Debug)]
pub(crate) struct Member {
    pub(crate) assoc: Arc<Association>,
    qid: u16,
}

impl Member {
    /// Queue `qid` (its id already taken from `assoc.ids`, or 0 for the admin queue).
    pub(crate) fn new(assoc: Arc<Association>, qid: u16) -> Member {
        Member { assoc, qid }
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        self.assoc.ids.set(self.qid, QidUse::Free);
    }
}
