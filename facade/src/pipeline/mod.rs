//! The pipeline as a library type: a block source (an NVMe queue pair or io_uring) streams into
//! unified-buffer pool blocks, and a sink (CUDA copy, BAR, null) consumes them, all on one
//! pinned polling thread. `--mode copy` runs the classic read()+pageable-copy path for A/B;
//! segment runs measure the source alone, the sink alone and the completion-handling cost.

mod bar_sink;
#[cfg(feature = "nvme")]
mod builder;
mod classic;
mod config;
mod cpu;
#[cfg(feature = "cuda")]
mod cuda_sinks;
mod dma_faults;
mod done_queue;
mod engine;
#[cfg(test)]
mod engine_tests;
mod error;
#[cfg(feature = "cuda")]
mod mapped;
mod mapped_options;
#[cfg(feature = "cuda")]
mod mapped_sink;
#[cfg(all(test, feature = "cuda"))]
mod mapped_tests;
#[cfg(feature = "cuda")]
mod mapped_windows;
mod null_sink;
mod progress;
mod report;
mod segments;
mod sink_ext;
mod verify;

pub use bar_sink::{BarSink, Landed};
#[cfg(feature = "nvme")]
pub use builder::{
    map_cap, mapped_plan, FileIo, HostCheck, MappedSettings, Note, Pipeline, PipelineBuilder,
    PipelineRunError, RunHook, SetupError, SinkSpec, SourceSpec, UringTuning, AUTO_MAPPED_RESIDENT,
};
pub use classic::run_copy;
pub use config::{Limit, Mode, PipelineConfig};
pub use cpu::{numa_node_of_cpu, online_cpus, process_cpu_time};
#[cfg(feature = "cuda")]
pub use cuda_sinks::CudaSinks;
pub use dma_faults::{DmaFaultWatch, DmaFaults};
pub use engine::{block_range, run_direct, run_direct_watching};
pub use error::PipelineError;
#[cfg(feature = "cuda")]
pub use mapped::{run_mapped, window_len, MappedFile};
pub use mapped_options::{
    MappedOptionError, MappedOptions, MappedPlan, COPY_ALIGN, DEFAULT_COPY_SIZE,
    DEFAULT_REGISTER_THREADS, DEFAULT_WINDOW_TARGET, MAX_REGISTER_THREADS,
};
#[cfg(feature = "cuda")]
pub use mapped_sink::MappedSink;
pub use null_sink::NullSink;
pub use report::{GpuShare, LatencySummary, MappedInfo, PipelineReport, RunFigures, VerifyResult};
pub use segments::run_sink_only;
pub use sink_ext::PipelineSink;
pub use ubdirect_core::util::pin_to_core;
pub use ubdirect_core::util::LatencyHistogram;
pub use verify::{compare, file_checksum, queue_checksum};
