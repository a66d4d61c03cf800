//! Queueing the commands of one request: slots from the free stacks, PRPs into the slot's list
//! pages, SQ entries at the tail; rolled back whole when anything fails.

use crate::controller::PAGE_SIZE;
use crate::error::NvmeError;
use crate::io_types::{IoData, IoPayload, Rejected};
use crate::prp;
use crate::spec::command::io_opcode;
use crate::spec::Sqe;

use super::pending::Pending;
use super::sub_range::SubRange;
use super::{CmdSlot, DataRef, IoQueuePair, NsLimits};

/// One request as [`IoQueuePair::queue_request`] takes it: the commands to build, without
/// the payload.
#[derive(Clone, Copy)]
pub(crate) struct Request {
    /// The NVM opcode of every command.
    pub(crate) opcode: u8,
    /// The namespace's limits.
    pub(crate) ns: NsLimits,
    /// First block.
    pub(crate) slba: u64,
    /// Blocks in all.
    pub(crate) nblocks: u64,
    /// Blocks per command at most.
    pub(crate) max_blocks: u64,
    /// Bits ORed into each command's CDW12 (FUA, ...).
    pub(crate) cdw12_flags: u32,
    /// Where the data starts in the payload.
    pub(crate) data_offset: usize,
    /// The caller's tag, handed back in the completion.
    pub(crate) tag: u64,
}

impl<P: IoPayload> IoQueuePair<P> {
    /// Queue the commands of one request. `bufs` describes where its data is (for commands
    /// with data); command `k` covers blocks `[slba_k, slba_k + nlb_k)`. On error nothing is
    /// queued and `bufs` comes back. A request needing more command slots than are free sends
    /// what fits and queues the rest (see [`IoQueuePair::pending_requests`]).
    #[inline]
    pub(crate) fn queue_request(
        &mut self,
        req: Request,
        bufs: P,
    ) -> std::result::Result<(), Rejected<P>> {
        let max_blocks = req.max_blocks.max(1);
        let ncmds = match self.admit(&req, max_blocks) {
            Ok(n) => n,
            Err(error) => return Err(Rejected { bufs, error }),
        };
        let mut c = Pending {
            opcode: req.opcode,
            nsid: req.ns.nsid,
            lba_shift: req.ns.lba_shift,
            slba: req.slba,
            nblocks: req.nblocks,
            max_blocks,
            cdw12_flags: req.cdw12_flags,
            data_offset: req.data_offset,
            done: 0,
        };
        // Commands sent now: all of them unless slots are short or requests wait before it.
        let now = if self.pending_len == 0 {
            ncmds.min(self.free_cid_top)
        } else {
            0
        };
        if now < ncmds {
            // Queued: its later commands are built from `poll`; check them all now so that
            // bad input is refused here, with nothing queued.
            if let Err(e) = self.check_request(c, &bufs) {
                return Err(Rejected {
                    bufs,
                    error: e.into(),
                });
            }
        }
        // One counter read per request: every command's deadline runs from here.
        let stamp = ubdirect_core::util::rdtsc();
        self.free_req_top -= 1;
        let rid = self.free_reqs[self.free_req_top];
        if now > 0 {
            if let Err(e) = self.send_cmds(rid, &mut c, &bufs, now, stamp) {
                self.free_req_top += 1;
                return Err(Rejected {
                    bufs,
                    error: e.into(),
                });
            }
        }
        self.take_request_slot(rid, &req, bufs, ncmds);
        if now < ncmds {
            self.push_pending(rid, c);
        }
        if self.auto_ring {
            self.ring();
        }
        Ok(())
    }

    /// The number of commands `req` needs at `max_blocks` per command, when the queue pair
    /// can take it: it fits the 16-bit count, a request slot is free and the queue pair is not
    /// dead.
    #[inline(always)]
    fn admit(&self, req: &Request, max_blocks: u64) -> std::result::Result<usize, NvmeError> {
        // The common case, one command, without a 64-bit division.
        let ncmds = if req.nblocks <= max_blocks {
            1
        } else {
            req.nblocks.div_ceil(max_blocks) as usize
        };
        if ncmds > u16::MAX as usize {
            return Err(NvmeError::RequestTooLarge {
                len: req.nblocks << req.ns.lba_shift,
                commands: ncmds,
                max_cmd: (max_blocks << req.ns.lba_shift) as usize,
                depth: u16::MAX as usize,
            });
        }
        if self.free_req_top == 0 || self.dead.is_some() {
            return Err(self.dead_error().unwrap_or(NvmeError::QueueFull {
                qid: self.qid,
                depth: self.depth,
                needed: 1,
            }));
        }
        Ok(ncmds)
    }

