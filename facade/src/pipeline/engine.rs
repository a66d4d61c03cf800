//! The direct pipeline loop: one polling thread keeps the source queue full to `qd` with pool
//! blocks, hands each completed block to the sink, and each sink-completed block back to the
//! pool (and so to the source). Nothing on this path allocates; doorbells are batched (one
//! ring per round of submissions).
//!
//! [`Engine`] holds the loop's state; each round runs its steps in order: watch (clock,
//! deadline, removal requests), sink backlog, fill the source, reap the source, reap the sink,
//! check whether to stop.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ubdirect_core::seams::{BlockCompletion, BlockErrorKind, BlockQueue, SinkErrorKind};
use ubdirect_core::util::{rdtsc, LatencyHistogram};
use ubdirect_core::{PciDevice, UbBuf, UbPool};

use super::config::{Limit, Mode, PipelineConfig};
use super::cpu::process_cpu_time;
use super::error::PipelineError;
pub(crate) use super::progress::make_progress;
use super::progress::ProgressBar;
use super::report::{PipelineReport, RunFigures};
use super::sink_ext::PipelineSink;

/// Per-block bookkeeping, in a ring indexed by block sequence number.
#[derive(Debug, Clone, Copy)]
struct Meta {
    seq: u64,
    start: Instant,
    len: u64,
}

/// Where block `seq` comes from: (source offset, length), given the source capacity.
pub fn block_range(seq: u64, block_size: u64, capacity: u64) -> (u64, u64) {
    let per_pass = capacity.div_ceil(block_size).max(1);
    let off = (seq % per_pass) * block_size;
    (off, block_size.min(capacity - off))
}

/// How often the loop asks the kernel whether it wants a device back (a syscall per device).
const REMOVAL_CHECK: Duration = Duration::from_millis(100);
/// How long the loop drains after a removal request before it gives the device up.
const REMOVAL_DRAIN: Duration = Duration::from_secs(2);
/// How long the loop drains after any other non-fatal error.
const ERROR_DRAIN: Duration = Duration::from_secs(10);

/// Run the direct pipeline from `src` through `pool` into `sink`.
/// Tags given to the sink are `seq * block_size`: the true stream offset during the first pass.
pub fn run_direct<Q, S>(
    src: &mut Q,
    sink: &mut S,
    pool: &Arc<UbPool>,
    cfg: &PipelineConfig,
    label: &str,
    source_name: &str,
) -> Result<PipelineReport, PipelineError>
where
    Q: BlockQueue + ?Sized,
    S: PipelineSink + ?Sized,
{
    run_direct_watching(src, sink, pool, cfg, label, source_name, &[])
}

/// [`run_direct`], also watching `devices` for a kernel removal request (hot-unplug, sysfs
/// `remove`; see [`PciDevice::enable_removal_notice`], which the caller calls first): checked
/// every 100 ms between batches; when one comes the run stops submitting, drains what completes
/// within 2 s and returns [`PipelineError::RemovalRequested`]. The caller then drops the queues
/// and the device so the kernel's removal can complete.
pub fn run_direct_watching<Q, S>(
    src: &mut Q,
    sink: &mut S,
    pool: &Arc<UbPool>,
    cfg: &PipelineConfig,
    label: &str,
    source_name: &str,
    devices: &[Arc<PciDevice>],
) -> Result<PipelineReport, PipelineError>
where
    Q: BlockQueue + ?Sized,
    S: PipelineSink + ?Sized,
{
    check_geometry(&*src, pool, cfg)?;
    let engine = Engine::new(src, sink, pool, cfg, devices);
    let mut r = engine.run()?;
    r.label = label.into();
    r.source = source_name.into();
    Ok(r)
}

/// Refuse settings the source or the pool cannot serve, before anything is submitted.
fn check_geometry<Q: BlockQueue + ?Sized>(
    src: &Q,
    pool: &UbPool,
    cfg: &PipelineConfig,
) -> Result<(), PipelineError> {
    cfg.validate(src.capacity(), src.block_size().max(1))
        .map_err(PipelineError::Config)?;
    if pool.block_size() < cfg.block_size {
        return Err(PipelineError::Config(format!(
            "pool blocks of {} bytes are smaller than PipelineConfig::block_size {}",
            pool.block_size(),
            cfg.block_size
        )));
    }
    if cfg.block_size > src.max_transfer() {
        return Err(PipelineError::Config(format!(
            "PipelineConfig::block_size {} exceeds what the source accepts per request ({} bytes)",
            cfg.block_size,
            src.max_transfer()
        )));
    }
    Ok(())
}

