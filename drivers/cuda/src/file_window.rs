//! File windows: a range of a file mapped read-only (MAP_SHARED, so the mapping *is* the page
//! cache) and pinned once for device DMA, kept in a [`FileWindowRegistry`] keyed by
//! (file identity, range), reused across passes and evicted least-recently-used beyond a byte cap.
//!
//! The pinning step is a [`HostPinner`]: `cuMemHostRegister(READ_ONLY)` on a GPU machine
//! ([`crate::CudaHostPinner`]); tests use a recording fake so the registry logic runs without
//! libcuda.
//!
//! Change detection: every [`FileWindowRegistry::acquire`] and [`FileWindowRegistry::check`]
//! fstat()s the file and compares size and mtime with what they were when its windows were
//! mapped. A change invalidates every window of that file and is reported as
//! [`WindowError::FileChanged`] (the caller ends the pass; the next acquire maps the new
//! contents). Between two checks, a truncation does not crash the process: nothing reads a
//! window from the CPU (the copy engines read it), and the pinned pages stay allocated while
//! pinned, so copies in flight read the pages as they were before the truncation (stale data,
//! except the tail of the last page past the new end, which the kernel zeroes; never a SIGBUS;
//! the next check reports the change).
//!
//! The IOMMU domain: a registry made with [`FileWindowRegistry::with_ub_registry`] maps each
//! window as a read-only UB file region ([`UbRegistry::register_file`]), so one mapping is
//! registered with CUDA *and* mapped in the VFIO IOMMU domain for device reads only: an NVMe
//! controller or a NIC of that domain can DMA from the window too ([`FileWindow::iova`]). The
//! region owns the file mapping (the IOMMU mapping goes first, then the process mapping); the
//! window pins the region's memory with its [`HostPinner`] and unregisters the region when it
//! goes. Why not a second [`HostPinner`] doing the IOMMU part: a pinner sees an address and a
//! length only, so it could register an anonymous "external" region without the file's
//! identity or stamp, and would not own the mapping it maps; the UB file region keeps both.
//! Without a UB registry, windows are host-pinned for CUDA only.

use std::collections::HashMap;
use std::fs::File;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use ubdirect_core::ub::{cpu_page_size, stat_file, ReadOnlyFileMap};
use ubdirect_core::{CoreError, UbRegion, UbRegistry};

pub use ubdirect_core::ub::FileStamp;

/// Pins host memory for device DMA (and unpins it).
pub trait HostPinner: Send + Sync {
    /// Pin `[ptr, ptr + len)` (page aligned) read-only for DMA by the device(s).
    fn pin(&self, ptr: *const u8, len: usize) -> Result<(), String>;
    /// Undo [`HostPinner::pin`] for exactly that range.
    fn unpin(&self, ptr: *const u8, len: usize);
}

/// Which file (device and inode numbers).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FileIdentity {
    /// st_dev.
    pub dev: u64,
    /// st_ino.
    pub ino: u64,
}

fn stat(file: &File) -> std::io::Result<(FileIdentity, FileStamp)> {
    let (dev, ino, stamp) = stat_file(file)?;
    Ok((FileIdentity { dev, ino }, stamp))
}

/// Registry key: a file and a byte range of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct WindowKey {
    /// The file.
    pub file: FileIdentity,
    /// First byte of the range.
    pub offset: u64,
    /// Length of the range.
    pub len: u64,
}

