//! Admin and NVM I/O command execution.

use super::prp::{segments, PrpError};
use super::queues::{Cq, Done, Sq};
use super::{NvmeModel, State};

/// Generic status codes (SCT 0).
mod sc {
    pub const INVALID_OPCODE: u16 = 0x01;
    pub const INVALID_FIELD: u16 = 0x02;
    pub const DATA_TRANSFER_ERROR: u16 = 0x04;
    pub const INVALID_NS: u16 = 0x0b;
    pub const LBA_OUT_OF_RANGE: u16 = 0x80;
}
/// Command-specific status codes (SCT 1).
mod csc {
    pub const CQ_INVALID: u16 = 0x00;
    pub const INVALID_QID: u16 = 0x01;
    pub const INVALID_QSIZE: u16 = 0x02;
    pub const INVALID_QUEUE_DELETION: u16 = 0x0c;
    pub const COMPARE_FAILURE: u16 = 0x85;
}

fn dw(sqe: &[u8; 64], i: usize) -> u32 {
    u32::from_le_bytes(sqe[i * 4..i * 4 + 4].try_into().expect("4 bytes"))
}
fn qw(sqe: &[u8; 64], off: usize) -> u64 {
    u64::from_le_bytes(sqe[off..off + 8].try_into().expect("8 bytes"))
}

fn bad_field() -> Option<Done> {
    Done::err(0, sc::INVALID_FIELD | 1 << 14)
}

impl State {
    /// Move `data` to (`to_host`) or from host memory along the command's PRPs.
    fn transfer(m: &NvmeModel, sqe: &[u8; 64], data: &mut [u8], to_host: bool) -> Result<(), u16> {
        let segs = segments(&m.dma, qw(sqe, 24), qw(sqe, 32), data.len()).map_err(|e| match e {
            PrpError::Offset => 0x13, // PRP Offset Invalid
            PrpError::Fault => sc::DATA_TRANSFER_ERROR,
        })?;
        let mut at = 0;
        for (iova, len) in segs {
            let chunk = &mut data[at..at + len];
            let r = if to_host {
                m.dma.write(iova, chunk)
            } else {
                m.dma.read(iova, chunk)
            };
            r.map_err(|_| sc::DATA_TRANSFER_ERROR)?;
            at += len;
        }
        Ok(())
    }

    fn send_page(&mut self, m: &NvmeModel, sqe: &[u8; 64], mut page: [u8; 4096]) -> Option<Done> {
        match Self::transfer(m, sqe, &mut page, true) {
            Ok(()) => Done::ok(0),
            Err(s) => Done::err(0, s),
        }
    }

    /// Execute an admin command; None when it completes later (never, for AER).
    pub(crate) fn admin(&mut self, m: &NvmeModel, sqe: &[u8; 64]) -> Option<Done> {
        let (cdw10, cdw11) = (dw(sqe, 10), dw(sqe, 11));
        match sqe[0] {
            0x06 => self.identify(m, sqe),
            // Set / Get Features.
            0x09 | 0x0a => self.features(sqe),
            0x05 => self.create_cq(sqe),
            0x01 => self.create_sq(sqe),
            0x00 => self.delete_sq(cdw10 as u16),
            0x04 => self.delete_cq(cdw10 as u16),
            // Abort: the model has already completed everything it will complete.
            0x08 => Done::ok(1),
            // Get Log Page: zeros.
            0x02 => {
                let dwords = ((cdw11 & 0xffff) << 16 | cdw10 >> 16) as usize + 1;
                if dwords * 4 > 64 << 10 {
                    return bad_field();
                }
                let mut data = vec![0u8; dwords * 4];
                match Self::transfer(m, sqe, &mut data, true) {
                    Ok(()) => Done::ok(0),
                    Err(s) => Done::err(0, s),
                }
            }
            // Asynchronous Event Request: held forever (the model raises no events).
            0x0c => None,
            // Doorbell Buffer Config.
            0x7c if self.cfg.shadow_doorbells => {
                let (db, ei) = (qw(sqe, 24), qw(sqe, 32));
                if db % 4096 != 0 || ei % 4096 != 0 || db == 0 || ei == 0 {
                    return bad_field();
                }
                self.shadow = Some((db, ei));
                Done::ok(0)
            }
            _ => Done::err(0, sc::INVALID_OPCODE),
        }
    }

    /// Identify: the controller, a namespace, the active namespace list or a namespace's
    /// identification descriptors (tampered with
    /// when the model is hostile).
    fn identify(&mut self, m: &NvmeModel, sqe: &[u8; 64]) -> Option<Done> {
        let (nsid, cns) = (dw(sqe, 1), dw(sqe, 10) as u8);
        let mut page = match cns {
            0x01 => self.identify_controller(),
            0x00 if nsid == 0 || nsid == u32::MAX => return Done::err(0, sc::INVALID_NS),
            0x00 => self.identify_namespace(nsid),
            0x02 if nsid >= 0xffff_fffe => return Done::err(0, sc::INVALID_NS),
            0x02 => self.active_list(nsid),
            0x03 if nsid == 0 || nsid >= 0xffff_fffe => return Done::err(0, sc::INVALID_NS),
            0x03 => self.ns_descriptors(nsid),
            _ => return bad_field(),
        };
        if let Some(t) = self.tamper.as_mut() {
            t.identify(cns, nsid, &mut page);
        }
        self.send_page(m, sqe, page)
    }

