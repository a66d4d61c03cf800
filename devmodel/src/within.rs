//! [`within`]: run a driver call on its own thread with a deadline, so a hang on device input
//! fails the test instead of stalling the suite.

use std::time::{Duration, Instant};

/// Run `f` on its own thread and fail the test when it has not returned within `limit` (a hang
/// on device input) or panicked. Returns what `f` returned.
pub fn within<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> T {
    let start = Instant::now();
    let h = std::thread::spawn(f);
    while !h.is_finished() {
        assert!(
            start.elapsed() < limit,
            "the driver did not return within {limit:?}: a hang on device input"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    match h.join() {
        Ok(v) => v,
        Err(p) => std::panic::resume_unwind(p),
    }
}
