//! Guest tests: the embedding examples run on the test bed's controllers and do what
//! they teach. `scripts/vm/suite.sh` builds the examples and puts them in the guest's PATH, and
//! binds the devices to vfio-pci.

use std::process::Command;

use ubdirect::dma::{DmaDomain, UbRegistry};
use ubdirect::nvme::controller::PROBE_READS;
use ubdirect::nvme::{Controller, ControllerOptions, ShadowDoorbells};
use ubdirect_testbed as testbed;

/// The controller's SMART Host Read Commands (all namespaces): opened and closed again, so an
/// example can open the device next. Opened with shadow doorbells off: the `Auto` probe would
/// add its own reads.
fn host_read_commands(addr: &str) -> u128 {
    let registry = UbRegistry::new(DmaDomain::new().expect("DMA domain"));
    let ctrl = Controller::open(
        &registry,
        addr.parse().unwrap(),
        ControllerOptions {
            shadow_doorbells: ShadowDoorbells::Off,
            ..ControllerOptions::default()
        },
    )
    .expect("the controller opens");
    let n = ctrl.smart_log().expect("SMART log").host_read_commands;
    drop(ctrl);
    n
}

/// Run example `name` with `args`; its stdout, or a failure with both streams.
fn run(name: &str, args: &[&str]) -> String {
    let out = Command::new(name)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{name} did not start ({e}): is it in the guest's PATH?"));
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(
        out.status.success(),
        "{name} {args:?}: {}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
    stdout
}

#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn hello_nvme_writes_and_reads_back_through_submit_ring_poll() {
    let tb = testbed::require();
    // The MDTS-0 controller's zero-filled namespace: its last 4 KiB are scratch (the PRP-chain
    // test writes from LBA 0).
    let addr = tb
        .nvme_mdts0
        .expect("no MDTS-0 NVMe controller in this guest (UBD_NVME_MDTS0 is empty)");
    let out = run("hello_nvme", &[&addr]);
    assert!(
        out.contains("namespace 1: 131072 blocks of 512 bytes"),
        "{out}"
    );
    assert!(
        out.contains("wrote and read back 4096 bytes at LBA 131064: identical"),
        "{out}"
    );
}

#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn nvme_per_thread_reads_with_one_queue_pair_per_thread() {
    let tb = testbed::require();
    let before = host_read_commands(&tb.nvme[0]);
    let out = run("nvme_per_thread", &[&tb.nvme[0], "2", "500"]);
    assert!(
        out.contains("2 threads, one queue pair each: 1000 reads of 4096 bytes"),
        "{out}"
    );
    // The effect, seen by the device: the 1000 reads reached it (one 4 KiB command each), plus
    // the shadow-doorbell probe's reads of the example's controller open (ShadowDoorbells::Auto).
    let after = host_read_commands(&tb.nvme[0]);
    let probe = PROBE_READS as u128;
    assert_eq!(
        after - before,
        1000 + probe,
        "SMART Host Read Commands {before} -> {after} (1000 reads + {probe} of the probe)"
    );
}

#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn pipeline_embedded_streams_and_verifies() {
    let tb = testbed::require();
    let out = run("pipeline_embedded", &[&tb.nvme[0], "8"]);
    assert!(out.contains("8388608 bytes in"), "{out}");
    assert!(out.contains("verify OK"), "{out}");
}

#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn nic_burst_sends_frames_through_an_env_from_one_nic_to_the_other() {
    let tb = testbed::require();
    let out = run("nic_burst", &[&tb.nics[0], &tb.nics[1], "200", "256"]);
    assert!(out.contains("200 frames of 256 B in"), "{out}");
}
