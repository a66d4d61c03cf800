//! Segment measurements (`--segments`): the sink alone, fed from pool blocks that already hold
//! data (UB -> GPU copy rate without a source). The source alone is `run_direct` with a
//! `NullSink`; the completion-handling cost is in every direct run's report.

use std::sync::Arc;
use std::time::Instant;

use ubdirect_core::seams::SinkErrorKind;
use ubdirect_core::util::{rdtsc, LatencyHistogram};
use ubdirect_core::{UbBuf, UbPool};

use super::config::{Limit, Mode, PipelineConfig};
use super::cpu::process_cpu_time;
use super::error::PipelineError;
use super::report::PipelineReport;
use super::sink_ext::PipelineSink;

/// Feed the sink from the pool's blocks (their current contents) until the limit; `qd` copies
/// in flight.
pub fn run_sink_only<S: PipelineSink + ?Sized>(
    sink: &mut S,
    pool: &Arc<UbPool>,
    cfg: &PipelineConfig,
    label: &str,
) -> Result<PipelineReport, PipelineError> {
    let bs = cfg.block_size.min(pool.block_size());
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
    let qd = free.len();
    let ring = (qd * 4).next_power_of_two();
    let mask = ring as u64 - 1;
    let t0 = Instant::now();
    let mut starts = vec![(u64::MAX, t0); ring];
    let mut lat = LatencyHistogram::default();
    let (limit, deadline) = match cfg.limit {
        Limit::Bytes(b) => (b, None),
        Limit::Duration(d) => (u64::MAX, Some(t0 + d)),
    };
    let cpu0 = process_cpu_time();
    let (mut sent, mut done_bytes, mut blocks, mut seq) = (0u64, 0u64, 0u64, 0u64);
    let (mut poll_cycles, mut completions) = (0u64, 0u64);
    let mut err = None;
    let mut last = Instant::now();
    loop {
        let going = err.is_none() && sent < limit && deadline.is_none_or(|d| Instant::now() < d);
        while going && sent < limit {
            let Some(buf) = free.pop() else { break };
            let len = (bs as u64).min(limit - sent) as usize;
            let tag = seq * bs as u64;
            starts[(seq & mask) as usize] = (seq, Instant::now());
            match sink.submit(buf, len, tag) {
                Ok(()) => {
                    sent += len as u64;
                    seq += 1;
                }
                Err((buf, e)) => {
                    free.push(buf);
                    if e.kind != SinkErrorKind::Full {
                        err = Some(PipelineError::Sink(e));
                    }
                    break;
                }
            }
        }
        let c0 = rdtsc();
        let n = sink
            .poll(usize::MAX, &mut |buf, tag, r| {
                match r {
                    Ok(()) => {
                        let s = tag / bs as u64;
                        let (ss, st) = starts[(s & mask) as usize];
                        if ss == s {
                            lat.record(st.elapsed().as_nanos() as u64);
                        }
                        done_bytes += (buf.len().min(bs)) as u64;
                        blocks += 1;
                    }
                    Err(e) => err = Some(PipelineError::Sink(e)),
                }
                free.push(buf);
            })
            .map_err(PipelineError::Sink)?;
        if n > 0 {
            poll_cycles += rdtsc().wrapping_sub(c0);
            completions += n as u64;
            last = Instant::now();
        } else if sink.in_flight() > 0 && last.elapsed() > cfg.stall_timeout {
            return Err(PipelineError::Stalled {
                secs: cfg.stall_timeout.as_secs(),
                in_flight: sink.in_flight(),
            });
        }
        if !going && sink.in_flight() == 0 {
            break;
        }
    }
    if let Some(e) = err {
        return Err(e);
    }
    let wall = t0.elapsed();
    let cpu = process_cpu_time().saturating_sub(cpu0);
    let mut r = PipelineReport::new(
        label,
        Mode::Direct,
        "pool (data already in UB)".into(),
        sink.name(),
        bs,
        qd,
        done_bytes.min(sent),
        blocks,
        wall,
        cpu,
        &lat,
    );
    if completions > 0 {
        r.cycles_per_completion = Some(poll_cycles as f64 / completions as f64);
    }
    Ok(r)
}
