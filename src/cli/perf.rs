//! `ubdirect perf`: NVMe I/O measurement in the manner of spdk_nvme_perf, on the userspace
//! driver. Each core gets its own pinned thread and queue pair; latency goes into a fixed-size
//! histogram; the driver's own submit and completion cost is timed with the cycle counter.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use serde::Serialize;
use ubdirect::dma::util::pin_to_core;
use ubdirect::dma::util::{rdtsc, LatencyHistogram, Tsc};
use ubdirect::dma::{PciAddress, PoolConfig, UbPool};
use ubdirect::nvme::{
    CommandSet, Controller, ControllerOptions, IoBuf, IoBufs, IoFlags, IoQueuePair, Lba, Namespace,
    QueueOptions, QueueStats, Recovery, ShadowDoorbells,
};
use ubdirect::pipeline::DmaFaultWatch;

use super::json::LatencyNs;
use super::leaks::Leaks;
use super::units::{parse_offset, parse_size, parse_usize_size};
use super::{CliResult, Outcome};
use report::{direction, latency_ns, window, Direction, HistogramJson};

mod floor;
#[cfg(test)]
mod model_loop;
mod report;
mod uring;

/// Measure NVMe I/O (IOPS, MiB/s, latency percentiles, driver cycles per I/O) like spdk_nvme_perf.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// PCI address of the controller (bound to vfio-pci), or nvmf-tcp://ADDR:PORT/SUBNQN[/NSID].
    #[arg(value_name = "PCI-ADDR", value_parser = super::nvmf::parse_ctrl_addr)]
    addr: String,

    /// Queue depth per core.
    #[arg(short = 'q', long = "queue-depth", default_value_t = 32)]
    queue_depth: usize,

    /// I/O size in bytes (K/M suffixes; a multiple of the LBA size).
    #[arg(short = 'o', long = "io-size", default_value = "4096", value_parser = parse_usize_size)]
    io_size: usize,

    /// I/O pattern.
    #[arg(short = 'w', long = "workload", value_enum, default_value = "randread")]
    workload: Workload,

    /// Read percentage for -w rw (0..=100).
    #[arg(short = 'M', long = "rwmixread", default_value_t = 50, value_parser = clap::value_parser!(u8).range(0..=100))]
    rwmixread: u8,

    /// Seconds to run.
    #[arg(short = 't', long = "seconds", alias = "time", default_value_t = 5.0)]
    time: f64,

    /// Warm-up seconds before the measured -t: I/O runs, its figures are not counted.
    #[arg(
        short = 'a',
        long = "warmup",
        value_name = "SECONDS",
        default_value_t = 0.0
    )]
    warmup: f64,

    /// Latency histogram: -L buckets (one per power of two), -LL the full histogram (every
    /// bucket); in the table and in --json (`latency_histogram`).
    #[arg(short = 'L', long = "latency-histogram", action = clap::ArgAction::Count)]
    latency_histogram: u8,

    /// One status line per second on stderr while running: auto (when stderr is a terminal
    /// and not --json), always, never.
    #[arg(long, value_enum, default_value = "auto")]
    progress: Progress,

    /// Cores to run on, each with its own queue pair: a list "0,2" or a mask "0x5".
    #[arg(short = 'c', long = "cores", default_value = "0", value_parser = parse_cores)]
    cores: CoreList,

    /// Namespace id (default: the first active one).
    #[arg(long = "ns", value_name = "NSID", value_parser = clap::value_parser!(u32).range(1..))]
    nsid: Option<u32>,

    /// Start of the I/O span in the namespace, in bytes (K/M/G suffixes: 64M).
    #[arg(long = "offset", value_name = "SIZE", value_parser = parse_offset, conflicts_with = "offset_mib")]
    offset: Option<u64>,

    /// Length of the I/O span in bytes (K/M/G suffixes; default: to the end of the namespace).
    #[arg(long = "span", value_name = "SIZE", value_parser = parse_size, conflicts_with = "span_mib")]
    span: Option<u64>,

    /// Old spelling of --offset, in MiB (hidden; still accepted).
    #[arg(long = "offset-mib", hide = true)]
    offset_mib: Option<u64>,

    /// Old spelling of --span, in MiB (hidden; still accepted).
    #[arg(long = "span-mib", hide = true)]
    span_mib: Option<u64>,

    /// Writes stamp each block with its LBA; reads check stamps they find (misdirected or stale data).
    #[arg(long)]
    verify: bool,

    #[command(flatten)]
    pub(super) noiommu: super::noiommu_arg::NoIommuArg,

    /// Shadow doorbells (Doorbell Buffer Config) where the controller has them: auto (on only
    /// where a short probe at open sees them save MMIO doorbell writes), on, or off.
    #[arg(long = "shadow-doorbells", value_enum, default_value = "auto")]
    shadow_doorbells: ShadowArg,

    /// Old spelling of --shadow-doorbells off (hidden; still accepted).
    #[arg(long, hide = true)]
    no_shadow_doorbell: bool,

    /// Place the I/O submission queues in the controller's Controller Memory Buffer (CMB).
    #[arg(long)]
    sq_in_cmb: bool,

    /// JSON on stdout instead of a table.
    #[arg(long)]
    json: bool,

    /// What issues the reads: this driver, the bare floor loop it is measured against, or the
    /// kernel's polled io_uring (the controller bound to the kernel nvme driver, loaded with
    /// nvme.poll_queues=1 or more).
    #[arg(long, value_enum, default_value = "ubdirect")]
    engine: Engine,

    /// With --engine floor: busy-wait this many cycle-counter ticks per read after queueing it,
    /// a stand-in for a driver's own per-I/O work (how much of it the device's pace hides).
    #[arg(long = "floor-pad-cycles", value_name = "TICKS", default_value_t = 0)]
    floor_pad_cycles: u64,
}

/// --engine values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
enum Engine {
    /// The userspace driver (IoQueuePair).
    Ubdirect,
    /// The floor loop: SQE, SQ doorbell, spin on the CQ phase bit, CQ doorbell; nothing else.
    Floor,
    /// io_uring with IORING_SETUP_IOPOLL and registered buffers, O_DIRECT on the namespace's
    /// block device (/dev/nvmeXnY).
    UringIopoll,
    /// io_uring NVMe passthrough (IORING_OP_URING_CMD, polled) on the namespace's char device
    /// (/dev/ngXnY).
    UringCmd,
}

/// --progress values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Progress {
    /// When stderr is a terminal and the output is not --json.
    Auto,
    /// Always.
    Always,
    /// Never.
    Never,
}

/// --shadow-doorbells values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum ShadowArg {
    /// On only where a probe at open sees them save MMIO doorbell writes.
    Auto,
    /// On whenever the controller has them.
    On,
    /// Never.
    Off,
}

impl Args {
    /// Whether to print the once-a-second status line.
    fn show_progress(&self) -> bool {
        match self.progress {
            Progress::Always => true,
            Progress::Never => false,
            Progress::Auto => !self.json && std::io::stderr().is_terminal(),
        }
    }

    /// The shadow doorbell mode asked for (`--no-shadow-doorbell` is `off`).
    fn shadow_mode(&self) -> ShadowDoorbells {
        match (self.no_shadow_doorbell, self.shadow_doorbells) {
            (true, _) | (_, ShadowArg::Off) => ShadowDoorbells::Off,
            (_, ShadowArg::On) => ShadowDoorbells::On,
            (_, ShadowArg::Auto) => ShadowDoorbells::Auto,
        }
    }
}

/// Shadow doorbells of a run: on or off, what was asked for, and why.
#[derive(Debug, Clone)]
struct ShadowInfo {
    on: bool,
    mode: &'static str,
    why: String,
}

impl ShadowInfo {
    /// Off for an engine that does not use the driver's doorbells.
    fn not_used(why: &str) -> ShadowInfo {
        ShadowInfo {
            on: false,
            mode: "off",
            why: why.into(),
        }
    }

    /// What the controller decided.
    fn of(ctrl: &Controller) -> ShadowInfo {
        let d = ctrl.shadow_decision();
        ShadowInfo {
            on: d.on,
            mode: match d.mode {
                ShadowDoorbells::Auto => "auto",
                ShadowDoorbells::On => "on",
                ShadowDoorbells::Off => "off",
            },
            why: d.why.clone(),
        }
    }
}