/// Why a window could not be had.
#[derive(Debug, thiserror::Error)]
pub enum WindowError {
    /// fstat/mmap failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The OS error.
        source: std::io::Error,
    },
    /// The range is empty or runs past the end of the file.
    #[error(
        "bytes {offset}..{end} are not inside the file ({size} bytes): pick a range within it"
    )]
    OutOfRange {
        /// Range start.
        offset: u64,
        /// Range end.
        end: u64,
        /// File size.
        size: u64,
    },
    /// The window alone exceeds the registry's cap.
    #[error("a {len}-byte window exceeds the {cap}-byte cap on registered file mappings (raise the cap given to FileWindowRegistry::new, or use smaller windows)")]
    TooLarge {
        /// Window length.
        len: u64,
        /// The cap.
        cap: u64,
    },
    /// The file changed (size or mtime) since its windows were mapped; they were dropped.
    #[error("the file changed while registered (size {old_size} -> {new_size} bytes{}): its {dropped} registered window(s) were dropped; run again to map the new contents", if *.mtime_changed { ", modified" } else { "" })]
    FileChanged {
        /// Size when mapped.
        old_size: u64,
        /// Size now.
        new_size: u64,
        /// Whether the modification time moved.
        mtime_changed: bool,
        /// Windows invalidated.
        dropped: usize,
    },
    /// The pinner (cuMemHostRegister) refused the mapping.
    #[error("registering the file mapping for DMA failed: {0}")]
    Pin(String),
    /// The UB registry (IOMMU domain) refused the file region.
    #[error("registering the file window in the DMA domain failed: {0}")]
    Ub(#[from] CoreError),
    /// The range is already a UB file region of someone else in the UB registry.
    #[error("file bytes {offset}..{end} are already registered as UB region {region} by another user of the UB registry: use that region, or get the window from this FileWindowRegistry only")]
    RegisteredElsewhere {
        /// Mapped range start (page aligned).
        offset: u64,
        /// Mapped range end.
        end: u64,
        /// The region.
        region: u32,
    },
}

/// What [`FileWindowRegistry::acquire_counted`] hands out.
#[derive(Debug, Clone)]
pub struct Acquired {
    /// The window.
    pub window: Arc<FileWindow>,
    /// True when this call mapped and registered it (false: it was registered already).
    pub registered: bool,
}

/// A mapped, pinned file range. Unpinned and unmapped when the last holder drops it.
pub struct FileWindow {
    map_base: *const u8,
    map_len: usize,
    data: *const u8,
    key: WindowKey,
    stamp: FileStamp,
    pinner: Arc<dyn HostPinner>,
    /// The UB file region owning the mapping, when the registry has a UB registry.
    ub: Option<(Arc<UbRegistry>, Arc<UbRegion>)>,
    /// The window's own mapping, when there is no UB registry (unmapped by `Drop` after the
    /// unpin).
    own: Option<ReadOnlyFileMap>,
}

// SAFETY: the window is an immutable read-only mapping; the raw pointers are addresses only,
// never dereferenced through &self methods other than as DMA sources.
unsafe impl Send for FileWindow {}
// SAFETY: as above: nothing in the window is mutated after construction.
unsafe impl Sync for FileWindow {}

impl std::fmt::Debug for FileWindow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileWindow")
            .field("key", &self.key)
            .field("stamp", &self.stamp)
            .finish()
    }
}

impl FileWindow {
    fn map(
        file: &File,
        key: WindowKey,
        stamp: FileStamp,
        pinner: &Arc<dyn HostPinner>,
        ub: Option<&Arc<UbRegistry>>,
        populate: bool,
    ) -> Result<FileWindow, WindowError> {
        let page = cpu_page_size() as u64;
        let base_off = key.offset / page * page;
        let lead = (key.offset - base_off) as usize;
        let map_len = (lead as u64 + key.len).next_multiple_of(page) as usize;
        if let Some(ub) = ub {
            return FileWindow::map_in_ub(file, key, stamp, pinner, ub, base_off, lead);
        }
        // Dropped (unmapped) on an error below: not pinned, not shared.
        let map = map_readonly(file, base_off, map_len)?;
        let base = map.as_ptr();
        if populate {
            populate_read(base, map_len);
        }
        pinner.pin(base, map_len).map_err(WindowError::Pin)?;
        Ok(FileWindow {
            map_base: base,
            map_len,
            // SAFETY: lead < page <= map_len: inside the mapping.
            data: unsafe { base.add(lead) },
            key,
            stamp,
            pinner: pinner.clone(),
            ub: None,
            own: Some(map),
        })
    }

