//! Mapping a file range read-only: [`ReadOnlyFileMap`] maps bytes of an open file with
//! `PROT_READ` and `MAP_SHARED` (the mapping *is* the page cache, and nothing can write through
//! it) and unmaps them on drop; [`stat_file`] gives the file's identity and [`FileStamp`] for
//! change detection. UB file regions ([`super::UbRegistry::register_file`]) and the CUDA crate's
//! file windows both map files this way.

use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::os::unix::io::AsRawFd;

/// What a file looked like when it was registered or mapped: size and modification time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileStamp {
    /// Size in bytes.
    pub size: u64,
    /// mtime in nanoseconds since the epoch.
    pub mtime_ns: i128,
}

impl FileStamp {
    /// The stamp of a file's metadata.
    pub fn of(m: &std::fs::Metadata) -> FileStamp {
        FileStamp {
            size: m.size(),
            mtime_ns: i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()),
        }
    }
}

/// One fstat of an open file: its device and inode numbers (which file it is) and its stamp.
pub fn stat_file(file: &File) -> std::io::Result<(u64, u64, FileStamp)> {
    let m = file.metadata()?;
    Ok((m.dev(), m.ino(), FileStamp::of(&m)))
}

/// The CPU page size in bytes (4096 at least): file mappings start at a multiple of it.
pub fn cpu_page_size() -> usize {
    // SAFETY: sysconf has no memory-safety preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(p).unwrap_or(4096).max(4096)
}

/// A read-only, shared mapping of `len` bytes of a file from a page-aligned offset; unmapped
/// when dropped. Bytes of the last page past the end of the file read as zeros; a CPU load of
/// a whole page past the end raises SIGBUS (devices reading the pages pinned by an IOMMU
/// mapping are not affected).
pub struct ReadOnlyFileMap {
    base: *mut libc::c_void,
    len: usize,
}

// SAFETY: the mapping is read-only and owned by this value; only its address is shared.
unsafe impl Send for ReadOnlyFileMap {}
// SAFETY: as above: nothing is mutated through a shared reference.
unsafe impl Sync for ReadOnlyFileMap {}

impl std::fmt::Debug for ReadOnlyFileMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadOnlyFileMap")
            .field("base", &self.base)
            .field("len", &self.len)
            .finish()
    }
}

impl ReadOnlyFileMap {
    /// Map bytes `[offset, offset + len)` of `file` (open for reading) read-only and shared.
    /// `offset` must be a multiple of [`cpu_page_size`] and `len` above zero (the kernel
    /// refuses anything else with `EINVAL`). The mapping does not need `file` afterwards.
    pub fn new(file: &File, offset: u64, len: usize) -> std::io::Result<ReadOnlyFileMap> {
        let off = libc::off_t::try_from(offset).map_err(|_| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("file offset {offset} is too large to map"),
            )
        })?;
        // SAFETY: a fresh read-only shared mapping of an open file; the kernel picks the address.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                off,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(ReadOnlyFileMap { base, len })
    }

    /// The address of the first byte mapped (file offset `offset` of [`ReadOnlyFileMap::new`]).
    pub fn as_ptr(&self) -> *const u8 {
        self.base.cast()
    }

    /// Bytes mapped.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Never true: an empty mapping is refused.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for ReadOnlyFileMap {
    fn drop(&mut self) {
        // SAFETY: our own mapping; whoever gave its pages to a device (IOMMU map, CUDA host
        // registration) undid that before dropping it.
        unsafe { libc::munmap(self.base, self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::fs::FileExt;
    use ubdirect_testbed::proc_maps::file_is_mapped;

    fn file_of(bytes: &[u8]) -> tempfile::NamedTempFile {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(bytes).unwrap();
        f.flush().unwrap();
        f
    }

    #[test]
    fn a_mapping_shows_the_file_from_its_offset_and_goes_on_drop() {
        let page = cpu_page_size();
        let bytes: Vec<u8> = (0..3 * page + 100)
            .map(|i| (i * 7 + i / 4096) as u8)
            .collect();
        let f = file_of(&bytes);
        let m = ReadOnlyFileMap::new(f.as_file(), page as u64, 2 * page + 100).unwrap();
        assert_eq!(m.len(), 2 * page + 100);
        assert!(!m.is_empty());
        // SAFETY: the mapping covers m.len() bytes, all inside the file.
        let seen = unsafe { std::slice::from_raw_parts(m.as_ptr(), m.len()) };
        assert!(seen == &bytes[page..], "the mapping differs from the file");
        assert!(file_is_mapped(f.path()));
        drop(m);
        assert!(!file_is_mapped(f.path()), "the mapping outlived its value");
    }

    #[test]
    fn the_mapping_is_the_page_cache_not_a_copy() {
        let f = file_of(&[1u8; 4096]);
        let m = ReadOnlyFileMap::new(f.as_file(), 0, 4096).unwrap();
        f.as_file().write_all_at(&[9u8; 16], 100).unwrap();
        // SAFETY: the mapping covers 4096 bytes of the file.
        let seen = unsafe { std::slice::from_raw_parts(m.as_ptr(), 4096) };
        assert_eq!(seen[99], 1);
        assert_eq!(
            seen[100..116],
            [9u8; 16],
            "a write to the file shows in the mapping"
        );
        assert_eq!(seen[116], 1);
    }

    #[test]
    fn bad_offsets_lengths_and_write_only_files_are_refused() {
        let f = file_of(&[0u8; 8192]);
        let e = ReadOnlyFileMap::new(f.as_file(), 100, 4096).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EINVAL), "{e}");
        let e = ReadOnlyFileMap::new(f.as_file(), 0, 0).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EINVAL), "{e}");
        let e = ReadOnlyFileMap::new(f.as_file(), u64::MAX - 4095, 4096).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput, "{e}");
        assert!(e.to_string().contains("too large to map"), "{e}");
        let w = std::fs::OpenOptions::new()
            .write(true)
            .open(f.path())
            .unwrap();
        let e = ReadOnlyFileMap::new(&w, 0, 4096).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EACCES), "{e}");
    }

    #[test]
    fn the_stamp_follows_size_and_mtime_and_the_identity_the_inode() {
        let f = file_of(&[0u8; 1000]);
        let (dev, ino, s) = stat_file(f.as_file()).unwrap();
        let m = std::fs::metadata(f.path()).unwrap();
        assert_eq!((dev, ino), (m.dev(), m.ino()));
        assert_eq!(s.size, 1000);
        assert_eq!(
            s.mtime_ns,
            i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec())
        );
        f.as_file().set_len(10).unwrap();
        let (_, _, now) = stat_file(f.as_file()).unwrap();
        assert_eq!(now.size, 10);
        assert_ne!(now, s);
        assert!(cpu_page_size() >= 4096 && cpu_page_size().is_power_of_two());
    }
}
