//! `ubdirect pipeline`: stream a source (NVMe namespace through vfio, or a file through
//! io_uring) through the unified buffer pool into a sink (CUDA, a device BAR, null). The flags
//! become a [`Pipeline`] builder, which owns the run's policy; this module parses, runs the
//! builder and prints.

use std::any::Any;

use ubdirect::dma::vfio::DomainOptions;
use ubdirect::nvme::transport::tcp::addr::TcpTarget;
use ubdirect::nvme::transport::tcp::ctrl::TcpOptions;
use ubdirect::pipeline::{
    DmaFaultWatch, FileIo, HostCheck, Limit, Mode, Note, Pipeline, PipelineBuilder,
    PipelineRunError, SinkSpec, SourceSpec, UringTuning, AUTO_MAPPED_RESIDENT,
};

use super::units::{parse_offset, parse_size};
use super::{CliResult, Outcome};

mod mapped;
mod parse;

use parse::{parse_mode, parse_sink, parse_source};

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
    #[arg(long, default_value_t = ubdirect::cuda::DEFAULT_STREAMS)]
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

type BoxErr = Box<dyn std::error::Error + Send + Sync>;

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

/// The run itself: the flags as a builder, its reports printed, a failed verification an error.
fn run_pipeline(args: &Args) -> CliResult {
    let reports = builder(args)?.run().map_err(cli_error)?;
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

/// The builder the flags describe (the flags checked that only the command line has).
fn builder(args: &Args) -> Result<PipelineBuilder, BoxErr> {
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
        return Err(pool_empty(bs).into());
    }
    if args.ns.is_some() && matches!(args.source, SourceSpec::File(_)) {
        return Err("--ns names a namespace of an nvme: source; a file: source has none".into());
    }
    let mut b = Pipeline::builder()
        .source(source(args)?)
        .sink(args.sink.clone())
        .block_size(bs)
        .queue_depth(args.qd)
        .pool_blocks(blocks)
        .start(args.start)
        .verify(args.verify)
        .mode(args.mode)
        .segments(args.segments)
        .cuda_streams(args.streams)
        .file_io(file_io(&args.io))
        .mapped(mapped::settings(args))
        .uring(uring(args))
        .repeat(args.repeat)
        .progress(!args.json)
        .domain_options(DomainOptions {
            allow_noiommu: args.noiommu.allow_noiommu,
            ..Default::default()
        })
        .before_run(Box::new(|d| {
            super::fault_hook::arm(d).map(|h| Box::new(h) as Box<dyn Any>)
        }))
        .on_note(print_note);
    if let Some(l) = limit(args)? {
        b = b.limit(l);
    }
    if let Some(core) = args.core {
        b = b.core(core);
    }
    if let SourceSpec::Tcp { .. } = args.source {
        let opts = super::nvmf::with_auth(TcpOptions::default())?;
        b = b.tcp(opts, super::nvmf::host_identity());
    }
    if let Some(hc) = &args.hostcheck {
        b = b.hostcheck(hostcheck(hc)?);
    }
    Ok(b)
}

/// The source with `--ns` merged into the namespace its name may carry.
fn source(args: &Args) -> Result<SourceSpec, BoxErr> {
    Ok(match &args.source {
        SourceSpec::Nvme { addr, nsid } => SourceSpec::Nvme {
            addr: *addr,
            nsid: super::namespace::merge(args.ns, *nsid)?,
        },
        SourceSpec::Tcp { addr, .. } => {
            let target: TcpTarget = addr.parse()?;
            SourceSpec::Tcp {
                addr: addr.clone(),
                nsid: super::namespace::merge(args.ns, target.nsid)?,
            }
        }
        other => other.clone(),
    })
}

/// The message of a pool that holds no block.
fn pool_empty(bs: usize) -> String {
    format!("the pool holds no block: --pool-size must be at least --block-size ({bs})")
}

/// `--io`.
fn file_io(io: &str) -> FileIo {
    match io {
        "mapped" => FileIo::Mapped,
        "direct" => FileIo::Direct,
        "buffered" => FileIo::Buffered,
        _ => FileIo::Auto,
    }
}

/// The io_uring flags.
fn uring(args: &Args) -> UringTuning {
    UringTuning {
        force_async: match args.uring_async.as_str() {
            "on" => Some(true),
            "off" => Some(false),
            _ => None,
        },
        idle_wait: args
            .uring_idle_wait_us
            .map(std::time::Duration::from_micros),
        max_workers: args.uring_workers,
        sqpoll_idle_ms: args.sqpoll,
    }
}

/// `--bytes` or `--seconds` (`None`: the whole source once).
fn limit(args: &Args) -> Result<Option<Limit>, BoxErr> {
    Ok(match (args.bytes, args.seconds) {
        (Some(b), _) => Some(Limit::Bytes(b)),
        (None, Some(s)) if s > 0.0 && s.is_finite() => {
            Some(Limit::Duration(std::time::Duration::from_secs_f64(s)))
        }
        (None, Some(s)) => return Err(format!("--seconds {s} must be a positive number").into()),
        (None, None) => None,
    })
}

/// `--hostcheck NAME,SOURCE_FILE,BAR_FILE`.
fn hostcheck(spec: &str) -> Result<HostCheck, BoxErr> {
    let parts: Vec<&str> = spec.split(',').collect();
    let [name, src_file, bar_file] = parts[..] else {
        return Err(format!("--hostcheck '{spec}' must be NAME,SOURCE_FILE,BAR_FILE").into());
    };
    Ok(HostCheck {
        name: name.into(),
        source_file: src_file.into(),
        bar_file: bar_file.into(),
    })
}

/// What the run tells while it runs, said in the command line's terms.
fn print_note(note: Note) {
    match note {
        Note::MappedSettingsUnused => tracing::warn!("--io auto reads this file into the UB pool (less than {:.0}% of it is in the page cache): --copy-size, --map-window and --register-threads do not apply", AUTO_MAPPED_RESIDENT * 100.0),
        Note::ControllerReset { addr, resets, requeued } => eprintln!(
            "ubdirect pipeline: NVMe controller {addr} was reset {resets} time(s) during the run; the reads in flight were submitted again (requeued commands: {requeued})"
        ),
        Note::HostCheck(line) => println!("{line}"),
    }
}

/// The builder's error as the command line says it: setup errors name the flags that set
/// them; the drivers' errors go on as they came (the error printer knows them).
fn cli_error(e: PipelineRunError) -> BoxErr {
    match e {
        PipelineRunError::Setup(s) => super::errors::setup_message(&s).into(),
        PipelineRunError::Run(e) => Box::new(e),
        PipelineRunError::Open(e) => e,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

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
        if ubdirect::cuda::driver_available().is_ok() {
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
}
