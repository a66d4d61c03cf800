//! Hugepage pools from sysfs (`/sys/kernel/mm/hugepages`, `/sys/devices/system/node/node*/hugepages`)
//! and reservation through `nr_hugepages`. Every function has an `_in` twin that takes the
//! filesystem root, so tests can run against a fake tree in a temporary directory.

use std::fs;
use std::path::{Path, PathBuf};

use crate::{HugeError, PageSize};

/// The real filesystem root that [`pools`] and [`reserve`] read.
pub const SYSFS_ROOT: &str = "/";

/// One hugepage pool: a page size, globally (`node: None`) or on one NUMA node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolInfo {
    /// The NUMA node, or None for the system-wide totals.
    pub node: Option<u32>,
    /// The page size.
    pub size: PageSize,
    /// Pages reserved (nr_hugepages).
    pub total: u64,
    /// Pages free.
    pub free: u64,
    /// Surplus pages (overcommitted beyond nr_hugepages).
    pub surplus: u64,
}

/// The system-wide pools (node None) followed by the per-node pools, for every page size the
/// kernel supports.
pub fn pools() -> Result<Vec<PoolInfo>, HugeError> {
    pools_in(Path::new(SYSFS_ROOT))
}

/// [`pools`] against another filesystem root (tests).
pub fn pools_in(root: &Path) -> Result<Vec<PoolInfo>, HugeError> {
    let mut out = Vec::new();
    for size in PageSize::ALL {
        let dir = size_dir(root, None, size);
        if dir.is_dir() {
            out.push(read_pool(&dir, None, size)?);
        }
    }
    for node in nodes(root)? {
        for size in PageSize::ALL {
            let dir = size_dir(root, Some(node), size);
            if dir.is_dir() {
                out.push(read_pool(&dir, Some(node), size)?);
            }
        }
    }
    Ok(out)
}

/// Pages of `size` a new mapping can still get on `node` (or system-wide): free pages less
/// those already promised to existing mappings (`resv_hugepages`, system-wide only).
pub(crate) fn free_pages_in(
    root: &Path,
    node: Option<u32>,
    size: PageSize,
) -> Result<u64, HugeError> {
    let dir = existing_size_dir(root, node, size)?;
    let free = read_u64(&dir.join("free_hugepages"))?;
    let resv = match node {
        None if dir.join("resv_hugepages").exists() => read_u64(&dir.join("resv_hugepages"))?,
        _ => 0,
    };
    Ok(free.saturating_sub(resv))
}

/// Set the number of reserved pages of `size` (on `node`, or system-wide) to `count`; returns
/// the number the kernel reserved, or [`HugeError::ReserveShort`] when it reserved fewer.
pub fn reserve(node: Option<u32>, size: PageSize, count: u64) -> Result<u64, HugeError> {
    reserve_in(Path::new(SYSFS_ROOT), node, size, count)
}

/// [`reserve`] against another filesystem root (tests).
pub fn reserve_in(
    root: &Path,
    node: Option<u32>,
    size: PageSize,
    count: u64,
) -> Result<u64, HugeError> {
    let dir = existing_size_dir(root, node, size)?;
    let path = dir.join("nr_hugepages");
    fs::write(&path, format!("{count}\n")).map_err(|source| HugeError::Io {
        op: "write",
        path: path.clone(),
        source,
    })?;
    let got = read_u64(&path)?;
    if got < count {
        return Err(HugeError::ReserveShort {
            size,
            node,
            wanted: count,
            got,
        });
    }
    Ok(got)
}

fn nodes(root: &Path) -> Result<Vec<u32>, HugeError> {
    let dir = root.join("sys/devices/system/node");
    let Ok(rd) = fs::read_dir(&dir) else {
        return Ok(Vec::new()); // kernel without NUMA support
    };
    let mut nodes: Vec<u32> = rd
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str()?.strip_prefix("node")?.parse().ok())
        .collect();
    nodes.sort_unstable();
    Ok(nodes)
}

fn size_dir(root: &Path, node: Option<u32>, size: PageSize) -> PathBuf {
    let leaf = format!("hugepages-{}", size.kib_name());
    match node {
        None => root.join("sys/kernel/mm/hugepages").join(leaf),
        Some(n) => root
            .join(format!("sys/devices/system/node/node{n}/hugepages"))
            .join(leaf),
    }
}

fn existing_size_dir(root: &Path, node: Option<u32>, size: PageSize) -> Result<PathBuf, HugeError> {
    if let Some(n) = node {
        let nd = root.join(format!("sys/devices/system/node/node{n}"));
        if !nd.is_dir() {
            return Err(HugeError::NoSuchNode { node: n, path: nd });
        }
    }
    let dir = size_dir(root, node, size);
    if !dir.is_dir() {
        return Err(HugeError::SizeUnsupported { size, path: dir });
    }
    Ok(dir)
}

fn read_pool(dir: &Path, node: Option<u32>, size: PageSize) -> Result<PoolInfo, HugeError> {
    Ok(PoolInfo {
        node,
        size,
        total: read_u64(&dir.join("nr_hugepages"))?,
        free: read_u64(&dir.join("free_hugepages"))?,
        surplus: read_u64(&dir.join("surplus_hugepages"))?,
    })
}

