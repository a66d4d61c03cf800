//! Guest tests: `ubdirect perf --verify` and `ubdirect pipeline --verify` survive a controller
//! reset under them (issue 9, "Deadlines and recovery"). The reset is a Function Level Reset
//! through sysfs (`/sys/bus/pci/devices/<addr>/reset`), from outside the tool, mid-run: the
//! controller forgets its queues (CSTS.RDY=0); the tools' queues (`Recovery::Requeue`) find it
//! from `io_timeout / 4` on, reset the controller, re-create their queues and submit what was in
//! flight again. The run ends with exit 0, no I/O error, verify OK, and the reset counted.

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use ubdirect_core::testbed;

/// Run `ubdirect <args>`; `reset_after` into the run, reset the PCI function `addr` through
/// sysfs (None: no reset). Returns the output, the run's duration and when the reset was done.
fn run(args: &[&str], addr: &str, reset_after: Option<Duration>) -> (Output, Duration) {
    let t0 = Instant::now();
    let child = Command::new("ubdirect")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run ubdirect (in PATH in the guest)");
    let reset = reset_after.map(|after| {
        let path = format!("/sys/bus/pci/devices/{addr}/reset");
        std::thread::spawn(move || {
            std::thread::sleep(after);
            std::fs::write(&path, "1").unwrap_or_else(|e| panic!("write 1 to {path}: {e}"));
        })
    });
    let out = child.wait_with_output().expect("wait for ubdirect");
    if let Some(r) = reset {
        r.join().expect("the reset thread");
    }
    let took = t0.elapsed();
    println!(
        "ubdirect {args:?}: exit {:?} after {took:?}\nstdout:\n{}\nstderr:\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out, took)
}

#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn perf_verify_survives_a_controller_reset() {
    let tb = testbed::require();
    let addr = tb.nvme[1].clone();
    // The region guest_nvme_cli's perf test writes too (nvme1 ns2, 48-52 MiB).
    let args = [
        "perf",
        &addr,
        "--ns",
        "2",
        "-q",
        "8",
        "-o",
        "8192",
        "-w",
        "rw",
        "-M",
        "50",
        "-t",
        "6",
        "--verify",
        "--offset-mib",
        "48",
        "--span-mib",
        "4",
        "--json",
    ];
    let (out, took) = run(&args, &addr, Some(Duration::from_secs(2)));
    assert_eq!(out.status.code(), Some(0));
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let t = &v["total"];
    assert_eq!(t["controller_resets"], 1, "{t}");
    assert_eq!(t["errors"], 0);
    assert_eq!(t["verify_errors"], 0);
    let core = &v["cores"][0];
    assert_eq!(core["resets"], 1, "{core}");
    assert!(core["requeued"].as_u64().unwrap() >= 1, "{core}");
    assert!(core["verified_blocks"].as_u64().unwrap() > 0, "{core}");
    // 6 s of I/O plus the recovery (found from io_timeout / 4 = 2.5 s after the reset).
    assert!(took < Duration::from_secs(6 + 3 + 3), "{took:?}");
}

#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn pipeline_verify_survives_a_controller_reset() {
    let tb = testbed::require();
    let addr = tb.nvme[0].clone();
    let source = format!("nvme:{addr}");
    // Small blocks at QD 1: the whole namespace twice (stream, then the verify re-read) takes
    // seconds in the TCG guest, so a reset lands inside the run.
    let args = [
        "pipeline",
        "--source",
        &source,
        "--sink",
        "null",
        "--block-size",
        "4K",
        "--qd",
        "1",
        "--bytes",
        "64M",
        "--verify",
    ];
    let (base, base_took) = run(&args, &addr, None);
    assert_eq!(base.status.code(), Some(0));
    assert!(
        base_took > Duration::from_millis(1500),
        "the run is too short to reset it mid-way: {base_took:?}"
    );
    let (out, took) = run(&args, &addr, Some(base_took / 2));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stdout
            .lines()
            .any(|l| l.contains("verify") && l.contains("OK")),
        "{stdout}"
    );
    assert!(
        stderr.contains(&format!(
            "NVMe controller {addr} was reset 1 time(s) during the run"
        )),
        "{stderr}"
    );
    // The recovery added about io_timeout / 4 (2.5 s) plus the reset to the run.
    assert!(
        took > base_took + Duration::from_secs(2) && took < base_took * 3 + Duration::from_secs(8),
        "{took:?} vs {base_took:?} without the reset"
    );
}
