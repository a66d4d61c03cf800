//! `ubdirect pipeline`: stream a source (NVMe namespace through vfio, or a file through
//! io_uring) through the unified buffer pool into a sink (CUDA, a device BAR, null).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use ubdirect::pipeline::{
    compare, file_checksum, numa_node_of_cpu, pin_to_core, queue_checksum, run_copy, run_direct,
    run_direct_watching, run_sink_only, BarSink, CudaSinks, DmaFaultWatch, Limit, Mode, NullSink,
    PipelineConfig, PipelineReport, PipelineSink,
};
use ubdirect_core::seams::BlockQueue;
use ubdirect_core::{DmaDomain, PciAddress, PciDevice, PoolConfig, UbPool, UbRegion, UbRegistry};

use super::units::{parse_offset, parse_size};
use super::{CliResult, Outcome};

/// Stream a source through the UB pool into a sink on one pinned polling thread, and report
/// GB/s, IOPS, CPU time per GB and per-block latency. Examples:
///   ubdirect pipeline --source nvme:0000:00:04.0 --sink cuda --verify --bytes 1G
///   ubdirect pipeline --source file:/dev/shm/data --sink cuda:0 --mode copy
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub(super) noiommu: super::noiommu_arg::NoIommuArg,
    /// nvme:<pci-addr> (bound to vfio-pci; --ns picks the namespace) or file:<path> (io_uring).
    #[arg(long, value_parser = parse_source)]
    source: SourceSpec,
    /// Namespace id of an nvme: source (default: the first active one).
    #[arg(long = "ns", value_name = "NSID", value_parser = clap::value_parser!(u32).range(1..))]
    ns: Option<u32>,
    /// cuda[:gpu[,gpu...]] | cuda:all | bar:<pci-addr>/<bar> | null. Several GPUs: blocks are
    /// striped over them round-robin, each GPU with its own streams and events.
    #[arg(long, default_value = "null", value_parser = parse_sink)]
    sink: SinkSpec,
    /// Bytes per block (K/M/G suffixes; > 256 KiB suits storage).
    #[arg(long, default_value = "4M", value_parser = parse_size)]
    block_size: u64,
    /// Source requests kept in flight (queue depth).
    #[arg(short = 'q', long = "queue-depth", alias = "qd", default_value_t = 32)]
    qd: usize,
    /// Pool size in bytes (default: block size x block count).
    #[arg(long, value_parser = parse_size)]
    pool_size: Option<u64>,
    /// Pool block count (default: 2 x qd, or what --pool-size holds).
    #[arg(long)]
    blocks: Option<usize>,
    /// Bytes to move (default: the whole source once).
    #[arg(long, value_parser = parse_size, conflicts_with = "seconds")]
    bytes: Option<u64>,
    /// Where in the source to start, in bytes (K/M/G suffixes; logical-block aligned).
    #[arg(long = "offset", alias = "start", default_value = "0", value_parser = parse_offset)]
    start: u64,
    /// Run this many seconds instead (wrapping around the source).
    #[arg(long)]
    seconds: Option<f64>,
    /// Pin the polling thread to this CPU.
    #[arg(long)]
    core: Option<usize>,
    /// Check that what arrived equals the source bytes.
    #[arg(long)]
    verify: bool,
    /// direct (UB pool, zero copies) or copy (read() + pageable copy, for A/B).
    #[arg(long, default_value = "direct", value_parser = parse_mode)]
    mode: Mode,
    /// JSON on stdout instead of text.
    #[arg(long)]
    json: bool,
    /// Also measure the segments alone: source -> null, pool -> sink.
    #[arg(long)]
    segments: bool,
    /// CUDA copy streams.
    #[arg(long, default_value_t = 4)]
    streams: usize,
    /// File sources: mapped (the page cache mapped read-only and registered once with CUDA;
    /// the copy engines read it in place), direct (O_DIRECT into the UB pool), buffered
    /// (io_uring page-cache reads into the UB pool), auto (mapped when the file is >= 90% in
    /// the page cache and the sink is CUDA in direct mode; otherwise O_DIRECT, buffered for
    /// tmpfs or when refused).
    #[arg(long, default_value = "auto", value_parser = ["auto", "mapped", "direct", "buffered"])]
    io: String,
    /// --io mapped: most bytes of file mappings kept registered (default: half the RAM).
    #[arg(long, value_parser = parse_size)]
    map_cap: Option<u64>,
    /// --io mapped: bytes per GPU copy out of the registered page cache (K/M/G suffixes; a
    /// multiple of 4K; default 64M, or the whole file when smaller). Independent of
    /// --block-size; the H2D ceiling of --segments copies this size too.
    #[arg(long, value_parser = parse_size)]
    copy_size: Option<u64>,
    /// --io mapped: bytes per registered window, a multiple of the copy size (default: the
    /// largest multiple up to 256M).
    #[arg(long, value_parser = parse_size)]
    map_window: Option<u64>,
    /// --io mapped: threads registering windows ahead of the copies (default 2).
    #[arg(long)]
    register_threads: Option<usize>,
    /// --io mapped: fault each window's page tables in before registering it
    /// (MADV_POPULATE_READ; default: with two or more registration threads).
    #[arg(long, hide = true, action = clap::ArgAction::Set)]
    map_populate: Option<bool>,
    /// Run the measured pass this many times in one process (registered file windows are
    /// reused by the later runs).
    #[arg(long, default_value_t = 1)]
    repeat: usize,
    /// File sources: punt reads to io-wq workers (spreads page-cache copies over cores):
    /// auto (on for buffered), on, off.
    #[arg(long, default_value = "auto", value_parser = ["auto", "on", "off"])]
    uring_async: String,
    /// File sources: when the source has nothing ready, sleep in the kernel up to this many
    /// microseconds for a completion instead of spinning (default: 1000 for O_DIRECT, 0 =
    /// spin for buffered).
    #[arg(long)]
    uring_idle_wait_us: Option<u64>,
    /// File sources: cap on io-wq workers.
    #[arg(long)]
    uring_workers: Option<u32>,
    /// File sources: kernel SQ polling thread (idle ms).
    #[arg(long)]
    sqpoll: Option<u32>,
    /// Print UBD-HOSTCHECK lines NAME,SOURCE_FILE,BAR_FILE comparing BAR blocks with the
    /// source's backing file (test bed only: hidden from --help).
    #[arg(long, hide = true)]
    hostcheck: Option<String>,
}

