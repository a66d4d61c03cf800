//! File regions ([`RegionKind::File`]): a range of a file mapped read-only and shared (the
//! mapping *is* the page cache), registered once in the [`UbRegistry`] and mapped in the IOMMU
//! with READ permission only, so an NVMe controller or a NIC can DMA *from* the file without a
//! copy, and can never write into it.
//!
//! - Ownership: the region owns the file mapping; the IOMMU mapping goes first (unregister, or
//!   the last `Arc<UbRegion>`), then the process mapping. Pools over a file region hand out
//!   blocks that are DMA sources only: no Rust slice over them ([`super::UbBuf::as_slice`] and
//!   [`super::UbBuf::as_mut_slice`] panic on them); the CPU copies one out with
//!   [`super::UbBuf::read_into`], which reads the file through the region's descriptor, never
//!   the mapping.
//! - Registering the same range of the same, unchanged file again returns the region already
//!   registered (one mapping, one IOVA range; also when two threads race).
//! - Change detection: [`UbRegion::check_file`] fstat()s the file and compares size and mtime
//!   with the registration, and whether the file still has a name ([`CoreError::FileChanged`]).
//!   The device paths that read a buffer (NVMe writes, NIC transmits) call it for buffers of
//!   file regions and refuse a changed file's buffer; other regions pay nothing. A file
//!   truncated (or rewritten) while registered: VFIO pinned the pages at registration, and
//!   pinned pages stay allocated when the kernel drops them from the file, so a device reading
//!   them would get the bytes as they were (for tmpfs and the page cache alike; the part of the
//!   last page past a new end that is not a page boundary is zeroed by the kernel); no IOMMU
//!   fault, no device error. Only a CPU load from the mapping past the new end raises SIGBUS,
//!   and nothing here loads from the mapping: a CPU read of a block after a truncation comes
//!   back short, [`CoreError::FileChanged`].
//!   Registering the changed file maps a new region; the stale one stays until unregistered.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::sync::Arc;

use super::file_map::{cpu_page_size, stat_file, FileStamp, ReadOnlyFileMap};
use super::region::{Backing, RegionKind, UbRegion};
use super::registry::UbRegistry;
use crate::error::{CoreError, Result};

/// (dev, ino, stamp) of an open file.
fn stat(file: &File) -> Result<(u64, u64, FileStamp)> {
    stat_file(file).map_err(|source| CoreError::Io {
        op: "fstat of the registered file".into(),
        source,
    })
}

/// The process mapping of a file region, with the file (for fstat on use), its name and what
/// it looked like at registration. The region dropping it removed its IOMMU mapping first.
pub(crate) struct FileMap {
    map: ReadOnlyFileMap,
    file: File,
    /// File offset of the region's first byte.
    offset: u64,
    stamp: FileStamp,
    /// The file's path at registration (from /proc/self/fd), or its device and inode.
    name: String,
    /// Names linking to the file at registration (0 for a file already unlinked then).
    links: u64,
}

impl FileMap {
    fn new(file: &File, offset: u64, len: usize, stamp: FileStamp) -> Result<FileMap> {
        let file = file.try_clone().map_err(|source| CoreError::Io {
            op: "dup of the file to register".into(),
            source,
        })?;
        let map = ReadOnlyFileMap::new(&file, offset, len).map_err(|source| CoreError::Io {
            op: format!("mmap of file bytes [{offset}, +{len}) read-only"),
            source,
        })?;
        let meta = file.metadata().map_err(|source| CoreError::Io {
            op: "fstat of the file to register".into(),
            source,
        })?;
        let name = std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd()))
            .map(|p| p.display().to_string())
            .unwrap_or_else(|_| format!("inode {} of device {:#x}", meta.ino(), meta.dev()));
        Ok(FileMap {
            map,
            file,
            offset,
            stamp,
            name,
            links: meta.nlink(),
        })
    }

    /// One fstat of the file, compared with the registration: size, mtime, and whether the
    /// file still has a name (a file removed, or replaced by a rename over it, has none).
    /// [`CoreError::FileChanged`] naming the file and what changed.
    #[cold]
    #[inline(never)]
    pub(crate) fn check(&self, id: u32) -> Result<()> {
        let meta = self.file.metadata().map_err(|source| CoreError::Io {
            op: format!("fstat of the registered file {}", self.name),
            source,
        })?;
        let now = FileStamp::of(&meta);
        let removed = self.links > 0 && meta.nlink() == 0;
        if now == self.stamp && !removed {
            return Ok(());
        }
        Err(CoreError::FileChanged {
            id,
            file: self.name.clone(),
            old_size: self.stamp.size,
            new_size: now.size,
            mtime_changed: now.mtime_ns != self.stamp.mtime_ns,
            removed,
        })
    }

    /// Copy region bytes `[at, at + dst.len())` into `dst` from the file (pread at the region's
    /// file offset through its descriptor), never from the mapping: bytes at or past the
    /// file's size at registration are zeros, as the mapping's last page shows them. Then one
    /// fstat ([`FileMap::check`]): [`CoreError::FileChanged`] when the file changed, and also
    /// when the read came back short (a file truncated under the region).
    pub(crate) fn read_at(&self, id: u32, at: usize, dst: &mut [u8]) -> Result<()> {
        let pos = self.offset + at as u64;
        let in_file = self.stamp.size.saturating_sub(pos).min(dst.len() as u64) as usize;
        let (head, tail) = dst.split_at_mut(in_file);
        let got = read_full_at(&self.file, head, pos).map_err(|source| CoreError::Io {
            op: format!(
                "read of {} bytes at {pos} of the registered file {}",
                head.len(),
                self.name
            ),
            source,
        })?;
        tail.fill(0);
        self.check(id)?;
        if got < head.len() {
            return Err(CoreError::FileChanged {
                id,
                file: self.name.clone(),
                old_size: self.stamp.size,
                new_size: pos + got as u64,
                mtime_changed: false,
                removed: false,
            });
        }
        Ok(())
    }
}

