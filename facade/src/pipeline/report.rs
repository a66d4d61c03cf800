//! The run summary: throughput, IOPS, CPU time per GB, per-block latency percentiles.

use std::fmt;
use std::time::Duration;

use ubdirect_core::util::LatencyHistogram;

use super::config::Mode;

/// Latency percentiles in microseconds.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct LatencySummary {
    /// Samples.
    pub count: u64,
    /// Mean.
    pub mean_us: f64,
    /// Median.
    pub p50_us: f64,
    /// 90th percentile.
    pub p90_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// 99.9th percentile.
    pub p999_us: f64,
    /// Maximum.
    pub max_us: f64,
}

impl From<&LatencyHistogram> for LatencySummary {
    fn from(h: &LatencyHistogram) -> Self {
        let us = |ns: u64| ns as f64 / 1000.0;
        LatencySummary {
            count: h.count(),
            mean_us: h.mean() / 1000.0,
            p50_us: us(h.quantile(0.50)),
            p90_us: us(h.quantile(0.90)),
            p99_us: us(h.quantile(0.99)),
            p999_us: us(h.quantile(0.999)),
            max_us: us(h.max()),
        }
    }
}

/// Verification outcome.
#[derive(Debug, Clone, serde::Serialize)]
pub struct VerifyResult {
    /// How the data was checked.
    pub method: String,
    /// Checksum of what arrived (hex).
    pub delivered: String,
    /// Checksum of the source (hex).
    pub expected: String,
    /// Whether they match.
    pub ok: bool,
}

/// One GPU's share of a striped run.
#[derive(Debug, Clone, serde::Serialize)]
pub struct GpuShare {
    /// Which GPU ("cuda:1 (NVIDIA H200)").
    pub gpu: String,
    /// Bytes it received.
    pub bytes: u64,
    /// Its GB/s over the run's wall time.
    pub gb_per_s: f64,
}

/// What a mapped-file run (`--io mapped`) did with the registered page cache.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct MappedInfo {
    /// Fraction of the file's pages in the page cache when the run chose its I/O.
    pub resident: f64,
    /// Windows mapped and registered by this run.
    pub windows_registered: u64,
    /// Window acquisitions served by an already registered window.
    pub windows_reused: u64,
    /// Seconds the registration threads spent mapping and registering (cuMemHostRegister) for
    /// this run, added over the threads; it overlaps the copies.
    pub register_s: f64,
    /// GB/s with the registration included: the run's wall time covers it (registration
    /// overlaps the copies), so this is the run's own rate; on a cold pass, what it costs.
    pub gb_per_s_with_register: f64,
    /// Bytes per copy.
    pub copy_size: u64,
    /// Bytes per registered window.
    pub window: u64,
    /// Threads registering windows ahead of the copies.
    pub register_threads: usize,
    /// Seconds the polling thread had room for a copy but its window was not registered yet.
    pub register_wait_s: f64,
}

/// One run's figures.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PipelineReport {
    /// What ran ("direct", "copy", "segment: ...").
    pub label: String,
    /// Direct or copy.
    pub mode: Mode,
    /// Source description.
    pub source: String,
    /// Sink description.
    pub sink: String,
    /// Block size in bytes.
    pub block_size: usize,
    /// Queue depth.
    pub qd: usize,
    /// Bytes delivered to the sink.
    pub bytes: u64,
    /// Blocks delivered.
    pub blocks: u64,
    /// Wall time in seconds.
    pub seconds: f64,
    /// GB/s (10^9 bytes per second).
    pub gb_per_s: f64,
    /// Blocks per second.
    pub iops: f64,
    /// Process CPU seconds (all threads, kernel workers included) per GB moved.
    pub cpu_s_per_gb: f64,
    /// Cores the run used: process CPU seconds (every thread, io-wq and driver threads
    /// included) per wall-clock second.
    pub cores: f64,
    /// Per-GPU figures when the sink stripes over several GPUs.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<GpuShare>,
    /// Registered-mapping figures of a `--io mapped` run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mapped: Option<MappedInfo>,
    /// Per-block latency, source submit to sink completion.
    pub latency: LatencySummary,
    /// Cycles (TSC) spent reaping one source completion and handing it to the sink.
    pub cycles_per_completion: Option<f64>,
    /// Verification, when asked for.
    pub verify: Option<VerifyResult>,
}

