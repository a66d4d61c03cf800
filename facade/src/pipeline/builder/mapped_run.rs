//! A file's page cache registered with the GPU in windows (by threads working ahead of the
//! copies) and copied in place, in copies of the copy size; with segments, the H2D ceiling
//! measured first in the same process with copies of the same size out of pinned pool blocks.

use std::path::Path;
use std::sync::Arc;

use ubdirect_core::UbPool;
use ubdirect_cuda::{CudaGpu, CudaHostPinner, FileWindowRegistry};

use super::super::config::PipelineConfig;
use super::super::cuda_sinks::CudaSinks;
use super::super::mapped::{run_mapped, MappedFile};
use super::super::mapped_options::{MappedOptions, MappedPlan};
use super::super::report::PipelineReport;
use super::super::segments::run_sink_only;
use super::error::PipelineRunError;
use super::file::open_error;
use super::mapped::{map_cap, mapped_plan};
use super::run::Run;
use super::sinks::verify_file;
use super::Settings;

/// Fraction of the range the run reads that is in the page cache (0 when it cannot be told).
pub(super) fn resident(file: &std::fs::File, s: &Settings, size: u64) -> f64 {
    let start = s.start.min(size);
    let len = match s.limit {
        Some(super::super::config::Limit::Bytes(b)) => b,
        _ => u64::MAX,
    }
    .min(size - start);
    ubdirect_cuda::resident_fraction(file, start, len).unwrap_or(0.0)
}

/// The registry of the run's windows: registered with the first GPU of the sink, under the
/// cap, page tables faulted in first when two or more threads register.
fn window_registry(
    run: &Run<'_>,
    plan: &MappedPlan,
) -> Result<FileWindowRegistry, PipelineRunError> {
    let gpu = CudaGpu::open(run.cuda_ordinals()?[0])?;
    let pinner = CudaHostPinner::new(&gpu)?;
    let windows = FileWindowRegistry::new(Arc::new(pinner), map_cap(&run.s.mapped));
    // Faulting a window's page tables in outside the driver lets one thread do it while another
    // registers (the driver registers one window at a time).
    let populate = run.s.mapped.populate.unwrap_or(plan.register_threads > 1);
    windows.set_populate(populate);
    Ok(windows)
}

/// The H2D ceiling: pinned pool blocks -> GPU in copies of `copy_size`.
fn h2d_ceiling(
    sinks: &mut CudaSinks,
    pool: &Arc<UbPool>,
    cfg: &PipelineConfig,
    copy_size: usize,
) -> Result<PipelineReport, PipelineRunError> {
    let c = PipelineConfig {
        verify: false,
        block_size: copy_size,
        ..cfg.clone()
    };
    let label = "segment: pinned UB -> GPU (H2D ceiling, no source, copies of the copy size)";
    let mut seg = run_sink_only(sinks, pool, &c, label)?;
    seg.gpus = sinks.shares(std::time::Duration::from_secs_f64(seg.seconds));
    sinks.reset_counts();
    Ok(seg)
}

/// Run the mapped path over the file at `path` (`resident` of it in the page cache).
pub(super) fn run(
    run: &mut Run<'_>,
    path: &Path,
    resident: f64,
    cfg: PipelineConfig,
) -> Result<(), PipelineRunError> {
    let s = run.s;
    let file = std::fs::File::open(path).map_err(|e| open_error(path, e))?;
    let size = file.metadata().map_err(PipelineRunError::open)?.len();
    let plan = mapped_plan(&s.mapped, s.start, size)?;
    let cfg = PipelineConfig {
        mapped: MappedOptions {
            copy_size: Some(plan.copy_size),
            window: Some(plan.window),
            register_threads: plan.register_threads,
        },
        ..cfg
    };
    // The ceiling's pool: pinned blocks of the copy size, one per copy in flight.
    let ceiling = match s.segments {
        true => Some(run.dev.host_pool(plan.copy_size, s.qd, false)?),
        false => None,
    };
    let region = ceiling.as_ref().map(|p| p.region().clone());
    let mut sinks = run.cuda_sinks(region.as_ref(), plan.copy_size, s.qd)?;
    run.warn_numa();
    let windows = window_registry(run, &plan)?;
    let name = format!(
        "file:{} (mapped page cache, registered read-only)",
        path.display()
    );
    let src = MappedFile {
        file: &file,
        name,
        registry: &windows,
        resident,
    };
    if let Some(pool) = &ceiling {
        let seg = h2d_ceiling(&mut sinks, pool, &cfg, plan.copy_size)?;
        run.reports.push(seg);
    }
    for i in 0..s.repeat {
        let mut r = run_mapped(&src, &mut sinks, &cfg, &run.label(i))?;
        sinks.reset_counts();
        verify_file(
            run,
            path,
            &mut r,
            &mut sinks,
            "GPU checksum vs read() of the file",
        )?;
        run.reports.push(r);
    }
    // The copies end before the windows they read go.
    drop(sinks);
    drop(windows);
    Ok(())
}
