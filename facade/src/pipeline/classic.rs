//! The classic copy path for A/B (`--mode copy`): read() into pageable memory, then a pageable
//! copy into the sink (a pageable cudaMemcpy for CUDA). One thread, one block at a time: what
//! an application does without the unified buffer.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::Instant;

use ubdirect_core::util::LatencyHistogram;

use super::config::{Limit, Mode, PipelineConfig};
use super::cpu::process_cpu_time;
use super::engine::{block_range, make_progress};
use super::error::PipelineError;
use super::report::{PipelineReport, RunFigures};
use super::sink_ext::PipelineSink;

/// Run the classic path from the file at `path` into `sink`.
pub fn run_copy<S: PipelineSink + ?Sized>(
    path: &Path,
    sink: &mut S,
    cfg: &PipelineConfig,
    label: &str,
) -> Result<PipelineReport, PipelineError> {
    let io = |what: String| move |source| PipelineError::Io { what, source };
    let file = File::open(path).map_err(io(format!("open {}", path.display())))?;
    let cap = file
        .metadata()
        .map_err(io(format!("stat {}", path.display())))?
        .len();
    cfg.validate(cap, 1).map_err(PipelineError::Config)?;
    let cap = cap - cfg.start;
    let bs = cfg.block_size as u64;
    let mut data = vec![0u8; cfg.block_size];
    let mut lat = LatencyHistogram::default();
    let progress = make_progress(cfg);
    let t0 = Instant::now();
    let cpu0 = process_cpu_time();
    let (limit, deadline) = match cfg.limit {
        Limit::Bytes(b) => (b, None),
        Limit::Duration(d) => (u64::MAX, Some(t0 + d)),
    };
    let (mut bytes, mut blocks, mut seq) = (0u64, 0u64, 0u64);
    while bytes < limit && deadline.is_none_or(|d| Instant::now() < d) {
        let start = Instant::now();
        let (off, len) = block_range(seq, bs, cap);
        let len = len.min(limit - bytes) as usize;
        let off = cfg.start + off;
        file.read_exact_at(&mut data[..len], off)
            .map_err(io(format!("read {} at {off}", path.display())))?;
        sink.copy_classic(&data[..len], seq * bs)
            .map_err(PipelineError::Verify)?;
        lat.record(start.elapsed().as_nanos() as u64);
        bytes += len as u64;
        blocks += 1;
        seq += 1;
        if let Some(pb) = &progress {
            pb.set_position(if deadline.is_some() {
                t0.elapsed().as_millis() as u64
            } else {
                bytes
            });
        }
    }
    sink.finish_classic().map_err(PipelineError::Verify)?;
    if let Some(pb) = progress {
        pb.finish_and_clear();
    }
    let wall = t0.elapsed();
    let cpu = process_cpu_time().saturating_sub(cpu0);
    let figures = RunFigures {
        label: label.into(),
        mode: Mode::Copy,
        source: format!("file:{} (read)", path.display()),
        sink: sink.name(),
        block_size: cfg.block_size,
        qd: 1,
        bytes,
        blocks,
        wall,
        cpu,
    };
    Ok(PipelineReport::new(figures, &lat))
}
