//! A lock-free stack of block indices (Treiber stack over an index array). The head carries a
//! generation tag in its upper 32 bits, so a pop that raced with pop-push-pop of the same
//! index fails its compare-exchange instead of corrupting the list (no ABA).
//!
//! The atomics come from `super::sync` so that `core/tests/loom_free_stack.rs` can compile this
//! very file against loom's model-checked atomics (keep this file free of tests and of other
//! dependencies for that reason; its unit tests are in `free_stack_tests.rs`).

use super::sync::{AtomicU32, AtomicU64, Ordering};

const NIL: u32 = u32::MAX;

/// A fixed-capacity lock-free stack of the indices `0..capacity`.
pub(crate) struct FreeStack {
    head: AtomicU64,
    next: Box<[AtomicU32]>,
}

impl FreeStack {
    /// A stack holding every index `0..n` (0 on top). `n` must be below `u32::MAX`.
    pub(crate) fn full(n: u32) -> FreeStack {
        let next: Box<[AtomicU32]> = (0..n)
            .map(|i| AtomicU32::new(if i + 1 < n { i + 1 } else { NIL }))
            .collect();
        FreeStack {
            head: AtomicU64::new(if n > 0 { 0 } else { u64::from(NIL) }),
            next,
        }
    }

    /// Take an index, or None when empty.
    #[inline]
    pub(crate) fn pop(&self) -> Option<u32> {
        let mut h = self.head.load(Ordering::Acquire);
        loop {
            let idx = h as u32;
            if idx == NIL {
                return None;
            }
            let next = self.next[idx as usize].load(Ordering::Relaxed);
            let new = ((h >> 32).wrapping_add(1) << 32) | u64::from(next);
            match self
                .head
                .compare_exchange_weak(h, new, Ordering::SeqCst, Ordering::Acquire)
            {
                Ok(_) => return Some(idx),
                Err(cur) => h = cur,
            }
        }
    }

    /// Give an index back. It must have come from [`FreeStack::pop`] and not be in the stack.
    #[inline]
    pub(crate) fn push(&self, idx: u32) {
        let mut h = self.head.load(Ordering::Relaxed);
        loop {
            self.next[idx as usize].store(h as u32, Ordering::Relaxed);
            let new = ((h >> 32).wrapping_add(1) << 32) | u64::from(idx);
            // SeqCst: get_timeout's waiter check relies on the push being ordered before the
            // putter's later load of the waiter count (a locked instruction on x86 either way).
            match self
                .head
                .compare_exchange_weak(h, new, Ordering::SeqCst, Ordering::Relaxed)
            {
                Ok(_) => return,
                Err(cur) => h = cur,
            }
        }
    }
}
