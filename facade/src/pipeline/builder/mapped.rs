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
use super::super::mapped_options::{MappedOptions, MappedPlan, COPY_ALIGN};
use super::super::report::PipelineReport;
use super::super::segments::run_sink_only;
use super::error::{PipelineRunError, SetupError};
use super::file::{open_error, verify_file};
use super::run::Run;
use super::{MappedSettings, Settings};

/// Page-cache residency above which `FileIo::Auto` maps the file instead of reading it.
pub const AUTO_MAPPED_RESIDENT: f64 = 0.9;

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

/// The registration cap: the one given, or half the RAM (MemTotal / 2), or 16 GiB when
/// /proc/meminfo says nothing.
pub fn map_cap(settings: &MappedSettings) -> u64 {
    settings.cap.unwrap_or_else(|| {
        std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|m| {
                m.lines()
                    .find(|l| l.starts_with("MemTotal:"))
                    .and_then(|l| l.split_whitespace().nth(1))
                    .and_then(|kb| kb.parse::<u64>().ok())
            })
            .map(|kb| kb * 1024 / 2)
            .unwrap_or(16 << 30)
    })
}

/// Check the mapped settings for a file of `size` bytes streamed from `start`.
pub fn mapped_plan(
    settings: &MappedSettings,
    start: u64,
    size: u64,
) -> Result<MappedPlan, SetupError> {
    let span = size.saturating_sub(start);
    if span == 0 {
        return Err(SetupError::StartPastEnd { start, size });
    }
    let opts = MappedOptions {
        copy_size: settings.copy_size,
        window: settings.window,
        register_threads: settings
            .register_threads
            .unwrap_or(super::super::mapped_options::DEFAULT_REGISTER_THREADS),
    };
    let plan = opts.resolve(span, start)?;
    let cap = map_cap(settings);
    if plan.window + COPY_ALIGN as u64 > cap {
        return Err(SetupError::WindowOverCap {
            window: plan.window,
            cap,
        });
    }
    Ok(plan)
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