/// The raw figures of one run, from which [`PipelineReport::new`] derives the rates.
#[derive(Debug, Clone)]
pub struct RunFigures {
    /// What ran ("pipeline", "segment: ...").
    pub label: String,
    /// Direct or copy.
    pub mode: Mode,
    /// Source description.
    pub source: String,
    /// Sink description.
    pub sink: String,
    /// Block size in bytes.
    pub block_size: usize,
    /// Queue depth.
    pub qd: usize,
    /// Bytes delivered to the sink.
    pub bytes: u64,
    /// Blocks delivered.
    pub blocks: u64,
    /// Wall time of the run.
    pub wall: Duration,
    /// Process CPU time the run took.
    pub cpu: Duration,
}

impl PipelineReport {
    /// The report of a run: `f`'s counts with the derived rates, and `lat`'s percentiles.
    pub fn new(f: RunFigures, lat: &LatencyHistogram) -> PipelineReport {
        let s = f.wall.as_secs_f64().max(1e-9);
        let gb = f.bytes as f64 / 1e9;
        let cpu = f.cpu.as_secs_f64();
        PipelineReport {
            label: f.label,
            mode: f.mode,
            source: f.source,
            sink: f.sink,
            block_size: f.block_size,
            qd: f.qd,
            bytes: f.bytes,
            blocks: f.blocks,
            seconds: f.wall.as_secs_f64(),
            gb_per_s: gb / s,
            iops: f.blocks as f64 / s,
            cpu_s_per_gb: if gb > 0.0 { cpu / gb } else { 0.0 },
            cores: cpu / s,
            gpus: Vec::new(),
            mapped: None,
            latency: lat.into(),
            cycles_per_completion: None,
            verify: None,
        }
    }
}

impl fmt::Display for PipelineReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{}: {} -> {} ({:?}, block {} KiB, qd {})",
            self.label,
            self.source,
            self.sink,
            self.mode,
            self.block_size >> 10,
            self.qd
        )?;
        writeln!(
            f,
            "  {:.3} GB in {:.3} s: {:.2} GB/s, {:.0} blocks/s, {:.3} CPU-s/GB, {:.2} cores",
            self.bytes as f64 / 1e9,
            self.seconds,
            self.gb_per_s,
            self.iops,
            self.cpu_s_per_gb,
            self.cores
        )?;
        for g in &self.gpus {
            writeln!(
                f,
                "  {}: {:.3} GB, {:.2} GB/s",
                g.gpu,
                g.bytes as f64 / 1e9,
                g.gb_per_s
            )?;
        }
        if let Some(m) = &self.mapped {
            writeln!(
                f,
                "  mapped page cache ({:.0}% resident): {} window(s) of {} registered in {:.3} s by {} thread(s) beside the copies ({:.3} s waited for), {} reuse(s); copies of {}",
                m.resident * 100.0,
                m.windows_registered,
                size(m.window),
                m.register_s,
                m.register_threads,
                m.register_wait_s,
                m.windows_reused,
                size(m.copy_size)
            )?;
        }
        let l = &self.latency;
        write!(
            f,
            "  block latency us: mean {:.0} p50 {:.0} p90 {:.0} p99 {:.0} p99.9 {:.0} max {:.0}",
            l.mean_us, l.p50_us, l.p90_us, l.p99_us, l.p999_us, l.max_us
        )?;
        if let Some(c) = self.cycles_per_completion {
            write!(f, "\n  completion handling: {c:.0} cycles per completion")?;
        }
        if let Some(v) = &self.verify {
            write!(
                f,
                "\n  verify ({}): {} (delivered {} expected {})",
                v.method,
                if v.ok { "OK" } else { "MISMATCH" },
                v.delivered,
                v.expected
            )?;
        }
        Ok(())
    }
}

/// Bytes as MiB when whole, else KiB.
fn size(b: u64) -> String {
    if b % (1 << 20) == 0 {
        format!("{} MiB", b >> 20)
    } else {
        format!("{} KiB", b >> 10)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cores_are_cpu_seconds_per_wall_second_in_text_and_json() {
        let mut lat = LatencyHistogram::default();
        lat.record(1000);
        let r = PipelineReport::new(
            RunFigures {
                label: "t".into(),
                mode: Mode::Direct,
                source: "src".into(),
                sink: "sink".into(),
                block_size: 4096,
                qd: 1,
                bytes: 2_000_000_000,
                blocks: 10,
                wall: Duration::from_secs(2),
                cpu: Duration::from_millis(500),
            },
            &lat,
        );
        assert!((r.cores - 0.25).abs() < 1e-9);
        assert!((r.cpu_s_per_gb - 0.25).abs() < 1e-9);
        assert!(r.to_string().contains("0.250 CPU-s/GB, 0.25 cores"), "{r}");
        let j = serde_json::to_value(&r).unwrap();
        assert_eq!(j["cores"].as_f64(), Some(0.25));
        assert!(j.get("gpus").is_none() && j.get("mapped").is_none());
    }
}
