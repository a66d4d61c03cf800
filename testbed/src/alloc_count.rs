//! A counting global allocator for the tests that prove an I/O path allocates nothing: it
//! forwards every call to the system allocator unchanged and counts allocations (`alloc` and
//! `realloc`), all of them and those of threads being watched.
//!
//! ```
//! use ubdirect_testbed::alloc_count::CountingAlloc;
//!
//! #[global_allocator]
//! static GLOBAL: CountingAlloc = CountingAlloc::new();
//!
//! fn main() {
//!     let mut v: Vec<u8> = Vec::with_capacity(8);
//!     let ((), n) = GLOBAL.count_on_this_thread(|| v.push(1)); // the "I/O path"
//!     assert_eq!(n, 0);
//! }
//! ```

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

thread_local! {
    /// Whether this thread's allocations count as watched.
    static WATCH: Cell<bool> = const { Cell::new(false) };
    /// This thread's watched allocations (per thread: two tests watching their own threads at
    /// once must not see each other's allocations).
    static WATCHED: Cell<u64> = const { Cell::new(0) };
}

/// The counting allocator; install it with `#[global_allocator]`.
#[derive(Debug, Default)]
pub struct CountingAlloc {
    all: AtomicU64,
}

impl CountingAlloc {
    /// A counter at zero (const, for a `static`).
    pub const fn new() -> CountingAlloc {
        CountingAlloc {
            all: AtomicU64::new(0),
        }
    }

    /// Allocations of every thread since the process started.
    pub fn count(&self) -> u64 {
        self.all.load(Ordering::Relaxed)
    }

    /// Runs `f` with this thread watched; returns its result and the allocations this thread
    /// made while it ran (other threads' do not count).
    pub fn count_on_this_thread<R>(&self, f: impl FnOnce() -> R) -> (R, u64) {
        let before = WATCHED.with(|n| n.get());
        let was = WATCH.with(|w| w.replace(true));
        let r = f();
        WATCH.with(|w| w.set(was));
        (r, WATCHED.with(|n| n.get()) - before)
    }

    fn counted(&self) {
        self.all.fetch_add(1, Ordering::Relaxed);
        // try_with: no count (rather than a panic) while this thread's locals are torn down.
        if WATCH.try_with(|w| w.get()).unwrap_or(false) {
            let _ = WATCHED.try_with(|n| n.set(n.get() + 1));
        }
    }
}

// SAFETY: forwards every call to the system allocator unchanged; only counts calls.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        self.counted();
        // SAFETY: the caller's contract is System's.
        unsafe { System.alloc(l) }
    }

    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: the caller's contract is System's.
        unsafe { System.dealloc(p, l) }
    }

    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        self.counted();
        // SAFETY: the caller's contract is System's.
        unsafe { System.realloc(p, l, n) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[global_allocator]
    static GLOBAL: CountingAlloc = CountingAlloc::new();

    #[test]
    fn a_box_is_one_allocation_of_this_thread_and_nothing_is_none() {
        let ((), one) = GLOBAL.count_on_this_thread(|| drop(std::hint::black_box(Box::new(7u64))));
        assert_eq!(one, 1);
        let mut v: Vec<u64> = Vec::with_capacity(4);
        let ((), none) = GLOBAL.count_on_this_thread(|| {
            v.push(1);
            v.pop();
        });
        assert_eq!(none, 0, "pushing within capacity does not allocate");
        let ((), grown) = GLOBAL.count_on_this_thread(|| v.extend(0..64));
        assert_eq!(grown, 1, "growing the vector is one realloc");
    }

    #[test]
    fn another_threads_allocations_count_in_all_but_not_on_this_thread() {
        let before = GLOBAL.count();
        let ((), here) = GLOBAL.count_on_this_thread(|| {
            std::thread::scope(|s| {
                s.spawn(|| {
                    for i in 0..100u8 {
                        drop(std::hint::black_box(vec![i; 64]));
                    }
                });
            });
        });
        assert!(
            GLOBAL.count() >= before + 100,
            "the other thread's vectors count in all"
        );
        // Spawning allocates a few times on this thread (the thread's handle and packet).
        assert!(here < 100, "{here} allocations on this thread");
    }

    #[test]
    fn two_threads_watched_at_once_count_only_their_own() {
        let go = std::sync::Barrier::new(2);
        let done = std::sync::Barrier::new(2);
        std::thread::scope(|s| {
            s.spawn(|| {
                let ((), n) = GLOBAL.count_on_this_thread(|| {
                    go.wait();
                    for i in 0..100u8 {
                        drop(std::hint::black_box(vec![i; 64]));
                    }
                    done.wait();
                });
                assert!(n >= 100, "{n}");
            });
            let ((), mine) = GLOBAL.count_on_this_thread(|| {
                go.wait();
                done.wait();
            });
            assert_eq!(
                mine, 0,
                "the other watched thread's allocations are not this thread's"
            );
        });
    }
}
