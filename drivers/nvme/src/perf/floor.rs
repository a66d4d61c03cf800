//! The floor loop: the least a host can do per NVMe read. One I/O queue pair of its
//! own, one pre-registered 4 KiB buffer per command slot, and per batch only what the hardware
//! requires: write the SQ entries, one SQ tail doorbell write, spin on the CQ phase bit, one CQ
//! head doorbell write per reaped batch. No request bookkeeping, no PRP lists, no recovery, no
//! shadow doorbells. `ubdirect perf --engine floor` runs it to measure the driver against.

use std::mem::ManuallyDrop;
use std::sync::Arc;
use std::time::Duration;

use ubdirect_core::{barrier, DmaMem, Mmio};

use crate::controller::{Controller, PAGE_SIZE};
use crate::error::{NvmeError, Result};
use crate::ring::{CqRing, SqRing};
use crate::spec::command::io_opcode;
use crate::spec::regs::{cq_head_doorbell, sq_tail_doorbell};
use crate::spec::Sqe;
use ubdirect_core::util::{rdtsc, LatencyHistogram};

/// What the caller of [`FloorQueue::run`] asks for.
#[derive(Debug, Clone, Copy)]
pub struct FloorJob {
    /// Namespace to read.
    pub nsid: u32,
    /// Bytes per read (a multiple of the LBA size, at most 4 KiB: one page, PRP1 only).
    pub io_size: usize,
    /// First LBA of the span read.
    pub first_block: u64,
    /// Reads land at random `io_size`-aligned offsets in this many blocks.
    pub span_blocks: u64,
    /// Run for this many cycle-counter ticks, then drain.
    pub run_ticks: u64,
    /// Give up when no completion arrives for this many ticks (the device's deadline).
    pub wait_ticks: u64,
    /// The same deadline as a duration (for the error).
    pub wait: Duration,
    /// Busy-wait this many cycle-counter ticks per read after queueing it (0: none): stands in
    /// for a driver's own per-I/O work, to measure how much of it the device's pace hides.
    pub pad_ticks: u64,
}

/// What a run measured.
#[derive(Debug, Clone, Copy, Default)]
pub struct FloorRun {
    /// Reads completed.
    pub ios: u64,
    /// Reads completed with an error status.
    pub errors: u64,
    /// SQ tail doorbell MMIO writes.
    pub sq_doorbell_writes: u64,
    /// CQ head doorbell MMIO writes.
    pub cq_doorbell_writes: u64,
}

/// One bare I/O queue pair for the floor loop.
pub struct FloorQueue {
    qid: u16,
    depth: usize,
    lba_shift: u32,
    sq: ManuallyDrop<SqRing>,
    cq: ManuallyDrop<CqRing>,
    bufs: ManuallyDrop<DmaMem>,
    mmio: Arc<Mmio>,
    sq_db: usize,
    cq_db: usize,
    /// The shadow doorbell slots (SQ tail, CQ head) when the controller has Doorbell Buffer
    /// Config on: such a controller (QEMU's) reads the new value from there, so it is written
    /// there too before the MMIO write.
    shadow: Option<(*mut u32, *mut u32)>,
    /// The device may still touch the rings: do not free them (set when Delete failed).
    leak: bool,
    ctrl: Arc<Controller>,
}

impl FloorQueue {
    /// Create the queue pair (Create I/O CQ polled, Create I/O SQ) holding up to `depth` reads
    /// of namespace `nsid` in flight (capped by the controller's MQES).
    pub fn new(ctrl: &Arc<Controller>, nsid: u32, depth: usize) -> Result<FloorQueue> {
        let ns = ctrl
            .namespace_info(nsid)
            .ok_or(NvmeError::NamespaceMissing {
                nsid,
                active: ctrl.namespaces().len(),
            })?
            .clone();
        if depth == 0 {
            return Err(NvmeError::InvalidArgument("queue depth must be at least 1"));
        }
        let entries = (depth + 1)
            .min(ctrl.max_queue_entries() as usize)
            .min(65535) as u16;
        let depth = entries as usize - 1;
        let registry = ctrl.registry().clone();
        let qid = ctrl.alloc_qid()?;
        // On the controller's NUMA node, as the driver's queue pairs.
        let numa = ctrl.device().numa_node();
        let mem = (|| -> Result<_> {
            Ok((
                SqRing::new(&registry, entries, numa)?,
                CqRing::new(
                    &registry,
                    crate::io_queue::cq_entries(entries, ctrl.cap()),
                    numa,
                )?,
                DmaMem::alloc_on(&registry, depth * PAGE_SIZE, numa)?,
            ))
        })();
        let (sq, cq, bufs) = match mem {
            Ok(m) => m,
            Err(e) => {
                ctrl.free_qid(qid);
                return Err(e);
            }
        };
        // As the driver's queue pairs: no stale shadow values under a reused id.
        crate::io_queue::clear_shadow_slots(ctrl, qid);
        if let Err(e) = crate::io_queue::create_device_queues(ctrl, qid, &sq, &cq) {
            ctrl.free_qid(qid);
            return Err(e);
        }
        let dstrd = ctrl.cap().dstrd();
        Ok(FloorQueue {
            qid,
            depth,
            lba_shift: ns.lba_size.trailing_zeros(),
            sq: ManuallyDrop::new(sq),
            cq: ManuallyDrop::new(cq),
            bufs: ManuallyDrop::new(bufs),
            mmio: ctrl.mmio().clone(),
            sq_db: sq_tail_doorbell(qid, dstrd),
            cq_db: cq_head_doorbell(qid, dstrd),
            shadow: ctrl.shadow_slots(qid).map(|(sq, cq)| (sq.db, cq.db)),
            leak: false,
            ctrl: ctrl.clone(),
        })
    }

