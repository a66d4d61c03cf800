//! [`SubRange`]: the (IOVA, len) pieces of a byte range of a segment list (scatter lists split
//! into commands).

/// The (IOVA, len) pieces of bytes `[start, start+len)` of a sequence of (IOVA, len) segments.
pub(crate) struct SubRange<I> {
    segs: I,
    skip: usize,
    left: usize,
}

impl<I: Iterator<Item = (u64, usize)>> SubRange<I> {
    pub(crate) fn new(segs: I, start: usize, len: usize) -> SubRange<I> {
        SubRange {
            segs,
            skip: start,
            left: len,
        }
    }
}

impl<I: Iterator<Item = (u64, usize)>> Iterator for SubRange<I> {
    type Item = (u64, usize);
    fn next(&mut self) -> Option<(u64, usize)> {
        while self.left > 0 {
            let (iova, len) = self.segs.next()?;
            if self.skip >= len {
                self.skip -= len;
                continue;
            }
            let start = iova + self.skip as u64;
            let n = (len - self.skip).min(self.left);
            self.skip = 0;
            self.left -= n;
            return Some((start, n));
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::SubRange;
    use proptest::prelude::*;

    /// Byte addresses covered by a list of pieces, in order.
    fn bytes(v: &[(u64, usize)]) -> Vec<u64> {
        v.iter()
            .flat_map(|&(a, l)| (0..l as u64).map(move |i| a + i))
            .collect()
    }

    proptest! {
        #[test]
        fn sub_ranges_tile_the_whole(lens in prop::collection::vec(1usize..300, 1..6), cut in 1usize..200) {
            let segs: Vec<(u64, usize)> = lens.iter().enumerate().map(|(i, &l)| ((i as u64 + 1) << 20, l)).collect();
            let total: usize = lens.iter().sum();
            let mut pieces = Vec::new();
            let mut off = 0;
            while off < total {
                let n = cut.min(total - off);
                let p: Vec<_> = SubRange::new(segs.iter().copied(), off, n).collect();
                prop_assert_eq!(p.iter().map(|x| x.1).sum::<usize>(), n);
                pieces.extend(p);
                off += n;
            }
            prop_assert_eq!(bytes(&pieces), bytes(&segs));
        }
    }
}
