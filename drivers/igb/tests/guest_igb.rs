//! Guest tests of the igb driver on QEMU's 82576 (two PFs on one hub, `UBD_IGB`): device facts,
//! PF-to-PF frames of every size byte-exact with both rings wrapping, the device's own
//! statistics, refusals, and frames received into the GPU-BAR stand-in (ivshmem BAR2) checked
//! from the host.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ubdirect_core::pci::{PciAddress, PciDevice};
use ubdirect_core::seams::{Nic, NicFrame};
use ubdirect_core::ub::{PoolConfig, UbBuf, UbPool, UbRegion, UbRegistry};
use ubdirect_core::vfio::DmaDomain;
use ubdirect_igb::{Igb, IgbConfig, IgbError};
use ubdirect_testbed as testbed;
use ubdirect_virtio_net::pattern::{self, Check};

const DEADLINE: Duration = Duration::from_secs(20);

/// Fields drop in order: the registry (and its IOMMU mappings) before the devices.
struct Bed {
    registry: Arc<UbRegistry>,
    a: Arc<PciDevice>,
    b: Arc<PciDevice>,
    domain: Arc<DmaDomain>,
}

fn addr(s: &str) -> PciAddress {
    s.parse().expect("test-bed address parses")
}

/// The two igb NICs, or `None` (with a skip line) when the test bed has none.
fn bed() -> Option<Bed> {
    let tb = testbed::require();
    if tb.igb.len() < 2 {
        testbed::skip(&format!(
            "the test bed has no two igb NICs (UBD_IGB={:?})",
            tb.igb
        ));
        return None;
    }
    let domain = DmaDomain::new().expect("vfio container");
    let a = PciDevice::open(&domain, addr(&tb.igb[0])).expect("open igb A");
    let b = PciDevice::open(&domain, addr(&tb.igb[1])).expect("open igb B");
    let registry = UbRegistry::new(domain.clone());
    Some(Bed {
        registry,
        a,
        b,
        domain,
    })
}

fn hugepage_pool(bed: &Bed, count: usize) -> Arc<UbPool> {
    let cfg = PoolConfig {
        block_size: 4096,
        block_count: count,
    };
    UbPool::with_hugepages(&bed.registry, cfg, None).expect("hugepage pool")
}

fn open(bed: &Bed, dev: &Arc<PciDevice>, pool: &Arc<UbPool>, cfg: IgbConfig) -> Igb {
    Igb::from_device(&bed.registry, dev.clone(), pool.clone(), cfg).expect("igb up")
}

fn frame(
    pool: &Arc<UbPool>,
    off: usize,
    len: usize,
    dst: [u8; 6],
    src: [u8; 6],
    seq: u64,
) -> NicFrame {
    let mut b = pool.get().expect("tx buffer");
    // Through a copy: the pool may be a BAR region, never borrowed as a Rust slice.
    let mut bytes = vec![0u8; len];
    pattern::fill(&mut bytes, dst, src, seq);
    b.write_from(off, &bytes)
        .expect("the frame fits the buffer");
    NicFrame::new(b, off, len)
        .map_err(|(_, e)| e)
        .expect("tx frame")
}

/// A received frame's bytes, copied out of its buffer (host memory or a BAR).
fn bytes_of(f: &NicFrame) -> Vec<u8> {
    let mut v = vec![0u8; f.len()];
    f.buf().read_into(f.offset(), &mut v).expect("frame bytes");
    v
}

