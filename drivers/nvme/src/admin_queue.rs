//! The admin queue pair: one command at a time, polled to completion under a deadline.
//!
//! Every admin path goes through [`AdminQueue::execute`], which refuses at once once a command
//! has timed out (the queue is "wedged" until the controller is reset): the timed-out command
//! may still complete, or DMA into the data page, at any time, so neither a new command nor the
//! data page is handed out before the reset disabled the controller. The SQ head comes from the
//! completions (CQE.SQHD), and a submission that would overrun it is refused.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ubdirect_core::{DmaMem, Mmio, UbRegistry};

use crate::doorbell::{Doorbell, ShadowSlot};
use crate::error::{NvmeError, Result};
use crate::ring::{CqRing, SqRing};
use crate::spec::regs::{cq_head_doorbell, sq_tail_doorbell, Csts};
use crate::spec::{Cqe, Sqe};
use crate::status::NvmeStatus;

/// Bytes of the admin data buffer (two 4 KiB pages: PRP1 + PRP2, no list needed).
pub(crate) const ADMIN_DATA_LEN: usize = 8192;

/// Read CSTS: all-ones (the device is gone) becomes DeviceGone; with `during` (what was under
/// way, for the message), CFS becomes ControllerFatal; without, a fatal CSTS comes back as is.
pub(crate) fn read_csts(mmio: &Mmio, during: Option<&'static str>) -> Result<Csts> {
    crate::controller::transport::read_csts(&mut &*mmio, during)
}

/// Read CSTS of a controller the driver has enabled: all-ones is DeviceGone, CFS is
/// ControllerFatal and RDY=0 is ControllerNotReady (reset or removed under the driver).
pub(crate) fn read_csts_enabled(mmio: &Mmio, during: &'static str) -> Result<Csts> {
    let csts = read_csts(mmio, Some(during))?;
    if !csts.rdy() {
        return Err(NvmeError::ControllerNotReady {
            csts: csts.0,
            during,
        });
    }
    Ok(csts)
}

/// The admin SQ/CQ, their doorbells and a data page for Identify / Get Log Page.
pub(crate) struct AdminQueue {
    pub(crate) sq: SqRing,
    pub(crate) cq: CqRing,
    sq_db: Doorbell,
    cq_db: Doorbell,
    mmio: Arc<Mmio>,
    pub(crate) data: DmaMem,
    next_cid: u16,
    entries: u16,
    sq_db_off: usize,
    cq_db_off: usize,
    /// SQ head as last reported by the controller (CQE.SQHD).
    sq_head: u16,
    /// A command timed out: refuse every command until [`AdminQueue::reset`]. Shared with the
    /// controller so it can be read without taking the admin lock.
    wedged: Arc<AtomicBool>,
    /// Completion entries skipped: stale (a timed-out command's late completion) or malformed.
    pub(crate) skipped: u64,
}

/// Most completion entries one `execute` skips (stale or malformed) before it gives up: a
/// controller posting garbage cannot keep the loop going past this, whatever the deadline.
const MAX_SKIPPED: u32 = 4096;

/// An admin command unanswered this long (or an eighth of its timeout, when shorter) gets its SQ
/// tail doorbell written again, and again at the same interval until the timeout.
const KICK_AFTER_AT_MOST: Duration = Duration::from_secs(1);

impl AdminQueue {
    /// Allocate the admin rings of `entries` entries each.
    pub(crate) fn new(
        registry: &Arc<UbRegistry>,
        mmio: Arc<Mmio>,
        entries: u16,
        dstrd: u8,
        numa: Option<u32>,
    ) -> Result<AdminQueue> {
        Ok(AdminQueue {
            sq: SqRing::new(registry, entries, numa)?,
            cq: CqRing::new(registry, entries, numa)?,
            sq_db: Doorbell::new(mmio.clone(), sq_tail_doorbell(0, dstrd), None),
            cq_db: Doorbell::new(mmio.clone(), cq_head_doorbell(0, dstrd), None),
            mmio,
            data: DmaMem::alloc_on(registry, ADMIN_DATA_LEN, numa)?,
            next_cid: 0,
            entries,
            sq_db_off: sq_tail_doorbell(0, dstrd),
            cq_db_off: cq_head_doorbell(0, dstrd),
            sq_head: 0,
            wedged: Arc::new(AtomicBool::new(false)),
            skipped: 0,
        })
    }

    /// Mirror admin doorbell values into the shadow buffer once Doorbell Buffer Config is on
    /// (some controllers read the admin shadow slots too); MMIO is still always written.
    pub(crate) fn set_shadow(&mut self, sq: ShadowSlot, cq: ShadowSlot) {
        let mmio = self.mmio.clone();
        let (sq_off, cq_off) = (self.sq_db_off, self.cq_db_off);
        let (old_sq, old_cq) = (
            std::mem::replace(
                &mut self.sq_db,
                Doorbell::new(mmio.clone(), sq_off, Some(sq)),
            ),
            std::mem::replace(&mut self.cq_db, Doorbell::new(mmio, cq_off, Some(cq))),
        );
        self.sq_db.carry_counts_from(&old_sq);
        self.cq_db.carry_counts_from(&old_cq);
        self.sq_db.write_always(self.sq.tail());
        self.cq_db.write_always(self.cq.head());
    }

