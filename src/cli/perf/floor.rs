//! `ubdirect perf --engine floor`: the floor loop of `ubdirect::nvme::perf::floor` on one pinned
//! core, reported like the driver's runs.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ubdirect::dma::util::pin_to_core;
use ubdirect::dma::util::{LatencyHistogram, Tsc};
use ubdirect::nvme::perf::floor::{FloorJob, FloorQueue};
use ubdirect::nvme::Controller;

use super::{finish, plain_core, single_core_randread, Args, PlainRun, RunEnd, ShadowInfo};
use crate::cli::CliResult;

/// A read not completed within this long fails the run.
const WAIT: Duration = Duration::from_secs(5);

/// Run the floor loop on the controller the caller opened.
pub(super) fn run(
    args: &Args,
    ctrl: &Arc<Controller>,
    nsid: u32,
    first_block: u64,
    span_blocks: u64,
) -> CliResult {
    let core = single_core_randread(args)?;
    if args.io_size > 4096 {
        return Err(format!(
            "--engine floor reads at most one 4 KiB page per command (-o {}): use -o 4096 or less",
            args.io_size
        )
        .into());
    }
    pin_to_core(core)?;
    let mut q = FloorQueue::new(ctrl, nsid, args.queue_depth)?;
    if q.depth() < args.queue_depth {
        eprintln!(
            "ubdirect perf: the controller caps the queue at {} reads in flight (-q {} asked for)",
            q.depth(),
            args.queue_depth
        );
    }
    let tsc = Tsc::calibrate(Duration::from_millis(100));
    let job = FloorJob {
        nsid,
        io_size: args.io_size,
        first_block,
        span_blocks,
        run_ticks: tsc.ticks(Duration::from_secs_f64(args.time.max(0.01))),
        wait_ticks: tsc.ticks(WAIT),
        wait: WAIT,
        pad_ticks: args.floor_pad_cycles,
    };
    let mut hist = LatencyHistogram::new();
    let t0 = Instant::now();
    let r = q.run(&job, &mut hist)?;
    let secs = t0.elapsed().as_secs_f64();
    let mut cores = [plain_core(
        PlainRun {
            core,
            qid: q.qid(),
            ios: r.ios,
            errors: r.errors,
            secs,
            io_size: args.io_size,
            doorbells: (r.sq_doorbell_writes, r.cq_doorbell_writes),
        },
        hist,
        &tsc,
    )];
    cores[0].queue_depth = q.depth();
    drop(q);
    finish(
        args,
        nsid,
        ShadowInfo::not_used("the floor loop writes the doorbell registers"),
        &tsc,
        &mut cores,
        RunEnd::without_pool(ctrl.resets()),
    )
}
