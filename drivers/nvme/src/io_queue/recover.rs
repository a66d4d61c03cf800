//! Recovery after a timeout or a controller fault (queue option [`Recovery`] other than
//! `Report`), like the Linux driver's: reset the controller (once, whichever queue pair asks
//! first), then re-create this queue on the device over the same rings and either submit the
//! requests that were in flight again or complete them with their buffers and
//! [`NvmeError::FailedByReset`]. Cold code: only after a fault.

use crate::error::{NvmeError, Result};
use crate::io_types::{IoCompletion, IoPayload, Recovery};

use super::poll::opcode_name;
use super::{create_device_queues, doorbells, IoQueuePair};

impl<P: IoPayload> IoQueuePair<P> {
    /// Reset the controller because of `why`, then rebuild this queue. A reset that fails
    /// (device gone, controller never ready again, namespace changed) kills the queue with its
    /// error.
    #[cold]
    pub(super) fn recover(
        &mut self,
        f: &mut dyn FnMut(IoCompletion<P>),
        why: NvmeError,
    ) -> Result<usize> {
        let span = self.ctrl.span().clone();
        let _entered = span.enter();
        tracing::warn!(qid = self.qid, error = %why, "NVMe I/O queue recovering: resetting the controller");
        if let Err(e) = self.ctrl.recover(self.generation) {
            tracing::warn!(qid = self.qid, error = %e, "NVMe controller reset failed; the queue is dead");
            // A controller found fatal or not ready that a reset cannot bring back: that
            // first finding is the error to report (the reset's is in the log).
            let keep = match why {
                NvmeError::ControllerNotReady { .. } | NvmeError::ControllerFatal { .. } => why,
                _ => e,
            };
            return Err(self.die(keep));
        }
        self.rebuild(f)
    }

    /// The controller was reset since this queue was created (by another queue pair's
    /// recovery, or [`crate::Controller::reset`]): rebuild, or die with
    /// [`NvmeError::ResetUnderQueue`] when the queue reports instead of recovering.
    #[cold]
    pub(super) fn after_reset_elsewhere(
        &mut self,
        f: &mut dyn FnMut(IoCompletion<P>),
    ) -> Result<usize> {
        if self.recovery == Recovery::Report {
            return Err(self.die(NvmeError::ResetUnderQueue {
                qid: self.qid,
                outstanding: self.in_flight,
            }));
        }
        self.rebuild(f)
    }

    /// Re-create the queue on the device after a reset and requeue or fail back what was in
    /// flight. Returns the requests completed (failed back).
    #[cold]
    fn rebuild(&mut self, f: &mut dyn FnMut(IoCompletion<P>)) -> Result<usize> {
        self.generation = self.ctrl.generation();
        self.stats.resets += 1;
        // The controller was disabled since: it no longer reads or writes the old rings, the
        // PRP lists or the buffers of the requests in flight.
        self.sq.reset();
        self.cq.reset();
        self.rung_tail = 0;
        self.cq_unrung = 0;
        if let Err(e) = create_device_queues(&self.ctrl, self.qid, &self.sq, &self.cq) {
            tracing::warn!(qid = self.qid, error = %e, "re-creating the NVMe I/O queue after a reset failed; the queue is dead");
            return Err(self.die(e));
        }
        let (mut sq_db, mut cq_db) = doorbells(&self.ctrl, self.qid, self.sq_db.is_shadowed());
        sq_db.carry_counts_from(&self.sq_db);
        cq_db.carry_counts_from(&self.cq_db);
        self.sq_db = sq_db;
        self.cq_db = cq_db;
        self.last_check = ubdirect_core::util::rdtsc();
        if self.recovery == Recovery::FailBack {
            let n = self.fail_back_pending(f);
            return Ok(n + self.fail_back_all(f));
        }
        // Requeue: the same entries (same command ids, same PRP list pages) again.
        let now = ubdirect_core::util::rdtsc();
        for cid in 0..self.depth {
            if !self.cmds[cid].active {
                continue;
            }
            self.cmds[cid].aborted = false;
            self.cmds[cid].stamp = now;
            self.sq.push(&self.sqes[cid]);
            self.stats.requeued += 1;
        }
        self.ring();
        tracing::info!(
            qid = self.qid,
            requeued = self.in_flight,
            "NVMe I/O queue back after a controller reset"
        );
        Ok(0)
    }

    /// Complete every request in flight with [`NvmeError::FailedByReset`] and its buffers.
    #[cold]
    fn fail_back_all(&mut self, f: &mut dyn FnMut(IoCompletion<P>)) -> usize {
        let mut n = 0;
        for cid in 0..self.depth {
            if !self.cmds[cid].active {
                continue;
            }
            let rid = self.cmds[cid].req as usize;
            self.cmds[cid].active = false;
            self.free_cids[self.free_cid_top] = cid as u16;
            self.free_cid_top += 1;
            let r = &mut self.reqs[rid];
            r.remaining -= 1;
            if r.remaining != 0 {
                continue;
            }
            let c = IoCompletion {
                tag: r.tag,
                bufs: r
                    .bufs
                    .take()
                    .expect("a request in flight holds its payload"),
                result: Err(NvmeError::FailedByReset {
                    command: opcode_name(r.opcode),
                    qid: self.qid,
                }),
            };
            self.free_reqs[self.free_req_top] = rid as u16;
            self.free_req_top += 1;
            self.in_flight -= 1;
            self.stats.failed_back += 1;
            n += 1;
            f(c);
        }
        n
    }
}
