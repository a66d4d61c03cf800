//! Guest tests of `ubdirect loopback` end to end (the binary the test bed puts in PATH): the
//! userspace path with GPU-BAR buffers, the kernel baselines (AF_PACKET sockets, PACKET_MMAP
//! rings, AF_XDP sockets), and refused arguments.

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use ubdirect_core::pci::PciAddress;
use ubdirect_testbed as testbed;

fn ubdirect(args: &[&str]) -> Output {
    Command::new("ubdirect")
        .args(args)
        .output()
        .expect("run `ubdirect` (the test bed puts target/debug/ubdirect in the guest's PATH)")
}

fn json(o: &Output) -> serde_json::Value {
    let text = String::from_utf8_lossy(&o.stdout);
    serde_json::from_str(&text).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {text}\nstderr: {}",
            String::from_utf8_lossy(&o.stderr)
        )
    })
}

/// `ubdirect loopback --tx <tx> --rx <rx>` followed by `more`.
fn loopback(tx: &str, rx: &str, more: &[&str]) -> Output {
    let mut args = vec!["loopback", "--tx", tx, "--rx", rx];
    args.extend_from_slice(more);
    ubdirect(&args)
}

/// The command's stderr as text.
fn stderr_of(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The JSON report of a run that must have succeeded (`context` starts the failure message).
fn json_of_success(o: &Output, context: &str) -> serde_json::Value {
    assert!(
        o.status.success(),
        "{context}exit {:?}: {}",
        o.status,
        stderr_of(o)
    );
    json(o)
}

fn nics() -> (String, String, String) {
    let tb = testbed::require();
    assert!(tb.nics.len() >= 2, "two NICs needed: {:?}", tb.nics);
    (
        tb.nics[0].clone(),
        tb.nics[1].clone(),
        tb.ivshmem.expect("ivshmem"),
    )
}

/// Rebinds the NICs to vfio-pci when dropped (the plan expects every device on vfio-pci).
struct BackToVfio(Vec<String>);
impl Drop for BackToVfio {
    fn drop(&mut self) {
        let st = Command::new("bind-vfio").args(&self.0).status();
        assert!(
            st.is_ok_and(|s| s.success()),
            "bind-vfio {:?} failed",
            self.0
        );
    }
}

#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn loopback_through_gpu_bar_is_byte_exact() {
    let (a, b, iv) = nics();
    let o = loopback(&a, &b, &["--gpu-bar", &iv, "--frames", "3000", "--json"]);
    let r = json_of_success(&o, "");
    assert_eq!(r["mode"], "ubdirect");
    assert_eq!(r["frames_sent"], 3000);
    assert_eq!(r["frames_received"], 3000);
    assert_eq!(r["mismatches"], 0);
    assert_eq!(r["drops"], 0);
    assert_eq!(
        r["frame_size"], 1514,
        "default frame size is the device maximum"
    );
    assert!(r["buffers"].as_str().unwrap().starts_with("gpu-bar"));
    assert_eq!(r["rx_stats"]["rx_packets"], 3000);
    assert!(r["segments_ns_per_frame"]["tx_burst"].as_f64().unwrap() > 0.0);
}

#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn loopback_refuses_bad_arguments() {
    let (a, b, iv) = nics();
    let o = loopback(&a, &b, &["--frame-size", "65536", "--frames", "10"]);
    assert_eq!(o.status.code(), Some(1));
    let err = stderr_of(&o);
    assert!(
        err.contains("--frame-size 65536 is out of range") && err.contains("1514"),
        "{err}"
    );
    let o = loopback(&a, &a, &[]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr_of(&o).contains("two NICs"));
    let o = loopback(&a, &b, &["--gpu-bar", &format!("{iv}/7")]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr_of(&o).contains("BAR 7 does not exist"));
    // The NICs still work after the refusals.
    let o = loopback(&a, &b, &["--frames", "100", "--frame-size", "60"]);
    assert!(o.status.success(), "{}", stderr_of(&o));
}

