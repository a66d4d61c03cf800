//! Guest tests of the CLI tools on the driver: `ubdirect identify --json` fields match the QEMU
//! command line; `ubdirect perf --json --verify` runs I/O without errors. The suite puts the
//! `ubdirect` binary in the guest's PATH.

use serde_json::Value;
use ubdirect_testbed as testbed;
use ubdirect_testbed::cli::{perf_verified_clean, perf_verify_args, ubdirect};

#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn identify_json_matches_the_qemu_command_line() {
    let tb = testbed::require();
    let (rc, out, err) = ubdirect(&["identify", "--json", &tb.nvme[1]]);
    assert_eq!(rc, 0, "stderr: {err}");
    let v: Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(v["controller"]["sn"], "ubd1");
    assert_eq!(v["controller"]["mdts"], 2);
    assert_eq!(v["controller"]["vid"], 0x1b36);
    assert_eq!(v["registers"]["max_command_bytes"], 16384);
    let ns = v["namespaces"].as_array().unwrap();
    assert_eq!(ns.len(), 2);
    assert_eq!(ns[0]["nsze"], 131072);
    assert_eq!(ns[0]["lba_size"], 512);
    assert_eq!(ns[1]["nsze"], 16384);
    assert_eq!(ns[1]["lba_size"], 4096);
    let in_use: Vec<_> = ns[1]["lbaf"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["in_use"] == true)
        .collect();
    assert_eq!(in_use.len(), 1);
    assert_eq!(in_use[0]["lbads"], 12);
    // Text output carries nvme-cli's names.
    let (rc, out, _) = ubdirect(&["identify", &tb.nvme[0]]);
    assert_eq!(rc, 0);
    for key in [
        "vid", "ssvid", "sn", "mn", "fr", "mdts", "cntlid", "ver", "oacs", "nn", "sqes", "cqes",
        "oncs", "vwc", "nsze", "ncap", "nuse", "flbas", "lbaf  0", "(in use)",
    ] {
        assert!(out.contains(key), "{key} missing in:\n{out}");
    }
}

#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn perf_json_verify_runs_clean() {
    let tb = testbed::require();
    let v = perf_verified_clean(ubdirect(&perf_verify_args(&tb.nvme[1], "1")));
    let t = &v["total"];
    assert_eq!(v["schema"], "ubdirect/1");
    let lat = &t["latency_ns"];
    assert!(lat["p50"].as_f64().unwrap() > 0.0);
    assert!(lat["p99"].as_f64().unwrap() >= lat["p50"].as_f64().unwrap());
    let core = &v["cores"][0];
    assert!(core["writes"].as_u64().unwrap() > 0 && core["reads"].as_u64().unwrap() > 0);
    // Bad arguments are refused with a message.
    let (rc, _, err) = ubdirect(&["perf", &tb.nvme[1], "--ns", "2", "-o", "512", "-t", "1"]);
    assert_eq!(rc, 1);
    assert!(
        err.contains("is not a multiple") && err.contains("use -o 4096"),
        "{err}"
    );
}

#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn perf_on_two_cores_uses_two_queue_pairs() {
    let tb = testbed::require();
    let (rc, out, err) = ubdirect(&[
        "perf",
        &tb.nvme[0],
        "-c",
        "0x3",
        "-q",
        "4",
        "-t",
        "1",
        "--span-mib",
        "16",
        "--json",
    ]);
    assert_eq!(rc, 0, "stderr: {err}");
    let v: Value = serde_json::from_str(&out).expect("JSON");
    let cores = v["cores"].as_array().unwrap();
    assert_eq!(cores.len(), 2);
    assert_eq!(cores[0]["core"], 0);
    assert_eq!(cores[1]["core"], 1);
    assert_ne!(cores[0]["qid"], cores[1]["qid"], "one queue pair per core");
    assert!(cores
        .iter()
        .all(|c| c["ios"].as_u64().unwrap() > 0 && c["errors"] == 0));
    let sum: u64 = cores.iter().map(|c| c["ios"].as_u64().unwrap()).sum();
    assert_eq!(v["total"]["ios"].as_u64().unwrap(), sum);
    // A core that does not exist is refused with the reason.
    let (rc, _, err) = ubdirect(&["perf", &tb.nvme[0], "-c", "7", "-t", "1"]);
    assert_eq!(rc, 1);
    assert!(err.contains("cannot pin to core 7"), "{err}");
}
