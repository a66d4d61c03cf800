//! PRP1 / PRP2 / PRP-list construction for one command's data buffer.
//!
//! The data is a sequence of IOVA segments. PRP rules (NVMe base spec 4.1.1): the first segment
//! may start at any dword-aligned offset within a memory page; every later segment must start on
//! a page boundary and every segment but the last must end on one. One entry per memory page;
//! two pages fit in PRP1/PRP2 directly, more go into a PRP list whose last entry on a full list
//! page chains to the next list page. List pages are pre-registered by the caller, contiguous in
//! IOVA, so building allocates nothing.

use thiserror::Error;

/// Why a buffer cannot be described by PRPs.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PrpError {
    /// The transfer has no bytes.
    #[error("PRP: empty transfer (length 0): give a length of at least one logical block")]
    Empty,
    /// The first segment does not start on a dword (4 byte) boundary.
    #[error("PRP: buffer IOVA {iova:#x} is not dword aligned: start the transfer at a multiple of 4 bytes")]
    Misaligned {
        /// Offending address.
        iova: u64,
    },
    /// A segment after the first does not start on a memory page boundary, or one before the
    /// last does not end on one.
    #[error("PRP: scatter segment {index} at IOVA {iova:#x} (len {len}) breaks page alignment: inner segment boundaries must be on {page_size}-byte pages")]
    SegmentNotPageAligned {
        /// Segment index.
        index: usize,
        /// Segment start.
        iova: u64,
        /// Segment length.
        len: usize,
        /// The memory page size in use.
        page_size: usize,
    },
    /// More entries than the pre-registered list pages hold.
    #[error("PRP: transfer needs more than the {capacity} PRP list entries pre-registered for a command: split it or raise the per-command transfer limit")]
    ListTooSmall {
        /// Entries available.
        capacity: usize,
    },
}

/// PRP1 and PRP2 of a built command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Prps {
    /// PRP entry 1.
    pub prp1: u64,
    /// PRP entry 2 (0, a second page, or the list pointer).
    pub prp2: u64,
    /// Number of data pointers (pages) described.
    pub entries: usize,
}

/// Number of list pages a single command of up to `max_bytes` (starting at any offset) needs.
pub fn list_pages_needed(page_size: usize, max_bytes: usize) -> usize {
    let data_pages = max_bytes.div_ceil(page_size) + 1; // +1: an unaligned start
    let in_list = data_pages.saturating_sub(1);
    if in_list <= 1 {
        return 0;
    }
    let per_page = page_size / 8;
    // k pages hold k*(per_page-1)+1 entries (all but the last spend one on the chain).
    (in_list - 1).div_ceil(per_page - 1)
}

/// Builds PRPs for `segments` (IOVA, length) with memory page size `page_size`, writing any list
/// into `list` (little-endian u64 entries, contiguous list pages starting at IOVA `list_iova`).
pub fn build<I>(
    page_size: usize,
    segments: I,
    list: &mut [u64],
    list_iova: u64,
) -> Result<Prps, PrpError>
where
    I: IntoIterator<Item = (u64, usize)>,
{
    let ps = page_size as u64;
    let per_page = page_size / 8;
    let mut w = ListWriter {
        list,
        list_iova,
        page_size: ps,
        per_page,
        pos: 0,
    };
    let mut prp1 = 0u64;
    let mut pending = 0u64;
    let mut count = 0usize;
    let mut rules = Alignment::new(page_size);
    for (index, (iova, len)) in segments.into_iter().enumerate() {
        if len == 0 {
            continue;
        }
        rules.admit(index, iova, len)?;
        let end = iova + len as u64;
        let mut p = iova;
        while p < end {
            match count {
                0 => prp1 = p,
                1 => pending = p,
                _ => {
                    w.place(pending, false)?;
                    pending = p;
                }
            }
            count += 1;
            p = (p / ps + 1) * ps;
        }
    }
    if rules.total == 0 {
        return Err(PrpError::Empty);
    }
    let prp2 = match count {
        1 => 0,
        2 => pending,
        _ => {
            w.place(pending, true)?;
            list_iova
        }
    };
    Ok(Prps {
        prp1,
        prp2,
        entries: count,
    })
}

