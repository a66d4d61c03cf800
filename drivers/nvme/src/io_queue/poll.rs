//! Reaping completions (phase tags, the CQ head doorbell once per many entries) and the deadline
//! slow path.
//!
//! Every command is timed from its own submission (a cycle-counter stamp in its slot), so a
//! queue that keeps completing other commands still notices one that never comes back. Every
//! [`CHECK_EVERY`] (32) polls with requests in flight, at most once per `io_timeout / 16`, one scan
//! of the slots finds the oldest command: from `io_timeout / 4` on the controller's CSTS is
//! read (all-ones, CFS, RDY=0); at `io_timeout` an Abort is sent for it and its clock restarts;
//! at `io_timeout` after the Abort the queue's [`Recovery`] decides: report (`Wedged`), or
//! reset the controller and requeue / fail back the requests in flight.
//!
//! Worst case until the first error with [`Recovery::Report`]: `io_timeout` (CSTS all-ones /
//! CFS / RDY=0 are seen from `io_timeout / 4` on), or `io_timeout + admin_timeout` when the
//! controller stays ready but the first Abort is not answered.

use std::time::Instant;

use crate::error::{NvmeError, Result};
use crate::io_types::{IoCompletion, IoPayload, Recovery};
use crate::spec::command::{admin_opcode, io_opcode};
use crate::spec::Sqe;
use crate::status::NvmeStatus;

use super::clock::{Ages, Ticks};
use super::{Dead, IoQueuePair};

/// Polls between two looks at the cycle counter for the deadline check: few enough that a
/// slow caller (a loaded TCG guest resubmitting between polls: ~3 ms a poll seen) still checks
/// every ~100 ms, many enough that a fast poll loop reads the counter rarely.
pub(crate) const CHECK_EVERY: u32 = 32;

const DURING: &str = "waiting for I/O completions";

/// How long a queue stopped by a removal request keeps reaping the requests in flight.
pub(crate) const REMOVAL_DRAIN: std::time::Duration = std::time::Duration::from_secs(2);

impl<P: IoPayload> IoQueuePair<P> {
    /// Reap up to `max` finished requests, calling `f` for each; writes the CQ head doorbell
    /// at most once for the batch, and only once the entries reaped since it was last written
    /// reach the CQ's spare entries (a CQ as large as its SQ: every batch). Returns how many requests finished. An error means a malformed
    /// completion was skipped (the completions of the same batch were delivered to `f` all the
    /// same), a timeout (Abort was sent), or a dead/wedged controller. A recovery
    /// ([`Recovery::FailBack`]) may deliver more than `max` requests at once.
    ///
    /// When the kernel asks for the device back (unbind, hot-unplug, sysfs remove), every
    /// later submission is refused with [`NvmeError::RemovalRequested`], the requests in flight
    /// still complete (for up to 2 s), then polls fail with that error too.
    ///
    /// Once the controller is found gone, fatal, not ready, or an Abort timed out, and the
    /// queue does not recover ([`Recovery::Report`], or the reset failed), the queue is dead:
    /// this and every later call (and every submission) fail at once with that error, and the
    /// requests still in flight stay with the queue ([`IoQueuePair::in_flight`] keeps counting
    /// them): their buffers never go back to the pool, as the device might still write them;
    /// dropping the queue pair leaks them.
    #[inline]
    pub fn poll(&mut self, max: usize, mut f: impl FnMut(IoCompletion<P>)) -> Result<usize> {
        if self.dead.is_some() && !self.draining_for_removal() {
            if let Some(e) = self.dead_error() {
                return Err(e);
            }
        }
        if self.ctrl.generation() != self.generation {
            return self.after_reset_elsewhere(&mut f);
        }
        let mut done = 0usize;
        let mut reaped = 0u32;
        let mut malformed: Option<NvmeError> = None;
        // At most one ring's worth of entries per call: a device that keeps posting entries
        // (malformed ones deliver nothing) cannot keep this loop going.
        while done < max && reaped as usize <= self.depth {
            let Some(cqe) = self.cq.peek() else { break };
            self.cq.advance();
            reaped += 1;
            // The hostile-device check, in one: the id names a slot of this queue (bounds),
            // that slot is in flight, and the entry is for this queue's SQ.
            let cid = cqe.cid as usize;
            match self.cmds.get(cid) {
                Some(slot) if slot.active && cqe.sq_id == self.qid => {}
                _ => {
                    self.malformed(cqe.cid, cqe.sq_id, &mut malformed);
                    continue;
                }
            }
            done += self.finish_command(cid, cqe.status, &mut f) as usize;
        }
        if reaped > 0 {
            // The head doorbell lags by fewer than `cq_slack` entries (see the field).
            self.cq_unrung += reaped;
            if self.cq_unrung >= self.cq_slack {
                self.cq_db.write(self.cq.head());
                self.cq_unrung = 0;
            }
            self.stats.completions += reaped as u64;
            if self.pending_len > 0 && self.free_cid_top > 0 {
                self.send_pending();
            }
        }
        if self.in_flight > 0 {
            self.polls = self.polls.wrapping_add(1);
            if self.polls % CHECK_EVERY == 0 {
                done += self.check_deadlines(&mut f)?;
            }
        }
        match malformed {
            Some(e) => Err(e),
            None => Ok(done),
        }
    }

