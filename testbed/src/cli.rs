//! Running the `ubdirect` binary from tests: its exit status and output, the arguments of the
//! `perf --verify` runs the CLI guest tests make, and the checks of a clean verified run.

use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

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

/// Waits for `child` until `limit` has passed since `start`, looking every `every`; at the limit
/// kills and reaps it. Its exit status, or None when the limit killed it.
pub fn wait_or_kill(
    child: &mut Child,
    start: Instant,
    limit: Duration,
    every: Duration,
) -> Option<ExitStatus> {
    loop {
        if let Some(st) = child.try_wait().expect("wait for the child") {
            return Some(st);
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(every);
    }
}

/// [`run`] of the `ubdirect` binary in the PATH (in the guest, scripts/vm/suite.sh puts the
/// one it built there).
pub fn ubdirect(args: &[&str]) -> (i32, String, String) {
    run("ubdirect", args, &[])
}

/// The arguments of `ubdirect perf <addr> <opts> -w rw -M 50 -t <secs> --verify --json`: 50/50
/// random reads and writes for `secs` seconds, every read checked against what was written,
/// with `opts` choosing the rest (namespace, queue depth, I/O size, region, queue placement).
pub fn perf_rw_verify_args<'a>(addr: &'a str, secs: &'a str, opts: &[&'a str]) -> Vec<&'a str> {
    let mut a = vec!["perf", addr];
    a.extend_from_slice(opts);
    a.extend(["-w", "rw", "-M", "50", "-t", secs, "--verify", "--json"]);
    a
}

/// The arguments of `ubdirect perf --verify --json` on namespace 2 of the NVMe controller at
/// `addr` (the test bed's nvme1) for `secs` seconds: 50/50 random reads and writes of 8 KiB at
/// queue depth 8 in the namespace's 48..52 MiB, the CLI guest tests' scratch region.
pub fn perf_verify_args<'a>(addr: &'a str, secs: &'a str) -> Vec<&'a str> {
    perf_rw_verify_args(
        addr,
        secs,
        &[
            "--ns",
            "2",
            "-q",
            "8",
            "-o",
            "8192",
            "--offset-mib",
            "48",
            "--span-mib",
            "4",
        ],
    )
}

/// The `--json` document of a `perf --verify` run (the `(status, stdout, stderr)` of [`run`])
/// that must have run clean: exit status 0, some I/O done, no I/O error, no verify error, and
/// the reads of core 0 found blocks stamped by its writes. Panics with the output otherwise.
pub fn perf_verified_clean((rc, out, err): (i32, String, String)) -> serde_json::Value {
    assert_eq!(rc, 0, "stderr: {err}\nstdout: {out}");
    let v: serde_json::Value = serde_json::from_str(&out)
        .unwrap_or_else(|e| panic!("stdout is not JSON ({e}):\n{out}\nstderr: {err}"));
    let t = &v["total"];
    assert!(t["ios"].as_u64().is_some_and(|n| n > 0), "no I/O done: {t}");
    assert_eq!(t["errors"], 0, "{t}");
    assert_eq!(t["verify_errors"], 0, "{t}");
    let core = &v["cores"][0];
    assert!(
        core["verified_blocks"].as_u64().is_some_and(|n| n > 0),
        "reads found stamped blocks: {core}"
    );
    v
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
    fn a_child_is_waited_for_until_its_limit_then_killed_and_reaped() {
        let start = Instant::now();
        let mut c = Command::new("sh").args(["-c", "exit 3"]).spawn().unwrap();
        let st = wait_or_kill(
            &mut c,
            start,
            Duration::from_secs(30),
            Duration::from_millis(5),
        );
        assert_eq!(st.and_then(|s| s.code()), Some(3));
        let start = Instant::now();
        let mut c = Command::new("sleep").arg("30").spawn().unwrap();
        let st = wait_or_kill(
            &mut c,
            start,
            Duration::from_millis(100),
            Duration::from_millis(5),
        );
        assert_eq!(st, None, "killed at the limit");
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "{:?}",
            start.elapsed()
        );
        // Reaped: the status is known at once, and it is the kill's signal.
        let reaped = c.try_wait().unwrap().expect("reaped");
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&reaped),
            Some(9)
        );
    }

    #[test]
    fn a_run_ended_by_a_signal_has_status_minus_one() {
        assert_eq!(run("sh", &["-c", "kill -9 $$"], &[]).0, -1);
    }

    /// A `perf --json` document with these totals and core 0's verified blocks.
    fn perf_doc(ios: u64, errors: u64, verify_errors: u64, verified: u64) -> String {
        format!(
            r#"{{"total":{{"ios":{ios},"errors":{errors},"verify_errors":{verify_errors}}},"cores":[{{"verified_blocks":{verified}}}]}}"#
        )
    }

    /// The panic message of `perf_verified_clean` on this run, or None when it passed.
    fn refusal(rc: i32, out: String) -> Option<String> {
        std::panic::catch_unwind(|| perf_verified_clean((rc, out, "the stderr".into())))
            .err()
            .map(|p| {
                p.downcast_ref::<String>()
                    .cloned()
                    .unwrap_or_else(|| p.downcast_ref::<&str>().unwrap().to_string())
            })
    }

    #[test]
    fn a_clean_verified_run_gives_its_document_and_each_fault_is_named() {
        let v = perf_verified_clean((0, perf_doc(10, 0, 0, 3), String::new()));
        assert_eq!(v["total"]["ios"], 10);
        let m = refusal(1, perf_doc(10, 0, 0, 3)).unwrap();
        assert!(m.contains("stderr: the stderr"), "{m}");
        let m = refusal(0, "not json".into()).unwrap();
        assert!(m.contains("stdout is not JSON"), "{m}");
        let m = refusal(0, perf_doc(0, 0, 0, 3)).unwrap();
        assert!(m.contains("no I/O done"), "{m}");
        let m = refusal(0, perf_doc(10, 2, 0, 3)).unwrap();
        assert!(m.contains(r#""errors":2"#), "{m}");
        let m = refusal(0, perf_doc(10, 0, 1, 3)).unwrap();
        assert!(m.contains(r#""verify_errors":1"#), "{m}");
        let m = refusal(0, perf_doc(10, 0, 0, 0)).unwrap();
        assert!(m.contains("reads found stamped blocks"), "{m}");
    }

    #[test]
    fn a_verified_rw_run_puts_the_options_between_device_and_workload() {
        let a = perf_rw_verify_args("0000:00:05.0", "1", &["-q", "32", "--sq-in-cmb"]);
        assert_eq!(
            a,
            [
                "perf",
                "0000:00:05.0",
                "-q",
                "32",
                "--sq-in-cmb",
                "-w",
                "rw",
                "-M",
                "50",
                "-t",
                "1",
                "--verify",
                "--json"
            ]
        );
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