    /// Back to the state after allocation: empty rings, doorbells without shadow slots. Only
    /// while the controller is disabled.
    pub(crate) fn reset(&mut self) {
        self.sq.reset();
        self.cq.reset();
        self.next_cid = 0;
        self.sq_head = 0;
        let old_sq = std::mem::replace(
            &mut self.sq_db,
            Doorbell::new(self.mmio.clone(), self.sq_db_off, None),
        );
        let old_cq = std::mem::replace(
            &mut self.cq_db,
            Doorbell::new(self.mmio.clone(), self.cq_db_off, None),
        );
        self.sq_db.carry_counts_from(&old_sq);
        self.cq_db.carry_counts_from(&old_cq);
        // The controller is disabled: the timed-out command is gone with every other one, so
        // the data page is ours again.
        self.wedged.store(false, Ordering::Relaxed);
    }

    /// The wedged flag, shared with the controller (read without the admin lock).
    pub(crate) fn wedged_flag(&self) -> Arc<AtomicBool> {
        self.wedged.clone()
    }

    /// Whether a command timed out since the last reset.
    pub(crate) fn is_wedged(&self) -> bool {
        self.wedged.load(Ordering::Relaxed)
    }

    /// Number of entries of each admin ring.
    pub(crate) fn entries(&self) -> u16 {
        self.entries
    }

    /// Submit `sqe`, wait for its completion up to `timeout`, and decode the status. Refused at
    /// once with [`NvmeError::Wedged`] (queue 0) after an earlier command timed out, until
    /// [`AdminQueue::reset`]; a timeout wedges the queue.
    pub(crate) fn execute(
        &mut self,
        mut sqe: Sqe,
        command: &'static str,
        timeout: Duration,
    ) -> Result<Cqe> {
        if self.is_wedged() {
            return Err(NvmeError::Wedged {
                qid: 0,
                outstanding: 1,
                waited: Duration::ZERO,
            });
        }
        let next_tail = (self.sq.tail() + 1) % self.entries;
        if next_tail == self.sq_head {
            // The controller says it has not fetched the entries before the tail: one more
            // would overwrite an entry it has yet to read.
            return Err(NvmeError::Wedged {
                qid: 0,
                outstanding: self.entries as usize - 1,
                waited: Duration::ZERO,
            });
        }
        let cid = self.next_cid;
        self.next_cid = self.next_cid.wrapping_add(1) % (self.entries * 4);
        sqe.set_cid(cid);
        self.sq.push(&sqe);
        self.sq_db.write_always(self.sq.tail());
        let start = Instant::now();
        let kick_every = (timeout / 8).min(KICK_AFTER_AT_MOST);
        let mut next_kick = kick_every;
        let mut kicked = 0u32;
        let mut spins = 0u32;
        let mut skipped = 0u32;
        loop {
            if let Some(cqe) = self.cq.peek() {
                self.cq.advance();
                self.cq_db.write_always(self.cq.head());
                if cqe.sq_head < self.entries {
                    self.sq_head = cqe.sq_head;
                }
                if cqe.cid == cid && cqe.sq_id == 0 {
                    if kicked > 0 {
                        self.answered_after_kick(command, cid, kicked, start);
                    }
                    let status = NvmeStatus::from_cqe_status(cqe.status);
                    if !status.is_success() {
                        return Err(NvmeError::Command { command, status });
                    }
                    return Ok(cqe);
                }
                // A late completion of an earlier command, or garbage: skip it, but under the
                // same deadline and a bound on how many.
                skipped += 1;
                self.skipped += 1;
                if skipped >= MAX_SKIPPED || start.elapsed() > timeout {
                    return Err(self.timed_out(command, cid, start));
                }
                continue;
            }
            spins += 1;
            if spins % 1024 == 0 {
                // Admin commands run only while the controller is enabled.
                read_csts_enabled(&self.mmio, command)?;
                let waited = start.elapsed();
                if waited > timeout {
                    return Err(self.timed_out(command, cid, start));
                }
                if waited >= next_kick {
                    // Ready, and no answer yet: write the SQ tail again in case the controller
                    // lost the write (RELIABILITY.md S9-3); the same tail adds no entry.
                    self.sq_db.kick(self.sq.tail());
                    kicked += 1;
                    next_kick += kick_every;
                }
            }
            std::hint::spin_loop();
        }
    }

    /// A command answered only after its SQ tail doorbell was written again: the controller had
    /// most likely lost the first write. Logged (WARN), as it says something about the device.
    #[cold]
    fn answered_after_kick(&self, command: &'static str, cid: u16, kicks: u32, start: Instant) {
        tracing::warn!(
            command,
            cid,
            kicks,
            waited = ?start.elapsed(),
            "NVMe admin command answered only after its SQ doorbell was written again: the controller had lost the first write"
        );
    }

    /// SQ tail doorbell writes repeated for commands that waited (see [`Doorbell::kick`]).
    pub(crate) fn doorbell_kicks(&self) -> u64 {
        self.sq_db.kicks
    }

    /// Wedge the queue after `cid` did not complete; the timeout error. Cold.
    #[cold]
    fn timed_out(&mut self, command: &'static str, cid: u16, start: Instant) -> NvmeError {
        self.wedged.store(true, Ordering::Relaxed);
        tracing::warn!(
            command,
            cid,
            sq_tail = self.sq.tail(),
            sq_head = self.sq_head,
            skipped = self.skipped,
            csts = format_args!("{:#x}", self.mmio.read32(crate::spec::regs::REG_CSTS)),
            cq = %self.cq.describe(),
            "NVMe admin command timed out; the admin completion queue as the driver sees it"
        );
        NvmeError::Timeout {
            then: crate::error::TIMEOUT_ADMIN,
            command,
            cid,
            qid: 0,
            waited: start.elapsed(),
        }
    }
}
