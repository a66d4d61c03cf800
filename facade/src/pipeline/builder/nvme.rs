//! An NVMe namespace through vfio-pci as the source.

use std::sync::Arc;

use ubdirect_core::seams::BlockQueue;
use ubdirect_core::PciAddress;
use ubdirect_nvme::{Controller, IoQueuePair, QueueOptions, Recovery};

use super::super::config::PipelineConfig;
use super::super::engine::run_direct_watching;
use super::super::sink_ext::PipelineSink;
use super::super::verify::queue_checksum;
use super::error::{PipelineRunError, SetupError};
use super::run::Run;
use super::sinks::add_verify;
use super::Note;

/// Stream namespace `nsid` (`None`: the first active one) of the controller at `addr`.
pub(super) fn run(
    run: &mut Run<'_>,
    addr: PciAddress,
    nsid: Option<u32>,
) -> Result<(), PipelineRunError> {
    let s = run.s;
    let pool = run.dev.pool(s.block_size)?;
    let ctrl = run
        .dev
        .ctrl
        .clone()
        .ok_or_else(|| PipelineRunError::open("NVMe controller not opened".to_string()))?;
    let mut q = open_queue(run, &ctrl, addr, nsid)?;
    let cap = q.capacity();
    let cfg = PipelineConfig {
        limit: run.limit(cap),
        ..run.config()
    };
    let name = format!("nvme:{addr}/{} (vfio)", q.default_nsid());
    let mut sink = run.make_sink(&pool, cap)?;
    run.warn_numa();
    if s.segments {
        // The sink alone makes no sense for the BAR sink: only the source writes a BAR.
        let sink_alone = run.dev.bar.is_none();
        let alone: Option<&mut dyn PipelineSink> = match sink_alone {
            true => Some(sink.as_mut()),
            false => None,
        };
        run.segments((&mut q, &name), alone, &pool, &cfg)?;
        if sink_alone {
            // The sink-alone segment fed this sink: a fresh one for the verified run.
            drop(sink);
            sink = run.make_sink(&pool, cap)?;
        }
    }
    // A hot-unplug of the controller or the BAR device ends the run with a typed error
    // (checked every 100 ms) instead of blocking the kernel's removal until exit.
    let mut watched = vec![ctrl.device().clone()];
    watched.extend(run.dev.bar_dev.iter().cloned());
    for d in &watched {
        d.enable_removal_notice()?;
    }
    let guard = run.before_run(ctrl.device());
    let sink = sink.as_mut();
    let mut r = run_direct_watching(&mut q, &mut *sink, &pool, &cfg, "pipeline", &name, &watched)?;
    if s.verify {
        // A second pass through the driver at QD1 into a host buffer is the reference.
        let bs = s.block_size.min(q.max_transfer());
        let ref_pool = run.dev.host_pool(bs, 1, true)?;
        let expected = queue_checksum(&mut q, &ref_pool, s.start, r.bytes)?;
        add_verify(&mut r, sink, expected, "sink checksum vs a QD1 re-read")?;
    }
    run.hostchecks(sink);
    drop(guard);
    if ctrl.resets() > 0 {
        run.note(Note::ControllerReset {
            addr,
            resets: ctrl.resets(),
            requeued: q.stats().requeued,
        });
    }
    run.reports.push(r);
    Ok(())
}

/// The run's queue pair on namespace `nsid` (`None`: the first active one).
fn open_queue(
    run: &Run<'_>,
    ctrl: &Arc<Controller>,
    addr: PciAddress,
    nsid: Option<u32>,
) -> Result<IoQueuePair, PipelineRunError> {
    let found = match nsid {
        Some(n) => ctrl.namespace_info(n),
        None => ctrl.namespaces().first(),
    };
    let Some(ns) = found else {
        let active = ctrl.namespaces().iter().map(|n| n.nsid).collect();
        return Err(SetupError::NamespaceNotActive { addr, nsid, active }.into());
    };
    let qopts = QueueOptions {
        depth: (run.s.qd * 4).max(64),
        nsid: Some(ns.nsid),
        // A timeout or a controller reset under the run resets the controller and submits the
        // reads in flight again: no block is lost.
        recovery: Recovery::Requeue,
        ..Default::default()
    };
    Ok(IoQueuePair::new(ctrl, qopts)?)
}