    /// [`FileWindow::map`] through the UB registry: the file region maps the range (read-only,
    /// in the IOMMU for device reads), then the pinner pins the region's memory.
    fn map_in_ub(
        file: &File,
        key: WindowKey,
        stamp: FileStamp,
        pinner: &Arc<dyn HostPinner>,
        ub: &Arc<UbRegistry>,
        base_off: u64,
        lead: usize,
    ) -> Result<FileWindow, WindowError> {
        let flen = lead as u64 + key.len;
        if let Some(r) = ub.file_region(file, base_off, flen)? {
            return Err(WindowError::RegisteredElsewhere {
                offset: base_off,
                end: base_off + flen,
                region: r.id,
            });
        }
        let region = ub.register_file(file, base_off, flen)?;
        if let Err(e) = pinner.pin(region.vaddr, region.len) {
            let _ = ub.unregister(region.id);
            return Err(WindowError::Pin(e));
        }
        Ok(FileWindow {
            map_base: region.vaddr,
            map_len: region.len,
            // SAFETY: lead < page <= region.len: inside the region's mapping.
            data: unsafe { region.vaddr.add(lead) },
            key,
            stamp,
            pinner: pinner.clone(),
            ub: Some((ub.clone(), region)),
            own: None,
        })
    }

    /// The device (IOVA) address of the window's first byte in the UB registry's DMA domain,
    /// when the registry has one ([`FileWindowRegistry::with_ub_registry`]).
    pub fn iova(&self) -> Option<u64> {
        let (_, r) = self.ub.as_ref()?;
        Some(r.iova + (self.data as usize - r.vaddr as usize) as u64)
    }

    /// The UB file region holding the window, when the registry has a UB registry.
    pub fn region(&self) -> Option<&Arc<UbRegion>> {
        self.ub.as_ref().map(|(_, r)| r)
    }

    /// Address of the window's first byte (file offset `key().offset`), for DMA.
    pub fn as_ptr(&self) -> *const u8 {
        self.data
    }

    /// Length of the range in bytes.
    pub fn len(&self) -> usize {
        self.key.len as usize
    }

    /// Never empty (the registry refuses empty ranges).
    pub fn is_empty(&self) -> bool {
        self.key.len == 0
    }

    /// The registry key (file and range).
    pub fn key(&self) -> WindowKey {
        self.key
    }

    /// Bytes mapped and pinned (the range rounded out to pages).
    pub fn pinned_len(&self) -> usize {
        self.map_len
    }
}

impl Drop for FileWindow {
    fn drop(&mut self) {
        // No copy from the window is in flight: every holder keeps its Arc until its copies
        // completed.
        self.pinner.unpin(self.map_base, self.map_len);
        // The window's own mapping goes once unpinned.
        drop(self.own.take());
        if let Some((ub, r)) = self.ub.take() {
            // The region owns the mapping: IOMMU unmap now, munmap when `r` (the last Arc) goes.
            if let Err(e) = ub.unregister(r.id) {
                tracing::error!(
                    region = r.id,
                    "unregistering a file window's UB region: {e}"
                );
            }
        }
    }
}

/// Fault the page tables of `[p, p + len)` in (MADV_POPULATE_READ) before the pinner walks
/// them; best effort (older kernels refuse it, and the pinner faults them itself).
fn populate_read(p: *const u8, len: usize) {
    // SAFETY: `[p, p + len)` is a live read-only mapping owned by the caller; populating reads
    // only fault pages in.
    let r = unsafe { libc::madvise(p.cast_mut().cast(), len, libc::MADV_POPULATE_READ) };
    if r != 0 {
        tracing::debug!("MADV_POPULATE_READ: {}", std::io::Error::last_os_error());
    }
}

fn map_readonly(file: &File, off: u64, len: usize) -> Result<ReadOnlyFileMap, WindowError> {
    ReadOnlyFileMap::new(file, off, len).map_err(|source| WindowError::Io {
        what: "mmap of the file range",
        source,
    })
}

