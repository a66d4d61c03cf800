//! `--io mapped`: the file's page cache itself is the unified buffer. The file is mapped
//! read-only in windows (1 GiB, a multiple of the block size), each registered once with CUDA
//! through a [`FileWindowRegistry`] and kept across passes; the polling thread only queues
//! `cuMemcpyHtoDAsync` copies straight out of the windows, striped over the GPUs, and reaps their
//! events. No CPU copy, no read(): the copy engines read the page cache in place.
//!
//! When every window the run touches fits under the registry's cap they are registered before
//! the timed loop (reported as `register_s`, and in `gb_per_s_with_register`); otherwise they
//! are registered as the stream reaches them and released when their copies completed. Before
//! each pass the file is fstat()ed: a change of size or mtime ends the run with an error naming
//! it (see `ubdirect_cuda::FileWindowRegistry`).

use std::fs::File;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ubdirect_core::seams::{BlockError, BlockErrorKind, SinkErrorKind};
use ubdirect_core::util::LatencyHistogram;
use ubdirect_cuda::{FileWindow, FileWindowRegistry, WindowError};

use super::config::{Limit, Mode, PipelineConfig};
use super::cpu::process_cpu_time;
use super::cuda_sinks::CudaSinks;
use super::engine::{block_range, make_progress};
use super::error::PipelineError;
use super::report::{MappedInfo, PipelineReport};

/// Target window length: registration granularity and eviction unit.
const WINDOW_TARGET: u64 = 1 << 30;

/// Window length for `block_size`-byte blocks: the largest multiple of the block size up to
/// 1 GiB (at least one block), so no block straddles two windows.
pub fn window_len(block_size: u64) -> u64 {
    let bs = block_size.max(1);
    (WINDOW_TARGET / bs).max(1) * bs
}

/// A `--io mapped` source: an open file and the registry its windows live in.
#[derive(Debug)]
pub struct MappedFile<'a> {
    /// The file.
    pub file: &'a File,
    /// Its name for reports.
    pub name: String,
    /// Registered windows (shared across passes and runs of the process).
    pub registry: &'a FileWindowRegistry,
    /// Page-cache residency measured when the I/O mode was chosen (for the report).
    pub resident: f64,
}

#[derive(Clone, Copy)]
struct Meta {
    seq: u64,
    start: Instant,
    len: u64,
    window: usize,
}

fn window_err(name: &str, e: WindowError) -> PipelineError {
    PipelineError::Source(BlockError::new(
        BlockErrorKind::Other,
        format!("{name}: {e}"),
    ))
}

struct Windows<'a> {
    src: &'a MappedFile<'a>,
    start: u64,
    span: u64,
    wlen: u64,
    slots: Vec<Option<Arc<FileWindow>>>,
    in_flight: Vec<usize>,
    keep_all: bool,
    register: Duration,
}

impl Windows<'_> {
    fn get(&mut self, wi: usize) -> Result<*const u8, PipelineError> {
        if let Some(w) = &self.slots[wi] {
            return Ok(w.as_ptr());
        }
        let off = wi as u64 * self.wlen;
        let len = self.wlen.min(self.span - off);
        let t = Instant::now();
        let w = self
            .src
            .registry
            .acquire(self.src.file, self.start + off, len)
            .map_err(|e| window_err(&self.src.name, e))?;
        self.register += t.elapsed();
        let p = w.as_ptr();
        self.slots[wi] = Some(w);
        Ok(p)
    }

    fn done(&mut self, wi: usize, current: usize) {
        self.in_flight[wi] -= 1;
        if !self.keep_all && self.in_flight[wi] == 0 && wi != current {
            self.slots[wi] = None;
        }
    }
}