/// Where the data comes from.
#[derive(Debug, Clone)]
enum SourceSpec {
    Nvme {
        addr: PciAddress,
        nsid: Option<u32>,
    },
    File(PathBuf),
    /// nvmf-tcp://ADDR:PORT/SUBNQN[/NSID].
    Tcp(String),
}

/// Where it goes.
#[derive(Debug, Clone)]
enum SinkSpec {
    /// GPU ordinals (empty = every GPU the driver sees).
    Cuda(Vec<usize>),
    Bar {
        addr: PciAddress,
        bar: u8,
    },
    Null,
}

fn parse_source(s: &str) -> Result<SourceSpec, String> {
    if s.starts_with("nvmf-tcp://") {
        return super::nvmf::parse_ctrl_addr(s).map(SourceSpec::Tcp);
    }
    if let Some(rest) = s.strip_prefix("nvme:") {
        let (addr, nsid) = match rest.rsplit_once('/') {
            Some((a, n)) => (
                a,
                Some(n.parse::<u32>().map_err(|_| {
                    format!("bad namespace id '{n}' in '{s}': name the namespace with --ns <nsid>")
                })?),
            ),
            None => (rest, None),
        };
        if nsid == Some(0) {
            return Err("namespace ids start at 1".into());
        }
        let addr = addr
            .parse::<PciAddress>()
            .map_err(|e| format!("bad PCI address in '{s}': {e} (e.g. nvme:0000:00:04.0)"))?;
        return Ok(SourceSpec::Nvme { addr, nsid });
    }
    if let Some(p) = s.strip_prefix("file:") {
        if p.is_empty() {
            return Err("file: needs a path (file:/dev/shm/data)".into());
        }
        return Ok(SourceSpec::File(PathBuf::from(p)));
    }
    Err(format!(
        "unknown source '{s}': use nvme:<pci-addr> (with --ns <nsid>), file:<path> or nvmf-tcp://ADDR:PORT/SUBNQN[/NSID]"
    ))
}

fn parse_sink(s: &str) -> Result<SinkSpec, String> {
    match s {
        "null" => return Ok(SinkSpec::Null),
        "cuda" => return Ok(SinkSpec::Cuda(vec![0])),
        "cuda:all" => return Ok(SinkSpec::Cuda(Vec::new())),
        _ => {}
    }
    if let Some(n) = s.strip_prefix("cuda:") {
        let mut v = Vec::new();
        for part in n.split(',') {
            let o: usize = part.trim().parse().map_err(|_| {
                format!("bad GPU ordinal '{part}' in '{s}' (cuda:0, cuda:0,1 or cuda:all)")
            })?;
            if v.contains(&o) {
                return Err(format!("GPU {o} is listed twice in '{s}'"));
            }
            v.push(o);
        }
        return Ok(SinkSpec::Cuda(v));
    }
    if let Some(rest) = s.strip_prefix("bar:") {
        let (a, b) = rest
            .rsplit_once('/')
            .ok_or_else(|| format!("'{s}' needs a BAR number: bar:<pci-addr>/<bar>"))?;
        let bar: u8 = b
            .parse()
            .ok()
            .filter(|&b| b < 6)
            .ok_or_else(|| format!("BAR '{b}' must be 0..5"))?;
        let addr = a
            .parse::<PciAddress>()
            .map_err(|e| format!("bad PCI address in '{s}': {e}"))?;
        return Ok(SinkSpec::Bar { addr, bar });
    }
    Err(format!(
        "unknown sink '{s}': use cuda[:gpu[,gpu...]], cuda:all, bar:<pci-addr>/<bar> or null"
    ))
}

fn parse_mode(s: &str) -> Result<Mode, String> {
    match s {
        "direct" => Ok(Mode::Direct),
        "copy" => Ok(Mode::Copy),
        _ => Err(format!("unknown mode '{s}': direct or copy")),
    }
}

