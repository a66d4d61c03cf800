//! `--io mapped`: the file's page cache itself is the unified buffer. The file is mapped
//! read-only in windows (a whole number of copies each, [`MappedOptions`]), each registered with
//! CUDA through a [`FileWindowRegistry`] and kept across passes; the polling thread only queues
//! host-to-device copies of the copy size straight out of the windows, striped over the GPUs,
//! and reaps their events. No CPU copy, no read(): the copy engines read the page cache in place.
//!
//! Registration runs beside the copies: worker threads register the windows ahead of the stream
//! (window k+1 while window k is copied), so a cold pass starts copying as soon as its first
//! window is registered instead of after the whole file; a copy is queued only from a window
//! already registered. (The CUDA driver registers one range at a time and holds copy submission
//! while it does, so on a cold pass registration and copies still share the time; faulting the
//! next window's page tables in on another thread, outside the driver, is what runs in parallel.) When every window the run touches fits under
//! the registry's cap they are all kept (and reused by later runs); otherwise a window is let go
//! of once its copies completed, and only a few are registered ahead. Before each pass the file
//! is fstat()ed: a change of size or mtime ends the run with an error naming it (see
//! `ubdirect_cuda::FileWindowRegistry`). A run that fails lets go of the windows it registered.
//!
//! [`MappedOptions`]: super::MappedOptions

use std::fs::File;
use std::time::{Duration, Instant};

use ubdirect_core::seams::{BlockError, BlockErrorKind, SinkErrorKind};
use ubdirect_core::util::LatencyHistogram;
use ubdirect_cuda::{FileWindowRegistry, WindowError};

use super::config::{Limit, Mode, PipelineConfig};
use super::cpu::process_cpu_time;
use super::engine::{block_range, make_progress};
use super::error::PipelineError;
use super::mapped_options::MappedPlan;
use super::mapped_sink::MappedSink;
use super::mapped_windows::{NotReady, Registrar, StopOnDrop, Windows};
use super::progress::ProgressBar;
use super::report::{MappedInfo, PipelineReport, RunFigures};

