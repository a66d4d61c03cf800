//! [`IoQueuePair`]: one I/O SQ/CQ pair owned by one thread. Pre-allocated command slots (each
//! with its PRP list pages) and request slots on free stacks: the I/O path allocates nothing
//! and makes no system call. Submissions are queued and the SQ tail doorbell is written once
//! per [`IoQueuePair::ring`]; the CQ head doorbell once per [`IoQueuePair::poll`] batch.
//!
//! Queued requests (SPDK's): a request that needs more command slots than are free (above
//! MDTS, or more than the whole depth) takes a request slot and sends what fits; the rest of its
//! commands wait in this queue pair's pending list and go out, in order, from
//! [`IoQueuePair::poll`] as completions free slots. Only running out of request slots (`depth`
//! requests in flight) is [`NvmeError::QueueFull`].

mod clock;
mod pending;
mod poll;
mod recover;
mod shadow_probe;
mod sub_range;
mod submit;

pub(crate) use shadow_probe::probe_shadow;
pub(crate) use submit::Request;

use std::mem::ManuallyDrop;
use std::sync::Arc;
use std::time::Instant;

use ubdirect_core::DmaMem;

use crate::controller::{transport, Controller, PAGE_SIZE};
use crate::doorbell::Doorbell;
use crate::error::{NvmeError, Result};
use crate::io_types::{IoBufs, IoCompletion, IoPayload, QueueOptions, QueueStats, Recovery};
use crate::prp::list_pages_needed;
use crate::ring::{CqRing, SqRing};
use crate::spec::command::admin_opcode;
use crate::spec::regs::{cq_head_doorbell, sq_tail_doorbell};
use crate::spec::Sqe;
use crate::status::NvmeStatus;

/// Per-namespace limits copied into the queue so the I/O path needs no lock.
#[derive(Debug, Clone, Copy)]
pub(crate) struct NsLimits {
    pub(crate) nsid: u32,
    pub(crate) lba_size: u32,
    pub(crate) lba_shift: u32,
    pub(crate) nsze: u64,
    /// Bytes per command: MDTS, the driver cap and the 16-bit NLB field, in whole blocks.
    pub(crate) max_cmd: usize,
    /// The LBA format in use carries metadata, which this driver does not transfer.
    pub(crate) has_metadata: bool,
}

#[derive(Clone, Copy, Default)]
struct CmdSlot {
    req: u16,
    active: bool,
    /// An Abort was sent for it (its clock restarted then).
    aborted: bool,
    /// Cycle counter when it was queued (or aborted): its own deadline runs from here.
    stamp: u64,
}

struct ReqSlot<P> {
    /// The payload while the request is in flight (None when the slot is free).
    bufs: Option<P>,
    tag: u64,
    remaining: u16,
    bytes: usize,
    opcode: u8,
    error: Option<NvmeStatus>,
}

impl<P> Default for ReqSlot<P> {
    fn default() -> Self {
        ReqSlot {
            bufs: None,
            tag: 0,
            remaining: 0,
            bytes: 0,
            opcode: 0,
            error: None,
        }
    }
}

/// Why a queue pair stopped for good: the controller will complete none of its commands.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Dead {
    /// CSTS read all-ones.
    Gone,
    /// CSTS.CFS=1 (the CSTS value).
    Fatal(u32),
    /// CSTS.RDY=0 while enabled (the CSTS value).
    NotReady(u32),
    /// An Abort (or another admin command) timed out: the admin queue does not answer.
    Wedged,
    /// The controller was reset under a queue that reports instead of recovering.
    ResetUnder,
    /// The kernel asked for the device back (unbind, hot-unplug, sysfs remove).
    Removed,
}

/// The data of a request being built: where its bytes are.
pub(crate) enum DataRef<'a> {
    None,
    One { iova: u64 },
    Sg(&'a crate::io_types::SgList),
}

