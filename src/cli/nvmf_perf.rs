//! `ubdirect perf nvmf-tcp://...`: the NVMe/TCP initiator measured like the PCIe one: one
//! queue (one connection) at depth -q, -o bytes per I/O, for -t seconds; IOPS, MiB/s, mean
//! latency, and CPU seconds per GB moved (user + system time of the process, so the kernel's
//! TCP work on this side is counted).
//! `UBD_NVMF_SPIN=1` polls without the poll(2) wait (a diagnostic: does the wait cost IOPS?).

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use ubdirect::dma::{DmaDomain, PoolConfig, UbBuf, UbPool, UbRegistry};
use ubdirect::nvme::transport::tcp::addr::TcpTarget;
use ubdirect::nvme::transport::tcp::ctrl::{TcpController, TcpOptions};
use ubdirect::nvme::transport::tcp::fabrics;
use ubdirect::nvme::transport::tcp::queue::{TcpCommand, TcpCompletion, TcpQueue};

use super::{CliResult, Outcome};

/// What `perf` asks of the TCP path.
#[derive(Debug)]
pub struct PerfSpec<'a> {
    /// nvmf-tcp:// address.
    pub addr: &'a str,
    /// Queue depth.
    pub queue_depth: usize,
    /// Bytes per I/O.
    pub io_size: usize,
    /// Writes (else reads).
    pub write: bool,
    /// Random offsets (else sequential).
    pub random: bool,
    /// Seconds.
    pub seconds: f64,
    /// Stamp written blocks with their LBA; check stamps on reads.
    pub verify: bool,
    /// JSON output.
    pub json: bool,
    /// Span start, bytes.
    pub offset: u64,
    /// Span length, bytes (None: to the end).
    pub span: Option<u64>,
}

#[derive(Debug, Serialize)]
struct Report<'a> {
    address: &'a str,
    engine: &'static str,
    nsid: u32,
    workload: &'static str,
    io_size: usize,
    queue_depth: usize,
    ios: u64,
    seconds: f64,
    iops: f64,
    bytes_per_s: f64,
    mean_latency_ns: f64,
    cpu_seconds: f64,
    cpu_s_per_gb: f64,
    verified_blocks: u64,
    verify_errors: u64,
    header_digest: bool,
    data_digest: bool,
}

/// The stamp of an LBA: its number and a marker, in the first 16 bytes of each block.
const STAMP: u64 = 0x7562_642d_6e76_6d66; // "ubd-nvmf"

fn cpu_seconds() -> f64 {
    // SAFETY: getrusage fills the struct it is given.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: a valid pointer to a rusage.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let t = |v: libc::timeval| v.tv_sec as f64 + v.tv_usec as f64 / 1e6;
    t(u.ru_utime) + t(u.ru_stime)
}

/// A result whose error the CLI prints.
type Fallible<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// Run it.
pub fn run(p: &PerfSpec<'_>) -> CliResult {
    if p.queue_depth == 0 || p.queue_depth > 1024 {
        return Err("-q must be 1 to 1024 on NVMe/TCP".into());
    }
    let target: TcpTarget = p.addr.parse()?;
    let host = super::nvmf::host_identity();
    let tuning = Tuning::from_env()?;
    let opts = super::nvmf::with_auth(TcpOptions {
        hdgst: tuning.digests,
        ddgst: tuning.digests,
        kato_ms: tuning.kato_ms,
        ..TcpOptions::default()
    })?;
    let ctrl = TcpController::connect(&target, &host, &opts)?;
    let nsid = target.nsid.unwrap_or(1);
    let span = Span::of(p, &ctrl, nsid)?;
    // The socket moves the data with the CPU: the pool needs no IOMMU mapping.
    let registry = UbRegistry::new(DmaDomain::host_only());
    let pool = UbPool::with_anonymous(
        &registry,
        PoolConfig {
            block_size: p.io_size.next_multiple_of(4096),
            block_count: p.queue_depth,
        },
        None,
    )?;
    let q: TcpQueue<UbBuf> = ctrl.io_queue(p.queue_depth)?;
    if q.free_slots() < p.queue_depth {
        return Err(format!(
            "-q {}: the target takes at most {} commands in flight on a queue (CAP.MQES / MAXCMD): lower -q",
            p.queue_depth,
            q.free_slots()
        )
        .into());
    }
    let mut run = Run::new(p, q, nsid, span);
    let cpu0 = cpu_seconds();
    let t0 = Instant::now();
    run.measure(&ctrl, &pool, &tuning, t0)?;
    let secs = t0.elapsed().as_secs_f64();
    let cpu = cpu_seconds() - cpu0;
    let r = run.report(secs, cpu);
    if p.json {
        super::json::print("perf", &r)?;
    } else {
        print_line(&r, p.verify);
    }
    if r.verify_errors > 0 {
        eprintln!(
            "ubdirect: {} block(s) read back with the wrong LBA stamp",
            r.verify_errors
        );
        return Ok(Outcome::Findings);
    }
    Ok(Outcome::Success)
}