    /// Set / Get Features: Number of Queues (granted once, on the first Set); others succeed.
    fn features(&mut self, sqe: &[u8; 64]) -> Option<Done> {
        let (cdw10, cdw11) = (dw(sqe, 10), dw(sqe, 11));
        if cdw10 as u8 != 0x07 {
            return Done::ok(0);
        }
        if sqe[0] == 0x09 && self.granted == 0 {
            let want = (cdw11 & 0xffff).max(cdw11 >> 16) + 1;
            self.granted = want.min(self.cfg.max_io_queues as u32).max(1) as u16;
        }
        let g = self.granted.max(1) as u32 - 1;
        Done::ok(g << 16 | g)
    }

    /// The queue id (CDW10 bits 15:0) and entries (bits 31:16, 0's based) of a Create I/O
    /// queue command, checked against the granted queues, those in use (`exists`) and the
    /// controller's maximum; CDW11 bit 0 (physically contiguous) must be set.
    fn check_create(&self, sqe: &[u8; 64], exists: bool) -> Result<(u16, u32), Option<Done>> {
        let (cdw10, cdw11) = (dw(sqe, 10), dw(sqe, 11));
        let qid = cdw10 as u16;
        let qsize = (cdw10 >> 16) + 1;
        let max_entries = (self.cfg.cap & 0xffff) as u32 + 1;
        if qid == 0 || qid > self.granted || exists {
            return Err(Done::err(1, csc::INVALID_QID));
        }
        if qsize < 2 || qsize > max_entries || cdw11 & 1 == 0 {
            return Err(Done::err(1, csc::INVALID_QSIZE));
        }
        Ok((qid, qsize))
    }

    /// Create I/O Completion Queue.
    fn create_cq(&mut self, sqe: &[u8; 64]) -> Option<Done> {
        let exists = self.cqs.contains_key(&(dw(sqe, 10) as u16));
        let (qid, qsize) = match self.check_create(sqe, exists) {
            Ok(q) => q,
            Err(done) => return done,
        };
        self.cqs.insert(qid, Cq::new(qw(sqe, 24), qsize as u16));
        Done::ok(0)
    }

    /// Create I/O Submission Queue (on an existing completion queue).
    fn create_sq(&mut self, sqe: &[u8; 64]) -> Option<Done> {
        let exists = self.sqs.contains_key(&(dw(sqe, 10) as u16));
        let (qid, qsize) = match self.check_create(sqe, exists) {
            Ok(q) => q,
            Err(done) => return done,
        };
        let cqid = (dw(sqe, 11) >> 16) as u16;
        if cqid == 0 || !self.cqs.contains_key(&cqid) {
            return Done::err(1, csc::CQ_INVALID);
        }
        self.sqs
            .insert(qid, Sq::new(qw(sqe, 24), qsize as u16, cqid));
        Done::ok(0)
    }

    /// Delete I/O Submission Queue.
    fn delete_sq(&mut self, qid: u16) -> Option<Done> {
        match qid {
            0 => Done::err(1, csc::INVALID_QID),
            q if self.sqs.remove(&q).is_some() => Done::ok(0),
            _ => Done::err(1, csc::INVALID_QID),
        }
    }

    /// Delete I/O Completion Queue (refused while a submission queue uses it).
    fn delete_cq(&mut self, qid: u16) -> Option<Done> {
        if qid == 0 || !self.cqs.contains_key(&qid) {
            return Done::err(1, csc::INVALID_QID);
        }
        if self.sqs.values().any(|s| s.cqid == qid) {
            return Done::err(1, csc::INVALID_QUEUE_DELETION);
        }
        self.cqs.remove(&qid);
        Done::ok(0)
    }

    /// Execute an NVM command.
    pub(crate) fn io(&mut self, m: &NvmeModel, sqe: &[u8; 64]) -> Option<Done> {
        let nsid = dw(sqe, 1);
        let Some(ns) = self.cfg.namespaces.iter().find(|n| n.nsid == nsid).cloned() else {
            return Done::err(0, sc::INVALID_NS);
        };
        let op = sqe[0];
        if op == 0x00 {
            return Done::ok(0);
        }
        if !matches!(op, 0x01 | 0x02 | 0x05 | 0x08 | 0x09) {
            return Done::err(0, sc::INVALID_OPCODE);
        }
        if op == 0x09 {
            return Done::ok(0);
        }
        let slba = dw(sqe, 10) as u64 | (dw(sqe, 11) as u64) << 32;
        let nlb = (dw(sqe, 12) & 0xffff) as u64 + 1;
        if slba.checked_add(nlb).is_none_or(|e| e > ns.blocks) {
            return Done::err(0, sc::LBA_OUT_OF_RANGE);
        }
        let (start, len) = ((slba << ns.lbads) as usize, (nlb << ns.lbads) as usize);
        if op == 0x08 {
            self.storage.get_mut(&nsid).expect("backed")[start..start + len].fill(0);
            return Done::ok(0);
        }
        // MDTS 40 and up (fuzzed configs) is beyond any namespace here: no limit.
        if self.cfg.mdts != 0 && self.cfg.mdts < 40 && len > 4096 << self.cfg.mdts {
            return bad_field();
        }
        let mut buf = vec![0u8; len];
        let medium = self.storage.get_mut(&nsid).expect("backed");
        let r = match op {
            0x02 => {
                buf.copy_from_slice(&medium[start..start + len]);
                Self::transfer(m, sqe, &mut buf, true)
            }
            0x01 => Self::transfer(m, sqe, &mut buf, false).map(|()| {
                medium[start..start + len].copy_from_slice(&buf);
            }),
            _ => Self::transfer(m, sqe, &mut buf, false).and_then(|()| {
                if medium[start..start + len] == buf[..] {
                    Ok(())
                } else {
                    Err(0x0185)
                }
            }),
        };
        match r {
            Ok(()) => Done::ok(0),
            Err(0x0185) => Done::err(2, csc::COMPARE_FAILURE & 0xff),
            Err(s) => Done::err(0, s),
        }
    }
}