    /// Record request `rid` (its payload, tag and `ncmds` commands) as in flight.
    #[inline(always)]
    fn take_request_slot(&mut self, rid: u16, req: &Request, bufs: P, ncmds: usize) {
        let r = &mut self.reqs[rid as usize];
        // A free request slot holds no buffers (they went back with its completion): nothing
        // to drop, so skip the drop call.
        debug_assert!(r.bufs.is_none());
        std::mem::forget(r.bufs.replace(bufs));
        r.tag = req.tag;
        r.remaining = ncmds as u16;
        r.bytes = if req.opcode == io_opcode::READ || req.opcode == io_opcode::WRITE {
            (req.nblocks << req.ns.lba_shift) as usize
        } else {
            0
        };
        r.opcode = req.opcode;
        r.error = None;
        self.in_flight += 1;
        self.stats.requests += 1;
        self.stats.commands += ncmds as u64;
    }

    /// Put the next `count` commands of request `rid` (described by `c`, data in `bufs`) into
    /// the SQ and advance `c.done`. On a PRP error the commands of this call are taken back
    /// (slots free, SQ tail restored) and `c` is unchanged.
    #[inline(always)]
    pub(super) fn send_cmds(
        &mut self,
        rid: u16,
        c: &mut Pending,
        bufs: &P,
        count: usize,
        stamp: u64,
    ) -> std::result::Result<(), prp::PrpError> {
        let saved_cid_top = self.free_cid_top;
        let saved_tail = self.sq.tail();
        let has_data = !matches!(bufs.data(), IoData::None);
        let mut done = c.done;
        for _ in 0..count {
            let nlb = (c.nblocks - done).min(c.max_blocks);
            self.free_cid_top -= 1;
            let cid = self.free_cids[self.free_cid_top];
            let (mut prp1, mut prp2) = (0, 0);
            if has_data {
                let byte_off = (done << c.lba_shift) as usize;
                let bytes = (nlb << c.lba_shift) as usize;
                let r = {
                    let data = match bufs.data() {
                        IoData::One(b) => DataRef::One {
                            iova: b.iova() + c.data_offset as u64,
                        },
                        IoData::Sg(s) => DataRef::Sg(s),
                        IoData::None => DataRef::None,
                    };
                    self.build_prps(cid, &data, byte_off, bytes)
                };
                match r {
                    Ok(p) => (prp1, prp2) = (p.prp1, p.prp2),
                    Err(e) => {
                        // The slots taken so far go back free (not in flight).
                        for i in self.free_cid_top..saved_cid_top {
                            self.cmds[self.free_cids[i] as usize].active = false;
                        }
                        self.free_cid_top = saved_cid_top;
                        self.sq.set_tail(saved_tail);
                        return Err(e);
                    }
                }
            }
            // Built in place in the slot's saved copy (kept to submit it again after a reset),
            // then copied once into the ring.
            let sqe = &mut self.sqes[cid as usize];
            *sqe = Sqe::new(c.opcode);
            sqe.set_cid(cid);
            sqe.nsid = c.nsid;
            sqe.prp1 = prp1;
            sqe.prp2 = prp2;
            if c.opcode != io_opcode::FLUSH {
                sqe.set_slba(c.slba + done);
                sqe.cdw12 = (nlb as u32 - 1) | c.cdw12_flags;
            }
            self.cmds[cid as usize] = CmdSlot {
                req: rid,
                active: true,
                aborted: false,
                stamp,
            };
            if self.lose_next {
                self.lose_next = false;
            } else {
                self.sq.push(&self.sqes[cid as usize]);
            }
            done += nlb;
        }
        c.done = done;
        Ok(())
    }