/// -w values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
enum Workload {
    /// Sequential reads.
    Read,
    /// Sequential writes.
    Write,
    /// Random reads.
    Randread,
    /// Random writes.
    Randwrite,
    /// Random mix of reads and writes (-M read percentage).
    Rw,
}

/// Parsed -c.
#[derive(Debug, Clone)]
struct CoreList(Vec<usize>);

fn parse_cores(s: &str) -> Result<CoreList, String> {
    let s = s.trim();
    let v: Vec<usize> = if let Some(hex) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        let mask = u64::from_str_radix(hex, 16).map_err(|e| format!("core mask {s:?}: {e}"))?;
        (0..64).filter(|b| mask >> b & 1 == 1).collect()
    } else {
        s.split(',')
            .map(|c| {
                c.trim()
                    .parse::<usize>()
                    .map_err(|e| format!("core {c:?}: {e}"))
            })
            .collect::<Result<_, _>>()?
    };
    if v.is_empty() {
        return Err("no cores selected".into());
    }
    Ok(CoreList(v))
}

/// What one core measured.
#[derive(Debug, Serialize)]
struct CoreResult {
    core: usize,
    qid: u16,
    /// Requests this core kept in flight: `-q`, or less where the controller's queue size
    /// (MQES) capped it.
    queue_depth: usize,
    ios: u64,
    reads: u64,
    writes: u64,
    errors: u64,
    seconds: f64,
    iops: f64,
    bytes_per_s: f64,
    latency_ns: LatencyNs,
    submit_cycles_per_io: f64,
    complete_cycles_per_io: f64,
    sq_doorbell_writes_per_io: f64,
    cq_doorbell_writes_per_io: f64,
    shadow_only_updates_per_io: f64,
    /// IOPS x mean latency / queue depth (at QD1: IOPS x mean latency; 1.0 = all of each
    /// I/O's time inside its latency window).
    window_fraction: f64,
    /// Cycle-counter ticks per I/O spent outside the latency window.
    outside_window_cycles_per_io: f64,
    verified_blocks: u64,
    verify_errors: u64,
    /// Controller resets this worker's queue went through (its requests were requeued).
    resets: u64,
    /// Commands submitted again after those resets.
    requeued: u64,
    /// Reads alone.
    read: Direction,
    /// Writes alone.
    write: Direction,
    #[serde(skip)]
    hist_read: LatencyHistogram,
    #[serde(skip)]
    hist_write: LatencyHistogram,
    #[serde(skip)]
    submit_cycles: u64,
    #[serde(skip)]
    complete_cycles: u64,
}

#[derive(Debug, Serialize)]
struct PerfReport<'a> {
    address: &'a str,
    engine: Engine,
    nsid: u32,
    workload: Workload,
    rwmixread: u8,
    io_size: usize,
    queue_depth: usize,
    /// The depth actually run (the smallest of the cores'): below `queue_depth` when the
    /// controller's queue size (MQES) capped it.
    effective_queue_depth: usize,
    shadow_doorbells: bool,
    /// `auto`, `on` or `off` (what was asked for).
    shadow_doorbells_mode: &'static str,
    /// Why they are on or off (the `auto` probe's counts).
    shadow_doorbells_why: String,
    sq_in_cmb: bool,
    tsc_hz: f64,
    /// `-a`: seconds of I/O before the measurement, not counted.
    warmup_seconds: f64,
    /// `-L` / `-LL`: the latency histogram of all cores.
    #[serde(skip_serializing_if = "Option::is_none")]
    latency_histogram: Option<HistogramJson>,
    cores: &'a [CoreResult],
    total: Total,
    /// Pool blocks and DMA mappings still held once the run's queues are dropped.
    #[serde(skip_serializing_if = "Option::is_none")]
    leaks: Option<Leaks>,
}

/// What the end of a run adds to its report.
struct RunEnd {
    /// Controller resets during the run.
    resets: u64,
    /// The leak check at exit (the engines that use the pool).
    leaks: Option<Leaks>,
}

impl RunEnd {
    /// A run with `resets` controller resets and no pool to check.
    fn without_pool(resets: u64) -> RunEnd {
        RunEnd {
            resets,
            leaks: None,
        }
    }
}

#[derive(Debug, Serialize)]
struct Total {
    ios: u64,
    iops: f64,
    bytes_per_s: f64,
    latency_ns: LatencyNs,
    submit_cycles_per_io: f64,
    complete_cycles_per_io: f64,
    submit_ns_per_io: f64,
    complete_ns_per_io: f64,
    /// IOPS x mean latency / queue depth of all cores (the cores' depths added up).
    window_fraction: f64,
    /// Cycle-counter ticks per I/O spent outside the latency window.
    outside_window_cycles_per_io: f64,
    /// The same in ns.
    outside_window_ns_per_io: f64,
    errors: u64,
    verify_errors: u64,
    /// Controller resets during the run (recoveries from timeouts or a reset under the run).
    controller_resets: u64,
    /// Reads alone.
    read: Direction,
    /// Writes alone.
    write: Direction,
    #[serde(skip)]
    hist: LatencyHistogram,
}

/// Settings shared by the workers.
struct Job {
    nsid: u32,
    io_size: usize,
    /// Requests in flight.
    depth: usize,
    /// Command slots of each queue pair.
    cmd_depth: usize,
    workload: Workload,
    rwmixread: u8,
    lba_size: u64,
    first_block: u64,
    span_blocks: u64,
    duration: Duration,
    warmup: Duration,
    /// I/Os completed so far per worker, warm-up included (read by the status line).
    done: Vec<Counter>,
    verify: bool,
    shadow: bool,
    sq_in_cmb: bool,
    tsc: Tsc,
    cores: usize,
}

/// A counter on a cache line of its own.
#[repr(align(64))]
#[derive(Default)]
struct Counter(AtomicU64);

const STAMP_MAGIC: u64 = 0x2146_5245_5044_4255; // "UBDPERF!"

/// Run it; then fail (exit 1) if the kernel logged an IOMMU fault for the controller.
pub fn run(args: &Args) -> CliResult {
    if args.warmup < 0.0 || !args.warmup.is_finite() {
        return Err(format!("-a {}: give the warm-up in seconds, 0 or more", args.warmup).into());
    }
    if (args.warmup > 0.0 || args.latency_histogram > 0)
        && (args.engine != Engine::Ubdirect || args.addr.starts_with("nvmf-tcp://"))
    {
        return Err("-a and -L are for --engine ubdirect on a PCI address: drop them".into());
    }
    if args.floor_pad_cycles != 0 && args.engine != Engine::Floor {
        return Err("--floor-pad-cycles is for --engine floor: drop it".into());
    }
    if args.addr.starts_with("nvmf-tcp://") {
        return super::nvmf_perf::run(&super::nvmf_perf::PerfSpec {
            addr: &args.addr,
            queue_depth: args.queue_depth,
            io_size: args.io_size,
            write: matches!(args.workload, Workload::Write | Workload::Randwrite),
            random: matches!(args.workload, Workload::Randread | Workload::Randwrite),
            seconds: args.time,
            verify: args.verify,
            json: args.json,
            offset: args.offset.unwrap_or(0),
            span: args.span,
        });
    }
    let devices: Vec<PciAddress> = args.addr.parse().into_iter().collect();
    let watch = DmaFaultWatch::start(&devices);
    let r = run_perf(args);
    match (watch.finish(), r) {
        (Ok(()), r) => r,
        (Err(f), Ok(_)) => Err(f.into()),
        (Err(f), Err(e)) => Err(format!("{e}\n{f}").into()),
    }
}

