//! [`Pipeline`]: the whole pipeline run from a description of its source and sink. It owns the
//! policy a tool would otherwise repeat: which devices join the DMA domain and in what order,
//! where the pool comes from (a BAR window for a BAR sink, hugepages otherwise), how a file is
//! read (its page cache mapped for the GPU, O_DIRECT or buffered io_uring, chosen by residency
//! when asked to), the segment measurements, verification against a second read and repeated
//! runs.
//!
//! Needs the `nvme` feature; a CUDA sink and the mapped-file run need `cuda`, a file read into
//! the pool needs `uring`, an NVMe/TCP source needs `nvmf` (without them the run is refused
//! with [`SetupError::NotBuilt`]).
//!
//! ```no_run
//! use ubdirect::pipeline::{Pipeline, SinkSpec, SourceSpec};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let reports = Pipeline::builder()
//!     .source(SourceSpec::Nvme { addr: "0000:00:04.0".parse()?, nsid: None })
//!     .sink(SinkSpec::Cuda(vec![0]))
//!     .block_size(4 << 20)
//!     .verify(true)
//!     .run()?;
//! for r in &reports {
//!     println!("{r}");
//! }
//! # Ok(()) }
//! ```

mod devices;
mod error;
mod file;
#[cfg(feature = "uring")]
mod file_uring;
mod mapped;
#[cfg(feature = "cuda")]
mod mapped_run;
mod nvme;
mod run;
mod sinks;
#[cfg(feature = "nvmf")]
mod tcp;
#[cfg(all(test, feature = "uring"))]
mod tests;

use std::any::Any;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use ubdirect_core::vfio::DomainOptions;
use ubdirect_core::{PciAddress, PciDevice};
#[cfg(feature = "nvmf")]
use ubdirect_nvme::transport::tcp::ctrl::TcpOptions;
#[cfg(feature = "nvmf")]
use ubdirect_nvme::transport::tcp::host::HostIdentity;

use super::config::{Limit, Mode};
use super::report::PipelineReport;

pub use error::{PipelineRunError, SetupError};
pub use mapped::{map_cap, mapped_plan, AUTO_MAPPED_RESIDENT};

/// Where the data comes from.
#[derive(Debug, Clone)]
pub enum SourceSpec {
    /// An NVMe namespace through vfio-pci (`nsid` `None`: the first active namespace).
    Nvme {
        /// The controller's PCI address (bound to vfio-pci).
        addr: PciAddress,
        /// The namespace.
        nsid: Option<u32>,
    },
    /// A file (or block device) through io_uring, or its page cache mapped for the GPU.
    File(PathBuf),
    /// A remote namespace over NVMe/TCP (needs the `nvmf` feature: without it the run is
    /// refused with [`SetupError::NotBuilt`]).
    Tcp {
        /// `nvmf-tcp://ADDR:PORT/SUBNQN[/NSID]`.
        addr: String,
        /// The namespace (`None`: the one in the address, else 1).
        nsid: Option<u32>,
    },
}

/// Where the data goes.
#[derive(Debug, Clone, Default)]
pub enum SinkSpec {
    /// CUDA device memory on these GPU ordinals, blocks striped round-robin (empty: every GPU
    /// the driver sees).
    Cuda(Vec<usize>),
    /// A device BAR: the pool is carved from it and the source DMAs straight into it.
    Bar {
        /// The device's PCI address (bound to vfio-pci).
        addr: PciAddress,
        /// The BAR number (0..5).
        bar: u8,
    },
    /// Nowhere (the source alone; checksummed when verifying).
    #[default]
    Null,
}

/// How a file source is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FileIo {
    /// Mapped when the range read is at least [`AUTO_MAPPED_RESIDENT`] in the page cache and
    /// the sink is CUDA in direct mode; otherwise O_DIRECT, buffered where O_DIRECT is refused.
    #[default]
    Auto,
    /// The page cache mapped read-only and registered with CUDA; the copy engines read it in
    /// place (CUDA sink, direct mode).
    Mapped,
    /// O_DIRECT reads into the pool.
    Direct,
    /// Page-cache reads into the pool.
    Buffered,
}

/// Mapped-file settings (each `None`: the default).
#[derive(Debug, Clone, Default)]
pub struct MappedSettings {
    /// Bytes per GPU copy out of the registered page cache (a multiple of 4K).
    pub copy_size: Option<usize>,
    /// Bytes per registered window (a multiple of the copy size).
    pub window: Option<u64>,
    /// Threads registering windows ahead of the copies.
    pub register_threads: Option<usize>,
    /// Fault each window's page tables in before registering it (default: with two or more
    /// registration threads).
    pub populate: Option<bool>,
    /// Most bytes of file mappings kept registered (default: half the RAM).
    pub cap: Option<u64>,
}