    /// Check every command of a request that will be queued can be described by PRPs (nothing
    /// written). Cold: only for requests that do not fit the free slots.
    #[cold]
    fn check_request(&self, c: Pending, bufs: &P) -> std::result::Result<(), prp::PrpError> {
        let mut done = 0u64;
        while done < c.nblocks {
            let nlb = (c.nblocks - done).min(c.max_blocks);
            let (off, bytes) = (
                (done << c.lba_shift) as usize,
                (nlb << c.lba_shift) as usize,
            );
            match bufs.data() {
                IoData::None => return Ok(()),
                IoData::One(b) => prp::check(
                    PAGE_SIZE,
                    [(b.iova() + (c.data_offset + off) as u64, bytes)],
                )?,
                IoData::Sg(sg) => prp::check(
                    PAGE_SIZE,
                    SubRange::new(
                        sg.iter().map(|s| (s.buf.iova() + s.offset as u64, s.len)),
                        off,
                        bytes,
                    ),
                )?,
            }
            done += nlb;
        }
        Ok(())
    }

    /// Queue one command whose data is `len` bytes in the list page of its own slot (Dataset
    /// Management ranges); `write_page` fills that page.
    pub(crate) fn queue_with_slot_page(
        &mut self,
        mut sqe: Sqe,
        len: usize,
        ctx: P,
        tag: u64,
        write_page: impl FnOnce(&mut [u64]),
    ) -> std::result::Result<(), Rejected<P>> {
        if self.free_cid_top == 0 || self.free_req_top == 0 || self.dead.is_some() {
            return Err(Rejected {
                bufs: ctx,
                error: self.dead_error().unwrap_or(NvmeError::QueueFull {
                    qid: self.qid,
                    depth: self.depth,
                    needed: 1,
                }),
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
            aborted: false,
            stamp: ubdirect_core::util::rdtsc(),
        };
        self.sqes[cid as usize] = sqe;
        self.sq.push(&sqe);
        let r = &mut self.reqs[rid as usize];
        r.bufs = Some(ctx);
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
        if let DataRef::One { iova } = data {
            if let Some(p) = direct_prps(iova + byte_off as u64, bytes) {
                return Ok(p);
            }
        }
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
}

/// The PRPs of one contiguous transfer of `bytes` at `start` that fits PRP1/PRP2 directly (one
/// or two memory pages, dword aligned): what [`prp::build`] returns for it, without its loop
/// and divisions. None for anything else (empty, misaligned, more than two pages): the caller
/// then builds (or refuses) it with [`prp::build`].
#[inline(always)]
fn direct_prps(start: u64, bytes: usize) -> Option<prp::Prps> {
    const PS: u64 = PAGE_SIZE as u64;
    if bytes == 0 || start & 3 != 0 {
        return None;
    }
    let next = (start & !(PS - 1)) + PS;
    let end = start + bytes as u64;
    if end <= next {
        Some(prp::Prps {
            prp1: start,
            prp2: 0,
            entries: 1,
        })
    } else if end <= next + PS {
        Some(prp::Prps {
            prp1: start,
            prp2: next,
            entries: 2,
        })
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn direct_prps_agree_with_build_wherever_they_answer() {
        let mut list = vec![0u64; 1024];
        let mut answered = 0;
        for page in [0x1000_0000u64, 0x7fff_f000] {
            for off in (0..2 * PAGE_SIZE as u64).step_by(4).chain([1, 2, 3, 6]) {
                for bytes in [0usize, 4, 512, 4092, 4096, 4100, 8192, 8196, 12288] {
                    let start = page + off;
                    let built = prp::build(PAGE_SIZE, [(start, bytes)], &mut list, 0x9000_0000);
                    match direct_prps(start, bytes) {
                        Some(p) => {
                            answered += 1;
                            assert_eq!(Ok(p), built, "start {start:#x} bytes {bytes}");
                            assert!(p.entries <= 2);
                        }
                        // Declined: empty, misaligned or needing a list.
                        None => assert!(
                            built.as_ref().map_or(true, |b| b.entries > 2),
                            "start {start:#x} bytes {bytes}: {built:?}"
                        ),
                    }
                }
            }
        }
        assert!(answered > 10_000, "{answered}");
    }
}
