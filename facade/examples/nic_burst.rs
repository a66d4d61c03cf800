//! Embedding the virtio-net poll-mode driver: open two NICs bound to vfio-pci, send bursts of
//! frames from a UB pool on one, receive them on the other, and print the counters.
//!
//! ```sh
//! cargo run --example nic_burst -- 0000:00:07.0 0000:00:08.0 [frames] [frame-size]
//! ```
//! (in the test-bed guest: `nic_burst ${UBD_NICS%,*} ${UBD_NICS#*,}`).
//!
//! The burst API is DPDK-shaped and allocation-free once the two `Vec`s exist: `tx_burst`
//! takes frames from the front of a `Vec<TxFrame>` (what does not fit stays there),
//! `rx_burst` appends up to the spare capacity of a `Vec<RxFrame>`. Buffers move into the
//! driver and come back only when the device is done with them.
//!
//! A dead NIC is a burst error, not a quiet link: once a queue pair has moved nothing for
//! `NetConfig::health_interval` (default 100 ms) its next idle burst reads device_status once
//! and returns `VirtioNetError::DeviceGone` / `DeviceNeedsReset`, and keeps returning it. So
//! propagate burst errors (`?` below) rather than ignoring them; no separate health call is
//! needed in the loop.

use std::time::{Duration, Instant};

use ubdirect::dma::PoolConfig;
use ubdirect::virtio_net::{RxFrame, TxFrame, FRAME_OFFSET};
use ubdirect::Env;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 3 {
        usage();
    }
    let (tx_addr, rx_addr) = (args[1].as_str(), args[2].as_str());
    let (frames, size) = counts(&args)?;

    // 1. One call: the hugepages checked, the DMA domain, both NICs' devices, a pool of 4 KiB
    //    blocks (mapped for the devices' DMA, so after them), then the NICs come up, each
    //    filling its RX ring from the pool.
    let mut env = Env::builder()
        .nic(tx_addr)
        .nic(rx_addr)
        .pool(PoolConfig {
            block_size: 4096,
            block_count: 1024,
        })
        .open()?;
    let pool = env.pool().clone();

    // 2. The NICs, moved out of the environment (each could go to its own polling thread).
    let mut nics = env.take_nics();
    let mut b = nics.pop().expect("two NICs were named");
    let mut a = nics.pop().expect("two NICs were named");
    let (src, dst) = (a.mac().unwrap_or_default(), b.mac().unwrap_or_default());
    if size < 14 || size > a.max_frame() {
        return Err(format!("frame size {size} must be 14..={}", a.max_frame()).into());
    }
    println!(
        "{tx_addr} ({src:02x?}) -> {rx_addr} ({dst:02x?}), max frame {}",
        a.max_frame()
    );

    // 3. The burst loop: the Vecs are made once; nothing below allocates.
    const BATCH: usize = 32;
    let mut txv: Vec<TxFrame> = Vec::with_capacity(BATCH);
    let mut rxv: Vec<RxFrame> = Vec::with_capacity(BATCH);
    let (mut sent, mut got) = (0u64, 0u64);
    let start = Instant::now();
    while got < frames {
        while sent < frames && txv.len() < BATCH && sent - got < 128 {
            let mut buf = pool.get()?;
            fill_frame(
                &mut buf.as_mut_slice()[FRAME_OFFSET..FRAME_OFFSET + size],
                dst,
                src,
                sent,
            );
            txv.push(TxFrame::new(buf, size).map_err(|(_, e)| e)?);
            sent += 1;
        }
        // `?`: a burst error ends the loop, and a dead NIC shows up here as DeviceGone.
        if !txv.is_empty() {
            a.tx_burst(&mut txv)?; // unsent frames stay in txv for the next round
        } else {
            a.reclaim_tx()?; // finished TX buffers back to the pool (and A's health check)
        }
        b.rx_burst(&mut rxv)?;
        for f in rxv.drain(..) {
            // f.data() is the frame, in place in the pool buffer (zero copy).
            if f.len() == size && f.data()[12..14] == 0x88b5u16.to_be_bytes() {
                got += 1;
            }
        } // dropping f returns its buffer to the pool
        if start.elapsed() > Duration::from_secs(30) {
            return Err(format!("only {got} of {frames} frames arrived within 30 s").into());
        }
    }
    let secs = start.elapsed().as_secs_f64();
    println!(
        "{got} frames of {size} B in {secs:.3} s: {:.0} frames/s",
        got as f64 / secs
    );
    println!("tx: {:?}\nrx: {:?}", a.stats(), b.stats());
    // 4. Shutdown: reset, buffers back to the pool, rings freed after the device is quiet.
    a.shutdown()?;
    b.shutdown()?;
    Ok(())
}

/// An Ethernet frame from `src` to `dst` (EtherType 0x88b5, local experimental) whose payload
/// bytes are all `seq`'s low byte.
fn fill_frame(f: &mut [u8], dst: [u8; 6], src: [u8; 6], seq: u64) {
    f[0..6].copy_from_slice(&dst);
    f[6..12].copy_from_slice(&src);
    f[12..14].copy_from_slice(&0x88b5u16.to_be_bytes());
    f[14..].fill(seq as u8);
}

/// The frame count and size arguments (1000 frames of 1514 bytes when not given).
fn counts(args: &[String]) -> Result<(u64, usize), std::num::ParseIntError> {
    let frames = args.get(3).map(|s| s.parse()).transpose()?.unwrap_or(1000);
    let size = args.get(4).map(|s| s.parse()).transpose()?.unwrap_or(1514);
    Ok((frames, size))
}

/// Say how to call it and exit with status 2.
fn usage() -> ! {
    eprintln!("usage: nic_burst <tx-bdf> <rx-bdf> [frames=1000] [frame-size=1514]");
    std::process::exit(2);
}
