//! Doorbell writes, direct or through the shadow doorbell buffer with EventIdx (Doorbell Buffer
//! Config, NVMe 1.3): with shadow doorbells the driver writes the new value to host memory and
//! touches the MMIO register only when the controller's EventIdx says it is not looking.

use std::sync::Arc;

use ubdirect_core::{barrier, Mmio};

/// One doorbell register (SQ tail or CQ head) and its optional shadow slots.
pub(crate) struct Doorbell {
    mmio: Arc<Mmio>,
    offset: usize,
    shadow: Option<ShadowSlot>,
    /// MMIO writes done.
    pub(crate) mmio_writes: u64,
    /// Writes that went only to the shadow buffer.
    pub(crate) shadow_only: u64,
    /// Of those, the ones the controller let go because its EventIdx was at or past the new
    /// value: it asked to hear of this queue later (a controller on which shadow doorbells
    /// pay). The others went only to the shadow buffer because EventIdx was still behind the
    /// last value written: the controller had not yet processed that write, which happens on
    /// one that asks to hear of every update (QEMU's) when the driver updates twice in a row.
    pub(crate) shadow_only_ahead: u64,
    /// Writes of a value already written ([`Doorbell::kick`]): a command waited long enough
    /// that the controller may have lost the first write.
    pub(crate) kicks: u64,
}

/// Pointers into the controller's shadow doorbell and EventIdx pages for one doorbell.
#[derive(Clone, Copy)]
pub(crate) struct ShadowSlot {
    pub(crate) db: *mut u32,
    pub(crate) ei: *const u32,
}

// SAFETY: the shadow pointers point into DMA pages owned by the controller, which every queue
// holding a Doorbell keeps alive through an Arc; each slot is written by exactly one queue.
unsafe impl Send for Doorbell {}

/// EventIdx rule from the spec (and Linux's nvme_dbbuf_need_event): ring when the new value
/// passed the controller's event index since the last write.
#[inline]
pub(crate) fn need_event(event_idx: u16, new: u16, old: u16) -> bool {
    new.wrapping_sub(event_idx).wrapping_sub(1) < new.wrapping_sub(old)
}

/// Whether the controller's event index is past `new` (within half the u16 index space): it
/// asked to hear of this doorbell only later than this update. An event index equal to `new`
/// is not: a controller that sets it to the value it has just read (QEMU's) has read the
/// shadow slot between the driver's store and its look at the index, a timing accident
/// (rare: about 1 of 79 probe updates under QEMU).
#[inline]
pub(crate) fn event_idx_ahead(event_idx: u16, new: u16) -> bool {
    event_idx.wrapping_sub(new).wrapping_sub(1) < 0x7fff
}

impl Doorbell {
    /// A doorbell at MMIO `offset`, shadowed when `shadow` is given.
    pub(crate) fn new(mmio: Arc<Mmio>, offset: usize, shadow: Option<ShadowSlot>) -> Doorbell {
        Doorbell {
            mmio,
            offset,
            shadow,
            mmio_writes: 0,
            shadow_only: 0,
            shadow_only_ahead: 0,
            kicks: 0,
        }
    }

    /// Take over the write counts of `old` (the doorbell this one replaces after a reset), so
    /// a queue's statistics run on across resets.
    pub(crate) fn carry_counts_from(&mut self, old: &Doorbell) {
        self.mmio_writes = old.mmio_writes;
        self.shadow_only = old.shadow_only;
        self.shadow_only_ahead = old.shadow_only_ahead;
        self.kicks = old.kicks;
    }

    /// Whether updates go through a shadow slot.
    pub(crate) fn is_shadowed(&self) -> bool {
        self.shadow.is_some()
    }

    /// Publish `value`. The caller has made the entries it announces visible (wmb).
    #[inline]
    pub(crate) fn write(&mut self, value: u16) {
        match self.shadow {
            None => {
                barrier::wmb();
                self.mmio.write32(self.offset, value as u32);
                self.mmio_writes += 1;
            }
            Some(s) => {
                // SAFETY: `s.db` / `s.ei` point into the live shadow pages (see the Send impl);
                // the controller reads and writes them concurrently, so accesses are volatile.
                let old = unsafe { std::ptr::read_volatile(s.db) } as u16;
                barrier::wmb();
                // SAFETY: as above.
                unsafe { std::ptr::write_volatile(s.db, value as u32) };
                // The shadow store must be visible before EventIdx is read.
                barrier::mb();
                // SAFETY: as above.
                let ei = unsafe { std::ptr::read_volatile(s.ei) } as u16;
                if need_event(ei, value, old) {
                    self.mmio.write32(self.offset, value as u32);
                    self.mmio_writes += 1;
                } else {
                    self.shadow_only += 1;
                    if event_idx_ahead(ei, value) {
                        self.shadow_only_ahead += 1;
                    }
                }
            }
        }
    }

