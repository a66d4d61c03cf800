//! The driver's side of one RX ring and one TX ring: descriptor memory, the buffer posted in
//! each slot, and the indices the driver keeps (it never trusts the device's head pointers on
//! the I/O path: completions are seen through the DD bits of descriptors the driver posted).

use std::ptr::NonNull;
use std::sync::Arc;

use ubdirect_core::ub::{DmaMem, UbBuf, UbRegistry};

use crate::desc::{DescRing, DESC_LEN};
use crate::error::Result;

/// A ring's memory, descriptors and slots.
pub(crate) struct Ring {
    pub(crate) desc: DescRing,
    pub(crate) slots: Box<[Option<UbBuf>]>,
    /// Next descriptor the driver fills (the tail it writes).
    pub(crate) tail: u16,
    /// Next descriptor the driver expects back.
    pub(crate) clean: u16,
    /// Descriptors handed to the device and not yet back.
    pub(crate) in_flight: u16,
    // Declared last: freed after the slots, and only after the device was reset.
    pub(crate) mem: DmaMem,
}

impl Ring {
    /// A zeroed ring of `size` descriptors on the device's NUMA node.
    pub(crate) fn new(registry: &Arc<UbRegistry>, size: u16, numa: Option<u32>) -> Result<Ring> {
        let mem = DmaMem::alloc_on(registry, size as usize * DESC_LEN, numa)?;
        let base = NonNull::new(mem.as_ptr()).expect("DmaMem is never null");
        // SAFETY: DmaMem is page aligned, zeroed, at least size * 16 bytes, and lives in this
        // Ring beside the view.
        let desc = unsafe { DescRing::new(base, size) };
        Ok(Ring {
            desc,
            slots: (0..size).map(|_| None).collect(),
            tail: 0,
            clean: 0,
            in_flight: 0,
            mem,
        })
    }

    /// Ring size.
    pub(crate) fn size(&self) -> u16 {
        self.desc.size()
    }

    /// Descriptors the driver may still hand out (one stays empty: tail == head means empty).
    pub(crate) fn free(&self) -> u16 {
        self.size() - 1 - self.in_flight
    }

    /// `i + 1` modulo the ring size.
    pub(crate) fn next(&self, i: u16) -> u16 {
        if i + 1 == self.size() {
            0
        } else {
            i + 1
        }
    }

    /// After a confirmed device reset: every posted buffer back to its pool.
    pub(crate) fn drain(&mut self) {
        for s in self.slots.iter_mut() {
            *s = None;
        }
        self.in_flight = 0;
        self.tail = 0;
        self.clean = 0;
    }
}
