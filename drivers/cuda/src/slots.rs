//! Which device ring slot a copy writes, and when a slot may be written again. Asynchronous
//! copies ([`crate::CudaSink::submit_host`], the `Sink` path) hold their slot until reaped;
//! pageable copies ([`crate::CudaSink::copy_pageable`]) take a slot no asynchronous copy holds,
//! round-robin, and leave work on the device behind them (the DMA from CUDA's staging buffer, the
//! checksum kernel) that the slot's event marks: whoever takes that slot next waits on the
//! event first.

/// A slot handed out, and whether its event must complete before the slot is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Take {
    /// The slot.
    pub slot: u32,
    /// The slot's event marks work that may still read or write the slot: wait on it first.
    pub wait: bool,
}

/// The slot table of one sink's device ring.
#[derive(Debug)]
pub(crate) struct Slots {
    /// Slots no asynchronous copy holds (taken last-in first-out).
    free: Vec<u32>,
    /// Held by an asynchronous copy in flight.
    busy: Vec<bool>,
    /// The slot's event was recorded after pageable work nobody waited for yet.
    pending: Vec<bool>,
    /// Where the next pageable copy starts looking.
    next: usize,
}

impl Slots {
    /// `n` slots, all free.
    pub(crate) fn new(n: usize) -> Slots {
        Slots {
            free: (0..n as u32).rev().collect(),
            busy: vec![false; n],
            pending: vec![false; n],
            next: 0,
        }
    }

    /// Slots in the ring.
    pub(crate) fn len(&self) -> usize {
        self.busy.len()
    }

    /// Slots held by asynchronous copies.
    pub(crate) fn in_flight(&self) -> usize {
        self.busy.len() - self.free.len()
    }

    /// A slot for an asynchronous copy, held until [`Slots::complete`]; `None` when every slot
    /// is held.
    pub(crate) fn take_async(&mut self) -> Option<Take> {
        let slot = self.free.pop()?;
        self.busy[slot as usize] = true;
        let wait = std::mem::take(&mut self.pending[slot as usize]);
        Some(Take { slot, wait })
    }

    /// Give back a slot [`Slots::take_async`] handed out when nothing was queued with it (its
    /// pending wait, if any, still stands).
    pub(crate) fn undo(&mut self, t: Take) {
        self.pending[t.slot as usize] |= t.wait;
        self.complete(t.slot);
    }

    /// The asynchronous copy holding `slot` completed (its event did).
    pub(crate) fn complete(&mut self, slot: u32) {
        debug_assert!(self.busy[slot as usize], "slot {slot} completed twice");
        self.busy[slot as usize] = false;
        self.free.push(slot);
    }

    /// A slot for a pageable copy: the next one round-robin that no asynchronous copy holds;
    /// `None` when every slot is held. Call [`Slots::pageable_queued`] once work was queued.
    pub(crate) fn take_pageable(&mut self) -> Option<Take> {
        let n = self.busy.len();
        let slot = (0..n)
            .map(|k| (self.next + k) % n)
            .find(|&s| !self.busy[s])?;
        self.next = (slot + 1) % n;
        let wait = std::mem::take(&mut self.pending[slot]);
        Some(Take {
            slot: slot as u32,
            wait,
        })
    }

    /// Pageable work on `slot` was queued and its event recorded after it.
    pub(crate) fn pageable_queued(&mut self, slot: u32) {
        self.pending[slot as usize] = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pageable_copy_never_takes_a_slot_an_async_copy_holds() {
        let mut s = Slots::new(3);
        let a = s.take_async().unwrap();
        let b = s.take_async().unwrap();
        assert_ne!(a.slot, b.slot);
        for _ in 0..5 {
            let p = s.take_pageable().unwrap();
            assert!(p.slot != a.slot && p.slot != b.slot, "{p:?}");
            s.pageable_queued(p.slot);
        }
        let c = s.take_async().unwrap();
        assert!(s.take_async().is_none() && s.take_pageable().is_none());
        assert!(
            c.wait,
            "the async copy reuses a slot pageable work used: it must wait"
        );
        assert_eq!(s.in_flight(), 3);
        s.complete(a.slot);
        assert_eq!(s.take_pageable().unwrap().slot, a.slot);
    }

    #[test]
    fn a_slot_is_written_again_only_after_waiting_on_its_event() {
        let mut s = Slots::new(2);
        let p0 = s.take_pageable().unwrap();
        assert_eq!(
            p0,
            Take {
                slot: 0,
                wait: false
            }
        );
        s.pageable_queued(0);
        let p1 = s.take_pageable().unwrap();
        assert_eq!(
            p1,
            Take {
                slot: 1,
                wait: false
            }
        );
        s.pageable_queued(1);
        // Round-robin comes back to slot 0, whose checksum kernel may still read it.
        assert_eq!(
            s.take_pageable().unwrap(),
            Take {
                slot: 0,
                wait: true
            }
        );
        // Waited for once: the wait is not asked for twice.
        s.pageable_queued(0);
        let a = s.take_async().unwrap();
        assert!(a.wait);
        // Nothing queued with it: the wait still stands for the next user.
        s.undo(a);
        let again = s.take_async().unwrap();
        assert_eq!(again, a);
        s.complete(again.slot);
        let next = s.take_async().unwrap();
        assert_eq!(
            next,
            Take {
                slot: again.slot,
                wait: false
            }
        );
    }
}
