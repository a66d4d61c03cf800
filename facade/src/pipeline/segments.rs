//! Segment measurements (`segments`): the sink alone, fed from pool blocks that already hold
//! data (UB -> GPU copy rate without a source). The source alone is `run_direct` with a
//! `NullSink`; the completion-handling cost is in every direct run's report.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ubdirect_core::seams::SinkErrorKind;
use ubdirect_core::util::{rdtsc, LatencyHistogram};
use ubdirect_core::{UbBuf, UbPool};

use super::config::{Limit, Mode, PipelineConfig};
use super::cpu::process_cpu_time;
use super::error::PipelineError;
use super::report::{PipelineReport, RunFigures};
use super::sink_ext::PipelineSink;

/// Feed the sink from the pool's blocks (their current contents) until the limit; `qd` copies
/// in flight.
pub fn run_sink_only<S: PipelineSink + ?Sized>(
    sink: &mut S,
    pool: &Arc<UbPool>,
    cfg: &PipelineConfig,
    label: &str,
) -> Result<PipelineReport, PipelineError> {
    let mut free: Vec<UbBuf> = Vec::with_capacity(cfg.qd);
    for _ in 0..cfg.qd {
        match pool.get() {
            Ok(b) => free.push(b),
            Err(_) => break,
        }
    }
    if free.is_empty() {
        return Err(PipelineError::Pool(
            "no free pool block for the sink-only segment".into(),
        ));
    }
    let mut run = SinkOnly::new(free, cfg.block_size.min(pool.block_size()), cfg);
    let cpu0 = process_cpu_time();
    run.run(sink, cfg.stall_timeout)?;
    let figures = RunFigures {
        label: label.into(),
        mode: Mode::Direct,
        source: "pool (data already in UB)".into(),
        sink: sink.name(),
        block_size: run.bs,
        qd: run.qd,
        bytes: run.done_bytes.min(run.sent),
        blocks: run.blocks,
        wall: run.t0.elapsed(),
        cpu: process_cpu_time().saturating_sub(cpu0),
    };
    let mut r = PipelineReport::new(figures, &run.lat);
    if run.completions > 0 {
        r.cycles_per_completion = Some(run.poll_cycles as f64 / run.completions as f64);
    }
    Ok(r)
}

/// The sink-only loop's state.
struct SinkOnly {
    /// Pool blocks not at the sink.
    free: Vec<UbBuf>,
    bs: usize,
    qd: usize,
    mask: u64,
    /// (sequence number, submit time) per block, in a ring.
    starts: Vec<(u64, Instant)>,
    lat: LatencyHistogram,
    t0: Instant,
    limit: u64,
    deadline: Option<Instant>,
    sent: u64,
    done_bytes: u64,
    blocks: u64,
    seq: u64,
    poll_cycles: u64,
    completions: u64,
    err: Option<PipelineError>,
}

impl SinkOnly {
    fn new(free: Vec<UbBuf>, bs: usize, cfg: &PipelineConfig) -> Self {
        let qd = free.len();
        let ring = (qd * 4).next_power_of_two();
        let t0 = Instant::now();
        let (limit, deadline) = match cfg.limit {
            Limit::Bytes(b) => (b, None),
            Limit::Duration(d) => (u64::MAX, Some(t0 + d)),
        };
        SinkOnly {
            free,
            bs,
            qd,
            mask: ring as u64 - 1,
            starts: vec![(u64::MAX, t0); ring],
            lat: LatencyHistogram::default(),
            t0,
            limit,
            deadline,
            sent: 0,
            done_bytes: 0,
            blocks: 0,
            seq: 0,
            poll_cycles: 0,
            completions: 0,
            err: None,
        }
    }

    /// Submit and reap until the limit is sent and the sink is idle, or an error.
    fn run<S: PipelineSink + ?Sized>(
        &mut self,
        sink: &mut S,
        stall_timeout: Duration,
    ) -> Result<(), PipelineError> {
        let mut last = Instant::now();
        loop {
            let going = self.err.is_none()
                && self.sent < self.limit
                && self.deadline.is_none_or(|d| Instant::now() < d);
            if going {
                self.submit(sink);
            }
            let n = self.reap(sink)?;
            if n > 0 {
                last = Instant::now();
            } else if sink.in_flight() > 0 && last.elapsed() > stall_timeout {
                return Err(PipelineError::Stalled {
                    secs: stall_timeout.as_secs(),
                    in_flight: sink.in_flight(),
                });
            }
            if !going && sink.in_flight() == 0 {
                break;
            }
        }
        self.err.take().map_or(Ok(()), Err)
    }

    /// Hand the sink free blocks until it is full or the limit is sent.
    fn submit<S: PipelineSink + ?Sized>(&mut self, sink: &mut S) {
        while self.sent < self.limit {
            let Some(buf) = self.free.pop() else { break };
            let len = (self.bs as u64).min(self.limit - self.sent) as usize;
            let tag = self.seq * self.bs as u64;
            self.starts[(self.seq & self.mask) as usize] = (self.seq, Instant::now());
            match sink.submit(buf, len, tag) {
                Ok(()) => {
                    self.sent += len as u64;
                    self.seq += 1;
                }
                Err((buf, e)) => {
                    self.free.push(buf);
                    if e.kind != SinkErrorKind::Full {
                        self.err = Some(PipelineError::Sink(e));
                    }
                    break;
                }
            }
        }
    }

    /// Reap the sink's completions; each block goes back on the free list.
    fn reap<S: PipelineSink + ?Sized>(&mut self, sink: &mut S) -> Result<usize, PipelineError> {
        let c0 = rdtsc();
        let (bs, mask, starts) = (self.bs, self.mask, &self.starts);
        let (lat, free, err) = (&mut self.lat, &mut self.free, &mut self.err);
        let (done_bytes, blocks) = (&mut self.done_bytes, &mut self.blocks);
        let n = sink
            .poll(usize::MAX, &mut |buf, tag, r| {
                match r {
                    Ok(()) => {
                        let s = tag / bs as u64;
                        let (ss, st) = starts[(s & mask) as usize];
                        if ss == s {
                            lat.record(st.elapsed().as_nanos() as u64);
                        }
                        *done_bytes += (buf.len().min(bs)) as u64;
                        *blocks += 1;
                    }
                    Err(e) => *err = Some(PipelineError::Sink(e)),
                }
                free.push(buf);
            })
            .map_err(PipelineError::Sink)?;
        if n > 0 {
            self.poll_cycles += rdtsc().wrapping_sub(c0);
            self.completions += n as u64;
        }
        Ok(n)
    }
}
