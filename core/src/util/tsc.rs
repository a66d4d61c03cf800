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
    pub fn calibrate(window: Duration) -> Tsc {
        let t0 = Instant::now();
        let c0 = rdtsc();
        std::thread::sleep(window);
        let c1 = rdtsc();
        let dt = t0.elapsed().as_secs_f64();
        Tsc {
            hz: (c1.wrapping_sub(c0)) as f64 / dt.max(1e-9),
        }
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
}