    /// Count a completion entry that names no command of this queue in flight (a hostile or
    /// broken device) and keep the first one as the batch's error. Cold: never on a sane
    /// device.
    #[cold]
    #[inline(never)]
    fn malformed(&mut self, cid: u16, sq_id: u16, first: &mut Option<NvmeError>) {
        self.stats.malformed_completions += 1;
        let in_range = (cid as usize) < self.depth && sq_id == self.qid;
        first.get_or_insert(NvmeError::MalformedCompletion {
            qid: self.qid,
            cid,
            sq_id,
            reason: if in_range {
                "no command with this id is in flight"
            } else {
                "command id or SQ id out of range"
            },
        });
    }

    /// Free command slot `cid` (in flight, checked by the caller), whose completion entry has
    /// status word `status` (phase tag in bit 0); when it was its request's last command, hand
    /// the request's completion to `f` (built in place, no intermediate copy) and return true.
    #[inline(always)]
    fn finish_command(
        &mut self,
        cid: usize,
        status: u16,
        f: &mut impl FnMut(IoCompletion<P>),
    ) -> bool {
        let slot = &mut self.cmds[cid];
        slot.active = false;
        let rid = slot.req as usize;
        self.free_cids[self.free_cid_top] = cid as u16;
        self.free_cid_top += 1;
        let r = &mut self.reqs[rid];
        // SC and SCT zero is success (the common case: one test of the raw word); anything
        // else is decoded on the cold path.
        if status & STATUS_SC_SCT != 0 {
            note_error(&mut r.error, status);
        }
        r.remaining -= 1;
        if r.remaining != 0 {
            return false;
        }
        self.free_reqs[self.free_req_top] = rid as u16;
        self.free_req_top += 1;
        self.in_flight -= 1;
        // Two calls of `f`, each with its completion built in the argument (the payload moved
        // straight from the slot): building the `Result` first, then the completion, made the
        // compiler copy the whole completion twice.
        match r.error {
            None => f(IoCompletion {
                tag: r.tag,
                bufs: take_payload(&mut r.bufs),
                result: Ok(r.bytes),
            }),
            Some(status) => f(failed(r.tag, take_payload(&mut r.bufs), r.opcode, status)),
        }
        true
    }

    /// True while a queue stopped by a removal request still has requests in flight to reap,
    /// for up to `REMOVAL_DRAIN`: the device still works, and the kernel waits for it.
    #[cold]
    fn draining_for_removal(&self) -> bool {
        matches!(self.dead, Some((Dead::Removed, since))
            if self.in_flight > 0 && since.elapsed() < REMOVAL_DRAIN)
    }

