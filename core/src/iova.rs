//! IOVA allocation: first-fit over the domain's valid IOVA ranges, aligned, with frees that
//! coalesce. Free ranges live in a BTreeMap keyed by start, so frees and neighbour merges are
//! O(log n); a first-fit search walks the (few) free fragments.

use std::collections::BTreeMap;
use std::ops::Range;

/// Why an allocation failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IovaError {
    /// Zero length, or alignment not a power of two.
    BadRequest,
    /// No free range fits; carries the largest free range's length.
    Exhausted {
        /// Length of the largest free range.
        largest_free: u64,
    },
    /// Free of a range that was not allocated (or with another length).
    NotAllocated,
}

/// An IOVA space allocator.
#[derive(Debug, Clone)]
pub struct IovaAllocator {
    /// Free ranges: start -> end (exclusive).
    free: BTreeMap<u64, u64>,
    /// Allocated ranges: start -> length.
    used: BTreeMap<u64, u64>,
}

impl IovaAllocator {
    /// An allocator over `ranges` (half-open, may be unsorted; overlaps are merged).
    pub fn new(ranges: &[Range<u64>]) -> IovaAllocator {
        let mut a = IovaAllocator {
            free: BTreeMap::new(),
            used: BTreeMap::new(),
        };
        for r in ranges.iter().filter(|r| r.start < r.end) {
            a.insert_free(r.start, r.end);
        }
        a
    }

    /// Allocate `len` bytes aligned to `align` (a power of two). Returns the start.
    pub fn alloc(&mut self, len: u64, align: u64) -> Result<u64, IovaError> {
        if len == 0 || !align.is_power_of_two() {
            return Err(IovaError::BadRequest);
        }
        let mut found = None;
        for (&s, &e) in &self.free {
            let Some(a) = s.checked_add(align - 1).map(|v| v & !(align - 1)) else {
                continue;
            };
            if a.checked_add(len).is_some_and(|end| end <= e) {
                found = Some((s, e, a));
                break;
            }
        }
        let Some((s, e, a)) = found else {
            return Err(IovaError::Exhausted {
                largest_free: self.largest_free(),
            });
        };
        self.free.remove(&s);
        if a > s {
            self.free.insert(s, a);
        }
        if a + len < e {
            self.free.insert(a + len, e);
        }
        self.used.insert(a, len);
        Ok(a)
    }

    /// Return `[start, start+len)`, which must be exactly one earlier allocation.
    pub fn free(&mut self, start: u64, len: u64) -> Result<(), IovaError> {
        match self.used.get(&start) {
            Some(&l) if l == len => {}
            _ => return Err(IovaError::NotAllocated),
        }
        self.used.remove(&start);
        self.insert_free(start, start + len);
        Ok(())
    }

    /// Mark `[start, start+len)` allocated (a mapping that already exists, carried over when
    /// the valid ranges change): the part inside free ranges is taken out of them. Refused
    /// (nothing changes) when it overlaps an allocation.
    pub fn reserve(&mut self, start: u64, len: u64) -> Result<(), IovaError> {
        let end = start.checked_add(len).ok_or(IovaError::BadRequest)?;
        if len == 0 {
            return Err(IovaError::BadRequest);
        }
        if let Some((&us, &ul)) = self.used.range(..end).next_back() {
            if us + ul > start {
                return Err(IovaError::BadRequest);
            }
        }
        let hit: Vec<(u64, u64)> = self
            .free
            .range(..end)
            .filter(|(_, &e)| e > start)
            .map(|(&s, &e)| (s, e))
            .collect();
        for (s, e) in hit {
            self.free.remove(&s);
            if s < start {
                self.free.insert(s, start);
            }
            if e > end {
                self.free.insert(end, e);
            }
        }
        self.used.insert(start, len);
        Ok(())
    }

    /// The length of the largest free range.
    pub fn largest_free(&self) -> u64 {
        self.free.iter().map(|(s, e)| e - s).max().unwrap_or(0)
    }

    /// Bytes allocated.
    pub fn used_bytes(&self) -> u64 {
        self.used.values().sum()
    }

    /// Number of live allocations.
    pub fn allocations(&self) -> usize {
        self.used.len()
    }

    /// The free ranges, in order (for tests and diagnostics).
    pub fn free_ranges(&self) -> Vec<Range<u64>> {
        self.free.iter().map(|(&s, &e)| s..e).collect()
    }

