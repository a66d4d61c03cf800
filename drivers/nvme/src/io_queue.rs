//! [`IoQueuePair`]: one I/O SQ/CQ pair owned by one thread. Pre-allocated command slots (each
//! with its PRP list pages) and request slots on free stacks: the I/O path allocates nothing
//! and makes no system call. Submissions are queued and the SQ tail doorbell is written once
//! per [`IoQueuePair::ring`]; the CQ head doorbell once per [`IoQueuePair::poll`] batch.

use std::mem::ManuallyDrop;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ubdirect_core::DmaMem;

use crate::controller::{Controller, PAGE_SIZE};
use crate::doorbell::Doorbell;
use crate::error::{NvmeError, Result};
use crate::io_types::{IoBufs, IoCompletion, QueueOptions, QueueStats, Rejected};
use crate::prp::{self, list_pages_needed};
use crate::ring::{CqRing, SqRing};
use crate::spec::command::{admin_opcode, io_opcode};
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
}

#[derive(Default)]
struct ReqSlot {
    bufs: IoBufs,
    tag: u64,
    remaining: u16,
    bytes: usize,
    opcode: u8,
    error: Option<NvmeStatus>,
}

/// The data of a request being built: where its bytes are.
pub(crate) enum DataRef<'a> {
    None,
    One { iova: u64 },
    Sg(&'a crate::io_types::SgList),
}

/// One I/O queue pair. `Send` (move it to its thread), not `Sync`.
pub struct IoQueuePair {
    qid: u16,
    sq: ManuallyDrop<SqRing>,
    cq: ManuallyDrop<CqRing>,
    lists: ManuallyDrop<DmaMem>,
    sq_db: Doorbell,
    cq_db: Doorbell,
    depth: usize,
    list_entries_per_cmd: usize,
    cmds: Box<[CmdSlot]>,
    free_cids: Box<[u16]>,
    free_cid_top: usize,
    reqs: ManuallyDrop<Box<[ReqSlot]>>,
    free_reqs: Box<[u16]>,
    free_req_top: usize,
    pub(crate) ns: Box<[NsLimits]>,
    pub(crate) default_ns: usize,
    in_flight: usize,
    rung_tail: u16,
    auto_ring: bool,
    io_timeout: Duration,
    idle_polls: u32,
    idle_since: Option<Instant>,
    aborted: bool,
    stats: QueueStats,
    // Last: the doorbells' BAR mapping must go before the controller (and its device) can.
    ctrl: Arc<Controller>,
}

// The raw shadow pointers inside the doorbells are owned by `ctrl` (kept alive by the Arc).
const _: fn() = || {
    fn is_send<T: Send>() {}
    is_send::<IoQueuePair>();
};