    /// Write `value`, the value last published, to the register again (and to the shadow slot):
    /// for a command that has waited long with the controller ready, in case the controller
    /// lost the first write (QEMU's TCG can, while another controller is hot-plugged:
    /// RELIABILITY.md row S9-3). The same tail announces no new entry, so a
    /// controller that did see the first write does nothing. Cold.
    #[cold]
    pub(crate) fn kick(&mut self, value: u16) {
        self.write_always(value);
        self.kicks += 1;
    }

    /// Publish `value` to the shadow slot (if any) and always to the register.
    pub(crate) fn write_always(&mut self, value: u16) {
        if let Some(s) = self.shadow {
            // SAFETY: see `write`.
            unsafe { std::ptr::write_volatile(s.db, value as u32) };
        }
        barrier::wmb();
        self.mmio.write32(self.offset, value as u32);
        self.mmio_writes += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_idx_rule() {
        // Controller saw up to 5 (event idx 5): moving 5 -> 7 crosses it? new-ei-1 = 1 < 2 yes.
        assert!(need_event(5, 7, 5));
        // Controller asked to be told after 9: moving 5 -> 7 does not cross it.
        assert!(!need_event(9, 7, 5));
        // Exactly reaching ei+1 rings.
        assert!(need_event(6, 7, 5));
        // Wrap-around of the u16 index.
        assert!(need_event(65535, 1, 65534));
        assert!(!need_event(3, 1, 65534));
    }

    #[test]
    fn a_skip_is_ahead_only_when_the_event_index_is_past_the_new_value() {
        // Lazy controller: asked to hear at 9, the driver moves 5 -> 7: skipped, ahead.
        assert!(!need_event(9, 7, 5) && event_idx_ahead(9, 7));
        // QEMU-like: event index still at 4 (the write of 5 not processed yet), 5 -> 7: skipped
        // because the controller is behind, not because it asked to hear later.
        assert!(!need_event(4, 7, 5) && !event_idx_ahead(4, 7));
        // QEMU-like, the other race: the controller read the new value 7 from the shadow slot
        // (processing an earlier write) and set its event index to 7 before the driver looked:
        // skipped because the controller has seen it, not because it asked to hear later.
        assert!(!need_event(7, 7, 5) && !event_idx_ahead(7, 7));
        // Just past.
        assert!(event_idx_ahead(8, 7));
        // Wrap-around.
        assert!(event_idx_ahead(2, 65534));
        assert!(!event_idx_ahead(65534, 2));
        assert!(!event_idx_ahead(65534, 65534));
    }

    #[test]
    fn shadow_write_skips_mmio_when_controller_not_waiting() {
        let mmio = Arc::new(Mmio::anonymous(0x2000).unwrap());
        let mut page = vec![0u32; 2];
        let db = page.as_mut_ptr();
        // SAFETY: index 1 of a 2-element vector.
        let ei = unsafe { db.add(1) };
        let mut d = Doorbell::new(mmio.clone(), 0x1000, Some(ShadowSlot { db, ei }));
        page_set(ei, 100);
        d.write(3);
        assert_eq!(mmio.read32(0x1000), 0, "event idx 100 not crossed: no MMIO");
        assert_eq!(d.shadow_only, 1);
        page_set(ei, 3);
        d.write(5);
        assert_eq!(mmio.read32(0x1000), 5);
        assert_eq!(d.mmio_writes, 1);
        // SAFETY: db points at element 0.
        assert_eq!(unsafe { *db }, 5);
        drop(page);
    }

    fn page_set(p: *mut u32, v: u32) {
        // SAFETY: test pointers into a live vector.
        unsafe { std::ptr::write_volatile(p, v) }
    }
}
