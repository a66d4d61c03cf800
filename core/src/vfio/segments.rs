//! [`DmaSegment`]: the physically contiguous pieces of a no-IOMMU mapping. Without an IOMMU a
//! device sees physical addresses, and the hugepages of one virtual range are usually scattered
//! in physical memory: the range is split per page into maximal contiguous runs, each at its
//! own bus address. Buffers handed out of such memory never cross a run's end (pools and DMA
//! slabs carve inside the runs), so a buffer is always one bus address range.
//! Pure functions over an injected physical-address lookup, tested on the host.

/// One physically contiguous piece of a mapping: bytes `[offset, offset+len)` of the mapped
/// memory are at bus addresses `[iova, iova+len)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DmaSegment {
    /// Byte offset of the piece in the mapping.
    pub offset: usize,
    /// Length in bytes.
    pub len: usize,
    /// Bus address of the piece's first byte.
    pub iova: u64,
}

impl DmaSegment {
    /// True when bytes `[offset, offset+len)` of the mapping lie inside this piece.
    pub fn holds(&self, offset: usize, len: usize) -> bool {
        offset >= self.offset
            && offset
                .checked_add(len)
                .is_some_and(|e| e <= self.offset + self.len)
    }
}

/// The pages of `[vaddr, vaddr+len)` (pages of `page` bytes, a power of two) grouped into
/// maximal physically contiguous runs, in order; `phys` gives the physical address of a
/// page-aligned virtual address. The first run starts at `vaddr` itself (mid-page), the last
/// ends at `vaddr+len`. On a lookup error: the page's address and the error.
pub(crate) fn contiguous_runs(
    vaddr: usize,
    len: usize,
    page: usize,
    mut phys: impl FnMut(usize) -> Result<u64, String>,
) -> Result<Vec<DmaSegment>, (usize, String)> {
    debug_assert!(page.is_power_of_two() && len > 0);
    let end = vaddr + len;
    let first = vaddr & !(page - 1);
    let base = phys(first).map_err(|e| (first, e))?;
    let mut runs = vec![DmaSegment {
        offset: 0,
        len: (first + page).min(end) - vaddr,
        iova: base + (vaddr - first) as u64,
    }];
    let mut at = first + page;
    while at < end {
        let p = phys(at).map_err(|e| (at, e))?;
        let n = page.min(end - at);
        let last = runs.last_mut().expect("one run at least");
        if last.iova + last.len as u64 == p {
            last.len += n;
        } else {
            runs.push(DmaSegment {
                offset: at - vaddr,
                len: n,
                iova: p,
            });
        }
        at += page;
    }
    Ok(runs)
}

/// The bus address of byte `offset` of a mapping at `base` whose pieces are `segments` (empty:
/// one contiguous range).
#[inline]
pub(crate) fn iova_at(segments: &[DmaSegment], base: u64, offset: usize) -> u64 {
    if segments.is_empty() {
        return base + offset as u64;
    }
    let i = segments.partition_point(|s| s.offset <= offset).max(1) - 1;
    let s = &segments[i];
    s.iova + (offset - s.offset) as u64
}