#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn kernel_baseline_moves_the_same_frames() {
    let (a, b, iv) = nics();
    let _back = BackToVfio(vec![a.clone(), b.clone(), iv.clone()]);
    let st = Command::new("bind-kernel")
        .args([&a, &b, &iv])
        .status()
        .expect("bind-kernel");
    assert!(st.success(), "bind-kernel failed");
    let o = loopback(
        &a,
        &b,
        &[
            "--kernel",
            "--frames",
            "500",
            "--frame-size",
            "512",
            // A small window keeps the kernel path's own drops (a full guest RX ring or socket
            // buffer under host load) out of a correctness test.
            "--window",
            "32",
            "--json",
        ],
    );
    let r = json_of_success(&o, "");
    assert_eq!(r["mode"], "kernel");
    assert_eq!(r["frames_received"], 500);
    assert_eq!(r["mismatches"], 0);
    // The copy path: frames copied by the CPU between socket buffers and the ivshmem BAR
    // (mapped through sysfs), verified in the BAR.
    let o = loopback(
        &a,
        &b,
        &[
            "--kernel",
            "--gpu-bar",
            &iv,
            "--frames",
            "300",
            "--window",
            "32",
            "--json",
        ],
    );
    let r = json_of_success(&o, "");
    assert_eq!(r["frames_received"], 300);
    assert_eq!(r["mismatches"], 0);
    assert!(r["buffers"].as_str().unwrap().contains("gpu-bar"), "{r}");
    // BAR 0 of ivshmem is its 256-byte register block: refused by name.
    let o = loopback(&a, &b, &["--kernel", "--gpu-bar", &format!("{iv}/0")]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr_of(&o).contains("too small"), "{}", stderr_of(&o));
}

/// Each kernel path of `--kernel` (AF_PACKET sockets, PACKET_MMAP TPACKET_V3 rings, AF_XDP
/// sockets in copy mode) carries
/// the pattern byte-exact and reports its CPU cost; then each path and the userspace driver run
/// for the same time in this boot, their figures printed side by side (`UBD-FIGURE` lines).
#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn kernel_ring_paths_move_the_same_frames() {
    let (a, b, iv) = nics();
    let figure_secs = std::env::var("UBD_LOOPBACK_FIGURE_SECS").unwrap_or_else(|_| "3".into());
    {
        let _back = BackToVfio(vec![a.clone(), b.clone(), iv.clone()]);
        let st = Command::new("bind-kernel")
            .args([&a, &b, &iv])
            .status()
            .expect("bind-kernel");
        assert!(st.success(), "bind-kernel failed");
        let paths = [
            ("packet", "kernel"),
            ("tpacket-v3", "kernel-tpacket-v3"),
            ("af-xdp", "kernel-af-xdp"),
        ];
        let mut ran = Vec::new();
        'paths: for (path, mode) in paths {
            for bar in [None, Some(iv.as_str())] {
                let mut args = vec!["--kernel", path, "--frames", "500", "--frame-size", "512"];
                // A small window keeps the kernel path's own drops out of a correctness test.
                args.extend(["--window", "32", "--json"]);
                if let Some(bar) = bar {
                    args.extend(["--gpu-bar", bar]);
                }
                // The kernel's own ring paths may drop a frame under load (its drops, not a
                // corruption): a run that lost frames but mismatched none is tried again, twice.
                let mut o = loopback(&a, &b, &args);
                for _ in 0..2 {
                    if o.status.success() || !stderr_of(&o).contains("dropped, 0 mismatched)") {
                        break;
                    }
                    println!("{args:?}: frames dropped, tried again: {}", stderr_of(&o));
                    o = loopback(&a, &b, &args);
                }
                if path == "af-xdp" && !o.status.success() && lacks_xdp(&o) {
                    println!(
                        "{}",
                        testbed::skip_line(
                            "kernel_ring_paths_move_the_same_frames",
                            "af-xdp: this kernel has no bpf() system call or AF_XDP sockets"
                        )
                    );
                    continue 'paths;
                }
                let r = json_of_success(&o, &format!("{args:?}: "));
                assert_eq!(r["mode"], mode, "{r}");
                assert_eq!(r["frames_received"], 500, "{r}");
                assert_eq!(r["mismatches"], 0, "{r}");
                assert!(r["cpu_s_per_gb"].as_f64().unwrap() > 0.0, "{r}");
            }
            ran.push(path);
        }
        for path in ran {
            let o = loopback(&a, &b, &["--kernel", path, "--seconds", &figure_secs]);
            println!(
                "UBD-FIGURE --kernel {path}: {}",
                String::from_utf8_lossy(&o.stdout)
            );
        }
    }
    let o = loopback(&a, &b, &["--seconds", &figure_secs]);
    println!(
        "UBD-FIGURE ubdirect: {}",
        String::from_utf8_lossy(&o.stdout)
    );
    assert!(o.status.success(), "{}", stderr_of(&o));
}

