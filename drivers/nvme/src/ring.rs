//! Submission and completion rings in driver DMA memory (phase-tagged completion polling).

use std::sync::Arc;

use ubdirect_core::{barrier, DmaMem, UbRegistry};

use crate::cmb::CmbSlice;
use crate::error::Result;
use crate::spec::{Cqe, Sqe};

/// Where a submission queue lives: host DMA memory, or the controller's own CMB.
enum SqMem {
    Host(DmaMem),
    Cmb(CmbSlice),
}

impl SqMem {
    #[inline]
    fn as_ptr(&self) -> *mut u8 {
        match self {
            SqMem::Host(m) => m.as_ptr(),
            SqMem::Cmb(c) => c.as_ptr(),
        }
    }
}

/// A submission queue ring of `entries` 64-byte entries.
pub(crate) struct SqRing {
    mem: SqMem,
    entries: u16,
    tail: u16,
}

impl SqRing {
    /// Allocate a zeroed ring on NUMA node `numa` (the controller's; None: no preference).
    pub(crate) fn new(
        registry: &Arc<UbRegistry>,
        entries: u16,
        numa: Option<u32>,
    ) -> Result<SqRing> {
        let mem = DmaMem::alloc_on(registry, entries as usize * 64, numa)?;
        Ok(SqRing {
            mem: SqMem::Host(mem),
            entries,
            tail: 0,
        })
    }
    /// A zeroed ring in the Controller Memory Buffer, in `slice` (at least `entries * 64`
    /// bytes).
    pub(crate) fn in_cmb(slice: CmbSlice, entries: u16) -> SqRing {
        let mut r = SqRing {
            mem: SqMem::Cmb(slice),
            entries,
            tail: 0,
        };
        r.reset();
        r
    }
    /// Zero the ring and start again at slot 0 (after a controller reset).
    pub(crate) fn reset(&mut self) {
        // SAFETY: the ring memory is entries * 64 bytes and the controller is disabled (or
        // does not know the queue yet), so the device does not access it.
        unsafe { std::ptr::write_bytes(self.mem.as_ptr(), 0, self.entries as usize * 64) };
        self.tail = 0;
    }
    /// The ring's IOVA (for Create I/O SQ / ASQ): in the CMB, the controller address.
    pub(crate) fn iova(&self) -> u64 {
        match &self.mem {
            SqMem::Host(m) => m.iova(),
            SqMem::Cmb(c) => c.iova(),
        }
    }
    /// The NUMA node of the ring's host memory (None in the CMB or without a node).
    pub(crate) fn numa_node(&self) -> Option<u32> {
        match &self.mem {
            SqMem::Host(m) => m.region().numa,
            SqMem::Cmb(_) => None,
        }
    }
    /// Entries of the ring.
    pub(crate) fn entries(&self) -> u16 {
        self.entries
    }
    /// True when the ring lies in the Controller Memory Buffer.
    pub(crate) fn in_cmb_memory(&self) -> bool {
        matches!(self.mem, SqMem::Cmb(_))
    }
    /// Current tail index (the value the tail doorbell gets).
    #[inline]
    pub(crate) fn tail(&self) -> u16 {
        self.tail
    }
    /// Reset the tail to an earlier value (rolling back entries that were never rung).
    #[inline]
    pub(crate) fn set_tail(&mut self, tail: u16) {
        self.tail = tail;
    }
    /// Copy `sqe` into the slot at the tail and advance the tail. The caller guarantees a free
    /// slot (at most entries-1 commands outstanding).
    #[inline]
    pub(crate) fn push(&mut self, sqe: &Sqe) {
        let slot = self.tail as usize;
        // SAFETY: slot < entries and the ring memory holds entries * 64 bytes, 64-byte aligned
        // (DmaMem is page aligned); the device reads this slot only after the doorbell write.
        unsafe {
            std::ptr::write_volatile(self.mem.as_ptr().cast::<Sqe>().add(slot), *sqe);
        }
        self.tail = if self.tail + 1 == self.entries {
            0
        } else {
            self.tail + 1
        };
    }
}

