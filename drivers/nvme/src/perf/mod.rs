//! Measurement helpers for `ubdirect perf` and the benches: a cycle counter calibrated against
//! the wall clock and a fixed-size log-linear latency histogram (no allocation when recording).
//! They live in `ubdirect_core::util` (the pipeline uses them too); re-exported here. And the
//! floor loop ([`floor`]), the bare minimum per read that the driver is measured against.

pub mod floor;

pub use ubdirect_core::util::{rdtsc, LatencyHistogram, Tsc};