/// The offset in the mapping of bus addresses `[iova, iova+len)` when they lie inside one
/// piece (or inside `[base, base+total)` without pieces).
pub(crate) fn offset_of(
    segments: &[DmaSegment],
    base: u64,
    total: usize,
    iova: u64,
    len: usize,
) -> Option<usize> {
    let inside = |start: u64, n: usize| {
        iova >= start
            && iova
                .checked_add(len as u64)
                .is_some_and(|e| e <= start + n as u64)
    };
    if segments.is_empty() {
        return inside(base, total).then(|| (iova - base) as usize);
    }
    segments
        .iter()
        .find(|s| inside(s.iova, s.len))
        .map(|s| s.offset + (iova - s.iova) as usize)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MB2: usize = 2 << 20;
    const H: usize = 0x7f00_0000_0000;

    fn frames(f: &[u64]) -> impl FnMut(usize) -> Result<u64, String> + '_ {
        move |a| {
            assert_eq!(a % MB2, 0, "unaligned lookup {a:#x}");
            f.get((a - H) / MB2)
                .copied()
                .ok_or_else(|| "not present".into())
        }
    }

    #[test]
    fn scattered_hugepages_split_into_runs_and_contiguous_ones_merge() {
        // Pages 0-1 contiguous, 2 elsewhere, 3 right after 2, 4 below everything.
        let f = [
            0x1_0000_0000,
            0x1_0020_0000,
            0x5000_0000,
            0x5020_0000,
            0x20_0000,
        ];
        let r = contiguous_runs(H, 5 * MB2, MB2, frames(&f)).unwrap();
        assert_eq!(
            r,
            vec![
                DmaSegment {
                    offset: 0,
                    len: 2 * MB2,
                    iova: 0x1_0000_0000
                },
                DmaSegment {
                    offset: 2 * MB2,
                    len: 2 * MB2,
                    iova: 0x5000_0000
                },
                DmaSegment {
                    offset: 4 * MB2,
                    len: MB2,
                    iova: 0x20_0000
                },
            ]
        );
        assert_eq!(iova_at(&r, 0x1_0000_0000, 2 * MB2 + 5), 0x5000_0005);
        assert_eq!(iova_at(&r, 0x1_0000_0000, MB2 + 7), 0x1_0020_0007);
        assert_eq!(offset_of(&r, 0, 0, 0x5020_0000, 4096), Some(3 * MB2));
        // Bus addresses across two runs are not one piece.
        assert_eq!(offset_of(&r, 0, 0, 0x1_003f_f000, 8192), None);
    }

    #[test]
    fn a_range_starting_and_ending_mid_page_keeps_its_offsets() {
        let f = [0x4000_0000, 0x8000_0000];
        let r = contiguous_runs(H + 0x1000, MB2, MB2, frames(&f)).unwrap();
        assert_eq!(
            r,
            vec![
                DmaSegment {
                    offset: 0,
                    len: MB2 - 0x1000,
                    iova: 0x4000_1000
                },
                DmaSegment {
                    offset: MB2 - 0x1000,
                    len: 0x1000,
                    iova: 0x8000_0000
                },
            ]
        );
    }

    #[test]
    fn a_missing_frame_names_the_page() {
        let e = contiguous_runs(H, 3 * MB2, MB2, frames(&[1 << 30])).unwrap_err();
        assert_eq!(e.0, H + MB2);
    }

    proptest! {
        /// For any physical layout: the runs cover the range in order without gaps, every
        /// byte's bus address is its page's frame plus the offset in the page, and no two
        /// neighbouring runs could have been one.
        #[test]
        fn runs_cover_the_range_and_map_every_byte_to_its_frame(
            pages in proptest::collection::vec(0u64..8, 1..24),
            head in 0usize..4,
            tail in 0usize..4,
        ) {
            // Frame of page i: a few "slots" so that runs of neighbours happen often.
            let f: Vec<u64> = pages.iter().enumerate()
                .map(|(i, &s)| if s < 4 { (1 << 32) + (i * MB2) as u64 } else { (s << 28) + (i * MB2) as u64 * 3 })
                .collect();
            let vaddr = H + head * 0x1000;
            let len = pages.len() * MB2 - head * 0x1000 - tail * 0x1000;
            let r = contiguous_runs(vaddr, len, MB2, frames(&f)).unwrap();
            let mut next = 0;
            for s in &r {
                prop_assert_eq!(s.offset, next);
                prop_assert!(s.len > 0);
                next += s.len;
            }
            prop_assert_eq!(next, len);
            for w in r.windows(2) {
                prop_assert_ne!(w[0].iova + w[0].len as u64, w[1].iova);
            }
            for off in (0..len).step_by(0x1000).chain([len - 1]) {
                let va = vaddr + off;
                let want = f[(va - H) / MB2] + (va % MB2) as u64;
                prop_assert_eq!(iova_at(&r, r[0].iova, off), want);
                prop_assert_eq!(offset_of(&r, 0, 0, want, 1), Some(off));
            }
        }
    }
}
