//! Guest tests: the C API's test program (capi/tests/c/api_test.c, built by scripts/vm/suite.sh
//! with `cc -Wall -Werror` against libubdirect, plain and with AddressSanitizer) runs against
//! the test bed's emulated NVMe controller through vfio-pci.

use std::process::Command;

use ubdirect_testbed as testbed;

/// Run `bin` on the MDTS-0 controller's scratch blocks; its output, or a failure with it.
fn run(bin: &str) -> String {
    let tb = testbed::require();
    // The MDTS-0 controller's namespace is zero-filled scratch; its last 8 blocks are the Rust
    // hello_nvme example's, so this takes the 16 before them.
    let addr = tb
        .nvme_mdts0
        .expect("no MDTS-0 NVMe controller in this guest (UBD_NVME_MDTS0 is empty)");
    let out = Command::new(bin)
        .args([&addr, "-24"])
        .env("ASAN_OPTIONS", "detect_leaks=1:abort_on_error=0")
        .output()
        .unwrap_or_else(|e| panic!("{bin} did not start ({e}): is it in the guest's PATH?"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{bin}: {}\n{text}", out.status);
    assert!(text.contains(" passed, 0 failed"), "{text}");
    text
}

// One test: the two runs open the same controller, which one process at a time can drive.
#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn the_c_api_test_program_passes_on_the_emulated_nvme_plain_and_under_asan() {
    let out = run("ubd_capi_test");
    assert!(
        out.contains("ok - the read gives back the written bytes exactly"),
        "{out}"
    );
    assert!(
        out.contains("ok - a read past the end is refused with -ERANGE"),
        "{out}"
    );
    assert!(
        out.contains("ok - a missing PCI device gives -ENODEV"),
        "{out}"
    );
    println!("{out}");
    let out = run("ubd_capi_test_asan");
    assert!(!out.contains("AddressSanitizer"), "{out}");
}

/// IOPS of `ubdirect perf` (random 4 KiB reads at `qd` for `secs`) on `addr`.
fn cli_iops(addr: &str, qd: u32, secs: u32) -> f64 {
    let (q, t) = (qd.to_string(), secs.to_string());
    let o = Command::new("ubdirect")
        .args(["perf", addr, "-w", "randread", "-q", &q, "-t", &t, "--json"])
        .output()
        .expect("ubdirect perf did not start: is it in the guest's PATH?");
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "ubdirect perf: {}\n{out}\n{}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    let v: serde_json::Value = serde_json::from_str(&out).expect("perf --json");
    v["total"]["iops"].as_f64().expect("total.iops")
}

/// IOPS of the C perf loop (examples/c/perf_loop.c) with the same settings.
fn c_iops(addr: &str, qd: u32, secs: u32) -> f64 {
    let (q, t) = (qd.to_string(), secs.to_string());
    let o = Command::new("ubd_capi_perf_loop")
        .args([addr, &q, &t])
        .output()
        .expect("ubd_capi_perf_loop did not start: is it in the guest's PATH?");
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "perf_loop: {}\n{out}\n{}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    out.split(": ")
        .nth(2)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no IOPS in {out:?}"))
}

/// The C perf loop (random 4 KiB reads through the C API, a callback per I/O that submits the
/// next) and `ubdirect perf` on the same controller in the same boot, at QD1 and QD32, best of
/// two 2 s runs each: both keep their queue depth and complete I/O, and the ratio is printed.
/// It is not asserted: guest runs are debug builds on an emulated CPU, where either side's
/// IOPS moved 3x between runs on a busy host.
#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn the_c_perf_loop_runs_beside_ubdirect_perf() {
    let tb = testbed::require();
    let addr = tb.nvme[0].as_str();
    for qd in [1, 32] {
        let (mut cli, mut c) = (0f64, 0f64);
        for _ in 0..2 {
            cli = cli.max(cli_iops(addr, qd, 2));
            c = c.max(c_iops(addr, qd, 2));
        }
        println!(
            "qd {qd}: ubdirect perf {cli:.0} IOPS, C API {c:.0} IOPS: {:.3}x",
            c / cli
        );
        assert!(cli > 0.0 && c > 0.0, "qd {qd}: {cli} vs {c}");
    }
}