/// One I/O queue pair. `Send` (move it to its thread), not `Sync`.
///
/// `P` is what each request carries in and its completion hands back ([`IoPayload`]): by
/// default [`IoBufs`] (every request kind); [`IoQueuePair::with_payload`] makes a queue pair
/// of another payload type, e.g. `IoQueuePair::<IoBuf>` whose completions hand back the
/// `IoBuf` itself.
pub struct IoQueuePair<P: IoPayload = IoBufs> {
    qid: u16,
    sq: ManuallyDrop<SqRing>,
    cq: ManuallyDrop<CqRing>,
    lists: ManuallyDrop<DmaMem>,
    sq_db: Doorbell,
    cq_db: Doorbell,
    depth: usize,
    list_entries_per_cmd: usize,
    cmds: Box<[CmdSlot]>,
    /// A copy of each command slot's SQ entry, to submit it again after a reset.
    sqes: Box<[Sqe]>,
    free_cids: Box<[u16]>,
    free_cid_top: usize,
    reqs: ManuallyDrop<Box<[ReqSlot<P>]>>,
    free_reqs: Box<[u16]>,
    free_req_top: usize,
    /// Per request slot: where its commands not yet sent resume (queued requests).
    pend: Box<[pending::Pending]>,
    /// FIFO of request slots with commands still to send (capacity `depth`).
    pending: Box<[u16]>,
    pending_head: usize,
    pending_len: usize,
    pub(crate) ns: Box<[NsLimits]>,
    pub(crate) default_ns: usize,
    in_flight: usize,
    rung_tail: u16,
    /// Completion entries reaped since the CQ head doorbell was last written.
    cq_unrung: u32,
    /// How many reaped entries the CQ head doorbell may lag behind: the CQ's entries beyond
    /// the SQ's ([`cq_entries`]); 0 (every batch) with shadow doorbells. The controller never
    /// finds the CQ full while the lag stays below it, as at most `depth` more entries can be
    /// posted.
    cq_slack: u32,
    auto_ring: bool,
    recovery: Recovery,
    /// Deadlines in cycle-counter ticks.
    ticks: clock::Ticks,
    /// Polls since creation (the deadline check runs every [`poll::CHECK_EVERY`] polls).
    polls: u32,
    /// Cycle counter at the last deadline check.
    last_check: u64,
    /// The controller's reset generation this queue exists in.
    generation: u64,
    /// Completions [`ubdirect_core::seams::BlockQueue::poll`] could not deliver (requests without
    /// a single buffer), kept for [`IoQueuePair::take_native_completions`]; capacity `depth`.
    pub(crate) held: Vec<IoCompletion<P>>,
    /// Test hook: the next command is taken as submitted but never reaches the device.
    lose_next: bool,
    /// Set once the controller cannot complete anything: every later call fails at once.
    dead: Option<(Dead, Instant)>,
    stats: QueueStats,
    /// The controller's DMA domain: a buffer of another domain is refused at submit.
    pub(crate) domain: ubdirect_core::DomainId,
    // Last: the doorbells' BAR mapping must go before the controller (and its device) can.
    ctrl: Arc<Controller>,
}

// The raw shadow pointers inside the doorbells are owned by `ctrl` (kept alive by the Arc).
const _: fn() = || {
    fn is_send<T: Send>() {}
    is_send::<IoQueuePair>();
};

/// The index of namespace `nsid` among the controller's active ones (the first without one);
/// an error when it is not active, or none is.
fn default_namespace(ctrl: &Controller, nsid: Option<u32>) -> Result<usize> {
    if ctrl.namespaces().is_empty() {
        return Err(NvmeError::NamespaceMissing {
            nsid: nsid.unwrap_or(1),
            active: 0,
        });
    }
    match nsid {
        None => Ok(0),
        Some(nsid) => ctrl.namespaces().iter().position(|n| n.nsid == nsid).ok_or(
            NvmeError::NamespaceMissing {
                nsid,
                active: ctrl.namespaces().len(),
            },
        ),
    }
}

impl IoQueuePair {
    /// A queue pair whose requests carry [`IoBufs`]; see [`IoQueuePair::with_payload`].
    pub fn new(ctrl: &Arc<Controller>, opts: QueueOptions) -> Result<IoQueuePair> {
        IoQueuePair::with_payload(ctrl, opts)
    }
}

