//! A pipeline embedded in a program: stream an NVMe namespace through pool buffers into a
//! sink (a checksum), then check it against a second read of the same bytes.
//!
//! ```sh
//! cargo run --release --example pipeline_embedded -- 0000:00:04.0 [MiB]
//! ```

use ubdirect::dma::PoolConfig;
use ubdirect::nvme::{IoQueuePair, QueueOptions};
use ubdirect::pipeline::{
    compare, queue_checksum, run_direct, Limit, NullSink, PipelineConfig, PipelineSink,
};
use ubdirect::Env;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let addr = args
        .next()
        .ok_or("usage: pipeline_embedded <pci-address> [MiB]")?;
    let mib: u64 = args.next().map(|s| s.parse()).transpose()?.unwrap_or(16);
    let (block_size, qd) = (1 << 20, 8);
    let env = Env::builder()
        .nvme(addr.as_str())
        .pool(PoolConfig {
            block_size,
            block_count: 2 * qd,
        })
        .open()?;
    // The source: an NVMe queue pair (its first namespace); the sink: checksums, no copy.
    let mut src = IoQueuePair::new(env.controller(0), QueueOptions::default())?;
    let mut sink = NullSink::new(qd, true);
    let cfg = PipelineConfig {
        block_size,
        qd,
        limit: Limit::Bytes(mib << 20),
        verify: true,
        ..PipelineConfig::default()
    };
    let report = run_direct(&mut src, &mut sink, env.pool(), &cfg, "direct", &addr)?;
    println!(
        "{} bytes in {:.3} s: {:.2} GB/s",
        report.bytes, report.seconds, report.gb_per_s
    );
    // Verify: what the sink checksummed against a second read of the same bytes.
    let expected = queue_checksum(&mut src, env.pool(), cfg.start, report.bytes)?;
    let delivered = sink
        .delivered_checksum()
        .ok_or("the sink keeps no checksum")??;
    match compare("sink checksum vs a re-read", delivered, expected) {
        v if v.ok => {
            println!("verify OK");
            Ok(())
        }
        v => Err(format!(
            "verify failed: delivered {} expected {}",
            v.delivered, v.expected
        )
        .into()),
    }
}
