//! Guest tests of the igb VF driver on QEMU's 82576 (`UBD_IGB`'s first PF): the PF on the
//! kernel igb driver creates two VFs (`sriov_numvfs`), both go to vfio-pci, and frames cross
//! from VF to VF (QEMU's internal VMDq switch) byte-exact; a VF whose PF driver goes down (its
//! interface set down: the driver resets the PF and stops answering the mailbox) is a clear
//! error, mid-run and at open.
//!
//! The tests change the PF's driver and VFs, so they run one at a time (a lock) and leave the
//! PF without VFs. They run with `UBD_IGB_VF=1` only, in a guest whose VF BARs lie below
//! 4 GiB: QEMU 10.0.2 maps a VF's BARs at the low 32 bits of their 64-bit address (`info mtree`
//! showed `igbvf-mmio` at 0x20000000 where the guest kernel put VF BAR 0 at 0xc020000000), so
//! in the standard test bed every VF register reads 0. A 32-bit physical address space puts
//! them below 4 GiB: `scripts/vm/igbvf.sh` builds this binary and runs it in such a guest.

use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ubdirect_core::pci::PciDevice;
use ubdirect_core::seams::{Nic, NicFrame};
use ubdirect_core::ub::{PoolConfig, UbPool, UbRegistry};
use ubdirect_core::vfio::DmaDomain;
use ubdirect_igb::{IgbError, IgbVf, IgbVfConfig};
use ubdirect_testbed as testbed;
use ubdirect_virtio_net::pattern::{self, Check};

const DEADLINE: Duration = Duration::from_secs(20);
const MAC_A: [u8; 6] = [0x02, 0x55, 0, 0, 0x0f, 0x01];
const MAC_B: [u8; 6] = [0x02, 0x55, 0, 0, 0x0f, 0x02];
/// The PF and its VFs are shared state: one test at a time.
static PF_LOCK: Mutex<()> = Mutex::new(());

/// Runs a shell script in the guest with `args` as $1...; panics with its output on failure.
fn sh(script: &str, args: &[&str]) -> String {
    let out = Command::new("sh")
        .arg("-c")
        .arg(script)
        .arg("sh")
        .args(args)
        .output()
        .expect("run sh");
    let (o, e) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(out.status.success(), "script failed: {script}\n{o}\n{e}");
    o
}

/// Puts `pf` on `driver` (igb or vfio-pci) with its link up, creates `n` VFs (not probed by any
/// kernel driver), binds them to vfio-pci and returns their addresses.
fn make_vfs(pf: &str, driver: &str, n: usize) -> Vec<String> {
    let script = r#"
        set -e
        pf=$1; drv=$2; n=$3; d=/sys/bus/pci/devices/$pf
        [ -e "$d/sriov_numvfs" ] || { echo "$pf has no SR-IOV capability" >&2; exit 1; }
        [ -e "$d/driver" ] && [ "$(cat $d/sriov_numvfs)" != 0 ] && echo 0 >"$d/sriov_numvfs"
        if [ "$drv" = igb ]; then
            modprobe igb
            echo igb >"$d/driver_override"
            [ -e "$d/driver" ] && echo "$pf" >"$d/driver/unbind"
            echo "$pf" >/sys/bus/pci/drivers_probe
            for i in $d/net/*; do ip link set "${i##*/}" up; done
        else
            bind-vfio "$pf" >&2
            echo 1 >/sys/module/vfio_pci/parameters/enable_sriov
        fi
        drv_now=$(readlink "$d/driver"); [ "${drv_now##*/}" = "$drv" ] || { echo "$pf is on ${drv_now##*/}" >&2; exit 1; }
        echo 0 >"$d/sriov_drivers_autoprobe"
        echo "$n" >"$d/sriov_numvfs"
        i=0
        while [ $i -lt "$n" ]; do
            v=$(readlink "$d/virtfn$i"); v=${v##*/}
            bind-vfio "$v" >&2
            # QEMU decodes a VF's BARs only with the memory bit of the VF's own command
            # register set (a driverless VF read all zeros until it was); vfio-pci emulates
            # that bit for VFs, so it is set here, in the device, before the open.
            printf '\006\000' | dd of="/sys/bus/pci/devices/$v/config" bs=1 seek=4 count=2 conv=notrunc 2>/dev/null
            echo "$v"
            i=$((i + 1))
        done
    "#;
    let n_s = n.to_string();
    let out = sh(script, &[pf, driver, &n_s]);
    out.lines().map(str::to_string).collect()
}

