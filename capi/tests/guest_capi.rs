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
    let out = run("ubd_capi_test_asan");
    assert!(!out.contains("AddressSanitizer"), "{out}");
}