impl MappedSettings {
    /// True when a setting that only a mapped run uses was given.
    pub fn any_given(&self) -> bool {
        self.copy_size.is_some() || self.window.is_some() || self.register_threads.is_some()
    }
}

/// io_uring settings of a file source read into the pool.
#[derive(Debug, Clone, Default)]
pub struct UringTuning {
    /// Punt reads to io-wq workers (`None`: on for buffered reads).
    pub force_async: Option<bool>,
    /// Sleep in the kernel up to this long for a completion when nothing is ready (`None`: the
    /// io_uring source's default).
    pub idle_wait: Option<Duration>,
    /// Cap on io-wq workers.
    pub max_workers: Option<u32>,
    /// Kernel SQ polling thread, idle milliseconds.
    pub sqpoll_idle_ms: Option<u32>,
}

/// Test-bed check of where a BAR sink's data landed: `UBD-HOSTCHECK` lines comparing the BAR's
/// backing file with the source's.
#[derive(Debug, Clone)]
pub struct HostCheck {
    /// Name of the check.
    pub name: String,
    /// The source's backing file (host side).
    pub source_file: String,
    /// The BAR's backing file (host side).
    pub bar_file: String,
}

/// What a run tells its caller while it runs, besides its reports.
#[derive(Debug, Clone)]
pub enum Note {
    /// `FileIo::Auto` reads the file into the pool (less than [`AUTO_MAPPED_RESIDENT`] of it is
    /// in the page cache), so the mapped settings given do not apply.
    MappedSettingsUnused,
    /// The NVMe controller was reset during the run; the reads in flight were submitted again.
    ControllerReset {
        /// The controller.
        addr: PciAddress,
        /// Resets during the run.
        resets: u64,
        /// Commands submitted again.
        requeued: u64,
    },
    /// A [`HostCheck`] line.
    HostCheck(String),
}

/// Called with the NVMe controller's device just before the measured run; what it returns is
/// dropped once the run (and its verification) ended.
pub type RunHook = Box<dyn FnOnce(&Arc<PciDevice>) -> Option<Box<dyn Any>>>;

/// The run's plain settings.
#[derive(Debug, Clone)]
struct Settings {
    source: Option<SourceSpec>,
    sink: SinkSpec,
    block_size: usize,
    qd: usize,
    pool_blocks: Option<usize>,
    limit: Option<Limit>,
    start: u64,
    core: Option<usize>,
    verify: bool,
    mode: Mode,
    segments: bool,
    streams: usize,
    file_io: FileIo,
    mapped: MappedSettings,
    uring: UringTuning,
    repeat: usize,
    progress: bool,
    domain: DomainOptions,
    #[cfg(feature = "nvmf")]
    tcp: TcpOptions,
    #[cfg(feature = "nvmf")]
    host: Option<HostIdentity>,
    hostcheck: Option<HostCheck>,
}

/// Builds and runs a [`Pipeline`]: name the source and sink, set what differs from the
/// defaults, then [`PipelineBuilder::run`].
#[must_use]
pub struct PipelineBuilder {
    s: Settings,
    notes: Option<Box<dyn FnMut(Note)>>,
    hook: Option<RunHook>,
}

/// The pipeline as one call: see the module documentation and [`Pipeline::builder`].
#[derive(Debug)]
pub struct Pipeline;

impl Pipeline {
    /// Start describing a run: sink null, 4 MiB blocks, queue depth 32, a pool of twice the
    /// queue depth, the whole source once from offset 0, direct mode, `FileIo::Auto`, four CUDA
    /// streams, one run, no progress bar.
    pub fn builder() -> PipelineBuilder {
        PipelineBuilder {
            s: Settings {
                source: None,
                sink: SinkSpec::Null,
                block_size: 4 << 20,
                qd: 32,
                pool_blocks: None,
                limit: None,
                start: 0,
                core: None,
                verify: false,
                mode: Mode::Direct,
                segments: false,
                streams: 4,
                file_io: FileIo::Auto,
                mapped: MappedSettings::default(),
                uring: UringTuning::default(),
                repeat: 1,
                progress: false,
                domain: DomainOptions::default(),
                #[cfg(feature = "nvmf")]
                tcp: TcpOptions::default(),
                #[cfg(feature = "nvmf")]
                host: None,
                hostcheck: None,
            },
            notes: None,
            hook: None,
        }
    }
}

