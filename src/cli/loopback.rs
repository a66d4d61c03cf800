//! `ubdirect loopback`: the source document's loop-back demo. A pattern is written into UB
//! buffers (in the GPU BAR region with `--gpu-bar`: the ivshmem BAR in the guest), sent on NIC
//! A, received on NIC B into buffers of the same region, and verified byte-exact. The driver
//! follows the device id: virtio-net, or igb for Intel 82576 NICs. `--kernel` runs the same
//! frames through the kernel's driver as the A/B baseline: AF_PACKET sockets, PACKET_MMAP
//! (TPACKET_V3) rings, or AF_XDP sockets.

mod afxdp;
mod igb_run;
mod kernel;
mod report;
mod sysfs_bar;
mod tpacket;
mod tpacket_ring;
mod xdp_prog;
mod xsk_ring;

use std::sync::Arc;
use std::time::{Duration, Instant};

use ubdirect::dma::pci::{PciAddress, PciDevice};
use ubdirect::dma::ub::{PoolConfig, UbBuf, UbPool, UbRegion, UbRegistry};
use ubdirect::virtio_net::pattern::{self, MIN_PATTERN_FRAME};
use ubdirect::virtio_net::{NetConfig, RxFrame, TxFrame, VirtioNet, VirtioNetError, FRAME_OFFSET};

pub use report::LoopbackReport;
use report::{RunInfo, Segments, Tally};

/// How long a run may go without any frame moving before it stops and counts what is missing
/// as dropped.
pub(crate) const STALL_DEADLINE: Duration = Duration::from_secs(2);

/// Bytes `[at, at + len)` of `buf` handed to `fill`: in place in host memory; for a BAR
/// through `scratch`, then copied in with volatile stores ([`UbBuf::write_from`]).
fn write_frame(
    buf: &mut UbBuf,
    at: usize,
    len: usize,
    scratch: &mut Vec<u8>,
    fill: impl FnOnce(&mut [u8]),
) -> Result<(), LoopbackError> {
    if buf.region().is_cpu_sliceable() {
        fill(&mut buf.as_mut_slice()[at..at + len]);
        return Ok(());
    }
    scratch.resize(len, 0);
    fill(scratch);
    Ok(buf.write_from(at, scratch)?)
}

/// Bytes `[at, at + len)` of `buf` to read: its slice in host memory; for a BAR copied into
/// `scratch` with volatile loads ([`UbBuf::read_into`]).
fn frame_bytes<'a>(
    buf: &'a UbBuf,
    at: usize,
    len: usize,
    scratch: &'a mut Vec<u8>,
) -> Result<&'a [u8], LoopbackError> {
    if buf.region().is_cpu_sliceable() {
        return Ok(&buf.as_slice()[at..at + len]);
    }
    scratch.resize(len, 0);
    buf.read_into(at, scratch)?;
    Ok(scratch)
}

