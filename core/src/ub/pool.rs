//! [`UbPool`]: one region carved into fixed, power-of-two blocks handed out as [`UbBuf`]s.
//! Get and put are a lock-free pop/push plus a few atomic counters (none at all when the
//! per-thread cache serves them): no allocation, no syscall. Only [`UbPool::get_timeout`] on an
//! empty pool takes a lock and sleeps.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use super::thread_cache;
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::{Duration, Instant};

use ubdirect_hugepages::PageSize;

use super::buf::UbBuf;
use super::free_stack::FreeStack;
use super::region::{RegionOwner, UbRegion};
use super::registry::UbRegistry;
use crate::error::{CoreError, Result};

/// Block size and count of a pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolConfig {
    /// Bytes per block: a power of two, at least 4 KiB.
    pub block_size: usize,
    /// Number of blocks.
    pub block_count: usize,
}

impl Default for PoolConfig {
    /// 8 blocks of 64 MiB (the source document's default).
    fn default() -> Self {
        PoolConfig {
            block_size: 64 << 20,
            block_count: 8,
        }
    }
}

impl PoolConfig {
    /// Bytes the pool needs (None on overflow).
    pub fn total(&self) -> Option<usize> {
        self.block_size.checked_mul(self.block_count)
    }

    /// Check the settings without allocating: the bytes the pool needs, or why they are refused.
    pub fn validate(&self) -> Result<usize> {
        if !self.block_size.is_power_of_two() || self.block_size < 4096 {
            return Err(CoreError::InvalidArgument(format!(
                "pool block size {} must be a power of two >= 4096",
                self.block_size
            )));
        }
        if self.block_count == 0 || self.block_count >= u32::MAX as usize {
            return Err(CoreError::InvalidArgument(format!(
                "pool block count {} must be 1..{}",
                self.block_count,
                u32::MAX
            )));
        }
        self.total().ok_or_else(|| {
            CoreError::InvalidArgument(format!(
                "pool of {} x {} bytes overflows",
                self.block_count, self.block_size
            ))
        })
    }
}

/// Statistics of a pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PoolStats {
    /// Bytes per block.
    pub block_size: usize,
    /// Blocks in the pool.
    pub block_count: usize,
    /// Blocks out now. With the thread cache on, blocks a thread caches count as out (no
    /// other thread can get them).
    pub in_use: usize,
    /// Most blocks ever out at once.
    pub high_water: usize,
    /// Successful gets. With the thread cache on, a thread's gets are added when its cache
    /// refills, spills, is flushed or the thread exits.
    pub allocations: u64,
    /// Gets that found the pool empty (get errors and get_timeout expiries).
    pub failures: u64,
}

/// Ids of pools, for the per-thread magazines (never reused).
static NEXT_POOL_ID: AtomicU64 = AtomicU64::new(1);

/// A fixed-block pool over one registered region.
pub struct UbPool {
    id: u64,
    /// Per-thread magazine size; 0: off.
    cache: AtomicUsize,
    region: Arc<UbRegion>,
    block_size: usize,
    /// The region is host memory ([`UbRegion::is_cpu_sliceable`]): blocks give Rust slices.
    cpu_slices: bool,
    block_count: usize,
    shift: u32,
    free: FreeStack,
    allocs: AtomicU64,
    /// Blocks off the shared stack (in buffers or thread caches).
    out: AtomicUsize,
    failures: AtomicU64,
    high_water: AtomicUsize,
    waiters: AtomicUsize,
    wait_lock: Mutex<()>,
    wait_cv: Condvar,
    /// Set when the pool created its region (with_hugepages) and unregisters it on drop.
    owner: Option<Weak<UbRegistry>>,
}

impl std::fmt::Debug for UbPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UbPool")
            .field("region", &self.region.id)
            .field("stats", &self.stats())
            .finish()
    }
}

