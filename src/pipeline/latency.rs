//! A fixed-size log-linear latency histogram (no allocation after creation): 64 power-of-two
//! ranges of nanoseconds, each split into 16 linear sub-buckets (~6% resolution).

const SUB: usize = 16;
const SUB_BITS: u32 = 4;

/// Latency histogram in nanoseconds.
#[derive(Debug, Clone)]
pub struct LatencyHistogram {
    buckets: Vec<u64>,
    count: u64,
    max: u64,
    min: u64,
    sum: u128,
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        LatencyHistogram {
            buckets: vec![0; 64 * SUB],
            count: 0,
            max: 0,
            min: u64::MAX,
            sum: 0,
        }
    }
}

fn bucket_of(v: u64) -> usize {
    if v < SUB as u64 {
        return v as usize;
    }
    let exp = 63 - v.leading_zeros(); // >= SUB_BITS
    let sub = (v >> (exp - SUB_BITS)) as usize & (SUB - 1);
    ((exp - SUB_BITS + 1) as usize) * SUB + sub
}

/// Upper bound of a bucket's range (what a percentile reports).
fn bucket_high(b: usize) -> u64 {
    if b < SUB {
        return b as u64;
    }
    let exp = (b / SUB) as u32 + SUB_BITS - 1;
    let sub = (b % SUB) as u64;
    let low = (1u64 << exp) | (sub << (exp - SUB_BITS));
    low + ((1u64 << (exp - SUB_BITS)) - 1)
}

impl LatencyHistogram {
    /// Record one sample.
    pub fn record(&mut self, ns: u64) {
        self.buckets[bucket_of(ns)] += 1;
        self.count += 1;
        self.max = self.max.max(ns);
        self.min = self.min.min(ns);
        self.sum += u128::from(ns);
    }

    /// Samples recorded.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Largest sample.
    pub fn max(&self) -> u64 {
        self.max
    }

    /// Mean in nanoseconds (0 when empty).
    pub fn mean(&self) -> u64 {
        if self.count == 0 {
            0
        } else {
            (self.sum / u128::from(self.count)) as u64
        }
    }

    /// The value at quantile `q` in [0, 1] (bucket upper bound, capped at the max seen).
    pub fn quantile(&self, q: f64) -> u64 {
        if self.count == 0 {
            return 0;
        }
        let rank = ((q.clamp(0.0, 1.0) * self.count as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (b, &c) in self.buckets.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return bucket_high(b).min(self.max).max(self.min);
            }
        }
        self.max
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

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
        fn bucket_bounds_contain_value(v in any::<u64>()) {
            let b = bucket_of(v);
            prop_assert!(b < 64 * SUB);
            prop_assert!(bucket_high(b) >= v);
            if b > 0 { prop_assert!(bucket_high(b - 1) < v); }
        }
    }
}
