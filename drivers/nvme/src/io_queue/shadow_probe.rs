//! The probe behind [`crate::controller::ShadowDoorbells::Auto`]: reads through a queue pair
//! with shadow doorbells, counting the doorbell updates EventIdx let go without an MMIO write.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::controller::{Controller, PAGE_SIZE};
use crate::error::{NvmeError, Result, TIMEOUT_WAIT};
use crate::io_types::{IoBufs, QueueOptions, Recovery};
use crate::spec::command::io_opcode;
use crate::spec::Sqe;

use super::IoQueuePair;

/// Issue `reads` one-block reads of block 0 of the first namespace without metadata whose
/// blocks fit a page (data into the command slot's own page), up to `depth` in flight on a
/// ring of `8 * depth` entries, in batches (one SQ doorbell per batch, one CQ doorbell per
/// poll: with shadow doorbells the head goes to the shadow slot every batch); within `deadline`. Returns the counts, or None when no namespace suits.
pub(crate) fn probe_shadow(
    ctrl: &Arc<Controller>,
    reads: usize,
    depth: usize,
    deadline: Duration,
) -> Result<Option<ProbeCounts>> {
    let Some(ns) = ctrl
        .namespaces()
        .iter()
        .find(|n| n.metadata_size == 0 && n.lba_size as usize <= PAGE_SIZE)
    else {
        return Ok(None);
    };
    // A ring much longer than the reads in flight, used the way `perf` and the pipeline use
    // it: a batch of submissions, one SQ doorbell; every completion found, one CQ doorbell.
    let mut qp = IoQueuePair::new(
        ctrl,
        QueueOptions {
            depth: depth * 8,
            nsid: Some(ns.nsid),
            shadow_doorbells: true,
            recovery: Recovery::Report,
            ..QueueOptions::default()
        },
    )?;
    let before = qp.stats();
    let ahead_before = qp.sq_db.shadow_only_ahead + qp.cq_db.shadow_only_ahead;
    let end = Instant::now() + deadline;
    let (mut sent, mut done) = (0usize, 0usize);
    while done < reads {
        while sent < reads && sent - done < depth {
            let mut sqe = Sqe::new(io_opcode::READ);
            sqe.nsid = ns.nsid;
            sqe.set_slba(0);
            qp.queue_with_slot_page(sqe, ns.lba_size as usize, IoBufs::None, sent as u64, |_| {})
                .map_err(|r| r.error)?;
            sent += 1;
        }
        qp.ring();
        done += qp.poll(depth, |_| {})?;
        if done < reads && Instant::now() > end {
            return Err(NvmeError::Timeout {
                command: "Read",
                cid: 0,
                qid: qp.qid(),
                waited: deadline,
                then: TIMEOUT_WAIT,
            });
        }
    }
    let st = qp.stats();
    let mmio = (st.sq_doorbell_writes + st.cq_doorbell_writes)
        - (before.sq_doorbell_writes + before.cq_doorbell_writes);
    let saved = st.shadow_only_updates - before.shadow_only_updates;
    let saved_ahead = qp.sq_db.shadow_only_ahead + qp.cq_db.shadow_only_ahead - ahead_before;
    Ok(Some(ProbeCounts {
        updates: mmio + saved,
        saved,
        saved_ahead,
    }))
}

/// What the shadow-doorbell probe counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ProbeCounts {
    /// Doorbell updates (SQ tail and CQ head).
    pub(crate) updates: u64,
    /// Updates that went only to the shadow buffer.
    pub(crate) saved: u64,
    /// Of those, the ones the controller's EventIdx asked to hear of later (see
    /// `Doorbell::shadow_only_ahead`); the rest only raced the controller's processing.
    pub(crate) saved_ahead: u64,
}