/// Settings from the environment.
struct Tuning {
    /// `UBD_NVMF_DIGESTS=1`: header and data digests.
    digests: bool,
    /// `UBD_NVMF_SPIN=1`: poll without ever sleeping in poll(2) (a diagnostic: does the 1 ms
    /// wait cost IOPS at depth?).
    spin: bool,
    /// `UBD_NVMF_IDLE_SPIN_US`: how long an empty poll keeps polling before the poll(2) wait
    /// (the block queue's default; 0: wait at once, no spin).
    idle_spin: Duration,
    /// `UBD_NVMF_KATO_MS`: the keep-alive timeout (0: off).
    kato_ms: u32,
}

impl Tuning {
    fn from_env() -> Result<Tuning, String> {
        let idle_spin = match std::env::var("UBD_NVMF_IDLE_SPIN_US") {
            Ok(v) => Duration::from_micros(v.parse::<u64>().map_err(|_| {
                format!("UBD_NVMF_IDLE_SPIN_US={v}: give the spin before each wait in microseconds (0: none)")
            })?),
            Err(_) => ubdirect::nvme::transport::tcp::block::DEFAULT_IDLE_SPIN,
        };
        let kato_ms = match std::env::var("UBD_NVMF_KATO_MS") {
            Ok(v) => v.parse::<u32>().map_err(|_| {
                format!(
                    "UBD_NVMF_KATO_MS={v}: give the keep-alive timeout in milliseconds (0: off)"
                )
            })?,
            Err(_) => 0,
        };
        Ok(Tuning {
            digests: std::env::var("UBD_NVMF_DIGESTS").is_ok_and(|v| v == "1"),
            spin: std::env::var("UBD_NVMF_SPIN").is_ok_and(|v| v == "1"),
            idle_spin,
            kato_ms,
        })
    }
}

/// The blocks the run covers.
#[derive(Clone, Copy)]
struct Span {
    lba: u64,
    /// First block.
    first: u64,
    /// Blocks per I/O.
    per_io: u64,
    /// I/Os that fit.
    slots: u64,
}

impl Span {
    /// The span `--offset` and `--span` give on namespace `nsid`, checked against `-o`.
    fn of(p: &PerfSpec<'_>, ctrl: &TcpController, nsid: u32) -> Fallible<Span> {
        let ns = ctrl.namespace(nsid)?;
        let lba = ns.lba_size as u64;
        if p.io_size == 0 || p.io_size as u64 % lba != 0 || p.io_size > (1 << 20) {
            return Err(format!(
                "-o {} must be a multiple of namespace {nsid}'s {lba}-byte block, at most 1 MiB",
                p.io_size
            )
            .into());
        }
        let first = p.offset / lba;
        let mut blocks = ns.nsze.saturating_sub(first);
        if let Some(s) = p.span {
            blocks = blocks.min(s / lba);
        }
        let per_io = p.io_size as u64 / lba;
        let slots = blocks / per_io;
        if slots == 0 {
            return Err("the span is smaller than one I/O: lower --offset or -o".into());
        }
        Ok(Span {
            lba,
            first,
            per_io,
            slots,
        })
    }
}

