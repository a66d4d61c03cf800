//! Guest test: every subcommand's `--json` on the guest's real devices validates against the
//! schema in docs/json.md (`ubdirect/1`): devices, doctor, identify, perf, pipeline, loopback,
//! log smart, log error. The suite puts the `ubdirect` binary in the guest's PATH and the
//! devices on vfio-pci.

#[path = "support/schema.rs"]
mod schema;

use ubdirect_testbed as testbed;

const BIN: &str = "ubdirect";

#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn every_subcommand_json_validates_against_the_documented_schema() {
    let tb = testbed::require();
    let nvme0 = tb.nvme[0].as_str();
    let nvme1 = tb.nvme[1].as_str();
    let j = |args: &[&str], rc: i32| schema::json_of(BIN, args, &[], rc);

    let v = j(&["devices", "--json"], 0);
    assert_eq!(
        v["devices"].as_array().unwrap().len(),
        tb.all().len(),
        "{v}"
    );
    // doctor exits 1 exactly when a finding is an error.
    let (rc, out, err) = schema::run(BIN, &["doctor", "--json", nvme0], &[]);
    let v: serde_json::Value =
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}{err}"));
    schema::validate(&v).unwrap_or_else(|e| panic!("doctor --json: {e}\n{out}"));
    assert_eq!(rc, i32::from(v["errors"].as_u64().unwrap() > 0), "{out}");
    assert_eq!(v["devices"][0], nvme0);

    let v = j(&["identify", "--json", nvme1], 0);
    assert_eq!(v["namespaces"].as_array().unwrap().len(), 2);

    let v = j(
        &[
            "perf",
            nvme1,
            "--ns",
            "2",
            "-q",
            "4",
            "-o",
            "8K",
            "--seconds",
            "0.3",
            "--json",
        ],
        0,
    );
    assert_eq!(
        (v["nsid"].as_u64(), v["queue_depth"].as_u64()),
        (Some(2), Some(4))
    );
    let t = &v["total"];
    let expect = t["iops"].as_f64().unwrap() * 8192.0;
    assert!(
        (t["bytes_per_s"].as_f64().unwrap() - expect).abs() <= expect * 1e-9 + 1.0,
        "bytes_per_s is iops x io_size: {t}"
    );
    assert!(t["latency_ns"]["p50"].as_f64().unwrap() > 0.0);

    let src = format!("nvme:{nvme0}");
    let v = j(&schema::pipeline_json_args(&src, &["--bytes", "4M"]), 0);
    let runs = v["runs"].as_array().unwrap();
    assert_eq!(runs.last().unwrap()["verify"]["ok"], true, "{v}");

    let v = j(&["log", "smart", nvme0, "--json"], 0);
    assert!(v["smart"]["temperature_k"].as_u64().unwrap() > 0);
    let v = j(&["log", "error", nvme0, "--json"], 0);
    assert!(v["entries"].is_array());

    if let [a, b, ..] = &tb.nics[..] {
        let v = j(
            &[
                "loopback", "--tx", a, "--rx", b, "--frames", "200", "--json",
            ],
            0,
        );
        assert_eq!(v["frames_received"], 200);
        assert!(v["bytes_per_s"].as_f64().unwrap() > 0.0);
    }
}
