//! An optional per-thread cache ("magazine") of free block indices in front of a pool's
//! lock-free stack: a thread that gets and puts blocks repeatedly touches only its own cache
//! and goes to the shared stack once per half magazine. Off by default (see
//! [`super::UbPool::set_thread_cache`] for when it pays off and what it costs).

use std::cell::RefCell;
use std::sync::Weak;

use super::pool::UbPool;

/// The magazines of this thread, one per pool that used the cache here.
struct Magazines(Vec<Magazine>);

struct Magazine {
    pool_id: u64,
    pool: Weak<UbPool>,
    items: Vec<u32>,
}

thread_local! {
    static MAGS: RefCell<Magazines> = const { RefCell::new(Magazines(Vec::new())) };
}

impl Drop for Magazines {
    fn drop(&mut self) {
        // Thread exit: give cached blocks back to their pools.
        for m in self.0.drain(..) {
            if let Some(p) = m.pool.upgrade() {
                for i in m.items {
                    p.push_shared(i);
                }
            }
        }
    }
}

/// Take a block index for `pool` from this thread's magazine, refilling it with up to
/// `cap / 2` indices from the shared stack. None when both are empty.
#[inline]
pub(crate) fn get(pool: &UbPool, cap: usize) -> Option<u32> {
    MAGS.try_with(|m| {
        let mut m = m.borrow_mut();
        let mag = magazine(&mut m.0, pool, cap);
        if let Some(i) = mag.items.pop() {
            return Some(i);
        }
        for _ in 0..cap.div_ceil(2) {
            match pool.pop_shared() {
                Some(i) => mag.items.push(i),
                None => break,
            }
        }
        mag.items.pop()
    })
    .unwrap_or_else(|_| pool.pop_shared())
}

/// Return a block index to this thread's magazine; a full magazine sends half its indices
/// back to the shared stack first.
#[inline]
pub(crate) fn put(pool: &UbPool, cap: usize, idx: u32) {
    let done = MAGS.try_with(|m| {
        let mut m = m.borrow_mut();
        let mag = magazine(&mut m.0, pool, cap);
        if mag.items.len() >= cap {
            for _ in 0..cap / 2 {
                if let Some(i) = mag.items.pop() {
                    pool.push_shared(i);
                }
            }
        }
        mag.items.push(idx);
    });
    if done.is_err() {
        pool.push_shared(idx);
    }
}

/// Give every index this thread caches for `pool` back to the shared stack.
pub(crate) fn flush(pool: &UbPool) {
    let _ = MAGS.try_with(|m| {
        let mut m = m.borrow_mut();
        if let Some(mag) = m.0.iter_mut().find(|x| x.pool_id == pool.id()) {
            for i in mag.items.drain(..) {
                pool.push_shared(i);
            }
        }
    });
}

#[inline]
fn magazine<'a>(mags: &'a mut Vec<Magazine>, pool: &UbPool, cap: usize) -> &'a mut Magazine {
    let id = pool.id();
    let at = match mags.iter().position(|x| x.pool_id == id) {
        Some(at) => at,
        None => {
            // Forget magazines of pools that are gone (their ids are never reused).
            mags.retain(|x| x.pool.strong_count() > 0);
            mags.push(Magazine {
                pool_id: id,
                pool: pool.weak_self(),
                items: Vec::with_capacity(cap + 1),
            });
            mags.len() - 1
        }
    };
    &mut mags[at]
}
