//! Reaping completions (phase tags, one CQ head doorbell per batch) and the idle-time timeout
//! check that aborts commands and reports a wedged controller.

use std::time::Instant;

use crate::error::{NvmeError, Result};
use crate::io_types::IoCompletion;
use crate::spec::command::{admin_opcode, io_opcode};
use crate::spec::Sqe;
use crate::status::NvmeStatus;

use super::IoQueuePair;

impl IoQueuePair {
    /// Reap up to `max` finished requests, calling `f` for each; writes the CQ head doorbell
    /// once for the batch. Returns how many requests finished. An error means a malformed
    /// completion was skipped, a timeout (Abort was sent), or a dead/wedged controller.
    #[inline]
    pub fn poll(&mut self, max: usize, mut f: impl FnMut(IoCompletion)) -> Result<usize> {
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

    /// Called on the slow path when polls keep finding nothing.
    #[cold]
    fn check_timeout(&mut self) -> Result<()> {
        let now = Instant::now();
        let since = *self.idle_since.get_or_insert(now);
        let waited = now - since;
        if waited < self.io_timeout {
            return Ok(());
        }
        self.ctrl.csts("waiting for I/O completions")?;
        if self.aborted {
            return Err(NvmeError::Wedged {
                qid: self.qid,
                outstanding: self.in_flight,
                waited,
            });
        }
        // Abort every command in flight; their completions (status "Command Abort Requested")
        // give the buffers back through poll().
        let mut first = None;
        for cid in 0..self.depth {
            if self.cmds[cid].active {
                let opcode = self.reqs[self.cmds[cid].req as usize].opcode;
                first.get_or_insert((cid as u16, opcode));
                let mut a = Sqe::new(admin_opcode::ABORT);
                a.cdw10 = (cid as u32) << 16 | self.qid as u32;
                if let Err(e) = self.ctrl.admin_exec(a, "Abort") {
                    tracing::warn!(error = %e, cid, qid = self.qid, "Abort failed");
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
