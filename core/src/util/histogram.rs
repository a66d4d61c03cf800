//! [`LatencyHistogram`]: log-linear buckets (32 per power of two, < 3.2 % relative error) over
//! u64 values, fixed size, so recording never allocates.

/// log2 of the sub-buckets per power of two.
const SUB_BITS: u32 = 5;
const SUB: u64 = 1 << SUB_BITS;
/// Buckets for the whole u64 range.
const BUCKETS: usize = ((64 - SUB_BITS as usize) + 1) * SUB as usize;

/// A latency histogram (values in any unit; `ubdirect perf` records TSC ticks).
#[derive(Clone)]
pub struct LatencyHistogram {
    counts: Box<[u64; BUCKETS]>,
    total: u64,
    sum: u128,
    min: u64,
    max: u64,
}

impl std::fmt::Debug for LatencyHistogram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LatencyHistogram")
            .field("count", &self.total)
            .field("min", &self.min)
            .field("max", &self.max)
            .finish()
    }
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        Self::new()
    }
}

#[inline(always)]
fn index(v: u64) -> usize {
    if v < SUB {
        v as usize
    } else {
        let msb = 63 - v.leading_zeros();
        let shift = msb - SUB_BITS;
        (((shift + 1) as u64) << SUB_BITS | ((v >> shift) & (SUB - 1))) as usize
    }
}

/// Lowest value of bucket `i` and the bucket's width.
fn bucket_range(i: usize) -> (u64, u64) {
    let i = i as u64;
    if i < 2 * SUB {
        (i, 1)
    } else {
        let shift = i / SUB - 1;
        ((SUB + i % SUB) << shift, 1 << shift)
    }
}