/// The run itself.
fn run_perf(args: &Args) -> CliResult {
    if args.queue_depth == 0 {
        return Err("-q must be at least 1".into());
    }
    if args.sq_in_cmb && args.engine != Engine::Ubdirect {
        return Err("--sq-in-cmb places the queues of --engine ubdirect only: drop it or use --engine ubdirect".into());
    }
    if matches!(args.engine, Engine::UringIopoll | Engine::UringCmd) {
        return uring::run(args);
    }
    let env = super::open::nvme_controller(args.noiommu, &args.addr, controller_options(args))?;
    let (registry, ctrl) = (env.registry().clone(), env.controller(0).clone());
    let target = Target::pick(args, &ctrl)?;
    if args.cores.0.len() > ctrl.io_queues_granted() as usize {
        return Err(format!(
            "{} cores asked for but the controller granted {} I/O queue pairs: give -c at most that many cores",
            args.cores.0.len(),
            ctrl.io_queues_granted()
        )
        .into());
    }
    if args.engine == Engine::Floor {
        return floor::run(
            args,
            &ctrl,
            target.nsid,
            target.first_block,
            target.span_blocks,
        );
    }
    let depths = Depths::of(args, &ctrl);
    if let Some(l) = capped_depth_line(args.queue_depth, depths.requests) {
        eprintln!("ubdirect perf: {l}");
    }
    // Pool blocks are powers of two of at least 4 KiB.
    let block = args.io_size.next_power_of_two().max(4096);
    let pool = UbPool::with_hugepages(
        &registry,
        PoolConfig {
            block_size: block,
            block_count: depths.requests * args.cores.0.len(),
        },
        ctrl.device().numa_node(),
    )?;
    let job = Arc::new(Job::new(args, &ctrl, &target, &depths));
    let mappings_expected = registry.region_count();
    let reset_hook = super::fault_hook::arm(ctrl.device());
    let mut cores = run_workers(args, &ctrl, &pool, &job)?;
    drop(reset_hook);
    // The workers' queue pairs and buffers are dropped: whatever is still out leaked.
    let end = RunEnd {
        resets: ctrl.resets(),
        leaks: Some(Leaks::count(&pool, &registry, mappings_expected)),
    };
    end.leaks.iter().for_each(|l| l.warn("perf"));
    finish(
        args,
        target.nsid,
        ShadowInfo::of(&ctrl),
        &job.tsc,
        &mut cores,
        end,
    )
}

/// The controller options `perf` opens the controller with.
fn controller_options(args: &Args) -> ControllerOptions {
    ControllerOptions {
        io_queues: args.cores.0.len().max(1) as u16,
        // The floor loop writes doorbells straight to the registers.
        shadow_doorbells: if args.engine == Engine::Floor {
            ShadowDoorbells::Off
        } else {
            args.shadow_mode()
        },
        cmb: args.sq_in_cmb,
        ..Default::default()
    }
}

/// The namespace and the block range of it the run covers.
struct Target {
    nsid: u32,
    lba_size: u64,
    first_block: u64,
    span_blocks: u64,
}

impl Target {
    /// The namespace `-n` names (or the only one) and the range `--offset` and `--span` give,
    /// checked against the namespace's size and block size.
    fn pick(args: &Args, ctrl: &Controller) -> Result<Target, String> {
        let ns = super::namespace::pick(ctrl, &args.addr, args.nsid)?;
        let nsid = ns.nsid;
        let lba = ns.lba_size as u64;
        check_command_set(args.workload, nsid, ns.command_set)?;
        if args.io_size as u64 % lba != 0 {
            return Err(format!(
                "-o {} is not a multiple of namespace {nsid}'s {lba}-byte logical block: use -o {}",
                args.io_size,
                (args.io_size as u64).next_multiple_of(lba)
            ));
        }
        let offset = args
            .offset
            .or(args.offset_mib.map(|m| m.saturating_mul(1 << 20)))
            .unwrap_or(0);
        if offset % lba != 0 {
            return Err(format!(
                "--offset {offset} is not a multiple of namespace {nsid}'s {lba}-byte logical block"
            ));
        }
        let first_block = offset / lba;
        if first_block >= ns.nsze {
            return Err(format!(
                "--offset {offset} is past the end of namespace {nsid} ({} bytes)",
                ns.size_bytes()
            ));
        }
        let mut span_blocks = ns.nsze - first_block;
        if let Some(b) = args
            .span
            .or(args.span_mib.map(|m| m.saturating_mul(1 << 20)))
        {
            span_blocks = span_blocks.min(b / lba);
        }
        if span_blocks < args.io_size as u64 / lba {
            return Err(format!(
                "the span from --offset {offset} (--span, or the end of namespace {nsid}) is smaller than one {}-byte I/O",
                args.io_size
            ));
        }
        Ok(Target {
            nsid,
            lba_size: lba,
            first_block,
            span_blocks,
        })
    }
}

/// Refuse, before anything is sent, a workload the namespace's command set cannot take: writes
/// on a namespace that takes no random writes (a zoned namespace writes only at each zone's
/// write pointer, one command at a time), and any I/O on one that has no logical blocks.
fn check_command_set(workload: Workload, nsid: u32, set: CommandSet) -> Result<(), String> {
    let writes = !matches!(workload, Workload::Read | Workload::Randread);
    match set {
        CommandSet::Nvm => Ok(()),
        CommandSet::Zoned if !writes => Ok(()),
        CommandSet::Zoned => Err(format!(
            "namespace {nsid} is a zoned namespace (Zoned Namespace command set): it takes writes only at each zone's write pointer, which perf does not track; use -w read or -w randread"
        )),
        other => Err(format!(
            "namespace {nsid} uses the {other} command set, which has no logical blocks to read or write: pick an NVM namespace with -n"
        )),
    }
}

/// How deep each core's queue pair runs.
struct Depths {
    /// Requests in flight per core.
    requests: usize,
    /// Command slots of each queue pair.
    commands: usize,
}

impl Depths {
    /// Requests in flight per core: -q, capped by the controller's queue size (MQES). Each
    /// queue pair gets command slots for all their commands where MQES allows; the commands of
    /// requests that do not fit wait in the queue pair (queued requests) and go out as slots
    /// free up.
    fn of(args: &Args, ctrl: &Controller) -> Depths {
        let max_depth = (ctrl.max_queue_entries() as usize).clamp(2, 65536) - 1;
        let requests = args.queue_depth.min(max_depth);
        let cmds_per_io = args
            .io_size
            .div_ceil(ctrl.max_command_bytes().max(1))
            .max(1);
        Depths {
            requests,
            commands: requests.saturating_mul(cmds_per_io).min(max_depth),
        }
    }
}

impl Job {
    /// The workers' settings; calibrates the cycle counter.
    fn new(args: &Args, ctrl: &Controller, target: &Target, depths: &Depths) -> Job {
        Job {
            nsid: target.nsid,
            io_size: args.io_size,
            depth: depths.requests,
            cmd_depth: depths.commands,
            workload: args.workload,
            rwmixread: args.rwmixread,
            lba_size: target.lba_size,
            first_block: target.first_block,
            span_blocks: target.span_blocks,
            duration: Duration::from_secs_f64(args.time.max(0.01)),
            warmup: Duration::from_secs_f64(args.warmup),
            done: (0..args.cores.0.len())
                .map(|_| Counter::default())
                .collect(),
            verify: args.verify,
            shadow: ctrl.shadow_doorbells(),
            sq_in_cmb: args.sq_in_cmb,
            tsc: Tsc::calibrate(Duration::from_millis(100)),
            cores: args.cores.0.len(),
        }
    }
}

/// One pinned worker per core, started together; their results once all are done (the first
/// error if one failed).
fn run_workers(
    args: &Args,
    ctrl: &Arc<Controller>,
    pool: &Arc<UbPool>,
    job: &Arc<Job>,
) -> Result<Vec<CoreResult>, String> {
    let start = Arc::new(Barrier::new(args.cores.0.len()));
    let results: Vec<Result<CoreResult, String>> = std::thread::scope(|s| {
        let handles: Vec<_> = args
            .cores
            .0
            .iter()
            .enumerate()
            .map(|(i, &core)| {
                let (ctrl, pool, job, start) =
                    (ctrl.clone(), pool.clone(), job.clone(), start.clone());
                s.spawn(move || worker(&ctrl, &pool, &job, i, core, &start))
            })
            .collect();
        status_lines(args, job, &handles);
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("worker panicked".into())))
            .collect()
    });
    results.into_iter().collect()
}