type BoxErr = Box<dyn std::error::Error + Send + Sync>;

/// What a run hands back besides its result: its reports and the device's NUMA node.
struct Outputs {
    reports: Vec<PipelineReport>,
    numa: Option<u32>,
}

mod mapped;
mod tcp;

/// Run the subcommand; then fail (exit 1) if the kernel logged an IOMMU fault for one of its
/// VFIO devices during the run, whatever the run itself reported.
pub fn run(args: &Args) -> CliResult {
    let mut devices = Vec::new();
    if let SourceSpec::Nvme { addr, .. } = &args.source {
        devices.push(*addr);
    }
    if let SinkSpec::Bar { addr, .. } = &args.sink {
        devices.push(*addr);
    }
    let watch = DmaFaultWatch::start(&devices);
    let r = run_pipeline(args);
    match (watch.finish(), r) {
        (Ok(()), r) => r,
        (Err(f), Ok(_)) => Err(f.into()),
        (Err(f), Err(e)) => Err(format!("{e}\n{f}").into()),
    }
}

/// The run itself.
fn run_pipeline(args: &Args) -> CliResult {
    let bs = usize::try_from(args.block_size).map_err(|_| "block size too large")?;
    if args.qd == 0 {
        return Err("--queue-depth must be at least 1".into());
    }
    let blocks = match (args.blocks, args.pool_size) {
        (Some(b), _) => b,
        (None, Some(p)) => usize::try_from(p / args.block_size).unwrap_or(0),
        (None, None) => args.qd * 2,
    };
    if blocks == 0 {
        return Err(format!(
            "the pool holds no block: --pool-size must be at least --block-size ({bs})"
        )
        .into());
    }
    if args.ns.is_some() && matches!(args.source, SourceSpec::File(_)) {
        return Err("--ns names a namespace of an nvme: source; a file: source has none".into());
    }
    if args.mode == Mode::Copy && !matches!(args.source, SourceSpec::File(_)) {
        return Err("--mode copy is the classic read() path: it needs a file: source".into());
    }
    if args.mode == Mode::Copy && matches!(args.sink, SinkSpec::Bar { .. }) {
        return Err("--mode copy has no BAR variant: a BAR is reached by DMA only".into());
    }
    if mapped::flags_given(args)
        && (!matches!(args.source, SourceSpec::File(_))
            || matches!(args.io.as_str(), "direct" | "buffered"))
    {
        return Err("--copy-size, --map-window and --register-threads set up --io mapped (a file: source, --io mapped or auto); this run reads into the UB pool in --block-size blocks".into());
    }
    if let Some(core) = args.core {
        pin_to_core(core)?;
    }

    // The DMA domain: a real VFIO container when a device is involved, host-only otherwise.
    let needs_vfio =
        matches!(args.source, SourceSpec::Nvme { .. }) || matches!(args.sink, SinkSpec::Bar { .. });
    let domain = if needs_vfio {
        args.noiommu.domain()?
    } else {
        DmaDomain::host_only()
    };
    let registry = UbRegistry::new(domain);

    // The pool: carved from the BAR for the BAR sink (the source DMAs straight into it),
    // hugepages otherwise (ordinary memory, with a warning, when there are none).
    let mut device_numa = None;
    // Devices join the domain before any memory is mapped into it (VFIO sets the IOMMU up when
    // the first group is attached): the NVMe controller first, then the BAR, then the pool.
    let ctrl = match &args.source {
        SourceSpec::Nvme { addr, .. } => {
            let c = ubdirect_nvme::Controller::open(
                &registry,
                *addr,
                ubdirect_nvme::ControllerOptions {
                    io_queues: 1,
                    ..Default::default()
                },
            )?;
            device_numa = c.device().numa_node();
            Some(c)
        }
        SourceSpec::File(_) | SourceSpec::Tcp(_) => None,
    };
    let mut bar_dev: Option<Arc<PciDevice>> = None;
    let bar_region: Option<Arc<UbRegion>> = match &args.sink {
        SinkSpec::Bar { addr, bar } => {
            let dev = PciDevice::open(registry.domain(), *addr)?;
            device_numa = device_numa.or(dev.numa_node());
            let region = registry.register_bar(&dev, *bar)?;
            bar_dev = Some(dev);
            Some(region)
        }
        _ => None,
    };
    let make_pool = || -> Result<Arc<UbPool>, BoxErr> {
        Ok(match &bar_region {
            Some(r) => {
                let fit = r.len / bs;
                if fit == 0 {
                    return Err(format!(
                    "BAR window of {} bytes cannot hold one {bs}-byte block: lower --block-size",
                    r.len
                )
                    .into());
                }
                UbPool::new(
                    &registry,
                    r.clone(),
                    PoolConfig {
                        block_size: bs,
                        block_count: blocks.min(fit),
                    },
                )?
            }
            None => host_pool(&registry, bs, blocks, needs_vfio)?,
        })
    };
    let cfg = PipelineConfig {
        block_size: bs,
        qd: args.qd,
        limit: Limit::Bytes(0), // set once the source's size is known
        verify: args.verify,
        progress: !args.json,
        stall_timeout: Duration::from_secs(30),
        start: args.start,
        mapped: mapped::options(args),
    };

    let mut reports = Vec::new();
    match &args.source {
        SourceSpec::Tcp(addr) => {
            let pool = make_pool()?;
            let r = tcp::run(
                args,
                addr,
                &registry,
                &pool,
                bar_region.as_ref(),
                bar_dev.as_ref(),
                cfg,
                &mut device_numa,
            )?;
            reports.push(r);
        }
        SourceSpec::File(path) => {
            let is_cuda = matches!(args.sink, SinkSpec::Cuda(_));
            if args.repeat == 0 {
                return Err("--repeat must be at least 1".into());
            }
            if args.repeat > 1 && args.verify {
                return Err("--verify checks one run: drop --repeat".into());
            }
            if args.io == "mapped" && !(is_cuda && args.mode == Mode::Direct) {
                return Err("--io mapped hands registered page cache to the GPU copy engines: it needs --sink cuda[...] and --mode direct (use --io buffered or direct otherwise)".into());
            }
            let file = std::fs::File::open(path)
                .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
            let size = file.metadata()?.len();
            let mapped = match args.io.as_str() {
                "mapped" => Some(resident(&file, args, size)),
                "auto" if is_cuda && args.mode == Mode::Direct => {
                    let r = resident(&file, args, size);
                    (r >= AUTO_MAPPED_RESIDENT).then_some(r)
                }
                _ => None,
            };
            if let Some(resident) = mapped {
                drop(file);
                let limit = limit(args, size)?;
                let mut out = Outputs {
                    reports: Vec::new(),
                    numa: device_numa,
                };
                mapped::run(
                    args,
                    path,
                    resident,
                    &registry,
                    PipelineConfig { limit, ..cfg },
                    &mut out,
                )?;
                reports.extend(out.reports);
            } else {
                if mapped::flags_given(args) {
                    tracing::warn!("--io auto reads this file into the UB pool (less than {:.0}% of it is in the page cache): --copy-size, --map-window and --register-threads do not apply", AUTO_MAPPED_RESIDENT * 100.0);
                }
                let pool = make_pool()?;
                file_uring(
                    args,
                    path,
                    &pool,
                    bar_region.as_ref(),
                    cfg,
                    &mut device_numa,
                    &mut reports,
                )?;
            }
        }
        SourceSpec::Nvme { addr, nsid } => {
            let pool = make_pool()?;
            let ctrl = ctrl.as_ref().ok_or("NVMe controller not opened")?;
            let nsid = super::namespace::merge(args.ns, *nsid)?;
            let ns = super::namespace::pick(ctrl, &addr.to_string(), nsid)?;
            let qopts = ubdirect_nvme::QueueOptions {
                depth: (args.qd * 4).max(64),
                nsid: Some(ns.nsid),
                // A timeout or a controller reset under the run resets the controller and
                // submits the reads in flight again: no block is lost.
                recovery: ubdirect_nvme::Recovery::Requeue,
                ..Default::default()
            };
            let mut q = ubdirect_nvme::IoQueuePair::new(ctrl, qopts)?;
            let cap = q.capacity();
            let cfg = PipelineConfig {
                limit: limit(args, cap)?,
                ..cfg
            };
            let name = format!("nvme:{addr}/{} (vfio)", q.default_nsid());
            let mut sink = make_sink(args, &pool, bar_region.as_ref(), cap, &mut device_numa)?;
            warn_numa(args.core, device_numa);
            if args.segments {
                // The sink alone makes no sense for the BAR sink: only the source writes a BAR.
                let sink_alone = bar_region.is_none();
                let seg = segments(&mut q, sink.as_mut(), &pool, &cfg, &name, sink_alone)?;
                reports.extend(seg);
                if sink_alone {
                    // The sink-alone segment fed this sink: a fresh one for the verified run.
                    drop(sink);
                    sink = make_sink(args, &pool, bar_region.as_ref(), cap, &mut device_numa)?;
                }
            }
            // A hot-unplug of the controller or the BAR device ends the run with a typed error
            // (checked every 100 ms) instead of blocking the kernel's removal until exit.
            let mut watched = vec![ctrl.device().clone()];
            watched.extend(bar_dev.iter().cloned());
            for d in &watched {
                d.enable_removal_notice()?;
            }
            let reset_hook = super::fault_hook::arm(ctrl.device());
            let mut r = run_direct_watching(
                &mut q,
                sink.as_mut(),
                &pool,
                &cfg,
                "pipeline",
                &name,
                &watched,
            )?;
            if args.verify {
                // A second pass through the driver at QD1 into a host buffer is the reference.
                let ref_pool = host_pool(&registry, bs.min(q.max_transfer()), 1, true)?;
                let expected = queue_checksum(&mut q, &ref_pool, args.start, r.bytes)?;
                add_verify(
                    &mut r,
                    sink.as_mut(),
                    expected,
                    "sink checksum vs a QD1 re-read",
                )?;
            }
            if let Some(hc) = &args.hostcheck {
                print_hostchecks(hc, sink.as_ref())?;
            }
            drop(reset_hook);
            if ctrl.resets() > 0 {
                eprintln!(
                    "ubdirect pipeline: NVMe controller {addr} was reset {} time(s) during the run; the reads in flight were submitted again (requeued commands: {})",
                    ctrl.resets(),
                    q.stats().requeued
                );
            }
            reports.push(r);
        }
    }

    if args.json {
        super::pipeline_json::print(&reports)?;
    } else {
        for r in &reports {
            println!("{r}");
        }
    }
    match reports.last().and_then(|r| r.verify.as_ref()) {
        Some(v) if !v.ok => Err(format!(
            "verify failed: delivered {} expected {}",
            v.delivered, v.expected
        )
        .into()),
        _ => Ok(Outcome::Success),
    }
}

