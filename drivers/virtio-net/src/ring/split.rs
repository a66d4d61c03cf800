//! The driver side of one split virtqueue over raw ring memory (DMA memory shared with the
//! device). A buffer is one descriptor, or a two-descriptor device-readable chain
//! ([`SplitRing::push_chain2`]); either way the head descriptor id is the buffer's slot, and
//! [`SplitRing::in_flight`] counts buffers, not descriptors. Nothing here allocates or makes a
//! syscall after `new`.

use std::sync::atomic::{fence, AtomicU16, Ordering};

use super::event_idx::vring_need_event;
use super::free_list::FreeList;
use super::layout::{
    Descriptor, RingLayout, UsedElem, AVAIL_F_NO_INTERRUPT, DESC_F_NEXT, DESC_F_WRITE,
    USED_F_NO_NOTIFY,
};

/// `links[id]` of a descriptor that heads no chain (or is free).
const NO_LINK: u16 = u16::MAX;
/// `links[id]` of the second descriptor of a chain: never a buffer's slot.
const CHAIN_TAIL: u16 = u16::MAX - 1;

/// A malformed used ring: the device reported something the driver never gave it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RingError {
    /// The queue size is not a power of two in 1..=32768.
    #[error("virtqueue size {0} is invalid: it must be a power of two between 1 and 32768")]
    BadSize(u32),
    /// A used element names a descriptor id beyond the ring.
    #[error("device completed descriptor id {id} but the ring has only {size} entries: malformed completion (reset the device)")]
    BadId {
        /// The id read.
        id: u32,
        /// The ring size.
        size: u16,
    },
    /// A used element names a descriptor that is not in flight (double completion).
    #[error("device completed descriptor id {id}, which is not in flight: malformed or duplicated completion (reset the device)")]
    NotInFlight {
        /// The id read.
        id: u16,
    },
    /// A used element reports more bytes written than the buffer holds.
    #[error("device reports {len} bytes written into descriptor id {id}, whose buffer holds {max}: malformed completion (reset the device)")]
    BadLen {
        /// The id read.
        id: u16,
        /// The length read.
        len: u32,
        /// The buffer's length.
        max: u32,
    },
    /// The used index moved further than the number of buffers in flight.
    #[error("device used index jumped from {last_used} to {used_idx} with only {in_flight} buffers in flight: malformed ring or device gone (reset the device)")]
    Overrun {
        /// The used index read.
        used_idx: u16,
        /// The driver's last consumed index.
        last_used: u16,
        /// Buffers in flight.
        in_flight: usize,
    },
}

/// Driver state of one split virtqueue.
pub struct SplitRing {
    layout: RingLayout,
    base: *mut u8,
    iova: u64,
    mask: u16,
    free: FreeList,
    /// Per descriptor id: the id chained after it, [`CHAIN_TAIL`] for a chain's second
    /// descriptor, [`NO_LINK`] otherwise. Ids are below 32768, so neither marker is an id.
    links: Box<[u16]>,
    /// Chain tails in flight: descriptors in use that are not buffers of their own.
    tails: usize,
    /// Next avail index the driver will publish (shadow of avail->idx).
    next_avail: u16,
    /// The avail index at the last kick decision.
    kicked_avail: u16,
    /// Next used index the driver will consume.
    last_used: u16,
    /// The device's used->idx as last loaded.
    seen_used: u16,
    event_idx: bool,
}

// SAFETY: the ring memory is owned by the queue that owns this SplitRing (DmaMem, Send);
// the raw pointer is only dereferenced through &mut self, so moving it across threads is
// sound. It is not Sync (no shared access).
unsafe impl Send for SplitRing {}

impl SplitRing {
    /// Initialises the ring in `base..base+layout.total` (zeroed memory, mapped at `iova`).
    ///
    /// # Safety
    /// `base` must be valid for reads and writes of `RingLayout::new(size).total` bytes,
    /// 64-byte aligned, and stay valid (and unused by anything else) while the ring lives.
    pub unsafe fn new(
        base: *mut u8,
        iova: u64,
        size: u16,
        event_idx: bool,
    ) -> Result<SplitRing, RingError> {
        // SAFETY: forwarded from the caller's contract.
        unsafe { Self::with_start_index(base, iova, size, event_idx, 0) }
    }

    /// Like [`SplitRing::new`] but with both indices starting at `start` (tests of 16-bit
    /// wrap-around; a device after reset always starts at 0).
    ///
    /// # Safety
    /// As for [`SplitRing::new`].
    pub unsafe fn with_start_index(
        base: *mut u8,
        iova: u64,
        size: u16,
        event_idx: bool,
        start: u16,
    ) -> Result<SplitRing, RingError> {
        let layout = RingLayout::new(size).ok_or(RingError::BadSize(size as u32))?;
        let ring = SplitRing {
            layout,
            base,
            iova,
            mask: size - 1,
            free: FreeList::new(size),
            links: vec![NO_LINK; size as usize].into_boxed_slice(),
            tails: 0,
            next_avail: start,
            kicked_avail: start,
            last_used: start,
            seen_used: start,
            event_idx,
        };
        // SAFETY: offsets come from the layout, inside the caller-guaranteed block.
        unsafe {
            ring.w16(layout.avail, AVAIL_F_NO_INTERRUPT);
            ring.w16(layout.avail_idx(), start);
            ring.w16(layout.used_event(), start.wrapping_sub(1));
            ring.w16(layout.used_idx(), start);
            ring.w16(layout.avail_event(), start);
        }
        Ok(ring)
    }