impl UbPool {
    /// Carve `region` (registered in `registry`) into `cfg.block_count` blocks of
    /// `cfg.block_size` from its start. A region is carved once:
    /// [`CoreError::RegionTaken`] when it already backs a pool or is a driver's DMA slab
    /// (`DmaMem`), whose rings and PRP pages must never be handed out as buffers.
    pub fn new(
        registry: &Arc<UbRegistry>,
        region: Arc<UbRegion>,
        cfg: PoolConfig,
    ) -> Result<Arc<UbPool>> {
        UbPool::build(registry, region, cfg, false)
    }

    /// Allocate a hugepage region for `cfg` on `numa`, register it and carve it. The region is
    /// unregistered when the pool goes.
    pub fn with_hugepages(
        registry: &Arc<UbRegistry>,
        cfg: PoolConfig,
        numa: Option<u32>,
    ) -> Result<Arc<UbPool>> {
        let total = cfg.validate()?;
        let size = if total >= (1 << 30)
            && total % (1 << 30) == 0
            && hugepages_free(PageSize::Size1G, numa) * (1 << 30) >= total as u64
        {
            PageSize::Size1G
        } else {
            PageSize::Size2M
        };
        let region = registry.register_hugepages(total, size, numa)?;
        UbPool::build_owned(registry, region, cfg)
    }

    /// Register ordinary (non-hugepage) anonymous memory for `cfg` and carve it: for the kernel
    /// path and host-only domains, where no device DMAs through the IOMMU. The region is
    /// unregistered when the pool goes.
    pub fn with_anonymous(
        registry: &Arc<UbRegistry>,
        cfg: PoolConfig,
        numa: Option<u32>,
    ) -> Result<Arc<UbPool>> {
        let total = cfg.validate()?;
        let region = registry.register_anonymous(total, numa)?;
        UbPool::build_owned(registry, region, cfg)
    }

    /// Carve a region the pool owns; the region is unregistered again if that fails.
    fn build_owned(
        registry: &Arc<UbRegistry>,
        region: Arc<UbRegion>,
        cfg: PoolConfig,
    ) -> Result<Arc<UbPool>> {
        match UbPool::build(registry, region.clone(), cfg, true) {
            Ok(p) => Ok(p),
            Err(e) => {
                let _ = registry.unregister(region.id);
                Err(e)
            }
        }
    }

    fn build(
        registry: &Arc<UbRegistry>,
        region: Arc<UbRegion>,
        cfg: PoolConfig,
        owned: bool,
    ) -> Result<Arc<UbPool>> {
        let total = cfg.validate()?;
        if total > region.len {
            return Err(CoreError::InvalidArgument(format!(
                "pool of {} x {} bytes does not fit region {} of {} bytes",
                cfg.block_count, cfg.block_size, region.id, region.len
            )));
        }
        check_blocks_in_pieces(&region, cfg.block_size, cfg.block_count)?;
        region.claim(RegionOwner::Pool)?;
        if let Err(e) = registry.add_user(&region) {
            region.release(RegionOwner::Pool);
            return Err(e);
        }
        Ok(Arc::new(UbPool {
            id: NEXT_POOL_ID.fetch_add(1, Ordering::Relaxed),
            cache: AtomicUsize::new(0),
            shift: cfg.block_size.trailing_zeros(),
            block_size: cfg.block_size,
            cpu_slices: region.is_cpu_sliceable(),
            block_count: cfg.block_count,
            free: FreeStack::full(cfg.block_count as u32),
            region,
            allocs: AtomicU64::new(0),
            out: AtomicUsize::new(0),
            failures: AtomicU64::new(0),
            high_water: AtomicUsize::new(0),
            waiters: AtomicUsize::new(0),
            wait_lock: Mutex::new(()),
            wait_cv: Condvar::new(),
            owner: owned.then(|| Arc::downgrade(registry)),
        }))
    }

    /// Whether the CPU may hold Rust slices over the blocks ([`UbRegion::is_cpu_sliceable`]).
    #[inline]
    pub(crate) fn cpu_slices(&self) -> bool {
        self.cpu_slices
    }

    /// Bytes per block.
    #[inline]
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Blocks in the pool.
    pub fn block_count(&self) -> usize {
        self.block_count
    }

