//! `pipeline --source nvmf-tcp://ADDR:PORT/SUBNQN[/NSID]`: a remote namespace over NVMe/TCP
//! through the same block-queue seam and engine as a local one. The socket receives straight
//! into the pipeline's pool blocks (carved from the BAR for `--sink bar:`).

use std::sync::Arc;

use ubdirect::pipeline::{queue_checksum, run_direct_watching, PipelineConfig, PipelineReport};
use ubdirect_core::seams::BlockQueue;
use ubdirect_core::{PciDevice, UbPool, UbRegion, UbRegistry};
use ubdirect_nvme::transport::tcp::addr::TcpTarget;
use ubdirect_nvme::transport::tcp::block::TcpBlockQueue;
use ubdirect_nvme::transport::tcp::ctrl::{TcpController, TcpOptions};

use super::{add_verify, host_pool, limit, make_sink, print_hostchecks, Args, BoxErr};

/// Run the pipeline from the NVMe/TCP target at `addr`.
#[allow(clippy::too_many_arguments)]
pub(super) fn run(
    args: &Args,
    addr: &str,
    registry: &Arc<UbRegistry>,
    pool: &Arc<UbPool>,
    bar: Option<&Arc<UbRegion>>,
    bar_dev: Option<&Arc<PciDevice>>,
    cfg: PipelineConfig,
    numa: &mut Option<u32>,
) -> Result<PipelineReport, BoxErr> {
    let target: TcpTarget = addr.parse()?;
    let nsid = super::super::namespace::merge(args.ns, target.nsid)?.unwrap_or(1);
    let host = super::super::nvmf::host_identity();
    let ctrl = TcpController::connect(
        &target,
        &host,
        &super::super::nvmf::with_auth(TcpOptions::default())?,
    )?;
    let ns = ctrl.namespace(nsid)?;
    let depth = (args.qd * 2).clamp(2, 1024);
    let q = ctrl.io_queue(depth)?;
    // CAP.MQES / MAXCMD may bound the queue below what was asked.
    let depth = q.free_slots();
    let mut q = TcpBlockQueue::new(q, &ns, depth, pool.block_size());
    let cap = q.capacity();
    let cfg = PipelineConfig {
        limit: limit(args, cap)?,
        ..cfg
    };
    let name = format!("{addr} (nvmf-tcp, nsid {nsid})");
    let mut sink = make_sink(args, pool, bar, cap, numa)?;
    let watched: Vec<Arc<PciDevice>> = bar_dev.into_iter().cloned().collect();
    for d in &watched {
        d.enable_removal_notice()?;
    }
    let mut r = run_direct_watching(
        &mut q,
        sink.as_mut(),
        pool,
        &cfg,
        "pipeline",
        &name,
        &watched,
    )?;
    if args.verify {
        // A second pass over the connection at QD1 into a host buffer is the reference.
        let ref_pool = host_pool(registry, cfg.block_size.min(q.max_transfer()), 1, false)?;
        let expected = queue_checksum(&mut q, &ref_pool, args.start, r.bytes)?;
        add_verify(
            &mut r,
            sink.as_mut(),
            expected,
            "sink checksum vs a QD1 re-read over NVMe/TCP",
        )?;
    }
    if let Some(hc) = &args.hostcheck {
        print_hostchecks(hc, sink.as_ref())?;
    }
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::super::{parse_source, SourceSpec};

    #[test]
    fn nvmf_tcp_sources_parse_or_say_what_is_wrong() {
        match parse_source("nvmf-tcp://10.0.0.2:4420/nqn.2026-11.io.ubdirect:test/1").unwrap() {
            SourceSpec::Tcp(a) => {
                assert_eq!(a, "nvmf-tcp://10.0.0.2:4420/nqn.2026-11.io.ubdirect:test/1")
            }
            other => panic!("{other:?}"),
        }
        let e = parse_source("nvmf-tcp://10.0.0.2:99999/nqn.x").unwrap_err();
        assert!(e.contains("port"), "{e}");
        let e = parse_source("nvmf-tcp://10.0.0.2").unwrap_err();
        assert!(e.contains("NQN is missing"), "{e}");
    }
}