    /// Write a doorbell: the shadow slot first when there is one, then the register.
    #[inline(always)]
    fn ring(&self, sq: bool, value: u16) {
        if let Some((s, c)) = self.shadow {
            // SAFETY: the slots point into the controller's shadow page, alive as long as
            // `self.ctrl`; only this queue writes its own slots.
            unsafe { std::ptr::write_volatile(if sq { s } else { c }, value as u32) };
            barrier::wmb();
        }
        let off = if sq { self.sq_db } else { self.cq_db };
        self.mmio.write32(off, value as u32);
    }

    /// The queue id.
    pub fn qid(&self) -> u16 {
        self.qid
    }

    /// Reads in flight at once (the depth asked for, capped by the controller).
    pub fn depth(&self) -> usize {
        self.depth
    }

    /// Keep `depth` random reads in flight for `job.run_ticks`, then wait for the last ones;
    /// each read's latency (ticks, submit to reap) goes into `hist`. Allocates nothing and makes
    /// no system call. A read not completed within `job.wait_ticks` of the last completion
    /// fails the run (the queue is then left to the controller's reset or teardown).
    pub fn run(&mut self, job: &FloorJob, hist: &mut LatencyHistogram) -> Result<FloorRun> {
        let mut reads = self.reads(job)?;
        let mut out = FloorRun::default();
        // The first batch.
        let t0 = rdtsc();
        for cid in 0..self.depth {
            self.sq.push(reads.next(cid));
        }
        barrier::wmb();
        self.ring(true, self.sq.tail());
        out.sq_doorbell_writes += 1;
        let end = t0 + job.run_ticks;
        let mut in_flight = self.depth;
        let mut last = rdtsc();
        let mut empty = 0u32;
        // The CQ head doorbell lags by fewer than the CQ's spare entries, as in the driver.
        let cq_slack = usize::from(self.cq.entries() - self.sq.entries());
        let mut cq_unrung = 0usize;
        while in_flight > 0 {
            let reaped = self.reap(&mut reads, hist, &mut out, end);
            in_flight -= reaped.finished;
            if reaped.count == 0 {
                // The deadline is read every 32 empty polls, as the driver's poll does
                // (`io_queue::poll::CHECK_EVERY`): under TCG a counter read is a call into QEMU,
                // and one per empty poll slowed this loop at QD1 below the driver's pace.
                empty = empty.wrapping_add(1);
                if empty % 32 == 0 && rdtsc().wrapping_sub(last) > job.wait_ticks {
                    self.leak = true;
                    return Err(NvmeError::Timeout {
                        command: "Read (floor loop)",
                        cid: 0,
                        qid: self.qid,
                        waited: job.wait,
                        then: crate::error::TIMEOUT_WAIT,
                    });
                }
                // No PAUSE (`spin_loop`) here: the driver's poll loop spins without one, and
                // under QEMU's TCG each PAUSE leaves the translated-code loop, which would make
                // this loop slower at QD1 than the driver it is the floor for.
                continue;
            }
            last = rdtsc();
            cq_unrung += reaped.count;
            if cq_unrung >= cq_slack {
                self.ring(false, self.cq.head());
                out.cq_doorbell_writes += 1;
                cq_unrung = 0;
            }
            if reaped.pushed {
                barrier::wmb();
                self.ring(true, self.sq.tail());
                out.sq_doorbell_writes += 1;
            }
        }
        Ok(out)
    }