    /// The region the blocks live in.
    #[inline]
    pub fn region(&self) -> &Arc<UbRegion> {
        &self.region
    }

    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    /// Pop from the shared (lock-free) free stack, counting the block as out.
    #[inline]
    pub(crate) fn take_shared(&self) -> Option<u32> {
        let idx = self.free.pop()?;
        // Counted after the pop (and uncounted before the push): `out` never exceeds the
        // blocks really out, so high_water stays within block_count.
        let out = self.out.fetch_add(1, Ordering::Relaxed) + 1;
        if out > self.high_water.load(Ordering::Relaxed) {
            self.high_water.fetch_max(out, Ordering::Relaxed);
        }
        Some(idx)
    }

    /// Push onto the shared free stack and wake a get_timeout waiter, if any.
    #[inline]
    pub(crate) fn return_shared(&self, idx: u32) {
        self.out.fetch_sub(1, Ordering::Relaxed);
        self.free.push(idx);
        if self.waiters.load(Ordering::SeqCst) > 0 {
            let _g = self.wait_lock.lock().unwrap_or_else(|p| p.into_inner());
            self.wait_cv.notify_one();
        }
    }

    /// Count `n` gets served by a thread cache (published in batches).
    #[inline]
    pub(crate) fn add_allocs(&self, n: u64) {
        if n > 0 {
            self.allocs.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// Turn the per-thread block cache on (`per_thread` blocks per thread, 2..=256) or off (0).
    ///
    /// With it, a thread that returns and takes blocks over and over touches only its own
    /// cache: a get+put writes no cache line another thread uses (no reference count, no
    /// shared counter; see [`PoolStats`] for how the statistics follow). The price: blocks
    /// cached by one thread are invisible to the others, so `get` can report exhaustion (and
    /// `get_timeout` keep waiting) while another thread's cache holds free blocks, and cached
    /// blocks keep the pool alive: call [`UbPool::flush_thread_cache`] on each thread that used
    /// the pool before dropping it (a thread's cache is also given back when the thread exits).
    /// Use it only for pools with many more blocks than threads x `per_thread`; set it before
    /// the pool is used. See BENCHMARKS.md for what it saves.
    pub fn set_thread_cache(&self, per_thread: usize) -> Result<()> {
        if per_thread != 0 && !(2..=256).contains(&per_thread) {
            return Err(CoreError::InvalidArgument(format!(
                "thread cache of {per_thread} blocks: use 0 (off) or 2..=256"
            )));
        }
        if per_thread * 4 > self.block_count {
            return Err(CoreError::InvalidArgument(format!(
                "thread cache of {per_thread} blocks on a pool of {}: needs at least 4x as many blocks",
                self.block_count
            )));
        }
        thread_cache::flush(self);
        self.cache.store(per_thread, Ordering::Relaxed);
        Ok(())
    }

    /// Give this thread's cached blocks back to the shared stack (no-op without a cache).
    pub fn flush_thread_cache(&self) {
        thread_cache::flush(self);
    }

    #[inline]
    fn take(self: &Arc<Self>) -> Option<UbBuf> {
        let cap = self.cache.load(Ordering::Relaxed);
        let (idx, me) = if cap == 0 {
            let idx = self.take_shared()?;
            self.allocs.fetch_add(1, Ordering::Relaxed);
            (idx, self.clone())
        } else {
            thread_cache::get(self, cap)?
        };
        let off = (idx as usize) << self.shift;
        Some(UbBuf::new(
            me,
            idx,
            self.region.vaddr.wrapping_add(off),
            self.region.iova_at(off),
        ))
    }

    fn exhausted(&self, waited: Option<Duration>) -> CoreError {
        self.failures.fetch_add(1, Ordering::Relaxed);
        CoreError::PoolExhausted {
            block_count: self.block_count,
            block_size: self.block_size,
            waited,
        }
    }

    /// Take a free block, or [`CoreError::PoolExhausted`] at once when none is free.
    #[inline]
    pub fn get(self: &Arc<Self>) -> Result<UbBuf> {
        match self.take() {
            Some(b) => Ok(b),
            None => Err(self.exhausted(None)),
        }
    }

    /// Take a free block, waiting up to `d` for one to come back.
    pub fn get_timeout(self: &Arc<Self>, d: Duration) -> Result<UbBuf> {
        if let Some(b) = self.take() {
            return Ok(b);
        }
        let start = Instant::now();
        let deadline = start.checked_add(d);
        let mut g = self.wait_lock.lock().unwrap_or_else(|p| p.into_inner());
        self.waiters.fetch_add(1, Ordering::SeqCst);
        // Pairs with put(): its push is ordered before its waiter check, our registration
        // before our retry, so a put either sees us waiting or we see its block.
        std::sync::atomic::fence(Ordering::SeqCst);
        let out = loop {
            if let Some(b) = self.take() {
                break Ok(b);
            }
            let now = Instant::now();
            let left = match deadline {
                Some(dl) if now >= dl => break Err(self.exhausted(Some(now - start))),
                Some(dl) => dl - now,
                None => Duration::from_secs(3600),
            };
            g = self
                .wait_cv
                .wait_timeout(g, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        };
        self.waiters.fetch_sub(1, Ordering::SeqCst);
        drop(g);
        out
    }

    /// Return block `idx` with the buffer's strong count of the pool (from UbBuf::drop).
    #[inline]
    pub(crate) fn put(this: Arc<Self>, idx: u32) {
        let cap = this.cache.load(Ordering::Relaxed);
        if cap == 0 {
            this.return_shared(idx);
        } else {
            thread_cache::put(this, cap, idx);
        }
    }

    /// A snapshot of the statistics.
    pub fn stats(&self) -> PoolStats {
        let allocs = self.allocs.load(Ordering::Relaxed);
        PoolStats {
            block_size: self.block_size,
            block_count: self.block_count,
            in_use: self.out.load(Ordering::Relaxed),
            high_water: self.high_water.load(Ordering::Relaxed),
            allocations: allocs,
            failures: self.failures.load(Ordering::Relaxed),
        }
    }
}

impl Drop for UbPool {
    fn drop(&mut self) {
        self.region.remove_user();
        self.region.release(RegionOwner::Pool);
        if let Some(reg) = self.owner.as_ref().and_then(Weak::upgrade) {
            if let Err(e) = reg.unregister(self.region.id) {
                tracing::warn!(
                    region = self.region.id,
                    "pool could not unregister its region: {e}"
                );
            }
        }
    }
}

/// Every block of a region in pieces (no-IOMMU memory whose hugepages are physically
/// scattered) must lie inside one piece, so that each buffer is one bus address range: blocks
/// that divide the hugepage size always do; others are refused, naming the first that does not.
fn check_blocks_in_pieces(region: &UbRegion, block_size: usize, count: usize) -> Result<()> {
    // A block crosses a piece's end exactly when that end lies strictly inside it.
    let total = block_size * count;
    for g in region.segments.iter().skip(1) {
        if g.offset < total && g.offset % block_size != 0 {
            let i = g.offset / block_size;
            let off = i * block_size;
            return Err(CoreError::InvalidArgument(format!(
                "block {i} of {block_size} bytes (bytes {off:#x}..{:#x} of region {}) crosses a physical discontinuity at {:#x}: the region's hugepages are scattered in physical memory, and without an IOMMU a buffer must be one physical range; use a block size that divides the hugepage size, or 1 GiB hugepages",
                off + block_size,
                region.id,
                g.offset
            )));
        }
    }
    Ok(())
}

fn hugepages_free(size: PageSize, numa: Option<u32>) -> u64 {
    ubdirect_hugepages::pools()
        .ok()
        .and_then(|ps| ps.into_iter().find(|p| p.size == size && p.node == numa))
        .map(|p| p.free)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vfio::DmaDomain;
    use proptest::prelude::*;
    use std::collections::HashSet;

    fn pool(bs: usize, n: usize) -> (Arc<UbRegistry>, Arc<UbPool>) {
        let reg = UbRegistry::new(DmaDomain::host_only());
        let r = reg.register_anonymous(bs * n, None).unwrap();
        let p = UbPool::new(
            &reg,
            r,
            PoolConfig {
                block_size: bs,
                block_count: n,
            },
        )
        .unwrap();
        (reg, p)
    }

    #[test]
    fn in_use_counts_a_block_taken_and_not_one_returned() {
        let (_reg, p) = pool(4096, 4);
        let kept = p.get().unwrap();
        drop(p.get().unwrap());
        assert_eq!(p.stats().in_use, 1);
        drop(kept);
        assert_eq!(p.stats().in_use, 0);
    }

    #[test]
    fn blocks_are_distinct_and_inside_the_region() {
        let (_reg, p) = pool(4096, 16);
        let bufs: Vec<UbBuf> = (0..16).map(|_| p.get().unwrap()).collect();
        let iovas: HashSet<u64> = bufs.iter().map(|b| b.iova()).collect();
        assert_eq!(iovas.len(), 16);
        for b in &bufs {
            assert!(b.region().contains_iova(b.iova(), b.len()));
            assert_eq!((b.iova() - b.region().iova) % 4096, 0);
            assert_eq!(
                b.as_ptr() as usize - b.region().vaddr as usize,
                (b.iova() - b.region().iova) as usize
            );
        }
        let e = p.get().unwrap_err();
        assert!(
            e.to_string()
                .contains("all 16 blocks of 4096 bytes are in use"),
            "{e}"
        );
        let s = p.stats();
        assert_eq!(
            (s.in_use, s.high_water, s.allocations, s.failures),
            (16, 16, 16, 1)
        );
        drop(bufs);
        let s = p.stats();
        assert_eq!((s.in_use, s.high_water), (0, 16));
    }

    #[test]
    fn a_pool_over_scattered_pieces_gives_each_buffer_its_pieces_bus_address() {
        use crate::vfio::DmaSegment;
        let reg = UbRegistry::new(DmaDomain::host_only());
        let mb2 = 2 << 20;
        // Three 2 MiB "hugepages": 0 and 1 contiguous (one piece), 2 elsewhere.
        let pieces = vec![
            DmaSegment {
                offset: 0,
                len: 2 * mb2,
                iova: 0x1_0000_0000,
            },
            DmaSegment {
                offset: 2 * mb2,
                len: mb2,
                iova: 0x4000_0000,
            },
        ];
        let r = reg.register_in_pieces(pieces.clone()).unwrap();
        let pool = UbPool::new(
            &reg,
            r.clone(),
            PoolConfig {
                block_size: 1 << 20,
                block_count: 6,
            },
        )
        .unwrap();
        let bufs: Vec<UbBuf> = (0..6).map(|_| pool.get().unwrap()).collect();
        for b in &bufs {
            let off = b.as_ptr() as usize - r.vaddr as usize;
            let piece = pieces
                .iter()
                .find(|g| g.holds(off, b.len()))
                .expect("inside one piece");
            assert_eq!(b.iova(), piece.iova + (off - piece.offset) as u64);
            assert_eq!(reg.iova_of(b.as_ptr()), Some(b.iova()));
            assert!(r.contains_iova(b.iova(), b.len()));
        }
        let iovas: HashSet<u64> = bufs.iter().map(|b| b.iova()).collect();
        assert!(iovas.contains(&0x4000_0000) && iovas.contains(&0x4010_0000));
        drop(bufs);
        drop(pool);
        // 4 MiB blocks would put block 1 across the end of piece 0 and the start of piece 1:
        // refused, naming it, and the region stays free for another pool.
        let r2 = reg
            .register_in_pieces(vec![
                DmaSegment {
                    offset: 0,
                    len: mb2,
                    iova: 0x2_0000_0000,
                },
                DmaSegment {
                    offset: mb2,
                    len: 3 * mb2,
                    iova: 0x6000_0000,
                },
            ])
            .unwrap();
        let e = UbPool::new(
            &reg,
            r2.clone(),
            PoolConfig {
                block_size: 4 << 20,
                block_count: 2,
            },
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("block 0 of 4194304 bytes"), "{e}");
        assert!(
            e.contains("crosses a physical discontinuity at 0x200000"),
            "{e}"
        );
        assert!(e.contains("divides the hugepage size"), "{e}");
        assert_eq!(r2.owner(), None, "a refusal changes nothing");
        UbPool::new(
            &reg,
            r2,
            PoolConfig {
                block_size: mb2,
                block_count: 4,
            },
        )
        .unwrap();
    }

    #[test]
    fn buffers_are_writable_and_keep_their_data() {
        let (_reg, p) = pool(8192, 2);
        let mut a = p.get().unwrap();
        let mut b = p.get().unwrap();
        a.as_mut_slice().fill(0xaa);
        b.as_mut_slice().fill(0x55);
        assert!(a.as_slice().iter().all(|&x| x == 0xaa));
        assert!(b.as_slice().iter().all(|&x| x == 0x55));
        assert_eq!(a.len(), 8192);
    }

    #[test]
    fn bad_configs_are_refused_and_change_nothing() {
        let reg = UbRegistry::new(DmaDomain::host_only());
        let r = reg.register_anonymous(1 << 16, None).unwrap();
        for (bs, n, why) in [
            (3000, 4, "power of two"),
            (2048, 4, "power of two >= 4096"),
            (4096, 0, "block count"),
            (1 << 16, 2, "does not fit"),
        ] {
            let e = UbPool::new(
                &reg,
                r.clone(),
                PoolConfig {
                    block_size: bs,
                    block_count: n,
                },
            )
            .unwrap_err();
            assert!(e.to_string().contains(why), "{e}");
        }
        assert_eq!(r.users(), 0);
    }

    #[test]
    fn a_region_backs_one_pool_only() {
        let (reg, p) = pool(4096, 4);
        let r = p.region().clone();
        assert_eq!(r.owner(), Some(RegionOwner::Pool));
        let cfg = PoolConfig {
            block_size: 4096,
            block_count: 2,
        };
        let e = UbPool::new(&reg, r.clone(), cfg).unwrap_err();
        assert!(
            matches!(e, CoreError::RegionTaken { owner: RegionOwner::Pool, id } if id == r.id),
            "{e}"
        );
        assert!(e.to_string().contains("register another region"), "{e}");
        assert_eq!(r.users(), 1, "the refusal changed nothing");
        drop(p);
        assert_eq!(r.owner(), None, "the pool released the region");
        let again = UbPool::new(&reg, r.clone(), cfg).unwrap();
        assert_eq!(again.get().unwrap().iova(), r.iova);
    }

    #[test]
    fn driver_dma_slabs_are_never_pooled() {
        let reg = UbRegistry::new(DmaDomain::host_only());
        let ring = crate::ub::DmaMem::alloc(&reg, 4096).unwrap();
        let slab = ring.region().clone();
        assert_eq!(slab.owner(), Some(RegionOwner::DmaSlab));
        let users = slab.users();
        let e = UbPool::new(
            &reg,
            slab.clone(),
            PoolConfig {
                block_size: 4096,
                block_count: 4,
            },
        )
        .unwrap_err();
        assert!(
            matches!(
                e,
                CoreError::RegionTaken {
                    owner: RegionOwner::DmaSlab,
                    ..
                }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("DMA slab"), "{e}");
        assert_eq!(slab.users(), users, "the refusal changed nothing");
        drop(ring);
        assert_eq!(
            slab.owner(),
            Some(RegionOwner::DmaSlab),
            "a slab stays a slab"
        );
    }

    #[test]
    fn pool_holds_its_region_registered() {
        let (reg, p) = pool(4096, 4);
        let id = p.region().id;
        assert!(matches!(
            reg.unregister(id),
            Err(CoreError::RegionBusy { .. })
        ));
        let b = p.get().unwrap();
        drop(p); // the buffer keeps the pool alive
        assert!(matches!(
            reg.unregister(id),
            Err(CoreError::RegionBusy { .. })
        ));
        drop(b);
        reg.unregister(id).unwrap();
    }

    #[test]
    fn get_timeout_honours_the_deadline() {
        let (_reg, p) = pool(4096, 1);
        let held = p.get().unwrap();
        let t = Instant::now();
        let e = p.get_timeout(Duration::from_millis(30)).unwrap_err();
        let waited = t.elapsed();
        assert!(
            waited >= Duration::from_millis(30),
            "returned early after {waited:?}"
        );
        assert!(
            matches!(e, CoreError::PoolExhausted { waited: Some(w), .. } if w >= Duration::from_millis(30))
        );
        assert_eq!(p.stats().failures, 1);
        drop(held);
        assert!(p.get_timeout(Duration::ZERO).is_ok());
    }

    #[test]
    fn get_timeout_wakes_when_a_buffer_returns() {
        let (_reg, p) = pool(4096, 1);
        let held = p.get().unwrap();
        let p2 = p.clone();
        let h =
            std::thread::spawn(move || p2.get_timeout(Duration::from_secs(20)).map(|b| b.index()));
        std::thread::sleep(Duration::from_millis(20));
        drop(held);
        assert_eq!(h.join().unwrap().unwrap(), 0);
    }

    #[test]
    fn threads_never_get_the_same_block() {
        let (_reg, p) = pool(4096, 8);
        let hs: Vec<_> = (0..4)
            .map(|t| {
                let p = p.clone();
                std::thread::spawn(move || {
                    for i in 0..5000u32 {
                        if let Ok(mut b) = p.get() {
                            let tag = (t << 24) | i;
                            b.as_mut_slice()[..4].copy_from_slice(&tag.to_ne_bytes());
                            std::hint::spin_loop();
                            assert_eq!(&b.as_slice()[..4], &tag.to_ne_bytes(), "block shared");
                        }
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        let s = p.stats();
        assert_eq!(s.in_use, 0);
        assert!(s.high_water <= 8);
    }

    #[test]
    fn with_hugepages_refuses_clearly_or_owns_its_region() {
        let reg = UbRegistry::new(DmaDomain::host_only());
        let cfg = PoolConfig {
            block_size: 1 << 20,
            block_count: 4,
        };
        match UbPool::with_hugepages(&reg, cfg, None) {
            Ok(p) => {
                assert_eq!(reg.regions().len(), 1);
                drop(p);
                assert!(
                    reg.regions().is_empty(),
                    "region unregistered with its pool"
                );
                assert_eq!(reg.domain().mapping_count(), 0);
            }
            Err(e) => assert!(e.to_string().contains("hugepages"), "{e}"),
        }
    }

    #[test]
    fn thread_cache_keeps_blocks_distinct_and_flushes() {
        let (_reg, p) = pool(4096, 64);
        assert!(p.set_thread_cache(1).is_err());
        assert!(p.set_thread_cache(32).is_err(), "needs 4x blocks");
        p.set_thread_cache(8).unwrap();
        let bufs: Vec<UbBuf> = (0..64).map(|_| p.get().unwrap()).collect();
        let idx: HashSet<u32> = bufs.iter().map(|b| b.index()).collect();
        assert_eq!(idx.len(), 64);
        assert!(p.get().is_err());
        drop(bufs);
        assert_eq!(
            p.stats().in_use,
            8,
            "the 8 blocks this thread's full cache holds count as out"
        );
        // Another thread sees the blocks this thread's cache does not hold (at most 8 cached).
        let p2 = p.clone();
        let n = std::thread::spawn(move || {
            let v: Vec<UbBuf> = std::iter::from_fn(|| p2.get().ok()).collect();
            v.len()
        })
        .join()
        .unwrap();
        assert_eq!(n, 56);
        p.flush_thread_cache();
        let p3 = p.clone();
        let n = std::thread::spawn(move || {
            std::iter::from_fn(|| p3.get().ok())
                .collect::<Vec<_>>()
                .len()
        })
        .join()
        .unwrap();
        assert_eq!(
            n, 64,
            "a thread's exit and a flush return every cached block"
        );
    }

    #[test]
    fn a_cached_get_put_touches_no_shared_counter_or_reference_count() {
        let (_reg, p) = pool(4096, 64);
        p.set_thread_cache(8).unwrap();
        drop(p.get().unwrap()); // the first get fills this thread's cache
        let strong = Arc::strong_count(&p);
        let before = p.stats();
        for _ in 0..1000 {
            let b = p.get().unwrap();
            assert_eq!(Arc::strong_count(&p), strong, "get cloned the pool's Arc");
            drop(b);
        }
        assert_eq!(Arc::strong_count(&p), strong, "put dropped an Arc");
        assert_eq!(p.stats(), before, "a shared counter moved");
        p.flush_thread_cache();
        let s = p.stats();
        assert_eq!(
            (s.allocations, s.in_use),
            (1001, 0),
            "flush publishes the counts"
        );
        assert_eq!(
            Arc::strong_count(&p),
            1,
            "cached blocks gave their counts back"
        );
    }

    #[test]
    fn cached_blocks_release_a_dropped_pool_and_its_region() {
        let reg = UbRegistry::new(DmaDomain::host_only());
        let cfg = PoolConfig {
            block_size: 4096,
            block_count: 16,
        };
        let p = UbPool::with_anonymous(&reg, cfg, None).unwrap();
        p.set_thread_cache(4).unwrap();
        drop(p.get().unwrap());
        let gone = Arc::downgrade(&p);
        drop(p);
        assert!(
            gone.upgrade().is_some(),
            "this thread's cached blocks hold it"
        );
        // The next magazine this thread opens releases pools only its cache keeps alive.
        let q = UbPool::with_anonymous(&reg, cfg, None).unwrap();
        q.set_thread_cache(4).unwrap();
        drop(q.get().unwrap());
        assert!(gone.upgrade().is_none(), "the dropped pool was released");
        assert_eq!(reg.regions().len(), 1, "and its region unregistered");
        // A thread's exit gives its cache back.
        let q2 = q.clone();
        std::thread::spawn(move || drop(q2.get().unwrap()))
            .join()
            .unwrap();
        q.flush_thread_cache();
        assert_eq!(q.stats().in_use, 0);
        assert_eq!(Arc::strong_count(&q), 1);
    }

    #[test]
    fn thread_cache_under_threads_never_shares_a_block() {
        let (_reg, p) = pool(4096, 64);
        p.set_thread_cache(4).unwrap();
        let hs: Vec<_> = (0..4)
            .map(|t| {
                let p = p.clone();
                std::thread::spawn(move || {
                    for i in 0..5000u32 {
                        let mut held = Vec::new();
                        for _ in 0..3 {
                            if let Ok(mut b) = p.get() {
                                let tag = (t << 24) | i;
                                b.as_mut_slice()[..4].copy_from_slice(&tag.to_ne_bytes());
                                held.push((b, tag));
                            }
                        }
                        for (b, tag) in &held {
                            assert_eq!(&b.as_slice()[..4], &tag.to_ne_bytes(), "block shared");
                        }
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        assert_eq!(p.stats().in_use, 0);
        let all = std::iter::from_fn(|| p.get().ok())
            .collect::<Vec<_>>()
            .len();
        assert_eq!(all, 64, "threads exited: caches flushed");
    }

    #[derive(Debug, Clone)]
    enum Op {
        Get,
        Put(prop::sample::Index),
    }

    proptest! {
        #[test]
        fn stats_match_a_model(ops in proptest::collection::vec(prop_oneof![Just(Op::Get), any::<prop::sample::Index>().prop_map(Op::Put)], 1..300)) {
            let (_reg, p) = pool(4096, 6);
            let mut held: Vec<UbBuf> = Vec::new();
            let (mut allocs, mut fails, mut hw) = (0u64, 0u64, 0usize);
            for op in ops {
                match op {
                    Op::Get => match p.get() {
                        Ok(b) => {
                            prop_assert!(held.iter().all(|h| h.index() != b.index()), "handed out twice");
                            held.push(b);
                            allocs += 1;
                            hw = hw.max(held.len());
                        }
                        Err(_) => {
                            prop_assert_eq!(held.len(), 6);
                            fails += 1;
                        }
                    },
                    Op::Put(i) => if !held.is_empty() { held.swap_remove(i.index(held.len())); },
                }
                let s = p.stats();
                prop_assert_eq!(s.in_use, held.len());
                prop_assert_eq!(s.allocations, allocs);
                prop_assert_eq!(s.failures, fails);
                prop_assert_eq!(s.high_water, hw);
            }
        }
    }
}