impl<P: IoPayload> IoQueuePair<P> {
    /// Create an I/O queue pair on `ctrl` (Create I/O CQ, polled, then Create I/O SQ).
    pub fn with_payload(ctrl: &Arc<Controller>, opts: QueueOptions) -> Result<IoQueuePair<P>> {
        let default_ns = default_namespace(ctrl, opts.nsid)?;
        let max_cmd_ctrl = ctrl.max_command_bytes();
        let lpp = list_pages_needed(PAGE_SIZE, max_cmd_ctrl).max(1);
        let ns: Box<[NsLimits]> = ctrl
            .namespaces()
            .iter()
            .map(|n| crate::namespace::limits(n, max_cmd_ctrl))
            .collect();
        let ticks = clock::Ticks::new(opts.io_timeout);
        let generation = ctrl.generation();
        // Id, entries and limits: the controller logic shared with NVMe/TCP.
        let made = transport::create_io_queue(
            &mut PcieIoQueue {
                ctrl,
                sq_in_cmb: opts.sq_in_cmb,
                lpp,
            },
            ctrl.qids(),
            ctrl.cap(),
            opts.depth,
        )?;
        let (qid, entries) = (made.qid, made.entries);
        let (sq, cq, lists) = made.queue;
        let depth = entries as usize - 1;
        let (sq_db, cq_db) = doorbells(ctrl, qid, opts.shadow_doorbells);
        // With shadow doorbells the controller's EventIdx already says which head updates it
        // needs by MMIO: each batch updates the shadow slot as before.
        let cq_slack = match cq_db.is_shadowed() {
            true => 0,
            false => u32::from(cq.entries() - entries),
        };
        let mut reqs = Vec::with_capacity(depth);
        reqs.resize_with(depth, ReqSlot::default);
        Ok(IoQueuePair {
            domain: ctrl.registry().domain().id(),
            ctrl: ctrl.clone(),
            qid,
            sq: ManuallyDrop::new(sq),
            cq: ManuallyDrop::new(cq),
            lists: ManuallyDrop::new(lists),
            sq_db,
            cq_db,
            depth,
            list_entries_per_cmd: lpp * PAGE_SIZE / 8,
            cmds: vec![CmdSlot::default(); depth].into_boxed_slice(),
            sqes: vec![Sqe::default(); depth].into_boxed_slice(),
            free_cids: (0..depth as u16).rev().collect(),
            free_cid_top: depth,
            reqs: ManuallyDrop::new(reqs.into_boxed_slice()),
            free_reqs: (0..depth as u16).rev().collect(),
            free_req_top: depth,
            pend: vec![pending::Pending::default(); depth].into_boxed_slice(),
            pending: vec![0u16; depth].into_boxed_slice(),
            pending_head: 0,
            pending_len: 0,
            ns,
            default_ns,
            in_flight: 0,
            rung_tail: 0,
            cq_unrung: 0,
            cq_slack,
            auto_ring: opts.auto_ring,
            recovery: opts.recovery,
            ticks,
            polls: 0,
            last_check: ubdirect_core::util::rdtsc(),
            generation,
            lose_next: false,
            held: Vec::with_capacity(depth),
            dead: None,
            stats: QueueStats::default(),
        })
    }

    /// The submission/completion queue id.
    pub fn qid(&self) -> u16 {
        self.qid
    }
    /// The NUMA nodes the queue pair's host memory was placed on: the SQ ring (unless in the
    /// CMB), the CQ ring and the PRP list pages, in that order (the controller's node).
    pub fn host_memory_numa(&self) -> Vec<Option<u32>> {
        let mut v = Vec::with_capacity(3);
        if !self.sq.in_cmb_memory() {
            v.push(self.sq.numa_node());
        }
        v.push(self.cq.numa_node());
        v.push(self.lists.region().numa);
        v
    }
    /// Commands this queue holds in flight.
    pub fn depth(&self) -> usize {
        self.depth
    }
    /// Requests submitted and not yet completed.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }
    /// Free command slots.
    pub fn free_slots(&self) -> usize {
        self.free_cid_top
    }
    /// Requests with commands still waiting for a free command slot (queued requests).
    pub fn pending_requests(&self) -> usize {
        self.pending_len
    }
    /// The controller.
    pub fn controller(&self) -> &Arc<Controller> {
        &self.ctrl
    }
    /// Whether the submission queue lies in the Controller Memory Buffer.
    pub fn sq_in_cmb(&self) -> bool {
        self.sq.in_cmb_memory()
    }
    /// Whether doorbells go through the shadow buffer.
    pub fn uses_shadow_doorbells(&self) -> bool {
        self.sq_db.is_shadowed()
    }
    /// Counters.
    pub fn stats(&self) -> QueueStats {
        let mut s = self.stats;
        s.sq_doorbell_writes = self.sq_db.mmio_writes;
        s.cq_doorbell_writes = self.cq_db.mmio_writes;
        s.shadow_only_updates = self.sq_db.shadow_only + self.cq_db.shadow_only;
        s.doorbell_kicks = self.sq_db.kicks;
        s
    }
    /// Test hook for the project's own tests (feature `test-hooks`, off by default; not part of
    /// the API): the next command queued is taken as submitted (slot held, clock started,
    /// counted in flight) but never written to the SQ, as if the device had lost it. A reset
    /// with [`Recovery::Requeue`] submits it for real.
    #[cfg(feature = "test-hooks")]
    pub fn lose_next_command(&mut self) {
        self.lose_next = true;
    }