/// Sends `total` pattern frames of `len` bytes from `a` to `b` (at most `window` in flight)
/// and checks each one arrives byte-exact and in order. Returns the next sequence number.
fn stream(
    pool: &Arc<UbPool>,
    a: &mut Igb,
    b: &mut Igb,
    len: usize,
    (first, total): (u64, u64),
) -> u64 {
    let (am, bm) = (a.mac().expect("MAC A"), b.mac().expect("MAC B"));
    let (mut next, mut expect) = (first, first);
    let (mut txv, mut out) = (Vec::with_capacity(32), Vec::with_capacity(32));
    let start = Instant::now();
    while expect < first + total {
        while next < first + total && txv.len() < 16 && next - expect < 48 {
            txv.push(frame(pool, (next as usize % 4) * 64, len, bm, am, next));
            next += 1;
        }
        if !txv.is_empty() {
            a.pair(0).unwrap().tx_burst(&mut txv).expect("tx_burst");
        }
        b.pair(0).unwrap().rx_burst(&mut out).expect("rx_burst");
        for f in out.drain(..) {
            match pattern::verify(&bytes_of(&f), bm, am, len) {
                Check::Good(seq) => assert_eq!(seq, expect, "frame out of order"),
                other => panic!(
                    "frame {expect} (len {}) is not byte-exact: {other:?}",
                    f.len()
                ),
            }
            expect += 1;
        }
        a.pair(0).unwrap().reclaim_tx().expect("reclaim");
        let s = (a.stats(), b.stats());
        assert!(
            start.elapsed() < DEADLINE,
            "stuck at {expect} of {}: {s:?}",
            first + total
        );
    }
    next
}

#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn igb_device_facts_are_read_and_the_link_comes_up() {
    let Some(bed) = bed() else { return };
    let pool = hugepage_pool(&bed, 1024);
    let a = open(&bed, &bed.a, &pool, IgbConfig::default());
    let b = open(&bed, &bed.b, &pool, IgbConfig::default());
    assert_eq!(a.mac(), Some([0x52, 0x54, 0, 0, 2, 1]));
    assert_eq!(b.mac(), Some([0x52, 0x54, 0, 0, 2, 2]));
    assert!(a.link_up().unwrap() && b.link_up().unwrap());
    assert_eq!((Nic::driver(&a), Nic::max_frame(&a)), ("igb", 1518));
    eprintln!("igb A: {:?}", a.info());
}

#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn igb_pf_to_pf_frames_are_byte_exact_and_the_rings_wrap() {
    let Some(bed) = bed() else { return };
    let pool = hugepage_pool(&bed, 2048);
    let cfg = IgbConfig {
        rx_ring_size: 64,
        tx_ring_size: 64,
        ..IgbConfig::default()
    };
    let mut a = open(&bed, &bed.a, &pool, cfg.clone());
    let mut b = open(&bed, &bed.b, &pool, cfg);
    let mut seq = 0;
    let mut octets = 0;
    for len in [60, 61, 512, 1514, 1518] {
        // 200 frames per size on 64-entry rings: both rings wrap 15 times over the test.
        seq = stream(&pool, &mut a, &mut b, len, (seq, 200));
        octets += 200 * (len as u64 + 4);
    }
    let (sa, sb) = (a.stats(), b.stats());
    assert_eq!((sa.tx_packets, sb.rx_packets, sb.rx_drops), (seq, seq, 0));
    let (ha, hb) = (a.hw_stats().unwrap(), b.hw_stats().unwrap());
    assert_eq!(
        (ha.good_tx_packets, ha.good_tx_octets),
        (seq, octets),
        "{ha:?}"
    );
    assert_eq!(
        (hb.good_rx_packets, hb.good_rx_octets),
        (seq, octets),
        "{hb:?}"
    );
    eprintln!("tx {sa:?} {ha:?}\nrx {sb:?} {hb:?}");
}

#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn igb_bad_sizes_and_exhausted_pools_are_clean_refusals() {
    let Some(bed) = bed() else { return };
    let pool = hugepage_pool(&bed, 300);
    let small = hugepage_pool(&bed, 100);
    let r = Igb::from_device(&bed.registry, bed.a.clone(), small, IgbConfig::default());
    assert!(
        matches!(
            r,
            Err(IgbError::RxPoolTooSmall {
                blocks: 100,
                need: 255
            })
        ),
        "{:?}",
        r.err()
    );
    let mut a = open(&bed, &bed.a, &pool, IgbConfig::default());
    let am = a.mac().unwrap();
    let mut v = vec![frame(&pool, 0, 1519, am, am, 1)];
    let e = a.pair(0).unwrap().tx_burst(&mut v).unwrap_err();
    assert!(
        matches!(e, IgbError::FrameTooLarge { len: 1519, .. }),
        "{e}"
    );
    assert_eq!(v.len(), 1, "nothing sent");
    let bad = IgbConfig {
        rx_ring_size: 100,
        ..IgbConfig::default()
    };
    let r = Igb::from_device(&bed.registry, bed.b.clone(), pool.clone(), bad);
    assert!(matches!(r, Err(IgbError::InvalidConfig(_))));
    assert_eq!(a.hw_stats().unwrap().good_tx_packets, 0);
}