/// Loop-back demo: a pattern written into UB buffers (in a GPU BAR with --gpu-bar) is sent on
/// NIC A, received on NIC B into the same region and verified byte-exact; --kernel runs the
/// same frames through the kernel driver (AF_PACKET, TPACKET_V3 rings or AF_XDP) as the A/B
/// baseline.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub noiommu: super::noiommu_arg::NoIommuArg,
    /// Sending NIC (PCI address, bound to vfio-pci; to virtio-pci with --kernel).
    #[arg(long)]
    pub tx: PciAddress,
    /// Receiving NIC (PCI address).
    #[arg(long)]
    pub rx: PciAddress,
    /// Put the TX and RX buffers in this device's BAR ("<bdf>" or "<bdf>/<bar>", default BAR 2:
    /// the ivshmem GPU-BAR stand-in). Default: a hugepage pool. With --kernel: the copy path,
    /// frames copied by the CPU between the kernel path's buffers (socket buffers, rings, UMEM)
    /// and the BAR (mapped through sysfs).
    #[arg(long = "gpu-bar", value_name = "BDF[/BAR]")]
    pub gpu_bar: Option<String>,
    /// Frame size in bytes, Ethernet header included (default: the largest the devices allow:
    /// MTU + 14, 1514 unless the device offers VIRTIO_NET_F_MTU).
    #[arg(long = "frame-size")]
    pub frame_size: Option<usize>,
    /// Frames per burst.
    #[arg(long, default_value_t = 32)]
    pub batch: usize,
    /// Frames to send (default 10000 unless --seconds is given).
    #[arg(long, conflicts_with = "seconds")]
    pub frames: Option<u64>,
    /// Send for this many seconds instead of a frame count.
    #[arg(long)]
    pub seconds: Option<f64>,
    /// Most frames in flight (sent, not yet received); default: the RX ring size.
    #[arg(long)]
    pub window: Option<usize>,
    /// Run a kernel baseline on the NICs' kernel netdevs instead: `packet` (the default of a
    /// bare --kernel: AF_PACKET raw sockets, sendmmsg/recvmmsg through socket buffers) or
    /// `tpacket-v3` (PACKET_MMAP: a TPACKET_V3 RX ring of blocks, a TX ring of frames) or
    /// `af-xdp` (XDP sockets in copy mode, an XDP program on the RX NIC redirecting to them).
    #[arg(long, value_enum, value_name = "PATH", num_args = 0..=1, default_missing_value = "packet")]
    pub kernel: Option<KernelPath>,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Which kernel path `--kernel` measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum KernelPath {
    /// AF_PACKET raw sockets, sendmmsg/recvmmsg (copies through socket buffers).
    Packet,
    /// PACKET_MMAP rings: TPACKET_V3 RX blocks, a TPACKET_V3 (or V2) TX frame ring.
    #[value(name = "tpacket-v3")]
    TpacketV3,
    /// AF_XDP sockets in copy mode (UMEM, fill/completion/RX/TX rings).
    #[value(name = "af-xdp")]
    AfXdp,
}