/// Page-cache residency above which `--io auto` maps the file instead of reading it.
const AUTO_MAPPED_RESIDENT: f64 = 0.9;

/// Fraction of the range the run reads that is in the page cache (0 when it cannot be told).
fn resident(file: &std::fs::File, args: &Args, size: u64) -> f64 {
    let start = args.start.min(size);
    let len = args.bytes.unwrap_or(u64::MAX).min(size - start);
    ubdirect_cuda::resident_fraction(file, start, len).unwrap_or(0.0)
}

/// `--map-cap`, or half the RAM (MemTotal / 2), or 16 GiB when /proc/meminfo says nothing.
fn map_cap(args: &Args) -> u64 {
    args.map_cap.unwrap_or_else(|| {
        std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|m| {
                m.lines()
                    .find(|l| l.starts_with("MemTotal:"))
                    .and_then(|l| l.split_whitespace().nth(1))
                    .and_then(|kb| kb.parse::<u64>().ok())
            })
            .map(|kb| kb * 1024 / 2)
            .unwrap_or(16 << 30)
    })
}

/// The file source through io_uring into the UB pool (`--io direct|buffered`, auto's fallback).
#[allow(clippy::too_many_arguments)]
fn file_uring(
    args: &Args,
    path: &std::path::Path,
    pool: &Arc<UbPool>,
    bar_region: Option<&Arc<UbRegion>>,
    cfg: PipelineConfig,
    device_numa: &mut Option<u32>,
    reports: &mut Vec<PipelineReport>,
) -> Result<(), BoxErr> {
    let opts = ubdirect_uring::UringOptions {
        direct: match args.io.as_str() {
            "direct" => ubdirect_uring::DirectMode::Require,
            "buffered" => ubdirect_uring::DirectMode::Off,
            _ => ubdirect_uring::DirectMode::Auto,
        },
        depth: args.qd,
        sqpoll_idle_ms: args.sqpoll,
        force_async: match args.uring_async.as_str() {
            "on" => Some(true),
            "off" => Some(false),
            _ => None,
        },
        max_workers: args.uring_workers,
        // io-wq workers everywhere but the polling core.
        iowq_cpus: args
            .core
            .map(|c| online_cpus().into_iter().filter(|&x| x != c).collect()),
        writable: false,
        idle_wait: args
            .uring_idle_wait_us
            .map(std::time::Duration::from_micros),
    };
    let mut q = ubdirect_uring::UringQueue::open(path, &[pool.region().clone()], &opts)?;
    let cap = q.capacity();
    let cfg = PipelineConfig {
        limit: limit(args, cap)?,
        ..cfg
    };
    let name = format!(
        "file:{} (io_uring, {}{})",
        path.display(),
        if q.is_direct() {
            "O_DIRECT"
        } else {
            "buffered"
        },
        if q.is_async() { ", io-wq" } else { "" }
    );
    let mut sink = make_sink(args, pool, bar_region, cap, device_numa)?;
    warn_numa(args.core, *device_numa);
    if args.segments {
        let seg = segments(&mut q, sink.as_mut(), pool, &cfg, &name, true)?;
        reports.extend(seg);
        // The sink-alone segment fed this sink: a fresh one for the verified run
        // (the old one released first: a CUDA sink registers the pool with the GPU).
        drop(sink);
        sink = make_sink(args, pool, bar_region, cap, device_numa)?;
    }
    for i in 0..args.repeat {
        let label = if args.repeat > 1 {
            format!("pipeline (run {}/{})", i + 1, args.repeat)
        } else {
            "pipeline".to_string()
        };
        let mut r = match args.mode {
            Mode::Direct => run_direct(&mut q, sink.as_mut(), pool, &cfg, &label, &name)?,
            Mode::Copy => run_copy(
                path,
                sink.as_mut(),
                &cfg,
                &format!("{label} (classic copy)"),
            )?,
        };
        if args.verify {
            let expected = file_checksum(path, args.start, r.bytes)?;
            add_verify(
                &mut r,
                sink.as_mut(),
                expected,
                "sink checksum vs read() of the file",
            )?;
        }
        reports.push(r);
    }
    Ok(())
}