/// The ivshmem BAR2 as a region, and a pool over its 40..48 MiB window (the NVMe tests use the
/// start of the BAR, the virtio-net test its top 8 MiB).
fn bar_pool(bed: &Bed) -> (Arc<PciDevice>, Arc<UbRegion>, Arc<UbPool>, Vec<UbBuf>) {
    let tb = testbed::require();
    let iv = tb
        .ivshmem
        .expect("the test bed has an ivshmem device (UBD_IVSHMEM)");
    let dev = PciDevice::open(&bed.domain, addr(&iv)).expect("open ivshmem");
    let region = bed
        .registry
        .register_bar(&dev, 2)
        .expect("register ivshmem BAR2");
    let blocks = region.len / 4096;
    let cfg = PoolConfig {
        block_size: 4096,
        block_count: blocks,
    };
    let pool = UbPool::new(&bed.registry, region.clone(), cfg).expect("pool in BAR2");
    // Every block outside the window is held for the whole test.
    let held = (0..blocks)
        .map(|_| pool.get().expect("block"))
        .filter(|b| !(40 << 20..48 << 20).contains(&((b.iova() - region.iova) as usize)))
        .collect();
    (dev, region, pool, held)
}

#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn igb_frames_received_into_the_gpu_bar_reach_the_host_file() {
    let Some(bed) = bed() else { return };
    let (_iv, region, pool, _held) = bar_pool(&bed);
    let mut a = open(&bed, &bed.a, &pool, IgbConfig::default());
    let mut b = open(&bed, &bed.b, &pool, IgbConfig::default());
    let (am, bm) = (a.mac().unwrap(), b.mac().unwrap());
    let len = 1518;
    let seq = 0x1eb_c0ffee_u64;
    let mut v = vec![frame(&pool, 0, len, bm, am, seq)];
    a.pair(0).unwrap().tx_burst(&mut v).expect("tx_burst");
    let mut out = Vec::with_capacity(4);
    let start = Instant::now();
    while out.is_empty() {
        b.pair(0).unwrap().rx_burst(&mut out).expect("rx_burst");
        assert!(start.elapsed() < DEADLINE, "nothing arrived");
    }
    let f = &out[0];
    let data = bytes_of(f);
    assert!(matches!(pattern::verify(&data, bm, am, len), Check::Good(s) if s == seq));
    assert_eq!(
        f.buf().region().id,
        region.id,
        "received into the BAR region"
    );
    let off = (f.buf().iova() - region.iova) as usize + f.offset();
    assert!(
        (40 << 20..48 << 20).contains(&off),
        "RX buffer in the 40..48 MiB window"
    );
    for (name, at, bytes) in [
        ("igb_rx_into_gpu_bar_head", off, &data[..64]),
        (
            "igb_rx_into_gpu_bar_tail",
            off + len - 32,
            &data[len - 32..],
        ),
    ] {
        println!(
            "{}",
            testbed::hostcheck_file_bytes(name, testbed::GPUBAR_FILE, at as u64, bytes)
        );
    }
}

