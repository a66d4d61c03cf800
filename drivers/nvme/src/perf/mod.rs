//! The floor loop ([`floor`]): the bare minimum per read that the driver is measured against,
//! for `ubdirect perf --engine floor` and the benches. The cycle counter and the latency
//! histogram those use are `ubdirect_core::util::{Tsc, LatencyHistogram}`.

pub mod floor;