/// The run's counters.
#[derive(Debug, Default)]
struct Counts {
    /// Next block sequence number to submit.
    seq: u64,
    /// Bytes submitted to the source.
    submitted: u64,
    /// Bytes handed to the sink.
    delivered: u64,
    /// Blocks the sink completed.
    blocks: u64,
    /// TSC cycles spent reaping source completions.
    poll_cycles: u64,
    /// Source completions reaped.
    completions: u64,
}

/// When the loop stops: the limits, the drain after an error, the removal and stall watches.
#[derive(Debug)]
struct StopState {
    /// Rounds run (the clock is read every 64th).
    round: u64,
    /// Bytes to move (`u64::MAX` for a timed run).
    byte_limit: u64,
    /// End of a timed run.
    deadline: Option<Instant>,
    /// The deadline has passed (seen at a clock read).
    past_deadline: bool,
    /// When the first error came: the loop drains in-flight work up to `drain_bound` from it.
    draining_since: Option<Instant>,
    /// How long to drain after the error.
    drain_bound: Duration,
    /// Last time the watched devices were asked about removal.
    last_removal_check: Instant,
    /// Something completed since the last clock read.
    progressed: bool,
    /// Last clock read at which something had completed.
    last_progress: Instant,
}

/// What the stop check decided.
enum Next {
    Continue,
    Stop,
}

/// The direct pipeline's state between rounds (see the module documentation).
struct Engine<'a, Q: ?Sized, S: ?Sized> {
    src: &'a mut Q,
    sink: &'a mut S,
    pool: &'a Arc<UbPool>,
    cfg: &'a PipelineConfig,
    devices: &'a [Arc<PciDevice>],
    /// Source capacity, logical block, pipeline block (bytes) and queue depth.
    cap: u64,
    lbs: u64,
    bs: u64,
    qd: usize,
    /// Mask of the `meta` ring.
    mask: u64,
    meta: Vec<Meta>,
    /// Blocks the sink refused as full, in stream order: (buffer, length, tag).
    backlog: VecDeque<(UbBuf, usize, u64)>,
    lat: LatencyHistogram,
    progress: Option<ProgressBar>,
    t0: Instant,
    cpu0: Duration,
    counts: Counts,
    stop: StopState,
    /// The first error; later ones are dropped.
    err: Option<PipelineError>,
}