/// Stream `cfg.limit` bytes of `src` into `sinks` (GPU copies straight out of registered
/// windows). `cfg.qd` is the copies in flight per GPU.
pub fn run_mapped(
    src: &MappedFile<'_>,
    sinks: &mut CudaSinks,
    cfg: &PipelineConfig,
    label: &str,
) -> Result<PipelineReport, PipelineError> {
    let cap = src
        .file
        .metadata()
        .map_err(|source| PipelineError::Io {
            what: format!("stat {}", src.name),
            source,
        })?
        .len();
    cfg.validate(cap, 1).map_err(PipelineError::Config)?;
    if cfg.verify && cfg.block_size % 8 != 0 {
        return Err(PipelineError::Config(format!(
            "PipelineConfig::verify needs a block size that is a multiple of 8 bytes, not {}",
            cfg.block_size
        )));
    }
    let ngpu = sinks.len().max(1);
    let span = cap - cfg.start;
    let bs = cfg.block_size as u64;
    let wlen = window_len(bs);
    let nwin = span.div_ceil(wlen) as usize;
    let stats0 = src.registry.stats();
    // Bytes the run touches: one pass at most decides which windows it needs.
    let touched = match cfg.limit {
        Limit::Bytes(b) => b.min(span),
        Limit::Duration(_) => span,
    };
    let touched_windows = touched.div_ceil(wlen) as usize;
    let mut win = Windows {
        src,
        start: cfg.start,
        span,
        wlen,
        slots: vec![None; nwin],
        in_flight: vec![0; nwin],
        keep_all: touched.next_multiple_of(4096) + 4096 * touched_windows as u64
            <= src.registry.cap(),
        register: Duration::ZERO,
    };
    if win.keep_all {
        for wi in 0..touched_windows {
            win.get(wi)?;
        }
    }
    let pre_register = win.register;
    win.register = Duration::ZERO;

    let qd = cfg.qd.max(1);
    let ring = (qd * ngpu * 2).next_power_of_two();
    let mask = ring as u64 - 1;
    let t0 = Instant::now();
    let mut meta = vec![
        Meta {
            seq: u64::MAX,
            start: t0,
            len: 0,
            window: 0,
        };
        ring
    ];
    let per_pass = span.div_ceil(bs).max(1);
    let (byte_limit, deadline) = match cfg.limit {
        Limit::Bytes(b) => (b, None),
        Limit::Duration(d) => (u64::MAX, Some(t0 + d)),
    };
    let mut lat = LatencyHistogram::default();
    let progress = make_progress(cfg);
    let cpu0 = process_cpu_time();
    let (mut seq, mut submitted, mut delivered, mut blocks) = (0u64, 0u64, 0u64, 0u64);
    let mut err: Option<PipelineError> = None;
    let mut past_deadline = false;
    let mut last_progress = t0;
    let mut iter = 0u64;
    let mut current = 0usize;
    let mut checked_pass = 0u64;
    let mut progressed = false;
    loop {
        iter += 1;
        let now = (iter % 64 == 0).then(Instant::now);
        if let (Some(d), Some(n)) = (deadline, now) {
            past_deadline |= n >= d;
        }
        // 1. Queue copies, round-robin over the GPUs, until one is full.
        while err.is_none() && !past_deadline && submitted < byte_limit {
            if seq > 0 && seq % per_pass == 0 && checked_pass != seq {
                // A new pass: has the file changed since its windows were registered?
                checked_pass = seq;
                if let Err(e) = src.registry.check(src.file) {
                    err = Some(window_err(&src.name, e));
                    break;
                }
            }
            if meta[(seq & mask) as usize].len != 0 {
                break; // the ring slot's copy has not been reaped yet
            }
            let (off, len) = block_range(seq, bs, span);
            let len = len.min(byte_limit - submitted);
            let wi = (off / wlen) as usize;
            let base = match win.get(wi) {
                Ok(p) => p,
                Err(e) => {
                    err = Some(e);
                    break;
                }
            };
            let g = sinks.gpu_of(seq);
            // SAFETY: `base` is window `wi`, held in `win.slots[wi]` while `in_flight[wi]` > 0
            // (released only by `done` once the copy was reaped, or after the sinks are
            // synchronized below); off - wi*wlen + len <= the window's length.
            let r = unsafe {
                let p = base.add((off - wi as u64 * wlen) as usize);
                sinks.submit_host(g, p, len as usize, seq * bs)
            };
            match r {
                Ok(()) => {}
                Err(e) if e.kind == SinkErrorKind::Full => break,
                Err(e) => {
                    err = Some(PipelineError::Sink(e));
                    break;
                }
            }
            meta[(seq & mask) as usize] = Meta {
                seq,
                start: Instant::now(),
                len,
                window: wi,
            };
            win.in_flight[wi] += 1;
            if wi != current {
                let old = current;
                current = wi;
                if !win.keep_all && win.in_flight[old] == 0 {
                    win.slots[old] = None;
                }
            }
            submitted += len;
            seq += 1;
        }
        // 2. Reap.
        let mut reaped = 0usize;
        let r = sinks.poll_host(&mut |tag, res| {
            reaped += 1;
            let s = tag / bs;
            let slot = (s & mask) as usize;
            let m = meta[slot];
            meta[slot].len = 0;
            if m.seq != s {
                err.get_or_insert(PipelineError::Verify(format!(
                    "copy of stream offset {tag} completed but was not in flight (bug)"
                )));
                return;
            }
            win.done(m.window, current);
            match res {
                Ok(()) => {
                    blocks += 1;
                    delivered += m.len;
                    lat.record(m.start.elapsed().as_nanos() as u64);
                }
                Err(e) => {
                    err.get_or_insert(PipelineError::Sink(e));
                }
            }
        });
        if let Err(e) = r {
            err.get_or_insert(PipelineError::Sink(e));
        }
        let in_flight = sinks.copies_in_flight();
        progressed |= reaped > 0;
        if let Some(n) = now {
            if std::mem::take(&mut progressed) || in_flight == 0 {
                last_progress = n;
                if let Some(pb) = &progress {
                    pb.set_position(match cfg.limit {
                        Limit::Bytes(_) => delivered,
                        Limit::Duration(_) => t0.elapsed().as_millis() as u64,
                    });
                }
            } else if n.duration_since(last_progress) > cfg.stall_timeout {
                err.get_or_insert(PipelineError::Stalled {
                    secs: cfg.stall_timeout.as_secs(),
                    in_flight,
                });
                break;
            }
        }
        let finished = err.is_some() || past_deadline || submitted >= byte_limit;
        if finished && in_flight == 0 {
            break;
        }
        if reaped == 0 {
            std::hint::spin_loop();
        }
    }
    let wall = t0.elapsed();
    let cpu = process_cpu_time().saturating_sub(cpu0);
    if let Some(pb) = progress {
        pb.finish_and_clear();
    }
    if sinks.copies_in_flight() > 0 {
        // Leaving early (stall): the windows must outlive every queued copy.
        if let Err(e) = sinks.synchronize() {
            tracing::error!("mapped run: GPU copies did not finish ({e}); leaking their windows");
            std::mem::forget(win.slots);
            return Err(err.unwrap_or(PipelineError::Verify(e)));
        }
    }
    if let Some(e) = err {
        return Err(e);
    }
    let stats = src.registry.stats();
    let mut r = PipelineReport::new(
        label,
        Mode::Direct,
        src.name.clone(),
        super::sink_ext::PipelineSink::name(sinks),
        cfg.block_size,
        qd,
        delivered,
        blocks,
        wall,
        cpu,
        &lat,
    );
    r.gpus = sinks.shares(wall);
    let register_s = (pre_register + win.register).as_secs_f64();
    r.mapped = Some(MappedInfo {
        resident: src.resident,
        windows_registered: stats.registered - stats0.registered,
        windows_reused: stats.reused - stats0.reused,
        register_s,
        gb_per_s_with_register: delivered as f64
            / 1e9
            / (wall + pre_register).as_secs_f64().max(1e-9),
    });
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_hold_whole_blocks() {
        assert_eq!(window_len(4 << 20), 1 << 30);
        assert_eq!(window_len(3 << 20), 341 * (3 << 20));
        assert_eq!(window_len(2 << 30), 2 << 30);
        assert_eq!(window_len(0), 1 << 30);
    }
}
