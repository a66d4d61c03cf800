//! Hugepage sizes supported by x86-64 Linux.

use std::fmt;

/// A hugepage size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PageSize {
    /// 2 MiB pages.
    Size2M,
    /// 1 GiB pages.
    Size1G,
}

impl PageSize {
    /// Every supported size, smallest first.
    pub const ALL: [PageSize; 2] = [PageSize::Size2M, PageSize::Size1G];

    /// The page size in bytes.
    pub const fn bytes(self) -> u64 {
        match self {
            PageSize::Size2M => 2 << 20,
            PageSize::Size1G => 1 << 30,
        }
    }

    /// The size for a byte count, if it is a supported hugepage size.
    pub const fn from_bytes(bytes: u64) -> Option<PageSize> {
        match bytes {
            0x20_0000 => Some(PageSize::Size2M),
            0x4000_0000 => Some(PageSize::Size1G),
            _ => None,
        }
    }

    /// The name sysfs uses for this size: "2048kB" or "1048576kB".
    pub const fn kib_name(self) -> &'static str {
        match self {
            PageSize::Size2M => "2048kB",
            PageSize::Size1G => "1048576kB",
        }
    }

    /// The size for a sysfs name such as "2048kB" (also accepts "hugepages-2048kB").
    pub fn from_kib_name(name: &str) -> Option<PageSize> {
        let name = name.strip_prefix("hugepages-").unwrap_or(name);
        PageSize::ALL.into_iter().find(|s| s.kib_name() == name)
    }

    /// `len` rounded up to a whole number of pages (None on overflow).
    pub fn round_up(self, len: usize) -> Option<usize> {
        let p = self.bytes() as usize;
        len.checked_add(p - 1).map(|v| v & !(p - 1))
    }
}

impl fmt::Display for PageSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PageSize::Size2M => f.write_str("2 MiB"),
            PageSize::Size1G => f.write_str("1 GiB"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_bytes_round_trip() {
        for s in PageSize::ALL {
            assert_eq!(PageSize::from_bytes(s.bytes()), Some(s));
            assert_eq!(PageSize::from_kib_name(s.kib_name()), Some(s));
            assert_eq!(
                PageSize::from_kib_name(&format!("hugepages-{}", s.kib_name())),
                Some(s)
            );
        }
        assert_eq!(PageSize::from_bytes(4096), None);
        assert_eq!(PageSize::from_kib_name("4kB"), None);
    }

    #[test]
    fn round_up_to_pages() {
        assert_eq!(PageSize::Size2M.round_up(1), Some(2 << 20));
        assert_eq!(PageSize::Size2M.round_up(2 << 20), Some(2 << 20));
        assert_eq!(PageSize::Size2M.round_up((2 << 20) + 1), Some(4 << 20));
        assert_eq!(PageSize::Size1G.round_up(0), Some(0));
        assert_eq!(PageSize::Size2M.round_up(usize::MAX), None);
    }
}
