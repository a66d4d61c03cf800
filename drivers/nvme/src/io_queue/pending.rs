//! Queued requests (SPDK's): a request whose commands do not all fit in the free command slots
//! keeps its request slot and waits, in order, in a FIFO of this queue pair; its remaining
//! commands go out from [`IoQueuePair::poll`] as completions free slots. Off the fast path:
//! only touched when a request did not fit.

use crate::error::NvmeError;
use crate::io_types::{IoCompletion, IoPayload};

use super::poll::opcode_name;
use super::IoQueuePair;

/// Where the unsent commands of a request resume: everything needed to build them.
#[derive(Clone, Copy, Default)]
pub(crate) struct Pending {
    pub(super) opcode: u8,
    pub(super) nsid: u32,
    pub(super) lba_shift: u32,
    pub(super) slba: u64,
    pub(super) nblocks: u64,
    /// Blocks per command (MDTS and the driver's limits).
    pub(super) max_blocks: u64,
    pub(super) cdw12_flags: u32,
    pub(super) data_offset: usize,
    /// Blocks whose commands were sent.
    pub(super) done: u64,
}

impl Pending {
    /// Commands not sent yet.
    pub(super) fn cmds_left(&self) -> usize {
        (self.nblocks - self.done).div_ceil(self.max_blocks) as usize
    }
}

impl<P: IoPayload> IoQueuePair<P> {
    /// Append request slot `rid` (whose commands were not all sent) to the pending FIFO.
    #[cold]
    pub(super) fn push_pending(&mut self, rid: u16, c: Pending) {
        self.pend[rid as usize] = c;
        // At most `depth` requests exist, so the FIFO (capacity `depth`) never overflows.
        let at = (self.pending_head + self.pending_len) % self.depth;
        self.pending[at] = rid;
        self.pending_len += 1;
        self.stats.queued_requests += 1;
    }

    /// Send the commands of pending requests, oldest first, while command slots are free;
    /// then ring the SQ doorbell for them. Called from `poll` after completions freed slots.
    #[cold]
    #[inline(never)]
    pub(super) fn send_pending(&mut self) {
        let stamp = ubdirect_core::util::rdtsc();
        while self.pending_len > 0 && self.free_cid_top > 0 {
            let rid = self.pending[self.pending_head];
            let mut c = self.pend[rid as usize];
            let count = c.cmds_left().min(self.free_cid_top);
            let bufs = self.reqs[rid as usize]
                .bufs
                .take()
                .expect("a pending request holds its payload");
            let r = self.send_cmds(rid, &mut c, &bufs, count, stamp);
            self.reqs[rid as usize].bufs = Some(bufs);
            if r.is_err() {
                // Not reached: check_request refused every command that cannot be built before
                // the request was queued. Should it happen, the unsent commands count as
                // failed so that the request still completes (with an error).
                let left = c.cmds_left() as u16;
                let req = &mut self.reqs[rid as usize];
                req.remaining -= left;
                req.error
                    .get_or_insert(crate::status::NvmeStatus::from_cqe_status(0x0002 << 1));
                c.done = c.nblocks;
            }
            self.pend[rid as usize] = c;
            if c.done < c.nblocks {
                break;
            }
            self.pending_head = (self.pending_head + 1) % self.depth;
            self.pending_len -= 1;
        }
        self.ring();
    }

    /// After a reset with [`crate::Recovery::FailBack`]: forget the unsent commands of pending
    /// requests; those with no command in flight complete here with
    /// [`NvmeError::FailedByReset`] (the others when their last command in flight is failed
    /// back). Returns how many completed here.
    #[cold]
    pub(super) fn fail_back_pending(&mut self, f: &mut dyn FnMut(IoCompletion<P>)) -> usize {
        let mut n = 0;
        while self.pending_len > 0 {
            let rid = self.pending[self.pending_head] as usize;
            self.pending_head = (self.pending_head + 1) % self.depth;
            self.pending_len -= 1;
            let left = self.pend[rid].cmds_left() as u16;
            let r = &mut self.reqs[rid];
            r.remaining -= left;
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
