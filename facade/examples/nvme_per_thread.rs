//! How a storage engine uses the NVMe driver: one controller shared by every thread, one queue
//! pair per thread (no lock on the I/O path), each keeping `QD` reads in flight with submit ->
//! ring -> poll -> reap, buffers from one pool shared by all.
//!
//! ```sh
//! cargo run --release --example nvme_per_thread -- 0000:00:04.0 [THREADS] [READS_PER_THREAD]
//! ```
//! It only reads (the first 64 MiB of the first namespace, 4 KiB random reads).

use std::time::{Duration, Instant};

use ubdirect::dma::PoolConfig;
use ubdirect::nvme::{IoBuf, IoFlags, IoQueuePair, Lba, QueueOptions};
use ubdirect::Env;

/// Reads each thread keeps in flight.
const QD: usize = 16;
/// Bytes per read.
const IO: usize = 4096;

fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("nvme_per_thread: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let usage = "usage: nvme_per_thread <pci-address> [threads] [reads-per-thread]";
    let addr = args.next().ok_or(usage)?;
    let threads: usize = args.next().map(|s| s.parse()).transpose()?.unwrap_or(2);
    let reads: u64 = args
        .next()
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(10_000);
    let env = Env::builder()
        .nvme(addr.as_str())
        .pool(PoolConfig {
            block_size: 4096,
            block_count: (threads * QD).next_power_of_two().max(512),
        })
        .open()?;
    let ns = env.controller(0).first_namespace()?;
    let span = (64u64 << 20).min(ns.capacity_bytes()) / IO as u64;
    let start = Instant::now();
    let done = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let job = Job {
                    ctrl: env.controller(0),
                    pool: env.pool(),
                    ns,
                    span,
                    reads,
                    seed: 0x9e37_79b9_7f4a_7c15u64 ^ t as u64,
                };
                s.spawn(move || reader(job))
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().expect("worker thread"))
            .collect::<Result<Vec<u64>, String>>()
    })?;
    let total: u64 = done.iter().sum();
    let secs = start.elapsed().as_secs_f64();
    println!(
        "{threads} threads, one queue pair each: {total} reads of {IO} bytes in {secs:.3} s ({:.0} IOPS)",
        total as f64 / secs
    );
    Ok(())
}

/// What one reader thread needs.
struct Job<'a> {
    ctrl: &'a std::sync::Arc<ubdirect::nvme::Controller>,
    pool: &'a std::sync::Arc<ubdirect::dma::UbPool>,
    ns: ubdirect::nvme::Namespace,
    span: u64,
    reads: u64,
    seed: u64,
}

/// One thread's reads on its own queue pair: created here, used only here. Returns the reads
/// completed.
fn reader(job: Job<'_>) -> Result<u64, String> {
    let opts = QueueOptions {
        depth: QD,
        ..QueueOptions::default()
    };
    // Its payload is one `IoBuf` window per request: completions hand it back.
    let mut qp = IoQueuePair::<IoBuf>::with_payload(job.ctrl, opts).map_err(|e| e.to_string())?;
    let (ns, span) = (job.ns, job.span);
    let mut x = job.seed;
    let mut next_lba = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        ns.lba_at(x % span * IO as u64).expect("a 4 KiB multiple")
    };
    let (mut submitted, mut completed) = (0u64, 0u64);
    let mut free: Vec<IoBuf> = Vec::with_capacity(QD);
    for _ in 0..QD {
        let b = job.pool.get().map_err(|e| e.to_string())?;
        free.push(IoBuf::prefix(b, IO).map_err(|e| e.to_string())?);
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while completed < job.reads {
        // Submit while there are buffers, then one doorbell write for all.
        while submitted < job.reads {
            let Some(buf) = free.pop() else { break };
            let lba: Lba = next_lba();
            qp.submit_read(&ns, lba, buf, IoFlags::empty(), submitted)
                .map_err(|r| r.error.to_string())?;
            submitted += 1;
        }
        qp.ring();
        // Reap: every completion hands its buffer back for the next read.
        let mut failed = None;
        qp.poll(QD, |c| {
            if let Err(e) = c.result {
                failed.get_or_insert(e.to_string());
            }
            free.push(c.bufs);
            completed += 1;
        })
        .map_err(|e| e.to_string())?;
        if let Some(e) = failed {
            return Err(e);
        }
        if Instant::now() > deadline {
            return Err(format!("{completed} of {} reads done in 60 s", job.reads));
        }
    }
    Ok(completed)
}
