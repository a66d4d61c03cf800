//! Guest test: `ubdirect perf --engine floor`, the bare floor loop the driver is
//! measured against, completes reads at QD1 and QD32 on the test bed's nvme0 and reports them
//! in `--json` that validates against docs/json.md; the driver's own run in the same form for
//! comparison. The suite puts the `ubdirect` binary in the guest's PATH and the devices on
//! vfio-pci.

#[path = "support/schema.rs"]
mod schema;

use ubdirect_testbed as testbed;

const BIN: &str = "ubdirect";

#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn floor_engine_reads_at_qd1_and_qd32_with_valid_json() {
    let tb = testbed::require();
    let nvme0 = tb.nvme[0].as_str();
    for q in ["1", "32"] {
        let v = schema::json_of(
            BIN,
            &[
                "perf", nvme0, "--engine", "floor", "-q", q, "-o", "4K", "-t", "0.5", "--json",
            ],
            &[],
            0,
        );
        assert_eq!(v["engine"], "floor", "{v}");
        assert_eq!(v["queue_depth"].as_u64(), q.parse().ok(), "{v}");
        let t = &v["total"];
        assert!(t["iops"].as_f64().unwrap() > 0.0, "QD{q}: {v}");
        assert!(t["ios"].as_u64().unwrap() > 0, "QD{q}: {v}");
        assert_eq!(t["errors"].as_u64(), Some(0), "QD{q}: {v}");
        let c = &v["cores"][0];
        // One SQ and at most one CQ doorbell write per reaped batch: never more than one each
        // per read.
        let sq = c["sq_doorbell_writes_per_io"].as_f64().unwrap();
        let cq = c["cq_doorbell_writes_per_io"].as_f64().unwrap();
        assert!(sq > 0.0 && sq <= 1.0 + 1e-9, "QD{q}: SQ doorbells/IO {sq}");
        assert!(cq > 0.0 && cq <= 1.0 + 1e-9, "QD{q}: CQ doorbells/IO {cq}");
    }
    // The floor loop deletes its queue pair: the driver runs on the same controller after it.
    let v = schema::json_of(
        BIN,
        &["perf", nvme0, "-q", "32", "-o", "4K", "-t", "0.3", "--json"],
        &[],
        0,
    );
    assert_eq!(v["engine"], "ubdirect", "{v}");
    assert!(v["total"]["iops"].as_f64().unwrap() > 0.0, "{v}");
    // What the floor loop cannot do is refused with the fix.
    let (rc, _, err) = schema::run(
        BIN,
        &["perf", nvme0, "--engine", "floor", "-o", "8K", "-t", "0.1"],
        &[],
    );
    assert_eq!(rc, 1, "{err}");
    assert!(err.contains("use -o 4096"), "{err}");
}