/// Until the workers are done: one line a second on stderr (with `--progress`).
fn status_lines<T>(args: &Args, job: &Job, handles: &[std::thread::ScopedJoinHandle<'_, T>]) {
    let show = args.show_progress();
    let t0 = Instant::now();
    let (mut next, mut last_ios, mut last_t) = (1u64, 0u64, 0.0f64);
    while !handles.iter().all(|h| h.is_finished()) {
        std::thread::sleep(Duration::from_millis(20));
        let t = t0.elapsed().as_secs_f64();
        if show && t >= next as f64 {
            let ios: u64 = job.done.iter().map(|c| c.0.load(Ordering::Relaxed)).sum();
            // The second just ended lay in the warm-up.
            let warming = (next as f64) <= job.warmup.as_secs_f64();
            eprintln!(
                "{}",
                report::progress_line(next, warming, ios - last_ios, t - last_t, job.io_size)
            );
            (next, last_ios, last_t) = (next + 1, ios, t);
        }
    }
}

/// Print the report of a run (table or `--json`) and say whether it found errors.
fn finish(
    args: &Args,
    nsid: u32,
    shadow: ShadowInfo,
    tsc: &Tsc,
    cores: &mut [CoreResult],
    end: RunEnd,
) -> CliResult {
    fill_windows(cores, tsc);
    let cores = &*cores;
    let mut total = summarize(cores, tsc, args.io_size);
    total.controller_resets = end.resets;
    let report = PerfReport {
        address: &args.addr,
        engine: args.engine,
        nsid,
        workload: args.workload,
        rwmixread: args.rwmixread,
        io_size: args.io_size,
        queue_depth: args.queue_depth,
        effective_queue_depth: effective_depth(cores, args.queue_depth),
        shadow_doorbells: shadow.on,
        shadow_doorbells_mode: shadow.mode,
        shadow_doorbells_why: shadow.why,
        sq_in_cmb: args.sq_in_cmb,
        tsc_hz: tsc.hz,
        warmup_seconds: args.warmup,
        latency_histogram: (args.latency_histogram > 0)
            .then(|| report::histogram(&total.hist, tsc, args.latency_histogram > 1)),
        cores,
        total,
        leaks: end.leaks,
    };
    if args.json {
        super::json::print("perf", &report)?;
    } else {
        print_report(&report);
    }
    if report.total.errors > 0 || report.total.verify_errors > 0 {
        return Ok(Outcome::Findings);
    }
    Ok(Outcome::Success)
}

/// The depth the run kept in flight: the smallest of the cores' (`asked` when none ran).
fn effective_depth(cores: &[CoreResult], asked: usize) -> usize {
    cores.iter().map(|c| c.queue_depth).min().unwrap_or(asked)
}

/// The line saying the controller capped `-q`, when it did.
fn capped_depth_line(asked: usize, effective: usize) -> Option<String> {
    (effective < asked).then(|| {
        format!(
            "queue depth capped: -q {asked} asked for, the controller's queues hold {effective} (MQES): running at depth {effective}"
        )
    })
}

/// Each core's latency window (and its directions') from its IOPS, mean latency and depth.
fn fill_windows(cores: &mut [CoreResult], tsc: &Tsc) {
    for c in cores {
        let w = window(c.iops, c.latency_ns.mean, c.queue_depth, tsc.hz);
        (c.window_fraction, c.outside_window_cycles_per_io) = (w.fraction, w.outside_cycles_per_io);
        for d in [&mut c.read, &mut c.write] {
            d.window_fraction = window(d.iops, d.latency_ns.mean, c.queue_depth, tsc.hz).fraction;
        }
    }
}

fn summarize(cores: &[CoreResult], tsc: &Tsc, io_size: usize) -> Total {
    let (mut hr, mut hw) = (LatencyHistogram::new(), LatencyHistogram::new());
    for c in cores {
        hr.merge(&c.hist_read);
        hw.merge(&c.hist_write);
    }
    let mut h = hr.clone();
    h.merge(&hw);
    let ios: u64 = cores.iter().map(|c| c.ios).sum();
    let iops: f64 = cores.iter().map(|c| c.iops).sum();
    let per_io = |x: u64| if ios == 0 { 0.0 } else { x as f64 / ios as f64 };
    let submit = per_io(cores.iter().map(|c| c.submit_cycles).sum());
    let complete = per_io(cores.iter().map(|c| c.complete_cycles).sum());
    let depth: usize = cores.iter().map(|c| c.queue_depth).sum();
    let latency = latency_ns(&h, tsc);
    let w = window(iops, latency.mean, depth, tsc.hz);
    let mut read = report::sum_directions(cores.iter().map(|c| &c.read), &hr, tsc);
    let mut write = report::sum_directions(cores.iter().map(|c| &c.write), &hw, tsc);
    for d in [&mut read, &mut write] {
        d.window_fraction = window(d.iops, d.latency_ns.mean, depth, tsc.hz).fraction;
    }
    Total {
        ios,
        iops,
        bytes_per_s: iops * io_size as f64,
        latency_ns: latency,
        submit_cycles_per_io: submit,
        complete_cycles_per_io: complete,
        submit_ns_per_io: tsc.to_ns(submit),
        complete_ns_per_io: tsc.to_ns(complete),
        window_fraction: w.fraction,
        outside_window_cycles_per_io: w.outside_cycles_per_io,
        outside_window_ns_per_io: tsc.to_ns(w.outside_cycles_per_io),
        errors: cores.iter().map(|c| c.errors).sum(),
        verify_errors: cores.iter().map(|c| c.verify_errors).sum(),
        controller_resets: 0,
        read,
        write,
        hist: h,
    }
}

const MIB: f64 = (1u64 << 20) as f64;

/// The human-readable report: the run's header, the per-core table, the totals, then the
/// latency, cost and counter lines.
fn print_report(r: &PerfReport<'_>) {
    print_header(r);
    print_core_table(r);
    print_latency_and_cost(r);
    print_counters(r);
}

/// A serde enum's name as it appears on the command line.
fn arg_name<T: Serialize>(v: T) -> String {
    serde_json::to_value(v)
        .ok()
        .and_then(|v| v.as_str().map(String::from))
        .unwrap_or_default()
}

/// The first lines: what ran, the shadow-doorbell choice and any depth cap.
fn print_header(r: &PerfReport<'_>) {
    println!(
        "ubdirect perf --engine {}: {} nsid {} -w {} -o {} -q {}{} shadow doorbells {}{}",
        arg_name(r.engine),
        r.address,
        r.nsid,
        arg_name(r.workload),
        r.io_size,
        r.queue_depth,
        if r.workload == Workload::Rw {
            format!(" -M {}", r.rwmixread)
        } else {
            String::new()
        },
        if r.shadow_doorbells { "on" } else { "off" },
        if r.sq_in_cmb { ", SQs in the CMB" } else { "" }
    );
    println!(
        "shadow doorbells {} (--shadow-doorbells {}): {}",
        if r.shadow_doorbells { "on" } else { "off" },
        r.shadow_doorbells_mode,
        r.shadow_doorbells_why
    );
    if let Some(l) = capped_depth_line(r.queue_depth, r.effective_queue_depth) {
        println!("{l}");
    }
}

/// The SPDK-style table: one line per core, the total, and per direction with `-w rw`.
fn print_core_table(r: &PerfReport<'_>) {
    println!(
        "{:<40}: {:>10} {:>10} {:>10} {:>10} {:>10}",
        "Latency(us)", "IOPS", "MiB/s", "Average", "min", "max"
    );
    for c in r.cores {
        println!(
            "{:<40}: {:>10.2} {:>10.2} {:>10.2} {:>10.2} {:>10.2}",
            format!(
                "PCIE ({}) NSID {} from core {:>2}",
                r.address, r.nsid, c.core
            ),
            c.iops,
            c.bytes_per_s / MIB,
            c.latency_ns.mean / 1e3,
            c.latency_ns.min.unwrap_or(0.0) / 1e3,
            c.latency_ns.max / 1e3
        );
    }
    println!("{}", "=".repeat(96));
    let t = &r.total;
    println!(
        "{:<40}: {:>10.2} {:>10.2} {:>10.2}",
        "Total",
        t.iops,
        t.bytes_per_s / MIB,
        t.latency_ns.mean / 1e3
    );
    if r.workload == Workload::Rw {
        for c in r.cores {
            for (name, d) in [("read", &c.read), ("write", &c.write)] {
                print_direction(&format!("  core {:>2} {name}", c.core), d);
            }
        }
        for (name, d) in [("read", &t.read), ("write", &t.write)] {
            print_direction(&format!("Total {name}"), d);
        }
    }
}

/// The warm-up note, latency percentiles, driver cost per I/O, latency window and doorbell
/// writes per core.
fn print_latency_and_cost(r: &PerfReport<'_>) {
    let t = &r.total;
    if r.warmup_seconds > 0.0 {
        println!(
            "warm-up: {} s of I/O before the measurement, not counted",
            r.warmup_seconds
        );
    }
    println!(
        "latency percentiles (us): p50 {:.2}  p99 {:.2}  p99.9 {:.2}  p99.99 {:.2}  stddev {:.2}",
        t.latency_ns.p50 / 1e3,
        t.latency_ns.p99 / 1e3,
        t.latency_ns.p999 / 1e3,
        t.latency_ns.p9999.unwrap_or(0.0) / 1e3,
        t.latency_ns.stddev.unwrap_or(0.0) / 1e3
    );
    println!(
        "driver cost per I/O (TSC {:.0} MHz): submit {:.0} cycles ({:.0} ns), complete {:.0} cycles ({:.0} ns)",
        r.tsc_hz / 1e6,
        t.submit_cycles_per_io,
        t.submit_ns_per_io,
        t.complete_cycles_per_io,
        t.complete_ns_per_io
    );
    println!("{}", window_line(t, r.workload == Workload::Rw));
    for c in r.cores {
        println!(
            "core {:>2} qid {}: doorbell MMIO writes per I/O: SQ {:.3} CQ {:.3}, shadow-only updates {:.3}",
            c.core, c.qid, c.sq_doorbell_writes_per_io, c.cq_doorbell_writes_per_io, c.shadow_only_updates_per_io
        );
    }
}

/// The histogram (with `-L`), then errors, controller resets and verification, when any.
fn print_counters(r: &PerfReport<'_>) {
    let t = &r.total;
    if let Some(h) = &r.latency_histogram {
        for l in report::histogram_lines(h) {
            println!("{l}");
        }
    }
    if t.errors > 0 {
        println!("I/O errors: {}", t.errors);
    }
    if t.controller_resets > 0 {
        println!(
            "controller resets: {} (commands in flight submitted again: {})",
            t.controller_resets,
            r.cores.iter().map(|c| c.requeued).sum::<u64>()
        );
    }
    if r.cores
        .iter()
        .any(|c| c.verified_blocks > 0 || c.verify_errors > 0)
    {
        println!(
            "verify: {} blocks checked, {} errors",
            r.cores.iter().map(|c| c.verified_blocks).sum::<u64>(),
            t.verify_errors
        );
    }
}

/// The table line of the latency window: IOPS x mean latency / depth (per direction with
/// `-w rw`) and the time per I/O outside it.
fn window_line(t: &Total, rw: bool) -> String {
    format!(
        "latency window: IOPS x mean latency / depth {:.3}{}; outside it per I/O: {:.0} cycles ({:.0} ns)",
        t.window_fraction,
        if rw {
            format!(
                " (reads {:.3}, writes {:.3})",
                t.read.window_fraction, t.write.window_fraction
            )
        } else {
            String::new()
        },
        t.outside_window_cycles_per_io,
        t.outside_window_ns_per_io
    )
}

/// One table line of one direction: I/Os, IOPS, MiB/s, average, p99 and max latency.
fn print_direction(label: &str, d: &Direction) {
    println!(
        "{label:<40}: {:>10.2} {:>10.2} {:>10.2} {:>10.2} {:>10.2}  ({} I/Os, p99 {:.2} us)",
        d.iops,
        d.bytes_per_s / MIB,
        d.latency_ns.mean / 1e3,
        d.latency_ns.min.unwrap_or(0.0) / 1e3,
        d.latency_ns.max / 1e3,
        d.ios,
        d.latency_ns.p99 / 1e3
    );
}

/// What an engine other than the driver counted on its one core.
#[derive(Debug, Clone, Copy)]
struct PlainRun {
    core: usize,
    qid: u16,
    ios: u64,
    errors: u64,
    secs: f64,
    io_size: usize,
    /// SQ and CQ doorbell writes.
    doorbells: (u64, u64),
}

/// The result of an engine other than the driver (one core; no driver cycle counts).
fn plain_core(run: PlainRun, hist: LatencyHistogram, tsc: &Tsc) -> CoreResult {
    let PlainRun {
        core,
        qid,
        ios,
        errors,
        secs,
        io_size,
        doorbells: (sq_db, cq_db),
    } = run;
    let per_io = |x: u64| if ios == 0 { 0.0 } else { x as f64 / ios as f64 };
    let iops = if secs > 0.0 { ios as f64 / secs } else { 0.0 };
    CoreResult {
        core,
        qid,
        queue_depth: 0,
        ios,
        reads: ios,
        writes: 0,
        errors,
        seconds: secs,
        iops,
        bytes_per_s: iops * io_size as f64,
        latency_ns: latency_ns(&hist, tsc),
        submit_cycles_per_io: 0.0,
        complete_cycles_per_io: 0.0,
        sq_doorbell_writes_per_io: per_io(sq_db),
        cq_doorbell_writes_per_io: per_io(cq_db),
        shadow_only_updates_per_io: 0.0,
        window_fraction: 0.0,
        outside_window_cycles_per_io: 0.0,
        verified_blocks: 0,
        verify_errors: 0,
        resets: 0,
        requeued: 0,
        read: direction(&hist, secs, io_size, tsc),
        write: Direction::default(),
        hist_read: hist,
        hist_write: LatencyHistogram::new(),
        submit_cycles: 0,
        complete_cycles: 0,
    }
}

/// The one core and the workload an engine other than the driver runs: random reads only.
fn single_core_randread(args: &Args) -> Result<usize, String> {
    if args.workload != Workload::Randread || args.verify {
        return Err(format!(
            "--engine {:?} runs random reads only: use -w randread without --verify",
            args.engine
        )
        .to_lowercase());
    }
    match args.cores.0[..] {
        [core] => Ok(core),
        _ => Err("this --engine runs on one core: give -c one core".into()),
    }
}

/// Per-worker state of one I/O slot (its tag is its index).
#[derive(Clone, Copy, Default)]
struct Slot {
    submitted: u64,
    lba: u64,
    write: bool,
}

struct Rng(u64);

impl Rng {
    #[inline(always)]
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
}

/// One core's run on its own queue pair; its figures.
fn worker(
    ctrl: &Arc<Controller>,
    pool: &Arc<UbPool>,
    job: &Job,
    index: usize,
    core: usize,
    start: &Barrier,
) -> Result<CoreResult, String> {
    // Every worker reaches the start barrier, also when its set-up failed, so that the others
    // are not left waiting.
    let prepared = Prepared::new(ctrl, pool, job, core);
    start.wait();
    let mut w = Worker::start(job, index, prepared?);
    w.run()?;
    Ok(w.result(core))
}

/// What a worker sets up before the start barrier: everything it allocates.
struct Prepared {
    qp: IoQueuePair,
    ns: Namespace,
    depth: usize,
    slots: Vec<Slot>,
    free: Vec<(usize, IoBuf)>,
    tally: Tally,
    /// Swapped in when the warm-up ends, so that the I/O path allocates nothing.
    fresh: (LatencyHistogram, LatencyHistogram),
}

impl Prepared {
    /// Pin to `core`, take a queue pair, the namespace and one pool buffer per request.
    fn new(
        ctrl: &Arc<Controller>,
        pool: &Arc<UbPool>,
        job: &Job,
        core: usize,
    ) -> Result<Prepared, String> {
        pin_to_core(core).map_err(|e| e.to_string())?;
        let qp = IoQueuePair::new(
            ctrl,
            QueueOptions {
                depth: job.cmd_depth,
                nsid: Some(job.nsid),
                shadow_doorbells: job.shadow,
                sq_in_cmb: job.sq_in_cmb,
                // A command that times out, or a controller reset under the run, resets the
                // controller and submits what was in flight again: the run goes on.
                recovery: Recovery::Requeue,
                ..Default::default()
            },
        )
        .map_err(|e| e.to_string())?;
        let depth = job.depth.min(qp.depth());
        let slots = vec![Slot::default(); depth];
        let ns = ctrl.namespace(job.nsid).map_err(|e| e.to_string())?;
        let mut free: Vec<(usize, IoBuf)> = Vec::with_capacity(depth);
        for i in 0..depth {
            let b = pool.get().map_err(|e| e.to_string())?;
            free.push((i, IoBuf::prefix(b, job.io_size).map_err(|e| e.to_string())?));
        }
        Ok(Prepared {
            qp,
            ns,
            depth,
            slots,
            free,
            tally: Tally::new(),
            fresh: (LatencyHistogram::new(), LatencyHistogram::new()),
        })
    }
}

/// Where a worker's I/Os go: in order through its share of the span, or at random.
struct IoPicker {
    rng: Rng,
    seq: u64,
    ios_in_span: u64,
    blocks_per_io: u64,
}

impl IoPicker {
    /// Worker `index`'s picker: sequential runs start at its share of the span.
    fn new(job: &Job, index: usize) -> IoPicker {
        let blocks_per_io = job.io_size as u64 / job.lba_size;
        let ios_in_span = job.span_blocks / blocks_per_io;
        IoPicker {
            rng: Rng(0x9e37_79b9_7f4a_7c15 ^ (index as u64 + 1).wrapping_mul(0x2545_f491_4f6c_dd1d)),
            seq: ios_in_span * index as u64 / job.cores as u64,
            ios_in_span,
            blocks_per_io,
        }
    }

    /// The next I/O: its first block and whether it writes.
    #[inline(always)]
    fn next(&mut self, job: &Job) -> (u64, bool) {
        let io = match job.workload {
            Workload::Read | Workload::Write => {
                let v = self.seq % self.ios_in_span;
                self.seq += 1;
                v
            }
            _ => self.rng.next() % self.ios_in_span,
        };
        let lba = job.first_block + io * self.blocks_per_io;
        let write = match job.workload {
            Workload::Write | Workload::Randwrite => true,
            Workload::Rw => self.rng.next() % 100 >= job.rwmixread as u64,
            _ => false,
        };
        (lba, write)
    }
}

/// A worker's counts. The I/O counts, histograms and cycle sums restart when the warm-up
/// ends; errors and verification count from the start.
struct Tally {
    hist_r: LatencyHistogram,
    hist_w: LatencyHistogram,
    ios: u64,
    reads: u64,
    writes: u64,
    errors: u64,
    verified: u64,
    verify_errors: u64,
    submit_cycles: u64,
    complete_cycles: u64,
    first_error: Option<String>,
}

impl Tally {
    fn new() -> Tally {
        Tally {
            hist_r: LatencyHistogram::new(),
            hist_w: LatencyHistogram::new(),
            ios: 0,
            reads: 0,
            writes: 0,
            errors: 0,
            verified: 0,
            verify_errors: 0,
            submit_cycles: 0,
            complete_cycles: 0,
            first_error: None,
        }
    }
}

/// One worker's run: its queue pair, its requests and its clock.
struct Worker<'a> {
    job: &'a Job,
    index: usize,
    qp: IoQueuePair,
    ns: Namespace,
    depth: usize,
    picker: IoPicker,
    slots: Vec<Slot>,
    /// Requests whose buffers are back, ready to go out again.
    free: Vec<(usize, IoBuf)>,
    tally: Tally,
    fresh: (LatencyHistogram, LatencyHistogram),
    stats0: QueueStats,
    t_start: Instant,
    measure_from: u64,
    warming: bool,
    deadline: u64,
    stopping: bool,
    /// I/Os that succeeded so far, warm-up included.
    done: u64,
    /// The last cycle-counter reading: taken at the end of each poll and after each ring, it
    /// starts the next step's figures, so the loop reads the counter once per poll and once
    /// per batch of submissions (plus once per batch of completions, in the poll).
    last: u64,
    /// Completions and successes of the last poll.
    reaped: usize,
    succeeded: u64,
}

