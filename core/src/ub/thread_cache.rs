//! The optional per-thread block cache of pools ([`UbPool::set_thread_cache`]): this thread's
//! [`Magazine`] per pool, and the glue that keeps the fast path off every shared cache line.
//!
//! # Ownership (why a get+put touches no shared cache line)
//! Every index cached in a thread's magazine owns one strong count of its pool: the count is
//! taken when the index leaves the shared stack (refill) and dropped when it goes back
//! (spill, flush, thread exit). A get moves the count of the index it takes into the new
//! [`super::UbBuf`]; a put moves the buffer's count back with the index. So the pool
//! provably outlives every buffer and every cached index, and a get+put that the magazine
//! serves does no atomic read-modify-write at all: no `Arc` clone or drop, no shared
//! counter (the thread's gets reach [`UbPool::stats`] when its magazine refills, spills, is
//! flushed or the thread exits).
//!
//! Cached indices keep their pool alive: a pool whose last handle is dropped while only this
//! thread's magazine still holds its indices is released the next time this thread opens a
//! magazine for another pool, calls `flush_thread_cache`, or exits.

use std::cell::RefCell;
use std::sync::{Arc, Weak};

use super::magazine::Magazine;
use super::pool::UbPool;

/// This thread's magazine for one pool.
struct Slot {
    pool_id: u64,
    /// Valid (kept alive) while `mag` holds indices: each owns a strong count.
    pool: Weak<UbPool>,
    mag: Magazine,
    /// Gets served here that the pool's statistics do not count yet.
    allocs: u64,
}

struct Slots(Vec<Slot>);

thread_local! {
    static SLOTS: RefCell<Slots> = const { RefCell::new(Slots(Vec::new())) };
}

impl Drop for Slots {
    fn drop(&mut self) {
        // Thread exit: give cached blocks back to their pools.
        for s in &mut self.0 {
            s.release();
        }
    }
}

impl Slot {
    /// Give every cached index back to the shared stack, publish the statistics and drop the
    /// strong counts the indices owned (possibly the pool's last).
    fn release(&mut self) {
        let Some(pool) = self.pool.upgrade() else {
            debug_assert_eq!(self.mag.len(), 0, "a cached index keeps its pool alive");
            return;
        };
        let n = self.mag.drain(|i| pool.return_shared(i));
        pool.add_allocs(std::mem::take(&mut self.allocs));
        let ptr = Arc::as_ptr(&pool);
        for _ in 0..n {
            // SAFETY: each drained index owned one strong count of this pool (module
            // invariant); `pool` holds another one until it drops below.
            unsafe { Arc::decrement_strong_count(ptr) };
        }
    }
}

/// This thread's slot for `pool`, and whether it was created now (with room for `cap`
/// indices; dead pools' slots are swept then).
#[inline]
fn slot<'a>(slots: &'a mut Vec<Slot>, pool: &Arc<UbPool>, cap: usize) -> (&'a mut Slot, bool) {
    let id = pool.id();
    let (at, created) = match slots.iter().position(|x| x.pool_id == id) {
        Some(at) => (at, false),
        None => {
            slots.retain(|x| x.pool.strong_count() > 0);
            slots.push(Slot {
                pool_id: id,
                pool: Arc::downgrade(pool),
                mag: Magazine::with_capacity(cap),
                allocs: 0,
            });
            (slots.len() - 1, true)
        }
    };
    (&mut slots[at], created)
}

/// Release the slots of pools that only this thread's cached indices keep alive (their users
/// dropped every handle and buffer). Called outside the hot path.
fn sweep_orphans() {
    let orphans: Vec<Slot> = SLOTS
        .try_with(|s| {
            let mut s = s.borrow_mut();
            let (orphans, keep) = std::mem::take(&mut s.0)
                .into_iter()
                .partition(|x| x.mag.len() > 0 && x.pool.strong_count() == x.mag.len());
            s.0 = keep;
            orphans
        })
        .unwrap_or_default();
    // Outside the borrow: dropping a pool must not find this thread's cache borrowed.
    for mut o in orphans {
        o.release();
    }
}

/// Take a block of `pool` through this thread's magazine: the index and the strong count it
/// carries (for the new buffer). None when the magazine and the shared stack are empty.
#[inline]
pub(crate) fn get(pool: &Arc<UbPool>, cap: usize) -> Option<(u32, Arc<UbPool>)> {
    let mut fresh = false;
    let got = SLOTS.try_with(|s| {
        let mut s = s.borrow_mut();
        let (slot, created) = slot(&mut s.0, pool, cap);
        fresh = created;
        let (idx, refilled) = slot.mag.take(cap, || pool.take_shared())?;
        slot.allocs += 1;
        if refilled > 0 {
            pool.add_allocs(std::mem::take(&mut slot.allocs));
            for _ in 0..refilled {
                // Each index the refill took from the shared stack owns one strong count.
                std::mem::forget(Arc::clone(pool));
            }
        }
        // SAFETY: the cached index owned one strong count of `pool` (module invariant); it
        // moves into the returned Arc together with the index.
        Some((idx, unsafe { Arc::from_raw(Arc::as_ptr(pool)) }))
    });
    if fresh {
        sweep_orphans();
    }
    match got {
        Ok(g) => g,
        // The thread is exiting (its cache is gone): use the shared stack.
        Err(_) => pool.take_shared().map(|i| (i, pool.clone())),
    }
}

/// Return block `idx` of `pool` (the buffer's strong count, moved in) to this thread's
/// magazine; a full magazine first spills half to the shared stack.
#[inline]
pub(crate) fn put(pool: Arc<UbPool>, cap: usize, idx: u32) {
    let spilled = SLOTS.try_with(|s| {
        let mut s = s.borrow_mut();
        let (slot, _) = slot(&mut s.0, &pool, cap);
        let n = slot.mag.give(cap, idx, |i| pool.return_shared(i));
        if n > 0 {
            pool.add_allocs(std::mem::take(&mut slot.allocs));
        }
        n
    });
    match spilled {
        Ok(n) => {
            // The index now cached owns the buffer's count.
            let ptr = Arc::into_raw(pool);
            for _ in 0..n {
                // SAFETY: each spilled index owned one strong count (module invariant); the
                // magazine still holds `idx` with its count, so this never drops the last one.
                unsafe { Arc::decrement_strong_count(ptr) };
            }
        }
        // The thread is exiting (its cache is gone): use the shared stack.
        Err(_) => pool.return_shared(idx),
    }
}

/// Give every index this thread caches for `pool` back to the shared stack.
pub(crate) fn flush(pool: &UbPool) {
    let slot = SLOTS
        .try_with(|s| {
            let mut s = s.borrow_mut();
            let at = s.0.iter().position(|x| x.pool_id == pool.id())?;
            Some(s.0.swap_remove(at))
        })
        .ok()
        .flatten();
    // The caller's reference keeps the pool alive through the release.
    if let Some(mut slot) = slot {
        slot.release();
    }
}