/// A completion queue ring of `entries` 16-byte entries, with the expected phase tag.
pub(crate) struct CqRing {
    mem: DmaMem,
    entries: u16,
    head: u16,
    phase: bool,
}

impl CqRing {
    /// Allocate a zeroed ring (expected phase 1 on the first pass) on NUMA node `numa` (the
    /// controller's; None: no preference).
    pub(crate) fn new(
        registry: &Arc<UbRegistry>,
        entries: u16,
        numa: Option<u32>,
    ) -> Result<CqRing> {
        let mem = DmaMem::alloc_on(registry, entries as usize * 16, numa)?;
        Ok(CqRing {
            mem,
            entries,
            head: 0,
            phase: true,
        })
    }
    /// The ring's IOVA.
    pub(crate) fn iova(&self) -> u64 {
        self.mem.iova()
    }
    /// The NUMA node of the ring's memory (None: no node asked for).
    pub(crate) fn numa_node(&self) -> Option<u32> {
        self.mem.region().numa
    }
    /// Zero the ring and expect phase 1 at slot 0 again (after a controller reset).
    pub(crate) fn reset(&mut self) {
        // SAFETY: the ring memory is entries * 16 bytes and the controller is disabled, so the
        // device does not access it.
        unsafe { std::ptr::write_bytes(self.mem.as_ptr(), 0, self.entries as usize * 16) };
        self.head = 0;
        self.phase = true;
    }
    /// Entries of the ring.
    pub(crate) fn entries(&self) -> u16 {
        self.entries
    }
    /// Current head index (the value the head doorbell gets).
    #[inline]
    pub(crate) fn head(&self) -> u16 {
        self.head
    }
    /// The entry at the head if its phase tag says the device has written it.
    #[inline]
    pub(crate) fn peek(&self) -> Option<Cqe> {
        // SAFETY: head < entries and the ring holds entries * 16 bytes, 16-byte aligned; the
        // device writes entries concurrently, so every read is volatile.
        let p = unsafe { self.mem.as_ptr().cast::<Cqe>().add(self.head as usize) };
        // SAFETY: `p` points into the ring (see above); status is the last u16 of the entry.
        let status = unsafe { std::ptr::read_volatile(std::ptr::addr_of!((*p).status)) };
        if (status & 1 != 0) != self.phase {
            return None;
        }
        barrier::rmb();
        // SAFETY: as above; the phase tag matched, so the device finished writing the entry.
        Some(unsafe { std::ptr::read_volatile(p) })
    }
    /// The ring as the driver sees it, for a timeout's diagnosis: the expected phase and every
    /// entry the device has written (non-zero) as `slot:cid/sqid/sqhd/status+phase`. Cold.
    #[cold]
    pub(crate) fn describe(&self) -> String {
        use std::fmt::Write;
        let mut out = format!("head {} phase {}", self.head, self.phase as u8);
        for slot in 0..self.entries as usize {
            // SAFETY: slot < entries and the ring holds entries * 16 bytes, 16-byte aligned;
            // volatile because the device may write it concurrently.
            let e = unsafe { std::ptr::read_volatile(self.mem.as_ptr().cast::<Cqe>().add(slot)) };
            if e.status != 0 || e.cid != 0 || e.sq_head != 0 || e.result != 0 {
                let _ = write!(
                    out,
                    " {slot}:{}/{}/{}/{:#x}",
                    e.cid, e.sq_id, e.sq_head, e.status
                );
            }
        }
        out
    }
    /// Consume the head entry.
    #[inline]
    pub(crate) fn advance(&mut self) {
        self.head += 1;
        if self.head == self.entries {
            self.head = 0;
            self.phase = !self.phase;
        }
    }
}
