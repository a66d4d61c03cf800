//! Errors of the hugepage crate: each names the cause and what to do.

use std::path::PathBuf;

use crate::PageSize;

/// Why a hugepage operation failed.
#[derive(Debug, thiserror::Error)]
pub enum HugeError {
    /// Not enough free hugepages of the size (on the node, when one was asked for).
    #[error(
        "no free {size} hugepages {where_} (need {need}, free {free}): run scripts/setup.sh \
         (HUGEMEM=<MiB>) or `echo N > {hint}`",
        where_ = node.map(|n| format!("on node {n}")).unwrap_or_else(|| "on any node".into()),
        hint = reserve_hint(*size, *node)
    )]
    NoFreePages {
        /// The page size asked for.
        size: PageSize,
        /// The NUMA node asked for, if any.
        node: Option<u32>,
        /// Pages needed.
        need: u64,
        /// Pages free there.
        free: u64,
    },
    /// The kernel reserved fewer pages than asked for.
    #[error(
        "asked the kernel to reserve {wanted} {size} hugepages {where_} but it reserved only \
         {got} (memory too fragmented or too small): reserve at boot (hugepages=N on the kernel \
         command line) or free memory and retry",
        where_ = node.map(|n| format!("on node {n}")).unwrap_or_else(|| "in total".into())
    )]
    ReserveShort {
        /// The page size.
        size: PageSize,
        /// The NUMA node, if any.
        node: Option<u32>,
        /// Pages asked for.
        wanted: u64,
        /// Pages the kernel holds now.
        got: u64,
    },
    /// This page size is not configured in the kernel (no sysfs directory for it).
    #[error("{size} hugepages are not supported by this kernel ({path} missing): use 2 MiB pages or boot with hugepagesz=1G")]
    SizeUnsupported {
        /// The page size.
        size: PageSize,
        /// The sysfs directory that is missing.
        path: PathBuf,
    },
    /// No such NUMA node.
    #[error(
        "NUMA node {node} does not exist ({path} missing): see /sys/devices/system/node/online"
    )]
    NoSuchNode {
        /// The node asked for.
        node: u32,
        /// The sysfs directory that is missing.
        path: PathBuf,
    },
    /// A sysfs or procfs file could not be read or written.
    #[error("{op} {path}: {source} (are you root? is sysfs mounted?)")]
    Io {
        /// What was being done ("read", "write").
        op: &'static str,
        /// The file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A sysfs file held something that is not a number.
    #[error("unexpected content {content:?} in {path}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What it held.
        content: String,
    },
    /// A zero or overflowing length was asked for.
    #[error("invalid hugepage allocation length {len}: must be > 0 and fit the address space")]
    InvalidLength {
        /// The length asked for.
        len: usize,
    },
    /// memfd_create(MFD_HUGETLB) failed.
    #[error("memfd_create(MFD_HUGETLB, {size}) failed: {source} (kernel without hugetlbfs?)")]
    Memfd {
        /// The page size.
        size: PageSize,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// mmap or populating the mapping failed.
    #[error("mapping {len} bytes of {size} hugepages failed in {op}: {source}; check free pages with `grep Huge /proc/meminfo` and reserve more (scripts/setup.sh)")]
    Map {
        /// The call that failed.
        op: &'static str,
        /// Bytes asked for.
        len: usize,
        /// The page size.
        size: PageSize,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// mbind to the NUMA node failed.
    #[error("mbind to NUMA node {node} failed: {source}")]
    Mbind {
        /// The node.
        node: u32,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The page is not present or the kernel hid its frame number.
    #[error("no physical address for {addr:#x}: {reason}")]
    NoPhysAddr {
        /// The virtual address.
        addr: usize,
        /// Why.
        reason: &'static str,
    },
}

fn reserve_hint(size: PageSize, node: Option<u32>) -> String {
    match node {
        Some(n) => format!(
            "/sys/devices/system/node/node{n}/hugepages/hugepages-{}/nr_hugepages",
            size.kib_name()
        ),
        None => format!(
            "/sys/kernel/mm/hugepages/hugepages-{}/nr_hugepages",
            size.kib_name()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_free_pages_message_says_what_to_do() {
        let e = HugeError::NoFreePages {
            size: PageSize::Size2M,
            node: Some(0),
            need: 256,
            free: 0,
        };
        let m = e.to_string();
        assert!(
            m.starts_with("no free 2 MiB hugepages on node 0 (need 256, free 0): run scripts/setup.sh (HUGEMEM="),
            "{m}"
        );
        assert!(
            m.contains("node0/hugepages/hugepages-2048kB/nr_hugepages"),
            "{m}"
        );
    }
}
