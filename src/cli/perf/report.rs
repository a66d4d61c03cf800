//! Pure helpers of `ubdirect perf`'s output: figures per direction (`-w rw`), the share of the
//! run's time inside the I/Os' latency windows, the latency histogram of `-L` (power-of-two
//! buckets) and `-LL` (every bucket), and the once-a-second status line.

use serde::Serialize;
use ubdirect::dma::util::{LatencyHistogram, Tsc};

use super::super::json::LatencyNs;

/// What one direction (reads or writes) measured.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Direction {
    /// I/Os completed.
    pub ios: u64,
    /// I/Os per second.
    pub iops: f64,
    /// Bytes per second.
    pub bytes_per_s: f64,
    /// Latency of these I/Os.
    pub latency_ns: LatencyNs,
    /// IOPS x mean latency / queue depth of these I/Os alone: their share of the queue slots'
    /// time spent inside latency windows (the directions' shares add up to the total's).
    pub window_fraction: f64,
}

/// The figures of `h` (TSC ticks) over `secs` seconds of `io_size`-byte I/Os.
pub fn direction(h: &LatencyHistogram, secs: f64, io_size: usize, tsc: &Tsc) -> Direction {
    let iops = if secs > 0.0 {
        h.count() as f64 / secs
    } else {
        0.0
    };
    Direction {
        ios: h.count(),
        iops,
        bytes_per_s: iops * io_size as f64,
        latency_ns: latency_ns(h, tsc),
        window_fraction: 0.0,
    }
}

/// Several cores' figures of one direction: counts and rates add up, latency from `merged`
/// (the cores' histograms merged).
pub fn sum_directions<'a>(
    dirs: impl Iterator<Item = &'a Direction>,
    merged: &LatencyHistogram,
    tsc: &Tsc,
) -> Direction {
    let mut d = Direction {
        latency_ns: latency_ns(merged, tsc),
        ..Default::default()
    };
    for x in dirs {
        d.ios += x.ios;
        d.iops += x.iops;
        d.bytes_per_s += x.bytes_per_s;
    }
    d
}

/// How much of a run's time lay inside its I/Os' latency windows (Little's law).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Window {
    /// IOPS x mean latency / queue depth: 1.0 when each queue slot always holds an I/O whose
    /// latency is being measured; at QD1, IOPS x mean latency.
    pub fraction: f64,
    /// Cycle-counter ticks per I/O that a queue slot spends outside any latency window: from
    /// the moment a completion is seen to the start of the next request in that slot
    /// (reaping, the callback, the loop's bookkeeping, the next request's set-up).
    pub outside_cycles_per_io: f64,
}

/// The latency window of `iops` I/Os per second at a mean latency of `mean_latency_ns` with
/// `depth` requests in flight, on a cycle counter of `tsc_hz`. All zero when nothing ran.
pub fn window(iops: f64, mean_latency_ns: f64, depth: usize, tsc_hz: f64) -> Window {
    if iops <= 0.0 || depth == 0 || !iops.is_finite() {
        return Window::default();
    }
    let mean_s = mean_latency_ns * 1e-9;
    let slot_s_per_io = depth as f64 / iops;
    Window {
        fraction: mean_s / slot_s_per_io,
        outside_cycles_per_io: (slot_s_per_io - mean_s) * tsc_hz,
    }
}

/// A histogram of TSC ticks as nanoseconds.
pub fn latency_ns(h: &LatencyHistogram, tsc: &Tsc) -> LatencyNs {
    let ns = |t: u64| tsc.to_ns(t as f64);
    LatencyNs {
        count: Some(h.count()),
        mean: tsc.to_ns(h.mean()),
        min: Some(ns(h.min())),
        p50: ns(h.quantile(0.5)),
        p90: Some(ns(h.quantile(0.9))),
        p99: ns(h.quantile(0.99)),
        p999: ns(h.quantile(0.999)),
        p9999: Some(ns(h.quantile(0.9999))),
        stddev: Some(tsc.to_ns(h.stddev())),
        max: ns(h.max()),
    }
}

