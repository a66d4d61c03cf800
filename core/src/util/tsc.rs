//! The CPU cycle counter (`rdtsc` on x86-64) and its frequency, measured against the wall clock.

use std::time::{Duration, Instant};

/// Read the cycle counter (x86-64: RDTSC; elsewhere: nanoseconds since first use).
#[inline(always)]
pub fn rdtsc() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: RDTSC has no memory effects and is available on every x86-64 CPU.
        unsafe { core::arch::x86_64::_rdtsc() }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        use std::sync::OnceLock;
        static START: OnceLock<Instant> = OnceLock::new();
        START.get_or_init(Instant::now).elapsed().as_nanos() as u64
    }
}

/// A calibrated cycle counter.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tsc {
    /// Counter ticks per second.
    pub hz: f64,
}

impl Tsc {
    /// Measure the counter frequency over `window` of wall-clock time (100 ms is plenty).
    ///
    /// Each end is a counter read bracketed by two clock reads; the estimate takes the middle of
    /// each bracket. For deadlines use [`Tsc::calibrate_no_early`].
    pub fn calibrate(window: Duration) -> Tsc {
        let (a, b) = Self::bracketed(window);
        let mid = (a + b) / 2.0;
        Tsc { hz: mid.max(1.0) }
    }

    /// Measure the counter frequency over `window`, rounded up: the frequency is at least the
    /// true one, so a deadline of `ticks(d)` counter ticks never expires before `d` of wall-clock
    /// time has passed, even when the thread was preempted during the measurement (which can
    /// only make the estimate larger, i.e. the deadline later).
    pub fn calibrate_no_early(window: Duration) -> Tsc {
        let (_, upper) = Self::bracketed(window);
        Tsc { hz: upper.max(1.0) }
    }

    /// `(lower, upper)` bounds on the counter frequency: counter ticks over the longest and the
    /// shortest wall-clock time the ticks can have taken.
    fn bracketed(window: Duration) -> (f64, f64) {
        let t0a = Instant::now();
        let c0 = rdtsc();
        let t0b = Instant::now();
        std::thread::sleep(window);
        let t1a = Instant::now();
        let c1 = rdtsc();
        let t1b = Instant::now();
        let ticks = c1.wrapping_sub(c0) as f64;
        let longest = t1b.duration_since(t0a).as_secs_f64().max(1e-9);
        let shortest = t1a.duration_since(t0b).as_secs_f64().max(1e-9);
        (ticks / longest, ticks / shortest)
    }
    /// Ticks to nanoseconds.
    pub fn to_ns(&self, ticks: f64) -> f64 {
        ticks * 1e9 / self.hz
    }
    /// Ticks in `d`.
    pub fn ticks(&self, d: Duration) -> u64 {
        (d.as_secs_f64() * self.hz) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counter_advances_and_calibrates() {
        let a = rdtsc();
        let t = Tsc::calibrate(Duration::from_millis(20));
        let b = rdtsc();
        assert!(b > a);
        assert!(t.hz > 1e6, "a counter of at least 1 MHz, got {}", t.hz);
        let one_ms = t.ticks(Duration::from_millis(1)) as f64;
        assert!((t.to_ns(one_ms) - 1e6).abs() < 1e3);
    }

    #[test]
    fn a_no_early_deadline_never_expires_before_its_wall_clock_time() {
        for _ in 0..20 {
            let t = Tsc::calibrate_no_early(Duration::from_millis(2));
            let d = Duration::from_millis(3);
            let start = Instant::now();
            let c0 = rdtsc();
            while rdtsc().wrapping_sub(c0) < t.ticks(d) {
                std::hint::spin_loop();
            }
            let took = start.elapsed();
            assert!(
                took >= d,
                "a {d:?} deadline expired after {took:?} (hz {})",
                t.hz
            );
        }
    }
}
