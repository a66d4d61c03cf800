//! A file read into the pool through io_uring (O_DIRECT or buffered), or read() and copied
//! (`Mode::Copy`): the segments first when asked for, then the repeated runs.
use std::path::Path;
use std::sync::Arc;

use ubdirect_core::seams::BlockQueue;
use ubdirect_core::UbPool;
use ubdirect_uring::{DirectMode, UringOptions, UringQueue};

use super::super::classic::run_copy;
use super::super::config::{Mode, PipelineConfig};
use super::super::cpu::online_cpus;
use super::super::engine::run_direct;
use super::error::PipelineRunError;
use super::run::Run;
use super::sinks::verify_file;
use super::FileIo;

/// The io_uring options of the run: the read mode, the depth, the tuning, and io-wq workers
/// on every CPU but the polling core.
fn uring_options(run: &Run<'_>) -> UringOptions {
    let s = run.s;
    UringOptions {
        direct: match s.file_io {
            FileIo::Direct => DirectMode::Require,
            FileIo::Buffered => DirectMode::Off,
            FileIo::Auto | FileIo::Mapped => DirectMode::Auto,
        },
        depth: s.qd,
        sqpoll_idle_ms: s.uring.sqpoll_idle_ms,
        force_async: s.uring.force_async,
        max_workers: s.uring.max_workers,
        iowq_cpus: s
            .core
            .map(|c| online_cpus().into_iter().filter(|&x| x != c).collect()),
        writable: false,
        idle_wait: s.uring.idle_wait,
    }
}

/// The file through io_uring into the pool (`FileIo::Direct` or `Buffered`, auto's fallback),
/// the segments first when asked for, then the repeated runs.
pub(super) fn uring(
    run: &mut Run<'_>,
    path: &Path,
    pool: &Arc<UbPool>,
) -> Result<(), PipelineRunError> {
    let s = run.s;
    let mut q = UringQueue::open(path, &[pool.region().clone()], &uring_options(run))?;
    let cap = q.capacity();
    let cfg = PipelineConfig {
        limit: run.limit(cap),
        ..run.config()
    };
    let name = format!(
        "file:{} (io_uring, {}{})",
        path.display(),
        if q.is_direct() {
            "O_DIRECT"
        } else {
            "buffered"
        },
        if q.is_async() { ", io-wq" } else { "" }
    );
    let mut sink = run.make_sink(pool, cap)?;
    run.warn_numa();
    if s.segments {
        run.segments((&mut q, &name), Some(sink.as_mut()), pool, &cfg)?;
        // The sink-alone segment fed this sink: a fresh one for the verified run (the old one
        // released first: a CUDA sink registers the pool with the GPU).
        drop(sink);
        sink = run.make_sink(pool, cap)?;
    }
    for i in 0..s.repeat {
        let label = run.label(i);
        let sink = sink.as_mut();
        let mut r = match s.mode {
            Mode::Direct => run_direct(&mut q, &mut *sink, pool, &cfg, &label, &name)?,
            Mode::Copy => run_copy(path, &mut *sink, &cfg, &format!("{label} (classic copy)"))?,
        };
        verify_file(
            run,
            path,
            &mut r,
            sink,
            "sink checksum vs read() of the file",
        )?;
        run.reports.push(r);
    }
    Ok(())
}