    /// The ring layout.
    pub fn layout(&self) -> &RingLayout {
        &self.layout
    }
    /// Ring size (entries).
    pub fn size(&self) -> u16 {
        self.layout.size
    }
    /// IOVA of the descriptor table.
    pub fn desc_iova(&self) -> u64 {
        self.iova + self.layout.desc as u64
    }
    /// IOVA of the driver (avail) area.
    pub fn avail_iova(&self) -> u64 {
        self.iova + self.layout.avail as u64
    }
    /// IOVA of the device (used) area.
    pub fn used_iova(&self) -> u64 {
        self.iova + self.layout.used as u64
    }
    /// Free descriptors.
    pub fn free_count(&self) -> usize {
        self.free.free()
    }
    /// Buffers (single descriptors and chains) handed to the device and not yet reaped.
    pub fn in_flight(&self) -> usize {
        self.free.in_use() - self.tails
    }
    /// True when `id` is the slot of a buffer in flight (a chain's second descriptor is not).
    pub fn is_in_flight(&self, id: u16) -> bool {
        self.free.is_in_use(id) && self.links.get(id as usize) != Some(&CHAIN_TAIL)
    }

    #[inline]
    fn idx_atomic(&self, off: usize) -> &AtomicU16 {
        // SAFETY: `off` is one of the layout's 2-byte aligned index fields inside the ring
        // block, valid for the ring's lifetime; the device accesses it concurrently, which is
        // exactly what an atomic models.
        unsafe { AtomicU16::from_ptr(self.base.add(off).cast::<u16>()) }
    }

    /// # Safety
    /// `off` must be a layout offset of a u16 field.
    #[inline]
    unsafe fn w16(&self, off: usize, v: u16) {
        // SAFETY: caller passes a layout offset inside the ring block.
        unsafe { core::ptr::write_volatile(self.base.add(off).cast::<u16>(), v.to_le()) }
    }

    /// Queues one buffer: `addr`/`len` (an IOVA), device-writable for RX. Returns its
    /// descriptor id, or `None` when the ring is full. Not visible to the device until
    /// [`SplitRing::publish`].
    #[inline]
    pub fn push(&mut self, addr: u64, len: u32, device_writable: bool) -> Option<u16> {
        let id = self.free.take()?;
        let flags = if device_writable { DESC_F_WRITE } else { 0 };
        self.write_desc(id, addr, len, flags, 0);
        self.make_avail(id);
        Some(id)
    }

    /// Queues one device-readable buffer in two parts, `first` then `second` (IOVA and length
    /// each), as a two-descriptor chain that one used element completes. Returns the head id
    /// (the buffer's slot), or `None` when fewer than two descriptors are free (nothing
    /// changed then). Not visible to the device until [`SplitRing::publish`].
    #[inline]
    pub fn push_chain2(&mut self, first: (u64, u32), second: (u64, u32)) -> Option<u16> {
        if self.free.free() < 2 {
            return None;
        }
        let head = self.free.take()?;
        let tail = self.free.take()?;
        self.write_desc(head, first.0, first.1, DESC_F_NEXT, tail);
        self.write_desc(tail, second.0, second.1, 0, 0);
        self.links[head as usize] = tail;
        self.links[tail as usize] = CHAIN_TAIL;
        self.tails += 1;
        self.make_avail(head);
        Some(head)
    }

    /// Writes descriptor `id`, which the caller just took from the free list.
    #[inline]
    fn write_desc(&mut self, id: u16, addr: u64, len: u32, flags: u16, next: u16) {
        let d = Descriptor {
            addr: addr.to_le(),
            len: len.to_le(),
            flags: flags.to_le(),
            next: next.to_le(),
        };
        // SAFETY: id < size, so the descriptor lies inside the ring block; it was free (not
        // in flight), so the device does not read it now.
        unsafe {
            core::ptr::write_volatile(
                self.base
                    .add(self.layout.desc + 16 * id as usize)
                    .cast::<Descriptor>(),
                d,
            );
        }
    }

    /// Puts head `id` in the next avail slot.
    #[inline]
    fn make_avail(&mut self, id: u16) {
        let slot = self.next_avail & self.mask;
        // SAFETY: slot < size, inside the avail ring; the slot is past the published index,
        // so the device does not read it now.
        unsafe { self.w16(self.layout.avail_entry(slot), id) };
        self.next_avail = self.next_avail.wrapping_add(1);
    }