    /// Ring the doorbell on every submission (true) or only on [`IoQueuePair::ring`] (false).
    pub fn set_auto_ring(&mut self, on: bool) {
        self.auto_ring = on;
        if on {
            self.ring();
        }
    }

    /// Limits of namespace `nsid`.
    #[inline]
    pub(crate) fn ns_limits(&self, nsid: u32) -> std::result::Result<NsLimits, NvmeError> {
        for n in self.ns.iter() {
            if n.nsid == nsid {
                if n.has_metadata {
                    return Err(NvmeError::MetadataNotSupported { nsid });
                }
                return Ok(*n);
            }
        }
        Err(NvmeError::NamespaceMissing {
            nsid,
            active: self.ns.len(),
        })
    }

    /// Write the SQ tail doorbell for everything queued since the last ring (once).
    #[inline]
    pub fn ring(&mut self) {
        let tail = self.sq.tail();
        if tail != self.rung_tail {
            self.sq_db.write(tail);
            self.rung_tail = tail;
        }
    }
}

/// The PCIe part of creating an I/O queue pair: rings (and PRP list pages) on the controller's
/// NUMA node, then Create I/O CQ and SQ.
struct PcieIoQueue<'a> {
    ctrl: &'a Controller,
    /// The SQ in the Controller Memory Buffer.
    sq_in_cmb: bool,
    /// PRP list pages per command.
    lpp: usize,
}

impl transport::IoQueueTransport for PcieIoQueue<'_> {
    type Error = NvmeError;
    type Queue = (SqRing, CqRing, DmaMem);
    fn max_entries(&self) -> u32 {
        u16::MAX as u32
    }
    fn create(&mut self, qid: u16, entries: u16) -> Result<Self::Queue> {
        let ctrl = self.ctrl;
        let registry = ctrl.registry();
        let depth = entries as usize - 1;
        let numa = ctrl.device().numa_node();
        let sq = if self.sq_in_cmb {
            let cmb = ctrl.cmb().ok_or(NvmeError::InvalidArgument(
                "QueueOptions::sq_in_cmb needs a controller opened with ControllerOptions::cmb = true",
            ))?;
            SqRing::in_cmb(cmb.alloc_sq(entries as usize * 64)?, entries)
        } else {
            SqRing::new(registry, entries, numa)?
        };
        let cq = CqRing::new(registry, cq_entries(entries, ctrl.cap()), numa)?;
        let lists = DmaMem::alloc_on(registry, depth * self.lpp * PAGE_SIZE, numa)?;
        clear_shadow_slots(ctrl, qid);
        create_device_queues(ctrl, qid, &sq, &cq)?;
        Ok((sq, cq, lists))
    }
}

/// Completion queue entries for an I/O queue pair whose SQ has `sq_entries`: one page of
/// entries ([`CQ_ENTRIES_MIN`]) where the controller's MQES allows, never fewer than the SQ's.
/// The entries beyond the SQ's let the CQ head doorbell be written once per many completions
/// instead of once per poll (at queue depth 1, once per I/O).
pub(crate) fn cq_entries(sq_entries: u16, cap: crate::spec::regs::Cap) -> u16 {
    let most = cap.max_queue_entries().clamp(2, 65535) as u16;
    sq_entries.max(CQ_ENTRIES_MIN.min(most))
}

/// Completion queue entries wanted at least: 256 entries of 16 bytes fill one 4 KiB page.
pub(crate) const CQ_ENTRIES_MIN: u16 = 256;

/// Create I/O CQ (polled) then I/O SQ `qid` on the device over the given rings, each sized as
/// its ring; on an SQ failure the CQ is deleted again.
pub(crate) fn create_device_queues(
    ctrl: &Controller,
    qid: u16,
    sq: &SqRing,
    cq: &CqRing,
) -> Result<()> {
    // Create I/O CQ: QSIZE (0-based) and QID; PC=1, IEN=0 (polled).
    let mut c = Sqe::new(admin_opcode::CREATE_IO_CQ);
    c.prp1 = cq.iova();
    c.cdw10 = (cq.entries() as u32 - 1) << 16 | qid as u32;
    c.cdw11 = 1;
    ctrl.admin_exec(c, "Create I/O Completion Queue")?;
    let mut s = Sqe::new(admin_opcode::CREATE_IO_SQ);
    s.prp1 = sq.iova();
    s.cdw10 = (sq.entries() as u32 - 1) << 16 | qid as u32;
    s.cdw11 = (qid as u32) << 16 | 1;
    if let Err(e) = ctrl.admin_exec(s, "Create I/O Submission Queue") {
        let mut d = Sqe::new(admin_opcode::DELETE_IO_CQ);
        d.cdw10 = qid as u32;
        let _ = ctrl.admin_exec(d, "Delete I/O Completion Queue");
        return Err(e);
    }
    Ok(())
}

