//! The smallest embedding of the NVMe driver, in the model a storage engine uses: open a
//! controller bound to vfio-pci, take a namespace handle, then submit -> ring -> poll -> reap.
//! It writes one block-sized pattern from a pool buffer, reads it back into another, compares.
//!
//! ```sh
//! scripts/setup.sh            # hugepages + bind the NVMe controller to vfio-pci
//! cargo run --example hello_nvme -- 0000:00:04.0 [LBA]
//! ```
//! It writes 4 KiB at LBA (default: the last 4 KiB of the first namespace): use a scratch disk.

use std::time::{Duration, Instant};

use ubdirect::dma::PoolConfig;
use ubdirect::nvme::{IoBuf, IoFlags, IoQueuePair, Lba, QueueOptions};
use ubdirect::Env;

fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("hello_nvme: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Ring the doorbell once, then poll until the request tagged `tag` completes (at most 5 s):
/// its buffer window comes back with the completion, as the `IoBuf` it was (the queue pair's
/// payload type), nothing to match or unwrap.
fn reap(qp: &mut IoQueuePair<IoBuf>, tag: u64) -> Result<IoBuf, Box<dyn std::error::Error>> {
    qp.ring();
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut done = None;
    loop {
        qp.poll(8, |c| {
            if c.tag == tag {
                done = Some(c)
            }
        })?;
        if let Some(c) = done {
            c.result?;
            return Ok(c.bufs);
        }
        if Instant::now() > deadline {
            return Err(format!("request {tag} did not complete within 5 s").into());
        }
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let addr = args.next().ok_or("usage: hello_nvme <pci-address> [lba]")?;

    // One call opens the DMA domain, the controller, then the buffer pool (its hugepages are
    // mapped for the device's DMA, so it comes after the device).
    let env = Env::builder()
        .nvme(addr.as_str())
        .pool(PoolConfig {
            block_size: 2 << 20,
            block_count: 2,
        })
        .open()?;
    let (ctrl, pool) = (env.controller(0), env.pool());
    let info = ctrl.info();
    println!("{addr}: {} (sn {}, fw {})", info.mn, info.sn, info.fr);
    // The namespace handle carries what a request is checked against: LBA size, size, MDTS.
    let ns = ctrl.first_namespace()?;
    println!(
        "namespace {}: {} blocks of {} bytes, {} blocks per command",
        ns.nsid(),
        ns.blocks(),
        ns.lba_size(),
        ns.max_blocks_per_command()
    );

    let len = 4096usize.max(ns.lba_size() as usize);
    let blocks = (len / ns.lba_size() as usize) as u64;
    let lba = match args.next() {
        Some(s) => Lba(s.parse()?),
        None => ns
            .last_blocks(blocks)
            .ok_or("the namespace is smaller than 4 KiB")?,
    };
    // One queue pair per thread: this one is ours. Its payload type (`IoBuf`: one window per
    // request) is what every completion hands back.
    let mut qp = IoQueuePair::<IoBuf>::with_payload(ctrl, QueueOptions::default())?;

    // The buffer window moves into the request and comes back with the completion.
    let mut out = IoBuf::prefix(pool.get()?, len)?;
    for (i, b) in out.as_mut_slice().iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(31) ^ 0x5a;
    }
    qp.submit_write(&ns, lba, out, IoFlags::FUA, 1)?;
    let out = reap(&mut qp, 1)?;

    qp.submit_read(
        &ns,
        lba,
        IoBuf::prefix(pool.get()?, len)?,
        IoFlags::empty(),
        2,
    )?;
    let back = reap(&mut qp, 2)?;

    if out.as_slice() == back.as_slice() {
        println!("wrote and read back {len} bytes at {lba}: identical");
        Ok(())
    } else {
        Err(format!("data read back at {lba} differs from what was written").into())
    }
}
