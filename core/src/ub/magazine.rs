//! A magazine: one thread's cache of free block indices in front of a pool's shared stack.
//! Taking and giving touch only the magazine; it goes to the shared stack once per half
//! magazine (refill when empty, spill half when full).
//!
//! Pure bookkeeping (no atomics, no thread-locals, no pool): the per-thread glue is in
//! `thread_cache.rs`, and `core/tests/loom_free_stack.rs` compiles this very file to check
//! magazines over the lock-free stack under every interleaving. Keep it free of other
//! dependencies for that reason.

/// Free block indices cached by one thread for one pool.
#[derive(Debug, Default)]
pub(crate) struct Magazine {
    items: Vec<u32>,
}

impl Magazine {
    /// An empty magazine with room for `cap` indices (no allocation on the I/O path later).
    pub(crate) fn with_capacity(cap: usize) -> Magazine {
        Magazine {
            items: Vec::with_capacity(cap + 1),
        }
    }

    /// Indices cached now.
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.items.len()
    }

    /// Take an index. An empty magazine first refills with up to `cap.div_ceil(2)` indices
    /// from `refill` (the shared stack; None when it is empty). Returns the index and how many
    /// indices the refill moved out of the shared stack. None when both are empty.
    #[inline]
    pub(crate) fn take(
        &mut self,
        cap: usize,
        mut refill: impl FnMut() -> Option<u32>,
    ) -> Option<(u32, usize)> {
        if let Some(i) = self.items.pop() {
            return Some((i, 0));
        }
        let mut moved = 0;
        for _ in 0..cap.div_ceil(2) {
            match refill() {
                Some(i) => {
                    self.items.push(i);
                    moved += 1;
                }
                None => break,
            }
        }
        self.items.pop().map(|i| (i, moved))
    }

    /// Cache `idx`. A full magazine (`cap` indices) first sends `cap / 2` of them to `spill`
    /// (the shared stack). Returns how many it spilled.
    #[inline]
    pub(crate) fn give(&mut self, cap: usize, idx: u32, mut spill: impl FnMut(u32)) -> usize {
        let mut moved = 0;
        if self.items.len() >= cap {
            for _ in 0..cap / 2 {
                if let Some(i) = self.items.pop() {
                    spill(i);
                    moved += 1;
                }
            }
        }
        self.items.push(idx);
        moved
    }

    /// Send every cached index to `spill`; returns how many.
    pub(crate) fn drain(&mut self, mut spill: impl FnMut(u32)) -> usize {
        let n = self.items.len();
        for i in self.items.drain(..) {
            spill(i);
        }
        n
    }
}