/// pread into all of `buf` from `pos`, retried on EINTR: the bytes read (fewer only at the end
/// of the file).
fn read_full_at(file: &File, buf: &mut [u8], pos: u64) -> std::io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match file.read_at(&mut buf[got..], pos + got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

fn page_size() -> u64 {
    cpu_page_size() as u64
}

/// The (dev, ino, offset, len) key of a file region.
fn key_of(r: &UbRegion) -> Option<(u64, u64, u64, u64)> {
    match r.kind {
        RegionKind::File {
            dev,
            ino,
            offset,
            len,
        } => Some((dev, ino, offset, len)),
        _ => None,
    }
}

fn stamp_of(r: &UbRegion) -> Option<FileStamp> {
    match r.backing() {
        Backing::File(m) => Some(m.stamp),
        _ => None,
    }
}

impl UbRegistry {
    /// Map bytes `[offset, offset + len)` of `file` read-only (shared: the page cache itself)
    /// and register them as a [`RegionKind::File`] region, mapped in the IOMMU for device
    /// reads only. `offset` must be a multiple of the page size; the region covers `len`
    /// rounded up to a page (the bytes past the end of the file in the last page read as
    /// zeros). The same range of the same unchanged file registered again returns the region
    /// already registered. The file must be opened for reading; the region keeps its own
    /// descriptor, so the caller may close it.
    pub fn register_file(&self, file: &File, offset: u64, len: u64) -> Result<Arc<UbRegion>> {
        let (dev, ino, stamp) = stat(file)?;
        let page = page_size();
        if offset % page != 0 {
            return Err(CoreError::InvalidArgument(format!(
                "file region offset {offset} is not a multiple of the page size ({page}): round it down and skip the lead"
            )));
        }
        let end = offset
            .checked_add(len)
            .filter(|&e| len > 0 && e <= stamp.size);
        if end.is_none() {
            return Err(CoreError::InvalidArgument(format!(
                "file bytes [{offset}, +{len}) are not inside the file ({} bytes): pick a non-empty range within it",
                stamp.size
            )));
        }
        let key = (dev, ino, offset, len);
        if let Some(r) = self.find_file(key, stamp) {
            return Ok(r);
        }
        let map_len = usize::try_from(len.next_multiple_of(page)).map_err(|_| {
            CoreError::InvalidArgument(format!("file range of {len} bytes is too large to map"))
        })?;
        let map = FileMap::new(file, offset, map_len, stamp)?;
        let ptr = map.map.as_ptr().cast_mut();
        let align = if map_len >= 2 << 20 { 2 << 20 } else { 4096 };
        let kind = RegionKind::File {
            dev,
            ino,
            offset,
            len,
        };
        // SAFETY: the mapping moves into the region, which unmaps the IOVA range before it.
        let r = unsafe { self.insert(ptr, map_len, align, kind, None, Backing::File(map))? };
        // Two threads registering the same range at once: the lowest id wins, the other one
        // is unregistered before anybody saw it.
        match self.find_file(key, stamp) {
            Some(first) if first.id < r.id => {
                self.unregister(r.id)?;
                Ok(first)
            }
            _ => Ok(r),
        }
    }

    /// The registered, current region of exactly `[offset, offset + len)` of `file`, if any.
    pub fn file_region(&self, file: &File, offset: u64, len: u64) -> Result<Option<Arc<UbRegion>>> {
        let (dev, ino, stamp) = stat(file)?;
        Ok(self.find_file((dev, ino, offset, len), stamp))
    }

    fn find_file(&self, key: (u64, u64, u64, u64), stamp: FileStamp) -> Option<Arc<UbRegion>> {
        self.regions()
            .into_iter()
            .filter(|r| key_of(r) == Some(key) && stamp_of(r) == Some(stamp))
            .min_by_key(|r| r.id)
    }

    /// The check before using a file region ([`UbRegion::check_file`]): fstat its file and
    /// compare size, mtime and its name's existence with the registration.
    /// [`CoreError::FileChanged`] when the file changed (the region keeps the pages pinned at
    /// registration: see the module docs); InvalidArgument for a region that is not a file
    /// region.
    pub fn check_file_region(&self, region: &UbRegion) -> Result<()> {
        let Backing::File(m) = region.backing() else {
            return Err(CoreError::InvalidArgument(format!(
                "UB region {} is not a file region",
                region.id
            )));
        };
        m.check(region.id)
    }

    /// The stamp (size, mtime) of a file region's file at registration.
    pub fn file_stamp(&self, region: &UbRegion) -> Option<FileStamp> {
        stamp_of(region)
    }
}

#[cfg(test)]
mod tests;