/// Checks that `segments` can be described by PRPs under the alignment rules of [`build`],
/// writing nothing: for a queued request whose later commands are built when slots free up.
/// (The list size is not checked: a command never exceeds the per-command limit the list
/// pages were sized for.)
pub fn check<I>(page_size: usize, segments: I) -> Result<(), PrpError>
where
    I: IntoIterator<Item = (u64, usize)>,
{
    let mut rules = Alignment::new(page_size);
    for (index, (iova, len)) in segments.into_iter().enumerate() {
        if len != 0 {
            rules.admit(index, iova, len)?;
        }
    }
    if rules.total == 0 {
        return Err(PrpError::Empty);
    }
    Ok(())
}

/// The alignment rules of [`build`] and [`check`], applied to one non-empty segment after
/// another: the first starts dword aligned, every later one starts on a page that the one before
/// ended on.
struct Alignment {
    page_size: usize,
    first: bool,
    prev_end_aligned: bool,
    /// Bytes admitted so far.
    total: usize,
}

impl Alignment {
    fn new(page_size: usize) -> Alignment {
        Alignment {
            page_size,
            first: true,
            prev_end_aligned: true,
            total: 0,
        }
    }

    /// Admits segment `index` (`len` > 0 bytes at `iova`), or says which rule it breaks.
    #[inline]
    fn admit(&mut self, index: usize, iova: u64, len: usize) -> Result<(), PrpError> {
        let ps = self.page_size as u64;
        if self.first {
            if iova & 3 != 0 {
                return Err(PrpError::Misaligned { iova });
            }
        } else if iova % ps != 0 || !self.prev_end_aligned {
            return Err(PrpError::SegmentNotPageAligned {
                index,
                iova,
                len,
                page_size: self.page_size,
            });
        }
        self.first = false;
        self.prev_end_aligned = (iova + len as u64) % ps == 0;
        self.total += len;
        Ok(())
    }
}

struct ListWriter<'a> {
    list: &'a mut [u64],
    list_iova: u64,
    page_size: u64,
    per_page: usize,
    pos: usize,
}