/// Fraction (0..=1) of the pages of `[offset, offset + len)` of `file` that are in the page
/// cache (mincore over a temporary mapping; touches no page). Empty ranges count as resident.
pub fn resident_fraction(file: &File, offset: u64, len: u64) -> std::io::Result<f64> {
    if len == 0 {
        return Ok(1.0);
    }
    let page = cpu_page_size() as u64;
    let base_off = offset / page * page;
    let map_len = (offset - base_off + len).next_multiple_of(page) as usize;
    let map = ReadOnlyFileMap::new(file, base_off, map_len)?;
    let pages = map_len / page as usize;
    let mut vec = vec![0u8; pages];
    // SAFETY: `map` maps `map_len` bytes; `vec` has one byte per page of it.
    let r = unsafe { libc::mincore(map.as_ptr().cast_mut().cast(), map_len, vec.as_mut_ptr()) };
    let err = std::io::Error::last_os_error();
    drop(map);
    if r != 0 {
        return Err(err);
    }
    let resident = vec.iter().filter(|&&b| b & 1 != 0).count();
    Ok(resident as f64 / pages as f64)
}

/// Counters of a registry.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RegistryStats {
    /// Windows mapped and pinned.
    pub registered: u64,
    /// Acquires served by a window already registered.
    pub reused: u64,
    /// Windows dropped to stay under the cap.
    pub evicted: u64,
    /// Windows dropped because their file changed.
    pub invalidated: u64,
    /// Time spent mapping and pinning, in nanoseconds.
    pub register_ns: u64,
}

struct Entry {
    win: Arc<FileWindow>,
    last_use: u64,
}

#[derive(Default)]
struct Inner {
    windows: HashMap<WindowKey, Entry>,
    held: u64,
    clock: u64,
    stats: RegistryStats,
    /// Windows dropped from the registry (evicted, cleared) that a caller may still hold: an
    /// acquire of the same key takes such a window back instead of mapping the range twice.
    parked: HashMap<WindowKey, Weak<FileWindow>>,
}

/// Registered file windows, shared by every pass (and every user) of the process.
pub struct FileWindowRegistry {
    pinner: Arc<dyn HostPinner>,
    cap: u64,
    populate: std::sync::atomic::AtomicBool,
    ub: Option<Arc<UbRegistry>>,
    inner: Mutex<Inner>,
}

impl std::fmt::Debug for FileWindowRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileWindowRegistry")
            .field("cap", &self.cap)
            .field("held", &self.held_bytes())
            .finish()
    }
}

impl FileWindowRegistry {
    /// A registry pinning through `pinner`, keeping at most `cap` bytes of windows registered
    /// (windows still held by a caller stay pinned until that caller drops them).
    pub fn new(pinner: Arc<dyn HostPinner>, cap: u64) -> FileWindowRegistry {
        FileWindowRegistry {
            pinner,
            cap,
            populate: std::sync::atomic::AtomicBool::new(false),
            ub: None,
            inner: Mutex::new(Inner::default()),
        }
    }

    /// [`FileWindowRegistry::new`] whose windows are also UB file regions of `ub`: mapped in
    /// its DMA domain (IOMMU, READ permission only) so devices of that domain can DMA from
    /// them ([`FileWindow::iova`]), and pinned by `pinner` (CUDA) over the same mapping.
    pub fn with_ub_registry(
        pinner: Arc<dyn HostPinner>,
        cap: u64,
        ub: Arc<UbRegistry>,
    ) -> FileWindowRegistry {
        FileWindowRegistry {
            ub: Some(ub),
            ..FileWindowRegistry::new(pinner, cap)
        }
    }

    /// Fault each new window's page tables in (MADV_POPULATE_READ) before pinning it, outside
    /// the pinner (off by default). Worth it when several threads acquire at once and the pinner
    /// runs one pin at a time (CUDA's registration does): one thread faults while another pins.
    /// A single thread is faster without it (the pinner faults the pages itself).
    pub fn set_populate(&self, on: bool) {
        self.populate
            .store(on, std::sync::atomic::Ordering::Relaxed);
    }

