//! Guest test: `ubdirect perf -o` at 4 x MDTS on the test bed's nvme1 (MDTS 16 KiB)
//! runs clean with `--verify` at QD1 and QD32: requests that need more command slots than are
//! free are queued in the queue pair and go out as slots free up (not refused with "queue is
//! full ... needs N commands"). A `-q` above the controller's queue size (MQES) runs at the
//! capped depth and says so. The suite puts `ubdirect` in the guest's PATH and the devices on
//! vfio-pci.

#[path = "support/schema.rs"]
mod schema;

use ubdirect_testbed as testbed;

const BIN: &str = "ubdirect";

#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn four_times_mdts_at_qd1_and_qd32_verifies_clean() {
    let tb = testbed::require();
    let nvme1 = tb.nvme[1].as_str();
    // nvme1 ns2: 4 KiB blocks, MDTS 16 KiB: a 64 KiB I/O is 4 commands. 40M..48M of ns2 is
    // used by no other guest test (guest_nvme_cli and guest_faults_reset write 48M..52M).
    for q in ["1", "32"] {
        let v = schema::json_of(
            BIN,
            &[
                "perf", nvme1, "--ns", "2", "-q", q, "-o", "64k", "-w", "rw", "-M", "50", "-t",
                "1", "--verify", "--offset", "40M", "--span", "8M", "--json",
            ],
            &[],
            0,
        );
        assert_eq!(v["io_size"], 65536, "{v}");
        assert_eq!(v["effective_queue_depth"].as_u64(), q.parse().ok(), "{v}");
        let t = &v["total"];
        assert!(t["ios"].as_u64().unwrap() > 0, "QD{q}: {v}");
        assert_eq!(t["errors"], 0, "QD{q}: {v}");
        assert_eq!(t["verify_errors"], 0, "QD{q}: {v}");
        let c = &v["cores"][0];
        assert!(
            c["reads"].as_u64().unwrap() > 0 && c["writes"].as_u64().unwrap() > 0,
            "QD{q}: {c}"
        );
        assert!(
            c["verified_blocks"].as_u64().unwrap() > 0,
            "QD{q}: reads found stamped blocks: {c}"
        );
    }
}

#[test]
#[ignore = "guest: needs vfio devices, run by scripts/test.sh"]
fn a_depth_above_mqes_runs_capped_and_says_so() {
    let tb = testbed::require();
    let nvme1 = tb.nvme[1].as_str();
    // QEMU's controller: MQES 2047 (2048 entries), so a queue holds 2047 commands.
    let args = [
        "perf", nvme1, "--ns", "2", "-q", "4096", "-o", "4k", "-t", "0.3", "--json",
    ];
    let (rc, out, err) = schema::run(BIN, &args, &[]);
    assert_eq!(rc, 0, "stderr: {err}\nstdout: {out}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    schema::validate(&v).unwrap();
    assert_eq!(v["queue_depth"], 4096, "{v}");
    assert_eq!(v["effective_queue_depth"], 2047, "{v}");
    assert_eq!(v["cores"][0]["queue_depth"], 2047, "{v}");
    assert!(
        err.contains("queue depth capped: -q 4096 asked for, the controller's queues hold 2047 (MQES): running at depth 2047"),
        "{err}"
    );
    // The table says it too.
    let (rc, out, err) = schema::run(BIN, &args[..args.len() - 1], &[]);
    assert_eq!(rc, 0, "{err}");
    assert!(out.contains("queue depth capped: -q 4096"), "{out}");
}
