//! [`UbBuf`]: one block of a [`UbPool`], owned by whoever holds it.

use std::mem::ManuallyDrop;
use std::sync::Arc;

use super::pool::UbPool;
use super::region::UbRegion;

mod copy;

/// One pool block. Moved into a submission and back out of its completion, so exactly one
/// party (the CPU holder or a device) owns it at a time. Returns to its pool on drop.
pub struct UbBuf {
    ptr: *mut u8,
    iova: u64,
    idx: u32,
    /// The buffer's strong count of its pool: moved back to the pool (its thread cache or the
    /// shared stack) in `drop`, so a cached get+put never touches the reference count.
    pool: ManuallyDrop<Arc<UbPool>>,
}

// SAFETY: a UbBuf is the exclusive owner of its block; moving it to another thread moves that
// ownership. The pool it returns to is Sync.
unsafe impl Send for UbBuf {}
// SAFETY: &UbBuf only allows reads of the block (as_slice, read_into); mutation needs &mut.
unsafe impl Sync for UbBuf {}

impl std::fmt::Debug for UbBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UbBuf")
            .field("iova", &format_args!("{:#x}", self.iova))
            .field("len", &self.len())
            .field("block", &self.idx)
            .finish()
    }
}

impl UbBuf {
    #[inline]
    pub(crate) fn new(pool: Arc<UbPool>, idx: u32, ptr: *mut u8, iova: u64) -> UbBuf {
        UbBuf {
            ptr,
            iova,
            idx,
            pool: ManuallyDrop::new(pool),
        }
    }

    /// The block's device (IOVA) address.
    #[inline]
    pub fn iova(&self) -> u64 {
        self.iova
    }

    /// The block size in bytes.
    #[inline]
    pub fn len(&self) -> usize {
        self.pool.block_size()
    }

    /// Always false (blocks are at least 4 KiB).
    #[inline]
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The block's bytes for the CPU, for a block of host memory.
    ///
    /// # Panics
    /// On a block of a file region or a BAR ([`UbRegion::is_cpu_sliceable`] false): another
    /// process may rewrite or truncate a file under the borrow (a load past a new end is a
    /// SIGBUS), and BAR memory is accessed volatile only. Copy such blocks out with
    /// [`UbBuf::read_into`].
    #[inline]
    pub fn as_slice(&self) -> &[u8] {
        if !self.pool.cpu_slices() {
            self.refuse_slice("as_slice");
        }
        // SAFETY: the block is len bytes of mapped host memory owned by this buffer; no
        // device may touch it while the CPU holds the buffer (ownership moves on submit).
        unsafe { std::slice::from_raw_parts(self.ptr, self.len()) }
    }

    /// The block's bytes for the CPU, writable, for a block of host memory.
    ///
    /// # Panics
    /// On a block of a read-only region (a registered file mapping, [`UbRegion::is_read_only`]):
    /// such blocks are DMA sources only; and on a block of a BAR, which is accessed volatile
    /// only ([`UbBuf::write_from`] writes it).
    #[inline]
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        if !self.pool.cpu_slices() {
            self.refuse_slice("as_mut_slice");
        }
        // SAFETY: as as_slice, and &mut self makes the borrow exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len()) }
    }

    /// The panic of a slice asked of a block that gives none, naming the region and what to
    /// use instead.
    #[cold]
    #[inline(never)]
    #[track_caller]
    fn refuse_slice(&self, method: &str) -> ! {
        let r = self.region();
        if r.is_read_only() {
            let instead = if method == "as_mut_slice" {
                "such blocks are DMA sources only; write the file instead"
            } else {
                "the file may be rewritten or truncated under the borrow (a load past a new end is a SIGBUS); copy the bytes out with UbBuf::read_into, which reads the file"
            };
            panic!(
                "UbBuf::{method} on a block of read-only UB region {} (a registered file mapping): {instead}",
                r.id
            );
        }
        panic!(
            "UbBuf::{method} on a block of UB region {} ({:?}): device memory is accessed volatile, never as a Rust slice; use UbBuf::read_into / UbBuf::write_from",
            r.id, r.kind
        );
    }

    /// The block's CPU address.
    #[inline]
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// The region the block lives in.
    #[inline]
    pub fn region(&self) -> &Arc<UbRegion> {
        self.pool.region()
    }

    /// The pool the block returns to.
    #[inline]
    pub fn pool(&self) -> &Arc<UbPool> {
        &self.pool
    }

    /// The block's index in its pool.
    #[inline]
    pub fn index(&self) -> u32 {
        self.idx
    }
}

impl Drop for UbBuf {
    #[inline]
    fn drop(&mut self) {
        // SAFETY: `pool` is taken once, here, and never used again.
        let pool = unsafe { ManuallyDrop::take(&mut self.pool) };
        UbPool::put(pool, self.idx);
    }
}
