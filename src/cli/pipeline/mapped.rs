//! `pipeline --io mapped`: a file's page cache registered with the GPU in windows (by threads
//! working ahead of the copies) and copied in place, in copies of `--copy-size` bytes; with
//! `--segments`, the H2D ceiling measured first in the same process with copies of the same size
//! out of pinned pool blocks.

use std::path::Path;
use std::sync::Arc;

use ubdirect::pipeline::{
    file_checksum, run_mapped, run_sink_only, CudaSinks, MappedFile, MappedOptionError,
    MappedOptions, MappedPlan, PipelineConfig, PipelineReport, COPY_ALIGN,
    DEFAULT_REGISTER_THREADS, MAX_REGISTER_THREADS,
};
use ubdirect_core::{UbPool, UbRegistry};

use super::{add_verify, cuda_ordinals, host_pool, make_cuda_sinks, map_cap, warn_numa, Args};
use super::{BoxErr, Outputs};

/// The mapped-run settings the flags ask for.
pub(super) fn options(args: &Args) -> MappedOptions {
    MappedOptions {
        copy_size: args
            .copy_size
            .map(|c| usize::try_from(c).unwrap_or(usize::MAX)),
        window: args.map_window,
        register_threads: args.register_threads.unwrap_or(DEFAULT_REGISTER_THREADS),
    }
}

/// True when a mapped-only flag was given.
pub(super) fn flags_given(args: &Args) -> bool {
    args.copy_size.is_some() || args.map_window.is_some() || args.register_threads.is_some()
}

/// The library's refusal of a mapped setting, said with the flag that set it.
pub(super) fn flag_error(e: &MappedOptionError) -> String {
    match *e {
        MappedOptionError::CopySizeZero => {
            format!("--copy-size must be at least {COPY_ALIGN} (4K), not 0")
        }
        MappedOptionError::CopySizeUnaligned { size } => format!(
            "--copy-size {size} is not a multiple of 4K: use {} or {}",
            size / COPY_ALIGN * COPY_ALIGN,
            size.next_multiple_of(COPY_ALIGN)
        ),
        MappedOptionError::CopySizeTooLarge { size, span, start } => format!(
            "--copy-size {size} exceeds the {span} bytes streamed from the file (its size less --offset {start}): use at most {}",
            span.next_multiple_of(COPY_ALIGN as u64)
        ),
        MappedOptionError::WindowNotMultiple { window, copy_size } => format!(
            "--map-window {window} must be a positive multiple of the copy size ({copy_size} bytes; --copy-size sets it)"
        ),
        MappedOptionError::RegisterThreads { threads } => {
            format!("--register-threads {threads}: use 1 to {MAX_REGISTER_THREADS}")
        }
    }
}

/// Check the mapped settings for a file of `size` bytes, in the CLI's terms.
pub(super) fn plan(args: &Args, size: u64) -> Result<MappedPlan, BoxErr> {
    let span = size.saturating_sub(args.start);
    if span == 0 {
        return Err(format!(
            "--offset {} is not below the file's {size} bytes: nothing to stream",
            args.start
        )
        .into());
    }
    let plan = options(args)
        .resolve(span, args.start)
        .map_err(|e| flag_error(&e))?;
    let cap = map_cap(args);
    if plan.window + COPY_ALIGN as u64 > cap {
        return Err(format!(
            "a {}-byte window cannot be registered under --map-cap {cap}: lower --map-window (or --copy-size), or raise --map-cap",
            plan.window
        )
        .into());
    }
    Ok(plan)
}

/// The registry of the run's windows: registered with the first GPU of `--sink`, under
/// `--map-cap`, page tables faulted in first when two or more threads register.
fn window_registry(
    args: &Args,
    plan: &MappedPlan,
) -> Result<ubdirect_cuda::FileWindowRegistry, BoxErr> {
    let gpu = ubdirect_cuda::CudaGpu::open(cuda_ordinals(args)?[0])?;
    let pinner = ubdirect_cuda::CudaHostPinner::new(&gpu)?;
    let windows = ubdirect_cuda::FileWindowRegistry::new(Arc::new(pinner), map_cap(args));
    // Faulting a window's page tables in outside the driver lets one thread do it while another
    // registers (the driver registers one window at a time).
    windows.set_populate(args.map_populate.unwrap_or(plan.register_threads > 1));
    Ok(windows)
}

/// `--segments`: the H2D ceiling, pinned pool blocks -> GPU in copies of `copy_size`.
fn h2d_ceiling(
    sinks: &mut CudaSinks,
    pool: &Arc<UbPool>,
    cfg: &PipelineConfig,
    copy_size: usize,
) -> Result<PipelineReport, BoxErr> {
    let c = PipelineConfig {
        verify: false,
        block_size: copy_size,
        ..cfg.clone()
    };
    let mut seg = run_sink_only(
        sinks,
        pool,
        &c,
        "segment: pinned UB -> GPU (H2D ceiling, no source, copies of the copy size)",
    )?;
    seg.gpus = sinks.shares(std::time::Duration::from_secs_f64(seg.seconds));
    sinks.reset_counts();
    Ok(seg)
}

/// Run `--io mapped` over `file` (`size` bytes, `resident` in the page cache).
pub(super) fn run(
    args: &Args,
    path: &Path,
    resident: f64,
    registry: &Arc<UbRegistry>,
    cfg: PipelineConfig,
    out: &mut Outputs,
) -> Result<(), BoxErr> {
    let file =
        std::fs::File::open(path).map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    let plan = plan(args, file.metadata()?.len())?;
    let cfg = PipelineConfig {
        mapped: MappedOptions {
            copy_size: Some(plan.copy_size),
            window: Some(plan.window),
            register_threads: plan.register_threads,
        },
        ..cfg
    };
    // The ceiling's pool: pinned blocks of the copy size, one per copy in flight.
    let ceiling = if args.segments {
        Some(host_pool(registry, plan.copy_size, args.qd, false)?)
    } else {
        None
    };
    let region = ceiling.as_ref().map(|p| p.region().clone());
    let mut sinks = make_cuda_sinks(
        args,
        region.as_ref(),
        plan.copy_size,
        args.qd,
        &mut out.numa,
    )?;
    warn_numa(args.core, out.numa);
    let windows = window_registry(args, &plan)?;
    let src = MappedFile {
        file: &file,
        name: format!(
            "file:{} (mapped page cache, registered read-only)",
            path.display()
        ),
        registry: &windows,
        resident,
    };
    if let Some(pool) = &ceiling {
        out.reports
            .push(h2d_ceiling(&mut sinks, pool, &cfg, plan.copy_size)?);
    }
    for i in 0..args.repeat {
        let label = if args.repeat > 1 {
            format!("pipeline (run {}/{})", i + 1, args.repeat)
        } else {
            "pipeline".to_string()
        };
        let mut r: PipelineReport = run_mapped(&src, &mut sinks, &cfg, &label)?;
        sinks.reset_counts();
        if args.verify {
            let expected = file_checksum(path, args.start, r.bytes)?;
            add_verify(
                &mut r,
                &mut sinks,
                expected,
                "GPU checksum vs read() of the file",
            )?;
        }
        out.reports.push(r);
    }
    // The copies end before the windows they read go.
    drop(sinks);
    drop(windows);
    Ok(())
}