/// NIC B stops decoding and DMAing (memory decoding and bus mastering cleared in its command
/// register through sysfs) while frames move: its bursts end with `DeviceGone` naming the
/// device within a bound and its shutdown refuses to call the reset confirmed (so its DMA
/// domain, and with it the IOMMU group, stays held until the process ends: the scenario runs in
/// a child process). Afterwards both NICs carry frames again.
#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn igb_a_nic_that_stops_decoding_is_gone_not_a_quiet_link() {
    const NAME: &str = "igb_a_nic_that_stops_decoding_is_gone_not_a_quiet_link";
    if std::env::var_os("UBD_IGB_VANISH_CHILD").is_some() {
        return vanish_scenario();
    }
    // Once in a fresh-clone run (QEMU 10.0.2, TCG) the guest's CPU 0 stopped for good right
    // after NIC B stopped decoding; until that is understood the scenario runs on request only
    // (UBD_IGB_VANISH=1), and the suite counts it as a skip.
    if std::env::var_os("UBD_IGB_VANISH").is_none() {
        println!(
            "{}",
            testbed::skip_line(
                NAME,
                "the NIC-stops-decoding scenario runs with UBD_IGB_VANISH=1 only (a guest CPU froze after it once)"
            )
        );
        return;
    }
    let Some(bed0) = bed() else { return };
    drop(bed0);
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            NAME,
            "--nocapture",
            "--test-threads=1",
        ])
        .env("UBD_IGB_VANISH_CHILD", "1")
        .output()
        .expect("run the scenario in a child process");
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    println!("child: {text}");
    assert!(
        out.status.success() && text.contains("1 passed"),
        "the scenario failed: {text}"
    );
    let bed = bed().expect("the test bed");
    let pool = hugepage_pool(&bed, 2048);
    let mut a = open(&bed, &bed.a, &pool, IgbConfig::default());
    let mut b = open(&bed, &bed.b, &pool, IgbConfig::default());
    stream(&pool, &mut a, &mut b, 256, (0, 100));
}

fn vanish_scenario() {
    use std::os::unix::fs::FileExt;
    const PCI_COMMAND: u64 = 4;
    let bed = bed().expect("the test bed");
    let pool = hugepage_pool(&bed, 2048);
    let mut a = open(&bed, &bed.a, &pool, IgbConfig::default());
    let mut b = open(&bed, &bed.b, &pool, IgbConfig::default());
    stream(&pool, &mut a, &mut b, 256, (0, 100));
    let baddr = bed.b.address();
    let config = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(format!("/sys/bus/pci/devices/{baddr}/config"))
        .expect("open the NIC's config space");
    let mut cmd = [0u8; 2];
    config.read_exact_at(&mut cmd, PCI_COMMAND).unwrap();
    let original = u16::from_le_bytes(cmd);
    assert_eq!(
        original & 0x6,
        0x6,
        "the driver enabled memory decoding and bus mastering"
    );
    config
        .write_all_at(&(original & !0x6).to_le_bytes(), PCI_COMMAND)
        .unwrap();
    let vanished = Instant::now();
    let mut out = Vec::with_capacity(8);
    let e = loop {
        if let Err(e) = b.pair(0).unwrap().rx_burst(&mut out) {
            break e;
        }
        assert!(
            vanished.elapsed() < Duration::from_secs(5),
            "no error 5 s after the NIC vanished"
        );
    };
    eprintln!("gone after {:?}: {e}", vanished.elapsed());
    let sd = b.shutdown();
    // Memory decoding back on (bus mastering stays for the next driver to enable).
    config
        .write_all_at(&(original & !0x4).to_le_bytes(), PCI_COMMAND)
        .unwrap();
    assert!(matches!(e, IgbError::DeviceGone { .. }), "{e}");
    assert!(e.to_string().contains(&format!("{baddr} is gone")), "{e}");
    assert!(matches!(sd, Err(IgbError::DeviceGone { .. })), "{sd:?}");
}

/// `ubdirect loopback` picks the igb driver for two 82576 NICs by their device id and moves
/// frames byte-exact.
#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn igb_cli_loopback_runs_on_two_82576_nics() {
    let tb = testbed::require();
    if tb.igb.len() < 2 {
        testbed::skip("the test bed has no two igb NICs");
        return;
    }
    let (rc, out, err) = testbed::cli::ubdirect(&[
        "loopback", "--tx", &tb.igb[0], "--rx", &tb.igb[1], "--frames", "3000", "--json",
    ]);
    println!("{out}\n{err}");
    assert_eq!(rc, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).expect("JSON report");
    assert_eq!(v["frames_received"], 3000, "{v}");
    assert_eq!(v["mismatches"], 0, "{v}");
    assert_eq!(v["max_frame"], 1518, "{v}");
}