    /// The error of a dead queue (None while it is alive). Cold: only on error paths.
    #[cold]
    pub(super) fn dead_error(&self) -> Option<NvmeError> {
        let (why, since) = self.dead?;
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
            Dead::ResetUnder => NvmeError::ResetUnderQueue {
                qid: self.qid,
                outstanding: self.in_flight,
            },
            Dead::Removed => NvmeError::RemovalRequested {
                addr: self.ctrl.device().address().to_string(),
            },
        })
    }

    /// Stop the queue for good because of `e` (a CSTS or admin failure); returns `e`.
    #[cold]
    pub(super) fn die(&mut self, e: NvmeError) -> NvmeError {
        let why = match e {
            NvmeError::DeviceGone { .. } => Dead::Gone,
            NvmeError::ControllerFatal { csts, .. } => Dead::Fatal(csts),
            NvmeError::ControllerNotReady { csts, .. } => Dead::NotReady(csts),
            NvmeError::ReadyTimeout { csts, .. } => Dead::NotReady(csts),
            NvmeError::ResetUnderQueue { .. } => Dead::ResetUnder,
            NvmeError::RemovalRequested { .. } => Dead::Removed,
            _ => Dead::Wedged,
        };
        self.dead = Some((why, Instant::now()));
        e
    }

    /// The slow path, every [`CHECK_EVERY`] polls with requests in flight: the ages of the
    /// commands in flight against `io_timeout`. Returns the requests a recovery completed.
    #[cold]
    fn check_deadlines(&mut self, f: &mut dyn FnMut(IoCompletion<P>)) -> Result<usize> {
        let now = ubdirect_core::util::rdtsc();
        if now.wrapping_sub(self.last_check) < self.ticks.check_every {
            return Ok(0);
        }
        self.last_check = now;
        // The kernel waits for the device until this process lets go of it: answer at once
        // (one eventfd read per check, at most every 50 ms).
        if self.dead.is_none() && self.ctrl.device().removal_requested() {
            let addr = self.ctrl.device().address().to_string();
            let e = self.die(NvmeError::RemovalRequested { addr });
            if self.in_flight == 0 {
                return Err(e);
            }
        }
        let ages = Ages::scan(
            self.cmds.iter().map(|c| (c.active, c.aborted, c.stamp)),
            now,
            self.ticks.timeout,
        );
        if ages.oldest < self.ticks.quarter {
            return Ok(0);
        }
        // A command has waited a while: is the controller still there and running? One MMIO
        // read per check, only while a command is that old.
        if let Err(e) = self.ctrl.csts_enabled(DURING) {
            return match e {
                NvmeError::ControllerFatal { .. } | NvmeError::ControllerNotReady { .. }
                    if self.recovery != Recovery::Report =>
                {
                    self.recover(f, e)
                }
                e => Err(self.die(e)),
            };
        }
        // The controller is ready and a command has waited a quarter of its deadline: write the
        // SQ tail again, in case the controller lost the write that announced it (S9-3). Only
        // what was rung: entries queued without a ring yet stay unannounced.
        self.sq_db.kick(self.rung_tail);
        if ages.expired_after_abort > 0 {
            let e = NvmeError::Wedged {
                qid: self.qid,
                outstanding: self.in_flight,
                waited: Ticks::duration(ages.oldest),
            };
            if self.recovery != Recovery::Report {
                return self.recover(f, e);
            }
            return Err(e);
        }
        if ages.expired == 0 {
            return Ok(0);
        }
        self.abort_expired(f, now)
    }

    /// Send an Abort for every command past its deadline that has none yet, and restart their
    /// clocks. When an Abort is not answered the admin queue is dead: stop at once (recover or
    /// die) instead of waiting `admin_timeout` per command.
    #[cold]
    fn abort_expired(&mut self, f: &mut dyn FnMut(IoCompletion<P>), now: u64) -> Result<usize> {
        let span = self.ctrl.span().clone();
        let _entered = span.enter();
        let mut first = None;
        for cid in 0..self.depth {
            let c = self.cmds[cid];
            if !c.active || c.aborted || now.saturating_sub(c.stamp) < self.ticks.timeout {
                continue;
            }
            let opcode = self.reqs[c.req as usize].opcode;
            first.get_or_insert((cid as u16, opcode, now.saturating_sub(c.stamp)));
            self.stats.timeouts += 1;
            self.cmds[cid].aborted = true;
            self.cmds[cid].stamp = ubdirect_core::util::rdtsc();
            let mut a = Sqe::new(admin_opcode::ABORT);
            a.cdw10 = (cid as u32) << 16 | self.qid as u32;
            self.stats.aborts_sent += 1;
            match self.ctrl.admin_exec(a, "Abort") {
                Ok(_) => {}
                // The controller refused this Abort (e.g. Abort Command Limit Exceeded): the
                // admin queue works; the next check escalates if nothing comes.
                Err(e @ NvmeError::Command { .. }) => {
                    tracing::warn!(error = %e, cid, qid = self.qid, "Abort failed");
                }
                Err(e) => {
                    tracing::warn!(error = %e, cid, qid = self.qid, "Abort not answered");
                    let e = match e {
                        e @ (NvmeError::DeviceGone { .. }
                        | NvmeError::ControllerFatal { .. }
                        | NvmeError::ControllerNotReady { .. }) => e,
                        _ => NvmeError::Wedged {
                            qid: self.qid,
                            outstanding: self.in_flight,
                            waited: Ticks::duration(now.saturating_sub(c.stamp)),
                        },
                    };
                    if self.recovery != Recovery::Report
                        && !matches!(e, NvmeError::DeviceGone { .. })
                    {
                        return self.recover(f, e);
                    }
                    return Err(self.die(e));
                }
            }
        }
        let Some((cid, opcode, age)) = first else {
            return Ok(0);
        };
        let e = NvmeError::Timeout {
            then: crate::error::TIMEOUT_ABORTED,
            command: opcode_name(opcode),
            cid,
            qid: self.qid,
            waited: Ticks::duration(age),
        };
        if self.recovery == Recovery::Report {
            return Err(e);
        }
        tracing::warn!(error = %e, "NVMe I/O command timed out; Abort sent");
        Ok(0)
    }
}