/// Why a loop-back could not run.
#[derive(Debug, thiserror::Error)]
pub enum LoopbackError {
    /// The userspace driver failed.
    #[error(transparent)]
    Driver(#[from] VirtioNetError),
    /// The igb driver failed (82576 NICs).
    #[error(transparent)]
    Igb(#[from] ubdirect::igb::IgbError),
    /// The core crate failed (VFIO, pools, BAR registration).
    #[error(transparent)]
    Core(#[from] ubdirect::dma::CoreError),
    /// A bad argument or missing set-up; nothing was sent.
    #[error("{0}")]
    Setup(String),
    /// The run finished but frames were lost or corrupted.
    #[error("loop-back failed: {0}")]
    Failed(String),
}

/// When to stop sending.
#[derive(Debug, Clone, Copy)]
pub enum Limit {
    /// After this many frames.
    Frames(u64),
    /// After this long.
    Time(Duration),
}

impl Limit {
    /// True while more frames should be sent.
    pub fn more(&self, sent: u64, start: Instant) -> bool {
        match *self {
            Limit::Frames(n) => sent < n,
            Limit::Time(d) => start.elapsed() < d,
        }
    }
    /// Frames still to send (unbounded for a time limit).
    pub fn remaining(&self, sent: u64) -> usize {
        match *self {
            Limit::Frames(n) => n.saturating_sub(sent).min(usize::MAX as u64) as usize,
            Limit::Time(_) => usize::MAX,
        }
    }
}

/// Refuses frame sizes the pattern or the devices cannot carry.
pub fn check_frame_size(fs: usize, max: usize, why: &str) -> Result<(), LoopbackError> {
    if fs < MIN_PATTERN_FRAME || fs > max {
        return Err(LoopbackError::Setup(format!(
            "--frame-size {fs} is out of range: it must be between {MIN_PATTERN_FRAME} (Ethernet header + sequence number) and {max} ({why}); without TSO a virtio-net frame cannot be larger, so aggregate data into batches of frames instead"
        )));
    }
    Ok(())
}

fn parse_bar(s: &str) -> Result<(PciAddress, u8), LoopbackError> {
    let (a, bar) = match s.split_once('/') {
        Some((a, b)) => (
            a,
            b.parse::<u8>().map_err(|_| {
                LoopbackError::Setup(format!(
                    "--gpu-bar {s}: BAR index '{b}' is not a number 0..5"
                ))
            })?,
        ),
        None => (s, 2),
    };
    if bar > 5 {
        return Err(LoopbackError::Setup(format!(
            "--gpu-bar {s}: BAR {bar} does not exist (0..5)"
        )));
    }
    let addr = a
        .parse::<PciAddress>()
        .map_err(|e| LoopbackError::Setup(format!("--gpu-bar {s}: {e}")))?;
    Ok((addr, bar))
}

/// Runs `ubdirect loopback` and prints the report; an error when frames were lost or wrong.
pub fn run(args: &Args) -> super::CliResult {
    let report = measure(args)?;
    if args.json {
        super::json::print("loopback", &report)?;
    } else {
        println!("{}", report.text());
    }
    if !report.ok() {
        return Err(LoopbackError::Failed(format!(
            "{} of {} frames came back byte-exact ({} dropped, {} mismatched)",
            report.frames_received, report.frames_sent, report.drops, report.mismatches
        ))
        .into());
    }
    Ok(super::Outcome::Success)
}

/// Runs the loop-back and returns its report without printing.
pub fn measure(args: &Args) -> Result<LoopbackReport, LoopbackError> {
    if args.tx == args.rx {
        return Err(LoopbackError::Setup(format!(
            "--tx and --rx are both {}: the loop-back needs two NICs on one link (in the guest: $UBD_NICS)",
            args.tx
        )));
    }
    if args.batch == 0 || args.batch > 4096 {
        return Err(LoopbackError::Setup(format!(
            "--batch {} is out of range (1..=4096)",
            args.batch
        )));
    }
    let limit = match (args.frames, args.seconds) {
        (Some(0), _) => return Err(LoopbackError::Setup("--frames 0: nothing to send".into())),
        (Some(n), _) => Limit::Frames(n),
        (None, Some(s)) if s > 0.0 && s.is_finite() => Limit::Time(Duration::from_secs_f64(s)),
        (None, Some(s)) => {
            return Err(LoopbackError::Setup(format!(
                "--seconds {s} must be positive"
            )))
        }
        (None, None) => Limit::Frames(10_000),
    };
    if let Some(path) = args.kernel {
        let bar = args.gpu_bar.as_deref().map(parse_bar).transpose()?;
        let window = args.window.unwrap_or(256).max(1);
        let ring_run = tpacket::Run {
            tx: args.tx,
            rx: args.rx,
            frame_size: args.frame_size,
            batch: args.batch,
            window,
            limit,
            gpu_bar: bar,
        };
        return match path {
            KernelPath::Packet => kernel::run(&ring_run),
            KernelPath::TpacketV3 => tpacket::run(&ring_run),
            KernelPath::AfXdp => afxdp::run(&ring_run),
        };
    }
    run_ubdirect(args, limit)
}

/// Block size for frames of up to `max_frame` bytes: header + frame, rounded to a power of two.
fn block_size_for(max_frame: usize) -> usize {
    (FRAME_OFFSET + max_frame).next_power_of_two().max(4096)
}

/// The loop-back on the userspace drivers: virtio-net, or igb when either NIC is an 82576.
fn run_ubdirect(args: &Args, limit: Limit) -> Result<LoopbackReport, LoopbackError> {
    // Devices first, then the registry: locals drop in reverse, so the registry's mappings go
    // while the devices still hold the IOMMU container.
    let domain = args.noiommu.domain()?;
    let tx_dev = PciDevice::open(&domain, args.tx)?;
    let rx_dev = PciDevice::open(&domain, args.rx)?;
    let bar = args.gpu_bar.as_deref().map(parse_bar).transpose()?;
    let bar_dev = match bar {
        Some((addr, _)) => Some(PciDevice::open(&domain, addr)?),
        None => None,
    };
    let registry = UbRegistry::new(domain.clone());
    let region = match (&bar_dev, bar) {
        (Some(d), Some((_, b))) => Some(registry.register_bar(d, b)?),
        _ => None,
    };
    let buffers = match bar {
        Some((a, b)) => format!("gpu-bar {a}/{b}"),
        None => "hugepages".to_string(),
    };
    let pools = Pools {
        registry: &registry,
        region: region.as_ref(),
    };
    // The pool must fit the largest frame the devices can deliver; start with 1514 and retry
    // once with what the device asks for.
    let pool = pools.make(block_size_for(args.frame_size.unwrap_or(0).max(1514)))?;
    // An Intel 82576 on either side: the igb driver (a virtio-net NIC opposite is refused by it).
    if igb_run::is_igb(&tx_dev) || igb_run::is_igb(&rx_dev) {
        let p = igb_run::IgbPair {
            registry: &registry,
            tx: &tx_dev,
            rx: &rx_dev,
            pool,
            buffers,
        };
        return igb_run::run(args, limit, p);
    }
    let (a, b, pool) = open_virtio_pair(&pools, pool, &tx_dev, &rx_dev)?;
    let mut pump = Pump::new(args, limit, a, b, pool)?;
    let cpu = report::CpuClock::start();
    let start = Instant::now();
    pump.run(start)?;
    let elapsed = start.elapsed();
    let cpu_s = cpu.seconds();
    pump.report(args, elapsed, buffers)
        .map(|r| r.with_cpu(cpu_s))
}

/// Makes the loop-back's pool: in the BAR region, or of hugepages.
struct Pools<'a> {
    registry: &'a Arc<UbRegistry>,
    region: Option<&'a Arc<UbRegion>>,
}

impl Pools<'_> {
    /// A pool of `block`-byte blocks.
    fn make(&self, block: usize) -> Result<Arc<UbPool>, LoopbackError> {
        let cfg = |count: usize| PoolConfig {
            block_size: block,
            block_count: count,
        };
        Ok(match self.region {
            Some(r) => {
                let count = (r.len / block).min(4096);
                UbPool::new(self.registry, (*r).clone(), cfg(count))?
            }
            None => UbPool::with_hugepages(self.registry, cfg(2048), None)?,
        })
    }
}

/// Open both NICs with virtio-net over `pool`; when the sending NIC needs larger receive
/// blocks, once more over a new pool of its size. Both NICs and the pool they use.
fn open_virtio_pair(
    pools: &Pools<'_>,
    mut pool: Arc<UbPool>,
    tx_dev: &Arc<PciDevice>,
    rx_dev: &Arc<PciDevice>,
) -> Result<(VirtioNet, VirtioNet, Arc<UbPool>), LoopbackError> {
    let open = |pool: &Arc<UbPool>, dev: &Arc<PciDevice>| {
        VirtioNet::from_device(
            pools.registry,
            dev.clone(),
            pool.clone(),
            NetConfig::default(),
        )
    };
    let a = match open(&pool, tx_dev) {
        Err(VirtioNetError::RxBlocksTooSmall { need, .. }) => {
            drop(pool);
            pool = pools.make(need.next_power_of_two())?;
            open(&pool, tx_dev)?
        }
        r => r?,
    };
    let b = open(&pool, rx_dev)?;
    Ok((a, b, pool))
}

/// The virtio-net loop-back in progress: NIC A sends pattern frames, NIC B receives and
/// verifies them.
struct Pump {
    a: VirtioNet,
    b: VirtioNet,
    pool: Arc<UbPool>,
    limit: Limit,
    /// Frame size.
    fs: usize,
    max_frame: usize,
    batch: usize,
    /// Most frames in flight.
    window: usize,
    amac: [u8; 6],
    bmac: [u8; 6],
    txv: Vec<TxFrame>,
    rxv: Vec<RxFrame>,
    /// Frame bytes on their way into or out of BAR buffers (copied, never sliced).
    scratch: Vec<u8>,
    t: Tally,
    /// Time per segment (the source document's advice: measure the pieces before the chain):
    /// pattern writes into the buffers, the TX burst, the RX burst (reap + refill),
    /// verification.
    seg: Segments,
}

impl Pump {
    /// Check the frame size and MACs of the pair, size the window.
    fn new(
        args: &Args,
        limit: Limit,
        a: VirtioNet,
        mut b: VirtioNet,
        pool: Arc<UbPool>,
    ) -> Result<Pump, LoopbackError> {
        let max_frame = a.max_frame().min(b.max_frame());
        let fs = args.frame_size.unwrap_or(max_frame);
        check_frame_size(fs, max_frame, "the devices' maximum frame: MTU + 14")?;
        let (Some(amac), Some(bmac)) = (a.mac(), b.mac()) else {
            return Err(LoopbackError::Setup(
                "a NIC has no MAC address (VIRTIO_NET_F_MAC not offered)".into(),
            ));
        };
        let window = args
            .window
            .unwrap_or(b.pair(0).map(|p| p.rx_ring_size()).unwrap_or(256))
            .max(1);
        let batch = args.batch;
        Ok(Pump {
            a,
            b,
            pool,
            limit,
            fs,
            max_frame,
            batch,
            window,
            amac,
            bmac,
            txv: Vec::with_capacity(batch),
            rxv: Vec::with_capacity(batch),
            scratch: Vec::with_capacity(fs),
            t: Tally::new(fs),
            seg: Segments::default(),
        })
    }

