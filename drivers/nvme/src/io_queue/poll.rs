//! Reaping completions (phase tags, one CQ head doorbell per batch) and the idle-time slow path:
//! a CSTS health check once a quarter of `io_timeout` passed without a completion, then Aborts
//! after `io_timeout`, and a queue that stops for good (every call fails at once) when the
//! controller is gone, fatal, not ready or its admin queue does not answer.
//!
//! Worst case until the first error: `io_timeout` (CSTS all-ones / CFS / RDY=0 are seen from
//! `io_timeout / 4` on), or `io_timeout + admin_timeout` when the controller stays ready but
//! the first Abort is not answered.

use std::time::Instant;

use crate::error::{NvmeError, Result};
use crate::io_types::IoCompletion;
use crate::spec::command::{admin_opcode, io_opcode};
use crate::spec::Sqe;
use crate::status::NvmeStatus;

use super::{Dead, IoQueuePair};

impl IoQueuePair {
    /// Reap up to `max` finished requests, calling `f` for each; writes the CQ head doorbell
    /// once for the batch. Returns how many requests finished. An error means a malformed
    /// completion was skipped, a timeout (Abort was sent), or a dead/wedged controller.
    ///
    /// Once the controller is found gone, fatal, not ready, or an Abort timed out, the queue is
    /// dead: this and every later call (and every submission) fail at once with that error,
    /// and the requests still in flight stay with the queue ([`IoQueuePair::in_flight`] keeps
    /// counting them): their buffers never go back to the pool, as the device might still write
    /// them; dropping the queue pair leaks them.
    #[inline]
    pub fn poll(&mut self, max: usize, mut f: impl FnMut(IoCompletion)) -> Result<usize> {
        if self.dead.is_some() {
            if let Some(e) = self.dead_error() {
                return Err(e);
            }
        }
        let mut done = 0usize;
        let mut reaped = 0u32;
        let mut malformed: Option<NvmeError> = None;
        while done < max {
            let Some(cqe) = self.cq.peek() else { break };
            self.cq.advance();
            reaped += 1;
            let cid = cqe.cid as usize;
            if cid >= self.depth || !self.cmds[cid].active || cqe.sq_id != self.qid {
                malformed.get_or_insert(NvmeError::MalformedCompletion {
                    qid: self.qid,
                    cid: cqe.cid,
                    sq_id: cqe.sq_id,
                    reason: if cid >= self.depth || cqe.sq_id != self.qid {
                        "command id or SQ id out of range"
                    } else {
                        "no command with this id is in flight"
                    },
                });
                continue;
            }
            let rid = self.cmds[cid].req as usize;
            self.cmds[cid].active = false;
            self.free_cids[self.free_cid_top] = cid as u16;
            self.free_cid_top += 1;
            let status = NvmeStatus::from_cqe_status(cqe.status);
            let r = &mut self.reqs[rid];
            if !status.is_success() && r.error.is_none() {
                r.error = Some(status);
            }
            r.remaining -= 1;
            if r.remaining == 0 {
                let bufs = std::mem::take(&mut r.bufs);
                let result = match r.error {
                    None => Ok(r.bytes),
                    Some(status) => Err(NvmeError::Command {
                        command: opcode_name(r.opcode),
                        status,
                    }),
                };
                let tag = r.tag;
                self.free_reqs[self.free_req_top] = rid as u16;
                self.free_req_top += 1;
                self.in_flight -= 1;
                done += 1;
                f(IoCompletion { tag, bufs, result });
            }
        }
        if reaped > 0 {
            self.cq_db.write(self.cq.head());
            self.stats.completions += reaped as u64;
            self.idle_polls = 0;
            self.idle_since = None;
            self.aborted = false;
        } else if self.in_flight > 0 {
            self.idle_polls = self.idle_polls.wrapping_add(1);
            if self.idle_polls % 4096 == 0 {
                self.check_timeout()?;
            }
        }
        match malformed {
            Some(e) => Err(e),
            None => Ok(done),
        }
    }

