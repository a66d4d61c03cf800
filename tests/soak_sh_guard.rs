//! scripts/soak.sh's guest side binds every test device to vfio-pci, writes their namespaces and
//! resets them: outside the project's test guest (this host) `--guest` is refused with a clear
//! message before anything runs (scripts/vm/guest/in-testbed decides).

use std::path::PathBuf;
use std::process::Command;

fn scripts() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scripts")
}

#[test]
fn soak_guest_side_refuses_to_run_on_a_host() {
    let marker = Command::new("sh")
        .arg(scripts().join("vm/guest/in-testbed"))
        .status()
        .expect("run sh in-testbed");
    if marker.success() {
        // Only inside the test guest; the guard's refusal cannot be shown there.
        eprintln!("this machine carries the test-bed marker: nothing to check");
        return;
    }
    let out = Command::new("sh")
        .arg(scripts().join("soak.sh"))
        .args(["--guest", "--duration", "1s"])
        .env("UBD_NVME", "0000:00:04.0,0000:00:05.0")
        .output()
        .expect("run sh scripts/soak.sh");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "stderr: {stderr}");
    assert!(
        stderr.contains("--guest runs only inside the project's test guest")
            && stderr.contains("ubdirect.testbed=1 on the kernel command line: no")
            && stderr.contains("run scripts/soak.sh without --guest"),
        "{stderr}"
    );
    assert!(
        out.stdout.is_empty(),
        "stdout: {}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn in_testbed_says_what_it_found() {
    let out = Command::new("sh")
        .arg(scripts().join("vm/guest/in-testbed"))
        .arg("-v")
        .output()
        .expect("run sh in-testbed -v");
    let text = String::from_utf8_lossy(&out.stdout);
    if out.status.success() {
        assert!(text.is_empty(), "{text}");
    } else {
        assert_eq!(out.status.code(), Some(1));
        assert!(
            text.contains("ubdirect.testbed=1 on the kernel command line:")
                && text.contains("/run/ubdirect-testbed:"),
            "{text}"
        );
    }
}
