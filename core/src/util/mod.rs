//! Measurement helpers shared by the drivers' tools and the pipeline: a fixed-size log-linear
//! latency histogram, the CPU cycle counter calibrated against the wall clock, and pinning the
//! measuring thread to a core, and the position-aware checksum the pipeline verifies data with.

pub mod checksum;
mod cpu;
mod histogram;
mod tsc;

pub use cpu::pin_to_core;
pub use histogram::LatencyHistogram;
pub use tsc::{rdtsc, Tsc};
