//! How a [`crate::UringQueue`] opens its source and sets up its ring.

/// Whether to bypass the page cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DirectMode {
    /// Try O_DIRECT; fall back to buffered I/O with a warning when the filesystem refuses it.
    #[default]
    Auto,
    /// O_DIRECT or fail.
    Require,
    /// Buffered I/O through the page cache (for /dev/shm and page-cache sources).
    Off,
}

/// Options for [`crate::UringQueue::open`].
#[derive(Debug, Clone)]
pub struct UringOptions {
    /// O_DIRECT policy.
    pub direct: DirectMode,
    /// Maximum requests in flight (the ring is sized to it).
    pub depth: usize,
    /// Kernel submission-queue polling thread with this idle time in milliseconds.
    pub sqpoll_idle_ms: Option<u32>,
    /// Mark every request IOSQE_ASYNC so io-wq workers run it: spreads buffered page-cache
    /// copies over many cores instead of doing them inline in the submitting thread.
    /// `None` = on for buffered I/O, off for O_DIRECT.
    pub force_async: Option<bool>,
    /// Cap on io-wq bounded workers (IORING_REGISTER_IOWQ_MAX_WORKERS); `None` = kernel default.
    pub max_workers: Option<u32>,
    /// CPUs the io-wq workers may run on (IORING_REGISTER_IOWQ_AFF); `None` = kernel default.
    /// Keep the polling core out of it so workers do not compete with the submitting thread.
    pub iowq_cpus: Option<Vec<usize>>,
    /// Open read-write (needed for writes).
    pub writable: bool,
    /// When a poll finds nothing while requests are in flight, wait in the kernel up to this
    /// long for one completion instead of returning at once, so the polling thread sleeps
    /// rather than spins on a slow source (a disk read with O_DIRECT takes milliseconds).
    /// `None` = 1 ms for O_DIRECT, off for buffered I/O; `Some(Duration::ZERO)` = off.
    pub idle_wait: Option<std::time::Duration>,
}

impl Default for UringOptions {
    fn default() -> Self {
        UringOptions {
            direct: DirectMode::Auto,
            depth: 64,
            sqpoll_idle_ms: None,
            force_async: None,
            max_workers: None,
            iowq_cpus: None,
            writable: false,
            idle_wait: None,
        }
    }
}