/// `--segments`: the source alone into a null sink, then (with `sink_alone`) the sink alone,
/// both unverified.
fn segments<Q: BlockQueue + ?Sized>(
    q: &mut Q,
    sink: &mut dyn PipelineSink,
    pool: &Arc<UbPool>,
    cfg: &PipelineConfig,
    name: &str,
    sink_alone: bool,
) -> Result<Vec<PipelineReport>, BoxErr> {
    let mut null = NullSink::new(pool.block_count(), false);
    let c = PipelineConfig {
        verify: false,
        ..cfg.clone()
    };
    let mut out = vec![run_direct(
        q,
        &mut null,
        pool,
        &c,
        "segment: source -> UB (sink null)",
        name,
    )?];
    if sink_alone {
        out.push(run_sink_only(
            sink,
            pool,
            &c,
            "segment: UB -> sink (no source)",
        )?);
    }
    Ok(out)
}

/// Online CPUs from sysfs ("0-15,32-47").
fn online_cpus() -> Vec<usize> {
    let s = std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap_or_default();
    let mut v = Vec::new();
    for part in s.trim().split(',').filter(|p| !p.is_empty()) {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        if let (Ok(a), Ok(b)) = (a.parse::<usize>(), b.parse::<usize>()) {
            v.extend(a..=b);
        }
    }
    v
}