impl IoQueuePair {
    /// Create an I/O queue pair on `ctrl` (Create I/O CQ, polled, then Create I/O SQ).
    pub fn new(ctrl: &Arc<Controller>, opts: QueueOptions) -> Result<IoQueuePair> {
        if ctrl.namespaces().is_empty() {
            return Err(NvmeError::NamespaceMissing {
                nsid: opts.nsid.unwrap_or(1),
                active: 0,
            });
        }
        let default_ns = match opts.nsid {
            None => 0,
            Some(nsid) => ctrl
                .namespaces()
                .iter()
                .position(|n| n.nsid == nsid)
                .ok_or(NvmeError::NamespaceMissing {
                    nsid,
                    active: ctrl.namespaces().len(),
                })?,
        };
        if opts.depth == 0 {
            return Err(NvmeError::InvalidArgument("queue depth must be at least 1"));
        }
        let entries = (opts.depth + 1)
            .min(ctrl.max_queue_entries() as usize)
            .min(65535) as u16;
        let depth = entries as usize - 1;
        let max_cmd_ctrl = ctrl.max_command_bytes();
        let lpp = list_pages_needed(PAGE_SIZE, max_cmd_ctrl).max(1);
        let ns: Box<[NsLimits]> = ctrl
            .namespaces()
            .iter()
            .map(|n| {
                let by_nlb = (n.lba_size as usize) << 16;
                let max_cmd = max_cmd_ctrl.min(by_nlb) / n.lba_size as usize * n.lba_size as usize;
                NsLimits {
                    nsid: n.nsid,
                    lba_size: n.lba_size,
                    lba_shift: n.lba_size.trailing_zeros(),
                    nsze: n.nsze,
                    max_cmd,
                    has_metadata: n.metadata_size != 0,
                }
            })
            .collect();
        let qid = ctrl.alloc_qid()?;
        let registry = ctrl.registry().clone();
        let build = || -> Result<(SqRing, CqRing, DmaMem)> {
            Ok((
                SqRing::new(&registry, entries)?,
                CqRing::new(&registry, entries)?,
                DmaMem::alloc(&registry, depth * lpp * PAGE_SIZE)?,
            ))
        };
        let (sq, cq, lists) = match build() {
            Ok(m) => m,
            Err(e) => {
                ctrl.free_qid(qid);
                return Err(e);
            }
        };
        // Create I/O CQ: QSIZE (0-based) and QID; PC=1, IEN=0 (polled).
        let mut c = Sqe::new(admin_opcode::CREATE_IO_CQ);
        c.prp1 = cq.iova();
        c.cdw10 = (entries as u32 - 1) << 16 | qid as u32;
        c.cdw11 = 1;
        if let Err(e) = ctrl.admin_exec(c, "Create I/O Completion Queue") {
            ctrl.free_qid(qid);
            return Err(e);
        }
        let mut s = Sqe::new(admin_opcode::CREATE_IO_SQ);
        s.prp1 = sq.iova();
        s.cdw10 = (entries as u32 - 1) << 16 | qid as u32;
        s.cdw11 = (qid as u32) << 16 | 1;
        if let Err(e) = ctrl.admin_exec(s, "Create I/O Submission Queue") {
            let mut d = Sqe::new(admin_opcode::DELETE_IO_CQ);
            d.cdw10 = qid as u32;
            let _ = ctrl.admin_exec(d, "Delete I/O Completion Queue");
            ctrl.free_qid(qid);
            return Err(e);
        }
        let dstrd = ctrl.cap().dstrd();
        let shadow = if opts.shadow_doorbells {
            ctrl.shadow_slots(qid)
        } else {
            None
        };
        let sq_db = Doorbell::new(
            ctrl.mmio().clone(),
            sq_tail_doorbell(qid, dstrd),
            shadow.map(|s| s.0),
        );
        let cq_db = Doorbell::new(
            ctrl.mmio().clone(),
            cq_head_doorbell(qid, dstrd),
            shadow.map(|s| s.1),
        );
        let mut reqs = Vec::with_capacity(depth);
        reqs.resize_with(depth, ReqSlot::default);
        Ok(IoQueuePair {
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
            free_cids: (0..depth as u16).rev().collect(),
            free_cid_top: depth,
            reqs: ManuallyDrop::new(reqs.into_boxed_slice()),
            free_reqs: (0..depth as u16).rev().collect(),
            free_req_top: depth,
            ns,
            default_ns,
            in_flight: 0,
            rung_tail: 0,
            auto_ring: opts.auto_ring,
            io_timeout: opts.io_timeout,
            idle_polls: 0,
            idle_since: None,
            aborted: false,
            stats: QueueStats::default(),
        })
    }