/// Removes the PF's VFs (their vfio handles must be closed first) and unloads igb, so both
/// PFs are driverless again as the test bed starts them (other guest tests bind them to
/// vfio-pci).
fn remove_vfs(pf: &str) {
    sh(
        r#"d=/sys/bus/pci/devices/$1; [ -e "$d/driver" ] && echo 0 >"$d/sriov_numvfs"
           echo >"$d/driver_override"; rmmod igb 2>/dev/null; true"#,
        &[pf],
    );
}

/// The first igb PF of the test bed, or `None` (with a skip line).
fn pf() -> Option<String> {
    let tb = testbed::require();
    if std::env::var("UBD_IGB_VF").as_deref() != Ok("1") {
        testbed::skip("the igb VF tests run with UBD_IGB_VF=1 only (QEMU 10.0.2 maps VF BARs at the low 32 bits of their address: scripts/vm/igbvf.sh runs them in a guest with VF BARs below 4 GiB)");
        return None;
    }
    match tb.igb.first() {
        Some(pf) => Some(pf.clone()),
        None => {
            testbed::skip(&format!(
                "the test bed has no igb NIC (UBD_IGB={:?})",
                tb.igb
            ));
            None
        }
    }
}

fn frame(pool: &Arc<UbPool>, len: usize, dst: [u8; 6], src: [u8; 6], seq: u64) -> NicFrame {
    let mut b = pool.get().expect("tx buffer");
    pattern::fill(&mut b.as_mut_slice()[..len], dst, src, seq);
    NicFrame::new(b, 0, len)
        .map_err(|(_, e)| e)
        .expect("tx frame")
}

/// Sends `total` pattern frames of `len` bytes from `a` to `b` and checks each arrives
/// byte-exact and in order (frames of other EtherTypes are skipped).
fn stream(pool: &Arc<UbPool>, a: &mut IgbVf, b: &mut IgbVf, len: usize, first: u64, total: u64) {
    let (am, bm) = (a.mac().expect("MAC A"), b.mac().expect("MAC B"));
    let (mut next, mut expect) = (first, first);
    let (mut txv, mut out) = (Vec::with_capacity(16), Vec::with_capacity(32));
    let start = Instant::now();
    while expect < first + total {
        while next < first + total && txv.len() < 8 && next - expect < 24 {
            txv.push(frame(pool, len, bm, am, next));
            next += 1;
        }
        if !txv.is_empty() {
            a.pair(0).unwrap().tx_burst(&mut txv).expect("tx_burst");
        }
        b.pair(0).unwrap().rx_burst(&mut out).expect("rx_burst");
        for f in out.drain(..) {
            match pattern::verify(f.data(), bm, am, len) {
                Check::Good(seq) => assert_eq!(seq, expect, "frame out of order"),
                Check::Foreign => continue,
                other => panic!(
                    "frame {expect} (len {}) is not byte-exact: {other:?}",
                    f.len()
                ),
            }
            expect += 1;
        }
        a.pair(0).unwrap().reclaim_tx().expect("reclaim");
        assert!(
            start.elapsed() < DEADLINE,
            "len {len}: stuck at {expect} of {}: A {:?} B {:?}",
            first + total,
            a.stats(),
            b.stats()
        );
    }
}

