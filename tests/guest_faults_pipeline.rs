//! Guest tests of the post-run IOMMU fault check of `ubdirect pipeline` and `ubdirect perf`
//! (RELIABILITY.md row 21): a DMA fault record for the run's device in the kernel log makes the
//! tool fail (exit 1) with the record and what it means; a record for another device does not.
//!
//! QEMU completes a read into an unmapped IOVA with success, and a separate process cannot unmap
//! the tool's own pool, so the fault record is written into the kernel log through /dev/kmsg
//! (root may) while the tool runs, in the exact text the guest kernel logs for a real fault
//! (`guest_faults.rs::read_into_an_unmapped_pool_is_detected_through_dmar_faults` shows one).
//! The tool reads the real kernel log; only the record's origin is staged.

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ubdirect_testbed as testbed;
use ubdirect_testbed::cli::wait_or_kill;

/// The record the guest kernel logs for an NVMe read into an unmapped IOVA, for `bdf`.
fn dmar_record(bdf: &str) -> String {
    format!(
        "DMAR: [DMA Write NO_PASID] Request device [{bdf}] fault addr 0xdead000 [fault reason 0x05] PTE Write access is not set"
    )
}

/// What a tool run gave.
struct ToolRun {
    code: Option<i32>,
    stderr: String,
    elapsed: Duration,
}

/// Run `ubdirect <args>`; 2 s in, write `record` into the kernel log. Killed after 120 s.
fn run_with_record(args: &[&str], record: &str) -> ToolRun {
    let t = Instant::now();
    let mut child = Command::new("ubdirect")
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run ubdirect (in PATH in the guest)");
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        child.try_wait().unwrap().is_none(),
        "ubdirect {args:?} ended before the record was written"
    );
    let mut kmsg = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/kmsg")
        .expect("open /dev/kmsg for writing (root)");
    kmsg.write_all(format!("<3>{record}\n").as_bytes())
        .expect("write the record into the kernel log");
    let status = wait_or_kill(
        &mut child,
        t,
        Duration::from_secs(120),
        Duration::from_millis(50),
    )
    .unwrap_or_else(|| panic!("ubdirect {args:?} still running after 120 s: killed"));
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    ToolRun {
        code: status.code(),
        stderr,
        elapsed: t.elapsed(),
    }
}

fn nvme0() -> (String, String) {
    let addr: ubdirect::dma::PciAddress = testbed::require().nvme[0].parse().unwrap();
    let short = format!("{:02x}:{:02x}.{}", addr.bus, addr.device, addr.function);
    (addr.to_string(), short)
}

/// The other NVMe controller's short address: a record for it must not fail a run on nvme0.
fn nvme1_short() -> String {
    let addr: ubdirect::dma::PciAddress = testbed::require().nvme[1].parse().unwrap();
    format!("{:02x}:{:02x}.{}", addr.bus, addr.device, addr.function)
}

fn assert_reports_the_fault(r: &ToolRun, short: &str, what: &str) {
    println!(
        "{what}: exit {:?} after {:?}\n{}",
        r.code, r.elapsed, r.stderr
    );
    assert_eq!(r.code, Some(1), "{what}: {}", r.stderr);
    assert!(r.stderr.contains("IOMMU DMA fault"), "{}", r.stderr);
    assert!(
        r.stderr.contains("the direct path is broken"),
        "{}",
        r.stderr
    );
    assert!(
        r.stderr
            .contains(&format!("Request device [{short}] fault addr 0xdead000")),
        "the record is quoted: {}",
        r.stderr
    );
}

#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn pipeline_fails_on_an_iommu_fault_of_its_device() {
    let (addr, short) = nvme0();
    let args = [
        "pipeline",
        "--source",
        &format!("nvme:{addr}"),
        "--sink",
        "null",
        "--block-size",
        "512K",
        "--qd",
        "2",
        "--seconds",
        "4",
    ];
    let r = run_with_record(&args, &dmar_record(&short));
    assert_reports_the_fault(&r, &short, "pipeline, fault of its device");
    // A fault of another device is not this run's.
    let r = run_with_record(&args, &dmar_record(&nvme1_short()));
    assert_eq!(r.code, Some(0), "pipeline, other device: {}", r.stderr);
}

#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn perf_fails_on_an_iommu_fault_of_its_device() {
    let (addr, short) = nvme0();
    let args = ["perf", &addr, "-q", "4", "-t", "4"];
    let r = run_with_record(&args, &dmar_record(&short));
    assert_reports_the_fault(&r, &short, "perf, fault of its device");
    let r = run_with_record(&args, &dmar_record(&nvme1_short()));
    assert_eq!(r.code, Some(0), "perf, other device: {}", r.stderr);
}