fn limit(args: &Args, cap: u64) -> Result<Limit, BoxErr> {
    Ok(match (args.bytes, args.seconds) {
        (Some(b), _) => Limit::Bytes(b),
        (None, Some(s)) if s > 0.0 && s.is_finite() => Limit::Duration(Duration::from_secs_f64(s)),
        (None, Some(s)) => return Err(format!("--seconds {s} must be a positive number").into()),
        (None, None) => Limit::Bytes(cap.saturating_sub(args.start).max(1)),
    })
}

/// A pool over hugepages, or ordinary memory when no hugepages are free and no device DMAs.
fn host_pool(
    registry: &Arc<UbRegistry>,
    bs: usize,
    blocks: usize,
    for_device: bool,
) -> Result<Arc<UbPool>, BoxErr> {
    let cfg = PoolConfig {
        block_size: bs,
        block_count: blocks,
    };
    match UbPool::with_hugepages(registry, cfg, None) {
        Ok(p) => Ok(p),
        Err(e) if !for_device => {
            tracing::info!("no hugepage pool ({e}); using ordinary memory for the kernel path");
            Ok(UbPool::with_anonymous(registry, cfg, None)?)
        }
        Err(e) => Err(e.into()),
    }
}

fn make_sink(
    args: &Args,
    pool: &Arc<UbPool>,
    bar: Option<&Arc<UbRegion>>,
    cap: u64,
    numa: &mut Option<u32>,
) -> Result<Box<dyn PipelineSink>, BoxErr> {
    Ok(match &args.sink {
        SinkSpec::Null => Box::new(NullSink::new(pool.block_count(), args.verify)),
        SinkSpec::Bar { .. } => {
            let region = bar.ok_or("BAR sink without a BAR region")?.clone();
            Box::new(BarSink::new(
                region,
                pool.block_size(),
                args.start,
                cap.saturating_sub(args.start),
                args.verify,
            ))
        }
        SinkSpec::Cuda(_) => Box::new(make_cuda_sinks(
            args,
            Some(pool.region()),
            pool.block_size(),
            pool.block_count(),
            numa,
        )?),
    })
}

/// The GPU ordinals of `--sink cuda...` (`cuda:all`: every GPU the driver sees).
fn cuda_ordinals(args: &Args) -> Result<Vec<usize>, BoxErr> {
    match &args.sink {
        SinkSpec::Cuda(v) if !v.is_empty() => Ok(v.clone()),
        SinkSpec::Cuda(_) => {
            ubdirect_cuda::driver_available()?;
            let n = ubdirect_cuda::CudaGpu::count();
            if n == 0 {
                return Err("cuda:all: the driver sees no GPU".into());
            }
            Ok((0..n).collect())
        }
        _ => Err("not a CUDA sink".into()),
    }
}

/// One CUDA sink per GPU of `--sink`, `depth` copies of up to `slot` bytes each; `region` (the
/// pool's memory) is registered once (PORTABLE: every GPU's context sees it as pinned).
fn make_cuda_sinks(
    args: &Args,
    region: Option<&Arc<UbRegion>>,
    slot: usize,
    depth: usize,
    numa: &mut Option<u32>,
) -> Result<CudaSinks, BoxErr> {
    let ordinals = cuda_ordinals(args)?;
    let mut sinks = Vec::with_capacity(ordinals.len());
    for (i, &ordinal) in ordinals.iter().enumerate() {
        let cfg = ubdirect_cuda::CudaSinkConfig {
            ordinal,
            streams: args.streams.max(1),
            depth: depth.max(1),
            block_size: slot,
            verify: args.verify,
        };
        let regions: Vec<Arc<UbRegion>> = match region {
            Some(r) if i == 0 => vec![r.clone()],
            _ => Vec::new(),
        };
        let sink = ubdirect_cuda::CudaSink::new(&cfg, &regions)?;
        if i == 0 {
            *numa = numa.or(sink.gpu().numa_node());
        }
        sinks.push(sink);
    }
    Ok(CudaSinks::new(sinks, ordinals, slot))
}

