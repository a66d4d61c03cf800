//! A lock-free stack of block indices (Treiber stack over an index array). The head carries a
//! generation tag in its upper 32 bits, so a pop that raced with pop-push-pop of the same
//! index fails its compare-exchange instead of corrupting the list (no ABA).

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

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

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::sync::Arc;

    #[test]
    fn pops_every_index_once() {
        let s = FreeStack::full(5);
        let got: Vec<u32> = std::iter::from_fn(|| s.pop()).collect();
        assert_eq!(got, vec![0, 1, 2, 3, 4]);
        s.push(3);
        s.push(1);
        assert_eq!(s.pop(), Some(1));
        assert_eq!(s.pop(), Some(3));
        assert_eq!(s.pop(), None);
        assert_eq!(FreeStack::full(0).pop(), None);
    }

    #[test]
    fn threads_never_share_an_index() {
        let s = Arc::new(FreeStack::full(8));
        let owned: Arc<Vec<AtomicU32>> = Arc::new((0..8).map(|_| AtomicU32::new(0)).collect());
        let hs: Vec<_> = (0..4)
            .map(|_| {
                let (s, owned) = (s.clone(), owned.clone());
                std::thread::spawn(move || {
                    for _ in 0..20_000 {
                        if let Some(i) = s.pop() {
                            assert_eq!(owned[i as usize].fetch_add(1, Ordering::SeqCst), 0);
                            owned[i as usize].fetch_sub(1, Ordering::SeqCst);
                            s.push(i);
                        }
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        let all: HashSet<u32> = std::iter::from_fn(|| s.pop()).collect();
        assert_eq!(all.len(), 8);
    }
}
