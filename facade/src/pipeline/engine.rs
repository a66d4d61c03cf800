//! The direct pipeline loop: one polling thread keeps the source queue full to `qd` with pool
//! blocks, hands each completed block to the sink, and each sink-completed block back to the
//! pool (and so to the source). Nothing on this path allocates; doorbells are batched (one
//! ring per round of submissions).

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
use super::report::PipelineReport;
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
    let cap = src.capacity();
    let lbs = u64::from(src.block_size().max(1));
    cfg.validate(cap, lbs as u32)
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
    let bs = cfg.block_size as u64;
    let qd = cfg.qd.min(src.depth()).max(1);
    let pool_blocks = pool.block_count().max(1);
    let ring = (pool_blocks * 4).next_power_of_two();
    let mask = ring as u64 - 1;
    let t0 = Instant::now();
    let mut meta = vec![
        Meta {
            seq: u64::MAX,
            start: t0,
            len: 0
        };
        ring
    ];
    let mut backlog: VecDeque<(UbBuf, usize, u64)> = VecDeque::with_capacity(pool_blocks);
    let mut lat = LatencyHistogram::default();
    let progress = make_progress(cfg);

    let (byte_limit, deadline) = match cfg.limit {
        Limit::Bytes(b) => (b, None),
        Limit::Duration(d) => (u64::MAX, Some(t0 + d)),
    };
    let cpu0 = process_cpu_time();
    let mut seq = 0u64;
    let mut submitted_bytes = 0u64;
    let mut delivered_bytes = 0u64;
    let mut blocks = 0u64;
    let mut poll_cycles = 0u64;
    let mut completions = 0u64;
    let mut err: Option<PipelineError> = None;
    let mut last_progress = Instant::now();
    let mut iter = 0u64;
    let mut draining_since: Option<Instant> = None;
    let mut drain_bound = ERROR_DRAIN;
    let mut last_removal_check = t0;
    let mut past_deadline = false;
    let mut progressed = false;

    loop {
        iter += 1;
        // The clock is read once every 64 rounds (deadline, stall detection), not per round.
        let now = if iter % 64 == 0 {
            Some(Instant::now())
        } else {
            None
        };
        if let (Some(d), Some(n)) = (deadline, now) {
            past_deadline |= n >= d;
        }
        if let Some(n) = now {
            if !devices.is_empty() && n.duration_since(last_removal_check) >= REMOVAL_CHECK {
                last_removal_check = n;
                if let Some(d) = devices.iter().find(|d| d.removal_requested()) {
                    drain_bound = REMOVAL_DRAIN;
                    err.get_or_insert(PipelineError::RemovalRequested {
                        device: d.address(),
                    });
                }
            }
        }
        let submitting = err.is_none() && submitted_bytes < byte_limit && !past_deadline;

        // 1. Sink backlog first (buffers the sink refused as full).
        while let Some((buf, len, tag)) = backlog.pop_front() {
            match sink.submit(buf, len, tag) {
                Ok(()) => {}
                Err((buf, e)) if e.kind == SinkErrorKind::Full => {
                    backlog.push_front((buf, len, tag));
                    break;
                }
                Err((_buf, e)) => {
                    err.get_or_insert(PipelineError::Sink(e));
                }
            }
        }

        // 2. Keep the source full.
        if submitting {
            let mut queued = 0;
            while src.in_flight() < qd && submitted_bytes < byte_limit {
                let buf = match pool.get() {
                    Ok(b) => b,
                    Err(_) => break, // all blocks are in flight: wait for completions
                };
                let (off, len) = block_range(seq, bs, cap);
                let len = len.min(byte_limit - submitted_bytes);
                let req = len.next_multiple_of(lbs) as usize;
                let tag = seq * bs;
                meta[(seq & mask) as usize] = Meta {
                    seq,
                    start: Instant::now(),
                    len,
                };
                if let Err((buf, e)) = src.submit_read(buf, cfg.start + off, req, tag) {
                    drop(buf);
                    // A queue out of command slots (large blocks split into many commands) is
                    // back-pressure while requests are in flight, an error when none are.
                    if e.kind != BlockErrorKind::QueueFull || src.in_flight() == 0 {
                        err.get_or_insert(PipelineError::Source(e));
                    }
                    break;
                }
                submitted_bytes += len;
                seq += 1;
                queued += 1;
            }
            if queued > 0 {
                if let Err(e) = src.ring() {
                    err.get_or_insert(PipelineError::Source(e));
                }
            }
        }

        // 3. Source completions go to the sink.
        let c0 = rdtsc();
        let n = {
            let mut on_done = |c: BlockCompletion| {
                let n = match c.result {
                    Ok(n) => n,
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
                if (n as u64) < want {
                    err.get_or_insert(PipelineError::ShortRead {
                        offset: c.tag,
                        got: n as u64,
                        want,
                    });
                    return;
                }
                let len = want as usize;
                delivered_bytes += len as u64;
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
            match src.poll(qd, &mut on_done) {
                Ok(n) => n,
                Err(e) => {
                    err.get_or_insert(PipelineError::Source(e));
                    0
                }
            }
        };
        if n > 0 {
            poll_cycles += rdtsc().wrapping_sub(c0);
            completions += n as u64;
        }

        // 4. Sink completions: the buffer drops back into the pool.
        let m = match sink.poll(usize::MAX, &mut |buf, tag, r| {
            drop(buf);
            match r {
                Ok(()) => {
                    blocks += 1;
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
        }) {
            Ok(m) => m,
            Err(e) => {
                err.get_or_insert(PipelineError::Sink(e));
                0
            }
        };

        // A fatal source error (device gone, controller fatal, queue wedged): nothing more can
        // complete, so waiting out the drain bound would only burn time. The queue keeps the
        // buffers still in flight (the device may yet write them); they never return to the pool.
        if err.as_ref().is_some_and(PipelineError::is_fatal) {
            break;
        }
        let in_flight = src.in_flight() + sink.in_flight() + backlog.len();
        if n > 0 || m > 0 {
            progressed = true;
            if let Some(pb) = &progress {
                if iter % 16 == 0 {
                    pb.set_position(match cfg.limit {
                        Limit::Bytes(_) => delivered_bytes,
                        Limit::Duration(_) => t0.elapsed().as_millis() as u64,
                    });
                }
            }
        }
        if let Some(now) = now {
            if std::mem::take(&mut progressed) {
                last_progress = now;
            } else if in_flight > 0 && now.duration_since(last_progress) > cfg.stall_timeout {
                err.get_or_insert(PipelineError::Stalled {
                    secs: cfg.stall_timeout.as_secs(),
                    in_flight,
                });
                break; // the queues keep their buffers; their Drop waits for the device
            }
        }
        let finished = !(err.is_none() && submitted_bytes < byte_limit && !past_deadline);
        if finished && in_flight == 0 {
            break;
        }
        if err.is_some() {
            let since = *draining_since.get_or_insert_with(Instant::now);
            if since.elapsed() > drain_bound {
                break;
            }
        }
        if n == 0 && m == 0 {
            std::hint::spin_loop();
        }
    }
    let wall = t0.elapsed();
    let cpu = process_cpu_time().saturating_sub(cpu0);
    if let Some(pb) = progress {
        pb.finish_and_clear();
    }
    if let Some(e) = err {
        return Err(name_removal(e, devices));
    }
    let mut r = PipelineReport::new(
        label,
        Mode::Direct,
        source_name.into(),
        sink.name(),
        cfg.block_size,
        qd,
        delivered_bytes,
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