    /// Insert a free range, merging with overlapping or adjacent neighbours.
    fn insert_free(&mut self, mut s: u64, mut e: u64) {
        // Merge with a predecessor that reaches s.
        if let Some((&ps, &pe)) = self.free.range(..=s).next_back() {
            if pe >= s {
                self.free.remove(&ps);
                s = ps;
                e = e.max(pe);
            }
        }
        // Merge with successors starting inside or right at the end.
        while let Some((&ns, &ne)) = self.free.range(s..).next() {
            if ns > e {
                break;
            }
            self.free.remove(&ns);
            e = e.max(ne);
        }
        self.free.insert(s, e);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const GUEST: [Range<u64>; 2] = [0x1_0000..0xfee0_0000, 0xfef0_0000..(1 << 48)];

    #[test]
    fn a_reserved_range_is_never_handed_out_and_frees_normally() {
        let mut a = IovaAllocator::new(std::slice::from_ref(&(0x10_0000..0x10_4000)));
        a.reserve(0x10_1000, 0x1000).unwrap();
        assert_eq!(
            a.free_ranges(),
            vec![0x10_0000..0x10_1000, 0x10_2000..0x10_4000]
        );
        assert_eq!(a.alloc(0x1000, 0x1000), Ok(0x10_0000));
        assert_eq!(a.alloc(0x1000, 0x1000), Ok(0x10_2000));
        // Overlapping an allocation is refused and changes nothing.
        assert_eq!(a.reserve(0x10_2800, 0x1000), Err(IovaError::BadRequest));
        assert_eq!(a.allocations(), 3);
        a.free(0x10_1000, 0x1000).unwrap();
        assert_eq!(a.alloc(0x1000, 0x1000), Ok(0x10_1000));
    }

    #[test]
    fn honours_ranges_and_alignment() {
        let mut a = IovaAllocator::new(&GUEST);
        let x = a.alloc(0x1000, 0x20_0000).unwrap();
        assert_eq!(x, 0x20_0000);
        // A request that does not fit below the MSI hole goes above it.
        let big = a.alloc(0x1_0000_0000, 0x1000).unwrap();
        assert_eq!(big, 0xfef0_0000);
        assert!(a.alloc(0, 4096).is_err());
        assert_eq!(a.alloc(4096, 3), Err(IovaError::BadRequest));
    }

    #[test]
    fn exhaustion_reports_largest_free() {
        let mut a = IovaAllocator::new(std::slice::from_ref(&(0x1000..0x5000)));
        a.alloc(0x2000, 0x1000).unwrap();
        assert_eq!(
            a.alloc(0x3000, 0x1000),
            Err(IovaError::Exhausted {
                largest_free: 0x2000
            })
        );
    }

    #[test]
    fn frees_coalesce_and_reject_strangers() {
        let mut a = IovaAllocator::new(std::slice::from_ref(&(0x1000..0x9000)));
        let x = a.alloc(0x1000, 0x1000).unwrap();
        let y = a.alloc(0x1000, 0x1000).unwrap();
        let z = a.alloc(0x1000, 0x1000).unwrap();
        assert_eq!(a.free(y, 0x2000), Err(IovaError::NotAllocated));
        a.free(y, 0x1000).unwrap();
        assert_eq!(a.free(y, 0x1000), Err(IovaError::NotAllocated));
        a.free(x, 0x1000).unwrap();
        a.free(z, 0x1000).unwrap();
        assert_eq!(
            a.free_ranges(),
            std::iter::once(0x1000..0x9000).collect::<Vec<_>>()
        );
        assert_eq!(a.allocations(), 0);
    }

    proptest! {
        #[test]
        fn never_overlaps_respects_ranges_and_coalesces(
            ops in proptest::collection::vec((1u64..64, 0u32..6, any::<bool>(), any::<prop::sample::Index>()), 1..200)
        ) {
            let ranges = [0x10_000u64..0x80_000, 0x90_000..0x200_000];
            let mut a = IovaAllocator::new(&ranges);
            let mut live: Vec<(u64, u64)> = Vec::new();
            for (pages, align_log, free, idx) in ops {
                if free && !live.is_empty() {
                    let (s, l) = live.swap_remove(idx.index(live.len()));
                    prop_assert!(a.free(s, l).is_ok());
                    continue;
                }
                let len = pages * 0x1000;
                let align = 0x1000u64 << align_log;
                match a.alloc(len, align) {
                    Ok(s) => {
                        prop_assert_eq!(s % align, 0);
                        prop_assert!(ranges.iter().any(|r| r.start <= s && s + len <= r.end));
                        for &(t, m) in &live {
                            prop_assert!(s + len <= t || t + m <= s, "overlap");
                        }
                        live.push((s, len));
                    }
                    Err(IovaError::Exhausted { largest_free }) => {
                        // Nothing of this size fits: either too long, or alignment defeats it.
                        prop_assert!(largest_free < len + align);
                    }
                    Err(e) => prop_assert!(false, "unexpected {:?}", e),
                }
            }
            prop_assert_eq!(a.allocations(), live.len());
            for (s, l) in live.drain(..) {
                a.free(s, l).unwrap();
            }
            prop_assert_eq!(a.free_ranges(), ranges.to_vec());
        }
    }
}
