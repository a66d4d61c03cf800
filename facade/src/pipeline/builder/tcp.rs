//! A remote namespace over NVMe/TCP as the source, through the same block-queue seam and engine
//! as a local one. The socket receives straight into the pool's blocks (carved from the BAR for
//! a BAR sink).

use std::sync::Arc;

use ubdirect_core::seams::BlockQueue;
use ubdirect_core::PciDevice;
use ubdirect_nvme::transport::tcp::addr::TcpTarget;
use ubdirect_nvme::transport::tcp::block::TcpBlockQueue;
use ubdirect_nvme::transport::tcp::ctrl::TcpController;
use ubdirect_nvme::transport::tcp::host::HostIdentity;

use super::super::config::PipelineConfig;
use super::super::engine::run_direct_watching;
use super::super::verify::queue_checksum;
use super::error::PipelineRunError;
use super::run::Run;
use super::sinks::add_verify;

/// Stream namespace `nsid` from the NVMe/TCP target at `addr`.
pub(super) fn run(
    run: &mut Run<'_>,
    addr: &str,
    nsid: Option<u32>,
) -> Result<(), PipelineRunError> {
    let s = run.s;
    let pool = run.dev.pool(s.block_size)?;
    let target: TcpTarget = addr.parse().map_err(PipelineRunError::open)?;
    let nsid = nsid.or(target.nsid).unwrap_or(1);
    let host = s.host.clone().unwrap_or_else(HostIdentity::system);
    let ctrl = TcpController::connect(&target, &host, &s.tcp).map_err(PipelineRunError::open)?;
    let ns = ctrl.namespace(nsid).map_err(PipelineRunError::open)?;
    let depth = (s.qd * 2).clamp(2, 1024);
    let q = ctrl.io_queue(depth).map_err(PipelineRunError::open)?;
    // CAP.MQES / MAXCMD may bound the queue below what was asked.
    let depth = q.free_slots();
    let mut q = TcpBlockQueue::new(q, &ns, depth, pool.block_size());
    let cap = q.capacity();
    let cfg = PipelineConfig {
        limit: run.limit(cap),
        ..run.config()
    };
    let name = format!("{addr} (nvmf-tcp, nsid {nsid})");
    let mut sink = run.make_sink(&pool, cap)?;
    let watched: Vec<Arc<PciDevice>> = run.dev.bar_dev.iter().cloned().collect();
    for d in &watched {
        d.enable_removal_notice()?;
    }
    let mut r = run_direct_watching(
        &mut q,
        sink.as_mut(),
        &pool,
        &cfg,
        "pipeline",
        &name,
        &watched,
    )?;
    if s.verify {
        // A second pass over the connection at QD1 into a host buffer is the reference.
        let bs = cfg.block_size.min(q.max_transfer());
        let ref_pool = run.dev.host_pool(bs, 1, false)?;
        let expected = queue_checksum(&mut q, &ref_pool, s.start, r.bytes)?;
        let method = "sink checksum vs a QD1 re-read over NVMe/TCP";
        add_verify(&mut r, sink.as_mut(), expected, method)?;
    }
    run.hostchecks(sink.as_ref());
    run.reports.push(r);
    Ok(())
}
