//! Pipeline errors: each names the cause and what to do.

use ubdirect_core::seams::{BlockError, SinkError};
use ubdirect_core::PciAddress;

/// Why a pipeline run failed.
#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    /// A bad setting or argument.
    #[error("{0}")]
    Config(String),
    /// A mapped-file run setting (copy size, window, registration threads) that cannot work.
    #[error("{0}")]
    MappedOption(#[from] super::mapped_options::MappedOptionError),
    /// The source failed.
    #[error("source: {0}")]
    Source(BlockError),
    /// The source completed a read with fewer bytes than asked for: the data past them would be
    /// a hole in the stream, so the run stops instead of delivering it.
    #[error("source: short read at stream offset {offset}: {got} of {want} bytes (the source shrank or the device returned less than asked; check its size and dmesg); nothing past it was delivered")]
    ShortRead {
        /// Stream offset of the block.
        offset: u64,
        /// Bytes the source returned.
        got: u64,
        /// Bytes the block needed.
        want: u64,
    },
    /// The sink failed.
    #[error("sink: {0}")]
    Sink(SinkError),
    /// The buffer pool failed.
    #[error("buffer pool: {0}")]
    Pool(String),
    /// Nothing completed for too long.
    #[error("stalled: no completion for {secs} s with {in_flight} requests in flight (device hung or too slow: check dmesg)")]
    Stalled {
        /// Seconds without progress.
        secs: u64,
        /// Requests outstanding at the time.
        in_flight: usize,
    },
    /// The kernel asked for a device back (hot-unplug, sysfs `remove`, unbind).
    #[error("the kernel asked for device {device} back (hot-unplug, sysfs remove or unbind): the run stopped; drop its queues and controller so the removal completes, then rescan and rebind it to vfio-pci to use it again")]
    RemovalRequested {
        /// The device the kernel wants.
        device: PciAddress,
    },
    /// Verification could not run.
    #[error("verify: {0}")]
    Verify(String),
    /// I/O on the classic path or while computing a reference checksum.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The OS error.
        source: std::io::Error,
    },
}

impl PipelineError {
    /// True when the source can complete nothing more (device gone, controller fatal, queue
    /// wedged): the run ends at once instead of draining.
    pub fn is_fatal(&self) -> bool {
        matches!(self, PipelineError::Source(e) if e.kind.is_fatal())
    }
}