impl LatencyHistogram {
    /// An empty histogram (one allocation, here).
    pub fn new() -> LatencyHistogram {
        LatencyHistogram {
            counts: Box::new([0; BUCKETS]),
            total: 0,
            sum: 0,
            min: u64::MAX,
            max: 0,
        }
    }
    /// Record one value.
    #[inline(always)]
    pub fn record(&mut self, v: u64) {
        self.counts[index(v)] += 1;
        self.total += 1;
        self.sum += v as u128;
        self.min = self.min.min(v);
        self.max = self.max.max(v);
    }
    /// Values recorded.
    pub fn count(&self) -> u64 {
        self.total
    }
    /// Exact mean (0 when empty).
    pub fn mean(&self) -> f64 {
        if self.total == 0 {
            0.0
        } else {
            self.sum as f64 / self.total as f64
        }
    }
    /// Smallest value (0 when empty).
    pub fn min(&self) -> u64 {
        if self.total == 0 {
            0
        } else {
            self.min
        }
    }
    /// Largest value.
    pub fn max(&self) -> u64 {
        self.max
    }
    /// The value at quantile `q` (0..=1): the midpoint of the bucket holding it, clamped to
    /// the recorded min/max. 0 when empty.
    pub fn quantile(&self, q: f64) -> u64 {
        if self.total == 0 {
            return 0;
        }
        let rank = ((q.clamp(0.0, 1.0) * self.total as f64).ceil() as u64).max(1);
        let mut seen = 0u64;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                let (lo, w) = bucket_range(i);
                return (lo + w / 2).clamp(self.min, self.max);
            }
        }
        self.max
    }
    /// Standard deviation, from the bucket midpoints around the exact mean (within the
    /// buckets' relative error; nothing more is kept per sample). 0 when empty.
    pub fn stddev(&self) -> f64 {
        if self.total == 0 {
            return 0.0;
        }
        let mean = self.mean();
        let mut acc = 0.0f64;
        for (i, &c) in self.counts.iter().enumerate() {
            if c != 0 {
                let (lo, w) = bucket_range(i);
                let mid = (lo + w / 2).clamp(self.min, self.max) as f64;
                acc += c as f64 * (mid - mean) * (mid - mean);
            }
        }
        (acc / self.total as f64).sqrt()
    }
    /// Every non-empty bucket: (lowest value, width, count), in order (for `perf -LL`).
    pub fn buckets(&self) -> impl Iterator<Item = (u64, u64, u64)> + '_ {
        self.counts
            .iter()
            .enumerate()
            .filter(|(_, &c)| c != 0)
            .map(|(i, &c)| {
                let (lo, w) = bucket_range(i);
                (lo, w, c)
            })
    }
    /// Add another histogram's counts.
    pub fn merge(&mut self, o: &LatencyHistogram) {
        for (a, b) in self.counts.iter_mut().zip(o.counts.iter()) {
            *a += b;
        }
        self.total += o.total;
        self.sum += o.sum;
        self.min = self.min.min(o.min);
        self.max = self.max.max(o.max);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn stddev_of_known_data() {
        let mut h = LatencyHistogram::new();
        assert_eq!(h.stddev(), 0.0);
        // 2, 4, 4, 4, 5, 5, 7, 9: mean 5, standard deviation 2 (exact: small values).
        for v in [2, 4, 4, 4, 5, 5, 7, 9] {
            h.record(v);
        }
        assert!((h.stddev() - 2.0).abs() < 1e-9, "{}", h.stddev());
        let b: Vec<_> = h.buckets().collect();
        assert_eq!(b[0], (2, 1, 1));
        assert_eq!(b.iter().map(|x| x.2).sum::<u64>(), 8);
    }

    #[test]
    fn small_values_are_exact() {
        let mut h = LatencyHistogram::new();
        for v in 1..=100 {
            h.record(v);
        }
        assert_eq!(h.count(), 100);
        assert_eq!(h.quantile(0.5), 50);
        assert_eq!(h.min(), 1);
        assert_eq!(h.max(), 100);
        assert!((h.mean() - 50.5).abs() < 1e-9);
        assert!((h.quantile(0.99) as i64 - 99).abs() <= 1);
    }

    #[test]
    fn buckets_are_contiguous_and_ordered() {
        let mut prev_end = 0;
        for i in 0..BUCKETS - 1 {
            let (lo, w) = bucket_range(i);
            assert_eq!(lo, prev_end, "bucket {i}");
            assert_eq!(index(lo), i);
            assert_eq!(index(lo + w - 1), i);
            prev_end = lo + w;
        }
        assert_eq!(index(u64::MAX), BUCKETS - 1);
    }

    #[test]
    fn empty_and_merge() {
        let h = LatencyHistogram::new();
        assert_eq!((h.quantile(0.5), h.min(), h.mean()), (0, 0, 0.0));
        let mut a = LatencyHistogram::new();
        let mut b = LatencyHistogram::new();
        a.record(10);
        b.record(1_000_000);
        a.merge(&b);
        assert_eq!(a.count(), 2);
        assert_eq!(a.max(), 1_000_000);
        assert_eq!(a.quantile(0.5), 10);
    }

    #[test]
    fn percentiles_of_known_data() {
        let mut h = LatencyHistogram::default();
        for v in 1..=1000u64 {
            h.record(v * 1000);
        }
        let p50 = h.quantile(0.5);
        assert!((470_000..=530_000).contains(&p50), "p50 {p50}");
        let p99 = h.quantile(0.99);
        assert!((950_000..=1_000_000).contains(&p99), "p99 {p99}");
        assert_eq!(h.quantile(1.0), 1_000_000);
        assert_eq!(h.count(), 1000);
        assert_eq!(LatencyHistogram::default().quantile(0.5), 0);
    }

    proptest! {
        #[test]
        fn quantiles_within_relative_error(mut vals in prop::collection::vec(1u64..10_000_000_000, 1..500), q in 0.0f64..1.0) {
            let mut h = LatencyHistogram::new();
            for &v in &vals { h.record(v); }
            vals.sort();
            let rank = ((q * vals.len() as f64).ceil() as usize).max(1);
            let exact = vals[rank - 1] as f64;
            let got = h.quantile(q) as f64;
            prop_assert!((got - exact).abs() <= exact / 32.0 + 1.0, "q {} exact {} got {}", q, exact, got);
        }
    }
}