impl<'a> Worker<'a> {
    /// Start the clock (right after the start barrier).
    fn start(job: &'a Job, index: usize, p: Prepared) -> Worker<'a> {
        let stats0 = p.qp.stats();
        let t_start = Instant::now();
        let measure_from = rdtsc() + job.tsc.ticks(job.warmup);
        Worker {
            job,
            index,
            picker: IoPicker::new(job, index),
            qp: p.qp,
            ns: p.ns,
            depth: p.depth,
            slots: p.slots,
            free: p.free,
            tally: p.tally,
            fresh: p.fresh,
            stats0,
            t_start,
            measure_from,
            warming: !job.warmup.is_zero(),
            deadline: measure_from + job.tsc.ticks(job.duration),
            stopping: false,
            done: 0,
            last: rdtsc(),
            reaped: 0,
            succeeded: 0,
        }
    }

    /// Submit, account, poll, until the time is up and nothing is in flight.
    fn run(&mut self) -> Result<(), String> {
        loop {
            // Resubmit first: the slots freed by the last poll go out before any bookkeeping,
            // which then runs while the device works on them.
            if !self.stopping && !self.free.is_empty() {
                self.submit_free()?;
            }
            // The last poll's bookkeeping, after its slots went out again.
            if self.reaped > 0 {
                self.done += self.succeeded;
                self.job.done[self.index]
                    .0
                    .store(self.done, Ordering::Relaxed);
            }
            if self.warming && self.last >= self.measure_from {
                self.end_warmup();
            }
            if !self.stopping && self.last >= self.deadline {
                self.stopping = true;
            }
            if self.stopping && self.qp.in_flight() == 0 {
                return Ok(());
            }
            self.reap()?;
        }
    }

    /// Send every free request out again, then ring.
    #[inline(always)]
    fn submit_free(&mut self) -> Result<(), String> {
        let job = self.job;
        // The reading that ended the poll which freed these slots: every request of the
        // batch is timed from before its set-up, so no latency is understated.
        let s0 = self.last;
        while let Some((slot, mut buf)) = self.free.pop() {
            let (lba, write) = self.picker.next(job);
            if write && job.verify {
                stamp(
                    buf.as_mut_slice(),
                    lba,
                    job.lba_size as usize,
                    self.picker.blocks_per_io,
                );
            }
            self.slots[slot] = Slot {
                submitted: s0,
                lba,
                write,
            };
            let r = if write {
                self.qp
                    .submit_write(&self.ns, Lba(lba), buf, IoFlags::empty(), slot as u64)
            } else {
                self.qp
                    .submit_read(&self.ns, Lba(lba), buf, IoFlags::empty(), slot as u64)
            };
            if let Err(rej) = r {
                return Err(format!("submit failed: {}", rej.error));
            }
        }
        self.qp.ring();
        self.last = rdtsc();
        self.tally.submit_cycles += self.last - s0;
        Ok(())
    }

    /// The warm-up is over: count from here.
    fn end_warmup(&mut self) {
        let t = &mut self.tally;
        self.warming = false;
        std::mem::swap(&mut t.hist_r, &mut self.fresh.0);
        std::mem::swap(&mut t.hist_w, &mut self.fresh.1);
        (t.ios, t.reads, t.writes, t.submit_cycles, t.complete_cycles) = (0, 0, 0, 0, 0);
        self.stats0 = self.qp.stats();
        self.t_start = Instant::now();
    }

    /// Poll the completions: time and check each, and free its slot.
    #[inline(always)]
    fn reap(&mut self) -> Result<(), String> {
        let job = self.job;
        let blocks_per_io = self.picker.blocks_per_io;
        let (slots, tally, free) = (&self.slots, &mut self.tally, &mut self.free);
        // From the last reading: the completion cycles include the few checks before it.
        let p0 = self.last;
        // Read the counter once per batch of completions, at the first one.
        let mut now = 0u64;
        let mut succeeded = 0;
        self.reaped = self
            .qp
            .poll(self.depth, |c| {
                if now == 0 {
                    now = rdtsc();
                }
                let slot = c.tag as usize;
                let s = slots[slot];
                let lat = now.saturating_sub(s.submitted);
                // Only I/O that succeeded counts as throughput and latency; a failed command
                // is an error, whatever it cost.
                if c.result.is_ok() {
                    tally.ios += 1;
                    succeeded += 1;
                    if s.write {
                        tally.writes += 1;
                        tally.hist_w.record(lat);
                    } else {
                        tally.reads += 1;
                        tally.hist_r.record(lat);
                    }
                }
                // Every request here moves one buffer window, which comes back.
                let IoBufs::One(buf) = c.bufs else {
                    return;
                };
                match c.result {
                    Err(e) => {
                        tally.errors += 1;
                        tally.first_error.get_or_insert_with(|| e.to_string());
                    }
                    Ok(_) if job.verify && !s.write => {
                        let (v, bad) = check_stamps(
                            buf.as_slice(),
                            s.lba,
                            job.lba_size as usize,
                            blocks_per_io,
                        );
                        tally.verified += v;
                        tally.verify_errors += bad;
                    }
                    Ok(_) => {}
                }
                free.push((slot, buf));
            })
            .map_err(|e| e.to_string())?;
        self.succeeded = succeeded;
        self.last = rdtsc();
        if self.reaped > 0 {
            self.tally.complete_cycles += self.last - p0;
        }
        Ok(())
    }

    /// The core's figures.
    fn result(self, core: usize) -> CoreResult {
        let job = self.job;
        let t = self.tally;
        let secs = self.t_start.elapsed().as_secs_f64();
        let (st, stats0) = (self.qp.stats(), self.stats0);
        if let Some(e) = &t.first_error {
            eprintln!(
                "ubdirect perf: core {core}: {} I/O error(s), first: {e}",
                t.errors
            );
        }
        let ios = t.ios;
        let per_io = |x: u64| if ios == 0 { 0.0 } else { x as f64 / ios as f64 };
        let iops = ios as f64 / secs;
        let mut all = t.hist_r.clone();
        all.merge(&t.hist_w);
        CoreResult {
            core,
            qid: self.qp.qid(),
            queue_depth: self.depth,
            ios,
            reads: t.reads,
            writes: t.writes,
            errors: t.errors,
            seconds: secs,
            iops,
            bytes_per_s: iops * job.io_size as f64,
            submit_cycles_per_io: per_io(t.submit_cycles),
            complete_cycles_per_io: per_io(t.complete_cycles),
            sq_doorbell_writes_per_io: per_io(st.sq_doorbell_writes - stats0.sq_doorbell_writes),
            cq_doorbell_writes_per_io: per_io(st.cq_doorbell_writes - stats0.cq_doorbell_writes),
            shadow_only_updates_per_io: per_io(st.shadow_only_updates - stats0.shadow_only_updates),
            window_fraction: 0.0,
            outside_window_cycles_per_io: 0.0,
            verified_blocks: t.verified,
            verify_errors: t.verify_errors,
            resets: st.resets - stats0.resets,
            requeued: st.requeued - stats0.requeued,
            read: direction(&t.hist_r, secs, job.io_size, &job.tsc),
            write: direction(&t.hist_w, secs, job.io_size, &job.tsc),
            latency_ns: latency_ns(&all, &job.tsc),
            hist_read: t.hist_r,
            hist_write: t.hist_w,
            submit_cycles: t.submit_cycles,
            complete_cycles: t.complete_cycles,
        }
    }
}

/// Stamp every block of a write with the magic and its LBA.
fn stamp(s: &mut [u8], lba: u64, lba_size: usize, blocks: u64) {
    for b in 0..blocks as usize {
        let o = b * lba_size;
        s[o..o + 8].copy_from_slice(&STAMP_MAGIC.to_le_bytes());
        s[o + 8..o + 16].copy_from_slice(&(lba + b as u64).to_le_bytes());
    }
}

/// Check the stamps found in a read: (stamped blocks seen, blocks whose stamp names another LBA).
fn check_stamps(s: &[u8], lba: u64, lba_size: usize, blocks: u64) -> (u64, u64) {
    let (mut seen, mut bad) = (0, 0);
    for b in 0..blocks as usize {
        let o = b * lba_size;
        if s[o..o + 8] == STAMP_MAGIC.to_le_bytes() {
            seen += 1;
            if s[o + 8..o + 16] != (lba + b as u64).to_le_bytes() {
                bad += 1;
            }
        }
    }
    (seen, bad)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A one-core run of 4 KiB I/Os on queue 1 without errors.
    fn plain(core: usize, ios: u64, secs: f64, doorbells: (u64, u64)) -> PlainRun {
        PlainRun {
            core,
            qid: 1,
            ios,
            errors: 0,
            secs,
            io_size: 4096,
            doorbells,
        }
    }

    fn parse(args: &[&str]) -> Args {
        use clap::Parser;
        let cli = crate::cli::Cli::try_parse_from(["ubdirect", "perf"].iter().chain(args).copied())
            .unwrap_or_else(|e| panic!("{args:?}: {e}"));
        match cli.command {
            crate::cli::Command::Perf(a) => a,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_noiommu_opt_in_is_off_unless_asked() {
        assert!(!parse(&["00:04.0"]).noiommu.allow_noiommu);
        assert!(parse(&["00:04.0", "--allow-noiommu"]).noiommu.allow_noiommu);
    }

    #[test]
    fn sq_in_cmb_is_for_the_ubdirect_engine_only() {
        assert!(parse(&["00:04.0", "--sq-in-cmb"]).sq_in_cmb);
        assert!(!parse(&["00:04.0"]).sq_in_cmb);
        for engine in ["floor", "uring-iopoll", "uring-cmd"] {
            let a = parse(&["00:04.0", "--engine", engine, "--sq-in-cmb"]);
            let Err(e) = run_perf(&a) else {
                panic!("{engine}: --sq-in-cmb accepted")
            };
            let e = e.to_string();
            assert!(e.contains("--engine ubdirect"), "{engine}: {e}");
        }
    }

    #[test]
    fn one_spelling_for_sizes_offsets_and_namespaces_old_ones_still_work() {
        let a = parse(&[
            "00:04.0",
            "--ns",
            "2",
            "--offset",
            "64M",
            "--span",
            "8M",
            "-o",
            "4K",
            "--seconds",
            "1",
        ]);
        assert_eq!(
            (a.nsid, a.offset, a.span, a.io_size, a.time),
            (Some(2), Some(64 << 20), Some(8 << 20), 4096, 1.0)
        );
        let a = parse(&[
            "00:04.0",
            "--offset-mib",
            "64",
            "--span-mib",
            "8",
            "--time",
            "2",
        ]);
        assert_eq!((a.offset_mib, a.span_mib, a.time), (Some(64), Some(8), 2.0));
        let a = parse(&["00:04.0"]);
        assert_eq!((a.nsid, a.offset, a.io_size), (None, None, 4096));
        use clap::Parser;
        for bad in [
            &["perf", "00:04.0", "--offset", "1M", "--offset-mib", "1"][..],
            &["perf", "00:04.0", "--ns", "0"],
            &["perf", "00:04.0", "-o", "0"],
        ] {
            let e = crate::cli::Cli::try_parse_from(["ubdirect"].iter().chain(bad).copied())
                .unwrap_err();
            assert_eq!(e.exit_code(), 2, "{bad:?}");
        }
    }

    #[test]
    fn engines_parse_and_other_engines_refuse_what_they_cannot_do() {
        assert_eq!(parse(&["00:04.0"]).engine, Engine::Ubdirect);
        assert_eq!(
            parse(&["00:04.0", "--engine", "floor"]).engine,
            Engine::Floor
        );
        assert_eq!(
            parse(&["00:04.0", "--engine", "uring-iopoll"]).engine,
            Engine::UringIopoll
        );
        assert_eq!(
            parse(&["00:04.0", "--engine", "uring-cmd"]).engine,
            Engine::UringCmd
        );
        let a = parse(&["00:04.0", "--engine", "floor", "-c", "0"]);
        assert_eq!(single_core_randread(&a), Ok(0));
        let a = parse(&["00:04.0", "--engine", "floor", "-w", "randwrite"]);
        let e = single_core_randread(&a).unwrap_err();
        assert!(e.contains("-w randread"), "{e}");
        let a = parse(&["00:04.0", "--engine", "floor", "-c", "0,1"]);
        let e = single_core_randread(&a).unwrap_err();
        assert!(e.contains("one core"), "{e}");
    }

    #[test]
    fn an_engine_report_is_valid_json_of_the_documented_schema() {
        let tsc = Tsc { hz: 2.0e9 };
        let mut hist = LatencyHistogram::new();
        for t in [40_000u64, 50_000, 60_000] {
            hist.record(t);
        }
        let mut core = plain_core(plain(0, 3, 1.0, (1, 3)), hist, &tsc);
        core.queue_depth = 1;
        assert_eq!(core.iops, 3.0);
        assert!((core.sq_doorbell_writes_per_io - 1.0 / 3.0).abs() < 1e-9);
        assert!(
            (core.latency_ns.p50 - 25_000.0).abs() < 1_000.0,
            "{:?}",
            core.latency_ns
        );
        // 20, 25, 30 us: standard deviation 4.08 us, p99.99 the largest (bucket error < 3.2 %).
        let sd = core.latency_ns.stddev.unwrap();
        assert!((sd - 4_082.0).abs() < 200.0, "{:?}", core.latency_ns);
        let p9999 = core.latency_ns.p9999.unwrap();
        assert!((p9999 - 30_000.0).abs() < 1_000.0, "{:?}", core.latency_ns);
        let mut cores = [core];
        fill_windows(&mut cores, &tsc);
        // 3 IOPS at QD1 with a 25 us mean: 75 us of each second inside the window.
        assert!((cores[0].window_fraction - 75e-6).abs() < 1e-6);
        let total = summarize(&cores, &tsc, 4096);
        assert_eq!((total.read.ios, total.write.ios), (3, 0));
        assert!((total.read.window_fraction - total.window_fraction).abs() < 1e-12);
        assert!((total.outside_window_ns_per_io - (1e9 / 3.0 - 25_000.0)).abs() < 1_000.0);
        for engine in ["floor", "uring-iopoll", "uring-cmd", "ubdirect"] {
            let args = parse(&["00:04.0", "--engine", engine, "-o", "4K", "-q", "32"]);
            let report = PerfReport {
                address: &args.addr,
                engine: args.engine,
                nsid: 1,
                workload: args.workload,
                rwmixread: args.rwmixread,
                io_size: args.io_size,
                queue_depth: args.queue_depth,
                effective_queue_depth: args.queue_depth,
                shadow_doorbells: false,
                shadow_doorbells_mode: "auto",
                shadow_doorbells_why: "auto: EventIdx saved 0 of 300 doorbell MMIO writes".into(),
                sq_in_cmb: engine == "ubdirect",
                tsc_hz: tsc.hz,
                warmup_seconds: 1.0,
                latency_histogram: Some(report::histogram(&total.hist, &tsc, engine == "floor")),
                cores: &cores,
                total: summarize(&cores, &tsc, args.io_size),
                leaks: Some(Leaks::default()),
            };
            let doc = crate::cli::json::document("perf", &report).unwrap();
            assert_eq!(doc["engine"], engine);
            assert!(doc["total"]["window_fraction"].as_f64().unwrap() > 0.0);
            assert!(doc["cores"][0]["outside_window_cycles_per_io"].is_number());
            assert!(doc["total"]["read"]["window_fraction"].is_number());
            crate::cli::json::validate(&doc).unwrap_or_else(|e| panic!("{engine}: {e}"));
        }
    }

    #[test]
    fn warmup_histogram_and_progress_parse_and_other_engines_refuse_them() {
        let a = parse(&["00:04.0", "-a", "1.5", "-LL", "--progress", "never"]);
        assert_eq!((a.warmup, a.latency_histogram), (1.5, 2));
        assert_eq!(a.progress, Progress::Never);
        assert!(!a.show_progress());
        assert_eq!(parse(&["00:04.0", "-L"]).latency_histogram, 1);
        assert!(parse(&["00:04.0", "--progress", "always"]).show_progress());
        // auto: never with --json.
        assert!(!parse(&["00:04.0", "--json"]).show_progress());
        for bad in [
            &["00:04.0", "--engine", "floor", "-a", "1"][..],
            &["00:04.0", "--engine", "uring-iopoll", "-L"],
            &["nvmf-tcp://127.0.0.1:4420/nqn.x", "-a", "1"],
            &["00:04.0", "--warmup=-1"],
        ] {
            let Err(e) = run(&parse(bad)) else {
                panic!("{bad:?} accepted")
            };
            let e = e.to_string();
            assert!(e.contains("-a"), "{bad:?}: {e}");
        }
    }

    #[test]
    fn a_zoned_namespace_takes_reads_and_refuses_writes_before_the_run() {
        for w in [Workload::Read, Workload::Randread] {
            assert_eq!(check_command_set(w, 1, CommandSet::Zoned), Ok(()));
        }
        for w in [Workload::Write, Workload::Randwrite, Workload::Rw] {
            let e = check_command_set(w, 2, CommandSet::Zoned).unwrap_err();
            assert!(e.contains("namespace 2 is a zoned namespace"), "{e}");
            assert_eq!(check_command_set(w, 2, CommandSet::Nvm), Ok(()));
        }
        let e = check_command_set(Workload::Read, 3, CommandSet::KeyValue).unwrap_err();
        assert!(e.contains("Key Value command set"), "{e}");
    }

    /// A -w rw run's report: reads and writes apart, each core's and the total's; the
    /// histogram counts every I/O.
    #[test]
    fn rw_report_splits_directions_and_the_histogram_sums_to_the_ios() {
        let tsc = Tsc { hz: 1.0e9 };
        let core = |n: usize, r: u64, w: u64| {
            let (mut hr, mut hw) = (LatencyHistogram::new(), LatencyHistogram::new());
            (0..r).for_each(|i| hr.record(10_000 + i));
            (0..w).for_each(|i| hw.record(50_000 + i));
            let mut c = plain_core(plain(n, r + w, 2.0, (0, 0)), LatencyHistogram::new(), &tsc);
            c.read = direction(&hr, 2.0, 4096, &tsc);
            c.write = direction(&hw, 2.0, 4096, &tsc);
            (c.hist_read, c.hist_write) = (hr, hw);
            c
        };
        let cores = [core(0, 600, 200), core(1, 400, 800)];
        let t = summarize(&cores, &tsc, 4096);
        assert_eq!((t.read.ios, t.write.ios), (1000, 1000));
        assert_eq!((t.read.iops, t.write.iops), (500.0, 500.0));
        assert!(t.read.latency_ns.p99 < 11_000.0, "{:?}", t.read.latency_ns);
        assert!(
            t.write.latency_ns.p50 > 48_000.0,
            "{:?}",
            t.write.latency_ns
        );
        let h = report::histogram(&t.hist, &tsc, false);
        assert_eq!(h.rows.iter().map(|r| r.count).sum::<u64>(), 2000);
    }

    /// The table says the window and the time outside it; per direction with -w rw.
    #[test]
    fn the_window_line_gives_the_fraction_and_the_time_outside() {
        let tsc = Tsc { hz: 1.0e9 };
        let mut hist = LatencyHistogram::new();
        (0..27).for_each(|_| hist.record(31_600));
        let mut cores = [plain_core(plain(0, 27, 0.001, (0, 0)), hist, &tsc)];
        cores[0].queue_depth = 1;
        fill_windows(&mut cores, &tsc);
        let t = summarize(&cores, &tsc, 4096);
        let l = window_line(&t, false);
        assert!(l.contains("depth 0.853;"), "{l}");
        assert!(l.contains("5437 cycles (5437 ns)"), "{l}");
        assert!(window_line(&t, true).contains("(reads 0.853, writes 0.000)"));
    }

    #[test]
    fn core_lists_and_masks() {
        assert_eq!(parse_cores("0").unwrap().0, vec![0]);
        assert_eq!(parse_cores("0,2").unwrap().0, vec![0, 2]);
        assert_eq!(parse_cores("0x5").unwrap().0, vec![0, 2]);
        assert!(parse_cores("0x0").is_err());
        assert!(parse_cores("a").is_err());
    }
}