/// One row of the latency histogram: I/Os with `lo_ns <= latency < hi_ns`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HistRow {
    /// Lower bound (inclusive), ns.
    pub lo_ns: f64,
    /// Upper bound (exclusive), ns.
    pub hi_ns: f64,
    /// I/Os in the range.
    pub count: u64,
    /// Percent of all I/Os at or below this row.
    pub cumulative_percent: f64,
}

/// The `latency_histogram` of the JSON report.
#[derive(Debug, Clone, Serialize)]
pub struct HistogramJson {
    /// `buckets` (`-L`: one row per power of two of TSC ticks) or `full` (`-LL`: every bucket,
    /// 32 per power of two).
    pub detail: &'static str,
    /// The non-empty rows, lowest latency first; their counts sum to the I/Os measured.
    pub rows: Vec<HistRow>,
}

/// `(lo, width, count)` buckets grouped into one per power of two (ticks 0 and 1 each alone).
pub fn coarse_buckets(fine: impl Iterator<Item = (u64, u64, u64)>) -> Vec<(u64, u64, u64)> {
    let mut out: Vec<(u64, u64, u64)> = Vec::new();
    for (lo, _w, c) in fine {
        let (glo, gw) = if lo == 0 {
            (0, 1)
        } else {
            let p = 63 - lo.leading_zeros();
            (1u64 << p, 1u64 << p)
        };
        match out.last_mut() {
            Some(last) if last.0 == glo => last.2 += c,
            _ => out.push((glo, gw, c)),
        }
    }
    out
}

/// The histogram of `-L` (`full`: `-LL`) in ns, with cumulative percentages.
pub fn histogram(h: &LatencyHistogram, tsc: &Tsc, full: bool) -> HistogramJson {
    let buckets: Vec<(u64, u64, u64)> = if full {
        h.buckets().collect()
    } else {
        coarse_buckets(h.buckets())
    };
    let total = h.count().max(1) as f64;
    let mut seen = 0u64;
    let rows = buckets
        .into_iter()
        .map(|(lo, w, c)| {
            seen += c;
            HistRow {
                lo_ns: tsc.to_ns(lo as f64),
                hi_ns: tsc.to_ns(lo.saturating_add(w) as f64),
                count: c,
                cumulative_percent: seen as f64 * 100.0 / total,
            }
        })
        .collect();
    HistogramJson {
        detail: if full { "full" } else { "buckets" },
        rows,
    }
}

/// The histogram as table lines (`  12.00 -   16.00 us:     1234  ( 45.67%)`).
pub fn histogram_lines(h: &HistogramJson) -> Vec<String> {
    let mut v = vec![format!(
        "latency histogram ({}), us: range, I/Os, cumulative",
        h.detail
    )];
    v.extend(h.rows.iter().map(|r| {
        format!(
            "{:>12.3} - {:>12.3}: {:>10}  ({:>7.3}%)",
            r.lo_ns / 1e3,
            r.hi_ns / 1e3,
            r.count,
            r.cumulative_percent
        )
    }));
    v
}

