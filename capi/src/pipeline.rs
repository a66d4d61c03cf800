//! `ubd_pipeline_run`: the pipeline (an NVMe namespace -> pool buffers -> a sink) as one call
//! with a configuration struct, on the calling thread.

use std::ffi::c_int;

use ubdirect::nvme::{IoQueuePair, QueueOptions};
use ubdirect::pipeline::{
    compare, queue_checksum, run_direct, Limit, NullSink, PipelineConfig, PipelineError,
    PipelineSink,
};

use crate::ctrlr::{ctrlr_ref, ubd_ctrlr};
use crate::env::{env_ref, ubd_env};
use crate::error::{guard, Error};

/// What `ubd_pipeline_run` streams; fill with `ubd_pipeline_opts_init`.
#[repr(C)]
pub struct ubd_pipeline_opts {
    /// The source namespace (0, the default: the first active one).
    pub nsid: u32,
    /// Requests kept in flight (default 8; at most the pool's buffers).
    pub qd: u32,
    /// Bytes per request and per buffer (default 1 MiB; at most the pool's block size, a
    /// multiple of the namespace's block size).
    pub block_size: usize,
    /// Bytes to move (default 64 MiB); the stream wraps around the namespace when larger.
    pub bytes: u64,
    /// Byte offset of the namespace the stream starts at (default 0, block aligned).
    pub start: u64,
    /// 1: checksum what arrives and compare it with a second read of the same bytes (a
    /// mismatch fails the call with -EIO); 0 (default): no check.
    pub verify: u32,
}

/// What a run did.
#[repr(C)]
pub struct ubd_pipeline_report {
    /// Bytes delivered to the sink.
    pub bytes: u64,
    /// Wall time of the run in seconds.
    pub seconds: f64,
    /// Throughput in GB/s (10^9 bytes per second).
    pub gb_per_s: f64,
    /// Requests per second.
    pub iops: f64,
    /// CPU seconds the process spent per GB moved.
    pub cpu_s_per_gb: f64,
    /// Median request latency in microseconds.
    pub p50_us: f64,
    /// 99th percentile request latency in microseconds.
    pub p99_us: f64,
    /// 1 when the data was verified equal to the source, 0 when not checked.
    pub verified: u32,
}

/// Fill `opts` with the defaults. 0, or -EINVAL for NULL.
#[no_mangle]
pub extern "C" fn ubd_pipeline_opts_init(opts: *mut ubd_pipeline_opts) -> c_int {
    guard(|| {
        // SAFETY: the caller passes a writable ubd_pipeline_opts or NULL (checked).
        let o = unsafe { opts.as_mut() }.ok_or_else(|| Error::null("opts"))?;
        *o = ubd_pipeline_opts {
            nsid: 0,
            qd: 8,
            block_size: 1 << 20,
            bytes: 64 << 20,
            start: 0,
            verify: 0,
        };
        Ok(0)
    })
}

impl From<PipelineError> for Error {
    fn from(e: PipelineError) -> Error {
        let errno = match &e {
            PipelineError::Config(_) => libc::EINVAL,
            PipelineError::Pool(_) => libc::ENOMEM,
            PipelineError::Stalled { .. } => libc::ETIMEDOUT,
            _ => libc::EIO,
        };
        Error::new(errno, format!("pipeline: {e}"))
    }
}

/// Stream `opts->bytes` from a namespace of `ctrlr` through `env`'s pool buffers into a sink
/// that consumes them in place (checksumming them when `opts->verify`), on the calling thread
/// with a queue pair of its own; `*out` (may be NULL) gets the figures. Returns 0, or a
/// negative errno (-EINVAL for NULL arguments or settings out of range, -EIO for a device
/// error or a verify mismatch, -ETIMEDOUT when the device stalls); `ubd_last_error_message`
/// says why. Needs `opts->qd` free pool buffers. Any thread; blocks until the run ends.
#[no_mangle]
pub extern "C" fn ubd_pipeline_run(
    env: *const ubd_env,
    ctrlr: *const ubd_ctrlr,
    opts: *const ubd_pipeline_opts,
    out: *mut ubd_pipeline_report,
) -> c_int {
    guard(|| {
        let env = env_ref(env)?;
        let c = ctrlr_ref(ctrlr)?;
        // SAFETY: the caller passes a readable ubd_pipeline_opts or NULL (checked).
        let o = unsafe { opts.as_ref() }.ok_or_else(|| Error::null("opts"))?;
        if o.qd == 0 || o.block_size == 0 {
            return Err(Error::new(
                libc::EINVAL,
                format!(
                    "pipeline: qd {} and block_size {}: both must be 1 or more",
                    o.qd, o.block_size
                ),
            ));
        }
        let qopts = QueueOptions {
            depth: o.qd as usize,
            nsid: (o.nsid != 0).then_some(o.nsid),
            ..QueueOptions::default()
        };
        let mut src = IoQueuePair::new(&c.ctrl, qopts)?;
        let qd = o.qd as usize;
        let mut sink = NullSink::new(qd, o.verify != 0);
        let cfg = PipelineConfig {
            block_size: o.block_size,
            qd,
            limit: Limit::Bytes(o.bytes),
            verify: o.verify != 0,
            start: o.start,
            ..PipelineConfig::default()
        };
        let name = c.ctrl.device().address().to_string();
        let pool = env.env.pool();
        let report = run_direct(&mut src, &mut sink, pool, &cfg, "direct", &name)?;
        let mut verified = 0;
        if o.verify != 0 {
            let expected = queue_checksum(&mut src, pool, cfg.start, report.bytes)?;
            let delivered = sink
                .delivered_checksum()
                .ok_or_else(|| Error::new(libc::EIO, "pipeline: the sink kept no checksum"))?
                .map_err(|e| Error::new(libc::EIO, format!("pipeline: verify: {e}")))?;
            let v = compare("sink checksum vs a re-read", delivered, expected);
            if !v.ok {
                return Err(Error::new(
                    libc::EIO,
                    format!(
                        "pipeline: verify failed: delivered {} expected {}",
                        v.delivered, v.expected
                    ),
                ));
            }
            verified = 1;
        }
        // SAFETY: the caller passes a writable ubd_pipeline_report or NULL.
        if let Some(r) = unsafe { out.as_mut() } {
            *r = ubd_pipeline_report {
                bytes: report.bytes,
                seconds: report.seconds,
                gb_per_s: report.gb_per_s,
                iops: report.iops,
                cpu_s_per_gb: report.cpu_s_per_gb,
                p50_us: report.latency.p50_us,
                p99_us: report.latency.p99_us,
                verified,
            };
        }
        Ok(0)
    })
}
