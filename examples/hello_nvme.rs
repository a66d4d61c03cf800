//! The smallest embedding of the NVMe driver: open a controller bound to vfio-pci, identify it,
//! write a block from a pool buffer, read it back into another, compare.
//!
//! ```sh
//! scripts/setup.sh            # hugepages + bind the NVMe controller to vfio-pci
//! cargo run --example hello_nvme -- 0000:00:04.0 [LBA]
//! ```
//! It writes one 4 KiB block at LBA (default: the last 4 KiB of namespace 1): use a scratch disk.

use std::time::Duration;

use ubdirect::dma::{DmaDomain, PoolConfig, UbPool, UbRegistry};
use ubdirect::nvme::{Controller, ControllerOptions, IoQueuePair, QueueOptions};

fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("hello_nvme: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let addr = args.next().ok_or("usage: hello_nvme <pci-address> [lba]")?;

    // One DMA domain and registry for the process; the pool's hugepages are mapped once.
    let registry = UbRegistry::new(DmaDomain::new()?);
    let ctrl = Controller::open(&registry, addr.parse()?, ControllerOptions::default())?;
    let info = ctrl.info();
    println!(
        "{addr}: {} (sn {}, fw {}), {} namespace(s)",
        info.mn,
        info.sn,
        info.fr,
        ctrl.namespaces().len()
    );
    let ns = ctrl
        .namespaces()
        .first()
        .ok_or("the controller has no active namespace")?;
    println!(
        "namespace {}: {} blocks of {} bytes",
        ns.nsid, ns.nsze, ns.lba_size
    );

    let len = 4096usize.max(ns.lba_size as usize);
    let blocks = (len / ns.lba_size as usize) as u64;
    let lba = match args.next() {
        Some(s) => s.parse()?,
        None => ns.nsze - blocks,
    };
    let pool = UbPool::with_hugepages(
        &registry,
        PoolConfig {
            block_size: 2 << 20,
            block_count: 2,
        },
        None,
    )?;
    let mut qp = IoQueuePair::new(&ctrl, QueueOptions::default())?;
    let timeout = Duration::from_secs(5);

    // The buffer moves into the request and comes back with the completion.
    let mut out = pool.get()?;
    for (i, b) in out.as_mut_slice()[..len].iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(31) ^ 0x5a;
    }
    let out = qp
        .write_blocking(ns.nsid, lba, out, 0, len, true, timeout)
        .map_err(|r| r.error)?;
    let back = qp
        .read_blocking(ns.nsid, lba, pool.get()?, 0, len, timeout)
        .map_err(|r| r.error)?;

    if out.as_slice()[..len] == back.as_slice()[..len] {
        println!("wrote and read back {len} bytes at LBA {lba}: identical");
        Ok(())
    } else {
        Err(format!("data read back at LBA {lba} differs from what was written").into())
    }
}