/// The status line printed once a second on stderr: `second` since the start, whether still
/// in the warm-up, and the I/Os completed over the last `dt` seconds.
pub fn progress_line(second: u64, warming: bool, ios: u64, dt: f64, io_size: usize) -> String {
    let iops = if dt > 0.0 { ios as f64 / dt } else { 0.0 };
    format!(
        "ubdirect perf: [{second:>4}s{}] {iops:>12.0} IOPS {:>10.2} MiB/s",
        if warming { " warm-up" } else { "" },
        iops * io_size as f64 / (1u64 << 20) as f64
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coarse_buckets_group_by_power_of_two_and_keep_the_count() {
        let mut h = LatencyHistogram::new();
        for v in [0u64, 1, 2, 3, 5, 6, 7, 100, 120, 130, 1000] {
            h.record(v);
        }
        let c = coarse_buckets(h.buckets());
        assert_eq!(
            c,
            vec![
                (0, 1, 1),
                (1, 1, 1),
                (2, 2, 2),
                (4, 4, 3),
                (64, 64, 2),
                (128, 128, 1),
                (512, 512, 1)
            ]
        );
        assert_eq!(c.iter().map(|x| x.2).sum::<u64>(), h.count());
    }

    #[test]
    fn histogram_rows_sum_to_the_ios_and_end_at_100_percent() {
        let tsc = Tsc { hz: 1.0e9 };
        let mut h = LatencyHistogram::new();
        for v in (1..=5000u64).map(|i| 10_000 + i * 37) {
            h.record(v);
        }
        for full in [false, true] {
            let j = histogram(&h, &tsc, full);
            assert_eq!(j.detail, if full { "full" } else { "buckets" });
            assert_eq!(j.rows.iter().map(|r| r.count).sum::<u64>(), 5000);
            assert!((j.rows.last().unwrap().cumulative_percent - 100.0).abs() < 1e-9);
            for w in j.rows.windows(2) {
                assert!(w[0].hi_ns <= w[1].lo_ns, "{w:?}");
            }
            assert!(j.rows[0].lo_ns <= 10_037.0 && j.rows[0].hi_ns > 10_037.0);
            assert_eq!(histogram_lines(&j).len(), j.rows.len() + 1);
        }
        // -LL has finer rows than -L.
        assert!(histogram(&h, &tsc, true).rows.len() > histogram(&h, &tsc, false).rows.len());
    }

    #[test]
    fn directions_add_up_across_cores() {
        let tsc = Tsc { hz: 1.0e9 };
        let (mut a, mut b) = (LatencyHistogram::new(), LatencyHistogram::new());
        for _ in 0..300 {
            a.record(20_000);
        }
        for _ in 0..100 {
            b.record(40_000);
        }
        let da = direction(&a, 2.0, 4096, &tsc);
        let db = direction(&b, 1.0, 4096, &tsc);
        assert_eq!(
            (da.ios, da.iops, da.bytes_per_s),
            (300, 150.0, 150.0 * 4096.0)
        );
        let mut m = a.clone();
        m.merge(&b);
        let t = sum_directions([&da, &db].into_iter(), &m, &tsc);
        assert_eq!((t.ios, t.iops), (400, 250.0));
        assert_eq!(t.latency_ns.count, Some(400));
        assert!(
            (t.latency_ns.mean - 25_000.0).abs() < 1.0,
            "{:?}",
            t.latency_ns
        );
        let empty = direction(&LatencyHistogram::new(), 0.0, 4096, &tsc);
        assert_eq!((empty.ios, empty.iops), (0, 0.0));
    }

    #[test]
    fn the_window_is_iops_times_latency_per_slot_and_the_rest_is_outside() {
        // QD1, 27,000 IOPS at 31.6 us: 37.04 us per I/O, 85.3 % of it inside the window, the
        // other 5.44 us (10,874 ticks at 2 GHz) outside.
        let w = window(27_000.0, 31_600.0, 1, 2.0e9);
        assert!((w.fraction - 0.8532).abs() < 1e-4, "{w:?}");
        assert!((w.outside_cycles_per_io - 10_874.07).abs() < 0.1, "{w:?}");
        // Every I/O's time inside the window: 1.0 and nothing outside.
        let w = window(1e6 / 25.0, 25_000.0, 1, 3.0e9);
        assert!((w.fraction - 1.0).abs() < 1e-12, "{w:?}");
        assert!(w.outside_cycles_per_io.abs() < 1e-6, "{w:?}");
        // At depth, each slot's share: 32 in flight, 200k IOPS at 150 us: 30 of 32 slots busy,
        // each slot 160 us per I/O of which 10 us (10,000 ticks at 1 GHz) outside.
        let w = window(200_000.0, 150_000.0, 32, 1.0e9);
        assert!((w.fraction - 0.9375).abs() < 1e-12, "{w:?}");
        assert!((w.outside_cycles_per_io - 10_000.0).abs() < 1e-6, "{w:?}");
        // Nothing ran.
        assert_eq!(window(0.0, 0.0, 1, 1.0e9), Window::default());
        assert_eq!(window(1000.0, 10.0, 0, 1.0e9), Window::default());
    }

    #[test]
    fn the_status_line_says_warm_up_and_the_rate() {
        let l = progress_line(3, true, 1500, 0.5, 4096);
        assert!(l.contains("[   3s warm-up]"), "{l}");
        assert!(l.contains(" 3000 IOPS"), "{l}");
        assert!(l.contains(" 11.72 MiB/s"), "{l}");
        assert!(!progress_line(4, false, 1, 1.0, 4096).contains("warm-up"));
    }
}