/// Window length for `copy_size`-byte copies with the default window target: the largest
/// multiple of the copy size up to it (at least one copy), so no copy straddles two windows.
pub fn window_len(copy_size: u64) -> u64 {
    let cs = copy_size.max(1);
    (super::mapped_options::DEFAULT_WINDOW_TARGET / cs).max(1) * cs
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

/// How long the polling thread sleeps between polls while the next window is registered.
const REGISTRATION_BACKOFF: Duration = Duration::from_micros(50);

/// How the run uses its windows.
struct Layout {
    /// Windows the run touches, from window 0.
    touched: usize,
    /// Every touched window fits under the registry's cap: keep them all.
    keep_all: bool,
    /// Windows registered ahead of the current one otherwise.
    lookahead: usize,
}

impl Layout {
    fn new(src: &MappedFile<'_>, cfg: &PipelineConfig, plan: &MappedPlan, span: u64) -> Layout {
        let touched = match cfg.limit {
            Limit::Bytes(b) => b.min(span),
            Limit::Duration(_) => span,
        };
        let touched_windows = touched.div_ceil(plan.window) as usize;
        let page = 4096;
        let cap = src.registry.cap();
        let pinned = plan.window + page;
        Layout {
            touched: touched_windows,
            keep_all: touched.next_multiple_of(page) + page * touched_windows as u64 <= cap,
            lookahead: (cap / pinned).saturating_sub(2).max(1) as usize,
        }
    }
}

/// Stream `cfg.limit` bytes of `src` into `sinks` (copies of `cfg.mapped`'s copy size straight
/// out of registered windows). `cfg.qd` is the copies in flight per GPU.
pub fn run_mapped<S: MappedSink + ?Sized>(
    src: &MappedFile<'_>,
    sinks: &mut S,
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
    let span = cap - cfg.start;
    let plan = cfg.mapped.resolve(span, cfg.start)?;
    if plan.copy_size > sinks.max_copy() {
        return Err(PipelineError::Config(format!(
            "the sink takes copies of at most {} bytes, less than the {}-byte copy size: build it with slots of at least the copy size",
            sinks.max_copy(),
            plan.copy_size
        )));
    }
    let layout = Layout::new(src, cfg, &plan, span);
    let reg = Registrar::new(src.file, src.registry, cfg.start, span, plan.window);
    let stats0 = src.registry.stats();
    let mut st = Stream::new(cfg, &plan, span, sinks.devices());
    let cpu0 = process_cpu_time();
    let (res, mut win) = std::thread::scope(|s| {
        for _ in 0..plan.register_threads {
            s.spawn(|| reg.work());
        }
        let _stop = StopOnDrop(&reg);
        let mut win = Windows::new(&reg, layout.touched, layout.keep_all, layout.lookahead);
        let r = st.run(src, sinks, &mut win);
        st.wall = st.t0.elapsed();
        (r, win)
    });
    let cpu = process_cpu_time().saturating_sub(cpu0);
    if sinks.copies_in_flight() > 0 {
        // Leaving early (stall): the windows must outlive every queued copy.
        if let Err(e) = sinks.synchronize() {
            tracing::error!("mapped run: GPU copies did not finish ({e}); leaking their windows");
            win.leak();
            return Err(res.err().unwrap_or(PipelineError::Verify(e)));
        }
    }
    if let Err(e) = res {
        win.release_fresh();
        return Err(e);
    }
    let stats = src.registry.stats();
    let figures = RunFigures {
        label: label.into(),
        mode: Mode::Direct,
        source: src.name.clone(),
        sink: sinks.name(),
        block_size: plan.copy_size,
        qd: st.qd,
        bytes: st.delivered,
        blocks: st.blocks,
        wall: st.wall,
        cpu,
    };
    let mut r = PipelineReport::new(figures, &st.lat);
    r.gpus = sinks.shares(st.wall);
    r.mapped = Some(MappedInfo {
        resident: src.resident,
        windows_registered: stats.registered - stats0.registered,
        windows_reused: stats.reused - stats0.reused,
        register_s: reg.busy().as_secs_f64(),
        gb_per_s_with_register: st.delivered as f64 / 1e9 / st.wall.as_secs_f64().max(1e-9),
        copy_size: plan.copy_size as u64,
        window: plan.window,
        register_threads: plan.register_threads,
        register_wait_s: st.wait.as_secs_f64(),
    });
    Ok(r)
}

/// The polling loop's state.
struct Stream {
    cs: u64,
    span: u64,
    wlen: u64,
    qd: usize,
    mask: u64,
    meta: Vec<Meta>,
    per_pass: u64,
    byte_limit: u64,
    deadline: Option<Instant>,
    stall_timeout: Duration,
    progress: Option<ProgressBar>,
    limit: Limit,
    t0: Instant,
    wall: Duration,
    lat: LatencyHistogram,
    seq: u64,
    submitted: u64,
    delivered: u64,
    blocks: u64,
    err: Option<PipelineError>,
    past_deadline: bool,
    checked_pass: u64,
    /// Time the copies waited for a window's registration.
    wait: Duration,
    waiting_since: Option<Instant>,
}

impl Stream {
    fn new(cfg: &PipelineConfig, plan: &MappedPlan, span: u64, devices: usize) -> Stream {
        let qd = cfg.qd.max(1);
        let ring = (qd * devices * 2).next_power_of_two();
        let t0 = Instant::now();
        let cs = plan.copy_size as u64;
        let (byte_limit, deadline) = match cfg.limit {
            Limit::Bytes(b) => (b, None),
            Limit::Duration(d) => (u64::MAX, Some(t0 + d)),
        };
        Stream {
            cs,
            span,
            wlen: plan.window,
            qd,
            mask: ring as u64 - 1,
            meta: vec![
                Meta {
                    seq: u64::MAX,
                    start: t0,
                    len: 0,
                    window: 0,
                };
                ring
            ],
            per_pass: span.div_ceil(cs).max(1),
            byte_limit,
            deadline,
            stall_timeout: cfg.stall_timeout,
            progress: make_progress(cfg),
            limit: cfg.limit,
            t0,
            wall: Duration::ZERO,
            lat: LatencyHistogram::default(),
            seq: 0,
            submitted: 0,
            delivered: 0,
            blocks: 0,
            err: None,
            past_deadline: false,
            checked_pass: 0,
            wait: Duration::ZERO,
            waiting_since: None,
        }
    }

    /// Queue, reap and watch for stalls until the limit is reached and every copy reaped (or
    /// an error ended the run and every copy was reaped).
    fn run<S: MappedSink + ?Sized>(
        &mut self,
        src: &MappedFile<'_>,
        sinks: &mut S,
        win: &mut Windows<'_, '_>,
    ) -> Result<(), PipelineError> {
        let progress = self.progress.take();
        let mut last_progress = self.t0;
        let mut progressed = false;
        let mut iter = 0u64;
        loop {
            iter += 1;
            let now = (iter % 64 == 0).then(Instant::now);
            if let (Some(d), Some(n)) = (self.deadline, now) {
                self.past_deadline |= n >= d;
            }
            self.submit(src, sinks, win);
            let reaped = self.reap(sinks, win);
            let in_flight = sinks.copies_in_flight();
            progressed |= reaped > 0;
            if let Some(n) = now {
                if std::mem::take(&mut progressed) || in_flight == 0 {
                    last_progress = n;
                    if let Some(pb) = &progress {
                        pb.set_position(match self.limit {
                            Limit::Bytes(_) => self.delivered,
                            Limit::Duration(_) => self.t0.elapsed().as_millis() as u64,
                        });
                    }
                } else if n.duration_since(last_progress) > self.stall_timeout {
                    self.err.get_or_insert(PipelineError::Stalled {
                        secs: self.stall_timeout.as_secs(),
                        in_flight,
                    });
                    break;
                }
                self.check_registration_wait(n, &src.name);
            }
            let finished =
                self.err.is_some() || self.past_deadline || self.submitted >= self.byte_limit;
            if finished && in_flight == 0 {
                break;
            }
            if reaped == 0 && self.waiting_since.is_some() {
                // The next window is being registered: the driver serialises that with every
                // other call, so polling it only slows the registration down.
                std::thread::sleep(REGISTRATION_BACKOFF);
            } else if reaped == 0 {
                std::hint::spin_loop();
            }
        }
        if let Some(pb) = progress {
            pb.finish_and_clear();
        }
        match self.err.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// A registration that takes longer than the stall timeout ends the run.
    fn check_registration_wait(&mut self, now: Instant, name: &str) {
        if let Some(since) = self.waiting_since {
            if now.duration_since(since) > self.stall_timeout {
                let (off, _) = block_range(self.seq, self.cs, self.span);
                self.err.get_or_insert(PipelineError::Source(BlockError::new(
                    BlockErrorKind::Other,
                    format!(
                        "{name}: registering the window holding file offset {off} with the GPU took more than {} s (driver hung?)",
                        self.stall_timeout.as_secs()
                    ),
                )));
            }
        }
    }

    /// Queue copies, round-robin over the devices, until a device is full, the next window is
    /// not registered yet, or the limit is reached.
    fn submit<S: MappedSink + ?Sized>(
        &mut self,
        src: &MappedFile<'_>,
        sinks: &mut S,
        win: &mut Windows<'_, '_>,
    ) {
        while self.err.is_none() && !self.past_deadline && self.submitted < self.byte_limit {
            let seq = self.seq;
            if seq > 0 && seq % self.per_pass == 0 && self.checked_pass != seq {
                // A new pass: has the file changed since its windows were registered?
                self.checked_pass = seq;
                if let Err(e) = src.registry.check(src.file) {
                    self.err = Some(window_err(&src.name, e));
                    return;
                }
            }
            let slot = (seq & self.mask) as usize;
            if self.meta[slot].len != 0 {
                return; // the ring slot's copy has not been reaped yet
            }
            let (off, len) = block_range(seq, self.cs, self.span);
            let len = len.min(self.byte_limit - self.submitted);
            let wi = (off / self.wlen) as usize;
            let base = match win.get(wi) {
                Ok(p) => p,
                Err(NotReady::Pending) => {
                    self.waiting_since.get_or_insert_with(Instant::now);
                    return;
                }
                Err(NotReady::Failed { offset, end, error }) => {
                    self.err = Some(PipelineError::Source(BlockError::new(
                        BlockErrorKind::Other,
                        format!(
                            "{}: the window of file bytes {offset}..{end}: {error}",
                            src.name
                        ),
                    )));
                    return;
                }
            };
            if let Some(since) = self.waiting_since.take() {
                self.wait += since.elapsed();
            }
            let d = sinks.device_of(seq);
            // SAFETY: `base` is window `wi`, held by `win` while copies from it are in flight
            // (let go of only by `done` once the copy was reaped, or after the sinks were
            // synchronized); off - wi*wlen + len <= the window's length.
            let r = unsafe {
                let p = base.add((off - wi as u64 * self.wlen) as usize);
                sinks.submit_host(d, p, len as usize, seq * self.cs)
            };
            match r {
                Ok(()) => {}
                Err(e) if e.kind == SinkErrorKind::Full => return,
                Err(e) => {
                    self.err = Some(PipelineError::Sink(e));
                    return;
                }
            }
            self.meta[slot] = Meta {
                seq,
                start: Instant::now(),
                len,
                window: wi,
            };
            win.submitted(wi);
            self.submitted += len;
            self.seq += 1;
        }
    }

    /// Reap completed copies; let windows go whose copies are all done.
    fn reap<S: MappedSink + ?Sized>(&mut self, sinks: &mut S, win: &mut Windows<'_, '_>) -> usize {
        let mut reaped = 0usize;
        let cs = self.cs;
        let mask = self.mask;
        let (meta, lat, err) = (&mut self.meta, &mut self.lat, &mut self.err);
        let (blocks, delivered) = (&mut self.blocks, &mut self.delivered);
        let r = sinks.poll_host(&mut |tag, res| {
            reaped += 1;
            let s = tag / cs;
            let slot = (s & mask) as usize;
            let m = meta[slot];
            meta[slot].len = 0;
            if m.seq != s || m.len == 0 {
                err.get_or_insert(PipelineError::Verify(format!(
                    "copy of stream offset {tag} completed but was not in flight (bug)"
                )));
                return;
            }
            win.done(m.window);
            match res {
                Ok(()) => {
                    *blocks += 1;
                    *delivered += m.len;
                    lat.record(m.start.elapsed().as_nanos() as u64);
                }
                Err(e) => {
                    err.get_or_insert(PipelineError::Sink(e));
                }
            }
        });
        if let Err(e) = r {
            self.err.get_or_insert(PipelineError::Sink(e));
        }
        reaped
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_hold_whole_copies() {
        assert_eq!(window_len(4 << 20), 256 << 20);
        assert_eq!(window_len(48 << 20), 240 << 20);
        assert_eq!(window_len(2 << 30), 2 << 30);
        assert_eq!(window_len(0), 256 << 20);
    }
}
