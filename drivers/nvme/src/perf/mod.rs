//! Measurement helpers for `ubdirect perf` and the benches: a cycle counter calibrated against
//! the wall clock and a fixed-size log-linear latency histogram (no allocation when recording).

mod histogram;
mod tsc;

pub use histogram::LatencyHistogram;
pub use tsc::{rdtsc, Tsc};
