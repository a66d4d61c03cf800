//! The `.hugepages(..)` step of [`EnvBuilder`](super::EnvBuilder): reserve hugepages, or only
//! verify that there are enough free ones for the pool, before any device opens.

use std::path::{Path, PathBuf};

use ubdirect_hugepages::{pools_in, reserve_in, HugeError, PageSize, SYSFS_ROOT};

const SIZE_2M: u64 = 2 << 20;
const SIZE_1G: u64 = 1 << 30;

/// What the hugepage step does before anything opens. Without a `.hugepages(..)` step a
/// hugepage pool is verified ([`Hugepages::verify`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hugepages {
    reserve: Option<u64>,
    root: PathBuf,
}

impl Default for Hugepages {
    fn default() -> Self {
        Hugepages::verify()
    }
}

impl Hugepages {
    /// Verify that the pool fits in the free hugepages (2 MiB pages, or 1 GiB pages when the
    /// pool is a whole number of them); reserve nothing.
    pub fn verify() -> Hugepages {
        Hugepages {
            reserve: None,
            root: PathBuf::from(SYSFS_ROOT),
        }
    }
    /// Reserve at least `pages` 2 MiB hugepages (on the builder's NUMA node, or system-wide)
    /// by raising `nr_hugepages` (needs root; never lowered), then verify as
    /// [`Hugepages::verify`] does.
    pub fn reserve(pages: u64) -> Hugepages {
        Hugepages {
            reserve: Some(pages),
            root: PathBuf::from(SYSFS_ROOT),
        }
    }
    /// Read (and write) the hugepage counts under `root` instead of `/` (a fake sysfs tree in
    /// tests, as `ubdirect_hugepages::pools_in` takes).
    pub fn sysfs_root(mut self, root: impl Into<PathBuf>) -> Hugepages {
        self.root = root.into();
        self
    }

    /// Run the step for a pool of `total` bytes on `node`.
    pub(super) fn run(&self, total: usize, node: Option<u32>) -> Result<(), HugeError> {
        let total = total as u64;
        if let Some(pages) = self.reserve {
            let now = count(&self.root, node, PageSize::Size2M, |p| p.total)?;
            if now < pages {
                reserve_in(&self.root, node, PageSize::Size2M, pages)?;
            }
        }
        check_free(&self.root, total, node)
    }
}

/// Pages of `size` on `node` (system-wide for None), as `field` of its pool; 0 when the kernel
/// has no such pool.
fn count(
    root: &Path,
    node: Option<u32>,
    size: PageSize,
    field: impl Fn(&ubdirect_hugepages::PoolInfo) -> u64,
) -> Result<u64, HugeError> {
    Ok(pools_in(root)?
        .iter()
        .find(|p| p.size == size && p.node == node)
        .map(field)
        .unwrap_or(0))
}

/// The pool (`total` bytes) fits the free 2 MiB pages, or the free 1 GiB pages when it is a
/// whole number of them (the pages `UbPool::with_hugepages` picks).
fn check_free(root: &Path, total: u64, node: Option<u32>) -> Result<(), HugeError> {
    if total % SIZE_1G == 0 && count(root, node, PageSize::Size1G, |p| p.free)? * SIZE_1G >= total {
        return Ok(());
    }
    let need = total.div_ceil(SIZE_2M);
    let free = count(root, node, PageSize::Size2M, |p| p.free)?;
    if free >= need {
        return Ok(());
    }
    Err(HugeError::NoFreePages {
        size: PageSize::Size2M,
        node,
        need,
        free,
    })
}