impl<'a, Q, S> Engine<'a, Q, S>
where
    Q: BlockQueue + ?Sized,
    S: PipelineSink + ?Sized,
{
    /// Size the rings for `pool` and start the clocks (settings already checked).
    fn new(
        src: &'a mut Q,
        sink: &'a mut S,
        pool: &'a Arc<UbPool>,
        cfg: &'a PipelineConfig,
        devices: &'a [Arc<PciDevice>],
    ) -> Self {
        let pool_blocks = pool.block_count().max(1);
        let ring = (pool_blocks * 4).next_power_of_two();
        let t0 = Instant::now();
        let meta = Meta {
            seq: u64::MAX,
            start: t0,
            len: 0,
        };
        let (byte_limit, deadline) = match cfg.limit {
            Limit::Bytes(b) => (b, None),
            Limit::Duration(d) => (u64::MAX, Some(t0 + d)),
        };
        Engine {
            cap: src.capacity(),
            lbs: u64::from(src.block_size().max(1)),
            bs: cfg.block_size as u64,
            qd: cfg.qd.min(src.depth()).max(1),
            mask: ring as u64 - 1,
            meta: vec![meta; ring],
            backlog: VecDeque::with_capacity(pool_blocks),
            lat: LatencyHistogram::default(),
            progress: make_progress(cfg),
            t0,
            cpu0: process_cpu_time(),
            counts: Counts::default(),
            stop: StopState {
                round: 0,
                byte_limit,
                deadline,
                past_deadline: false,
                draining_since: None,
                drain_bound: ERROR_DRAIN,
                last_removal_check: t0,
                progressed: false,
                last_progress: Instant::now(),
            },
            err: None,
            src,
            sink,
            pool,
            cfg,
            devices,
        }
    }

    /// Run rounds until the limit is reached and everything has drained, or an error ends it.
    fn run(mut self) -> Result<PipelineReport, PipelineError> {
        loop {
            let now = self.watch();
            let submitting = self.submitting();
            self.drain_backlog();
            if submitting {
                self.fill_source();
            }
            let n = self.reap_source();
            let m = self.reap_sink();
            if let Next::Stop = self.check_stop(now, n, m) {
                break;
            }
            if n == 0 && m == 0 {
                std::hint::spin_loop();
            }
        }
        self.finish()
    }

    /// Start a round: read the clock once every 64 rounds (deadline, stall detection) and, at
    /// most every [`REMOVAL_CHECK`], ask whether the kernel wants a watched device back.
    /// Returns the time when the clock was read.
    fn watch(&mut self) -> Option<Instant> {
        let st = &mut self.stop;
        st.round += 1;
        if st.round % 64 != 0 {
            return None;
        }
        let now = Instant::now();
        if let Some(d) = st.deadline {
            st.past_deadline |= now >= d;
        }
        if !self.devices.is_empty() && now.duration_since(st.last_removal_check) >= REMOVAL_CHECK {
            st.last_removal_check = now;
            if let Some(d) = self.devices.iter().find(|d| d.removal_requested()) {
                st.drain_bound = REMOVAL_DRAIN;
                self.err.get_or_insert(PipelineError::RemovalRequested {
                    device: d.address(),
                });
            }
        }
        Some(now)
    }

    /// No error, bytes left to submit and time left.
    fn submitting(&self) -> bool {
        self.err.is_none()
            && self.counts.submitted < self.stop.byte_limit
            && !self.stop.past_deadline
    }

    /// Hand the sink the blocks it refused as full, in order, until it refuses again.
    fn drain_backlog(&mut self) {
        while let Some((buf, len, tag)) = self.backlog.pop_front() {
            match self.sink.submit(buf, len, tag) {
                Ok(()) => {}
                Err((buf, e)) if e.kind == SinkErrorKind::Full => {
                    self.backlog.push_front((buf, len, tag));
                    break;
                }
                Err((_buf, e)) => {
                    self.err.get_or_insert(PipelineError::Sink(e));
                }
            }
        }
    }

    /// Keep the source full: a read per free pool block up to the queue depth and the byte
    /// limit, then one doorbell for the batch.
    fn fill_source(&mut self) {
        let limit = self.stop.byte_limit;
        let mut queued = 0;
        while self.src.in_flight() < self.qd && self.counts.submitted < limit {
            let Ok(buf) = self.pool.get() else {
                break; // all blocks are in flight: wait for completions
            };
            let seq = self.counts.seq;
            let (off, len) = block_range(seq, self.bs, self.cap);
            let len = len.min(limit - self.counts.submitted);
            let req = len.next_multiple_of(self.lbs) as usize;
            let tag = seq * self.bs;
            self.meta[(seq & self.mask) as usize] = Meta {
                seq,
                start: Instant::now(),
                len,
            };
            if let Err((buf, e)) = self.src.submit_read(buf, self.cfg.start + off, req, tag) {
                drop(buf);
                // A queue out of command slots (large blocks split into many commands) is
                // back-pressure while requests are in flight, an error when none are.
                if e.kind != BlockErrorKind::QueueFull || self.src.in_flight() == 0 {
                    self.err.get_or_insert(PipelineError::Source(e));
                }
                break;
            }
            self.counts.submitted += len;
            self.counts.seq += 1;
            queued += 1;
        }
        if queued > 0 {
            if let Err(e) = self.src.ring() {
                self.err.get_or_insert(PipelineError::Source(e));
            }
        }
    }

    /// Reap source completions and hand each block to the sink (or the backlog when the sink
    /// is full). Returns how many completed.
    fn reap_source(&mut self) -> usize {
        let c0 = rdtsc();
        let (bs, mask) = (self.bs, self.mask);
        let (meta, sink, backlog) = (&self.meta, &mut *self.sink, &mut self.backlog);
        let (err, delivered) = (&mut self.err, &mut self.counts.delivered);
        let mut on_done = |c: BlockCompletion| {
            let n = match c.result {
                Ok(n) => n as u64,
                Err(e) => {
                    err.get_or_insert(PipelineError::Source(e));
                    return;
                }
            };
            // The request was rounded up to the logical block; deliver the bytes asked for.
            // Fewer than that is a short read: an error, never a hole in the stream.
            let s = c.tag / bs;
            let md = meta[(s & mask) as usize];
            let want = if md.seq == s { md.len } else { bs };
            if n < want {
                err.get_or_insert(PipelineError::ShortRead {
                    offset: c.tag,
                    got: n,
                    want,
                });
                return;
            }
            let len = want as usize;
            *delivered += want;
            match sink.submit(c.buf, len, c.tag) {
                Ok(()) => {}
                Err((buf, e)) if e.kind == SinkErrorKind::Full => {
                    backlog.push_back((buf, len, c.tag))
                }
                Err((_buf, e)) => {
                    err.get_or_insert(PipelineError::Sink(e));
                }
            }
        };
        let n = match self.src.poll(self.qd, &mut on_done) {
            Ok(n) => n,
            Err(e) => {
                err.get_or_insert(PipelineError::Source(e));
                0
            }
        };
        if n > 0 {
            self.counts.poll_cycles += rdtsc().wrapping_sub(c0);
            self.counts.completions += n as u64;
        }
        n
    }

    /// Reap sink completions: each buffer drops back into the pool, each block's latency is
    /// recorded. Returns how many completed.
    fn reap_sink(&mut self) -> usize {
        let (bs, mask, meta) = (self.bs, self.mask, &self.meta);
        let (lat, blocks, err) = (&mut self.lat, &mut self.counts.blocks, &mut self.err);
        let polled = self.sink.poll(usize::MAX, &mut |buf, tag, r| {
            drop(buf);
            match r {
                Ok(()) => {
                    *blocks += 1;
                    let s = tag / bs;
                    let md = meta[(s & mask) as usize];
                    if md.seq == s {
                        lat.record(md.start.elapsed().as_nanos() as u64);
                    }
                }
                Err(e) => {
                    err.get_or_insert(PipelineError::Sink(e));
                }
            }
        });
        polled.unwrap_or_else(|e| {
            self.err.get_or_insert(PipelineError::Sink(e));
            0
        })
    }

    /// End of a round: stop on a fatal source error, a stall, when everything asked for has
    /// drained, or when the drain after an error has run out; move the progress bar.
    fn check_stop(&mut self, now: Option<Instant>, n: usize, m: usize) -> Next {
        // A fatal source error (device gone, controller fatal, queue wedged): nothing more can
        // complete, so waiting out the drain bound would only burn time. The queue keeps the
        // buffers still in flight (the device may yet write them); they never return to the pool.
        if self.err.as_ref().is_some_and(PipelineError::is_fatal) {
            return Next::Stop;
        }
        let in_flight = self.src.in_flight() + self.sink.in_flight() + self.backlog.len();
        if n > 0 || m > 0 {
            self.stop.progressed = true;
            self.show_progress();
        }
        if let Some(now) = now {
            if std::mem::take(&mut self.stop.progressed) {
                self.stop.last_progress = now;
            } else if in_flight > 0
                && now.duration_since(self.stop.last_progress) > self.cfg.stall_timeout
            {
                self.err.get_or_insert(PipelineError::Stalled {
                    secs: self.cfg.stall_timeout.as_secs(),
                    in_flight,
                });
                return Next::Stop; // the queues keep their buffers; their Drop waits for the device
            }
        }
        if !self.submitting() && in_flight == 0 {
            return Next::Stop;
        }
        if self.err.is_some() {
            let since = *self.stop.draining_since.get_or_insert_with(Instant::now);
            if since.elapsed() > self.stop.drain_bound {
                return Next::Stop;
            }
        }
        Next::Continue
    }

    /// Move the progress bar (every 16th round that completed something).
    fn show_progress(&self) {
        let Some(pb) = &self.progress else { return };
        if self.stop.round % 16 == 0 {
            pb.set_position(match self.cfg.limit {
                Limit::Bytes(_) => self.counts.delivered,
                Limit::Duration(_) => self.t0.elapsed().as_millis() as u64,
            });
        }
    }

    /// The report of the finished run, or its first error (a source error while a watched
    /// device has a removal request is reported as that request).
    fn finish(self) -> Result<PipelineReport, PipelineError> {
        let wall = self.t0.elapsed();
        let cpu = process_cpu_time().saturating_sub(self.cpu0);
        if let Some(pb) = self.progress {
            pb.finish_and_clear();
        }
        if let Some(e) = self.err {
            return Err(name_removal(e, self.devices));
        }
        let c = &self.counts;
        let mut r = PipelineReport::new(
            RunFigures {
                label: String::new(),
                mode: Mode::Direct,
                source: String::new(),
                sink: self.sink.name(),
                block_size: self.cfg.block_size,
                qd: self.qd,
                bytes: c.delivered,
                blocks: c.blocks,
                wall,
                cpu,
            },
            &self.lat,
        );
        if c.completions > 0 {
            r.cycles_per_completion = Some(c.poll_cycles as f64 / c.completions as f64);
        }
        Ok(r)
    }
}

/// A source error raised because the kernel asked for a watched device back (the queue pair
/// noticed the request before the engine's own check) is reported as that request.
fn name_removal(e: PipelineError, devices: &[Arc<PciDevice>]) -> PipelineError {
    if !matches!(e, PipelineError::Source(_)) {
        return e;
    }
    match devices.iter().find(|d| d.removal_requested()) {
        Some(d) => PipelineError::RemovalRequested {
            device: d.address(),
        },
        None => e,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Blocks of one pass tile the source exactly, and later passes repeat them.
        #[test]
        fn blocks_tile_the_source(cap in 1u64..(1 << 24), bs_k in 1u64..64) {
            let bs = bs_k * 4096;
            let per_pass = cap.div_ceil(bs);
            let mut next = 0;
            for s in 0..per_pass {
                let (off, len) = block_range(s, bs, cap);
                prop_assert_eq!(off, next);
                prop_assert!(len > 0 && len <= bs);
                next = off + len;
                prop_assert_eq!(block_range(s + per_pass, bs, cap), (off, len));
            }
            prop_assert_eq!(next, cap);
        }
    }
}
