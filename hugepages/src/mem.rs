//! [`HugeMem`]: an mmapped, populated hugepage mapping backed by a memfd-hugetlb file.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::ptr::NonNull;

use memfd::{HugetlbSize, MemfdOptions};

use crate::sysfs::{free_pages_in, SYSFS_ROOT};
use crate::{HugeError, PageSize};

/// `MADV_POPULATE_WRITE` (Linux 5.14): fault in pages, returning an error instead of SIGBUS.
const MADV_POPULATE_WRITE: libc::c_int = 23;
/// `MPOL_BIND` from linux/mempolicy.h.
const MPOL_BIND: libc::c_int = 2;

/// An mmapped, populated hugepage mapping (memfd-hugetlb, MAP_SHARED). Hugetlb pages are never
/// swapped or migrated, so the physical pages stay put for the mapping's life. Unmapped on
/// drop.
#[derive(Debug)]
pub struct HugeMem {
    ptr: NonNull<u8>,
    len: usize,
    size: PageSize,
    numa: Option<u32>,
    _file: File,
}

// SAFETY: HugeMem owns its mapping exclusively; the raw pointer is only an address, and any
// access through it is the caller's (unsafe) responsibility.
unsafe impl Send for HugeMem {}
// SAFETY: &HugeMem only hands out the address and metadata, never references into the memory.
unsafe impl Sync for HugeMem {}

impl HugeMem {
    /// Map `len` bytes (rounded up to the page size) of hugepages of `size`, bound to NUMA
    /// node `numa` when given, populated (every page faulted in) before returning.
    pub fn alloc(len: usize, size: PageSize, numa: Option<u32>) -> Result<HugeMem, HugeError> {
        let len = match size.round_up(len) {
            Some(l) if l > 0 => l,
            _ => return Err(HugeError::InvalidLength { len }),
        };
        let need = (len as u64) / size.bytes();
        let free = free_pages_in(Path::new(SYSFS_ROOT), numa, size)?;
        if free < need {
            return Err(HugeError::NoFreePages {
                size,
                node: numa,
                need,
                free,
            });
        }
        let hsize = match size {
            PageSize::Size2M => HugetlbSize::Huge2MB,
            PageSize::Size1G => HugetlbSize::Huge1GB,
        };
        let file = MemfdOptions::default()
            .close_on_exec(true)
            .hugetlb(Some(hsize))
            .create("ubdirect-hugemem")
            .map_err(|e| HugeError::Memfd {
                size,
                source: memfd_io_error(e),
            })?
            .into_file();
        file.set_len(len as u64).map_err(|source| HugeError::Map {
            op: "ftruncate",
            len,
            size,
            source,
        })?;
        let populate_now = if numa.is_none() {
            libc::MAP_POPULATE
        } else {
            0
        };
        // SAFETY: a fresh shared mapping of our own memfd; no existing memory is affected.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | populate_now,
                file.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(HugeError::Map {
                op: "mmap",
                len,
                size,
                source: std::io::Error::last_os_error(),
            });
        }
        let mem = HugeMem {
            // SAFETY: mmap succeeded, so p is not null.
            ptr: unsafe { NonNull::new_unchecked(p.cast()) },
            len,
            size,
            numa,
            _file: file,
        };
        if let Some(node) = numa {
            mem.bind_and_populate(node)?;
        }
        Ok(mem)
    }

    fn bind_and_populate(&self, node: u32) -> Result<(), HugeError> {
        let mut mask = [0u64; 16]; // 1024 nodes
        let (word, bit) = ((node / 64) as usize, node % 64);
        if word >= mask.len() {
            return Err(HugeError::Mbind {
                node,
                source: std::io::Error::from_raw_os_error(libc::EINVAL),
            });
        }
        mask[word] |= 1 << bit;
        // SAFETY: mbind on our own mapping; the mask pointer and bit count describe `mask`.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_mbind,
                self.ptr.as_ptr(),
                self.len,
                MPOL_BIND,
                mask.as_ptr(),
                mask.len() * 64,
                0u32,
            )
        };
        if rc != 0 {
            return Err(HugeError::Mbind {
                node,
                source: std::io::Error::last_os_error(),
            });
        }
        // SAFETY: madvise on our own mapping.
        let rc = unsafe { libc::madvise(self.ptr.as_ptr().cast(), self.len, MADV_POPULATE_WRITE) };
        if rc != 0 {
            return Err(HugeError::Map {
                op: "madvise(MADV_POPULATE_WRITE)",
                len: self.len,
                size: self.size,
                source: std::io::Error::last_os_error(),
            });
        }
        Ok(())
    }

    /// The start of the mapping (page aligned).
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// The mapping's length in bytes (a multiple of the page size).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: a mapping holds at least one page.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The hugepage size backing the mapping.
    pub fn page_size(&self) -> PageSize {
        self.size
    }

    /// The NUMA node the pages are bound to, when one was asked for.
    pub fn numa_node(&self) -> Option<u32> {
        self.numa
    }

    /// The memfd behind the mapping (for mapping it by file, e.g. iommufd's
    /// `IOMMU_IOAS_MAP_FILE`); it lives as long as `self`.
    pub fn memfd(&self) -> std::os::fd::BorrowedFd<'_> {
        std::os::fd::AsFd::as_fd(&self._file)
    }
}

impl Drop for HugeMem {
    fn drop(&mut self) {
        // SAFETY: we own the mapping and nothing can refer to it after drop.
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}

fn memfd_io_error(e: memfd::Error) -> std::io::Error {
    match e {
        memfd::Error::Create(io) => io,
        other => std::io::Error::other(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pools;

    fn free_2m() -> u64 {
        pools()
            .unwrap()
            .iter()
            .find(|p| p.node.is_none() && p.size == PageSize::Size2M)
            .map(|p| p.free)
            .unwrap_or(0)
    }

    #[test]
    fn zero_length_is_refused() {
        let e = HugeMem::alloc(0, PageSize::Size2M, None).unwrap_err();
        assert!(matches!(e, HugeError::InvalidLength { len: 0 }), "{e}");
    }

    #[test]
    fn too_many_pages_names_need_and_free() {
        let free = free_2m();
        let want = (free + 1) as usize * (2 << 20);
        let e = HugeMem::alloc(want, PageSize::Size2M, None).unwrap_err();
        let m = e.to_string();
        assert!(
            m.contains(&format!("(need {}, free {free})", free + 1)),
            "{m}"
        );
        assert!(m.contains("scripts/setup.sh"), "{m}");
    }
}
