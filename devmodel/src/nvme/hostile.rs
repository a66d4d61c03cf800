//! [`Hostile`]: a plan of misbehaviour (from generated fuzz input, or written by hand) and the
//! [`super::Tamper`] that carries it out.

use super::Tamper;

/// One change to a completion entry before it is posted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CqeTweak {
    /// Leave it alone.
    Keep,
    /// Replace the command identifier.
    Cid(u16),
    /// Post it with the wrong phase tag (the driver must not see it).
    FlipPhase,
    /// Replace the status field (bits 15:1; the phase tag is kept).
    Status(u16),
    /// Replace the SQ head pointer.
    SqHead(u16),
    /// Replace the SQ identifier.
    SqId(u16),
    /// Replace the result (DW0).
    Result(u32),
    /// Replace all 16 bytes, phase tag kept.
    Bytes([u8; 16]),
}

/// A controller's misbehaviour, applied on top of the well-behaved model.
#[derive(Debug, Clone, Default)]
pub struct Hostile {
    /// Register reads at these BAR0 offsets return these values instead (exact offset match;
    /// a 64-bit read at 0 is CAP, 32-bit reads at 0 / 4 its halves).
    pub registers: Vec<(u64, u64)>,
    /// From this register read on (0-based count), every register reads all-ones.
    pub all_ones_after: Option<u64>,
    /// Byte patches `(cns, offset, value)` applied to every Identify page of that CNS.
    pub identify_patches: Vec<(u8, u16, u8)>,
    /// From this command on (0-based count over all queues), commands are swallowed.
    pub silent_after: Option<u64>,
    /// Applied to completions in order, one each; completions past the end are left alone.
    pub cqe_tweaks: Vec<CqeTweak>,
    /// SQ tail doorbell writes (0-based count over all queues) that are lost: the controller
    /// never sees them.
    pub lost_sq_doorbells: Vec<u64>,
}

impl Hostile {
    /// The tamper that carries the plan out.
    pub fn into_tamper(self) -> Box<dyn Tamper> {
        Box::new(Run {
            plan: self,
            reads: 0,
            commands: 0,
            completions: 0,
            sq_doorbells: 0,
        })
    }
}

struct Run {
    plan: Hostile,
    reads: u64,
    commands: u64,
    completions: usize,
    sq_doorbells: u64,
}

impl Tamper for Run {
    fn register(&mut self, off: u64, size: u8, value: u64) -> u64 {
        let n = self.reads;
        self.reads += 1;
        if self.plan.all_ones_after.is_some_and(|a| n >= a) {
            return u64::MAX >> (64 - 8 * size as u32);
        }
        match self.plan.registers.iter().find(|(o, _)| *o == off) {
            Some(&(_, v)) => v & (u64::MAX >> (64 - 8 * size as u32)),
            None => {
                // A 32-bit read of CAP's halves follows a 64-bit CAP override.
                match self.plan.registers.iter().find(|(o, _)| *o == 0) {
                    Some(&(_, cap)) if off == 4 && size == 4 => cap >> 32,
                    _ => value,
                }
            }
        }
    }

    fn identify(&mut self, cns: u8, _nsid: u32, page: &mut [u8; 4096]) {
        for &(c, off, v) in &self.plan.identify_patches {
            if c == cns {
                page[off as usize % 4096] = v;
            }
        }
    }

    fn answer(&mut self, _qid: u16, _opcode: u8) -> bool {
        let n = self.commands;
        self.commands += 1;
        self.plan.silent_after.is_none_or(|s| n < s)
    }

    fn sq_doorbell(&mut self, _qid: u16, _value: u16) -> bool {
        let n = self.sq_doorbells;
        self.sq_doorbells += 1;
        !self.plan.lost_sq_doorbells.contains(&n)
    }

    fn completion(&mut self, _cqid: u16, e: &mut [u8; 16]) {
        let i = self.completions;
        self.completions += 1;
        let Some(&t) = self.plan.cqe_tweaks.get(i) else {
            return;
        };
        let phase = e[14] & 1;
        match t {
            CqeTweak::Keep => {}
            CqeTweak::Cid(c) => e[12..14].copy_from_slice(&c.to_le_bytes()),
            CqeTweak::FlipPhase => e[14] ^= 1,
            CqeTweak::Status(s) => {
                e[14..16].copy_from_slice(&((s << 1) | phase as u16).to_le_bytes())
            }
            CqeTweak::SqHead(h) => e[8..10].copy_from_slice(&h.to_le_bytes()),
            CqeTweak::SqId(q) => e[10..12].copy_from_slice(&q.to_le_bytes()),
            CqeTweak::Result(r) => e[0..4].copy_from_slice(&r.to_le_bytes()),
            CqeTweak::Bytes(b) => {
                *e = b;
                e[14] = (e[14] & !1) | phase;
            }
        }
    }
}
