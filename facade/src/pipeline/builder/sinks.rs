//! The run's sinks, and what every source path does around its run: the NUMA warning, the
//! segment measurements, the verification and the host-check lines.

use std::sync::Arc;

use ubdirect_core::seams::BlockQueue;
use ubdirect_core::UbPool;
#[cfg(feature = "cuda")]
use ubdirect_core::UbRegion;

use super::super::bar_sink::BarSink;
use super::super::config::PipelineConfig;
use super::super::cpu::numa_node_of_cpu;
#[cfg(feature = "cuda")]
use super::super::cuda_sinks::CudaSinks;
use super::super::engine::run_direct;
use super::super::null_sink::NullSink;
use super::super::report::PipelineReport;
use super::super::segments::run_sink_only;
use super::super::sink_ext::PipelineSink;
use super::super::verify::compare;
use super::error::{PipelineRunError, SetupError};
use super::run::Run;
use super::{Note, SinkSpec};

impl Run<'_> {
    /// The sink of `--sink`-style [`SinkSpec`] over `pool`, for a source of `cap` bytes.
    pub(super) fn make_sink(
        &mut self,
        pool: &Arc<UbPool>,
        cap: u64,
    ) -> Result<Box<dyn PipelineSink>, PipelineRunError> {
        let s = self.s;
        Ok(match &s.sink {
            SinkSpec::Null => Box::new(NullSink::new(pool.block_count(), s.verify)),
            SinkSpec::Bar { .. } => {
                let region = self.dev.bar.clone().ok_or_else(|| {
                    PipelineRunError::open("BAR sink without a BAR region".to_string())
                })?;
                Box::new(BarSink::new(
                    region,
                    pool.block_size(),
                    s.start,
                    cap.saturating_sub(s.start),
                    s.verify,
                ))
            }
            #[cfg(feature = "cuda")]
            SinkSpec::Cuda(_) => Box::new(self.cuda_sinks(
                Some(pool.region()),
                pool.block_size(),
                pool.block_count(),
            )?),
            #[cfg(not(feature = "cuda"))]
            SinkSpec::Cuda(_) => return Err(SetupError::NotBuilt { feature: "cuda" }.into()),
        })
    }

    /// The GPU ordinals of the CUDA sink (every GPU the driver sees for an empty list).
    #[cfg(feature = "cuda")]
    pub(super) fn cuda_ordinals(&self) -> Result<Vec<usize>, PipelineRunError> {
        match &self.s.sink {
            SinkSpec::Cuda(v) if !v.is_empty() => Ok(v.clone()),
            SinkSpec::Cuda(_) => {
                ubdirect_cuda::driver_available()?;
                let n = ubdirect_cuda::CudaGpu::count();
                if n == 0 {
                    return Err(SetupError::NoGpu.into());
                }
                Ok((0..n).collect())
            }
            _ => Err(PipelineRunError::open("not a CUDA sink".to_string())),
        }
    }

    /// One CUDA sink per GPU, `depth` copies of up to `slot` bytes each; `region` (the pool's
    /// memory) is registered once (PORTABLE: every GPU's context sees it as pinned).
    #[cfg(feature = "cuda")]
    pub(super) fn cuda_sinks(
        &mut self,
        region: Option<&Arc<UbRegion>>,
        slot: usize,
        depth: usize,
    ) -> Result<CudaSinks, PipelineRunError> {
        let ordinals = self.cuda_ordinals()?;
        let mut sinks = Vec::with_capacity(ordinals.len());
        for (i, &ordinal) in ordinals.iter().enumerate() {
            let cfg = ubdirect_cuda::CudaSinkConfig {
                ordinal,
                streams: self.s.streams.max(1),
                depth: depth.max(1),
                block_size: slot,
                verify: self.s.verify,
            };
            let regions: Vec<Arc<UbRegion>> = match region {
                Some(r) if i == 0 => vec![r.clone()],
                _ => Vec::new(),
            };
            let sink = ubdirect_cuda::CudaSink::new(&cfg, &regions)?;
            if i == 0 {
                self.dev.numa = self.dev.numa.or(sink.gpu().numa_node());
            }
            sinks.push(sink);
        }
        Ok(CudaSinks::new(sinks, ordinals, slot))
    }

    /// Warn when the polling core is on another NUMA node than the device.
    pub(super) fn warn_numa(&self) {
        if let (Some(c), Some(d)) = (self.s.core, self.dev.numa) {
            match numa_node_of_cpu(c) {
                Some(n) if n != d => tracing::warn!("core {c} is on NUMA node {n} but the device is on node {d}: expect lower bandwidth; pick a core of node {d}"),
                _ => {}
            }
        }
    }

    /// The segments: the source alone into a null sink, then (given `sink`) the sink alone
    /// from the pool, both unverified.
    pub(super) fn segments<Q: BlockQueue + ?Sized>(
        &mut self,
        (q, name): (&mut Q, &str),
        sink: Option<&mut dyn PipelineSink>,
        pool: &Arc<UbPool>,
        cfg: &PipelineConfig,
    ) -> Result<(), PipelineRunError> {
        let mut null = NullSink::new(pool.block_count(), false);
        let c = PipelineConfig {
            verify: false,
            ..cfg.clone()
        };
        let label = "segment: source -> UB (sink null)";
        let r = run_direct(q, &mut null, pool, &c, label, name)?;
        self.reports.push(r);
        if let Some(sink) = sink {
            let r = run_sink_only(sink, pool, &c, "segment: UB -> sink (no source)")?;
            self.reports.push(r);
        }
        Ok(())
    }

    /// Send the host-check lines of `sink`, when asked for.
    pub(super) fn hostchecks(&mut self, sink: &dyn PipelineSink) {
        let Some(hc) = self.s.hostcheck.clone() else {
            return;
        };
        for line in sink.hostcheck_lines(&hc.name, &hc.bar_file, &hc.source_file) {
            self.note(Note::HostCheck(line));
        }
    }
}

/// Record in `r` how `sink`'s checksum compares with `expected`.
pub(super) fn add_verify(
    r: &mut PipelineReport,
    sink: &mut dyn PipelineSink,
    expected: u64,
    method: &str,
) -> Result<(), PipelineRunError> {
    let delivered = sink
        .delivered_checksum()
        .ok_or(SetupError::SinkCannotVerify)?
        .map_err(PipelineRunError::open)?;
    r.verify = Some(compare(method, delivered, expected));
    Ok(())
}

/// With verification on: compare what `sink` received with read() of the file.
#[cfg(any(feature = "cuda", feature = "uring"))]
pub(super) fn verify_file(
    run: &Run<'_>,
    path: &std::path::Path,
    r: &mut PipelineReport,
    sink: &mut dyn PipelineSink,
    method: &str,
) -> Result<(), PipelineRunError> {
    if run.s.verify {
        let expected = super::super::verify::file_checksum(path, run.s.start, r.bytes)?;
        add_verify(r, sink, expected, method)?;
    }
    Ok(())
}