/// Delete I/O SQ then I/O CQ `qid` on the device (the CQ only once the SQ is gone).
pub(crate) fn delete_device_queues(ctrl: &Controller, qid: u16) -> Result<()> {
    let mut d = Sqe::new(admin_opcode::DELETE_IO_SQ);
    d.cdw10 = qid as u32;
    ctrl.admin_exec(d, "Delete I/O Submission Queue")?;
    let mut d = Sqe::new(admin_opcode::DELETE_IO_CQ);
    d.cdw10 = qid as u32;
    ctrl.admin_exec(d, "Delete I/O Completion Queue")?;
    Ok(())
}

/// Zero queue `qid`'s shadow doorbell and EventIdx slots before its queues are created: a
/// queue deleted earlier under the same id left its last tail / head there, which a controller
/// reads as the new queue's (QEMU fetched stale SQ entries) and the doorbell logic takes as
/// the previous value.
pub(crate) fn clear_shadow_slots(ctrl: &Controller, qid: u16) {
    if let Some((sq, cq)) = ctrl.shadow_slots(qid) {
        for s in [sq, cq] {
            // SAFETY: the slots point into the controller's live shadow pages (see
            // doorbell::ShadowSlot); queue `qid` does not exist on the device now, so nothing
            // else reads or writes these slots; volatile because the device may read them.
            unsafe {
                std::ptr::write_volatile(s.db, 0);
                std::ptr::write_volatile(s.ei.cast_mut(), 0);
            }
        }
        ubdirect_core::barrier::wmb();
    }
}

/// The SQ tail and CQ head doorbells of queue `qid`, through the shadow slots when asked for
/// and the controller has them on.
pub(super) fn doorbells(ctrl: &Controller, qid: u16, shadow: bool) -> (Doorbell, Doorbell) {
    let dstrd = ctrl.cap().dstrd();
    let shadow = if shadow { ctrl.shadow_slots(qid) } else { None };
    (
        Doorbell::new(
            ctrl.mmio().clone(),
            sq_tail_doorbell(qid, dstrd),
            shadow.map(|s| s.0),
        ),
        Doorbell::new(
            ctrl.mmio().clone(),
            cq_head_doorbell(qid, dstrd),
            shadow.map(|s| s.1),
        ),
    )
}

impl<P: IoPayload> Drop for IoQueuePair<P> {
    fn drop(&mut self) {
        let span = self.ctrl.span().clone();
        let _entered = span.enter();
        let reset_since = self.ctrl.generation() != self.generation;
        if matches!(self.dead, Some((Dead::ResetUnder, _))) || (self.dead.is_none() && reset_since)
        {
            // The controller was reset (disabled) since this queue was created or re-created:
            // the device no longer knows the queue and touches none of its memory. Nothing to
            // delete.
            // SAFETY: each is dropped once, here; see above.
            unsafe {
                ManuallyDrop::drop(&mut self.sq);
                ManuallyDrop::drop(&mut self.cq);
                ManuallyDrop::drop(&mut self.lists);
                ManuallyDrop::drop(&mut self.reqs);
            }
            self.ctrl.free_qid(self.qid);
            return;
        }
        if let Some((why, _)) = self.dead {
            // The controller is gone, not ready or its admin queue does not answer: a Delete
            // would only wait out admin_timeout. The device may still DMA into the rings and
            // buffers: leak them; Controller::reset frees the qid.
            tracing::warn!(
                qid = self.qid,
                ?why,
                "NVMe I/O queue not deleted (controller dead); its memory stays mapped"
            );
            self.ctrl.leak_qid(self.qid);
            return;
        }
        match delete_device_queues(&self.ctrl, self.qid) {
            Ok(_) => {
                // SAFETY: each is dropped once, here; the queues are deleted so the device no
                // longer touches the rings, PRP lists or request buffers.
                unsafe {
                    ManuallyDrop::drop(&mut self.sq);
                    ManuallyDrop::drop(&mut self.cq);
                    ManuallyDrop::drop(&mut self.lists);
                    ManuallyDrop::drop(&mut self.reqs);
                }
                self.ctrl.free_qid(self.qid);
            }
            Err(e) => {
                // The device may still DMA into the rings and buffers: leak them; the qid stays
                // reserved until Controller::reset.
                tracing::warn!(error = %e, qid = self.qid, "deleting NVMe I/O queue failed; its memory stays mapped");
                self.ctrl.leak_qid(self.qid);
            }
        }
    }
}
