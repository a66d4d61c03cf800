//! The atomics of the lock-free parts of the pool, in one place: std's here; the loom tests
//! (`core/tests/loom_*.rs`) compile those files against loom's instead.

pub(crate) use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