/// The run on one queue: its commands in flight and its counts.
struct Run<'a> {
    p: &'a PerfSpec<'a>,
    q: TcpQueue<UbBuf>,
    nsid: u32,
    span: Span,
    seq: u64,
    rng: u64,
    /// When each tag's command went out.
    started: Vec<Instant>,
    /// Each tag's first block.
    slba_of: Vec<u64>,
    ios: u64,
    verified: u64,
    bad: u64,
    lat_ns: f64,
}

impl<'a> Run<'a> {
    fn new(p: &'a PerfSpec<'a>, q: TcpQueue<UbBuf>, nsid: u32, span: Span) -> Run<'a> {
        Run {
            p,
            q,
            nsid,
            span,
            seq: 0,
            rng: 0x2545_f491_4f6c_dd1d,
            started: vec![Instant::now(); p.queue_depth],
            slba_of: vec![0u64; p.queue_depth],
            ios: 0,
            verified: 0,
            bad: 0,
            lat_ns: 0.0,
        }
    }

    /// Fill the queue, then keep it full until the time is up and drain it.
    fn measure(
        &mut self,
        ctrl: &TcpController,
        pool: &Arc<UbPool>,
        tuning: &Tuning,
        t0: Instant,
    ) -> Fallible<()> {
        let end = t0 + Duration::from_secs_f64(self.p.seconds.max(0.01));
        for tag in 0..self.p.queue_depth {
            self.submit(pool.get()?, tag, Instant::now())?;
        }
        let mut done: Vec<TcpCompletion<UbBuf>> = Vec::with_capacity(self.p.queue_depth);
        let mut inflight = self.p.queue_depth;
        let mut next_admin = Instant::now();
        // While polls find nothing: until when to keep polling before the poll(2) wait.
        let mut spin_until: Option<Instant> = None;
        while inflight > 0 {
            if tuning.kato_ms > 0 && Instant::now() >= next_admin {
                // Keep Alive on the admin connection, sent from this loop when due.
                ctrl.poll_admin()?;
                next_admin = Instant::now() + Duration::from_millis(tuning.kato_ms as u64 / 8);
            }
            if self.q.poll(&mut |c| done.push(c))? == 0 && !tuning.spin {
                // Nothing arrived: poll again for up to the idle spin, then sleep in poll(2)
                // until the socket is ready rather than spin on, so the kernel's TCP and (on
                // one machine) nvmet work get the CPU. 1 ms bounds it so command deadlines are
                // still checked.
                let now = Instant::now();
                let until = *spin_until.get_or_insert(now + tuning.idle_spin);
                if now < until {
                    std::hint::spin_loop();
                    continue;
                }
                spin_until = None;
                self.q.wait_ready(Duration::from_millis(1))?;
                continue;
            }
            spin_until = None;
            let now = Instant::now();
            for c in done.drain(..) {
                inflight -= 1;
                let tag = c.tag as usize;
                c.result?;
                let b = self.complete(c.buf, tag, now)?;
                if now < end {
                    self.submit(b, tag, now)?;
                    inflight += 1;
                }
            }
        }
        Ok(())
    }

    /// The next I/O's first block: at random, or the next in order.
    fn next_slba(&mut self) -> u64 {
        let i = if self.p.random {
            self.rng ^= self.rng << 13;
            self.rng ^= self.rng >> 7;
            self.rng ^= self.rng << 17;
            self.rng % self.span.slots
        } else {
            let i = self.seq % self.span.slots;
            self.seq += 1;
            i
        };
        self.span.first + i * self.span.per_io
    }

    /// Send the next I/O as `tag` in `b` (stamped first when it writes with `--verify`).
    fn submit(&mut self, mut b: UbBuf, tag: usize, now: Instant) -> Fallible<()> {
        let p = self.p;
        let slba = self.next_slba();
        self.slba_of[tag] = slba;
        self.started[tag] = now;
        if p.write && p.verify {
            for (k, blk) in b.as_mut_slice()[..p.io_size]
                .chunks_exact_mut(self.span.lba as usize)
                .enumerate()
            {
                blk[..8].copy_from_slice(&(slba + k as u64).to_le_bytes());
                blk[8..16].copy_from_slice(&STAMP.to_le_bytes());
            }
        }
        let sqe = fabrics::rw(p.write, self.nsid, slba, self.span.per_io as u32);
        let len = p.io_size as u32;
        let cmd = if p.write {
            TcpCommand::new(sqe, "Write").write(0, len)
        } else {
            TcpCommand::new(sqe, "Read").read(0, len)
        };
        self.q
            .submit(cmd.buf(b).tag(tag as u64))
            .map_err(|(e, _)| e)?;
        Ok(())
    }

    /// Count `tag`'s successful I/O and check its stamps (reads with `--verify`); its buffer.
    fn complete(&mut self, buf: Option<UbBuf>, tag: usize, now: Instant) -> Fallible<UbBuf> {
        self.ios += 1;
        self.lat_ns += now.duration_since(self.started[tag]).as_nanos() as f64;
        let b = buf.ok_or("a completion without its buffer")?;
        if self.p.verify && !self.p.write {
            for (k, blk) in b.as_slice()[..self.p.io_size]
                .chunks_exact(self.span.lba as usize)
                .enumerate()
            {
                if blk[8..16] == STAMP.to_le_bytes() {
                    self.verified += 1;
                    if blk[..8] != (self.slba_of[tag] + k as u64).to_le_bytes() {
                        self.bad += 1;
                    }
                }
            }
        }
        Ok(b)
    }

    /// The report of a run that took `secs` and `cpu` CPU seconds.
    fn report(&self, secs: f64, cpu: f64) -> Report<'a> {
        let (p, ios) = (self.p, self.ios);
        let bytes = ios as f64 * p.io_size as f64;
        let neg = self.q.negotiated();
        Report {
            address: p.addr,
            engine: "ubdirect-tcp",
            nsid: self.nsid,
            workload: match (p.write, p.random) {
                (false, false) => "read",
                (true, false) => "write",
                (false, true) => "randread",
                (true, true) => "randwrite",
            },
            io_size: p.io_size,
            queue_depth: p.queue_depth,
            ios,
            seconds: secs,
            iops: ios as f64 / secs,
            bytes_per_s: bytes / secs,
            mean_latency_ns: if ios > 0 {
                self.lat_ns / ios as f64
            } else {
                0.0
            },
            cpu_seconds: cpu,
            cpu_s_per_gb: if bytes > 0.0 {
                cpu / (bytes / 1e9)
            } else {
                0.0
            },
            verified_blocks: self.verified,
            verify_errors: self.bad,
            header_digest: neg.hdgst,
            data_digest: neg.ddgst,
        }
    }
}

/// The one-line summary.
fn print_line(r: &Report<'_>, verify: bool) {
    println!(
        "nvmf-tcp {} -q {} -o {}: {} IOs in {:.2} s: {:.0} IOPS, {:.1} MiB/s, mean latency {:.1} us, CPU {:.3} s = {:.3} CPU-s/GB{}",
        r.workload,
        r.queue_depth,
        r.io_size,
        r.ios,
        r.seconds,
        r.iops,
        r.bytes_per_s / (1 << 20) as f64,
        r.mean_latency_ns / 1e3,
        r.cpu_seconds,
        r.cpu_s_per_gb,
        if verify {
            format!(
                ", verified {} blocks, {} mismatches",
                r.verified_blocks, r.verify_errors
            )
        } else {
            String::new()
        }
    );
}