/// Whether a failed `loopback --kernel af-xdp` says the kernel lacks what AF_XDP needs.
fn lacks_xdp(o: &Output) -> bool {
    let e = String::from_utf8_lossy(&o.stderr);
    e.contains("CONFIG_BPF_SYSCALL") || e.contains("CONFIG_XDP_SOCKETS")
}

/// The receiving NIC stops decoding and DMAing (its PCI command register cleared through sysfs)
/// while `ubdirect loopback` runs: the run ends with the typed DeviceGone error within a bound,
/// not with a report of a quiet link, and the NICs carry frames again afterwards.
#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn loopback_ends_with_device_gone_when_the_rx_nic_vanishes() {
    const PCI_COMMAND: u64 = 4;
    const MEMORY_AND_BUS_MASTER: u16 = 0x6;
    let (a, b, _) = nics();
    let addr: PciAddress = b.parse().expect("NIC address");
    let config = OpenOptions::new()
        .read(true)
        .write(true)
        .open(format!("/sys/bus/pci/devices/{addr}/config"))
        .expect("open the NIC's config space");
    let mut child = Command::new("ubdirect")
        .args(["loopback", "--tx", &a, "--rx", &b, "--seconds", "30"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run `ubdirect loopback`");
    // Let the run get going (open, bring-up, frames moving).
    std::thread::sleep(Duration::from_millis(1500));
    let mut cmd = [0u8; 2];
    config.read_exact_at(&mut cmd, PCI_COMMAND).unwrap();
    let original = u16::from_le_bytes(cmd);
    assert_eq!(
        original & MEMORY_AND_BUS_MASTER,
        MEMORY_AND_BUS_MASTER,
        "the driver enabled the NIC"
    );
    let vanished = Instant::now();
    config
        .write_all_at(
            &(original & !MEMORY_AND_BUS_MASTER).to_le_bytes(),
            PCI_COMMAND,
        )
        .unwrap();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break Some(st);
        }
        if vanished.elapsed() > Duration::from_secs(15) {
            child.kill().unwrap();
            break None;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let ended_ms = vanished.elapsed().as_millis();
    let out = child.wait_with_output().unwrap();
    // Memory decoding back on (bus mastering stays for the next driver to enable).
    config
        .write_all_at(&(original & !0x4).to_le_bytes(), PCI_COMMAND)
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("loop-back ended {ended_ms} ms after the NIC vanished: {status:?}\n{stderr}");
    let status = status.expect("`ubdirect loopback` did not end within 15 s of the NIC vanishing");
    assert!(!status.success(), "a dead NIC must fail the run");
    assert!(
        stderr.contains(&format!("{addr} is gone")) && stderr.contains("device_status reads"),
        "the error names the device and the cause: {stderr}"
    );
    // The health interval is 100 ms; the bound leaves room for a loaded TCG host.
    assert!(
        ended_ms < 5000,
        "ended {ended_ms} ms after the NIC vanished"
    );
    // The NICs work again.
    let o = loopback(&a, &b, &["--frames", "200", "--json"]);
    assert_eq!(
        json_of_success(&o, "after the fault: ")["frames_received"],
        200
    );
}