impl PipelineBuilder {
    /// The source (required).
    pub fn source(mut self, source: SourceSpec) -> Self {
        self.s.source = Some(source);
        self
    }
    /// The sink (default: null).
    pub fn sink(mut self, sink: SinkSpec) -> Self {
        self.s.sink = sink;
        self
    }
    /// Bytes per block: per source request and per sink copy.
    pub fn block_size(mut self, bytes: usize) -> Self {
        self.s.block_size = bytes;
        self
    }
    /// Source requests kept in flight.
    pub fn queue_depth(mut self, qd: usize) -> Self {
        self.s.qd = qd;
        self
    }
    /// Pool blocks (default: twice the queue depth; a BAR pool holds at most what fits).
    pub fn pool_blocks(mut self, blocks: usize) -> Self {
        self.s.pool_blocks = Some(blocks);
        self
    }
    /// When to stop (default: the whole source once, from the start offset).
    pub fn limit(mut self, limit: Limit) -> Self {
        self.s.limit = Some(limit);
        self
    }
    /// Source byte offset the stream starts at (logical-block aligned).
    pub fn start(mut self, offset: u64) -> Self {
        self.s.start = offset;
        self
    }
    /// Pin the polling thread to this CPU first.
    pub fn core(mut self, core: usize) -> Self {
        self.s.core = Some(core);
        self
    }
    /// Check that what arrived equals the source bytes (a second read is the reference).
    pub fn verify(mut self, on: bool) -> Self {
        self.s.verify = on;
        self
    }
    /// Direct (the pool, zero copies) or the classic read() and pageable copy (file sources).
    pub fn mode(mut self, mode: Mode) -> Self {
        self.s.mode = mode;
        self
    }
    /// Also measure the source alone (into a null sink) and the sink alone (from the pool)
    /// before the run.
    pub fn segments(mut self, on: bool) -> Self {
        self.s.segments = on;
        self
    }
    /// CUDA copy streams per GPU.
    pub fn cuda_streams(mut self, streams: usize) -> Self {
        self.s.streams = streams;
        self
    }
    /// How a file source is read.
    pub fn file_io(mut self, io: FileIo) -> Self {
        self.s.file_io = io;
        self
    }
    /// Mapped-file settings.
    pub fn mapped(mut self, settings: MappedSettings) -> Self {
        self.s.mapped = settings;
        self
    }
    /// io_uring settings of a file read into the pool.
    pub fn uring(mut self, tuning: UringTuning) -> Self {
        self.s.uring = tuning;
        self
    }
    /// Run the measured pass this many times (file sources; registered windows are reused).
    pub fn repeat(mut self, runs: usize) -> Self {
        self.s.repeat = runs;
        self
    }
    /// Show a progress bar on stderr (only on a terminal, with the `progress` feature).
    pub fn progress(mut self, on: bool) -> Self {
        self.s.progress = on;
        self
    }
    /// Options of the DMA domain opened when a device is involved (the no-IOMMU opt-in).
    pub fn domain_options(mut self, opts: DomainOptions) -> Self {
        self.s.domain = opts;
        self
    }
    /// Connection options and host identity of an NVMe/TCP source (default: the defaults and
    /// [`HostIdentity::system`]). With the `nvmf` feature.
    #[cfg(feature = "nvmf")]
    pub fn tcp(mut self, opts: TcpOptions, host: HostIdentity) -> Self {
        self.s.tcp = opts;
        self.s.host = Some(host);
        self
    }
    /// Produce [`HostCheck`] lines (as [`Note::HostCheck`]) after the run.
    pub fn hostcheck(mut self, check: HostCheck) -> Self {
        self.s.hostcheck = Some(check);
        self
    }
    /// Receive the run's [`Note`]s as they happen (default: logged through `tracing`).
    pub fn on_note(mut self, f: impl FnMut(Note) + 'static) -> Self {
        self.notes = Some(Box::new(f));
        self
    }
    /// Call `hook` with the NVMe controller's device just before the measured run.
    pub fn before_run(mut self, hook: RunHook) -> Self {
        self.hook = Some(hook);
        self
    }
    /// Run: the segments first when asked for, then the measured run(s). Returns the reports in
    /// that order (the last is the pipeline's).
    pub fn run(self) -> Result<Vec<PipelineReport>, PipelineRunError> {
        run::run(self)
    }
}
