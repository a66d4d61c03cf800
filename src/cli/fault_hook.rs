//! Test hook for the recovery tests (`tests/guest_faults_reset.rs`): with
//! `UBD_INJECT_RESET_AFTER_MS=<ms>` in the environment, `perf` and `pipeline` reset their NVMe
//! controller's PCI function (VFIO_DEVICE_RESET: a Function Level Reset behind the driver's
//! back) that long after the controller was opened, from a thread of their own. Unset: nothing.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ubdirect::dma::PciDevice;

/// The environment variable of the hook.
pub(crate) const ENV: &str = "UBD_INJECT_RESET_AFTER_MS";

/// A pending injected reset; dropping it cancels the reset if it has not happened yet.
pub(crate) struct ResetHook {
    done: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for ResetHook {
    fn drop(&mut self) {
        self.done.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Arm the hook for `dev` when [`ENV`] is set (a number of milliseconds).
pub(crate) fn arm(dev: &Arc<PciDevice>) -> Option<ResetHook> {
    let after = Duration::from_millis(std::env::var(ENV).ok()?.trim().parse().ok()?);
    let done = Arc::new(AtomicBool::new(false));
    let (dev, stop) = (dev.clone(), done.clone());
    let thread = std::thread::spawn(move || {
        let t0 = Instant::now();
        while t0.elapsed() < after {
            if stop.load(Ordering::Relaxed) {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        // SAFETY: the reset under a running pipeline is the fault this test hook injects (only
        // when its environment variable is set); the driver is built to survive it.
        match unsafe { dev.access_unclaimed() }.reset() {
            Ok(()) => eprintln!("{ENV}: reset {} (FLR) under the run", dev.address()),
            Err(e) => eprintln!("{ENV}: reset of {} failed: {e}", dev.address()),
        }
    });
    Some(ResetHook {
        done,
        thread: Some(thread),
    })
}