/// The Status Code and Status Code Type bits of a CQE's status word (bit 0 is the phase tag):
/// both zero is success ([`NvmeStatus::is_success`]).
const STATUS_SC_SCT: u16 = 0x0ffe;

/// Keep the first error status of a request's commands. Cold: only for failed commands.
#[cold]
#[inline(never)]
fn note_error(error: &mut Option<NvmeStatus>, status: u16) {
    if error.is_none() {
        *error = Some(NvmeStatus::from_cqe_status(status));
    }
}

/// The payload of a request slot in flight, leaving the slot empty.
#[inline(always)]
fn take_payload<P>(slot: &mut Option<P>) -> P {
    match slot.take() {
        Some(p) => p,
        None => unreachable!("a request in flight holds its payload"),
    }
}

/// The completion of a request one of whose commands failed with `status`. Cold.
#[cold]
#[inline(never)]
fn failed<P>(tag: u64, bufs: P, opcode: u8, status: NvmeStatus) -> IoCompletion<P> {
    IoCompletion {
        tag,
        bufs,
        result: Err(NvmeError::Command {
            command: opcode_name(opcode),
            status,
        }),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_status_mask_agrees_with_is_success_for_every_status_word() {
        for w in 0..=u16::MAX {
            assert_eq!(
                w & STATUS_SC_SCT == 0,
                NvmeStatus::from_cqe_status(w).is_success(),
                "status word {w:#06x}"
            );
        }
    }
}