fn warn_numa(core: Option<usize>, device_numa: Option<u32>) {
    if let (Some(c), Some(d)) = (core, device_numa) {
        match numa_node_of_cpu(c) {
            Some(n) if n != d => tracing::warn!("core {c} is on NUMA node {n} but the device is on node {d}: expect lower bandwidth; pick a core of node {d}"),
            _ => {}
        }
    }
}

fn add_verify(
    r: &mut PipelineReport,
    sink: &mut dyn PipelineSink,
    expected: u64,
    method: &str,
) -> Result<(), BoxErr> {
    let delivered = sink
        .delivered_checksum()
        .ok_or("this sink cannot check what it received: run without --verify")??;
    r.verify = Some(compare(method, delivered, expected));
    Ok(())
}

fn print_hostchecks(spec: &str, sink: &dyn PipelineSink) -> Result<(), BoxErr> {
    let parts: Vec<&str> = spec.split(',').collect();
    let [name, src_file, bar_file] = parts[..] else {
        return Err(format!("--hostcheck '{spec}' must be NAME,SOURCE_FILE,BAR_FILE").into());
    };
    for line in sink.hostcheck_lines(name, bar_file, src_file) {
        println!("{line}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_parse_or_say_what_is_wrong() {
        match parse_source("nvme:0000:00:04.0/2").unwrap() {
            SourceSpec::Nvme { addr, nsid } => {
                assert_eq!(addr.to_string(), "0000:00:04.0");
                assert_eq!(nsid, Some(2));
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            parse_source("nvme:00:04.0").unwrap(),
            SourceSpec::Nvme { nsid: None, .. }
        ));
        assert!(matches!(
            parse_source("file:/dev/shm/x").unwrap(),
            SourceSpec::File(_)
        ));
        assert!(parse_source("nvme:00:04.0/0")
            .unwrap_err()
            .contains("start at 1"));
        assert!(parse_source("nvme:00:04.0/x")
            .unwrap_err()
            .contains("namespace"));
        assert!(parse_source("nvme:zz").unwrap_err().contains("PCI address"));
        assert!(parse_source("file:").unwrap_err().contains("path"));
        assert!(parse_source("disk:/x")
            .unwrap_err()
            .contains("nvme:<pci-addr>"));
    }

    #[test]
    fn sinks_parse_or_say_what_is_wrong() {
        assert!(matches!(parse_sink("null").unwrap(), SinkSpec::Null));
        assert!(matches!(parse_sink("cuda").unwrap(), SinkSpec::Cuda(v) if v == [0]));
        assert!(matches!(parse_sink("cuda:3").unwrap(), SinkSpec::Cuda(v) if v == [3]));
        assert!(matches!(parse_sink("cuda:0,1").unwrap(), SinkSpec::Cuda(v) if v == [0, 1]));
        assert!(matches!(parse_sink("cuda:all").unwrap(), SinkSpec::Cuda(v) if v.is_empty()));
        assert!(parse_sink("cuda:0,0").unwrap_err().contains("twice"));
        assert!(parse_sink("cuda:0,").unwrap_err().contains("ordinal"));
        assert!(matches!(
            parse_sink("bar:00:06.0/2").unwrap(),
            SinkSpec::Bar { bar: 2, .. }
        ));
        assert!(parse_sink("cuda:x").unwrap_err().contains("ordinal"));
        assert!(parse_sink("bar:00:06.0")
            .unwrap_err()
            .contains("BAR number"));
        assert!(parse_sink("bar:00:06.0/7").unwrap_err().contains("0..5"));
        assert!(parse_sink("gpu").unwrap_err().contains("cuda[:gpu"));
    }

    fn parse(args: &[&str]) -> Args {
        use clap::Parser;
        let cli =
            crate::cli::Cli::try_parse_from(["ubdirect", "pipeline"].iter().chain(args).copied())
                .unwrap_or_else(|e| panic!("{args:?}: {e}"));
        match cli.command {
            crate::cli::Command::Pipeline(a) => a,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn one_spelling_for_offsets_depth_and_namespaces_old_ones_still_work() {
        let a = parse(&[
            "--source",
            "nvme:00:04.0",
            "--ns",
            "2",
            "--offset",
            "64M",
            "-q",
            "4",
        ]);
        assert_eq!((a.ns, a.start, a.qd), (Some(2), 64 << 20, 4));
        let a = parse(&["--source", "nvme:00:04.0/2", "--start", "1M", "--qd", "8"]);
        assert_eq!((a.start, a.qd), (1 << 20, 8));
        assert!(matches!(a.source, SourceSpec::Nvme { nsid: Some(2), .. }));
        assert!(crate::cli::namespace::merge(a.ns, Some(2)).is_ok());
    }

    #[test]
    fn modes() {
        assert!(parse_mode("fast").is_err());
        assert!(parse_mode("copy").is_ok());
    }

    fn args(extra: &[&str]) -> Args {
        #[derive(clap::Parser)]
        struct T {
            #[command(flatten)]
            a: Args,
        }
        let mut v = vec!["pipeline"];
        v.extend_from_slice(extra);
        <T as clap::Parser>::try_parse_from(v).unwrap().a
    }

    fn temp_file(tag: &str, len: usize) -> (PathBuf, String) {
        let p = std::env::temp_dir().join(format!("ubd-cli-{tag}-{}", std::process::id()));
        std::fs::write(&p, vec![7u8; len]).unwrap();
        let s = format!("file:{}", p.display());
        (p, s)
    }

    #[test]
    fn io_mapped_needs_a_cuda_sink_and_direct_mode() {
        let (p, src) = temp_file("needs", 1 << 20);
        let e = run_pipeline(&args(&[
            "--source", &src, "--sink", "null", "--io", "mapped", "--qd", "2",
        ]))
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("--io mapped") && e.contains("--sink cuda"),
            "{e}"
        );
        let e = run_pipeline(&args(&[
            "--source", &src, "--sink", "cuda", "--io", "mapped", "--mode", "copy", "--qd", "2",
        ]))
        .unwrap_err()
        .to_string();
        assert!(e.contains("--mode direct"), "{e}");
        let e = run_pipeline(&args(&[
            "--source", &src, "--sink", "cuda", "--io", "mapped", "--qd", "2", "--repeat", "2",
            "--verify",
        ]))
        .unwrap_err()
        .to_string();
        assert!(e.contains("--repeat"), "{e}");
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn mapped_settings_are_refused_with_the_flag_that_set_them() {
        let check = |extra: &[&str], size: u64, want: &[&str]| {
            let mut v = vec!["--source", "file:/dev/shm/x", "--sink", "cuda"];
            v.extend_from_slice(extra);
            let e = mapped::plan(&args(&v), size).unwrap_err().to_string();
            for w in want {
                assert!(e.contains(w), "{extra:?}: {e}");
            }
        };
        let zero = <crate::cli::Cli as clap::Parser>::try_parse_from([
            "ubdirect",
            "pipeline",
            "--source",
            "file:/x",
            "--copy-size",
            "0",
        ])
        .map(|_| ())
        .expect_err("--copy-size 0 parsed")
        .to_string();
        assert!(zero.contains("--copy-size"), "{zero}");
        check(
            &["--copy-size", "5000"],
            1 << 30,
            &["--copy-size 5000", "multiple of 4K", "use 4096 or 8192"],
        );
        check(
            &["--copy-size", "64M", "--offset", "512K"],
            1 << 20,
            &["--copy-size 67108864", "524288 bytes", "--offset 524288"],
        );
        check(
            &["--copy-size", "2M", "--map-window", "3M"],
            1 << 30,
            &["--map-window 3145728", "--copy-size"],
        );
        check(
            &["--register-threads", "0"],
            1 << 30,
            &["--register-threads 0", "1 to 64"],
        );
        check(
            &[
                "--copy-size",
                "1M",
                "--map-window",
                "64M",
                "--map-cap",
                "32M",
            ],
            1 << 30,
            &["--map-cap", "--map-window"],
        );
        check(
            &["--offset", "1M"],
            1 << 20,
            &["--offset", "nothing to stream"],
        );
        let p = mapped::plan(
            &args(&["--source", "file:/x", "--copy-size", "16M"]),
            1 << 30,
        );
        let p = p.unwrap();
        assert_eq!((p.copy_size, p.window), (16 << 20, 256 << 20));
        // Default on a small file: one copy of the whole file.
        let p = mapped::plan(&args(&["--source", "file:/x"]), 3 << 20).unwrap();
        assert_eq!((p.copy_size, p.window), (3 << 20, 3 << 20));
    }

    #[test]
    fn mapped_flags_on_a_run_that_does_not_map_are_refused() {
        let (p, src) = temp_file("notmapped", 1 << 20);
        for extra in [
            &["--io", "buffered", "--copy-size", "16M"][..],
            &["--io", "direct", "--register-threads", "2"][..],
        ] {
            let mut v = vec!["--source", &src, "--sink", "null", "--qd", "2"];
            v.extend_from_slice(extra);
            let e = run_pipeline(&args(&v)).unwrap_err().to_string();
            assert!(
                e.contains("--copy-size") && e.contains("--io mapped"),
                "{e}"
            );
        }
        let e = run_pipeline(&args(&[
            "--source",
            "nvme:0000:00:04.0",
            "--map-window",
            "64M",
        ]))
        .unwrap_err()
        .to_string();
        assert!(e.contains("--map-window"), "{e}");
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn io_mapped_without_a_driver_says_so() {
        if ubdirect_cuda::driver_available().is_ok() {
            return; // a GPU machine: the device run covers mapped mode
        }
        let (p, src) = temp_file("nodriver", 1 << 20);
        for io in ["mapped", "auto"] {
            let e = run_pipeline(&args(&[
                "--source", &src, "--sink", "cuda:0,1", "--io", io, "--qd", "2",
            ]))
            .unwrap_err()
            .to_string();
            assert!(e.contains("libcuda"), "--io {io}: {e}");
        }
        let e = run_pipeline(&args(&[
            "--source", &src, "--sink", "cuda:all", "--qd", "2",
        ]))
        .unwrap_err()
        .to_string();
        assert!(e.contains("libcuda"), "{e}");
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn online_cpu_list_parses() {
        let cpus = online_cpus();
        assert!(!cpus.is_empty());
        assert!(cpus.windows(2).all(|w| w[0] < w[1]));
    }
}
