//! scripts/setup.sh argument validation on the host: every bad input exits non-zero with a clear
//! message on stderr before anything is changed. Only bad input, `help` and the read-only
//! `status` mode run here, so the machine is never touched.

use std::path::PathBuf;
use std::process::{Command, Output};

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scripts/setup.sh")
}

/// Run setup.sh under `sh` with only PATH from the environment plus `env`.
fn run(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new("sh");
    cmd.arg(script()).args(args).env_clear();
    if let Some(path) = std::env::var_os("PATH") {
        cmd.env("PATH", path);
    }
    // Keep the state file (never written by these cases) away from the real one anyway.
    cmd.env(
        "UBD_STATE_DIR",
        std::env::temp_dir().join("ubd-setup-args-test"),
    );
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run sh scripts/setup.sh")
}

/// Assert a usage error: exit 2, the message on stderr, nothing on stdout (so nothing was done).
fn assert_rejected(args: &[&str], env: &[(&str, &str)], message: &str) {
    let out = run(args, env);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(2),
        "{args:?} {env:?}: stderr {stderr}"
    );
    assert!(stderr.contains("setup.sh: error: "), "{stderr}");
    assert!(stderr.contains(message), "expected {message:?} in {stderr}");
    assert!(
        out.stdout.is_empty(),
        "stdout: {}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn help_prints_modes_and_knobs() {
    for arg in ["help", "-h", "--help"] {
        let out = run(&[arg], &[]);
        assert_eq!(out.status.code(), Some(0));
        let text = String::from_utf8_lossy(&out.stdout);
        for word in [
            "config",
            "reset",
            "status",
            "HUGEMEM",
            "HUGEPGSZ",
            "HUGENODE",
            "PCI_ALLOWED",
            "PCI_BLOCKED",
            "TARGET_USER",
            "UBD_ALLOW_NOIOMMU",
        ] {
            assert!(text.contains(word), "help lacks {word}");
        }
    }
}

#[test]
fn unknown_mode_and_extra_arguments() {
    assert_rejected(&["bind"], &[], "unknown mode 'bind'");
    assert_rejected(&["config", "extra"], &[], "too many arguments");
}

#[test]
fn non_numeric_hugemem() {
    assert_rejected(
        &["config"],
        &[("HUGEMEM", "1G")],
        "HUGEMEM='1G' is not a number",
    );
    assert_rejected(&["config"], &[("HUGEMEM", "-5")], "HUGEMEM='-5'");
}

#[test]
fn bad_page_size_and_node() {
    assert_rejected(&[], &[("HUGEPGSZ", "4096")], "use 2048 (2 MiB) or 1048576");
    assert_rejected(&[], &[("HUGENODE", "zero")], "'zero' is not a NUMA node");
    assert_rejected(
        &[],
        &[("HUGENODE", "4095")],
        "NUMA node 4095 does not exist",
    );
}

#[test]
fn malformed_and_missing_pci_addresses() {
    for bad in ["00:04", "0000:00:20.0", "00:04.8", "xyz", "0000:00:04.0.1"] {
        assert_rejected(&["config"], &[("PCI_ALLOWED", bad)], "is not a PCI address");
    }
    assert_rejected(
        &["reset"],
        &[("PCI_BLOCKED", "0000:00:04.0 junk")],
        "PCI_BLOCKED: 'junk'",
    );
    assert_rejected(
        &["config"],
        &[("PCI_ALLOWED", "0000:fe:1f.7")],
        "no PCI device 0000:fe:1f.7",
    );
    assert_rejected(
        &["config"],
        &[("PCI_ALLOWED", "FE:1F.7")],
        "no PCI device 0000:fe:1f.7",
    );
}

#[test]
fn unknown_target_user() {
    assert_rejected(
        &["config"],
        &[("TARGET_USER", "no-such-user-ubd")],
        "TARGET_USER='no-such-user-ubd': no such user",
    );
}

/// `UBD_ALLOW_NOIOMMU` takes only `1` (any other value is refused, nothing done).
#[test]
fn noiommu_mode_takes_only_1() {
    for v in ["yes", "0", ""] {
        assert_rejected(
            &["config"],
            &[("UBD_ALLOW_NOIOMMU", v)],
            "is not understood: set UBD_ALLOW_NOIOMMU=1 to turn on vfio's unsafe no-IOMMU mode",
        );
    }
}

/// `UBD_ALLOW_NOIOMMU=1` is accepted (the no-IOMMU back end uses it); the read-only `status` runs with it.
#[test]
fn noiommu_mode_1_is_accepted() {
    let out = run(&["status"], &[("UBD_ALLOW_NOIOMMU", "1")]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "stderr {stderr}");
    assert!(!stderr.contains("error"), "{stderr}");
}

/// HUGEMEM is decimal; a number too large for sh arithmetic is refused, not wrapped.
#[test]
fn hugemem_too_large() {
    assert_rejected(
        &["config"],
        &[("HUGEMEM", "99999999999999999999")],
        "HUGEMEM='99999999999999999999' is too large",
    );
    assert_rejected(
        &["config"],
        &[("HUGEMEM", "0001000000000")],
        "HUGEMEM='0001000000000' is too large",
    );
}

#[test]
fn status_is_read_only_and_prints_the_tables() {
    let out = run(&["status"], &[]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("BDF") && text.contains("VENDOR:DEV") && text.contains("GROUP"),
        "{text}"
    );
    assert!(text.contains("Hugepages"), "{text}");
}

#[test]
fn config_as_non_root_is_refused_before_any_change() {
    // As root, drop to nobody with setpriv (util-linux); as a normal user, run directly.
    let is_root = Command::new("id")
        .arg("-u")
        .output()
        .map(|o| o.stdout == b"0\n")
        .unwrap_or(false);
    let mut cmd = if is_root {
        let mut c = Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups", "sh"]);
        c
    } else {
        Command::new("sh")
    };
    cmd.arg(script()).arg("config").env(
        "UBD_STATE_DIR",
        std::env::temp_dir().join("ubd-setup-args-test"),
    );
    let out = match cmd.output() {
        Ok(o) => o,
        Err(e) if is_root => {
            eprintln!("setpriv not available ({e}): cannot drop root here");
            return;
        }
        Err(e) => panic!("run sh: {e}"),
    };
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("run it as root"), "{stderr}");
    assert!(out.stdout.is_empty());
}
