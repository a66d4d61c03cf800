//! Submission / completion queues of the model: fetch, execute, post with the phase tag.

use super::{NvmeModel, State};

/// A submission queue.
#[derive(Debug, Clone)]
pub(crate) struct Sq {
    pub(crate) base: u64,
    pub(crate) size: u16,
    pub(crate) head: u16,
    pub(crate) tail: u16,
    pub(crate) cqid: u16,
}

impl Sq {
    pub(crate) fn new(base: u64, size: u16, cqid: u16) -> Sq {
        Sq {
            base,
            size,
            head: 0,
            tail: 0,
            cqid,
        }
    }
}

/// A completion queue.
#[derive(Debug, Clone)]
pub(crate) struct Cq {
    pub(crate) base: u64,
    pub(crate) size: u16,
    pub(crate) head: u16,
    pub(crate) tail: u16,
    pub(crate) phase: bool,
}

impl Cq {
    pub(crate) fn new(base: u64, size: u16) -> Cq {
        Cq {
            base,
            size,
            head: 0,
            tail: 0,
            phase: true,
        }
    }
    fn full(&self) -> bool {
        (self.tail + 1) % self.size == self.head
    }
}

/// A command's outcome: CQE DW0 and the status field (SCT << 8 | SC, DNR bit 14).
pub(crate) struct Done {
    pub(crate) result: u32,
    pub(crate) status: u16,
}

impl Done {
    pub(crate) fn ok(result: u32) -> Option<Done> {
        Some(Done { result, status: 0 })
    }
    pub(crate) fn err(sct: u16, sc: u16) -> Option<Done> {
        Some(Done {
            result: 0,
            status: sct << 8 | sc,
        })
    }
}

impl State {
    /// A lazy CQ (see `NvmeConfig::shadow_lazy_cq`) that looks full: take the head the driver
    /// wrote to its shadow doorbell.
    fn refresh_cq_head_from_shadow(&mut self, m: &NvmeModel, cqid: u16) {
        let Some((db, _)) = self.shadow else { return };
        let stride = 4u64 << self.dstrd();
        let Ok(v) = m.dma.read_u32(db + (2 * cqid as u64 + 1) * stride) else {
            return;
        };
        if let Some(cq) = self.cqs.get_mut(&cqid) {
            if (v as u16) < cq.size && v <= 0xffff {
                cq.head = v as u16;
            }
        }
    }

    /// Run the commands between SQ `qid`'s head and tail while its CQ has room.
    pub(crate) fn process_sq(&mut self, m: &NvmeModel, qid: u16) {
        loop {
            let Some(sq) = self.sqs.get(&qid).cloned() else {
                return;
            };
            if sq.head == sq.tail || self.cfs {
                return;
            }
            if self.cfg.shadow_lazy_cq && self.cqs.get(&sq.cqid).is_some_and(|c| c.full()) {
                self.refresh_cq_head_from_shadow(m, sq.cqid);
            }
            match self.cqs.get(&sq.cqid) {
                Some(cq) if !cq.full() => {}
                Some(_) => {
                    self.stats.cq_full_waits += 1;
                    return;
                }
                None => return,
            }
            let mut sqe = [0u8; 64];
            if m.dma.read(sq.base + sq.head as u64 * 64, &mut sqe).is_err() {
                // A queue the controller cannot read: fatal, as on hardware.
                self.cfs = true;
                return;
            }
            let head = (sq.head + 1) % sq.size;
            if let Some(s) = self.sqs.get_mut(&qid) {
                s.head = head;
            }
            let opcode = sqe[0];
            let stats = if qid == 0 {
                &mut self.stats.admin
            } else {
                &mut self.stats.io
            };
            *stats.entry(opcode).or_default() += 1;
            if let Some(t) = self.tamper.as_mut() {
                if !t.answer(qid, opcode) {
                    self.stats.swallowed += 1;
                    continue;
                }
            }
            let done = if qid == 0 {
                self.admin(m, &sqe)
            } else {
                self.io(m, &sqe)
            };
            if let Some(d) = done {
                let cid = u16::from_le_bytes([sqe[2], sqe[3]]);
                self.post(m, sq.cqid, qid, head, cid, d);
            }
        }
    }

    /// Post a completion to CQ `cqid` (which has room).
    fn post(&mut self, m: &NvmeModel, cqid: u16, sqid: u16, sq_head: u16, cid: u16, d: Done) {
        let Some(cq) = self.cqs.get(&cqid).cloned() else {
            return;
        };
        let mut e = [0u8; 16];
        e[0..4].copy_from_slice(&d.result.to_le_bytes());
        e[8..10].copy_from_slice(&sq_head.to_le_bytes());
        e[10..12].copy_from_slice(&sqid.to_le_bytes());
        e[12..14].copy_from_slice(&cid.to_le_bytes());
        e[14..16].copy_from_slice(&(d.status << 1 | cq.phase as u16).to_le_bytes());
        if let Some(t) = self.tamper.as_mut() {
            t.completion(cqid, &mut e);
        }
        if m.dma.write(cq.base + cq.tail as u64 * 16, &e).is_err() {
            self.cfs = true;
            return;
        }
        self.stats.completions += 1;
        if let Some(c) = self.cqs.get_mut(&cqid) {
            c.tail += 1;
            if c.tail == c.size {
                c.tail = 0;
                c.phase = !c.phase;
            }
        }
    }
}