    /// Send, receive and verify until the limit is reached and nothing is in flight, or until
    /// nothing moved for [`STALL_DEADLINE`].
    fn run(&mut self, start: Instant) -> Result<(), LoopbackError> {
        let mut last_progress = Instant::now();
        let mut now = Instant::now();
        loop {
            let sending = self.limit.more(self.t.sent, start);
            if !sending && self.txv.is_empty() && self.t.in_flight() == 0 {
                return Ok(());
            }
            if sending {
                self.fill()?;
            }
            let t_fill = Instant::now();
            let mut moved = self.send()?;
            let t_tx = Instant::now();
            let n = self.b.rx_burst(&mut self.rxv)?;
            let t_rx = Instant::now();
            if n > 0 {
                for f in self.rxv.drain(..) {
                    let got = frame_bytes(f.buf(), f.offset(), f.len(), &mut self.scratch)?;
                    self.t
                        .account(pattern::verify(got, self.bmac, self.amac, self.fs));
                }
                moved = true;
            }
            let t_verify = Instant::now();
            self.seg.add(now, t_fill, t_tx, t_rx, t_verify);
            now = t_verify;
            if moved {
                last_progress = now;
            } else if now - last_progress > STALL_DEADLINE {
                return self.stall();
            }
        }
    }

    /// Fill the burst: the CPU (the GPU's stand-in) writes the pattern into BAR buffers.
    fn fill(&mut self) -> Result<(), LoopbackError> {
        let t = &mut self.t;
        while self.txv.len() < self.batch
            && (t.in_flight() as usize) < self.window
            && self.limit.remaining(t.sent) > 0
        {
            let Ok(mut buf) = self.pool.get() else { break };
            let (bmac, amac, seq) = (self.bmac, self.amac, t.sent);
            write_frame(&mut buf, FRAME_OFFSET, self.fs, &mut self.scratch, |b| {
                pattern::fill(b, bmac, amac, seq)
            })?;
            // The frame length was checked against the device maximum above.
            let f = TxFrame::new(buf, self.fs).map_err(|(_, e)| e)?;
            self.txv.push(f);
            t.sent += 1;
        }
        Ok(())
    }