    /// The submission/completion queue id.
    pub fn qid(&self) -> u16 {
        self.qid
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
    /// The controller.
    pub fn controller(&self) -> &Arc<Controller> {
        &self.ctrl
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
        s
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
                    return Err(NvmeError::Unsupported {
                        what: "I/O to a namespace formatted with metadata (LBA format MS > 0): reformat it without metadata",
                    });
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

    /// Queue the commands of one request. `data` describes where its `len` bytes are (for
    /// commands with data); `fill` sets opcode-specific dwords of command `k` covering blocks
    /// `[slba_k, slba_k + nlb_k)`. On error nothing is queued and `bufs` comes back.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    pub(crate) fn queue_request(
        &mut self,
        opcode: u8,
        ns: NsLimits,
        slba: u64,
        nblocks: u64,
        max_blocks: u64,
        cdw12_flags: u32,
        bufs: IoBufs,
        data_offset: usize,
        tag: u64,
    ) -> std::result::Result<(), Rejected> {
        let ncmds = nblocks.div_ceil(max_blocks.max(1)).max(1) as usize;
        if ncmds > self.depth {
            return Err(Rejected {
                bufs,
                error: NvmeError::RequestTooLarge {
                    len: nblocks << ns.lba_shift,
                    commands: ncmds,
                    max_cmd: (max_blocks << ns.lba_shift) as usize,
                    depth: self.depth,
                },
            });
        }
        if ncmds > self.free_cid_top || self.free_req_top == 0 {
            return Err(Rejected {
                bufs,
                error: NvmeError::QueueFull {
                    qid: self.qid,
                    depth: self.depth,
                    needed: ncmds,
                },
            });
        }
        let (nsid, lba_shift) = (ns.nsid, ns.lba_shift);
        let saved_cid_top = self.free_cid_top;
        let saved_tail = self.sq.tail();
        self.free_req_top -= 1;
        let rid = self.free_reqs[self.free_req_top];
        let mut done_blocks = 0u64;
        for _ in 0..ncmds {
            let nlb = (nblocks - done_blocks).min(max_blocks);
            self.free_cid_top -= 1;
            let cid = self.free_cids[self.free_cid_top];
            let mut sqe = Sqe::new(opcode);
            sqe.set_cid(cid);
            sqe.nsid = nsid;
            let has_data = !matches!(bufs, IoBufs::None);
            if has_data {
                let byte_off = (done_blocks << lba_shift) as usize;
                let bytes = (nlb << lba_shift) as usize;
                let r = {
                    let data = match &bufs {
                        IoBufs::One(b) => DataRef::One {
                            iova: b.iova() + data_offset as u64,
                        },
                        IoBufs::Sg(s) => DataRef::Sg(s),
                        IoBufs::None => DataRef::None,
                    };
                    self.build_prps(cid, &data, byte_off, bytes)
                };
                match r {
                    Ok(p) => {
                        sqe.prp1 = p.prp1;
                        sqe.prp2 = p.prp2;
                    }
                    Err(e) => {
                        self.free_cid_top = saved_cid_top;
                        self.free_req_top += 1;
                        self.sq.set_tail(saved_tail);
                        return Err(Rejected {
                            bufs,
                            error: e.into(),
                        });
                    }
                }
            }
            if opcode != io_opcode::FLUSH {
                sqe.set_slba(slba + done_blocks);
                sqe.cdw12 = (nlb as u32 - 1) | cdw12_flags;
            }
            self.cmds[cid as usize] = CmdSlot {
                req: rid,
                active: true,
            };
            self.sq.push(&sqe);
            done_blocks += nlb;
        }
        let r = &mut self.reqs[rid as usize];
        r.bufs = bufs;
        r.tag = tag;
        r.remaining = ncmds as u16;
        r.bytes = if opcode == io_opcode::READ || opcode == io_opcode::WRITE {
            (nblocks << lba_shift) as usize
        } else {
            0
        };
        r.opcode = opcode;
        r.error = None;
        self.in_flight += 1;
        self.stats.requests += 1;
        self.stats.commands += ncmds as u64;
        if self.auto_ring {
            self.ring();
        }
        Ok(())
    }

    /// Queue one command whose data is `len` bytes in the list page of its own slot (Dataset
    /// Management ranges); `write_page` fills that page.
    pub(crate) fn queue_with_slot_page(
        &mut self,
        mut sqe: Sqe,
        len: usize,
        tag: u64,
        write_page: impl FnOnce(&mut [u64]),
    ) -> std::result::Result<(), Rejected> {
        if self.free_cid_top == 0 || self.free_req_top == 0 {
            return Err(Rejected {
                bufs: IoBufs::None,
                error: NvmeError::QueueFull {
                    qid: self.qid,
                    depth: self.depth,
                    needed: 1,
                },
            });
        }
        debug_assert!(len <= PAGE_SIZE);
        self.free_req_top -= 1;
        let rid = self.free_reqs[self.free_req_top];
        self.free_cid_top -= 1;
        let cid = self.free_cids[self.free_cid_top];
        let (list, iova) = self.list_of(cid);
        write_page(&mut list[..PAGE_SIZE / 8]);
        sqe.set_cid(cid);
        sqe.prp1 = iova;
        self.cmds[cid as usize] = CmdSlot {
            req: rid,
            active: true,
        };
        self.sq.push(&sqe);
        let r = &mut self.reqs[rid as usize];
        r.bufs = IoBufs::None;
        r.tag = tag;
        r.remaining = 1;
        r.bytes = 0;
        r.opcode = sqe.opcode();
        r.error = None;
        self.in_flight += 1;
        self.stats.requests += 1;
        self.stats.commands += 1;
        if self.auto_ring {
            self.ring();
        }
        Ok(())
    }

    /// The PRP list pages of command slot `cid` and their IOVA.
    #[inline]
    fn list_of(&mut self, cid: u16) -> (&mut [u64], u64) {
        let n = self.list_entries_per_cmd;
        let off = cid as usize * n * 8;
        // SAFETY: `lists` holds depth * n u64 entries (page aligned, zeroed); cid < depth; the
        // slot is free (not in flight), so the device does not read it now; `&mut self`
        // guarantees no other reference.
        let slice = unsafe {
            std::slice::from_raw_parts_mut(self.lists.as_ptr().add(off).cast::<u64>(), n)
        };
        (slice, self.lists.iova() + off as u64)
    }

    #[inline]
    fn build_prps(
        &mut self,
        cid: u16,
        data: &DataRef<'_>,
        byte_off: usize,
        bytes: usize,
    ) -> std::result::Result<prp::Prps, prp::PrpError> {
        let (list, list_iova) = self.list_of(cid);
        match data {
            DataRef::None => Err(prp::PrpError::Empty),
            DataRef::One { iova } => prp::build(
                PAGE_SIZE,
                [(iova + byte_off as u64, bytes)],
                list,
                list_iova,
            ),
            DataRef::Sg(sg) => prp::build(
                PAGE_SIZE,
                SubRange::new(
                    sg.iter().map(|s| (s.buf.iova() + s.offset as u64, s.len)),
                    byte_off,
                    bytes,
                ),
                list,
                list_iova,
            ),
        }
    }

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

/// The (IOVA, len) pieces of bytes `[start, start+len)` of a sequence of (IOVA, len) segments.
pub(crate) struct SubRange<I> {
    segs: I,
    skip: usize,
    left: usize,
}

impl<I: Iterator<Item = (u64, usize)>> SubRange<I> {
    pub(crate) fn new(segs: I, start: usize, len: usize) -> SubRange<I> {
        SubRange {
            segs,
            skip: start,
            left: len,
        }
    }
}

impl<I: Iterator<Item = (u64, usize)>> Iterator for SubRange<I> {
    type Item = (u64, usize);
    fn next(&mut self) -> Option<(u64, usize)> {
        while self.left > 0 {
            let (iova, len) = self.segs.next()?;
            if self.skip >= len {
                self.skip -= len;
                continue;
            }
            let start = iova + self.skip as u64;
            let n = (len - self.skip).min(self.left);
            self.skip = 0;
            self.left -= n;
            return Some((start, n));
        }
        None
    }
}

impl Drop for IoQueuePair {
    fn drop(&mut self) {
        let mut d = Sqe::new(admin_opcode::DELETE_IO_SQ);
        d.cdw10 = self.qid as u32;
        let sq_ok = self.ctrl.admin_exec(d, "Delete I/O Submission Queue");
        let mut d = Sqe::new(admin_opcode::DELETE_IO_CQ);
        d.cdw10 = self.qid as u32;
        let cq_ok = sq_ok.and_then(|_| self.ctrl.admin_exec(d, "Delete I/O Completion Queue"));
        match cq_ok {
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
                // The device may still DMA into the rings and buffers: leak them (and the qid).
                tracing::warn!(error = %e, qid = self.qid, "deleting NVMe I/O queue failed; its memory stays mapped");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::SubRange;
    use proptest::prelude::*;

    /// Byte addresses covered by a list of pieces, in order.
    fn bytes(v: &[(u64, usize)]) -> Vec<u64> {
        v.iter()
            .flat_map(|&(a, l)| (0..l as u64).map(move |i| a + i))
            .collect()
    }

    proptest! {
        #[test]
        fn sub_ranges_tile_the_whole(lens in prop::collection::vec(1usize..300, 1..6), cut in 1usize..200) {
            let segs: Vec<(u64, usize)> = lens.iter().enumerate().map(|(i, &l)| ((i as u64 + 1) << 20, l)).collect();
            let total: usize = lens.iter().sum();
            let mut pieces = Vec::new();
            let mut off = 0;
            while off < total {
                let n = cut.min(total - off);
                let p: Vec<_> = SubRange::new(segs.iter().copied(), off, n).collect();
                prop_assert_eq!(p.iter().map(|x| x.1).sum::<usize>(), n);
                pieces.extend(p);
                off += n;
            }
            prop_assert_eq!(bytes(&pieces), bytes(&segs));
        }
    }
}
