//! The table of pool regions registered once as io_uring fixed buffers.

/// The largest single registered buffer the kernel accepts.
pub const MAX_FIXED_LEN: usize = 1 << 30;

/// One registered iovec.
#[derive(Debug, Clone, Copy)]
struct FixedBuf {
    start: usize,
    len: usize,
}

/// Registered buffers in registration order (index = io_uring buf_index).
#[derive(Debug, Default)]
pub struct FixedTable {
    bufs: Vec<FixedBuf>,
}

impl FixedTable {
    /// Split each `(addr, len)` range into chunks of at most [`MAX_FIXED_LEN`].
    pub fn from_ranges(ranges: &[(usize, usize)]) -> FixedTable {
        let mut bufs = Vec::new();
        for &(start, len) in ranges {
            let mut off = 0;
            while off < len {
                let l = (len - off).min(MAX_FIXED_LEN);
                bufs.push(FixedBuf {
                    start: start + off,
                    len: l,
                });
                off += l;
            }
        }
        FixedTable { bufs }
    }

    /// The iovecs to hand to IORING_REGISTER_BUFFERS.
    pub fn iovecs(&self) -> Vec<libc::iovec> {
        self.bufs
            .iter()
            .map(|b| libc::iovec {
                iov_base: b.start as *mut libc::c_void,
                iov_len: b.len,
            })
            .collect()
    }

    /// How many buffers are registered.
    pub fn len(&self) -> usize {
        self.bufs.len()
    }

    /// True when no buffer is registered.
    pub fn is_empty(&self) -> bool {
        self.bufs.is_empty()
    }

    /// The buf_index of the registered buffer wholly containing `[addr, addr+len)`.
    /// A linear scan: the table holds a handful of regions. No allocation.
    pub fn index_of(&self, addr: usize, len: usize) -> Option<u16> {
        let end = addr.checked_add(len)?;
        self.bufs
            .iter()
            .position(|b| addr >= b.start && end <= b.start + b.len)
            .and_then(|i| u16::try_from(i).ok())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn splits_large_regions() {
        let t = FixedTable::from_ranges(&[(0x1000_0000, 2 * MAX_FIXED_LEN + 4096)]);
        assert_eq!(t.len(), 3);
        assert_eq!(t.index_of(0x1000_0000, 4096), Some(0));
        assert_eq!(t.index_of(0x1000_0000 + MAX_FIXED_LEN, 4096), Some(1));
        // straddling a chunk boundary is not one fixed buffer
        assert_eq!(t.index_of(0x1000_0000 + MAX_FIXED_LEN - 512, 1024), None);
        assert_eq!(t.index_of(0x1000_0000 + 2 * MAX_FIXED_LEN, 4096), Some(2));
        assert_eq!(t.index_of(0x1000_0000 + 2 * MAX_FIXED_LEN, 4097), None);
    }

    proptest! {
        #[test]
        fn index_of_contains(start in 0x1000usize..0x1_0000_0000, len in 1usize..(1<<20), a in 0usize..(1<<21), l in 1usize..(1<<20)) {
            let t = FixedTable::from_ranges(&[(start, len)]);
            let addr = start + a;
            let inside = a + l <= len;
            prop_assert_eq!(t.index_of(addr, l).is_some(), inside);
        }
    }
}