    /// The UB registry windows are registered in, if any.
    pub fn ub_registry(&self) -> Option<&Arc<UbRegistry>> {
        self.ub.as_ref()
    }

    /// The byte cap.
    pub fn cap(&self) -> u64 {
        self.cap
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The window for `[offset, offset + len)` of `file`: the registered one when there is one
    /// (and the file has not changed), else a new mapping, pinned, registered. Evicts the least
    /// recently used windows beyond the cap first.
    pub fn acquire(
        &self,
        file: &File,
        offset: u64,
        len: u64,
    ) -> Result<Arc<FileWindow>, WindowError> {
        self.acquire_counted(file, offset, len).map(|a| a.window)
    }

    /// [`FileWindowRegistry::acquire`], also telling whether this call registered the window
    /// (rather than finding it registered). Several threads may acquire at once: the mapping
    /// and pinning of a new window happen outside the registry's lock.
    pub fn acquire_counted(
        &self,
        file: &File,
        offset: u64,
        len: u64,
    ) -> Result<Acquired, WindowError> {
        let (id, stamp) = stat(file).map_err(|source| WindowError::Io {
            what: "fstat",
            source,
        })?;
        let end = offset.saturating_add(len);
        let key = WindowKey {
            file: id,
            offset,
            len,
        };
        let page = cpu_page_size() as u64;
        let pinned = (offset % page + len).next_multiple_of(page);
        {
            let mut g = self.lock();
            invalidate_changed(&mut g, id, stamp)?;
            if len == 0 || end > stamp.size {
                return Err(WindowError::OutOfRange {
                    offset,
                    end,
                    size: stamp.size,
                });
            }
            if let Some(w) = take_registered(&mut g, key, stamp, self.cap) {
                return Ok(Acquired {
                    window: w,
                    registered: false,
                });
            }
            if pinned > self.cap {
                return Err(WindowError::TooLarge {
                    len: pinned,
                    cap: self.cap,
                });
            }
            evict_for(&mut g, pinned, self.cap);
            // Counted as held while it is being mapped, so concurrent acquires stay under the cap.
            g.held += pinned;
        }
        let t = Instant::now();
        let populate = self.populate.load(std::sync::atomic::Ordering::Relaxed);
        let mapped = FileWindow::map(file, key, stamp, &self.pinner, self.ub.as_ref(), populate);
        self.insert_mapped(key, pinned, mapped, t.elapsed())
    }

    /// Enter a window [`FileWindowRegistry::acquire_counted`] mapped (or failed to) outside the
    /// lock, `pinned` bytes of which it counted as held meanwhile.
    fn insert_mapped(
        &self,
        key: WindowKey,
        pinned: u64,
        mapped: Result<FileWindow, WindowError>,
        took: Duration,
    ) -> Result<Acquired, WindowError> {
        let mut g = self.lock();
        g.held -= pinned;
        let w = Arc::new(mapped?);
        g.stats.register_ns += took.as_nanos() as u64;
        g.stats.registered += 1;
        let clock = g.clock;
        if let Some(e) = g.windows.get_mut(&key) {
            // Another thread registered the same range meanwhile: use its window (ours is
            // unpinned and unmapped when dropped, outside the lock).
            e.last_use = clock;
            let theirs = e.win.clone();
            drop(g);
            drop(w);
            return Ok(Acquired {
                window: theirs,
                registered: false,
            });
        }
        g.held += w.map_len as u64;
        g.clock += 1;
        let now = g.clock;
        g.windows.insert(
            key,
            Entry {
                win: w.clone(),
                last_use: now,
            },
        );
        Ok(Acquired {
            window: w,
            registered: true,
        })
    }

    /// Drop the registered window of `key` from the registry (it stays pinned while a caller
    /// holds it, and is unpinned when the last holder lets go). True when there was one.
    pub fn release(&self, key: WindowKey) -> bool {
        let mut g = self.lock();
        match g.windows.remove(&key) {
            Some(e) => {
                g.held -= e.win.map_len as u64;
                park(&mut g, key, &e.win);
                true
            }
            None => false,
        }
    }

    /// The check before a pass: fstat `file` and drop its windows if it changed since they
    /// were mapped ([`WindowError::FileChanged`]).
    pub fn check(&self, file: &File) -> Result<(), WindowError> {
        let (id, stamp) = stat(file).map_err(|source| WindowError::Io {
            what: "fstat",
            source,
        })?;
        invalidate_changed(&mut self.lock(), id, stamp)
    }

    /// Bytes of windows the registry keeps pinned.
    pub fn held_bytes(&self) -> u64 {
        self.lock().held
    }

    /// Windows registered now.
    pub fn len(&self) -> usize {
        self.lock().windows.len()
    }

    /// True when no window is registered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The counters so far.
    pub fn stats(&self) -> RegistryStats {
        self.lock().stats
    }

    /// Time spent mapping and pinning so far.
    pub fn register_time(&self) -> Duration {
        Duration::from_nanos(self.lock().stats.register_ns)
    }

    /// Drop every registered window (pinned ones still held by callers live on until released).
    pub fn clear(&self) {
        let mut g = self.lock();
        let all: Vec<(WindowKey, Entry)> = g.windows.drain().collect();
        for (k, e) in &all {
            g.held -= e.win.map_len as u64;
            park(&mut g, *k, &e.win);
        }
    }
}

/// The registered (or parked and unchanged) window of `key`, counted as reused; a parked one
/// comes back after the least recently used windows beyond `cap` went.
fn take_registered(
    g: &mut Inner,
    key: WindowKey,
    stamp: FileStamp,
    cap: u64,
) -> Option<Arc<FileWindow>> {
    g.clock += 1;
    let now = g.clock;
    if let Some(e) = g.windows.get_mut(&key) {
        e.last_use = now;
        let w = e.win.clone();
        g.stats.reused += 1;
        return Some(w);
    }
    let w = g.parked.remove(&key).and_then(|w| w.upgrade())?;
    if w.stamp != stamp {
        return None;
    }
    evict_for(g, w.map_len as u64, cap);
    g.held += w.map_len as u64;
    g.stats.reused += 1;
    g.windows.insert(
        key,
        Entry {
            win: w.clone(),
            last_use: now,
        },
    );
    Some(w)
}

/// Drop least recently used windows until `pinned` more bytes fit under `cap` (or none is left).
fn evict_for(g: &mut Inner, pinned: u64, cap: u64) {
    while g.held + pinned > cap && !g.windows.is_empty() {
        let lru = g
            .windows
            .iter()
            .min_by_key(|(_, e)| e.last_use)
            .map(|(k, _)| *k);
        if let Some(k) = lru {
            if let Some(e) = g.windows.remove(&k) {
                g.held -= e.win.map_len as u64;
                g.stats.evicted += 1;
                park(g, k, &e.win);
            }
        }
    }
}

/// Remember a window the registry lets go of, for a holder's sake (and forget dead ones).
fn park(g: &mut Inner, k: WindowKey, w: &Arc<FileWindow>) {
    g.parked.retain(|_, w| w.strong_count() > 0);
    g.parked.insert(k, Arc::downgrade(w));
}

/// Drop the windows of `id` whose stamp differs from `now`; an error when there were any.
fn invalidate_changed(g: &mut Inner, id: FileIdentity, now: FileStamp) -> Result<(), WindowError> {
    let stale: Vec<(WindowKey, FileStamp)> = g
        .windows
        .iter()
        .filter(|(k, e)| k.file == id && e.win.stamp != now)
        .map(|(k, e)| (*k, e.win.stamp))
        .collect();
    let Some(&(_, old)) = stale.first() else {
        return Ok(());
    };
    for (k, _) in &stale {
        if let Some(e) = g.windows.remove(k) {
            g.held -= e.win.map_len as u64;
        }
    }
    g.stats.invalidated += stale.len() as u64;
    Err(WindowError::FileChanged {
        old_size: old.size,
        new_size: now.size,
        mtime_changed: old.mtime_ns != now.mtime_ns,
        dropped: stale.len(),
    })
}