fn read_u64(path: &Path) -> Result<u64, HugeError> {
    let s = fs::read_to_string(path).map_err(|source| HugeError::Io {
        op: "read",
        path: path.to_path_buf(),
        source,
    })?;
    s.trim().parse().map_err(|_| HugeError::Parse {
        path: path.to_path_buf(),
        content: s.trim().to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    struct FakeRoot(PathBuf);

    impl FakeRoot {
        fn new(tag: &str) -> FakeRoot {
            let p = std::env::temp_dir().join(format!(
                "ubd-hugepages-{tag}-{}-{:?}",
                std::process::id(),
                std::thread::current().id()
            ));
            let _ = fs::remove_dir_all(&p);
            fs::create_dir_all(&p).unwrap();
            FakeRoot(p)
        }
        fn pool(&self, node: Option<u32>, size: PageSize, nr: u64, free: u64, surplus: u64) {
            let d = size_dir(&self.0, node, size);
            fs::create_dir_all(&d).unwrap();
            fs::write(d.join("nr_hugepages"), format!("{nr}\n")).unwrap();
            fs::write(d.join("free_hugepages"), format!("{free}\n")).unwrap();
            fs::write(d.join("surplus_hugepages"), format!("{surplus}\n")).unwrap();
        }
    }

    impl Drop for FakeRoot {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn pools_lists_global_then_nodes() {
        let r = FakeRoot::new("list");
        r.pool(None, PageSize::Size2M, 16, 12, 0);
        r.pool(None, PageSize::Size1G, 0, 0, 0);
        r.pool(Some(0), PageSize::Size2M, 10, 8, 0);
        r.pool(Some(1), PageSize::Size2M, 6, 4, 1);
        let p = pools_in(&r.0).unwrap();
        assert_eq!(p.len(), 4);
        assert_eq!(
            p[0],
            PoolInfo {
                node: None,
                size: PageSize::Size2M,
                total: 16,
                free: 12,
                surplus: 0
            }
        );
        assert_eq!(p[1].size, PageSize::Size1G);
        assert_eq!(p[2].node, Some(0));
        assert_eq!(
            p[3],
            PoolInfo {
                node: Some(1),
                size: PageSize::Size2M,
                total: 6,
                free: 4,
                surplus: 1
            }
        );
    }

    #[test]
    fn pools_rejects_garbage() {
        let r = FakeRoot::new("garbage");
        r.pool(None, PageSize::Size2M, 1, 1, 0);
        let d = size_dir(&r.0, None, PageSize::Size2M);
        fs::write(d.join("free_hugepages"), "lots\n").unwrap();
        let e = pools_in(&r.0).unwrap_err();
        assert!(
            matches!(e, HugeError::Parse { ref content, .. } if content == "lots"),
            "{e}"
        );
    }

    #[test]
    fn reserve_writes_and_reads_back() {
        let r = FakeRoot::new("reserve");
        r.pool(Some(0), PageSize::Size2M, 0, 0, 0);
        assert_eq!(reserve_in(&r.0, Some(0), PageSize::Size2M, 32).unwrap(), 32);
        let d = size_dir(&r.0, Some(0), PageSize::Size2M);
        assert_eq!(fs::read_to_string(d.join("nr_hugepages")).unwrap(), "32\n");
    }

    #[test]
    fn reserve_errors_name_the_cause() {
        let r = FakeRoot::new("reserve-err");
        r.pool(None, PageSize::Size2M, 0, 0, 0);
        let e = reserve_in(&r.0, Some(3), PageSize::Size2M, 1).unwrap_err();
        assert!(matches!(e, HugeError::NoSuchNode { node: 3, .. }), "{e}");
        let e = reserve_in(&r.0, None, PageSize::Size1G, 1).unwrap_err();
        assert!(
            e.to_string().contains("1 GiB hugepages are not supported"),
            "{e}"
        );
    }

    #[test]
    fn reserve_write_failure_is_an_io_error() {
        let r = FakeRoot::new("wfail");
        r.pool(None, PageSize::Size2M, 0, 0, 0);
        let d = size_dir(&r.0, None, PageSize::Size2M);
        // nr_hugepages as a directory makes the write fail.
        fs::remove_file(d.join("nr_hugepages")).unwrap();
        fs::create_dir(d.join("nr_hugepages")).unwrap();
        let e = reserve_in(&r.0, None, PageSize::Size2M, 4).unwrap_err();
        assert!(matches!(e, HugeError::Io { op: "write", .. }), "{e}");
    }

    #[test]
    fn free_pages_excludes_reserved_ones() {
        let r = FakeRoot::new("resv");
        r.pool(None, PageSize::Size2M, 10, 7, 0);
        let d = size_dir(&r.0, None, PageSize::Size2M);
        fs::write(d.join("resv_hugepages"), "3\n").unwrap();
        assert_eq!(free_pages_in(&r.0, None, PageSize::Size2M).unwrap(), 4);
    }

    #[test]
    fn free_pages_reads_the_node() {
        let r = FakeRoot::new("free");
        r.pool(Some(0), PageSize::Size2M, 10, 7, 0);
        assert_eq!(free_pages_in(&r.0, Some(0), PageSize::Size2M).unwrap(), 7);
    }

    #[test]
    fn real_sysfs_parses() {
        // The host or guest this runs on has /sys; whatever is reserved, it must parse and
        // be self-consistent.
        for p in pools().unwrap() {
            assert!(p.free <= p.total + p.surplus, "{p:?}");
        }
    }
}