    /// Frees the second descriptor of the chain `head` heads, if any.
    #[inline]
    fn unlink(&mut self, head: u16) {
        let tail = self.links[head as usize];
        if tail == NO_LINK {
            return;
        }
        self.links[head as usize] = NO_LINK;
        if let Some(t) = self.links.get_mut(tail as usize) {
            *t = NO_LINK;
            self.free.give(tail);
            self.tails -= 1;
        }
    }

    /// Makes everything pushed so far visible to the device (one release store).
    #[inline]
    pub fn publish(&mut self) {
        self.idx_atomic(self.layout.avail_idx())
            .store(self.next_avail.to_le(), Ordering::Release);
    }

    /// Published entries the device has not been told about yet.
    pub fn unkicked(&self) -> u16 {
        self.next_avail.wrapping_sub(self.kicked_avail)
    }

    /// After [`SplitRing::publish`]: does the device want a doorbell for the entries published
    /// since the last call? With EVENT_IDX this asks `avail_event`; without it, the used ring's
    /// NO_NOTIFY flag. Records the decision point either way.
    #[inline]
    pub fn kick_needed(&mut self) -> bool {
        if self.next_avail == self.kicked_avail {
            return false;
        }
        // The avail idx store must be visible before we read the device's event/flags.
        fence(Ordering::SeqCst);
        let need = if self.event_idx {
            let ev = u16::from_le(
                self.idx_atomic(self.layout.avail_event())
                    .load(Ordering::Acquire),
            );
            vring_need_event(ev, self.next_avail, self.kicked_avail)
        } else {
            let flags = u16::from_le(self.idx_atomic(self.layout.used).load(Ordering::Acquire));
            flags & USED_F_NO_NOTIFY == 0
        };
        self.kicked_avail = self.next_avail;
        need
    }

    /// Reaps one used element: its descriptor id (now free again) and the length the device
    /// wrote. `Ok(None)` when nothing new is there. Never trusts the device: ids out of range,
    /// not in flight, or an index that runs ahead of what was given become [`RingError`]s and
    /// leave the ring unchanged.
    #[inline]
    pub fn pop_used(&mut self) -> Result<Option<(u16, u32)>, RingError> {
        self.pop_used_within(u32::MAX)
    }

    /// [`SplitRing::pop_used`] for device-writable buffers of `max_len` bytes: a used length
    /// beyond it is [`RingError::BadLen`] and, like every error, leaves the ring unchanged
    /// (the next call reports it again).
    #[inline]
    pub fn pop_used_within(&mut self, max_len: u32) -> Result<Option<(u16, u32)>, RingError> {
        if self.last_used == self.seen_used {
            let idx = u16::from_le(
                self.idx_atomic(self.layout.used_idx())
                    .load(Ordering::Acquire),
            );
            let ahead = idx.wrapping_sub(self.last_used) as usize;
            if ahead > self.in_flight() {
                return Err(RingError::Overrun {
                    used_idx: idx,
                    last_used: self.last_used,
                    in_flight: self.in_flight(),
                });
            }
            if ahead == 0 {
                return Ok(None);
            }
            self.seen_used = idx;
        }
        let slot = self.last_used & self.mask;
        // SAFETY: slot < size, inside the used ring; the Acquire load of used->idx above
        // orders this read after the device's write of the element.
        let e: UsedElem = unsafe {
            core::ptr::read_volatile(
                self.base
                    .add(self.layout.used_entry(slot))
                    .cast::<UsedElem>(),
            )
        };
        let id = u32::from_le(e.id);
        let len = u32::from_le(e.len);
        if id >= self.layout.size as u32 {
            return Err(RingError::BadId {
                id,
                size: self.layout.size,
            });
        }
        let id = id as u16;
        if !self.is_in_flight(id) {
            return Err(RingError::NotInFlight { id });
        }
        if len > max_len {
            return Err(RingError::BadLen {
                id,
                len,
                max: max_len,
            });
        }
        if !self.free.give(id) {
            return Err(RingError::NotInFlight { id });
        }
        self.unlink(id);
        self.last_used = self.last_used.wrapping_add(1);
        Ok(Some((id, len)))
    }

    /// Keeps used-buffer notifications (interrupts) away: moves `used_event` just behind the
    /// consumed index, so the device never finds it inside the range it advances over. A plain
    /// store into ring memory: no device exit.
    #[inline]
    pub fn suppress_interrupts(&mut self) {
        if self.event_idx {
            self.idx_atomic(self.layout.used_event())
                .store(self.last_used.wrapping_sub(1).to_le(), Ordering::Relaxed);
        }
    }

    /// Forgets every in-flight buffer and returns the ids that were in flight to `f`. Only
    /// after the device has been reset (it will not touch the ring again).
    pub fn drain_after_reset(&mut self, mut f: impl FnMut(u16)) {
        for id in 0..self.layout.size {
            if self.free.give(id) {
                f(id);
            }
        }
        self.links.fill(NO_LINK);
        self.tails = 0;
    }
}

#[cfg(test)]
#[path = "split_tests.rs"]
mod tests;