    /// Send the burst (or reclaim sent frames when there is none); whether any frame went.
    fn send(&mut self) -> Result<bool, LoopbackError> {
        if self.txv.is_empty() {
            self.a.reclaim_tx()?;
            return Ok(false);
        }
        let moved = self.a.tx_burst(&mut self.txv)? > 0;
        if !self.txv.is_empty() {
            self.t.tx_full += 1;
        }
        Ok(moved)
    }

    /// Nothing moved for too long: count what is unsent as not sent and what is in flight as
    /// lost.
    fn stall(&mut self) -> Result<(), LoopbackError> {
        // The burst calls report a dead NIC after their health interval (100 ms) already;
        // ask both once more so a stall is never reported as a quiet link.
        self.a.check_health()?;
        self.b.check_health()?;
        let t = &mut self.t;
        t.stalled = true;
        t.sent -= self.txv.len() as u64;
        self.txv.clear();
        t.lost += t.in_flight();
        Ok(())
    }

    /// Shut both NICs down; the run's report.
    fn report(
        self,
        args: &Args,
        elapsed: Duration,
        buffers: String,
    ) -> Result<LoopbackReport, LoopbackError> {
        let (sa, sb) = (self.a.stats(), self.b.stats());
        self.a.shutdown()?;
        self.b.shutdown()?;
        let mut report = self.t.report(RunInfo {
            mode: "ubdirect",
            tx: args.tx,
            rx: args.rx,
            max_frame: self.max_frame,
            batch: self.batch,
            elapsed,
            buffers: Some(buffers),
        });
        (report.tx_stats, report.rx_stats) = (Some(sa), Some(sb));
        report.segments_ns_per_frame = self.seg.per_frame(self.t.sent.max(1));
        Ok(report)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Args, clap::Error> {
        use clap::Parser;
        let base = ["ubdirect", "loopback", "--tx", "00:07.0", "--rx", "00:08.0"];
        let cli = crate::cli::Cli::try_parse_from(base.iter().chain(args).copied())?;
        match cli.command {
            crate::cli::Command::Loopback(a) => Ok(a),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn kernel_flag_selects_the_path_and_a_bare_flag_means_af_packet() {
        assert_eq!(parse(&[]).unwrap().kernel, None);
        assert_eq!(
            parse(&["--kernel"]).unwrap().kernel,
            Some(KernelPath::Packet)
        );
        let a = parse(&["--kernel", "--frames", "5"]).unwrap();
        assert_eq!((a.kernel, a.frames), (Some(KernelPath::Packet), Some(5)));
        for (v, want) in [
            ("packet", KernelPath::Packet),
            ("tpacket-v3", KernelPath::TpacketV3),
        ] {
            assert_eq!(parse(&["--kernel", v]).unwrap().kernel, Some(want));
            assert_eq!(
                parse(&[&format!("--kernel={v}")]).unwrap().kernel,
                Some(want)
            );
        }
        let e = parse(&["--kernel", "netmap"]).unwrap_err().to_string();
        assert!(e.contains("tpacket-v3") && e.contains("af-xdp"), "{e}");
    }

    #[test]
    fn bar_argument_parses() {
        assert_eq!(parse_bar("00:06.0").unwrap().1, 2);
        assert_eq!(parse_bar("0000:00:06.0/4").unwrap().1, 4);
        assert!(parse_bar("00:06.0/9").is_err());
        assert!(parse_bar("00:06.0/x").is_err());
        assert!(parse_bar("zz").is_err());
    }

    #[test]
    fn frame_size_limits_name_the_range() {
        assert!(check_frame_size(60, 1514, "x").is_ok());
        let e = check_frame_size(65536, 1514, "MTU + 14")
            .unwrap_err()
            .to_string();
        assert!(e.contains("1514") && e.contains("MTU + 14"), "{e}");
        assert!(check_frame_size(10, 1514, "x").is_err());
    }

    #[test]
    fn block_sizes_fit_header_and_frame() {
        assert_eq!(block_size_for(1514), 4096);
        assert_eq!(block_size_for(4090), 8192);
        assert!(block_size_for(9014) >= 9026);
    }
}
