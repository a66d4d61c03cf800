//! Memory barriers for device access. Call [`wmb`] after filling a descriptor in DMA memory and
//! before the doorbell write that tells the device about it; [`rmb`] after seeing a completion's
//! phase/valid bit and before reading the rest of it.

use std::sync::atomic::{fence, Ordering};

/// Order earlier stores before later stores (descriptor writes before a doorbell).
#[inline(always)]
pub fn wmb() {
    // x86-64 keeps stores in order with respect to each other and to uncached MMIO stores; a
    // release fence stops the compiler from reordering. Other architectures get a real fence.
    fence(Ordering::Release);
}

/// Order earlier loads before later loads (a completion's valid bit before its payload).
#[inline(always)]
pub fn rmb() {
    fence(Ordering::Acquire);
}

/// Full barrier: order every earlier access before every later one.
#[inline(always)]
pub fn mb() {
    fence(Ordering::SeqCst);
}
