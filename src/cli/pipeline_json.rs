//! `pipeline --json`: the runs in the shared schema's units (bytes/s, ns, `queue_depth`).

use serde::Serialize;
use ubdirect::pipeline::{MappedInfo, Mode, PipelineReport, VerifyResult};

use super::json::LatencyNs;

/// One run (a segment, or the pipeline itself; the last run is the pipeline).
#[derive(Debug, Serialize)]
pub struct RunJson<'a> {
    /// What ran ("pipeline", "segment: source -> UB (sink null)", ...).
    pub label: &'a str,
    /// direct or copy.
    pub mode: Mode,
    /// The source, as a person reads it.
    pub source: &'a str,
    /// The sink.
    pub sink: &'a str,
    /// Bytes per block.
    pub block_size: usize,
    /// Source requests kept in flight.
    pub queue_depth: usize,
    /// Bytes delivered to the sink.
    pub bytes: u64,
    /// Blocks delivered.
    pub blocks: u64,
    /// Wall time.
    pub seconds: f64,
    /// Bytes per second delivered.
    pub bytes_per_s: f64,
    /// Blocks per second.
    pub iops: f64,
    /// Process CPU time (all threads) per byte moved, in ns (= CPU seconds per GB).
    pub cpu_ns_per_byte: f64,
    /// Cores the run kept busy: process CPU seconds (all threads, io-wq and driver threads
    /// included) per wall second.
    pub cores_used: f64,
    /// Per-GPU shares of a striped run (`--sink cuda:0,1`); empty otherwise.
    pub gpus: Vec<GpuJson<'a>>,
    /// What a mapped-file run (`--io mapped`) did with the registered page cache, or null.
    pub mapped: Option<&'a MappedInfo>,
    /// Per-block latency, source submit to sink completion.
    pub latency_ns: LatencyNs,
    /// TSC cycles to reap one source completion and hand it to the sink.
    pub cycles_per_completion: Option<f64>,
    /// The verification, when asked for.
    pub verify: Option<&'a VerifyResult>,
}

/// One GPU's share of a striped run.
#[derive(Debug, Serialize)]
pub struct GpuJson<'a> {
    /// Which GPU ("cuda:1 (NVIDIA H200)").
    pub gpu: &'a str,
    /// Bytes it received.
    pub bytes: u64,
    /// Its bytes per second over the run's wall time.
    pub bytes_per_s: f64,
}

impl<'a> From<&'a PipelineReport> for RunJson<'a> {
    fn from(r: &'a PipelineReport) -> Self {
        let l = &r.latency;
        RunJson {
            label: &r.label,
            mode: r.mode,
            source: &r.source,
            sink: &r.sink,
            block_size: r.block_size,
            queue_depth: r.qd,
            bytes: r.bytes,
            blocks: r.blocks,
            seconds: r.seconds,
            bytes_per_s: r.gb_per_s * 1e9,
            iops: r.iops,
            cpu_ns_per_byte: r.cpu_s_per_gb,
            cores_used: r.cores,
            gpus: r
                .gpus
                .iter()
                .map(|g| GpuJson {
                    gpu: &g.gpu,
                    bytes: g.bytes,
                    bytes_per_s: g.gb_per_s * 1e9,
                })
                .collect(),
            mapped: r.mapped.as_ref(),
            latency_ns: LatencyNs {
                count: Some(l.count),
                mean: l.mean_us * 1e3,
                min: None,
                p50: l.p50_us * 1e3,
                p90: Some(l.p90_us * 1e3),
                p99: l.p99_us * 1e3,
                p999: l.p999_us * 1e3,
                p9999: None,
                stddev: None,
                max: l.max_us * 1e3,
            },
            cycles_per_completion: r.cycles_per_completion,
            verify: r.verify.as_ref(),
        }
    }
}

/// The `pipeline` document's own fields.
#[derive(Serialize)]
struct Body<'a> {
    runs: Vec<RunJson<'a>>,
}

fn body(reports: &[PipelineReport]) -> Body<'_> {
    Body {
        runs: reports.iter().map(RunJson::from).collect(),
    }
}

/// The document for `reports`.
#[cfg(test)]
pub fn document(reports: &[PipelineReport]) -> serde_json::Result<serde_json::Value> {
    super::json::document("pipeline", body(reports))
}

/// Print the document for `reports` on stdout.
pub fn print(reports: &[PipelineReport]) -> serde_json::Result<()> {
    super::json::print("pipeline", body(reports))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use ubdirect::pipeline::LatencyHistogram;

    #[test]
    fn pipeline_json_is_in_the_shared_units_and_validates() {
        let mut h = LatencyHistogram::new();
        h.record(2_000);
        let mut r = PipelineReport::new(
            ubdirect::pipeline::RunFigures {
                label: "pipeline".into(),
                mode: Mode::Direct,
                source: "file:/x".into(),
                sink: "null".into(),
                block_size: 1 << 20,
                qd: 8,
                bytes: 2_000_000_000,
                blocks: 1907,
                wall: Duration::from_secs(1),
                cpu: Duration::from_millis(500),
            },
            &h,
        );
        r.verify = Some(ubdirect::pipeline::compare("re-read", 7, 7));
        let v = document(&[r]).unwrap();
        crate::cli::json::validate(&v).unwrap();
        let run = &v["runs"][0];
        assert_eq!(run["queue_depth"], 8);
        assert!(
            (run["bytes_per_s"].as_f64().unwrap() - 2e9).abs() < 1.0,
            "{run}"
        );
        assert!(run.get("qd").is_none() && run.get("gb_per_s").is_none());
        assert_eq!(run["verify"]["ok"], true);
    }
}