    /// The reads of `job` on this queue, checked: one page or less each, a multiple of the
    /// LBA size, at least one in the span, no more in flight than there are stamps.
    fn reads<'a>(&self, job: &'a FloorJob) -> Result<Reads<'a>> {
        if job.io_size == 0
            || job.io_size > PAGE_SIZE
            || job.io_size & ((1 << self.lba_shift) - 1) != 0
        {
            return Err(NvmeError::InvalidArgument(
                "the floor loop reads one page (4 KiB) or less per command, a multiple of the LBA size",
            ));
        }
        let blocks = (job.io_size >> self.lba_shift) as u64;
        let slots = job.span_blocks / blocks;
        if slots == 0 {
            return Err(NvmeError::InvalidArgument(
                "the span is smaller than one read",
            ));
        }
        if self.depth > STAMPS {
            return Err(NvmeError::InvalidArgument(
                "the floor loop holds at most 1024 reads in flight",
            ));
        }
        let mut sqe = Sqe::new(io_opcode::READ);
        sqe.nsid = job.nsid;
        sqe.cdw12 = blocks as u32 - 1;
        Ok(Reads {
            job,
            sqe,
            base: self.bufs.iova(),
            stamps: [0; STAMPS],
            rng: 0x9e37_79b9_7f4a_7c15,
            slots,
            blocks,
        })
    }

    /// Reap every completion there is; before the end, send a new read in each one's slot.
    #[inline(always)]
    fn reap(
        &mut self,
        reads: &mut Reads<'_>,
        hist: &mut LatencyHistogram,
        out: &mut FloorRun,
        end: u64,
    ) -> Reaped {
        let mut r = Reaped::default();
        while let Some(c) = self.cq.peek() {
            self.cq.advance();
            r.count += 1;
            let now = rdtsc();
            let cid = c.cid as usize % self.depth;
            hist.record(now.saturating_sub(reads.stamps[cid]));
            out.ios += 1;
            if c.status_field() != 0 {
                out.errors += 1;
            }
            if now < end {
                self.sq.push(reads.next(cid));
                r.pushed = true;
                if reads.job.pad_ticks != 0 {
                    pad(reads.job.pad_ticks);
                }
            } else {
                r.finished += 1;
            }
        }
        r
    }
}

/// Submission stamps the floor loop keeps: its most reads in flight.
const STAMPS: usize = 1024;

/// The floor loop's reads: one template command, a random block per read, and when each
/// command id (= buffer slot) went out.
struct Reads<'a> {
    job: &'a FloorJob,
    sqe: Sqe,
    /// IOVA of the first buffer slot.
    base: u64,
    stamps: [u64; STAMPS],
    rng: u64,
    /// Reads that fit in the span.
    slots: u64,
    /// Blocks per read.
    blocks: u64,
}

impl Reads<'_> {
    /// The command of a new read into slot `cid`, at a random block; stamped now.
    #[inline(always)]
    fn next(&mut self, cid: usize) -> &Sqe {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        let lba = self.job.first_block + (self.rng % self.slots) * self.blocks;
        self.sqe.set_cid(cid as u16);
        self.sqe.prp1 = self.base + (cid * PAGE_SIZE) as u64;
        self.sqe.set_slba(lba);
        self.stamps[cid] = rdtsc();
        &self.sqe
    }
}

/// What one pass over the completion queue found.
#[derive(Default)]
struct Reaped {
    /// Completions reaped.
    count: usize,
    /// Reads sent again in their slots.
    pushed: bool,
    /// Slots left empty (the run's time is up).
    finished: usize,
}

/// Spin for `ticks` cycle-counter ticks (the floor loop's stand-in for per-I/O driver work).
#[cold]
#[inline(never)]
fn pad(ticks: u64) {
    let t = rdtsc();
    while rdtsc().wrapping_sub(t) < ticks {}
}

impl Drop for FloorQueue {
    fn drop(&mut self) {
        let deleted =
            !self.leak && crate::io_queue::delete_device_queues(&self.ctrl, self.qid).is_ok();
        if deleted {
            // SAFETY: each is dropped once, here; the queues are deleted, so the device no
            // longer touches the rings or the buffers.
            unsafe {
                ManuallyDrop::drop(&mut self.sq);
                ManuallyDrop::drop(&mut self.cq);
                ManuallyDrop::drop(&mut self.bufs);
            }
            self.ctrl.free_qid(self.qid);
        } else {
            // The device may still write into the rings and buffers: keep them mapped.
            tracing::warn!(
                qid = self.qid,
                "floor-loop queue not deleted; its memory stays mapped"
            );
            self.ctrl.leak_qid(self.qid);
        }
    }
}