impl ListWriter<'_> {
    /// Put one more data entry into the list. When this page's last slot is reached and more
    /// entries follow (`last` false), that slot chains to the next list page.
    fn place(&mut self, entry: u64, last: bool) -> Result<(), PrpError> {
        let capacity = self.list.len();
        if !last && self.pos % self.per_page == self.per_page - 1 {
            // Last slot of a list page and `entry` is not the final one: chain.
            let next = (self.pos + 1) / self.per_page;
            if self.pos + 1 >= capacity {
                return Err(PrpError::ListTooSmall { capacity });
            }
            self.list[self.pos] = (self.list_iova + next as u64 * self.page_size).to_le();
            self.pos += 1;
        }
        if self.pos >= capacity {
            return Err(PrpError::ListTooSmall { capacity });
        }
        self.list[self.pos] = entry.to_le();
        self.pos += 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const PS: usize = 4096;
    const LIST_IOVA: u64 = 0x7000_0000;

    /// Walk PRPs the way a controller does and return the byte ranges they describe.
    fn walk(p: Prps, total: usize, list: &[u64]) -> Vec<(u64, usize)> {
        let ps = PS as u64;
        let mut out = Vec::new();
        let mut left = total;
        let first = (ps - p.prp1 % ps).min(left as u64) as usize;
        out.push((p.prp1, first));
        left -= first;
        if left == 0 {
            return out;
        }
        if left <= PS {
            out.push((p.prp2, left));
            return out;
        }
        let per_page = PS / 8;
        let mut idx = ((p.prp2 - LIST_IOVA) / 8) as usize;
        while left > 0 {
            let e = u64::from_le(list[idx]);
            if idx % per_page == per_page - 1 && left > PS {
                // chain pointer
                idx = ((e - LIST_IOVA) / 8) as usize;
                continue;
            }
            assert_eq!(e % ps, 0, "list entries are page aligned");
            let n = left.min(PS);
            out.push((e, n));
            left -= n;
            idx += 1;
        }
        out
    }

    /// Merge adjacent ranges so that walk output and the input segments compare equal.
    fn merge(v: &[(u64, usize)]) -> Vec<(u64, usize)> {
        let mut out: Vec<(u64, usize)> = Vec::new();
        for &(a, l) in v {
            if let Some(last) = out.last_mut() {
                if last.0 + last.1 as u64 == a {
                    last.1 += l;
                    continue;
                }
            }
            out.push((a, l));
        }
        out
    }

    #[test]
    fn single_page_uses_prp1_only() {
        let mut list = vec![0u64; 512];
        let p = build(PS, [(0x1000_0200, 512)], &mut list, LIST_IOVA).unwrap();
        assert_eq!(
            p,
            Prps {
                prp1: 0x1000_0200,
                prp2: 0,
                entries: 1
            }
        );
    }

    #[test]
    fn page_crossing_uses_prp2_as_second_page() {
        let mut list = vec![0u64; 512];
        let p = build(PS, [(0x1000_0e00, 1024)], &mut list, LIST_IOVA).unwrap();
        assert_eq!(
            p,
            Prps {
                prp1: 0x1000_0e00,
                prp2: 0x1000_1000,
                entries: 2
            }
        );
    }

    #[test]
    fn three_pages_use_a_list() {
        let mut list = vec![0u64; 512];
        let p = build(PS, [(0x1000_0000, 3 * PS)], &mut list, LIST_IOVA).unwrap();
        assert_eq!(p.prp2, LIST_IOVA);
        assert_eq!(&list[..2], &[0x1000_1000, 0x1000_2000]);
    }

    #[test]
    fn chains_list_pages_at_the_last_slot() {
        let mut list = vec![0u64; 1024];
        // 1 + 513 entries: a list page holds 512, so 513 list entries need a chain.
        let p = build(PS, [(0x1000_0000, 514 * PS)], &mut list, LIST_IOVA).unwrap();
        assert_eq!(p.entries, 514);
        assert_eq!(list[511], LIST_IOVA + PS as u64);
        assert_eq!(list[512], 0x1000_0000 + 512 * PS as u64);
        // 1 + 512 entries fill exactly one list page without a chain.
        let mut list = vec![0u64; 512];
        let p = build(PS, [(0x1000_0000, 513 * PS)], &mut list, LIST_IOVA).unwrap();
        assert_eq!(p.entries, 513);
        assert_eq!(list[511], 0x1000_0000 + 512 * PS as u64);
    }

    #[test]
    fn rejects_bad_inputs() {
        let mut list = vec![0u64; 512];
        assert_eq!(
            build(PS, [(0x1002, 512)], &mut list, LIST_IOVA),
            Err(PrpError::Misaligned { iova: 0x1002 })
        );
        assert_eq!(
            build(PS, [(0x1000, 0)], &mut list, LIST_IOVA),
            Err(PrpError::Empty)
        );
        assert!(matches!(
            build(PS, [(0x1000, 100), (0x3000, 4096)], &mut list, LIST_IOVA),
            Err(PrpError::SegmentNotPageAligned { index: 1, .. })
        ));
        assert!(matches!(
            build(PS, [(0x1000, 4096), (0x3200, 4096)], &mut list, LIST_IOVA),
            Err(PrpError::SegmentNotPageAligned { index: 1, .. })
        ));
        let mut small = vec![0u64; 4];
        assert_eq!(
            build(PS, [(0x1000_0000, 10 * PS)], &mut small, LIST_IOVA),
            Err(PrpError::ListTooSmall { capacity: 4 })
        );
    }

    #[test]
    fn list_page_sizing() {
        assert_eq!(list_pages_needed(PS, 4096), 0);
        assert_eq!(list_pages_needed(PS, 8192), 1);
        assert_eq!(list_pages_needed(PS, 512 * 1024), 1);
        assert_eq!(list_pages_needed(PS, 2 * 1024 * 1024), 1);
        assert_eq!(list_pages_needed(PS, 2 * 1024 * 1024 + 4096), 2);
        assert_eq!(list_pages_needed(PS, 8 * 1024 * 1024), 5);
    }

    fn segments() -> impl Strategy<Value = Vec<(u64, usize)>> {
        // First segment: dword-aligned offset in a page, any length; later segments whole-page
        // aligned starts. Inner ends are forced to page boundaries.
        (
            0u64..1024,
            1usize..4,
            prop::collection::vec((1u64..4096, 1usize..700), 0..4),
            1usize..5000,
        )
            .prop_map(|(off_dw, first_pages, rest, tail)| {
                let ps = PS as u64;
                let mut v = Vec::new();
                let start = 0x4000_0000 + off_dw * 4;
                let n = rest.len();
                let first_len = if n == 0 {
                    (first_pages - 1) * PS + tail
                } else {
                    ((start / ps + first_pages as u64) * ps - start) as usize
                };
                v.push((start, first_len));
                for (i, (page, pages)) in rest.into_iter().enumerate() {
                    let len = if i + 1 == n {
                        (pages - 1) * PS + tail
                    } else {
                        pages * PS
                    };
                    v.push((0x1_0000_0000 + page * 0x100_0000, len));
                }
                v
            })
    }

    /// The PRP rules of the NVMe specification, written apart from `Alignment`: cut the
    /// transfer into page chunks (one PRP entry each); the first chunk may start anywhere dword
    /// aligned, every later one starts at offset 0 of a page and every chunk before the last
    /// ends at a page end. The first chunk boundary that breaks this blames the segment the
    /// later chunk belongs to. Ok: the number of entries (chunks).
    fn prp_rules(ps: usize, segs: &[(u64, usize)]) -> Result<usize, PrpError> {
        let ps64 = ps as u64;
        let mut chunks: Vec<(usize, u64, u64)> = Vec::new();
        for (i, &(iova, len)) in segs.iter().enumerate() {
            let end = iova + len as u64;
            let mut at = iova;
            while at < end {
                let next = (at / ps64 + 1) * ps64;
                chunks.push((i, at, next.min(end)));
                at = next.min(end);
            }
        }
        let Some(&(_, first, _)) = chunks.first() else {
            return Err(PrpError::Empty);
        };
        if first % 4 != 0 {
            return Err(PrpError::Misaligned { iova: first });
        }
        for w in chunks.windows(2) {
            let ((_, _, prev_end), (k, start, _)) = (w[0], w[1]);
            if start % ps64 != 0 || prev_end % ps64 != 0 {
                return Err(PrpError::SegmentNotPageAligned {
                    index: k,
                    iova: segs[k].0,
                    len: segs[k].1,
                    page_size: ps,
                });
            }
        }
        Ok(chunks.len())
    }

    #[test]
    fn the_prp_rules_oracle_on_known_cases() {
        assert_eq!(prp_rules(PS, &[]), Err(PrpError::Empty));
        assert_eq!(prp_rules(PS, &[(0x1000, 0)]), Err(PrpError::Empty));
        assert_eq!(prp_rules(PS, &[(0x1004, 8192)]), Ok(3));
        assert_eq!(
            prp_rules(PS, &[(0x1002, 8)]),
            Err(PrpError::Misaligned { iova: 0x1002 })
        );
        assert_eq!(prp_rules(PS, &[(0x1800, 0x800), (0x9000, 4096)]), Ok(2));
        // The first segment ends mid-page: the second is blamed.
        assert_eq!(
            prp_rules(PS, &[(0x1000, 0x800), (0x9000, 4096)]),
            Err(PrpError::SegmentNotPageAligned {
                index: 1,
                iova: 0x9000,
                len: 4096,
                page_size: PS
            })
        );
    }

    proptest! {
        #[test]
        fn prps_cover_exactly_the_byte_range(segs in segments()) {
            let total: usize = segs.iter().map(|s| s.1).sum();
            let mut list = vec![0u64; 8 * 512];
            let p = build(PS, segs.clone(), &mut list, LIST_IOVA).unwrap();
            let walked = walk(p, total, &list);
            prop_assert_eq!(walked.len(), p.entries);
            prop_assert_eq!(merge(&walked), merge(&segs));
        }

        /// `build` and `check` (queued requests) accept and refuse exactly what the PRP rules
        /// written apart in [`prp_rules`] do, with the same error, given a list big enough: any
        /// segments, well-formed or not (page-aligned ones often, to reach the accepting side).
        #[test]
        fn build_and_check_agree_with_the_prp_rules(
            segs in prop::collection::vec(
                (prop_oneof![(0u64..256).prop_map(|p| p * 4096), 0u64..(1 << 20)],
                 prop_oneof![(0usize..5).prop_map(|p| p * 4096), 0usize..20_000]),
                0..5,
            ),
        ) {
            let want = prp_rules(PS, &segs);
            let mut list = vec![0u64; 16 * 512];
            let built = build(PS, segs.clone(), &mut list, LIST_IOVA);
            prop_assert_eq!(built.map(|p| p.entries), want.clone());
            prop_assert_eq!(check(PS, segs), want.map(|_| ()));
        }

        #[test]
        fn sizing_is_enough_for_any_offset(bytes in 1usize..(9 << 20), off_dw in 0u64..1024) {
            let pages = list_pages_needed(PS, bytes);
            let mut list = vec![0u64; pages * 512];
            let r = build(PS, [(0x4000_0000 + off_dw * 4, bytes)], &mut list, LIST_IOVA);
            prop_assert!(r.is_ok(), "{:?}", r);
        }
    }
}