    /// The error of a dead queue (None while it is alive). Cold: only on error paths.
    #[cold]
    pub(super) fn dead_error(&self) -> Option<NvmeError> {
        let (why, since) = self.dead?;
        const DURING: &str = "waiting for I/O completions";
        Some(match why {
            Dead::Gone => NvmeError::DeviceGone { register: "CSTS" },
            Dead::Fatal(csts) => NvmeError::ControllerFatal {
                csts,
                during: DURING,
            },
            Dead::NotReady(csts) => NvmeError::ControllerNotReady {
                csts,
                during: DURING,
            },
            Dead::Wedged => NvmeError::Wedged {
                qid: self.qid,
                outstanding: self.in_flight,
                waited: since.elapsed(),
            },
        })
    }

    /// Stop the queue for good because of `e` (a CSTS or admin failure); returns `e`.
    #[cold]
    fn die(&mut self, e: NvmeError) -> NvmeError {
        let why = match e {
            NvmeError::DeviceGone { .. } => Dead::Gone,
            NvmeError::ControllerFatal { csts, .. } => Dead::Fatal(csts),
            NvmeError::ControllerNotReady { csts, .. } => Dead::NotReady(csts),
            _ => Dead::Wedged,
        };
        self.dead = Some((why, Instant::now()));
        e
    }

    /// Called on the slow path when polls keep finding nothing.
    #[cold]
    fn check_timeout(&mut self) -> Result<()> {
        let now = Instant::now();
        let since = *self.idle_since.get_or_insert(now);
        let waited = now - since;
        if waited < self.io_timeout / 4 {
            return Ok(());
        }
        // Quiet for a while: is the controller still there and running? One MMIO read per
        // 4096 empty polls, only on this slow path.
        if let Err(e) = self.ctrl.csts_enabled("waiting for I/O completions") {
            return Err(self.die(e));
        }
        if waited < self.io_timeout {
            return Ok(());
        }
        if self.aborted {
            return Err(NvmeError::Wedged {
                qid: self.qid,
                outstanding: self.in_flight,
                waited,
            });
        }
        // Abort every command in flight; their completions (status "Command Abort Requested")
        // give the buffers back through poll(). When an Abort is not answered, the admin queue
        // is dead: stop at once instead of waiting admin_timeout per command.
        let mut first = None;
        for cid in 0..self.depth {
            if !self.cmds[cid].active {
                continue;
            }
            let opcode = self.reqs[self.cmds[cid].req as usize].opcode;
            first.get_or_insert((cid as u16, opcode));
            let mut a = Sqe::new(admin_opcode::ABORT);
            a.cdw10 = (cid as u32) << 16 | self.qid as u32;
            match self.ctrl.admin_exec(a, "Abort") {
                Ok(_) => {}
                // The controller refused this Abort (e.g. Abort Command Limit Exceeded): the
                // admin queue works; the next timeout check reports Wedged if nothing comes.
                Err(e @ NvmeError::Command { .. }) => {
                    tracing::warn!(error = %e, cid, qid = self.qid, "Abort failed");
                }
                Err(e) => {
                    tracing::warn!(error = %e, cid, qid = self.qid, "Abort not answered; the queue is dead");
                    let e = match e {
                        e @ (NvmeError::DeviceGone { .. }
                        | NvmeError::ControllerFatal { .. }
                        | NvmeError::ControllerNotReady { .. }) => e,
                        _ => NvmeError::Wedged {
                            qid: self.qid,
                            outstanding: self.in_flight,
                            waited: since.elapsed(),
                        },
                    };
                    return Err(self.die(e));
                }
            }
        }
        self.aborted = true;
        self.idle_since = Some(Instant::now());
        let (cid, opcode) = first.unwrap_or((0, 0));
        Err(NvmeError::Timeout {
            command: opcode_name(opcode),
            cid,
            qid: self.qid,
            waited,
        })
    }
}

/// The spec name of an NVM I/O opcode.
pub(crate) fn opcode_name(op: u8) -> &'static str {
    match op {
        io_opcode::FLUSH => "Flush",
        io_opcode::WRITE => "Write",
        io_opcode::READ => "Read",
        io_opcode::WRITE_ZEROES => "Write Zeroes",
        io_opcode::DATASET_MANAGEMENT => "Dataset Management",
        io_opcode::COMPARE => "Compare",
        _ => "I/O command",
    }
}
