//! Why a [`super::Pipeline`] run could not start or failed: settings that cannot work together
//! ([`SetupError`], in the builder's terms), the run's own errors, or a device or driver that
//! would not open (its own error, kept as it is so the caller can match on it).

use std::error::Error;

use ubdirect_core::{CoreError, PciAddress};

use super::super::error::PipelineError;
use super::super::mapped_options::MappedOptionError;

/// Settings of a [`super::PipelineBuilder`] that cannot work (together), or a device that
/// cannot serve them.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// No source was named.
    #[error("no source: name one with PipelineBuilder::source")]
    NoSource,
    /// The queue depth is 0.
    #[error("the queue depth must be at least 1")]
    QueueDepthZero,
    /// The pool would hold no block.
    #[error("the pool holds no block of {block_size} bytes")]
    PoolEmpty {
        /// The block size.
        block_size: usize,
    },
    /// `Mode::Copy` with a source other than a file.
    #[error("Mode::Copy is the classic read() path: it needs a file source")]
    CopyNeedsFile,
    /// `Mode::Copy` into a BAR.
    #[error("Mode::Copy has no BAR variant: a BAR is reached by DMA only")]
    CopyToBar,
    /// Mapped settings on a run that reads into the pool.
    #[error("the mapped settings (copy size, window, registration threads) set up a mapped file run (a file source, FileIo::Mapped or Auto); this run reads into the pool in blocks")]
    MappedSettingsUnused,
    /// Zero runs asked for.
    #[error("the repeat count must be at least 1")]
    RepeatZero,
    /// Verification of repeated runs.
    #[error("verification checks one run: repeat must be 1")]
    VerifyRepeat,
    /// `FileIo::Mapped` with a sink other than CUDA, or in copy mode.
    #[error("FileIo::Mapped hands registered page cache to the GPU copy engines: it needs a CUDA sink and Mode::Direct (use FileIo::Buffered or Direct otherwise)")]
    MappedNeedsCuda,
    /// The mapped run's start offset is at or past the file's end.
    #[error("start offset {start} is not below the file's {size} bytes: nothing to stream")]
    StartPastEnd {
        /// The start offset.
        start: u64,
        /// The file's size.
        size: u64,
    },
    /// A mapped setting that cannot work.
    #[error(transparent)]
    Mapped(#[from] MappedOptionError),
    /// A mapped window larger than the registration cap.
    #[error("a {window}-byte window cannot be registered under a cap of {cap} bytes: use smaller windows (or copies), or a larger MappedSettings::cap")]
    WindowOverCap {
        /// The window.
        window: u64,
        /// The cap.
        cap: u64,
    },
    /// A BAR window too small for one block.
    #[error("BAR window of {len} bytes cannot hold one {block_size}-byte block: use a smaller block size")]
    BarTooSmall {
        /// The BAR window's length.
        len: usize,
        /// The block size.
        block_size: usize,
    },
    /// The namespace asked for is not active on the controller.
    #[error("namespace {} is not active on {addr} (active: {active:?})", nsid.map(|n| n.to_string()).unwrap_or_default())]
    NamespaceNotActive {
        /// The controller.
        addr: PciAddress,
        /// The namespace asked for (`None`: the first active one, and there is none).
        nsid: Option<u32>,
        /// The active namespace ids.
        active: Vec<u32>,
    },
    /// Every GPU was asked for and the driver sees none.
    #[error("the CUDA driver sees no GPU")]
    NoGpu,
    /// The run needs a part of the library this build left out.
    #[error("this build of the ubdirect library has no {feature} support (its `{feature}` feature is off)")]
    NotBuilt {
        /// The cargo feature.
        feature: &'static str,
    },
    /// Verification asked of a sink that cannot checksum what it received.
    #[error("this sink cannot check what it received: run without verification")]
    SinkCannotVerify,
}

/// Why a [`super::Pipeline`] run failed.
#[derive(Debug, thiserror::Error)]
pub enum PipelineRunError {
    /// The settings cannot work.
    #[error(transparent)]
    Setup(#[from] SetupError),
    /// The run (or a segment, or the verification) failed.
    #[error(transparent)]
    Run(#[from] PipelineError),
    /// A device or driver would not open or failed outside the run: the driver's own error
    /// (`CoreError`, `NvmeError`, `CudaError`, `UringError`, a TCP error), as it came.
    #[error(transparent)]
    Open(Box<dyn Error + Send + Sync>),
}

impl PipelineRunError {
    /// A driver's error, kept as it came.
    pub(super) fn open(e: impl Into<Box<dyn Error + Send + Sync>>) -> Self {
        PipelineRunError::Open(e.into())
    }
}

impl From<CoreError> for PipelineRunError {
    fn from(e: CoreError) -> Self {
        PipelineRunError::open(e)
    }
}

impl From<ubdirect_nvme::NvmeError> for PipelineRunError {
    fn from(e: ubdirect_nvme::NvmeError) -> Self {
        PipelineRunError::open(e)
    }
}

#[cfg(feature = "cuda")]
impl From<ubdirect_cuda::CudaError> for PipelineRunError {
    fn from(e: ubdirect_cuda::CudaError) -> Self {
        PipelineRunError::open(e)
    }
}

#[cfg(feature = "uring")]
impl From<ubdirect_uring::UringError> for PipelineRunError {
    fn from(e: ubdirect_uring::UringError) -> Self {
        PipelineRunError::open(e)
    }
}