#[test]
#[ignore = "guest: needs the igb kernel module and vfio, run by scripts/test.sh"]
fn igbvf_vf_to_vf_frames_are_byte_exact() {
    let Some(pf) = pf() else { return };
    let _l = PF_LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let vfs = make_vfs(&pf, "igb", 2);
    {
        let domain = DmaDomain::new().expect("vfio container");
        let da = PciDevice::open(&domain, vfs[0].parse().unwrap()).expect("open VF 0");
        let db = PciDevice::open(&domain, vfs[1].parse().unwrap()).expect("open VF 1");
        let registry = UbRegistry::new(domain.clone());
        let cfg = PoolConfig {
            block_size: 4096,
            block_count: 2048,
        };
        let pool = UbPool::with_hugepages(&registry, cfg, None).expect("hugepage pool");
        // The PF's kernel driver answers the mailbox from its interrupt work: in a TCG guest on
        // a loaded host that took over the 1 s default once (no answer at all, V2PMAILBOX 0).
        let vf_cfg = |mac| IgbVfConfig {
            mac: Some(mac),
            mailbox_timeout: Duration::from_secs(10),
            ..IgbVfConfig::default()
        };
        let mut a = IgbVf::from_device(&registry, da, pool.clone(), vf_cfg(MAC_A)).expect("VF A");
        let mut b = IgbVf::from_device(&registry, db, pool.clone(), vf_cfg(MAC_B)).expect("VF B");
        eprintln!("VF A {:?}, VF B {:?}", a.info(), b.info());
        assert_eq!(
            (Nic::driver(&a), a.mac(), b.mac()),
            ("igb-vf", Some(MAC_A), Some(MAC_B))
        );
        assert!(a.link_up().unwrap());
        let mut seq = 0;
        for len in [60, 61, 128, 1000, 1514, 1518] {
            stream(&pool, &mut a, &mut b, len, seq, 40);
            stream(&pool, &mut b, &mut a, len, seq + 40, 40);
            seq += 80;
        }
        a.shutdown().expect("VF A shutdown");
        b.shutdown().expect("VF B shutdown");
    }
    remove_vfs(&pf);
}

/// Sets the PF's network interface down or up (the igb driver resets the PF on both).
fn pf_link(pf: &str, up: bool) {
    let state = if up { "up" } else { "down" };
    sh(
        r#"for i in /sys/bus/pci/devices/$1/net/*; do ip link set "${i##*/}" "$2"; done"#,
        &[pf, state],
    );
}

#[test]
#[ignore = "guest: needs the igb kernel module and vfio, run by scripts/test.sh"]
fn igbvf_a_vf_whose_pf_driver_goes_down_is_a_clear_error() {
    let Some(pf) = pf() else { return };
    let _l = PF_LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let vfs = make_vfs(&pf, "igb", 1);
    {
        let domain = DmaDomain::new().expect("vfio container");
        let dev = PciDevice::open(&domain, vfs[0].parse().unwrap()).expect("open VF");
        let registry = UbRegistry::new(domain.clone());
        let cfg = PoolConfig {
            block_size: 4096,
            block_count: 512,
        };
        let pool = UbPool::with_hugepages(&registry, cfg, None).expect("hugepage pool");
        let mut vf =
            IgbVf::from_device(&registry, dev.clone(), pool.clone(), IgbVfConfig::default())
                .expect("VF up while the PF driver is up");
        // The igb driver resets the PF when its interface goes down: the VF's queues stop.
        pf_link(&pf, false);
        let t = Instant::now();
        let mut out = Vec::with_capacity(8);
        // The link goes first (LinkDown, not sticky); then the reset stops the VF's queues.
        let mut link_down_seen = false;
        let e = loop {
            match vf.pair(0).unwrap().rx_burst(&mut out) {
                Err(IgbError::LinkDown { .. }) => link_down_seen = true,
                Err(e) => break e,
                Ok(_) => out.clear(),
            }
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "no error but LinkDown ({link_down_seen}) after the PF went down"
            );
        };
        eprintln!("mid-run: {e} (after {:?})", t.elapsed());
        assert!(matches!(e, IgbError::DeviceGone { .. }), "{e}");
        drop(vf);
        // Opened again while the PF is down: RSTI stays set, nothing answers the mailbox.
        let t = Instant::now();
        let e = IgbVf::from_device(&registry, dev, pool, IgbVfConfig::default())
            .err()
            .expect("the PF driver is down: the open must fail");
        eprintln!("open: {e} (after {:?})", t.elapsed());
        assert!(
            matches!(
                e,
                IgbError::PfNotReady { .. } | IgbError::MailboxTimeout { .. }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("igb"), "{e}");
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    }
    pf_link(&pf, true);
    remove_vfs(&pf);
}
