//! Running the `ubdirect` binary from tests: its exit status and output, and the arguments of
//! the `perf --verify` run that the CLI guest tests share.

use std::process::Command;

/// Runs `bin` with `args` and the extra environment `env`; returns its exit status (-1 when a
/// signal ended it), stdout and stderr. Panics when it cannot be started.
pub fn run(bin: &str, args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let out = Command::new(bin)
        .args(args)
        .envs(env.iter().copied())
        .output()
        .unwrap_or_else(|e| panic!("running {bin}: {e}"));
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// [`run`] of the `ubdirect` binary in the PATH (in the guest, scripts/vm/suite.sh puts the
/// one it built there).
pub fn ubdirect(args: &[&str]) -> (i32, String, String) {
    run("ubdirect", args, &[])
}

/// The arguments of `ubdirect perf --verify --json` on namespace 2 of the NVMe controller at
/// `addr` (the test bed's nvme1) for `secs` seconds: 50/50 random reads and writes of 8 KiB at
/// queue depth 8 in the namespace's 48..52 MiB, the CLI guest tests' scratch region.
pub fn perf_verify_args<'a>(addr: &'a str, secs: &'a str) -> Vec<&'a str> {
    vec![
        "perf",
        addr,
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
        secs,
        "--verify",
        "--offset-mib",
        "48",
        "--span-mib",
        "4",
        "--json",
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_gives_the_exit_status_the_output_and_sees_the_environment() {
        let (rc, out, err) = run(
            "sh",
            &["-c", "echo \"out $UBD_T\"; echo err >&2; exit 3"],
            &[("UBD_T", "x")],
        );
        assert_eq!((rc, out.as_str(), err.as_str()), (3, "out x\n", "err\n"));
    }

    #[test]
    fn a_run_ended_by_a_signal_has_status_minus_one() {
        assert_eq!(run("sh", &["-c", "kill -9 $$"], &[]).0, -1);
    }

    #[test]
    fn the_perf_verify_run_names_its_device_and_seconds() {
        let a = perf_verify_args("0000:00:05.0", "8");
        assert_eq!(&a[..2], ["perf", "0000:00:05.0"]);
        let secs = a.iter().position(|x| *x == "-t").unwrap();
        assert_eq!(a[secs + 1], "8");
        assert!(a.contains(&"--verify") && a.last() == Some(&"--json"));
    }
}
